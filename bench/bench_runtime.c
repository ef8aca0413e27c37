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
#include <time.h>

#include "shardrt.h"

static int reps = 5;
static int smoke = 0;
static int engines_only = 0;
static const char *engine_shapes = NULL; /* --shapes S: only the engine shapes whose name holds S */

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

/* ---- GEMM engines: the measurements behind gemm.c's rule ---- */

/* One shape of the products the benches' steps run (SHARDC_GEMM_TRACE=1 lists them), each engine
 * timed on the same data in one device thread, interleaved rep by rep, the best of the reps in
 * thread CPU time (the machine is shared: CPU time leaves out the time other processes hold the
 * core, and the best leaves out most of what their traffic in the caches adds; docs/benchmarks.md). */
typedef struct EngineShape {
  int m, n, k, batch, ta, tb;
  const char *where;
  double t[6]; /* best seconds: f32 on openblas, onednn-f32, auto; bf16 on openblas (widened), onednn-f32 (widened), onednn (as they are) */
  double t_auto16;
  RtGemmEngine pick32, pick16;
} EngineShape;

static double thread_cpu(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int engines_device(RtDevice *dev, void *arg) {
  EngineShape *e = arg;
  int64_t nb = e->batch ? e->batch : 1;
  size_t a_len = (size_t)nb * e->m * e->k, b_len = (size_t)nb * e->k * e->n, c_len = (size_t)nb * e->m * e->n;
  float *a, *b, *c;
  void *a16, *b16, *c16;
  int rc = rt_alloc(dev, a_len * 4, "A", (void **)&a);
  if (!rc) rc = rt_alloc(dev, b_len * 4, "B", (void **)&b);
  if (!rc) rc = rt_alloc(dev, c_len * 4, "C", (void **)&c);
  if (!rc) rc = rt_alloc(dev, a_len * 2, "A16", &a16);
  if (!rc) rc = rt_alloc(dev, b_len * 2, "B16", &b16);
  if (!rc) rc = rt_alloc(dev, c_len * 2, "C16", &c16);
  if (rc) return rc;
  fill(a, a_len, 1);
  fill(b, b_len, 2);
  rt_convert(a16, RT_BF16, a, RT_F32, a_len);
  rt_convert(b16, RT_BF16, b, RT_F32, b_len);
  RtGemm g32 = {.a_type = RT_F32, .b_type = RT_F32, .c_type = RT_F32, .trans_a = e->ta, .trans_b = e->tb, .m = e->m, .n = e->n,
                .k = e->k, .batch = e->batch, .a = a, .lda = e->ta ? e->m : e->k, .stride_a = (int64_t)e->m * e->k,
                .b = b, .ldb = e->tb ? e->k : e->n, .stride_b = (int64_t)e->k * e->n, .c = c, .ldc = e->n,
                .stride_c = (int64_t)e->m * e->n, .alpha = 1, .beta = 0};
  RtGemm g16 = g32;
  g16.a_type = g16.b_type = g16.c_type = RT_BF16; /* the programs' bf16 contractions: bf16 in and out */
  g16.a = a16, g16.b = b16, g16.c = c16;
  e->pick32 = rt_gemm_choice(&g32), e->pick16 = rt_gemm_choice(&g16);
  /* repetitions: about 0.2 s of work per engine at 50 GFLOP/s, 3 to 25 */
  double flops = 2.0 * e->m * e->n * e->k * nb;
  int n = (int)(0.2 * 50e9 / flops);
  n = smoke ? 1 : n < 3 ? 3 : n > 25 ? 25 : n;
  /* (engine, operands) per column; column 6 is auto on bf16 */
  static const RtGemmEngine eng[7] = {RT_GEMM_OPENBLAS, RT_GEMM_ONEDNN_F32, RT_GEMM_AUTO, RT_GEMM_OPENBLAS,
                                      RT_GEMM_ONEDNN_F32, RT_GEMM_ONEDNN, RT_GEMM_AUTO};
  double *times = calloc((size_t)(7 * (n + 1)), sizeof(double));
  for (int r = 0; r <= n && !rc; r++) /* round 0 warms up (creates the primitives) and is not counted */
    for (int col = 0; col < 7 && !rc; col++) {
      rt_gemm_engine(dev, eng[col]);
      double t0 = thread_cpu();
      rc = rt_gemm(dev, col < 3 ? &g32 : &g16);
      times[col * (n + 1) + r] = thread_cpu() - t0;
    }
  rt_gemm_engine(dev, RT_GEMM_AUTO);
  for (int col = 0; col < 7 && !rc; col++) {
    double *t = times + col * (n + 1) + 1;
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    if (col < 6) e->t[col] = t[0];
    else e->t_auto16 = t[0];
  }
  free(times);
  rt_free(dev, a), rt_free(dev, b), rt_free(dev, c), rt_free(dev, a16), rt_free(dev, b16), rt_free(dev, c16);
  return rc;
}

static void bench_gemm_engines(void) {
  EngineShape shapes[] = {
      /* the MLP step (batch 16 x seq 256 rows, embed 512, hidden 2048), one device */
      {4096, 2048, 512, 1, 0, 0, "mlp x.w_in", {0}, 0, 0, 0},
      {4096, 512, 2048, 1, 0, 0, "mlp h.w_out", {0}, 0, 0, 0},
      {4096, 2048, 512, 1, 0, 1, "mlp dy.w_out^T", {0}, 0, 0, 0},
      {512, 2048, 4096, 1, 1, 0, "mlp x^T.dh", {0}, 0, 0, 0},
      {2048, 512, 4096, 1, 1, 0, "mlp h^T.dy", {0}, 0, 0, 0},
      /* ... on two devices (half the rows each) */
      {2048, 2048, 512, 1, 0, 0, "mlp/2 x.w_in", {0}, 0, 0, 0},
      {256, 2048, 2048, 1, 1, 0, "mlp/2 x^T.dh", {0}, 0, 0, 0},
      /* the LLaMA block (batch 4 x seq 256 rows, embed 512, kv 128, hidden 1536), one device */
      {1024, 512, 512, 1, 0, 0, "llama x.wq", {0}, 0, 0, 0},
      {1024, 128, 512, 1, 0, 0, "llama x.wk", {0}, 0, 0, 0},
      {1024, 1536, 512, 1, 0, 0, "llama m.wg", {0}, 0, 0, 0},
      {1024, 512, 1536, 1, 0, 0, "llama h.wd", {0}, 0, 0, 0},
      {1024, 1536, 512, 1, 0, 1, "llama dy.wd^T", {0}, 0, 0, 0},
      {512, 1536, 1024, 1, 1, 0, "llama m^T.dg", {0}, 0, 0, 0},
      {512, 128, 1024, 1, 1, 0, "llama x^T.dk", {0}, 0, 0, 0},
      {1024, 512, 128, 1, 0, 1, "llama dk.wk^T", {0}, 0, 0, 0},
      /* attention's products per (batch, head): 32 of seq 256 x head 64 */
      {256, 256, 64, 32, 0, 1, "attn q.k^T", {0}, 0, 0, 0},
      {256, 64, 256, 32, 0, 0, "attn p.v", {0}, 0, 0, 0},
      /* the samples at the README's small sizes */
      {64, 64, 32, 1, 0, 0, "small 64x64x32", {0}, 0, 0, 0},
      {64, 32, 64, 1, 0, 1, "small 64x32x64", {0}, 0, 0, 0},
      {8, 8, 8, 16, 0, 1, "small 8^3 x16", {0}, 0, 0, 0},
      /* around the rule's edges */
      {1024, 256, 512, 1, 0, 0, "edge", {0}, 0, 0, 0},
      {1024, 512, 256, 1, 0, 0, "edge", {0}, 0, 0, 0},
      {256, 1024, 1024, 1, 0, 0, "edge", {0}, 0, 0, 0},
      {4096, 128, 512, 1, 0, 0, "edge", {0}, 0, 0, 0},
      {4096, 512, 128, 1, 0, 0, "edge", {0}, 0, 0, 0},
      {2048, 128, 2048, 1, 0, 0, "edge", {0}, 0, 0, 0},
      {64, 64, 64, 1, 0, 0, "edge", {0}, 0, 0, 0},
      {96, 96, 96, 1, 0, 0, "edge", {0}, 0, 0, 0},
      {128, 128, 64, 8, 0, 1, "edge", {0}, 0, 0, 0},
      {64, 64, 64, 8, 0, 1, "edge", {0}, 0, 0, 0},
      {512, 512, 64, 16, 0, 1, "edge", {0}, 0, 0, 0},
      /* squares */
      {128, 128, 128, 1, 0, 0, "square 128", {0}, 0, 0, 0},
      {256, 256, 256, 1, 0, 0, "square 256", {0}, 0, 0, 0},
      {512, 512, 512, 1, 0, 0, "square 512", {0}, 0, 0, 0},
      {1024, 1024, 1024, 1, 0, 0, "square 1024", {0}, 0, 0, 0},
      {2048, 2048, 2048, 1, 0, 0, "square 2048", {0}, 0, 0, 0},
  };
  int ns = sizeof shapes / sizeof *shapes;
  if (smoke) shapes[0] = (EngineShape){48, 32, 40, 2, 0, 1, "smoke", {0}, 0, 0, 0}, ns = 1;
  if (engine_shapes) { /* keep the shapes whose name holds the string, in order */
    int kept = 0;
    for (int i = 0; i < ns; i++)
      if (strstr(shapes[i].where, engine_shapes)) shapes[kept++] = shapes[i];
    ns = kept;
  }
  const RtCpu *cpu = rt_cpu();
  printf("gemm engines: GFLOP/s, one device thread, best of 3-25 reps in thread CPU time; oneDNN %s, ISA %s, bf16 units %s%s\n",
         cpu->dnnl_version, cpu->dnnl_isa, cpu->bf16_native ? "yes" : "no", cpu->amx ? " (AMX)" : "");
  printf("  %-16s %-22s | %9s %9s %9s %5s | %9s %9s %9s %9s %5s\n", "", "m x n x k", "f32:blas", "dnnl", "auto", "pick",
         "bf16:blas", "dnnl-f32", "dnnl", "auto", "pick");
  RtConfig cfg = {0};
  Runtime *rt;
  check(rt_open(&cfg, &rt), rt);
  for (int i = 0; i < ns; i++) {
    EngineShape *e = &shapes[i];
    check(rt_run(rt, engines_device, e), rt);
    double fl = 2.0 * e->m * e->n * e->k * (e->batch ? e->batch : 1) * 1e-9;
    char shape[48];
    snprintf(shape, sizeof shape, "%dx%dx%d%s%s%s", e->m, e->n, e->k, e->ta ? " A^T" : "", e->tb ? " B^T" : "",
             e->batch > 1 ? " batched" : "");
    static const char *const tag[] = {"auto", "blas", "dnnl", "dnnl"};
    printf("  %-16s %-22s | %9.1f %9.1f %9.1f %5s | %9.1f %9.1f %9.1f %9.1f %5s\n", e->where, shape, fl / e->t[0], fl / e->t[1],
           fl / e->t[2], tag[e->pick32], fl / e->t[3], fl / e->t[4], fl / e->t[5], fl / e->t_auto16,
           e->pick16 == RT_GEMM_ONEDNN ? "dnnl16" : tag[e->pick16]);
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
  static const int x[1] = {0};
  for (int r = 0; r <= reps && !rc; r++) {
    if ((rc = rt_barrier(dev, x, 1))) break;
    double t0 = rt_seconds();
    rc = rt_all_reduce(dev, x, 1, RT_F32, RT_SUM, b->in[d], b->out[d], (int64_t)b->count);
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
  static const int x[1] = {0};
  int rc = rt_barrier(dev, x, 1);
  double t0 = rt_seconds();
  for (int i = 0; i < b->iters && !rc; i++) rc = rt_barrier(dev, x, 1);
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
    else if (!strcmp(argv[i], "--engines")) engines_only = 1;
    else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) engine_shapes = argv[++i];
    else {
      fprintf(stderr, "usage: bench_runtime [--smoke] [--reps N] [--engines] [--shapes NAME]\n");
      return 2;
    }
  }
  if (reps < 1) reps = 1;
  bench_gemm_engines();
  if (engines_only) return 0;
  bench_gemm();
  bench_all_reduce();
  bench_barrier();
  return 0;
}
