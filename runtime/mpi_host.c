/* mpi_host.c: the MPI backend's process: MPI's start and end (rt_mpi_init registers mpi.c's
 * backend), the main of an executable built with --backend mpi, and the launcher's status file.
 *
 * The status file. `shardc run --backend mpi` starts mpirun and then knows nothing of its ranks but
 * their exit; a rank killed mid-step (SIGKILL, the OOM killer) says nothing at all, and mpirun
 * stops the others. So the launcher creates a small file (rt_mpi_status_create) and passes its
 * path in SHARDC_MPI_STATUS; each rank on the same host maps it and keeps in it its state
 * (running, finished, stopped by mpirun's SIGTERM, or the fatal signal it caught) and, per device,
 * what it is in (the collective, with the op's line from rt_at_line). After mpirun ends, a rank
 * still "running" is one that died without a word: rt_mpi_status_report names it, its devices
 * and where each was. Ranks on other hosts cannot reach the file; there mpirun's own message
 * (which names the rank) is all there is. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "mpi_int.h"

static RtStatusFile *status_map;
static size_t status_size;
static int my_rank = 0, world = 1;

int rt_mpi_launched(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_SIZE") || getenv("PMI_RANK");
}

int rt_mpi_rank(void) { return my_rank; }
int rt_mpi_size(void) { return world; }

/* ---- the status file ---- */

static void mark(int32_t state, int32_t sig) {
  if (!status_map || my_rank >= (int)status_map->ranks) return;
  RtStatusRank *r = &rt_status_ranks(status_map)[my_rank];
  if (sig) atomic_store(&r->sig, sig);
  atomic_store(&r->state, state);
}

static struct sigaction old_action[32];

/* mpirun stops the other ranks with SIGTERM when one ends abnormally: those are not to blame. A
 * fatal signal of its own is recorded, then handled as before (Open MPI prints a backtrace). */
static void on_signal(int sig) {
  mark(sig == SIGTERM ? RT_RANK_TERMINATED : RT_RANK_SIGNALLED, sig);
  sigaction(sig, &old_action[sig], NULL);
  raise(sig);
}

static void map_status(void) {
  const char *path = getenv("SHARDC_MPI_STATUS");
  if (!path || !*path) return;
  int fd = open(path, O_RDWR);
  if (fd < 0) return; /* another host: nothing to say through it */
  struct stat st;
  if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(RtStatusFile)) {
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      RtStatusFile *f = p;
      if (f->magic == RT_STATUS_MAGIC && (size_t)st.st_size >= rt_status_bytes((int)f->ndev, (int)f->ranks) &&
          my_rank < (int)f->ranks) {
        status_map = f, status_size = (size_t)st.st_size;
      } else {
        munmap(p, (size_t)st.st_size);
      }
    }
  }
  close(fd);
  if (!status_map) return;
  atomic_store(&rt_status_ranks(status_map)[my_rank].pid, (int32_t)getpid());
  mark(RT_RANK_RUNNING, 0);
  static const int sigs[] = {SIGTERM, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
  for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(sigs[i], &sa, &old_action[sigs[i]]);
  }
}

RtStatusFile *rtmpi_status(int ndev, int ranks) {
  return status_map && (int)status_map->ndev == ndev && (int)status_map->ranks == ranks ? status_map : NULL;
}

void rtmpi_mark_aborting(void) { mark(RT_RANK_TERMINATED, 0); }

int rt_mpi_status_create(int ndev, int ranks, int threads_per_rank, char *path, size_t n) {
  const char *dir = getenv("TMPDIR");
  snprintf(path, n, "%s/shardc-mpi-XXXXXX", dir && *dir ? dir : "/tmp");
  int fd = mkstemp(path);
  if (fd < 0) return RT_E_SYS;
  size_t bytes = rt_status_bytes(ndev, ranks);
  RtStatusFile head = {RT_STATUS_MAGIC, (uint32_t)ndev, (uint32_t)ranks, (uint32_t)threads_per_rank};
  int ok = ftruncate(fd, (off_t)bytes) == 0 && pwrite(fd, &head, sizeof head, 0) == (ssize_t)sizeof head;
  close(fd);
  if (!ok) unlink(path);
  return ok ? RT_OK : RT_E_SYS;
}

/* "all_reduce over {x} at line 14" from a status word, as rtrun_describe says it */
static void where_text(const RtConfig *cfg, uint64_t where, int line, char *buf, size_t n) {
  int kind = (int)(where & 0xff) - 1, peer = (int)(where >> 16) - 1;
  unsigned mask = (unsigned)(where >> 8 & 0xff);
  char at[32] = "";
  if (line > 0) snprintf(at, sizeof at, " at line %d", line);
  if (kind < 0) {
    if (line > 0) snprintf(buf, n, "running the op at line %d", line);
    else snprintf(buf, n, "running its own code");
  } else if (kind == RT_COLL_RECV || kind == RT_COLL_SEND) {
    snprintf(buf, n, "in %s %s device %d%s", rtrun_coll_name((RtCollKind)kind), kind == RT_COLL_RECV ? "from" : "to", peer, at);
  } else {
    char axes[RT_MAX_AXES * (RT_NAME_MAX + 2)] = "";
    size_t len = 0;
    for (int a = 0; a < cfg->naxes && a < RT_MAX_AXES; a++)
      if (mask >> a & 1)
        len += (size_t)snprintf(axes + len, sizeof axes - len, "%s%s", len ? ", " : "", cfg->axis_name[a] ? cfg->axis_name[a] : "?");
    snprintf(buf, n, "in %s over {%s}%s", rtrun_coll_name((RtCollKind)kind), axes, at);
  }
}

