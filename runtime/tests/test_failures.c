/* test_failures.c: what happens when things go wrong. A failing device stops the others
 * promptly wherever they wait (a collective, a recv, a barrier); a collective or a recv that
 * waits too long ends with a timeout naming the device, the collective and who is missing; a
 * peer that returned is noticed at once; over-cap and injected allocation failures are errors
 * naming the buffer; meshes over the device limit are refused; bad arguments are caught; and
 * failures at random points while peers read each other's buffers leave no dangling reads (the
 * ASan build checks that). */
#include "rt_test.h"

static const int X[1] = {0};

/* ---- a failing device stops the others ---- */

typedef struct Stop {
  int rc[4];
} Stop;

/* Device 2 fails after 20 ms; meanwhile 0 waits in an all_reduce, 1 in a recv from 2, 3 in a
 * barrier: all must wake and return RT_E_STOPPED, long before the 60 s timeout. */
static int stop_device(RtDevice *dev, void *arg) {
  Stop *s = arg;
  int d = rt_device_index(dev), rc;
  float buf[64] = {0};
  switch (d) {
  case 2:
    test_sleep_us(20000);
    rc = rt_fail(dev, "line 12: take: index %d out of range [0, %d)", 70, 64);
    break;
  case 0: rc = rt_all_reduce(dev, TG(X, 1), RT_F32, RT_SUM, buf, buf, 64); break;
  case 1: rc = rt_recv(dev, 2, 0, buf, sizeof buf); break;
  default: rc = rt_barrier(dev, TG(X, 1)); break;
  }
  s->rc[d] = rc;
  return rc;
}

static void test_fail_stops_all(void) {
  ut_begin("a failing device stops devices waiting in all_reduce, recv and barrier within 0.5 s");
  RtConfig cfg = test_mesh(1, (int[]){4});
  Runtime *rt;
  rt_open(&cfg, &rt);
  Stop s;
  double t0 = rt_seconds();
  int rc = rt_run(rt, stop_device, &s);
  double took = rt_seconds() - t0;
  UT_CHECK(rc == RT_E_FAILED, "rt_run returned %s", rt_status_name(rc));
  UT_CHECK(!strcmp(rt_errmsg(rt), "device 2 [x=2]: line 12: take: index 70 out of range [0, 64)"), "message: %s",
           rt_errmsg(rt));
  UT_CHECK(took < 0.5, "took %.3f s", took);
  UT_CHECK(s.rc[2] == RT_E_FAILED, "device 2 returned %s", rt_status_name(s.rc[2]));
  for (int d = 0; d < 4; d++)
    if (d != 2) UT_CHECK(s.rc[d] == RT_E_STOPPED, "device %d returned %s", d, rt_status_name(s.rc[d]));
  /* the runtime is reusable after a stopped run */
  rc = rt_run(rt, stop_device, &s);
  UT_CHECK(rc == RT_E_FAILED && contains(rt_errmsg(rt), "device 2"), "second run: %s", rt_errmsg(rt));
  rt_close(rt);
  ut_end();
}

/* Only the first failure's message is kept. */
static int two_fail_device(RtDevice *dev, void *arg) {
  int d = rt_device_index(dev);
  if (d == 1) return rt_fail(dev, "first");
  test_sleep_us(50000);
  return d == 3 ? rt_fail(dev, "second") : rt_barrier(dev, TG(X, 1));
}

static void test_first_failure_wins(void) {
  ut_begin("the first failure's message is the one reported");
  RtConfig cfg = test_mesh(1, (int[]){4});
  Runtime *rt;
  rt_open(&cfg, &rt);
  int rc = rt_run(rt, two_fail_device, NULL);
  UT_CHECK(rc == RT_E_FAILED && !strcmp(rt_errmsg(rt), "device 1 [x=1]: first"), "%s: %s", rt_status_name(rc),
           rt_errmsg(rt));
  rt_close(rt);
  ut_end();
}

/* An entry function that returns an error without rt_fail still stops the run. */
static int bare_error_device(RtDevice *dev, void *arg) {
  if (rt_device_index(dev) == 0) return 42;
  return rt_barrier(dev, TG(X, 1));
}

