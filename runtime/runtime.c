/* runtime.c: the launcher. rt_open checks the mesh against the device limit and makes one
 * RtDevice per device; rt_run holds OpenBLAS to one thread, has the backend run the entry
 * function on every device, and returns the run's first failure; rt_fail and every error the
 * runtime finds in a device come through rtrun_fail, which records the first message and stops
 * the run: every waiting device wakes (sync.c) and unwinds with RT_E_STOPPED. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"

static const char *const status_names[] = {
#define RT_X(name, text) "RT_" #name,
    RT_STATUS_LIST(RT_X)
#undef RT_X
};

static const char *const status_texts[] = {
#define RT_X(name, text) text,
    RT_STATUS_LIST(RT_X)
#undef RT_X
};

static const struct {
  const char *name;
  size_t bytes;
} dtypes[] = {
#define RT_X(name, text, bytes) {text, bytes},
    RT_DTYPE_LIST(RT_X)
#undef RT_X
};

static const char *const coll_names[] = {
#define RT_X(name, text) text,
    RT_COLL_LIST(RT_X)
#undef RT_X
};

const char *rt_status_name(int status) {
  if (status < 0 || status >= (int)(sizeof status_names / sizeof *status_names)) return "RT_E_UNKNOWN";
  return status_names[status];
}

size_t rt_dtype_size(RtDtype dt) { return (unsigned)dt < RT_DTYPE_COUNT ? dtypes[dt].bytes : 0; }
const char *rt_dtype_name(RtDtype dt) { return (unsigned)dt < RT_DTYPE_COUNT ? dtypes[dt].name : "?"; }
const char *rtrun_coll_name(RtCollKind k) { return (unsigned)k < RT_COLL_COUNT ? coll_names[k] : "?"; }

const RtBackend *rtrun_mpi_backend;

double rt_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- open and close ---- */

