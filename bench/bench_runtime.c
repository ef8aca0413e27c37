/* bench_runtime.c: the runtime's costs, each against a reference measured in the same run:
 *
 *   gemm       rt_gemm vs a direct cblas_sgemm of the same shape, both on one device thread
 *              with OpenBLAS at one thread (goal: >= 0.9x)
 *   allreduce  rt_all_reduce (f32, sum) over 8 device threads (and 2): bytes of the buffer per
 *              second, vs memcpy of the same bytes on one thread. Also the memory traffic per
 *              second: n devices each need their own copy of the result, so the chunked
 *              algorithm reads the n inputs once (n x size), writes the n outputs (n x size,
 *              one chunk in the reduce step, the rest in the copy step) and reads the n - 1
 *              chunks it copies ((n - 1) x size): (3n - 1) x size, where memcpy moves 2 x size.
 *              Small buffers (every rank reduces all of it) move n (n + 1) x size.
 *   barrier    rt_barrier over 2, 4 and 8 device threads, vs pthread_barrier_wait
 *
 * Usage: bench_runtime [--smoke] [--reps N]. --smoke uses tiny sizes (ctest runs it); numbers
 * are best of N (default 5). A benchmark reports; it never fails on a figure. */
#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shardrt.h"

/* The replica groups over (x) on a one-axis mesh of n devices: one group, rank = device. */
static const RtGroups *bench_x_groups(int n) {
  static RtGroups g;
  static int32_t idx[4096], zero[4096];
  for (int d = 0; d < n && d < 4096; d++) idx[d] = d, zero[d] = 0;
  g = (RtGroups){.naxes = 1, .axes = {0}, .ngroups = 1, .size = n, .members = idx, .group_of = zero, .rank_of = idx, .text = "(x)"};
  return &g;
}
static const RtGroups *bench_groups; /* the open runtime's */

static int reps = 5;
static int smoke = 0;

static double best(double a, double b) { return a < b ? a : b; }

static void fill(float *x, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) x[i] = rt_random_float(seed, 0, i, -1, 1);
}

static int check(int rc, Runtime *rt) {
  if (rc) {
    fprintf(stderr, "bench_runtime: %s: %s\n", rt_status_name(rc), rt_errmsg(rt));
    exit(1);
  }
  return rc;
}

/* ---- gemm ---- */

typedef struct GemmBench {
  int m, n, k, batch;
  RtDtype ab;         /* the operands' dtype; C is f32 */
  double direct, rt;  /* best seconds */
} GemmBench;

/* Both timings inside one device thread, alternating, so that they share the core, the caches
 * and OpenBLAS's one-thread setting. The direct call is the f32 product on the same data. */
static int gemm_device(RtDevice *dev, void *arg) {
  GemmBench *g = arg;
  size_t a_len = (size_t)g->m * g->k * g->batch, b_len = (size_t)g->k * g->n * g->batch,
         c_len = (size_t)g->m * g->n * g->batch;
  float *a, *b, *c;
  void *a16 = NULL, *b16 = NULL;
  int rc = rt_alloc(dev, a_len * 4, "A", (void **)&a);
  if (!rc) rc = rt_alloc(dev, b_len * 4, "B", (void **)&b);
  if (!rc) rc = rt_alloc(dev, c_len * 4, "C", (void **)&c);
  if (rc) return rc;
  fill(a, a_len, 1);
  fill(b, b_len, 2);
  memset(c, 0, c_len * 4);
  if (g->ab != RT_F32) {
    if ((rc = rt_alloc(dev, a_len * 2, "A16", &a16)) || (rc = rt_alloc(dev, b_len * 2, "B16", &b16))) return rc;
    rt_convert(a16, g->ab, a, RT_F32, a_len);
    rt_convert(b16, g->ab, b, RT_F32, b_len);
  }
  RtGemm desc = {.a_type = g->ab, .b_type = g->ab, .c_type = RT_F32, .m = g->m, .n = g->n, .k = g->k,
                 .batch = g->batch, .a = g->ab == RT_F32 ? (void *)a : a16, .lda = g->k, .stride_a = (int64_t)g->m * g->k,
                 .b = g->ab == RT_F32 ? (void *)b : b16, .ldb = g->n, .stride_b = (int64_t)g->k * g->n,
                 .c = c, .ldc = g->n, .stride_c = (int64_t)g->m * g->n, .alpha = 1, .beta = 0};
  g->direct = g->rt = 1e30;
  for (int r = 0; r <= reps && !rc; r++) { /* the first round warms up and is not counted */
    double t0 = rt_seconds();
    for (int i = 0; i < g->batch; i++)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->m, g->n, g->k, 1.0f, a + (size_t)i * g->m * g->k, g->k,
                  b + (size_t)i * g->k * g->n, g->n, 0.0f, c + (size_t)i * g->m * g->n, g->n);
    double t1 = rt_seconds();
    rc = rt_gemm(dev, &desc);
    double t2 = rt_seconds();
    if (r) g->direct = best(g->direct, t1 - t0), g->rt = best(g->rt, t2 - t1);
  }
  rt_free(dev, a16);
  rt_free(dev, b16);
  rt_free(dev, a);
  rt_free(dev, b);
  rt_free(dev, c);
  return rc;
}