static void test_bare_error(void) {
  ut_begin("an entry function returning an error of its own stops the run and is reported");
  RtConfig cfg = test_mesh(1, (int[]){3});
  Runtime *rt;
  rt_open(&cfg, &rt);
  double t0 = rt_seconds();
  int rc = rt_run(rt, bare_error_device, NULL);
  UT_CHECK(rc != RT_OK, "rt_run returned RT_OK");
  UT_CHECK(contains(rt_errmsg(rt), "device 0 [x=0]: the entry function returned 42"), "message: %s", rt_errmsg(rt));
  UT_CHECK(rt_seconds() - t0 < 0.5, "took %.2f s", rt_seconds() - t0);
  rt_close(rt);
  ut_end();
}

/* ---- timeouts ---- */

/* The stuck device is busy in its own code (polling rt_check, as a long loop in generated code
 * would) and never reaches the collective. */
static int stuck_device(RtDevice *dev, void *arg) {
  int kind = *(int *)arg, d = rt_device_index(dev);
  float in[8] = {0}, out[32];
  static const int yx[2] = {1, 0};
  if (d == 3) {
    while (rt_check(dev) == RT_OK) test_sleep_us(1000);
    return RT_E_STOPPED;
  }
  switch (kind) {
  case 0: return rt_all_reduce(dev, TG(X, 1), RT_F32, RT_SUM, in, out, 8);
  case 1: return rt_all_gather(dev, TG(yx, 2), RT_F32, in, out, 1, 8, 1);
  default: return d == 1 ? rt_recv(dev, 3, 5, in, sizeof in) : RT_OK;
  }
}

static void test_timeouts(void) {
  static const char *const names[] = {"all_reduce over (x) on [x: 4]", "all_gather over (y, x) on [x: 2, y: 2]",
                                      "recv from a device that never sends"};
  for (int kind = 0; kind < 3; kind++) {
    char name[128];
    snprintf(name, sizeof name, "a stuck %s times out after 0.2 s, naming the device and the collective", names[kind]);
    ut_begin(name);
    RtConfig cfg = kind == 1 ? test_mesh(2, (int[]){2, 2}) : test_mesh(1, (int[]){4});
    cfg.timeout_s = 0.2;
    Runtime *rt;
    rt_open(&cfg, &rt);
    double t0 = rt_seconds();
    int rc = rt_run(rt, stuck_device, &kind);
    double took = rt_seconds() - t0;
    const char *msg = rt_errmsg(rt);
    UT_CHECK(rc == RT_E_TIMEOUT, "rt_run returned %s: %s", rt_status_name(rc), msg);
    UT_CHECK(took >= 0.2 && took < 1.0, "took %.3f s", took);
    if (kind == 0) {
      UT_CHECK(contains(msg, ": all_reduce over (x) timed out after 0.2 s waiting for device 3 [x=3] (running its own code)"),
               "message: %s", msg);
    } else if (kind == 1) {
      UT_CHECK(contains(msg, ": all_gather over (y, x) timed out after 0.2 s waiting for device 3 [x=1, y=1] (running its own code)"),
               "message: %s", msg);
    } else {
      UT_CHECK(!strcmp(msg, "device 1 [x=1]: recv from device 3 (tag 5) timed out after 0.2 s; device 3 [x=3] (running its own code)"),
               "message: %s", msg);
    }
    UT_CHECK(!contains(msg, "device 3 [x=3]: ") && !contains(msg, "device 3 [x=1, y=1]: "),
             "the stuck device is blamed as the one that timed out: %s", msg);
    rt_close(rt);
    ut_end();
  }
}

/* A peer that returned from its entry function will never arrive: noticed without waiting for
 * the timeout. */
static int early_return_device(RtDevice *dev, void *arg) {
  int which = *(int *)arg, d = rt_device_index(dev);
  float in[8] = {0}, out[32];
  if (d == 3) return RT_OK;
  if (which == 0) return rt_all_gather(dev, TG(X, 1), RT_F32, in, out, 1, 8, 1);
  return d == 0 ? rt_recv(dev, 3, 1, in, sizeof in) : RT_OK;
}

