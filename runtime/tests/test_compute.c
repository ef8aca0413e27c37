/* test_compute.c: the compute helpers against independent references. Conversions: every
 * bf16 and f16 pattern decoded, and a million f32 values (every exponent, the ties, the
 * subnormals, the overflow edges) rounded, compared with a rounding computed from the value.
 * GEMM: every transpose, leading dims, batches, alpha and beta, bf16/f16 operands, against a
 * double-precision triple loop. Random numbers: the documented hash, ranges, and the same value
 * for a global element however the tensor is cut into device blocks. OpenBLAS: one thread
 * inside the devices, the caller's setting restored after. */
#include <cblas.h>

#include "rt_test.h"

/* ---- conversions ---- */

static void test_decode(void) {
  ut_begin("bf16 and f16 -> f32: all 65536 patterns of each");
  for (uint32_t h = 0; h < 65536; h++) {
    double want = ref_f16_value((uint16_t)h);
    float got = rt_f16_to_f32((uint16_t)h);
    if (isnan(want) ? !isnan(got) : (got != want || !signbit(got) != !signbit(want))) {
      ut_fail("f16 0x%04x: got %a, want %a", h, (double)got, want);
      break;
    }
    want = ref_bf16_value((uint16_t)h);
    got = rt_bf16_to_f32((uint16_t)h);
    if (isnan(want) ? !isnan(got) : test_bits(got) != test_bits((float)want)) {
      ut_fail("bf16 0x%04x: got %a, want %a", h, (double)got, want);
      break;
    }
  }
  ut_end();
}

/* The f32 values worth trying: a stride through all patterns, plus every exponent's edges and
 * the ties of both formats (values halfway between neighbours, with even and odd neighbours). */
static int encode_inputs(float *out, int max) {
  int n = 0;
  for (uint64_t u = 0; u < 0x100000000ull && n < max; u += 4099) out[n++] = test_float((uint32_t)u);
  for (int e = -160; e <= 130 && n + 16 < max; e++)
    for (int k = 0; k < 8; k++) {
      double base = ldexp(1.0 + k / 8.0, e);
      out[n++] = (float)base;
      out[n++] = -(float)base;
    }
  for (uint32_t m = 0; m < 4096 && n + 8 < max; m++) {
    out[n++] = test_float(0x3f800000u + (m << 13) + 0x1000u);       /* f16 ties near 1 */
    out[n++] = test_float(0x3f800000u + (m << 16) + 0x8000u);       /* bf16 ties near 1 */
    out[n++] = test_float(0x33000000u + m * 0x800u);                /* f16 subnormal range */
    out[n++] = test_float(0x477fe000u + m);                         /* f16 overflow edge */
    out[n++] = test_float(0x7f7f0000u + m * 16);                    /* bf16 overflow edge */
  }
  static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, 65504.0f, 65519.996f, 65520.0f, 0x1p-24f,
                                  0x1p-25f, 0x1.000002p-25f, 0x1p-14f, 0x1.ffcp-15f, 0x1p-126f, 0x1p-149f};
  for (size_t i = 0; i < sizeof special / sizeof *special && n < max; i++) out[n++] = special[i];
  return n;
}

static void test_encode(void) {
  ut_begin("f32 -> bf16 and f16: round to nearest even over a million values, ties and edges included");
  int max = 1 << 21;
  float *in = malloc((size_t)max * sizeof *in);
  int n = encode_inputs(in, max);
  int bad_bf = 0, bad_h = 0;
  for (int i = 0; i < n; i++) {
    uint16_t want_bf = ref_bf16_bits(ref_round_bf16(in[i])), got_bf = rt_f32_to_bf16(in[i]);
    uint16_t want_h = ref_f16_bits(ref_round_f16(in[i])), got_h = rt_f32_to_f16(in[i]);
    if (isnan(in[i])) {
      UT_CHECK((got_bf & 0x7fc0) == 0x7fc0 && (got_h & 0x7e00) == 0x7e00, "NaN %08x -> bf16 %04x, f16 %04x",
               test_bits(in[i]), got_bf, got_h);
      continue;
    }
    if (got_bf != want_bf && bad_bf++ < 3) ut_fail("bf16(%a): got 0x%04x, want 0x%04x", (double)in[i], got_bf, want_bf);
    if (got_h != want_h && bad_h++ < 3) ut_fail("f16(%a): got 0x%04x, want 0x%04x", (double)in[i], got_h, want_h);
  }
  UT_CHECK(n > 1000000, "only %d inputs", n);
  UT_CHECK(!bad_bf && !bad_h, "%d bf16 and %d f16 roundings wrong of %d", bad_bf, bad_h, n);
  /* the array path (rt_convert's vectorised loop) on the same values, from an odd offset so that
   * the vector loop's head and tail run too, and back: bf16 -> f32 is exact */
  uint16_t *bf = malloc((size_t)n * sizeof *bf);
  float *back = malloc((size_t)n * sizeof *back);
  UT_CHECK(rt_convert(bf + 1, RT_BF16, in + 1, RT_F32, (size_t)n - 1) == RT_OK, "f32 -> bf16 over %d", n - 1);
  UT_CHECK(rt_convert(back + 1, RT_F32, bf + 1, RT_BF16, (size_t)n - 1) == RT_OK, "bf16 -> f32 over %d", n - 1);
  int bad_arr = 0, bad_back = 0;
  for (int i = 1; i < n; i++) {
    if (isnan(in[i])) {
      if ((bf[i] & 0x7fc0) != 0x7fc0 && bad_arr++ < 3) ut_fail("array: NaN %08x -> bf16 %04x", test_bits(in[i]), bf[i]);
      continue;
    }
    uint16_t want = ref_bf16_bits(ref_round_bf16(in[i]));
    if (bf[i] != want && bad_arr++ < 3) ut_fail("array bf16(%a): got 0x%04x, want 0x%04x", (double)in[i], bf[i], want);
    if ((double)back[i] != ref_bf16_value(want) && bad_back++ < 3) ut_fail("array f32(bf16 0x%04x): got %a", want, (double)back[i]);
  }
  UT_CHECK(!bad_arr && !bad_back, "array path: %d bf16 roundings and %d widenings wrong of %d", bad_arr, bad_back, n - 1);
  free(bf), free(back), free(in);
  ut_end();
}

