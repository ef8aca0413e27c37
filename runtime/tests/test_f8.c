/* test_f8.c: the FP8 dtypes of the runtime (runtime/dtype.h): f8e4m3 (OCP E4M3FN) and f8e5m2
 * (OCP E5M2), against a table computed here from the formats' definitions, not from the bits the
 * runtime manipulates:
 *   value(code) = (-1)^s 2^(e - bias) (1 + m / 2^M) for e > 0, (-1)^s 2^(1 - bias) m / 2^M for e = 0;
 *   e4m3: bias 7, M 3, 0x7f / 0xff NaN, no infinity; e5m2: bias 15, M 2, e = 31 infinity (m = 0)
 *   or NaN.
 * Encoding is checked against a brute-force nearest search over that table (ties to the code with
 * an even mantissa), with the rules docs/language.md states: e4m3 saturates at +-448 (any larger
 * finite value and infinity), e5m2 overflows to infinity from 61440 (57344 + half its last step,
 * the tie rounding to even, i.e. up). Then rt_convert's array paths and a gemm of FP8 operands with
 * a bf16 result. */
#include <float.h>
#include <math.h>

#include "rt_test.h"

typedef struct Fmt {
  const char *name;
  RtDtype dt;
  int bias, mant;
  bool ieee; /* e5m2: infinities and NaNs at the top exponent */
  uint8_t (*enc)(float);
  float (*dec)(uint8_t);
} Fmt;

static const Fmt FMTS[2] = {
    {"f8e4m3", RT_F8E4M3, 7, 3, false, rt_f32_to_f8e4m3, rt_f8e4m3_to_f32},
    {"f8e5m2", RT_F8E5M2, 15, 2, true, rt_f32_to_f8e5m2, rt_f8e5m2_to_f32},
};

/* the definition: NaN for NaN codes, +-inf for e5m2's infinities */
static double ref_value(const Fmt *f, int c) {
  int s = c >> 7, ebits = 7 - f->mant, e = (c & 0x7f) >> f->mant, m = c & ((1 << f->mant) - 1);
  int emax = (1 << ebits) - 1;
  if (f->ieee && e == emax) return m ? NAN : (s ? -INFINITY : INFINITY);
  if (!f->ieee && e == emax && m == (1 << f->mant) - 1) return NAN;
  double v = e == 0 ? ldexp((double)m, 1 - f->bias - f->mant) : ldexp(1.0 + (double)m / (1 << f->mant), e - f->bias);
  return s ? -v : v;
}

static double ref_max(const Fmt *f) { return f->ieee ? 57344.0 : 448.0; }

/* the code nearest x (finite, |x| <= the largest finite), ties to an even mantissa */
static int ref_nearest(const Fmt *f, double x) {
  int best = -1;
  double bd = INFINITY;
  for (int c = 0; c < 256; c++) {
    double v = ref_value(f, c);
    if (!isfinite(v)) continue;
    if (v == 0 && !signbit(v) != !signbit(x)) continue; /* a zero keeps x's sign */
    if (v != 0 && (v < 0) != (x < 0) && x != 0) continue;
    double d = fabs(v - x);
    if (d < bd || (d == bd && !(c & 1) && (best & 1))) bd = d, best = c;
  }
  return best;
}

static int ref_encode(const Fmt *f, float xf) {
  double x = xf;
  int sign = signbit(x) ? 0x80 : 0;
  if (isnan(x)) return -1; /* any NaN code with x's sign: checked apart */
  double a = fabs(x), max = ref_max(f);
  if (!f->ieee && a > max) return sign | 0x7e;                 /* saturate, infinity too */
  if (f->ieee && a >= max + ldexp(1.0, 15 - f->mant - 1)) return sign | 0x7c; /* 61440 and up: inf */
  if (f->ieee && a > max) return sign | 0x7b;                  /* below the tie: the largest finite */
  return ref_nearest(f, x);
}

