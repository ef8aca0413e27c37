/* bench_posted.c: a collective-matmul-shaped ring (n - 1 permute steps, each overlapped with a
 * GEMM on the block at hand) on the threads backend, three ways, in one run:
 *
 *   blocking  rt_permute_shift, then the GEMM (the threads backend before posted permutes: its
 *             _start ran the whole rendezvous and rt_wait did nothing)
 *   posted    rt_permute_shift_start, the GEMM, rt_wait (the backend's design: the copy is made
 *             by whichever of sender and receiver waits first)
 *   progress  the other design docs/runtime.md weighs, emulated here outside the runtime: a
 *             progress thread per device makes the copy while its device runs the GEMM
 *             (posts and completions through one mutex and condition variable)
 *
 * Each step also reads the block just received (a checksum), so a step cannot start before its
 * block is there. The GEMM is m x m x m f32 through cblas_sgemm on the device thread (OpenBLAS
 * held to one thread by rt_run); the block is `count` floats. The alone-times of one GEMM and one
 * blocking permute step are printed first, so the overlap's ceiling is visible.
 *
 * Usage: bench_posted [--smoke] [--reps N] [--devices N] [--m M] [--count C] [--steps S]
 * (steps: rings per timed run, default 20). Times are best of N (default 5) per step of the
 * ring; a benchmark reports, it never fails on a figure. */
#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shardrt.h"

enum { BLOCKING, POSTED, PROGRESS, GEMM_ALONE, PERMUTE_ALONE, NMODES };
static const char *mode_name[NMODES] = {"blocking", "posted", "progress", "gemm alone", "permute alone"};

static int ndev = 2, m = 384, steps = 20, reps = 5;
static int64_t count = 1 << 20;

static const RtGroups *x_groups(int n) {
  static RtGroups g;
  static int32_t idx[4096], zero[4096];
  for (int d = 0; d < n && d < 4096; d++) idx[d] = d, zero[d] = 0;
  g = (RtGroups){.naxes = 1, .axes = {0}, .ngroups = 1, .size = n, .members = idx, .group_of = zero, .rank_of = idx, .text = "(x)"};
  return &g;
}

/* ---- the progress-thread emulation ---- */

typedef struct Prog {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  const float *in[64];
  float *out[64];
  int64_t posted[64];  /* posts so far per device */
  int64_t copied[64];  /* blocks delivered into each device's out */
  int64_t taken[64];   /* blocks copied out of each device's in */
  int stop;
  pthread_t thread[64];
} Prog;
static Prog P;

/* Device d's progress thread: for its k-th post, waits until its receiver (d + 1) posted its
 * k-th, copies d's in into it, and says so. */
static void *progress_main(void *arg) {
  int d = (int)(intptr_t)arg, to = (d + 1) % ndev;
  for (int64_t k = 1;; k++) {
    pthread_mutex_lock(&P.lock);
    while (!P.stop && (P.posted[d] < k || P.posted[to] < k)) pthread_cond_wait(&P.cond, &P.lock);
    if (P.stop) {
      pthread_mutex_unlock(&P.lock);
      return NULL;
    }
    const float *src = P.in[d];
    float *dst = P.out[to];
    pthread_mutex_unlock(&P.lock);
    memcpy(dst, src, sizeof(float) * (size_t)count);
    pthread_mutex_lock(&P.lock);
    P.copied[to] = k;
    P.taken[d] = k;
    pthread_cond_broadcast(&P.cond);
    pthread_mutex_unlock(&P.lock);
  }
}

static void prog_post(int d, const float *in, float *out) {
  pthread_mutex_lock(&P.lock);
  P.in[d] = in;
  P.out[d] = out;
  P.posted[d]++;
  pthread_cond_broadcast(&P.cond);
  pthread_mutex_unlock(&P.lock);
}

static void prog_wait(int d) {
  pthread_mutex_lock(&P.lock);
  while (P.copied[d] < P.posted[d] || P.taken[d] < P.posted[d]) pthread_cond_wait(&P.cond, &P.lock);
  pthread_mutex_unlock(&P.lock);
}

/* ---- the ring ---- */

typedef struct Run {
  int mode;
  double seconds[64];
  double sink[64];
} Run;