static void test_convert(void) {
  ut_begin("rt_convert between every pair of float dtypes; i32 only to i32");
  float src[5] = {1.0f, -2.5f, 0x1.0101p0f, 70000.0f, 3e-8f}, back[5];
  uint16_t bf[5], h[5], h2[5];
  UT_CHECK(rt_convert(bf, RT_BF16, src, RT_F32, 5) == RT_OK, "f32 -> bf16");
  UT_CHECK(rt_convert(h, RT_F16, bf, RT_BF16, 5) == RT_OK, "bf16 -> f16");
  UT_CHECK(rt_convert(h2, RT_F16, src, RT_F32, 5) == RT_OK, "f32 -> f16");
  UT_CHECK(rt_convert(back, RT_F32, h, RT_F16, 5) == RT_OK, "f16 -> f32");
  for (int i = 0; i < 5; i++) {
    UT_CHECK(bf[i] == ref_bf16_bits(ref_round_bf16(src[i])), "bf16[%d] 0x%04x", i, bf[i]);
    double via = ref_round_f16(ref_round_bf16(src[i]));
    UT_CHECK(h[i] == ref_f16_bits(via), "f16 via bf16 [%d] 0x%04x", i, h[i]);
    UT_CHECK(h2[i] == ref_f16_bits(ref_round_f16(src[i])), "f16[%d] 0x%04x", i, h2[i]);
    UT_CHECK(back[i] == (float)ref_f16_value(h[i]), "back[%d] %g", i, back[i]);
  }
  int32_t ints[2] = {1, 2}, ints2[2];
  UT_CHECK(rt_convert(ints2, RT_I32, ints, RT_I32, 2) == RT_OK && ints2[1] == 2, "i32 -> i32");
  UT_CHECK(rt_convert(back, RT_F32, ints, RT_I32, 2) == RT_E_ARG, "i32 -> f32 accepted");
  UT_CHECK(rt_convert(back, (RtDtype)7, src, RT_F32, 2) == RT_E_ARG, "an unknown dtype accepted");
  ut_end();
}

/* ---- GEMM ---- */

typedef struct GemmCase {
  RtDtype at, bt, ct;
  int ta, tb;
  int64_t m, n, k, batch, pad;
  float alpha, beta;
  int b_broadcast; /* stride_b 0: every batch shares B */
  int64_t hold;    /* bytes the device holds during the call (the scratch budget grows with it) */
} GemmCase;

typedef struct GemmRun {
  const GemmCase *c;
  RtGemmEngine engine;
  void *a, *b, *c_buf;
  int64_t lda, ldb, ldc, sa, sb, sc;
} GemmRun;

static double elem(const void *buf, RtDtype t, int64_t i) {
  if (t == RT_F32) return ((const float *)buf)[i];
  if (t == RT_BF16) return ref_bf16_value(((const uint16_t *)buf)[i]);
  return ref_f16_value(((const uint16_t *)buf)[i]);
}

static void put(void *buf, RtDtype t, int64_t i, float v) {
  if (t == RT_F32) ((float *)buf)[i] = v;
  else if (t == RT_BF16) ((uint16_t *)buf)[i] = ref_bf16_bits(ref_round_bf16(v));
  else ((uint16_t *)buf)[i] = ref_f16_bits(ref_round_f16(v));
}

static int gemm_device(RtDevice *dev, void *arg) {
  GemmRun *r = arg;
  const GemmCase *c = r->c;
  RtGemm g = {.a_type = c->at, .b_type = c->bt, .c_type = c->ct, .trans_a = c->ta, .trans_b = c->tb,
              .m = c->m, .n = c->n, .k = c->k, .batch = c->batch,
              .a = r->a, .lda = r->lda, .stride_a = r->sa,
              .b = r->b, .ldb = r->ldb, .stride_b = r->sb,
              .c = r->c_buf, .ldc = r->ldc, .stride_c = r->sc,
              .alpha = c->alpha, .beta = c->beta};
  void *held = NULL;
  int rc = rt_gemm_engine(dev, r->engine);
  if (!rc && c->hold) rc = rt_alloc(dev, (size_t)c->hold, "held", &held);
  if (!rc) rc = rt_gemm(dev, &g);
  rt_free(dev, held);
  return rc;
}