static void every_code(const Fmt *f) {
  char name[64];
  snprintf(name, sizeof name, "%s: all 256 codes decode and encode back", f->name);
  ut_begin(name);
  int nan_codes = 0, inf_codes = 0;
  for (int c = 0; c < 256; c++) {
    double want = ref_value(f, c);
    float got = f->dec((uint8_t)c);
    if (isnan(want)) {
      nan_codes++;
      UT_CHECK(isnan(got), "code 0x%02x decodes to %g, want NaN", c, got);
      uint8_t back = f->enc(got);
      UT_CHECK(isnan(ref_value(f, back)) && (back & 0x80) == (c & 0x80), "NaN code 0x%02x encodes back to 0x%02x", c, back);
      continue;
    }
    if (isinf(want)) inf_codes++;
    UT_CHECK((double)got == want && !signbit(got) == !signbit(want), "code 0x%02x decodes to %.9g, want %.9g", c, got, want);
    UT_CHECK(f->enc((float)want) == c, "%.9g encodes to 0x%02x, want 0x%02x", want, f->enc((float)want), c);
  }
  UT_CHECK(nan_codes == (f->ieee ? 6 : 2) && inf_codes == (f->ieee ? 2 : 0), "%d NaN codes, %d infinities", nan_codes,
           inf_codes);
  UT_CHECK(f->dec(f->ieee ? 0x7b : 0x7e) == (float)ref_max(f), "largest finite %g", f->dec(f->ieee ? 0x7b : 0x7e));
  UT_CHECK(f->dec(1) == (float)ldexp(1.0, 1 - f->bias - f->mant), "smallest subnormal %g", f->dec(1));
  ut_end();
}

/* every midpoint between neighbouring finite values: the tie goes to the even code, a hair either
 * side to the nearer one */
static void halfway(const Fmt *f) {
  char name[64];
  snprintf(name, sizeof name, "%s: halfway cases round to even", f->name);
  ut_begin(name);
  int ties = 0;
  for (int c = 0; c < 0x7f; c++) {
    double lo = ref_value(f, c), hi = ref_value(f, c + 1);
    if (!isfinite(lo) || !isfinite(hi)) continue;
    for (int s = 0; s < 2; s++) {
      float mid = (float)((lo + hi) / 2) * (s ? -1.0f : 1.0f); /* exact in f32 */
      int sg = s ? 0x80 : 0, even = (c & 1) ? c + 1 : c;
      UT_CHECK(f->enc(mid) == (sg | even), "tie %.9g between 0x%02x and 0x%02x -> 0x%02x, want 0x%02x", mid, c, c + 1,
               f->enc(mid), sg | even);
      float below = nextafterf(mid, 0), above = nextafterf(mid, s ? -INFINITY : INFINITY);
      UT_CHECK(f->enc(below) == (sg | c), "%.9g -> 0x%02x, want 0x%02x", below, f->enc(below), sg | c);
      UT_CHECK(f->enc(above) == (sg | (c + 1)), "%.9g -> 0x%02x, want 0x%02x", above, f->enc(above), sg | (c + 1));
      ties++;
    }
  }
  UT_CHECK(ties == 2 * (f->ieee ? 123 : 126), "%d ties", ties);
  ut_end();
}