static void test_peer_returned(void) {
  for (int which = 0; which < 2; which++) {
    ut_begin(which ? "a recv from a device that returned without sending fails at once"
                   : "a collective whose peer returned without calling it fails at once");
    RtConfig cfg = test_mesh(1, (int[]){4}); /* the default 60 s timeout */
    Runtime *rt;
    rt_open(&cfg, &rt);
    double t0 = rt_seconds();
    int rc = rt_run(rt, early_return_device, &which);
    UT_CHECK(rc == RT_E_MISMATCH, "rt_run returned %s: %s", rt_status_name(rc), rt_errmsg(rt));
    UT_CHECK(contains(rt_errmsg(rt), which ? "recv from device 3 (tag 1): device 3 [x=3] (returned from its entry function) without sending it"
                                           : "all_gather over (x): device 3 [x=3] (returned from its entry function) without calling it"),
             "message: %s", rt_errmsg(rt));
    UT_CHECK(rt_seconds() - t0 < 0.5, "took %.2f s", rt_seconds() - t0);
    rt_close(rt);
    ut_end();
  }
}

/* ---- memory ---- */

static int cap_device(RtDevice *dev, void *arg) {
  void *w, *h;
  int rc = rt_alloc(dev, 600 * 1024, "weights", &w);
  if (rc) return rc;
  if (rt_device_index(dev) == 1) {
    rc = rt_alloc(dev, 600 * 1024, "h1", &h);
    if (rc) return rc;
    rt_free(dev, h);
  }
  return rt_free(dev, w);
}

static void test_over_cap(void) {
  ut_begin("going over the per-device cap fails, naming the device, the buffer and the sizes");
  RtConfig cfg = test_mesh(1, (int[]){4});
  cfg.mem_cap = 1 << 20;
  Runtime *rt;
  rt_open(&cfg, &rt);
  int rc = rt_run(rt, cap_device, NULL);
  UT_CHECK(rc == RT_E_NOMEM, "rt_run returned %s", rt_status_name(rc));
  UT_CHECK(!strcmp(rt_errmsg(rt), "device 1 [x=1]: out of memory for buffer 'h1': it needs 614400 bytes (600.0 KiB) "
                                  "with 614400 bytes (600.0 KiB) in use, over the cap of 1048576 bytes (1.0 MiB) per device"),
           "message: %s", rt_errmsg(rt));
  RtStats s;
  rt_stats(rt, 1, &s);
  UT_CHECK(s.mem_peak == 600 * 1024 && s.mem_cap == 1 << 20 && s.allocs == 2, "device 1: peak %zu cap %zu allocs %llu",
           s.mem_peak, s.mem_cap, (unsigned long long)s.allocs);
  /* what device 1 did not free is still on its account, and rt_close frees it */
  UT_CHECK(s.mem_current == 600 * 1024, "device 1 holds %zu bytes", s.mem_current);
  rt_close(rt);
  ut_end();
}

static int inject_device(RtDevice *dev, void *arg) {
  void *p[5] = {0};
  char name[16];
  int rc = RT_OK;
  for (int i = 0; i < 5 && !rc; i++) {
    snprintf(name, sizeof name, "buf%d", i + 1);
    rc = rt_alloc(dev, 1000, name, &p[i]);
  }
  for (int i = 0; i < 5; i++) rt_free(dev, p[i]);
  return rc;
}

static void test_injected(void) {
  ut_begin("an injected failure of the 3rd allocation on device 2 is reported as such");
  RtConfig cfg = test_mesh(2, (int[]){2, 2});
  cfg.fail_alloc_nth = 3;
  cfg.fail_alloc_device = 2;
  Runtime *rt;
  rt_open(&cfg, &rt);
  int rc = rt_run(rt, inject_device, NULL);
  UT_CHECK(rc == RT_E_NOMEM, "rt_run returned %s", rt_status_name(rc));
  UT_CHECK(!strcmp(rt_errmsg(rt), "device 2 [x=1, y=0]: cannot allocate buffer 'buf3' of 1000 bytes: injected failure of allocation #3"),
           "message: %s", rt_errmsg(rt));
  for (int d = 0; d < 4; d++) {
    RtStats s;
    rt_stats(rt, d, &s);
    UT_CHECK(s.mem_current == 0, "device %d leaks %zu bytes", d, s.mem_current);
    if (d == 2) UT_CHECK(s.allocs == 3 && s.mem_peak == 2000, "device 2: %llu allocations, peak %zu", (unsigned long long)s.allocs, s.mem_peak);
  }
  rt_close(rt);
  ut_end();

  ut_begin("an injected failure on every device: one of them is reported");
  cfg.fail_alloc_device = -1;
  cfg.fail_alloc_nth = 1;
  rt_open(&cfg, &rt);
  rc = rt_run(rt, inject_device, NULL);
  UT_CHECK(rc == RT_E_NOMEM && contains(rt_errmsg(rt), "'buf1' of 1000 bytes: injected failure of allocation #1"),
           "%s: %s", rt_status_name(rc), rt_errmsg(rt));
  rt_close(rt);
  ut_end();
}