static void run_gemm(const GemmCase *c, RtGemmEngine engine) {
  char name[240];
  snprintf(name, sizeof name, "gemm on %s: %s x %s -> %s, %s%s, m %lld n %lld k %lld, batch %lld%s, lds padded by %lld, alpha %g beta %g",
           rt_gemm_engine_name(engine), rt_dtype_name(c->at), rt_dtype_name(c->bt), rt_dtype_name(c->ct), c->ta ? "A^T" : "A",
           c->tb ? " B^T" : " B", (long long)c->m, (long long)c->n, (long long)c->k, (long long)c->batch,
           c->b_broadcast ? " (B shared)" : "", (long long)c->pad, c->alpha, c->beta);
  ut_begin(name);
  int64_t nb = c->batch ? c->batch : 1;
  int64_t a_rows = c->ta ? c->k : c->m, a_cols = c->ta ? c->m : c->k;
  int64_t b_rows = c->tb ? c->n : c->k, b_cols = c->tb ? c->k : c->n;
  GemmRun r = {.c = c, .engine = engine};
  r.lda = (a_cols ? a_cols : 1) + c->pad, r.ldb = (b_cols ? b_cols : 1) + c->pad, r.ldc = (c->n ? c->n : 1) + c->pad;
  r.sa = a_rows * r.lda + 3, r.sb = c->b_broadcast ? 0 : b_rows * r.ldb + 1, r.sc = c->m * r.ldc + 2;
  int64_t a_len = nb * r.sa + 1, b_len = nb * (b_rows * r.ldb + 1) + 1, c_len = nb * r.sc + 1;
  size_t cs = rt_dtype_size(c->ct);
  r.a = calloc((size_t)a_len, 4);
  r.b = calloc((size_t)b_len, 4);
  r.c_buf = calloc((size_t)c_len, 4);
  void *c_orig = calloc((size_t)c_len, 4);
  double *want = malloc((size_t)(nb * c->m * c->n + 1) * sizeof *want);
  double *bound = malloc((size_t)(nb * c->m * c->n + 1) * sizeof *bound);
  for (int64_t i = 0; i < a_len; i++) put(r.a, c->at, i, test_value(1, 1, (uint64_t)i));
  for (int64_t i = 0; i < b_len; i++) put(r.b, c->bt, i, test_value(1, 2, (uint64_t)i));
  for (int64_t i = 0; i < c_len; i++) put(r.c_buf, c->ct, i, test_value(1, 3, (uint64_t)i));
  memcpy(c_orig, r.c_buf, (size_t)c_len * cs);
  for (int64_t bi = 0; bi < nb; bi++)
    for (int64_t i = 0; i < c->m; i++)
      for (int64_t j = 0; j < c->n; j++) {
        double s = 0, mag = 0;
        for (int64_t p = 0; p < c->k; p++) {
          double x = elem(r.a, c->at, bi * r.sa + (c->ta ? p * r.lda + i : i * r.lda + p));
          double y = elem(r.b, c->bt, bi * r.sb + (c->tb ? j * r.ldb + p : p * r.ldb + j));
          s += x * y, mag += fabs(x * y);
        }
        double c0 = elem(r.c_buf, c->ct, bi * r.sc + i * r.ldc + j);
        want[(bi * c->m + i) * c->n + j] = c->alpha * s + c->beta * c0;
        bound[(bi * c->m + i) * c->n + j] = fabs(c->alpha) * mag + fabs(c->beta * c0);
      }
  RtConfig cfg = test_mesh(0, NULL);
  Runtime *rt;
  rt_open(&cfg, &rt);
  int rc = rt_run(rt, gemm_device, &r);
  UT_CHECK(rc == RT_OK, "rt_run: %s", rt_errmsg(rt));
  /* f32 C: sgemm's own rounding, well within 1e-5 of the magnitudes summed; a 16-bit C adds
   * its final rounding (half an ulp: 2^-9 relative for bf16, 2^-12 for f16). */
  double rel = c->ct == RT_F32 ? 1e-5 : c->ct == RT_BF16 ? 0x1p-9 + 1e-5 : 0x1p-12 + 1e-5;
  int bad = 0;
  for (int64_t bi = 0; bi < nb && !bad; bi++)
    for (int64_t i = 0; i < c->m && !bad; i++) {
      for (int64_t j = 0; j < c->n && !bad; j++) {
        double w = want[(bi * c->m + i) * c->n + j], b = bound[(bi * c->m + i) * c->n + j];
        double got = elem(r.c_buf, c->ct, bi * r.sc + i * r.ldc + j);
        if (fabs(got - w) > rel * (b + fabs(w)) + 1e-30) {
          ut_fail("batch %lld C[%lld][%lld] = %.9g, want %.9g", (long long)bi, (long long)i, (long long)j, got, w);
          bad = 1;
        }
      }
      /* the padding after each row of C is untouched */
      int64_t pad_at = bi * r.sc + i * r.ldc + c->n;
      if (!bad && memcmp((char *)r.c_buf + (size_t)pad_at * cs, (char *)c_orig + (size_t)pad_at * cs,
                         (size_t)(r.ldc - c->n) * cs)) {
        ut_fail("batch %lld: the padding after row %lld of C was written", (long long)bi, (long long)i);
        bad = 1;
      }
    }
  RtStats s;
  rt_stats(rt, 0, &s);
  /* the f32 scratch is counted, block by block: within a sixteenth of the operands' bytes over
   * the batch (a shared B once; the device holds nothing else here), or the smallest blocks (one
   * element each) */
  /* widened unless oneDNN takes the 16-bit operands as they are (forced, or the rule's pick on a
   * CPU with bf16 units) */
  RtGemm shape = {.a_type = c->at, .b_type = c->bt, .c_type = c->ct, .m = c->m, .n = c->n, .k = c->k, .batch = c->batch};
  bool as_they_are = engine == RT_GEMM_ONEDNN || (engine == RT_GEMM_AUTO && rt_gemm_choice(&shape) == RT_GEMM_ONEDNN);
  if ((c->at != RT_F32 || c->bt != RT_F32 || c->ct != RT_F32) && c->k && c->m && c->n && !as_they_are) {
    size_t own = (size_t)(nb * c->m * c->k) * rt_dtype_size(c->at) + (size_t)((c->b_broadcast ? 1 : nb) * c->k * c->n) * rt_dtype_size(c->bt) +
                 (size_t)(nb * c->m * c->n) * cs;
    size_t least = 3 * 4;
    UT_CHECK(s.mem_peak > 0, "the widened blocks were not counted: peak %zu", s.mem_peak);
    (void)as_they_are;
    size_t base = own > (size_t)c->hold ? own : (size_t)c->hold;
    UT_CHECK(s.mem_peak - (size_t)c->hold <= (base / 16 > least ? base / 16 : least),
             "the scratch (%zu bytes) is over a sixteenth of the operands' %zu bytes or the %lld held", s.mem_peak - (size_t)c->hold, own,
             (long long)c->hold);
  }
  (void)a_rows, (void)a_cols;
  UT_CHECK(s.mem_current == 0, "gemm left %zu bytes allocated", s.mem_current);
  rt_close(rt);
  free(r.a), free(r.b), free(r.c_buf), free(c_orig), free(want), free(bound);
  ut_end();
}