/* the beyond-the-range rules and NaN */
static void edges(const Fmt *f) {
  char name[64];
  snprintf(name, sizeof name, "%s: saturation / overflow, infinity, NaN, zeros", f->name);
  ut_begin(name);
  if (!f->ieee) {
    float big[] = {448.0f, 463.99f, 464.0f, 480.0f, 500.0f, 1e30f, FLT_MAX, INFINITY};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
      UT_CHECK(f->enc(big[i]) == 0x7e, "%g -> 0x%02x, want 0x7e (448)", big[i], f->enc(big[i]));
      UT_CHECK(f->enc(-big[i]) == 0xfe, "%g -> 0x%02x, want 0xfe (-448)", -big[i], f->enc(-big[i]));
    }
  } else {
    UT_CHECK(f->enc(57344.0f) == 0x7b && f->enc(61439.0f) == 0x7b, "57344, 61439 -> 0x%02x 0x%02x", f->enc(57344.0f),
             f->enc(61439.0f));
    UT_CHECK(f->enc(61440.0f) == 0x7c && f->enc(1e30f) == 0x7c && f->enc(INFINITY) == 0x7c, "61440, 1e30, inf -> inf");
    UT_CHECK(f->enc(-61440.0f) == 0xfc && f->enc(-INFINITY) == 0xfc, "-61440, -inf -> -inf");
    UT_CHECK(isinf(f->dec(0x7c)) && f->dec(0xfc) < 0, "0x7c, 0xfc decode to +-inf");
  }
  UT_CHECK(isnan(ref_value(f, f->enc(NAN))) && isnan(ref_value(f, f->enc(-NAN))) && (f->enc(-NAN) & 0x80), "NaN -> 0x%02x",
           f->enc(NAN));
  UT_CHECK(f->enc(0.0f) == 0x00 && f->enc(-0.0f) == 0x80, "+-0 -> 0x%02x 0x%02x", f->enc(0.0f), f->enc(-0.0f));
  float tiny = (float)ldexp(1.0, -f->bias - f->mant); /* half the smallest subnormal: a tie with 0 */
  UT_CHECK(f->enc(tiny) == 0x00 && f->enc(nextafterf(tiny, 1)) == 0x01 && f->enc(1e-30f) == 0 && f->enc(-1e-30f) == 0x80,
           "underflow: %g -> 0x%02x", tiny, f->enc(tiny));
  ut_end();
}

/* a sweep of f32 inputs (every 509th bit pattern, both signs) against the brute-force encoder */
static void sweep(const Fmt *f) {
  char name[64];
  snprintf(name, sizeof name, "%s: f32 sweep against the nearest-value search", f->name);
  ut_begin(name);
  int n = 0, bad = 0;
  double top = ref_max(f) * 4;
  for (uint64_t u = 0; u <= 0xffffffffu; u += 509) {
    uint32_t b = (uint32_t)u;
    float x;
    memcpy(&x, &b, sizeof x);
    if (!isnan(x) && fabs(x) > top && !isinf(x)) continue; /* far beyond: the edges case covers them */
    if (!isnan(x) && fabs(x) < 1e-8 && x != 0) continue;   /* far below: flush, as edges checks */
    n++;
    uint8_t got = f->enc(x);
    int want = ref_encode(f, x);
    if (want < 0 ? !(isnan(ref_value(f, got)) && (got & 0x80) == (signbit(x) ? 0x80 : 0)) : got != want) {
      if (bad++ < 5) ut_fail("%.9g (0x%08x) -> 0x%02x, want 0x%02x", x, b, got, want);
    }
  }
  UT_CHECK(n > 100000, "only %d inputs", n);
  UT_CHECK(!bad, "%d of %d wrong", bad, n);
  ut_end();
}

/* rt_convert's tile paths agree with the scalar conversions, f32 <-> f8 and bf16 -> f8 */
static void arrays(const Fmt *f) {
  char name[64];
  snprintf(name, sizeof name, "%s: rt_convert arrays", f->name);
  ut_begin(name);
  enum { N = 3000 };
  static float src[N], back[N];
  static uint8_t q[N], q2[N];
  static uint16_t bf[N];
  for (int i = 0; i < N; i++) src[i] = (float)((i % 97) - 48) * 0.37f * (float)ldexp(1.0, (i % 23) - 12);
  UT_CHECK(rt_convert(q, f->dt, src, RT_F32, N) == RT_OK, "f32 -> %s", f->name);
  UT_CHECK(rt_convert(back, RT_F32, q, f->dt, N) == RT_OK, "%s -> f32", f->name);
  UT_CHECK(rt_convert(bf, RT_BF16, src, RT_F32, N) == RT_OK && rt_convert(q2, f->dt, bf, RT_BF16, N) == RT_OK, "bf16 -> %s",
           f->name);
  int bad = 0;
  for (int i = 0; i < N; i++) {
    bad += q[i] != f->enc(src[i]) || back[i] != f->dec(q[i]) || q2[i] != f->enc(rt_bf16_to_f32(bf[i]));
    bad += (double)back[i] != ref_value(f, q[i]);
  }
  UT_CHECK(!bad, "%d elements differ from the scalar conversions", bad);
  UT_CHECK(rt_dtype_size(f->dt) == 1 && !strcmp(rt_dtype_name(f->dt), f->name), "size %zu, name %s", rt_dtype_size(f->dt),
           rt_dtype_name(f->dt));
  ut_end();
}

