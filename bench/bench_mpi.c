/* bench_mpi.c: the runtime's collectives over MPI against Open MPI's own and against the threads
 * backend, on as many ranks as mpirun starts (4 for docs/benchmarks.md):
 *
 *   rt_all_reduce (f32, sum) and rt_all_gather over all devices of a mesh [ranks], on
 *     mpi       the MPI backend, one device per rank (runtime/mpi.c: signatures, then
 *               MPI_Alltoallv + rtk_reduce + MPI_Allgatherv, or MPI_Allgather for the gather)
 *     MPI       MPI_Allreduce / MPI_Allgather on MPI_COMM_WORLD, the same bytes: the baseline
 *               (Debian 12 has no osu-micro-benchmarks; this is its osu_allreduce loop)
 *     threads   the threads backend, as many device threads in rank 0's process (the other
 *               ranks sleep meanwhile)
 *   the hybrid: the MPI backend with 2 device threads per rank (mesh [2 x ranks]), for scale
 *
 * Figures: the buffer's bytes per device over the time of one collective (rank 0's view: from
 * leaving a barrier to leaving the collective, the mean over a loop, best of N loops).
 *
 * Usage: mpirun -np 4 bench_mpi [--smoke] [--reps N]. --smoke uses tiny sizes (ctest runs it). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shardrt_mpi.h"

static int reps = 5, smoke = 0, W = 1, ME = 0;

typedef struct Job {
  int gather;       /* 0: all_reduce, 1: all_gather */
  int64_t count;    /* elements of the result per device */
  int iters;
  float **in, **out; /* per device */
  double seconds;   /* device 0: per collective */
} Job;

static int device_fn(RtDevice *dev, void *arg) {
  Job *j = arg;
  int d = rt_device_index(dev), n = rt_group_size(dev, (int[]){0}, 1), rc;
  static const int x[1] = {0};
  if ((rc = rt_barrier(dev, x, 1))) return rc;
  double t0 = rt_seconds();
  for (int i = 0; i < j->iters && !rc; i++)
    rc = j->gather ? rt_all_gather(dev, x, 1, RT_F32, j->in[d], j->out[d], 1, j->count / n, 1)
                   : rt_all_reduce(dev, x, 1, RT_F32, RT_SUM, j->in[d], j->out[d], j->count);
  if (d == 0) j->seconds = (rt_seconds() - t0) / j->iters;
  return rc;
}

static double run_rt(RtBackendKind backend, int ndev, int per_rank, int gather, int64_t count, int iters) {
  RtConfig cfg = {.naxes = 1, .axis_size = {ndev}, .backend = backend, .threads_per_rank = per_rank};
  Runtime *rt;
  if (rt_open(&cfg, &rt)) {
    fprintf(stderr, "bench_mpi: %s\n", rt_errmsg(rt));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  Job j = {gather, count, iters, calloc((size_t)ndev, sizeof(float *)), calloc((size_t)ndev, sizeof(float *)), 0};
  for (int d = 0; d < ndev; d++) {
    if (!rt_device_local(rt, d)) continue;
    j.in[d] = malloc((size_t)count * sizeof(float));
    j.out[d] = malloc((size_t)count * sizeof(float));
    for (int64_t i = 0; i < count; i++) j.in[d][i] = rt_random_float(1, (uint64_t)d, (uint64_t)i, -1, 1);
  }
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    if (rt_run(rt, device_fn, &j)) {
      fprintf(stderr, "bench_mpi: %s\n", rt_errmsg(rt));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (j.seconds < best) best = j.seconds;
  }
  for (int d = 0; d < ndev; d++) free(j.in[d]), free(j.out[d]);
  free(j.in), free(j.out);
  rt_close(rt);
  return best;
}

static double run_mpi(int gather, int64_t count, int iters) {
  float *in = malloc((size_t)count * sizeof(float)), *out = malloc((size_t)count * sizeof(float));
  for (int64_t i = 0; i < count; i++) in[i] = rt_random_float(1, (uint64_t)ME, (uint64_t)i, -1, 1);
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++)
      if (gather) MPI_Allgather(in, (int)(count / W), MPI_FLOAT, out, (int)(count / W), MPI_FLOAT, MPI_COMM_WORLD);
      else MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double t = (MPI_Wtime() - t0) / iters;
    if (t < best) best = t;
  }
  free(in), free(out);
  return best;
}

/* The threads backend in rank 0 alone; the others wait without taking a core. */
static double run_threads(int gather, int64_t count, int iters) {
  double t = 0;
  if (ME == 0) t = run_rt(RT_BACKEND_THREADS, W, 0, gather, count, iters);
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  for (int done = 0; !done;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (!done) nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
  return t;
}

static void row(const char *what, int64_t count, double t_rt, double t_mpi, double t_thr, double t_hyb) {
  double bytes = (double)count * 4;
  char size[32];
  if (bytes >= 1 << 20) snprintf(size, sizeof size, "%g MiB", bytes / (1 << 20));
  else snprintf(size, sizeof size, "%g KiB", bytes / 1024);
  printf("  %-10s %-9s %9.1f us %7.2f GB/s | %9.1f us %7.2f GB/s | %9.1f us %7.2f GB/s | %9.1f us %7.2f GB/s | %5.2fx\n", what,
         size, t_rt * 1e6, bytes / t_rt / 1e9, t_mpi * 1e6, bytes / t_mpi / 1e9, t_thr * 1e6, bytes / t_thr / 1e9, t_hyb * 1e6,
         bytes / t_hyb / 1e9, t_mpi / t_rt);
}

int main(int argc, char **argv) {
  char err[256];
  if (rt_mpi_init(&argc, &argv, err, sizeof err)) {
    fprintf(stderr, "bench_mpi: %s\n", err);
    return 1;
  }
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--smoke")) smoke = 1;
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
  }
  if (smoke) reps = 1;
  W = rt_mpi_size(), ME = rt_mpi_rank();
  static const int64_t full[] = {4096, 65536, 1 << 20, 4 << 20}, tiny[] = {64, 20000};
  const int64_t *counts = smoke ? tiny : full;
  int ncounts = smoke ? 2 : 4;
  if (ME == 0)
    printf("bench_mpi: %d ranks; per collective (rank 0's device, best of %d loops), bytes of the result per device\n"
           "  %-10s %-9s %-27s | %-27s | %-27s | %-27s | %s\n",
           W, reps, "collective", "size", "shardrt over MPI", "Open MPI's own", "shardrt threads", "MPI, 2 threads/rank",
           "MPI's/ours");
  for (int gather = 0; gather < 2; gather++)
    for (int c = 0; c < ncounts; c++) {
      int64_t count = counts[c] / (4 * W) * (4 * W); /* divisible by the ranks and 2 x ranks */
      int iters = smoke ? 2 : count >= (1 << 20) ? 20 : 200;
      double t_rt = run_rt(RT_BACKEND_MPI, W, 1, gather, count, iters);
      double t_mpi = run_mpi(gather, count, iters);
      double t_thr = run_threads(gather, count, iters);
      double t_hyb = run_rt(RT_BACKEND_MPI, 2 * W, 2, gather, count, iters);
      if (ME == 0) row(gather ? "all_gather" : "all_reduce", count, t_rt, t_mpi, t_thr, t_hyb);
    }
  rt_mpi_finalize();
  return 0;
}