/* Every case on every engine: the rule's pick, and each engine forced. */
static void test_gemm(void) {
  static const int64_t shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {64, 48, 80}};
  static const GemmCase batched[] = {
      {RT_F32, RT_F32, RT_F32, 0, 1, 9, 6, 11, 4, 2, 1.0f, 0.0f, 0, 0},
      {RT_F32, RT_F32, RT_F32, 1, 0, 9, 6, 11, 3, 0, -2.0f, 1.0f, 1, 0},
      {RT_BF16, RT_BF16, RT_F32, 0, 0, 31, 19, 45, 2, 1, 1.0f, 0.0f, 0, 0},
      {RT_BF16, RT_F32, RT_BF16, 1, 1, 16, 23, 7, 3, 0, 1.0f, 1.0f, 1, 0},
      {RT_F16, RT_F16, RT_F16, 0, 1, 12, 40, 33, 2, 2, 0.5f, 0.25f, 0, 0},
      {RT_F32, RT_F16, RT_F32, 0, 0, 8, 8, 8, 0, 0, 1.0f, 0.0f, 0, 0},
      {RT_BF16, RT_F16, RT_BF16, 1, 0, 5, 3, 0, 2, 1, 1.0f, 2.0f, 0, 0}, /* k = 0: C = beta C */
      {RT_F32, RT_F32, RT_F32, 0, 0, 0, 5, 4, 0, 0, 1.0f, 0.0f, 0, 0}, /* m = 0: nothing */
      {RT_BF16, RT_BF16, RT_BF16, 0, 1, 24, 20, 36, 5, 1, 1.0f, 0.5f, 1, 0}, /* B shared */
      {RT_BF16, RT_BF16, RT_BF16, 1, 0, 40, 33, 70, 0, 0, -1.0f, 0.0f, 0, 0},
      {RT_BF16, RT_BF16, RT_BF16, 0, 0, 3000, 8, 16, 0, 0, 1.0f, 0.5f, 0, 0}, /* B whole, A's rows in blocks */
      {RT_BF16, RT_BF16, RT_BF16, 0, 1, 8, 3000, 16, 0, 1, 1.0f, 0.0f, 0, 0}, /* A whole, B's columns in blocks */
      {RT_BF16, RT_BF16, RT_F32, 1, 1, 20, 20, 20, 6, 1, 1.0f, 1.0f, 0, 256 << 10}, /* 3 batch elements at a time */
  };
  for (int e = RT_GEMM_AUTO; e <= RT_GEMM_ONEDNN; e++) {
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
      for (int t = 0; t < 4; t++) {
        GemmCase c = {RT_F32, RT_F32, RT_F32, t & 1, t >> 1, shapes[s][0], shapes[s][1], shapes[s][2], 0, s % 2 ? 3 : 0,
                      s % 2 ? 1.5f : 1.0f, s % 2 ? 0.5f : 0.0f, 0, 0};
        run_gemm(&c, (RtGemmEngine)e);
      }
    for (size_t i = 0; i < sizeof batched / sizeof *batched; i++) run_gemm(&batched[i], (RtGemmEngine)e);
  }
}

/* ---- oneDNN: the cache of primitives, threads, the CPU ---- */

typedef struct CacheRun {
  float *a[4], *b[4], *c[4];
  int64_t m, n, k;
  RtGemmEngine engine;
  int threads[4];  /* rt_gemm_threads() inside the device */
  int tasks[4];    /* the process's threads after its products */
} CacheRun;

/* The threads of this process now (/proc/self/status), 0 if unknown. */
static int process_threads(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  int n = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "Threads: %d", &n) == 1) break;
  if (f) fclose(f);
  return n;
}