/* C (bf16) = A (e4m3) B (e5m2): each product and each partial sum exact in f32 here (3 + 2
 * significant bits, exponents within a small range, k = 16), so the reference is the exact sum in
 * double rounded once to bf16 */
typedef struct GemmF8 {
  RtGemm g;
  RtGemmEngine engine;
} GemmF8;

static int gemm_f8_device(RtDevice *dev, void *arg) {
  GemmF8 *r = arg;
  int rc = rt_gemm_engine(dev, r->engine);
  return rc ? rc : rt_gemm(dev, &r->g);
}

static void gemm_f8(void) {
  ut_begin("gemm: f8e4m3 x f8e5m2 operands, bf16 result, f32 accumulation");
  enum { M = 5, N = 7, K = 16 };
  uint8_t a[M * K], b[K * N];
  uint16_t c[M * N];
  double ref[M * N];
  for (int i = 0; i < M * K; i++) a[i] = rt_f32_to_f8e4m3((float)(((i * 7) % 13) - 6) * 0.25f);
  for (int i = 0; i < K * N; i++) b[i] = rt_f32_to_f8e5m2((float)(((i * 5) % 11) - 5) * 0.5f);
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = 0;
      for (int k = 0; k < K; k++) s += ref_value(&FMTS[0], a[i * K + k]) * ref_value(&FMTS[1], b[k * N + j]);
      ref[i * N + j] = s;
    }
  int sizes[1] = {1};
  RtConfig cfg = test_mesh(1, sizes);
  Runtime *rt = NULL;
  UT_CHECK(rt_open(&cfg, &rt) == RT_OK, "rt_open");
  GemmF8 r = {.g = {.a_type = RT_F8E4M3, .b_type = RT_F8E5M2, .c_type = RT_BF16, .m = M, .n = N, .k = K, .batch = 1,
                    .a = a, .lda = K, .b = b, .ldb = N, .c = c, .ldc = N, .alpha = 1, .beta = 0}};
  for (int e = RT_GEMM_AUTO; rt && e <= RT_GEMM_ONEDNN; e++) {
    memset(c, 0xff, sizeof c);
    r.engine = (RtGemmEngine)e;
    UT_CHECK(rt_run(rt, gemm_f8_device, &r) == RT_OK, "rt_gemm (engine %s)", rt_gemm_engine_name((RtGemmEngine)e));
    int bad = 0;
    for (int i = 0; i < M * N; i++) bad += rt_bf16_to_f32(c[i]) != rt_bf16_to_f32(rt_f32_to_bf16((float)ref[i]));
    UT_CHECK(!bad, "engine %s: %d of %d elements differ", rt_gemm_engine_name((RtGemmEngine)e), bad, M * N);
  }
  if (rt) rt_close(rt);
  ut_end();
}

int main(void) {
  for (int i = 0; i < 2; i++) {
    every_code(&FMTS[i]);
    halfway(&FMTS[i]);
    edges(&FMTS[i]);
    sweep(&FMTS[i]);
    arrays(&FMTS[i]);
  }
  gemm_f8();
  return ut_summary();
}