static int device(RtDevice *dev, void *arg) {
  Run *r = arg;
  int d = rt_device_index(dev), rc = RT_OK;
  const RtGroups *g = x_groups(ndev);
  float *blk[2], *A = malloc(sizeof(float) * (size_t)m * m), *B = malloc(sizeof(float) * (size_t)m * m),
                 *C = malloc(sizeof(float) * (size_t)m * m);
  blk[0] = malloc(sizeof(float) * (size_t)count);
  blk[1] = malloc(sizeof(float) * (size_t)count);
  for (int64_t i = 0; i < (int64_t)m * m; i++) A[i] = (float)(i % 7) * 0.1f, B[i] = (float)(i % 5) * 0.1f;
  for (int64_t i = 0; i < count; i++) blk[0][i] = (float)d, blk[1][i] = 0;
  int n = r->mode == PERMUTE_ALONE || r->mode == GEMM_ALONE ? 2 : ndev; /* alone: one step */
  rc = rt_barrier(dev, g);
  double t0 = rt_seconds(), sink = 0;
  for (int s = 0; s < steps && !rc; s++) {
    int cur = 0;
    for (int j = 0; j < n - 1 && !rc; j++) {
      float *in = blk[cur], *out = blk[1 - cur];
      RtRequest *req = NULL;
      if (r->mode == BLOCKING || r->mode == PERMUTE_ALONE) rc = rt_permute_shift(dev, g, RT_F32, in, out, count, 1);
      else if (r->mode == POSTED) rc = rt_permute_shift_start(dev, g, RT_F32, in, out, count, 1, &req);
      else if (r->mode == PROGRESS) prog_post(d, in, out);
      if (rc) break;
      if (r->mode != PERMUTE_ALONE) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m, 1, A, m, B, m, 0, C, m);
      if (r->mode == POSTED) rc = rt_wait(dev, req);
      else if (r->mode == PROGRESS) prog_wait(d);
      if (r->mode != GEMM_ALONE) cur = 1 - cur;
      for (int64_t i = 0; i < count; i += 1024) sink += blk[cur][i]; /* the block at hand, read */
    }
  }
  r->seconds[d] = rt_seconds() - t0;
  r->sink[d] = sink + C[0];
  free(A), free(B), free(C), free(blk[0]), free(blk[1]);
  return rc;
}

static double one(Runtime *rt, int mode) {
  Run r = {.mode = mode};
  if (mode == PROGRESS) {
    memset(P.posted, 0, sizeof P.posted);
    memset(P.copied, 0, sizeof P.copied);
    memset(P.taken, 0, sizeof P.taken);
    P.stop = 0;
    for (int d = 0; d < ndev; d++) pthread_create(&P.thread[d], NULL, progress_main, (void *)(intptr_t)d);
  }
  int rc = rt_run(rt, device, &r);
  if (mode == PROGRESS) {
    pthread_mutex_lock(&P.lock);
    P.stop = 1;
    pthread_cond_broadcast(&P.cond);
    pthread_mutex_unlock(&P.lock);
    for (int d = 0; d < ndev; d++) pthread_join(P.thread[d], NULL);
  }
  if (rc) {
    fprintf(stderr, "bench_posted: %s: %s\n", rt_status_name(rc), rt_errmsg(rt));
    exit(1);
  }
  double worst = 0;
  for (int d = 0; d < ndev; d++) worst = r.seconds[d] > worst ? r.seconds[d] : worst;
  int per = mode == GEMM_ALONE || mode == PERMUTE_ALONE ? 1 : ndev - 1;
  return worst / steps / per; /* per ring step */
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--smoke")) ndev = 2, m = 32, count = 1000, steps = 2, reps = 1;
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--devices") && i + 1 < argc) ndev = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--m") && i + 1 < argc) m = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--count") && i + 1 < argc) count = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_posted [--smoke] [--reps N] [--devices N] [--m M] [--count C] [--steps S]\n");
      return 2;
    }
  }
  if (ndev < 2 || ndev > 64 || m < 1 || count < 1 || steps < 1 || reps < 1) {
    fprintf(stderr, "bench_posted: devices 2..64, and positive sizes\n");
    return 2;
  }
  pthread_mutex_init(&P.lock, NULL);
  pthread_cond_init(&P.cond, NULL);
  RtConfig cfg = {.naxes = 1, .axis_size = {ndev}, .axis_name = {"x"}};
  Runtime *rt;
  if (rt_open(&cfg, &rt)) {
    fprintf(stderr, "bench_posted: rt_open: %s\n", rt ? rt_errmsg(rt) : "out of memory");
    return 1;
  }
  double best[NMODES];
  for (int k = 0; k < NMODES; k++) best[k] = 1e30;
  for (int rep = 0; rep < reps; rep++) /* interleaved, so that load on the machine hits every mode */
    for (int k = 0; k < NMODES; k++) {
      double t = one(rt, k);
      best[k] = t < best[k] ? t : best[k];
    }
  printf("posted permutes: %d devices, ring of %d steps, block %lld f32 (%.2f MB), GEMM %d^3 f32; best of %d, ms per step\n",
         ndev, ndev - 1, (long long)count, (double)count * 4 / 1e6, m, reps);
  for (int k = 0; k < NMODES; k++) printf("  %-14s %8.3f ms\n", mode_name[k], best[k] * 1e3);
  printf("  posted/blocking %.2f  progress/blocking %.2f  (ideal overlap: max(gemm, permute)/(gemm + permute) = %.2f)\n",
         best[POSTED] / best[BLOCKING], best[PROGRESS] / best[BLOCKING],
         (best[GEMM_ALONE] > best[PERMUTE_ALONE] ? best[GEMM_ALONE] : best[PERMUTE_ALONE]) /
             (best[GEMM_ALONE] + best[PERMUTE_ALONE]));
  rt_close(rt);
  return 0;
}