static int cache_device(RtDevice *dev, void *arg) {
  CacheRun *r = arg;
  int d = rt_device_index(dev), rc = rt_gemm_engine(dev, r->engine);
  r->threads[d] = rt_gemm_threads();
  for (int rep = 0; rep < 3 && !rc; rep++)
    rc = rt_gemm(dev, &(RtGemm){.a_type = RT_F32, .b_type = RT_F32, .c_type = RT_F32, .m = r->m, .n = r->n, .k = r->k,
                                .a = r->a[d], .lda = r->k, .b = r->b[d], .ldb = r->n, .c = r->c[d], .ldc = r->n, .alpha = 1});
  r->tasks[d] = process_threads();
  return rc;
}

static void test_gemm_cache(void) {
  ut_begin("oneDNN: one primitive per shape, made once and reused by every device and every run; one thread per device");
  enum { M = 160, N = 96, K = 200 };
  CacheRun r = {.m = M, .n = N, .k = K, .engine = RT_GEMM_ONEDNN_F32};
  for (int d = 0; d < 4; d++) {
    r.a[d] = malloc(M * K * sizeof(float)), r.b[d] = malloc(K * N * sizeof(float)), r.c[d] = malloc(M * N * sizeof(float));
    for (int i = 0; i < M * K; i++) r.a[d][i] = test_value((uint64_t)d, 11, (uint64_t)i);
    for (int i = 0; i < K * N; i++) r.b[d][i] = test_value((uint64_t)d, 12, (uint64_t)i);
  }
  int host_threads = rt_gemm_threads(), before = process_threads();
  RtConfig four = test_mesh(1, (int[]){4});
  Runtime *rt;
  rt_open(&four, &rt);
  uint64_t created = 0, reused = 0;
  for (int run = 0; run < 2; run++) UT_CHECK(rt_run(rt, cache_device, &r) == RT_OK, "run %d: %s", run, rt_errmsg(rt));
  UT_CHECK(rt_gemm_cache_stats(rt, &created, &reused) == RT_OK, "stats");
  /* 4 devices x 2 runs x 3 products of one shape: 1 made, 23 reused */
  UT_CHECK(created == 1 && reused == 23, "one shape: %llu primitives made, %llu reuses (want 1 and 23)", (unsigned long long)created,
           (unsigned long long)reused);
  r.m = M / 2; /* another shape: one more primitive */
  UT_CHECK(rt_run(rt, cache_device, &r) == RT_OK, "another shape: %s", rt_errmsg(rt));
  rt_gemm_cache_stats(rt, &created, &reused);
  UT_CHECK(created == 2 && reused == 34, "two shapes: %llu made, %llu reuses (want 2 and 34)", (unsigned long long)created,
           (unsigned long long)reused);
  for (int d = 0; d < 4; d++) {
    UT_CHECK(r.threads[d] == 1, "device %d: oneDNN would use %d threads", d, r.threads[d]);
    /* the host, four device threads, and whatever ran before (OpenBLAS's pool): no OpenMP team */
    UT_CHECK(before == 0 || r.tasks[d] <= before + 4, "device %d: %d threads in the process during the run, %d before it: oneDNN started a team",
             d, r.tasks[d], before);
  }
  UT_CHECK(rt_gemm_threads() == host_threads, "the host's OpenMP setting: %d after the run, %d before", rt_gemm_threads(), host_threads);
  rt_close(rt);
  /* the products themselves: each equal to OpenBLAS's to f32 rounding over K terms */
  for (int d = 0; d < 4; d++) {
    float *want = malloc(M * N * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M / 2, N, K, 1, r.a[d], K, r.b[d], N, 0, want, N);
    double worst = 0;
    for (int i = 0; i < M / 2 * N; i++) worst = fmax(worst, fabs((double)want[i] - r.c[d][i]));
    UT_CHECK(worst < 1e-4, "device %d: oneDNN's product differs from OpenBLAS's by %g", d, worst);
    free(want), free(r.a[d]), free(r.b[d]), free(r.c[d]);
  }
  ut_end();
}

/* A flag of /proc/cpuinfo's first "flags" line: an independent reading of cpuid. -1 unknown. */
static int cpuinfo_flag(const char *flag) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return -1;
  static char line[8192];
  int found = -1;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "flags", 5)) {
      found = 0;
      for (char *t = strtok(strchr(line, ':') + 1, " \t\n"); t; t = strtok(NULL, " \t\n"))
        if (!strcmp(t, flag)) found = 1;
      break;
    }
  fclose(f);
  return found;
}