static void test_host_alloc(void) {
  ut_begin("host allocations between runs: counted, aligned, a foreign free caught, the rest freed by rt_close");
  RtConfig cfg = test_mesh(1, (int[]){2});
  Runtime *rt;
  rt_open(&cfg, &rt);
  RtDevice *d1 = rt_device(rt, 1);
  UT_CHECK(d1 && !rt_device(rt, 2) && !rt_device(rt, -1), "rt_device bounds");
  void *a, *b, *c;
  UT_CHECK(!rt_alloc(d1, 100, "a", &a) && !rt_alloc(d1, 3000, "b", &b) && !rt_alloc(d1, 0, "c", &c), "allocations failed");
  UT_CHECK((uintptr_t)a % 64 == 0 && (uintptr_t)b % 64 == 0, "not 64-byte aligned");
  memset(b, 1, 3000);
  rt_free(d1, b);
  RtStats s;
  rt_stats(rt, 1, &s);
  UT_CHECK(s.mem_current == 100 && s.mem_peak == 3100 && s.allocs == 3, "current %zu peak %zu allocs %llu", s.mem_current,
           s.mem_peak, (unsigned long long)s.allocs);
  /* A pointer rt_alloc did not return (one inside a plain malloc, so that reading the header
   * rt_free looks for is itself valid). */
  char *plain = calloc(1, 512);
  int rc = rt_free(d1, plain + 256);
  UT_CHECK(rc == RT_E_ARG && contains(rt_errmsg(rt), "not a live buffer"), "a foreign pointer: %s: %s",
           rt_status_name(rc), rt_errmsg(rt));
  free(plain);
  rt_close(rt); /* frees a and c: the leak checker of the ASan build watches */
  ut_end();
}

/* A freed large buffer is kept and handed to the next allocation of the same size (alloc.c):
 * same pointer, counted as free meanwhile, a second free of it still caught, and rt_close frees
 * what is kept (the ASan build's leak checker watches). A buffer of another rounded size is not
 * reused. */
static void test_spare_buffers(void) {
  ut_begin("large freed buffers kept for the same size: reused, counted as free, double free caught");
  RtConfig cfg = test_mesh(1, (int[]){1});
  Runtime *rt;
  rt_open(&cfg, &rt);
  RtDevice *d = rt_device(rt, 0);
  size_t big = 2u << 20;
  void *a = NULL, *b = NULL, *c = NULL;
  UT_CHECK(!rt_alloc(d, big, "a", &a), "allocation failed");
  memset(a, 7, big);
  rt_free(d, a);
  RtStats s;
  rt_stats(rt, 0, &s);
  UT_CHECK(s.mem_current == 0 && s.mem_peak == big, "after the free: current %zu, peak %zu", s.mem_current, s.mem_peak);
  int rc = rt_free(d, a);
  UT_CHECK(rc == RT_E_ARG && contains(rt_errmsg(rt), "not a live buffer"), "a second free: %s", rt_status_name(rc));
  UT_CHECK(!rt_alloc(d, big - 100, "b", &b), "allocation failed"); /* another size, rounded to 64: not reused */
  UT_CHECK(b != a, "a buffer of another rounded size was reused");
  UT_CHECK(!rt_alloc(d, big, "c", &c) && c == a, "the kept buffer was not reused (%p, kept %p)", c, a);
  rt_stats(rt, 0, &s);
  UT_CHECK(s.mem_current == 2 * big - 100 && s.mem_peak == 2 * big - 100, "current %zu peak %zu", s.mem_current, s.mem_peak);
  rt_free(d, b);
  rt_free(d, c);
  rt_close(rt);
  ut_end();
}

/* ---- limits and arguments ---- */