static void bench_gemm(void) {
  GemmBench cases[] = {
      {512, 512, 512, 1, RT_F32, 0, 0},    {1024, 1024, 1024, 1, RT_F32, 0, 0}, {2048, 2048, 2048, 1, RT_F32, 0, 0},
      {4096, 1024, 256, 1, RT_F32, 0, 0},  {256, 256, 256, 16, RT_F32, 0, 0},   {1024, 1024, 1024, 1, RT_BF16, 0, 0},
  };
  int ncases = sizeof cases / sizeof *cases;
  if (smoke) {
    cases[0] = (GemmBench){64, 48, 32, 1, RT_F32, 0, 0};
    cases[1] = (GemmBench){32, 16, 8, 3, RT_BF16, 0, 0};
    ncases = 2;
  }
  RtConfig cfg = {0}; /* one device */
  Runtime *rt;
  check(rt_open(&cfg, &rt), rt);
    bench_groups = bench_x_groups(rt_device_count(rt));
  printf("gemm: rt_gemm vs cblas_sgemm, one device thread, OpenBLAS at 1 thread, best of %d\n", reps);
  printf("  %-28s %12s %12s %8s\n", "shape (m x n x k, batch)", "direct", "rt_gemm", "ratio");
  for (int i = 0; i < ncases; i++) {
    GemmBench *g = &cases[i];
    check(rt_run(rt, gemm_device, g), rt);
    double flops = 2.0 * g->m * g->n * g->k * g->batch;
    char shape[64];
    int len = snprintf(shape, sizeof shape, "%dx%dx%d", g->m, g->n, g->k);
    if (g->batch > 1) len += snprintf(shape + len, sizeof shape - (size_t)len, ", batch %d", g->batch);
    if (g->ab != RT_F32) snprintf(shape + len, sizeof shape - (size_t)len, " (%s A, B)", rt_dtype_name(g->ab));
    printf("  %-28s %7.1f GF/s %7.1f GF/s %7.2fx\n", shape, flops / g->direct * 1e-9, flops / g->rt * 1e-9,
           g->direct / g->rt);
  }
  rt_close(rt);
}

/* ---- all_reduce ---- */

typedef struct ArBench {
  size_t count; /* f32 elements per device */
  float *in[8], *out[8];
  double best; /* seconds, device 0's view: from leaving a barrier to leaving the all_reduce */
} ArBench;

static int ar_device(RtDevice *dev, void *arg) {
  ArBench *b = arg;
  int d = rt_device_index(dev), rc = RT_OK;
  for (int r = 0; r <= reps && !rc; r++) {
    if ((rc = rt_barrier(dev, bench_groups))) break;
    double t0 = rt_seconds();
    rc = rt_all_reduce(dev, bench_groups, RT_F32, RT_SUM, b->in[d], b->out[d], (int64_t)b->count);
    double t = rt_seconds() - t0;
    /* the slowest device decides when the result is everywhere: barrier, then device 0 reads */
    if (!rc && r && d == 0) b->best = best(b->best, t);
  }
  return rc;
}

static double memcpy_seconds(size_t bytes) {
  char *src = malloc(bytes), *dst = malloc(bytes);
  memset(src, 1, bytes);
  memset(dst, 2, bytes);
  double t = 1e30;
  for (int r = 0; r <= reps; r++) {
    double t0 = rt_seconds();
    memcpy(dst, src, bytes);
    double t1 = rt_seconds();
    if (r) t = best(t, t1 - t0);
  }
  if (dst[bytes / 2] != 1) abort(); /* keep the copy */
  free(src);
  free(dst);
  return t;
}