static void test_cpu(void) {
  ut_begin("the CPU's features at run time agree with /proc/cpuinfo; the rule takes bf16 natively only with bf16 units");
  const RtCpu *cpu = rt_cpu();
  static const struct { unsigned bit; const char *flag; } feats[] = {
      {RT_CPU_AVX512F, "avx512f"}, {RT_CPU_AVX512_BF16, "avx512_bf16"}, {RT_CPU_AVX512_FP16, "avx512_fp16"},
      {RT_CPU_AMX_TILE, "amx_tile"}, {RT_CPU_AMX_BF16, "amx_bf16"}};
  for (size_t i = 0; i < sizeof feats / sizeof *feats; i++) {
    int f = cpuinfo_flag(feats[i].flag);
    if (f >= 0)
      UT_CHECK(!!(cpu->features & feats[i].bit) == f, "%s: cpuid says %d, /proc/cpuinfo %d", feats[i].flag,
               !!(cpu->features & feats[i].bit), f);
  }
  /* oneDNN's ISA needs the units: bf16 natively implies AVX512-BF16 or AMX-BF16 in cpuid */
  UT_CHECK(!cpu->bf16_native || (cpu->features & (RT_CPU_AVX512_BF16 | RT_CPU_AMX_BF16)),
           "oneDNN claims bf16 units (%s) the CPU does not have", cpu->dnnl_isa);
  UT_CHECK(cpu->dnnl_isa && *cpu->dnnl_version, "oneDNN's ISA and version");
  RtGemm big = {.a_type = RT_BF16, .b_type = RT_BF16, .c_type = RT_BF16, .m = 1024, .n = 1024, .k = 1024, .batch = 1};
  RtGemmEngine e = rt_gemm_choice(&big);
  UT_CHECK(cpu->bf16_native ? e == RT_GEMM_ONEDNN : e != RT_GEMM_ONEDNN, "a bf16 1024^3 product goes to %s on a CPU %s bf16 units",
           rt_gemm_engine_name(e), cpu->bf16_native ? "with" : "without");
  RtGemm f16 = big;
  f16.a_type = f16.b_type = RT_F16;
  UT_CHECK(rt_gemm_choice(&f16) != RT_GEMM_ONEDNN, "f16 operands are not taken as they are");
  ut_end();
}

/* ---- random numbers ---- */

/* splitmix64 as published: state += G; z = state; the finaliser. */
static uint64_t splitmix_next(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t splitmix_mix(uint64_t z) {
  uint64_t s = z - 0x9e3779b97f4a7c15ull;
  return splitmix_next(&s);
}

static void test_random_hash(void) {
  ut_begin("rt_random_bits is the documented hash: splitmix64's stream from key = mix(seed ^ mix(tensor + G))");
  static const uint64_t seeds[] = {0, 1, 42, 0xdeadbeefcafef00dull};
  for (size_t s = 0; s < 4; s++)
    for (uint64_t tensor = 0; tensor < 3; tensor++) {
      uint64_t key = splitmix_mix(seeds[s] ^ splitmix_mix(tensor + 0x9e3779b97f4a7c15ull)), state = key;
      for (uint64_t i = 0; i < 6; i++) {
        uint64_t want = splitmix_next(&state), got = rt_random_bits(seeds[s], tensor, i);
        UT_CHECK(got == want, "seed %llu tensor %llu index %llu: %016llx, want %016llx", (unsigned long long)seeds[s],
                 (unsigned long long)tensor, (unsigned long long)i, (unsigned long long)got, (unsigned long long)want);
      }
    }
  /* values computed apart (in Python from the formula in docs/runtime.md), so that a change of
   * the formula shows even if both sides above changed with it */
  UT_CHECK(rt_random_bits(0, 0, 0) == 0x568a9b0b1a2c05ecull, "rt_random_bits(0, 0, 0)");
  UT_CHECK(rt_random_bits(42, 7, 1000) == 0xb4e95c3e9ad373caull, "rt_random_bits(42, 7, 1000)");
  UT_CHECK(rt_random_bits(0xdeadbeefcafef00dull, 3, 123456789) == 0x954a064341440dd4ull,
           "rt_random_bits(0xdeadbeefcafef00d, 3, 123456789)");
  int same = 0;
  for (uint64_t i = 0; i < 100; i++) same += rt_random_bits(7, 1, i) == rt_random_bits(7, 2, i);
  UT_CHECK(same == 0, "tensors 1 and 2 share %d of 100 values", same);
  ut_end();
}

static void test_random_ranges(void) {
  ut_begin("uniform floats in [lo, hi) with the right mean; integers in [lo, hi), evenly spread");
  double sum = 0;
  int out_of_range = 0, buckets[10] = {0};
  for (uint64_t i = 0; i < 200000; i++) {
    float u = rt_random_float(3, 9, i, -2.0f, 6.0f);
    out_of_range += !(u >= -2.0f && u < 6.0f);
    sum += u;
    int32_t k = rt_random_int(3, 10, i, -5, 5);
    if (k < -5 || k >= 5) out_of_range++;
    else buckets[k + 5]++;
  }
  UT_CHECK(!out_of_range, "%d values out of range", out_of_range);
  UT_CHECK(fabs(sum / 200000 - 2.0) < 0.02, "mean %g, want 2", sum / 200000);
  for (int b = 0; b < 10; b++) UT_CHECK(abs(buckets[b] - 20000) < 1000, "integer %d drawn %d times of 200000", b - 5, buckets[b]);
  /* hi just above lo: rounding could reach hi; it must not */
  float lo = 1.0f, hi = nextafterf(1.0f, 2.0f);
  for (uint64_t i = 0; i < 1000; i++) UT_CHECK(rt_random_float(1, 1, i, lo, hi) == lo, "a value reached hi");
  UT_CHECK(rt_random_int(1, 1, 5, INT32_MIN, INT32_MAX) >= INT32_MIN, "the widest range");
  ut_end();
}

/* Every device generates its own block of a [6, 9, 4] tensor (dims 0 and 1 over a [2, 3] mesh);
 * pieced together, they are the tensor generated whole on one device. */
typedef struct RandRun {
  RtDtype dt;
  void *blocks[6];
} RandRun;

static int rand_device(RtDevice *dev, void *arg) {
  RandRun *r = arg;
  int d = rt_device_index(dev);
  RtBlock b = {3, {6, 9, 4}, {rt_device_coord(dev, 0) * 3, rt_device_coord(dev, 1) * 3, 0}, {3, 3, 4}};
  int rc = rt_alloc(dev, 36 * 4, "block", &r->blocks[d]);
  if (!rc) rc = rt_random_fill(r->blocks[d], r->dt, &b, 11, 5, r->dt == RT_I32 ? -100 : -1, r->dt == RT_I32 ? 100 : 1);
  return rc;
}

static void test_random_blocks(void) {
  static const RtDtype dts[] = {RT_F32, RT_BF16, RT_F16, RT_I32};
  for (int t = 0; t < 4; t++) {
    char name[128];
    snprintf(name, sizeof name, "random %s: six device blocks equal the tensor generated whole", rt_dtype_name(dts[t]));
    ut_begin(name);
    size_t es = rt_dtype_size(dts[t]);
    char whole[6 * 9 * 4 * 4];
    RtBlock all = {3, {6, 9, 4}, {0, 0, 0}, {6, 9, 4}};
    double lo = dts[t] == RT_I32 ? -100 : -1, hi = dts[t] == RT_I32 ? 100 : 1;
    UT_CHECK(rt_random_fill(whole, dts[t], &all, 11, 5, lo, hi) == RT_OK, "whole");
    /* element by element, the whole tensor is the scalar functions at the global index */
    for (int i = 0; i < 6 * 9 * 4; i++) {
      float f = rt_random_float(11, 5, (uint64_t)i, -1, 1);
      uint32_t want = dts[t] == RT_F32   ? test_bits(f)
                      : dts[t] == RT_BF16 ? ref_bf16_bits(ref_round_bf16(f))
                      : dts[t] == RT_F16  ? ref_f16_bits(ref_round_f16(f))
                                          : (uint32_t)rt_random_int(11, 5, (uint64_t)i, -100, 100);
      uint32_t got = es == 2 ? ((uint16_t *)whole)[i] : ((uint32_t *)whole)[i];
      UT_CHECK(got == want, "element %d: 0x%x, want 0x%x", i, got, want);
      if (!ut_ok()) break;
    }
    RtConfig cfg = test_mesh(2, (int[]){2, 3});
    Runtime *rt;
    rt_open(&cfg, &rt);
    RandRun r = {dts[t], {0}};
    int rc = rt_run(rt, rand_device, &r);
    UT_CHECK(rc == RT_OK, "rt_run: %s", rt_errmsg(rt));
    for (int d = 0; d < 6 && rc == RT_OK; d++) {
      int x = d / 3, y = d % 3;
      for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
          size_t at = (size_t)(((x * 3 + i) * 9 + y * 3 + j) * 4) * es;
          UT_CHECK(!memcmp((char *)r.blocks[d] + (size_t)((i * 3 + j) * 4) * es, whole + at, 4 * es),
                   "device %d row (%d, %d) differs from the whole tensor", d, i, j);
        }
    }
    rt_close(rt);
    ut_end();
  }
  ut_begin("rt_random_fill refuses bad blocks and ranges");
  char buf[64];
  RtBlock outside = {1, {10}, {8}, {4}};
  UT_CHECK(rt_random_fill(buf, RT_F32, &outside, 1, 1, 0, 1) == RT_E_ARG, "a block past the end");
  RtBlock ok = {1, {10}, {0}, {4}};
  UT_CHECK(rt_random_fill(buf, RT_I32, &ok, 1, 1, 0.5, 3) == RT_E_ARG, "a fractional integer bound");
  UT_CHECK(rt_random_fill(buf, RT_I32, &ok, 1, 1, 3, 3) == RT_E_ARG, "an empty integer range");
  ut_end();
}