static int count_device(RtDevice *dev, void *arg) {
  _Atomic int *ran = arg;
  atomic_fetch_add(&ran[rt_device_index(dev)], 1);
  return rt_barrier(dev, TG((int[]){0, 1}, 2));
}

static void test_device_limit(void) {
  ut_begin("a mesh over the 64-device limit is refused, naming both numbers");
  RtConfig cfg = test_mesh(2, (int[]){8, 16});
  Runtime *rt;
  int rc = rt_open(&cfg, &rt);
  UT_CHECK(rc == RT_E_LIMIT, "rt_open returned %s", rt_status_name(rc));
  UT_CHECK(!strcmp(rt_errmsg(rt), "mesh [x: 8, y: 16] has 128 devices: over the limit of 64 device threads this runtime "
                                  "runs (one thread per device); run a smaller mesh"),
           "message: %s", rt_errmsg(rt));
  UT_CHECK(rt_run(rt, count_device, NULL) == RT_E_LIMIT && rt_device_count(rt) == 0, "a refused runtime ran");
  rt_close(rt);
  cfg.max_devices = RT_HARD_MAX_DEVICES + 1;
  rc = rt_open(&cfg, &rt);
  UT_CHECK(rc == RT_E_LIMIT && contains(rt_errmsg(rt), "max_devices"), "max_devices over the hard limit: %s", rt_errmsg(rt));
  rt_close(rt);
  RtConfig huge = test_mesh(3, (int[]){1 << 20, 1 << 20, 1 << 20});
  rc = rt_open(&huge, &rt);
  UT_CHECK(rc == RT_E_LIMIT && contains(rt_errmsg(rt), "more than 4096 devices"), "an overflowing mesh: %s", rt_errmsg(rt));
  rt_close(rt);
  ut_end();

  ut_begin("with max_devices 128, the same mesh runs 128 threads");
  cfg.max_devices = 128;
  rc = rt_open(&cfg, &rt);
  UT_CHECK(rc == RT_OK && rt_device_count(rt) == 128, "rt_open: %s", rt_errmsg(rt));
  _Atomic int ran[128] = {0};
  rc = rt_run(rt, count_device, ran);
  UT_CHECK(rc == RT_OK, "rt_run: %s", rt_errmsg(rt));
  for (int d = 0; d < 128; d++) UT_CHECK(ran[d] == 1, "device %d ran %d times", d, ran[d]);
  rt_close(rt);
  ut_end();
}

/* Replica groups over (x) holding devices 0 and 1 alone: devices 2 and 3 are in none. */
static const int32_t half_members[2] = {0, 1}, half_group[4] = {0, 0, -1, -1}, half_rank[4] = {0, 1, -1, -1};
static const RtGroups half = {.naxes = 1, .axes = {0}, .ngroups = 1, .size = 2, .subset = 1, .members = half_members,
                              .group_of = half_group, .rank_of = half_rank, .text = "(x) ranks {0, 1}"};

static int bad_args_device(RtDevice *dev, void *arg) {
  int which = *(int *)arg;
  float in[16] = {0}, out[64];
  switch (which) {
  case 0: return rt_all_to_all(dev, TG(X, 1), RT_F32, in, out, 2, (int64_t[]){3, 4}, 0, 1);
  case 1: return rt_all_gather(dev, NULL, RT_F32, in, out, 1, 4, 1);
  case 2: return rt_device_index(dev) >= 2 ? rt_all_reduce(dev, &half, RT_F32, RT_SUM, in, out, 4) : RT_OK;
  case 3: return rt_all_gather(dev, TG(X, 1), RT_F32, in, in + 1, 1, 4, 1);
  case 4: return rt_permute_pairs(dev, TG(X, 1), RT_F32, in, out, 4, (int[]){0, 1, 2, 1}, 2);
  case 5: return rt_send(dev, 9, 0, in, 4);
  case 6: return rt_reduce_scatter(dev, TG(X, 1), (RtDtype)9, RT_SUM, in, out, 1, 1, 1);
  default: return rt_gemm(dev, &(RtGemm){.a_type = RT_F32, .b_type = RT_F32, .c_type = RT_F32, .m = 2, .n = 3, .k = 4,
                                          .a = in, .lda = 3, .b = in, .ldb = 3, .c = out, .ldc = 3});
  }
}