/* Records an error found before any device runs (a bad config). */
static int open_error(Runtime *rt, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int open_error(Runtime *rt, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(rt->err, sizeof rt->err, fmt, ap);
  va_end(ap);
  rt->err_code = code;
  return code;
}

static void mesh_text(const RtConfig *cfg, char *buf, size_t n) {
  size_t len = (size_t)snprintf(buf, n, "[");
  for (int a = 0; a < cfg->naxes && len < n; a++)
    len += (size_t)snprintf(buf + len, n - len, "%s%s: %d", a ? ", " : "",
                            cfg->axis_name[a] ? cfg->axis_name[a] : "?", cfg->axis_size[a]);
  if (len < n) snprintf(buf + len, n - len, "]");
}

static int check_config(Runtime *rt, const RtConfig *cfg) {
  if (cfg->naxes < 0 || cfg->naxes > RT_MAX_AXES)
    return open_error(rt, RT_E_LIMIT, "a mesh of %d axes: the runtime takes 0 to %d", cfg->naxes, RT_MAX_AXES);
  int64_t ndev = 1;
  for (int a = 0; a < cfg->naxes; a++) {
    if (cfg->axis_size[a] < 1)
      return open_error(rt, RT_E_ARG, "mesh axis %d has size %d", a, cfg->axis_size[a]);
    ndev *= cfg->axis_size[a];
    if (ndev > RT_HARD_MAX_DEVICES) ndev = RT_HARD_MAX_DEVICES + 1; /* no overflow; refused below */
  }
  int limit = cfg->max_devices ? cfg->max_devices : RT_DEFAULT_MAX_DEVICES;
  if (limit < 1 || limit > RT_HARD_MAX_DEVICES)
    return open_error(rt, RT_E_LIMIT, "max_devices %d: the runtime allows 1 to %d device threads", limit,
                      RT_HARD_MAX_DEVICES);
  if (cfg->backend == RT_BACKEND_MPI) {
    /* under MPI the limit is on each process's threads; the mesh may be as large as the job */
    int t = cfg->threads_per_rank ? cfg->threads_per_rank : 1;
    if (t < 1 || t > limit)
      return open_error(rt, RT_E_LIMIT, "%d threads per rank: the MPI backend runs 1 to %d device threads per rank",
                        t, limit);
    if (ndev > RT_HARD_MAX_DEVICES)
      return open_error(rt, RT_E_LIMIT, "a mesh of more than %d devices: over the runtime's limit", RT_HARD_MAX_DEVICES);
    if (ndev % t) {
      char mesh[256];
      mesh_text(cfg, mesh, sizeof mesh);
      return open_error(rt, RT_E_ARG, "mesh %s has %lld devices: %d threads per rank do not divide them", mesh,
                        (long long)ndev, t);
    }
    limit = RT_HARD_MAX_DEVICES;
  }
  if (ndev > limit) {
    char mesh[256];
    mesh_text(cfg, mesh, sizeof mesh);
    char count[32];
    if (ndev > RT_HARD_MAX_DEVICES) snprintf(count, sizeof count, "more than %d", RT_HARD_MAX_DEVICES);
    else snprintf(count, sizeof count, "%lld", (long long)ndev);
    return open_error(rt, RT_E_LIMIT,
                      "mesh %s has %s devices: over the limit of %d device threads this runtime runs "
                      "(one thread per device); run a smaller mesh",
                      mesh, count, limit);
  }
  if (cfg->timeout_s < 0) return open_error(rt, RT_E_ARG, "timeout %g s is negative", cfg->timeout_s);
  if (cfg->fail_alloc_nth < 0 || cfg->fail_alloc_device < -1 || cfg->fail_alloc_device >= ndev)
    return open_error(rt, RT_E_ARG, "fail_alloc_nth %lld on device %d: no such allocation or device",
                      (long long)cfg->fail_alloc_nth, cfg->fail_alloc_device);
  if (cfg->backend == RT_BACKEND_MPI && !rtrun_mpi_backend)
    return open_error(rt, RT_E_ARG, "the MPI backend is not started in this process (rt_mpi_init, shardrt_mpi.h)");
  if (cfg->backend != RT_BACKEND_THREADS && cfg->backend != RT_BACKEND_MPI)
    return open_error(rt, RT_E_ARG, "unknown backend %d", (int)cfg->backend);
  rt->ndev = (int)ndev;
  return RT_OK;
}

static void label_device(Runtime *rt, RtDevice *d) {
  size_t n = sizeof d->label, len = (size_t)snprintf(d->label, n, "device %d", d->index);
  for (int a = 0; a < rt->naxes && len < n; a++)
    len += (size_t)snprintf(d->label + len, n - len, "%s%s=%d", a ? ", " : " [", rt->axis_name[a], d->coord[a]);
  if (rt->naxes && len < n) len += (size_t)snprintf(d->label + len, n - len, "]");
  if (rt->backend == rtrun_mpi_backend && rt->backend && len < n)
    snprintf(d->label + len, n - len, " on rank %d", d->index / rt->threads_per_rank);
}

int rt_open(const RtConfig *cfg, Runtime **out) {
  Runtime *rt = calloc(1, sizeof *rt);
  *out = rt;
  if (!rt) return RT_E_NOMEM;
  pthread_mutex_init(&rt->err_lock, NULL);
  if (!cfg) return open_error(rt, RT_E_ARG, "no config");
  int rc = check_config(rt, cfg);
  if (rc) return rc;

  rt->naxes = cfg->naxes;
  for (int a = cfg->naxes - 1; a >= 0; a--) {
    rt->axis_size[a] = cfg->axis_size[a];
    rt->axis_stride[a] = a == cfg->naxes - 1 ? 1 : rt->axis_stride[a + 1] * rt->axis_size[a + 1];
    if (cfg->axis_name[a]) snprintf(rt->axis_name[a], RT_NAME_MAX, "%s", cfg->axis_name[a]);
    else snprintf(rt->axis_name[a], RT_NAME_MAX, "a%d", a);
  }
  rt->timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : RT_DEFAULT_TIMEOUT_S;
  rt->mem_cap = cfg->mem_cap;
  rt->fail_alloc_nth = cfg->fail_alloc_nth;
  rt->fail_alloc_device = cfg->fail_alloc_device;
  rt->pack_members = cfg->pack_members != 0;
  rt->route_log = cfg->route_log;
  rt->route_mode = cfg->route_log ? cfg->route_mode : RT_ROUTE_OWN;
  rt->backend = cfg->backend == RT_BACKEND_MPI ? rtrun_mpi_backend : &rt_threads_backend;
  rt->threads_per_rank = cfg->backend == RT_BACKEND_MPI && cfg->threads_per_rank ? cfg->threads_per_rank : 1;
  rt->local_lo = 0, rt->local_hi = rt->ndev; /* the MPI backend's open narrows it */
  rt->process_rank = 0, rt->process_count = 1;

  /* RtDevice is cache-line aligned (its wake word): aligned_alloc, and a size it divides. */
  rt->devices = aligned_alloc(_Alignof(RtDevice), (size_t)rt->ndev * sizeof(RtDevice));
  if (!rt->devices) return open_error(rt, RT_E_NOMEM, "out of memory for %d devices", rt->ndev);
  memset(rt->devices, 0, (size_t)rt->ndev * sizeof(RtDevice));
  for (int i = 0; i < rt->ndev; i++) {
    RtDevice *d = &rt->devices[i];
    d->rt = rt;
    d->index = i;
    for (int a = 0; a < rt->naxes; a++) d->coord[a] = (int)(i / rt->axis_stride[a] % rt->axis_size[a]);
    label_device(rt, d);
    rtmem_init(&d->mem);
  }
  rtsync_policy(rt);
  const char *engine = getenv("SHARDC_GEMM"); /* benches and tests: one engine for every product */
  if (engine && *engine) {
    int e = -1;
    for (int i = RT_GEMM_AUTO; i <= RT_GEMM_ONEDNN; i++)
      if (strcmp(engine, rt_gemm_engine_name((RtGemmEngine)i)) == 0) e = i;
    if (e < 0) {
      rt->backend = NULL;
      return open_error(rt, RT_E_ARG, "SHARDC_GEMM=%s: expected auto, openblas, onednn-f32 or onednn", engine);
    }
    rt->gemm_engine = e;
  }
  for (int i = 0; i < rt->ndev; i++) rt->devices[i].gemm_engine = rt->gemm_engine;
  const char *trace = getenv("SHARDC_GEMM_TRACE");
  rt->gemm_trace = trace && *trace && strcmp(trace, "0") != 0;
  if ((rc = rtdnnl_open(rt))) {
    rt->backend = NULL;
    return open_error(rt, rc, "out of memory for the GEMM cache");
  }
  const RtBackend *b = rt->backend;
  rc = b->open(rt);
  if (rc) {
    rt->backend = NULL;
    if (rt->err[0]) return rt->err_code = rc; /* the backend said why (a wrong -np) */
    return open_error(rt, rc, "the %s backend could not start: %s", b->name, status_texts[rc]);
  }
  return RT_OK;
}

void rt_close(Runtime *rt) {
  if (!rt) return;
  if (rt->devices) {
    /* The backend first: it may hold messages on the devices' accounts. */
    if (rt->backend) rt->backend->close(rt);
    rtdnnl_close(rt);
    for (int i = 0; i < rt->ndev; i++) {
      rtmem_release_all(&rt->devices[i]);
      pthread_mutex_destroy(&rt->devices[i].mem.lock);
      free(rt->devices[i].executed);
    }
    free(rt->devices);
  }
  pthread_mutex_destroy(&rt->err_lock);
  free(rt);
}

const char *rt_errmsg(const Runtime *rt) { return rt ? rt->err : "out of memory"; }
int rt_device_count(const Runtime *rt) { return rt && rt->backend ? rt->ndev : 0; }

RtDevice *rt_device(Runtime *rt, int index) {
  if (!rt || !rt->backend || index < 0 || index >= rt->ndev) return NULL;
  return &rt->devices[index];
}

int rt_gemm_cache_stats(const Runtime *rt, uint64_t *created, uint64_t *reused) {
  if (!rt || !rt->dnnl || !created || !reused) return RT_E_ARG;
  rtdnnl_counts(rt, created, reused);
  return RT_OK;
}

int rt_stats(const Runtime *rt, int device, RtStats *out) {
  if (!rt || !rt->backend || device < 0 || device >= rt->ndev || !out) return RT_E_ARG;
  RtDevice *d = &rt->devices[device];
  pthread_mutex_lock(&d->mem.lock);
  out->mem_current = d->mem.current;
  out->mem_peak = d->mem.peak;
  out->allocs = d->mem.allocs;
  pthread_mutex_unlock(&d->mem.lock);
  out->mem_cap = rt->mem_cap;
  out->collectives = d->ncoll;
  out->coll_seconds = d->coll_seconds;
  out->sim_compute_s = d->clock[RT_CLOCK_COMPUTE];
  out->sim_comm_s = d->clock[RT_CLOCK_COMM];
  return RT_OK;
}

/* ---- what ran ---- */

void rtrun_count(RtDevice *dev, RtCollKind kind, unsigned axes, double bytes) {
  for (int i = 0; i < dev->nexecuted; i++) {
    RtExecuted *e = &dev->executed[i];
    if (e->kind == (int32_t)kind && e->axes == axes && e->bytes_per_device == bytes) {
      e->count++;
      return;
    }
  }
  if (dev->nexecuted == dev->cap_executed) {
    int cap = dev->cap_executed ? 2 * dev->cap_executed : 16;
    RtExecuted *x = realloc(dev->executed, sizeof *x * (size_t)cap);
    if (!x) { /* out of host memory: rt_executed says the counts are incomplete */
      dev->executed_lost = true;
      return;
    }
    dev->executed = x, dev->cap_executed = cap;
  }
  dev->executed[dev->nexecuted++] = (RtExecuted){.kind = (int32_t)kind, .axes = axes, .bytes_per_device = bytes, .count = 1};
}

int rt_executed(const Runtime *rt, int device, RtExecuted *out, int n) {
  if (!rt || !rt->backend || device < 0 || device >= rt->ndev || !rtrun_local(rt, device)) return -1;
  const RtDevice *d = &rt->devices[device];
  if (d->executed_lost) return -1;
  for (int i = 0; out && i < d->nexecuted && i < n; i++) out[i] = d->executed[i];
  return d->nexecuted;
}

void rt_clock_add(RtDevice *dev, int stream, double seconds) {
  if (dev && (stream == RT_CLOCK_COMPUTE || stream == RT_CLOCK_COMM)) dev->clock[stream] += seconds;
}

/* ---- running ---- */

int rt_run(Runtime *rt, RtEntry fn, void *arg) {
  if (!rt) return RT_E_NOMEM;
  if (!rt->backend) return rt->err_code; /* rt_open failed: the message is still there */
  rt->err_code = 0;
  rt->err[0] = 0;
  atomic_store(&rt->stopped, 0);
  if (!fn) return open_error(rt, RT_E_ARG, "rt_run: no entry function");
  rt->entry = fn;
  rt->entry_arg = arg;
  for (int i = 0; i < rt->ndev; i++) {
    RtDevice *d = &rt->devices[i];
    atomic_store(&d->done, 0);
    atomic_store(&d->where, 0);
    d->ncoll = 0;
    d->coll_seconds = 0;
    d->nexecuted = 0;
    d->executed_lost = false;
    d->clock[0] = d->clock[1] = 0;
    atomic_store_explicit(&d->line, 0, memory_order_relaxed);
    d->rc = RT_OK;
  }

  /* One BLAS thread per device thread: with its own pool, OpenBLAS would start threads that
   * fight the device threads for the cores. The setting is process-wide, so it is checked and
   * put back afterwards. */
  int blas_threads = openblas_get_num_threads();
  openblas_set_num_threads(1);
  if (openblas_get_num_threads() != 1) {
    openblas_set_num_threads(blas_threads);
    return open_error(rt, RT_E_SYS, "OpenBLAS did not accept one thread per device (it reports %d)",
                      openblas_get_num_threads());
  }
  int rc = rt->backend->run(rt);
  openblas_set_num_threads(blas_threads);
  for (int i = 0; i < rt->ndev; i++) atomic_store_explicit(&rt->devices[i].line, 0, memory_order_relaxed);
  return rt->err_code ? rt->err_code : rc;
}

void rtrun_device_main(RtDevice *dev) {
  Runtime *rt = dev->rt;
  int rc = rtdnnl_device_begin(dev);
  if (!rc) rc = rt->entry(dev, rt->entry_arg);
  rtdnnl_device_end(dev);
  dev->rc = rc;
  /* An error the runtime did not see (the entry's own code): record it, so the run stops. */
  if (rc != RT_OK && !rtrun_stopped(rt))
    rtrun_fail(dev, rc > 0 && rc < (int)(sizeof status_names / sizeof *status_names) ? rc : RT_E_FAILED,
               "the entry function returned %d (%s)", rc, rt_status_name(rc));
  atomic_store(&dev->where, 0);
  atomic_store(&dev->done, 1);
  /* Anyone waiting for this device to arrive somewhere now knows it never will. */
  rtsync_wake_all(rt);
}

/* ---- failures ---- */

int rtrun_vfail(RtDevice *dev, int code, const char *fmt, va_list ap) {
  Runtime *rt = dev->rt;
  pthread_mutex_lock(&rt->err_lock);
  if (!rt->err_code) {
    rt->err_code = code;
    /* the op's line, when the generated code said it and the message does not */
    int line = atomic_load_explicit(&dev->line, memory_order_relaxed);
    int n = snprintf(rt->err, sizeof rt->err, "%s: ", dev->label);
    if (line > 0 && strncmp(fmt, "line ", 5) && n > 0 && (size_t)n < sizeof rt->err)
      n += snprintf(rt->err + n, sizeof rt->err - (size_t)n, "line %d: ", line);
    if (n > 0 && (size_t)n < sizeof rt->err) vsnprintf(rt->err + n, sizeof rt->err - (size_t)n, fmt, ap);
  }
  pthread_mutex_unlock(&rt->err_lock);
  atomic_store(&rt->stopped, 1);
  rt->backend->stop(rt);
  return code;
}

int rtrun_fail(RtDevice *dev, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  rtrun_vfail(dev, code, fmt, ap);
  va_end(ap);
  return code;
}

int rt_fail(RtDevice *dev, const char *fmt, ...) {
  if (!dev) return RT_E_ARG;
  va_list ap;
  va_start(ap, fmt);
  rtrun_vfail(dev, RT_E_FAILED, fmt, ap);
  va_end(ap);
  return RT_E_FAILED;
}

int rt_check(RtDevice *dev) { return dev && rtrun_stopped(dev->rt) ? RT_E_STOPPED : RT_OK; }

void rtrun_describe(const Runtime *rt, int device, char *buf, size_t n) {
  const RtDevice *d = &rt->devices[device];
  uint64_t where = atomic_load(&d->where);
  int kind = (int)(where & 0xff) - 1, peer = (int)(where >> 16) - 1;
  unsigned mask = (unsigned)(where >> 8 & 0xff);
  if (atomic_load(&d->done)) {
    snprintf(buf, n, "%s (returned from its entry function)", d->label);
  } else if (kind < 0) {
    snprintf(buf, n, "%s (running its own code)", d->label);
  } else if (kind == RT_COLL_RECV || kind == RT_COLL_SEND) {
    snprintf(buf, n, "%s (in %s %s device %d)", d->label, rtrun_coll_name((RtCollKind)kind),
             kind == RT_COLL_RECV ? "from" : "to", peer);
  } else {
    char axes[RT_MAX_AXES * (RT_NAME_MAX + 2)] = "";
    size_t len = 0;
    for (int a = 0; a < rt->naxes; a++)
      if (mask >> a & 1)
        len += (size_t)snprintf(axes + len, sizeof axes - len, "%s%s", len ? ", " : "", rt->axis_name[a]);
    int line = atomic_load_explicit(&d->line, memory_order_relaxed);
    char at[32] = "";
    if (line > 0) snprintf(at, sizeof at, " at line %d", line);
    snprintf(buf, n, "%s (in %s over {%s}%s)", d->label, rtrun_coll_name((RtCollKind)kind), axes, at);
  }
}

int rt_device_index(const RtDevice *dev) { return dev->index; }

void rt_at_line(RtDevice *dev, int line) {
  atomic_store_explicit(&dev->line, line, memory_order_relaxed);
  if (dev->line_mirror) atomic_store_explicit(dev->line_mirror, line, memory_order_relaxed);
}

/* ---- processes ---- */

int rt_device_local(const Runtime *rt, int device) { return rt && rt->backend && device >= 0 && rtrun_local(rt, device); }
int rtrun_world_rank; /* this process's MPI rank once rt_mpi_init ran: the answer for a runtime that did not open */
int rt_process_rank(const Runtime *rt) { return rt && rt->backend ? rt->process_rank : rtrun_world_rank; }
int rt_process_count(const Runtime *rt) { return rt && rt->backend ? rt->process_count : 1; }

const void *rt_fetch_to_root(Runtime *rt, int device, const void *buf, size_t bytes, void *scratch) {
  if (!rt || !rt->backend || device < 0 || device >= rt->ndev) return NULL;
  if (!rt->backend->fetch_to_root) return buf;
  return rt->backend->fetch_to_root(rt, device, buf, bytes, scratch);
}

void rt_bcast_from_root(Runtime *rt, void *buf, size_t bytes) {
  if (rt && rt->backend && rt->backend->bcast_from_root && bytes) rt->backend->bcast_from_root(rt, buf, bytes);
}

int rt_processes_agree(Runtime *rt, int ok, char *msg, size_t n) {
  if (!rt || !rt->backend || !rt->backend->processes_agree) return ok != 0;
  return rt->backend->processes_agree(rt, ok, msg, n);
}

int rt_device_coord(const RtDevice *dev, int axis) {
  return axis >= 0 && axis < dev->rt->naxes ? dev->coord[axis] : -1;
}