/* ---- OpenBLAS threads ---- */

static int blas_device(RtDevice *dev, void *arg) {
  int *seen = arg;
  seen[rt_device_index(dev)] = openblas_get_num_threads();
  return RT_OK;
}

static void test_blas_threads(void) {
  ut_begin("OpenBLAS runs one thread inside each device thread; the caller's setting comes back");
  openblas_set_num_threads(2);
  int before = openblas_get_num_threads();
  RtConfig cfg = test_mesh(1, (int[]){4});
  Runtime *rt;
  rt_open(&cfg, &rt);
  int seen[4] = {0};
  int rc = rt_run(rt, blas_device, seen);
  UT_CHECK(rc == RT_OK, "rt_run: %s", rt_errmsg(rt));
  for (int d = 0; d < 4; d++) UT_CHECK(seen[d] == 1, "device %d sees %d OpenBLAS threads", d, seen[d]);
  UT_CHECK(openblas_get_num_threads() == before, "after the run: %d threads, before: %d", openblas_get_num_threads(), before);
  rt_close(rt);
  ut_end();
}

/* Four devices multiply at once, each its own matrices: OpenBLAS called from several threads,
 * each result equal (bitwise: one thread, the same kernel) to the product done alone. */
enum { CG = 96 };

typedef struct ConcurrentGemm {
  float *a[4], *b[4], *c[4];
  RtGemmEngine engine;
} ConcurrentGemm;

static int concurrent_gemm_device(RtDevice *dev, void *arg) {
  ConcurrentGemm *g = arg;
  int d = rt_device_index(dev), rc = rt_gemm_engine(dev, g->engine);
  for (int rep = 0; rep < 5 && !rc; rep++)
    rc = rt_gemm(dev, &(RtGemm){.a_type = RT_F32, .b_type = RT_F32, .c_type = RT_F32, .m = CG, .n = CG, .k = CG,
                                .a = g->a[d], .lda = CG, .b = g->b[d], .ldb = CG, .c = g->c[d], .ldc = CG,
                                .alpha = 1, .beta = 0});
  return rc;
}