static void test_bad_args(void) {
  static const char *const want[] = {
      "all_to_all over (x): split dim 0 (size 3) does not divide into 4 blocks",
      "all_gather: malformed replica groups",
      "all_reduce over (x) ranks {0, 1}: the replica groups hold no group of this device",
      "all_gather over (x): the input and the output overlap",
      "collective_permute over (x): rank 1 receives twice in the pairs",
      "send to device 9: the mesh has devices 0 to 3",
      "reduce_scatter over (x): unknown dtype 9",
      "gemm: lda is 3, needs at least 4",
  };
  for (int which = 0; which < 8; which++) {
    char name[160];
    snprintf(name, sizeof name, "bad arguments are an RT_E_ARG naming the call: %s", want[which]);
    ut_begin(name);
    RtConfig cfg = test_mesh(1, (int[]){4});
    Runtime *rt;
    rt_open(&cfg, &rt);
    int rc = rt_run(rt, bad_args_device, &which);
    UT_CHECK(rc == RT_E_ARG, "rt_run returned %s: %s", rt_status_name(rc), rt_errmsg(rt));
    UT_CHECK(contains(rt_errmsg(rt), want[which]), "message: %s", rt_errmsg(rt));
    rt_close(rt);
    ut_end();
  }
}

/* ---- failures at random points while buffers are shared ---- */

typedef struct Chaos {
  int run;
} Chaos;

/* Devices loop over collectives on freshly allocated buffers, freeing them right after each
 * returns; one device fails at a run-dependent step. A device that left a collective while a
 * peer still read its input would show as a use-after-free in the ASan build. */
static int chaos_device(RtDevice *dev, void *arg) {
  Chaos *c = arg;
  int d = rt_device_index(dev), rc = RT_OK;
  int fails_at = d == c->run % 4 ? c->run % 7 : -1;
  static const int yx[2] = {1, 0};
  for (int step = 0; step < 12 && !rc; step++) {
    if (step == fails_at) return rt_fail(dev, "step %d", step);
    float *in, *out;
    if ((rc = rt_alloc(dev, 4096 * sizeof(float), "in", (void **)&in))) break;
    if ((rc = rt_alloc(dev, 4 * 4096 * sizeof(float), "out", (void **)&out))) {
      rt_free(dev, in);
      break;
    }
    for (int i = 0; i < 4096; i++) in[i] = (float)(d + i);
    if (test_hash((uint64_t)c->run, (uint64_t)d, (uint64_t)step) % 3 == 0) test_sleep_us(200);
    switch (step % 3) {
    case 0: rc = rt_all_gather(dev, TG(yx, 2), RT_F32, in, out, 1, 4096, 1); break;
    case 1: rc = rt_all_reduce(dev, TG(yx, 2), RT_F32, RT_SUM, in, out, 4096); break;
    default: rc = rt_all_to_all(dev, TG(yx, 2), RT_F32, in, out, 2, (int64_t[]){64, 64}, 0, 1); break;
    }
    rt_free(dev, in);
    rt_free(dev, out);
  }
  return rc;
}

static void test_chaos(void) {
  ut_begin("30 runs with a device failing at a different step: the right error, nothing read after free");
  RtConfig cfg = test_mesh(2, (int[]){2, 2});
  Runtime *rt;
  rt_open(&cfg, &rt);
  for (int run = 0; run < 30; run++) {
    Chaos c = {run};
    int rc = rt_run(rt, chaos_device, &c);
    char want[64];
    snprintf(want, sizeof want, "device %d [", run % 4);
    UT_CHECK(rc == RT_E_FAILED && !strncmp(rt_errmsg(rt), want, strlen(want)), "run %d: %s: %s", run,
             rt_status_name(rc), rt_errmsg(rt));
    for (int d = 0; d < 4; d++) {
      RtStats s;
      rt_stats(rt, d, &s);
      UT_CHECK(s.mem_current == 0, "run %d: device %d leaks %zu bytes", run, d, s.mem_current);
    }
    if (!ut_ok()) break;
  }
  rt_close(rt);
  ut_end();
}

int main(void) {
  test_fail_stops_all();
  test_first_failure_wins();
  test_bare_error();
  test_timeouts();
  test_peer_returned();
  test_over_cap();
  test_injected();
  test_host_alloc();
  test_spare_buffers();
  test_device_limit();
  test_bad_args();
  test_chaos();
  return ut_summary();
}