static void device_label(const RtConfig *cfg, int d, char *buf, size_t n) {
  size_t len = (size_t)snprintf(buf, n, "device %d", d);
  int64_t below = 1;
  for (int a = cfg->naxes - 1; a >= 0; a--) below *= cfg->axis_size[a];
  for (int a = 0; a < cfg->naxes && len < n; a++) {
    below /= cfg->axis_size[a];
    len += (size_t)snprintf(buf + len, n - len, "%s%s=%lld", a ? ", " : " [", cfg->axis_name[a] ? cfg->axis_name[a] : "?",
                            (long long)(d / below % cfg->axis_size[a]));
  }
  if (cfg->naxes && len < n) snprintf(buf + len, n - len, "]");
}

int rt_mpi_status_report(const char *path, const RtConfig *cfg, char *buf, size_t n) {
  buf[0] = 0;
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  struct stat st;
  void *p = fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(RtStatusFile)
                ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0)
                : MAP_FAILED;
  close(fd);
  if (p == MAP_FAILED) return -1;
  RtStatusFile *f = p;
  int bad = 0, seen = 0;
  if (f->magic == RT_STATUS_MAGIC && (size_t)st.st_size >= rt_status_bytes((int)f->ndev, (int)f->ranks) && f->threads_per_rank) {
    RtStatusRank *ranks = rt_status_ranks(f);
    RtStatusDevice *devs = rt_status_devices(f);
    for (uint32_t r = 0; r < f->ranks; r++) seen += atomic_load(&ranks[r].state) != RT_RANK_UNSEEN;
    size_t len = 0;
    for (uint32_t r = 0; seen && r < f->ranks && len < n; r++) {
      int state = atomic_load(&ranks[r].state), sig = atomic_load(&ranks[r].sig);
      if (state == RT_RANK_FINISHED || state == RT_RANK_TERMINATED) continue;
      bad++;
      const char *how = state == RT_RANK_UNSEEN      ? "never started"
                        : state == RT_RANK_SIGNALLED ? "crashed"
                                                     : "ended without finishing (killed, or it exited)";
      len += (size_t)snprintf(buf + len, n - len, "%srank %u (pid %d) %s", len ? "\n" : "", r, (int)atomic_load(&ranks[r].pid), how);
      if (state == RT_RANK_SIGNALLED && len < n) len += (size_t)snprintf(buf + len, n - len, " on signal %d (%s)", sig, strsignal(sig));
      for (uint32_t i = 0; state != RT_RANK_UNSEEN && i < f->threads_per_rank && len < n; i++) {
        int d = (int)(r * f->threads_per_rank + i);
        if (d >= (int)f->ndev) break;
        char label[RT_LABEL_MAX], what[256];
        device_label(cfg, d, label, sizeof label);
        if (atomic_load(&devs[d].done)) snprintf(what, sizeof what, "had returned from its entry function");
        else where_text(cfg, atomic_load(&devs[d].where), atomic_load(&devs[d].line), what, sizeof what);
        len += (size_t)snprintf(buf + len, n - len, "%s %s %s", i ? ";" : ":", label, what);
      }
    }
  }
  munmap(p, (size_t)st.st_size);
  return bad;
}

/* ---- MPI's start and end ---- */

int rt_mpi_init(int *argc, char ***argv, char *err, size_t n) {
  int inited = 0, finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    snprintf(err, n, "MPI was already ended in this process");
    return RT_E_SYS;
  }
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
      snprintf(err, n, "MPI_Init_thread failed");
      return RT_E_SYS;
    }
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  /* the waits sleep for microseconds (mpi.c): without this the kernel rounds them up to 50 us */
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  rtrun_mpi_backend = &rt_mpi_backend;
  rtrun_world_rank = my_rank;
  map_status();
  return RT_OK;
}

void rt_mpi_finalize(void) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (!inited || finalized) return;
  mark(RT_RANK_FINISHED, 0);
  MPI_Finalize();
  rtrun_mpi_backend = NULL;
  if (status_map) munmap(status_map, status_size), status_map = NULL;
}

int rt_mpi_bcast_int(int x) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Bcast(&x, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return x;
}

int rt_mpi_all(int ok) {
  int inited = 0, finalized = 0, all = ok != 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all;
}

int rt_mpi_main(int argc, char **argv, const RtProgram *p) {
  char err[256];
  if (rt_mpi_init(&argc, &argv, err, sizeof err)) {
    fprintf(stderr, "error: %s\n", err);
    return 1;
  }
  RtProgram q = *p;
  q.backend = RT_BACKEND_MPI;
  int rc = rt_launch_main(argc, argv, &q);
  rc = rt_mpi_bcast_int(rc);
  rt_mpi_finalize();
  return rc;
}