static void test_concurrent_gemm(RtGemmEngine engine) {
  char name[120];
  snprintf(name, sizeof name, "four devices multiplying at once on %s get what each gets alone", rt_gemm_engine_name(engine));
  ut_begin(name);
  ConcurrentGemm g = {.engine = engine};
  float *alone[4];
  for (int d = 0; d < 4; d++) {
    g.a[d] = malloc(CG * CG * sizeof(float));
    g.b[d] = malloc(CG * CG * sizeof(float));
    g.c[d] = malloc(CG * CG * sizeof(float));
    alone[d] = malloc(CG * CG * sizeof(float));
    for (int i = 0; i < CG * CG; i++) g.a[d][i] = test_value((uint64_t)d, 7, (uint64_t)i), g.b[d][i] = test_value((uint64_t)d, 8, (uint64_t)i);
  }
  RtConfig one = test_mesh(0, NULL), four = test_mesh(1, (int[]){4});
  Runtime *rt;
  rt_open(&one, &rt);
  for (int d = 0; d < 4; d++) {
    ConcurrentGemm single = g;
    single.a[0] = g.a[d], single.b[0] = g.b[d], single.c[0] = alone[d];
    UT_CHECK(rt_run(rt, concurrent_gemm_device, &single) == RT_OK, "alone %d: %s", d, rt_errmsg(rt));
  }
  rt_close(rt);
  rt_open(&four, &rt);
  UT_CHECK(rt_run(rt, concurrent_gemm_device, &g) == RT_OK, "together: %s", rt_errmsg(rt));
  rt_close(rt);
  for (int d = 0; d < 4; d++) {
    UT_CHECK(!memcmp(g.c[d], alone[d], CG * CG * sizeof(float)), "device %d: a different product together", d);
    free(g.a[d]), free(g.b[d]), free(g.c[d]), free(alone[d]);
  }
  ut_end();
}

static void test_engine_env(void) {
  ut_begin("SHARDC_GEMM: an unknown engine is refused by rt_open, naming the choices");
  setenv("SHARDC_GEMM", "mkl", 1);
  RtConfig one = test_mesh(0, NULL);
  Runtime *rt;
  int rc = rt_open(&one, &rt);
  UT_CHECK(rc == RT_E_ARG && strstr(rt_errmsg(rt), "SHARDC_GEMM=mkl") && strstr(rt_errmsg(rt), "onednn-f32"), "rt_open: %d, %s", rc,
           rt_errmsg(rt));
  rt_close(rt);
  setenv("SHARDC_GEMM", "openblas", 1);
  rc = rt_open(&one, &rt);
  UT_CHECK(rc == RT_OK, "SHARDC_GEMM=openblas: %s", rt_errmsg(rt));
  rt_close(rt);
  unsetenv("SHARDC_GEMM");
  ut_end();
}

/* ---- names and statistics ---- */

static int stats_device(RtDevice *dev, void *arg) {
  float x = 1, y;
  int rc = rt_all_reduce(dev, (int[]){0}, 1, RT_F32, RT_SUM, &x, &y, 1);
  if (!rc) rc = rt_barrier(dev, (int[]){0}, 1);
  return rc;
}

static void test_names_and_stats(void) {
  ut_begin("status and dtype names; collective counts per device");
  UT_CHECK(!strcmp(rt_status_name(RT_E_TIMEOUT), "RT_E_TIMEOUT") && !strcmp(rt_status_name(99), "RT_E_UNKNOWN"),
           "status names");
  UT_CHECK(rt_dtype_size(RT_BF16) == 2 && rt_dtype_size(RT_I32) == 4 && !strcmp(rt_dtype_name(RT_F16), "f16") &&
               rt_dtype_size((RtDtype)9) == 0,
           "dtype table");
  RtConfig cfg = test_mesh(1, (int[]){2});
  Runtime *rt;
  rt_open(&cfg, &rt);
  UT_CHECK(rt_run(rt, stats_device, NULL) == RT_OK, "rt_run: %s", rt_errmsg(rt));
  RtStats s;
  UT_CHECK(rt_stats(rt, 1, &s) == RT_OK && s.collectives == 2 && s.coll_seconds >= 0, "device 1: %llu collectives",
           (unsigned long long)s.collectives);
  UT_CHECK(rt_stats(rt, 2, &s) == RT_E_ARG, "stats of a device past the end");
  UT_CHECK(rt_gemm_engine(rt_device(rt, 0), (RtGemmEngine)9) == RT_E_ARG && !strcmp(rt_gemm_engine_name(RT_GEMM_ONEDNN_F32), "onednn-f32"),
           "GEMM engines: names, an unknown one refused");
  rt_close(rt);
  ut_end();
}

int main(void) {
  test_decode();
  test_encode();
  test_convert();
  test_gemm();
  test_random_hash();
  test_random_ranges();
  test_random_blocks();
  test_blas_threads();
  for (int e = RT_GEMM_OPENBLAS; e <= RT_GEMM_ONEDNN; e++) test_concurrent_gemm((RtGemmEngine)e);
  test_gemm_cache();
  test_cpu();
  test_engine_env();
  test_names_and_stats();
  return ut_summary();
}