static void bench_all_reduce(void) {
  size_t sizes[] = {16 << 10, 256 << 10, 4 << 20, 16 << 20}; /* bytes per device */
  int nsizes = smoke ? 2 : 4;
  if (smoke) sizes[0] = 4 << 10, sizes[1] = 96 << 10;
  int devices[] = {2, 8};
  printf("all_reduce: f32 sum, bytes per device / time (best of %d) vs memcpy of the same bytes on one thread;\n"
         "  traffic: the bytes the algorithm reads and writes / time, vs memcpy's 2 x bytes / time\n", reps);
  printf("  %-8s %10s %12s %12s %12s %8s %16s %8s\n", "devices", "bytes", "time", "all_reduce", "memcpy", "ratio",
         "traffic", "ratio");
  for (int di = 0; di < 2; di++) {
    int n = devices[di];
    RtConfig cfg = {.naxes = 1, .axis_size = {n}, .axis_name = {"x"}};
    Runtime *rt;
    check(rt_open(&cfg, &rt), rt);
    bench_groups = bench_x_groups(rt_device_count(rt));
    for (int s = 0; s < nsizes; s++) {
      ArBench b = {.count = sizes[s] / 4, .best = 1e30};
      for (int d = 0; d < n; d++) {
        b.in[d] = malloc(sizes[s]);
        b.out[d] = malloc(sizes[s]);
        fill(b.in[d], b.count, (uint64_t)d);
        memset(b.out[d], 0, sizes[s]);
      }
      check(rt_run(rt, ar_device, &b), rt);
      double mc = memcpy_seconds(sizes[s]);
      /* threads.c: buffers up to 64 KiB take the direct path */
      double moved = sizes[s] <= 64 << 10 ? (double)n * (n + 1) * sizes[s] : (3.0 * n - 1) * sizes[s];
      printf("  %-8d %10zu %9.1f us %7.2f GB/s %7.2f GB/s %7.3fx %11.2f GB/s %7.2fx\n", n, sizes[s], b.best * 1e6,
             sizes[s] / b.best * 1e-9, sizes[s] / mc * 1e-9, mc / b.best, moved / b.best * 1e-9,
             moved / b.best / (2.0 * sizes[s] / mc));
      for (int d = 0; d < n; d++) free(b.in[d]), free(b.out[d]);
    }
    rt_close(rt);
  }
}

/* ---- barriers ---- */

typedef struct BarBench {
  int iters;
  double seconds;
  pthread_barrier_t pb;
} BarBench;

static int bar_device(RtDevice *dev, void *arg) {
  BarBench *b = arg;
  int rc = rt_barrier(dev, bench_groups);
  double t0 = rt_seconds();
  for (int i = 0; i < b->iters && !rc; i++) rc = rt_barrier(dev, bench_groups);
  if (rt_device_index(dev) == 0) b->seconds = rt_seconds() - t0;
  return rc;
}

static void *pthread_bar(void *arg) {
  BarBench *b = arg;
  pthread_barrier_wait(&b->pb);
  double t0 = rt_seconds();
  for (int i = 0; i < b->iters; i++) pthread_barrier_wait(&b->pb);
  double t = rt_seconds() - t0;
  if (pthread_barrier_wait(&b->pb) == PTHREAD_BARRIER_SERIAL_THREAD) b->seconds = t;
  return NULL;
}

static void bench_barrier(void) {
  printf("barrier: per barrier, best of %d runs\n", reps);
  printf("  %-8s %10s %14s %18s\n", "threads", "iterations", "rt_barrier", "pthread_barrier");
  for (int n = 2; n <= 8; n *= 2) {
    int iters = smoke ? 50 : n <= 2 ? 20000 : 5000;
    RtConfig cfg = {.naxes = 1, .axis_size = {n}, .axis_name = {"x"}};
    Runtime *rt;
    check(rt_open(&cfg, &rt), rt);
    bench_groups = bench_x_groups(rt_device_count(rt));
    double t_rt = 1e30, t_p = 1e30;
    for (int r = 0; r < reps; r++) {
      BarBench b = {.iters = iters};
      check(rt_run(rt, bar_device, &b), rt);
      t_rt = best(t_rt, b.seconds / iters);
      pthread_barrier_init(&b.pb, NULL, (unsigned)n);
      pthread_t th[8];
      for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, pthread_bar, &b);
      for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
      pthread_barrier_destroy(&b.pb);
      t_p = best(t_p, b.seconds / iters);
    }
    rt_close(rt);
    printf("  %-8d %10d %11.2f us %15.2f us\n", n, iters, t_rt * 1e6, t_p * 1e6);
  }
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--smoke")) smoke = 1, reps = 1;
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_runtime [--smoke] [--reps N]\n");
      return 2;
    }
  }
  if (reps < 1) reps = 1;
  bench_gemm();
  bench_all_reduce();
  bench_barrier();
  return 0;
}
