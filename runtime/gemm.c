/* gemm.c: the contraction entry the lowering calls: row-major C = alpha op(A) op(B) + beta C over
 * a batch, products accumulated in f32 and C rounded once to its dtype. Two engines: OpenBLAS's
 * cblas_sgemm (one thread: rt_run set it) and oneDNN's matmul (gemm_dnnl.c), picked per product
 * by rule() below, from measurements on the CPUs it names. bf16 operands go to oneDNN as they are
 * where the CPU multiplies bf16 natively; otherwise bf16 and f16 operands are widened to f32 block
 * by block in scratch buffers taken from the device's allocator (so they count towards its peak,
 * within a sixteenth of the operands' bytes or of what the device holds), and a bf16 or f16 C is
 * accumulated in f32 and rounded once. */
#include <cblas.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "rt_internal.h"

static bool is_float(RtDtype t) {
  return t == RT_F32 || t == RT_BF16 || t == RT_F16 || t == RT_F8E4M3 || t == RT_F8E5M2;
}
static bool is_f8(RtDtype t) { return t == RT_F8E4M3 || t == RT_F8E5M2; }

static int64_t max1(int64_t x) { return x > 1 ? x : 1; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static const char *const engine_names[] = {"auto", "openblas", "onednn-f32", "onednn"};

const char *rt_gemm_engine_name(RtGemmEngine e) {
  return e >= RT_GEMM_AUTO && e <= RT_GEMM_ONEDNN ? engine_names[e] : "?";
}

int rt_gemm_engine(RtDevice *dev, RtGemmEngine e) {
  if (!dev || e < RT_GEMM_AUTO || e > RT_GEMM_ONEDNN) return RT_E_ARG;
  dev->gemm_engine = e;
  return RT_OK;
}

/* ---- the rule ----
 *
 * Measured with `build/bench/bench_runtime --engines` (one device thread, best of 3-25 reps in
 * thread CPU time, every engine on the same data, interleaved), on the Intel Xeon (Cascade Lake,
 * AVX-512 with VNNI, no AVX512-BF16, no AMX; oneDNN's ISA avx512_core_vnni) this repository is
 * developed on, 2 cores shared with other builds (load average 13-15), oneDNN 2.6.3 and OpenBLAS
 * 0.3.21. GFLOP/s, f32 operands (docs/benchmarks.md has the whole table):
 *
 *   shape (m x n x k)              OpenBLAS  oneDNN   oneDNN/OpenBLAS
 *   4096 x 512 x 2048 (mlp)           110.7    71.4    0.65   \
 *   1024 x 1536 x 512 (llama)         103.0    68.5    0.67    | n and k both over 256:
 *   512 x 1536 x 1024, A^T            102.7    68.0    0.66    | OpenBLAS, by 0-50%
 *   256 x 1024 x 1024                  96.8    83.2    0.86    |
 *   1024 x 512 x 512                  102.1   105.3    1.03   /
 *   1024 x 128 x 512 (llama wk)        87.3   131.3    1.50   \
 *   512 x 128 x 1024, A^T              75.3    95.9    1.27    | n or k at most 256:
 *   1024 x 512 x 128, B^T              87.1   116.1    1.33    | oneDNN, by 7-50%
 *   4096 x 512 x 128                   82.3    89.5    1.09    |
 *   1024 x 512 x 256                  100.0   107.4    1.07   /
 *   32 x (256 x 256 x 64), B^T         60.3    81.8    1.36   \ batched (attention's shapes):
 *   8 x (64 x 64 x 64), B^T            61.4   104.3    1.70   / oneDNN's batched primitive
 *   64 x 64 x 64                      125.8    70.4    0.56   \ under 4 MFLOP a call: oneDNN's
 *   96 x 96 x 96                      132.6   108.5    0.82    | few microseconds of overhead
 *   16 x (8 x 8 x 8), B^T               3.3     2.7    0.82   / per call lose
 *
 * bf16 operands: this CPU has no bf16 units, and oneDNN's emulated bf16 matmul ran at 20-26
 * GFLOP/s on every shape above, against 60-90 for the same product widened to f32 (blocks on
 * the f32 rule): so bf16 goes to oneDNN as it is only where oneDNN reports AVX512-BF16 or AMX
 * (rt_cpu), where the issue that asked for this measured oneDNN's bf16 matmul at 184 GFLOP/s
 * against OpenBLAS's sgemm at 91 (2048^3, one thread, on an AMD EPYC with AVX512-BF16; not
 * measured here: no such CPU at hand). f16 is always widened (oneDNN 2.6 multiplies f16 natively
 * only on AVX512-FP16 parts, which its ISA query cannot name). */
enum { RULE_MIN_FLOPS = 4000000 };

static RtGemmEngine rule_f32(int64_t m, int64_t n, int64_t k, int64_t batch) {
  double flops = 2.0 * (double)m * (double)n * (double)k * (double)batch;
  if (flops < RULE_MIN_FLOPS) return RT_GEMM_OPENBLAS;
  if (batch > 1 || n <= 256 || k <= 256) return RT_GEMM_ONEDNN_F32;
  return RT_GEMM_OPENBLAS;
}

static RtGemmEngine rule(const RtGemm *g, const RtCpu *cpu) {
  int64_t batch = max1(g->batch);
  bool narrow = g->a_type != RT_F32 || g->b_type != RT_F32;
  double flops = 2.0 * (double)g->m * (double)g->n * (double)g->k * (double)batch;
  if (narrow && g->a_type == RT_BF16 && g->b_type == RT_BF16 && cpu->bf16_native && flops >= RULE_MIN_FLOPS)
    return RT_GEMM_ONEDNN;
  return rule_f32(g->m, g->n, g->k, batch);
}

RtGemmEngine rt_gemm_choice(const RtGemm *g) { return g ? rule(g, rt_cpu()) : RT_GEMM_OPENBLAS; }

/* ---- checks ---- */

static int bad(RtDevice *dev, const char *what, long long got, long long want) {
  return rtrun_fail(dev, RT_E_ARG, "gemm: %s is %lld, needs at least %lld", what, got, want);
}

static int check(RtDevice *dev, const RtGemm *g) {
  if (!is_float(g->a_type) || !is_float(g->b_type) || !is_float(g->c_type))
    return rtrun_fail(dev, RT_E_ARG, "gemm: operands %s x %s -> %s: only f32, bf16 and f16", rt_dtype_name(g->a_type),
                      rt_dtype_name(g->b_type), rt_dtype_name(g->c_type));
  if (g->m < 0 || g->n < 0 || g->k < 0 || g->m > INT_MAX || g->n > INT_MAX || g->k > INT_MAX)
    return rtrun_fail(dev, RT_E_ARG, "gemm: m, n, k = %lld, %lld, %lld: each from 0 to %d", (long long)g->m,
                      (long long)g->n, (long long)g->k, INT_MAX);
  int64_t a_cols = g->trans_a ? g->m : g->k, b_cols = g->trans_b ? g->k : g->n;
  if (g->lda < max1(a_cols)) return bad(dev, "lda", (long long)g->lda, (long long)max1(a_cols));
  if (g->ldb < max1(b_cols)) return bad(dev, "ldb", (long long)g->ldb, (long long)max1(b_cols));
  if (g->ldc < max1(g->n)) return bad(dev, "ldc", (long long)g->ldc, (long long)max1(g->n));
  if (g->lda > INT_MAX || g->ldb > INT_MAX || g->ldc > INT_MAX)
    return rtrun_fail(dev, RT_E_ARG, "gemm: a leading dim over %d", INT_MAX);
  if (g->batch < 0 || g->stride_a < 0 || g->stride_b < 0 || g->stride_c < 0)
    return rtrun_fail(dev, RT_E_ARG, "gemm: negative batch or stride");
  if ((g->m && g->k && !g->a) || (g->k && g->n && !g->b) || (g->m && g->n && !g->c))
    return rtrun_fail(dev, RT_E_ARG, "gemm: a NULL operand");
  return RT_OK;
}

/* ---- widening ---- */

/* Widens a rows x cols matrix (leading dim ld) of type t into a dense f32 one. */
static void widen(float *dst, const void *src, RtDtype t, int64_t rows, int64_t cols, int64_t ld) {
  size_t es = rt_dtype_size(t);
  if (t == RT_BF16) { /* exact: the bf16 bits are the f32's upper half */
    for (int64_t i = 0; i < rows; i++) rtk_bf16_to_f32(dst + i * cols, (const uint16_t *)src + i * ld, (size_t)cols);
    return;
  }
  for (int64_t i = 0; i < rows; i++)
    rt_convert(dst + i * cols, RT_F32, (const char *)src + (size_t)(i * ld) * es, t, (size_t)cols);
}

static void narrow(void *dst, RtDtype t, int64_t ld, const float *src, int64_t rows, int64_t cols) {
  size_t es = rt_dtype_size(t);
  for (int64_t i = 0; i < rows; i++)
    rt_convert((char *)dst + (size_t)(i * ld) * es, t, src + i * cols, RT_F32, (size_t)cols);
}

/* ---- products ---- */

/* An all-f32 product on OpenBLAS, or on oneDNN's f32 matmul where it has an implementation. */
static int product_f32(RtDevice *dev, const RtGemm *g, RtGemmEngine e) {
  if (e == RT_GEMM_AUTO) e = rule_f32(g->m, g->n, g->k, max1(g->batch));
  if (e != RT_GEMM_OPENBLAS) {
    bool ran;
    int rc = rtdnnl_gemm(dev, g, &ran);
    if (rc || ran) return rc;
  }
  enum CBLAS_TRANSPOSE ta = g->trans_a ? CblasTrans : CblasNoTrans, tb = g->trans_b ? CblasTrans : CblasNoTrans;
  for (int64_t i = 0; i < max1(g->batch); i++)
    cblas_sgemm(CblasRowMajor, ta, tb, (int)g->m, (int)g->n, (int)g->k, g->alpha, (const float *)g->a + i * g->stride_a,
                (int)g->lda, (const float *)g->b + i * g->stride_b, (int)g->ldb, g->beta, (float *)g->c + i * g->stride_c,
                (int)g->ldc);
  return RT_OK;
}

/* k = 0: C = beta C (alpha times an empty sum), in f32, rounded once; beta 0 writes zeros. */
static void scale_only(const RtGemm *g) {
  size_t cs = rt_dtype_size(g->c_type);
  for (int64_t b = 0; b < max1(g->batch); b++)
    for (int64_t i = 0; i < g->m; i++) {
      char *row = (char *)g->c + (size_t)(b * g->stride_c + i * g->ldc) * cs;
      for (int64_t j = 0; j < g->n; j++) {
        float v = 0;
        if (g->beta != 0) rt_convert(&v, RT_F32, row + (size_t)j * cs, g->c_type, 1), v *= g->beta;
        rt_convert(row + (size_t)j * cs, g->c_type, &v, RT_F32, 1);
      }
    }
}

/* bf16 and f16 through f32 block by block: C in blocks of bb x bm x bn (bb batch elements)
 * accumulated in f32 over blocks of bk along K, each block of A and B widened when it is first
 * used (a block already widened is not widened again), and each block's f32 product on engine e
 * (AUTO: the f32 rule for the block's shape). The scratch stays within a sixteenth of the
 * operands' own bytes or of what the device holds now, whichever is larger: the buffer plan
 * (`check`) does not count it, and the measured peak should agree with the plan. Blocks, in order
 * of preference: the whole product; fewer batch elements at once; B whole with A's and C's rows
 * in blocks (or A whole with B's and C's columns), so that every element is converted once;
 * else square blocks (widening again costs about 1 / block of the product's time). */
typedef struct Blocks {
  int64_t bb, bm, bn, bk;
} Blocks;

static double scratch_of(const Blocks *b, bool wa, bool wb, bool wc, bool share_a, bool share_b) {
  return 4.0 * ((wa ? (double)((share_a ? 1 : b->bb) * b->bm * b->bk) : 0) + (wb ? (double)((share_b ? 1 : b->bb) * b->bk * b->bn) : 0) +
                (wc ? (double)(b->bb * b->bm * b->bn) : 0));
}

static Blocks choose_blocks(const RtGemm *g, double budget, bool wa, bool wb, bool wc, bool share_a, bool share_b) {
  Blocks b = {max1(g->batch), max1(g->m), max1(g->n), max1(g->k)};
  while (b.bb > 1 && scratch_of(&b, wa, wb, wc, share_a, share_b) > budget) b.bb = (b.bb + 1) / 2;
  if (scratch_of(&b, wa, wb, wc, share_a, share_b) <= budget) return b;
  /* one operand whole, the other's rows (columns) and C's in blocks of at least 32 */
  double room = budget / 4;
  if (wb || !wa) {
    double per_row = (wa ? (double)g->k : 0) + (wc ? (double)g->n : 0), rows = (room - (wb ? (double)(g->k * g->n) : 0)) / (per_row > 0 ? per_row : 1);
    if (rows >= (double)min64(max1(g->m), 32)) return (Blocks){1, min64(max1(g->m), (int64_t)rows), max1(g->n), max1(g->k)};
  }
  if (wa || !wb) {
    double per_col = (wb ? (double)g->k : 0) + (wc ? (double)g->m : 0), cols = (room - (wa ? (double)(g->m * g->k) : 0)) / (per_col > 0 ? per_col : 1);
    if (cols >= (double)min64(max1(g->n), 32)) return (Blocks){1, max1(g->m), min64(max1(g->n), (int64_t)cols), max1(g->k)};
  }
  for (;;) {
    if (scratch_of(&b, wa, wb, wc, share_a, share_b) <= budget || (b.bm == 1 && b.bn == 1 && b.bk == 1)) return b;
    int64_t *big = &b.bm; /* halve the largest dim that holds scratch */
    if ((wb || wc) && b.bn > *big) big = &b.bn;
    if ((wa || wb) && b.bk > *big) big = &b.bk;
    if (*big == 1) big = b.bm > 1 ? &b.bm : b.bn > 1 ? &b.bn : &b.bk;
    *big = (*big + 1) / 2;
  }
}

static int widened(RtDevice *dev, const RtGemm *g, RtGemmEngine e) {
  int64_t batch = max1(g->batch);
  size_t as = rt_dtype_size(g->a_type), bs = rt_dtype_size(g->b_type), cs = rt_dtype_size(g->c_type);
  bool wa = g->a_type != RT_F32, wb = g->b_type != RT_F32, wc = g->c_type != RT_F32;
  bool share_a = batch > 1 && g->stride_a == 0, share_b = batch > 1 && g->stride_b == 0;
  double own = (double)(share_a ? 1 : batch) * (double)(g->m * g->k) * (double)as +
               (double)(share_b ? 1 : batch) * (double)(g->k * g->n) * (double)bs + (double)batch * (double)(g->m * g->n) * (double)cs;
  pthread_mutex_lock(&dev->mem.lock);
  double held = (double)dev->mem.current;
  pthread_mutex_unlock(&dev->mem.lock);
  Blocks bl = choose_blocks(g, (own > held ? own : held) / 16, wa, wb, wc, share_a, share_b);
  int64_t bb = bl.bb, bm = bl.bm, bn = bl.bn, bk = bl.bk;
  float *a32 = NULL, *b32 = NULL, *c32 = NULL;
  int rc = RT_OK;
  if (wa) rc = rt_alloc(dev, (size_t)((share_a ? 1 : bb) * bm * bk) * sizeof(float), "gemm: A widened to f32", (void **)&a32);
  if (!rc && wb) rc = rt_alloc(dev, (size_t)((share_b ? 1 : bb) * bk * bn) * sizeof(float), "gemm: B widened to f32", (void **)&b32);
  if (!rc && wc) rc = rt_alloc(dev, (size_t)(bb * bm * bn) * sizeof(float), "gemm: C in f32", (void **)&c32);
  int64_t a_at[3] = {-1, -1, -1}, b_at[3] = {-1, -1, -1}; /* the block each scratch holds: batch, row, K */
  for (int64_t q0 = 0; !rc && q0 < batch; q0 += bb) {
    int64_t nq = min64(bb, batch - q0);
    for (int64_t i0 = 0; !rc && i0 < g->m; i0 += bm) {
      int64_t mb = min64(bm, g->m - i0);
      for (int64_t j0 = 0; !rc && j0 < g->n; j0 += bn) {
        int64_t nb = min64(bn, g->n - j0);
        char *c = (char *)g->c + (size_t)(q0 * g->stride_c + i0 * g->ldc + j0) * cs;
        RtGemm p = {.a_type = RT_F32, .b_type = RT_F32, .c_type = RT_F32, .trans_a = g->trans_a, .trans_b = g->trans_b,
                    .m = mb, .n = nb, .batch = nq, .c = c, .ldc = g->ldc, .stride_c = g->stride_c, .alpha = g->alpha};
        if (c32) {
          if (g->beta != 0)
            for (int64_t q = 0; q < nq; q++) widen(c32 + q * mb * nb, c + (size_t)(q * g->stride_c) * cs, g->c_type, mb, nb, g->ldc);
          p.c = c32, p.ldc = nb, p.stride_c = mb * nb;
        }
        for (int64_t k0 = 0; !rc && k0 < g->k; k0 += bk) {
          int64_t kb = min64(bk, g->k - k0);
          /* A's block (rows i0.., columns k0..; stored transposed: the other way round), B's */
          const char *a = (const char *)g->a + (size_t)(q0 * g->stride_a + (g->trans_a ? k0 * g->lda + i0 : i0 * g->lda + k0)) * as;
          const char *b = (const char *)g->b + (size_t)(q0 * g->stride_b + (g->trans_b ? j0 * g->ldb + k0 : k0 * g->ldb + j0)) * bs;
          p.k = kb;
          p.a = a, p.lda = g->lda, p.stride_a = g->stride_a;
          p.b = b, p.ldb = g->ldb, p.stride_b = g->stride_b;
          if (a32) {
            int64_t rows = g->trans_a ? kb : mb, cols = g->trans_a ? mb : kb;
            if (a_at[0] != (share_a ? 0 : q0) || a_at[1] != i0 || a_at[2] != k0) {
              for (int64_t q = 0; q < (share_a ? 1 : nq); q++)
                widen(a32 + q * mb * kb, a + (size_t)(q * g->stride_a) * as, g->a_type, rows, cols, g->lda);
              a_at[0] = share_a ? 0 : q0, a_at[1] = i0, a_at[2] = k0;
            }
            p.a = a32, p.lda = cols, p.stride_a = share_a ? 0 : mb * kb;
          }
          if (b32) {
            int64_t rows = g->trans_b ? nb : kb, cols = g->trans_b ? kb : nb;
            if (b_at[0] != (share_b ? 0 : q0) || b_at[1] != j0 || b_at[2] != k0) {
              for (int64_t q = 0; q < (share_b ? 1 : nq); q++)
                widen(b32 + q * kb * nb, b + (size_t)(q * g->stride_b) * bs, g->b_type, rows, cols, g->ldb);
              b_at[0] = share_b ? 0 : q0, b_at[1] = j0, b_at[2] = k0;
            }
            p.b = b32, p.ldb = cols, p.stride_b = share_b ? 0 : kb * nb;
          }
          p.beta = k0 ? 1.0f : g->beta;
          rc = product_f32(dev, &p, e);
        }
        if (!rc && c32)
          for (int64_t q = 0; q < nq; q++) narrow(c + (size_t)(q * g->stride_c) * cs, g->c_type, g->ldc, c32 + q * mb * nb, mb, nb);
      }
    }
  }
  rt_free(dev, a32);
  rt_free(dev, b32);
  rt_free(dev, c32);
  return rc;
}

static void trace(const RtGemm *g, RtGemmEngine e, const char *how) {
  fprintf(stderr, "shardrt gemm: %s x %s -> %s, %lld x %lld x %lld, batch %lld%s%s: %s%s\n", rt_dtype_name(g->a_type),
          rt_dtype_name(g->b_type), rt_dtype_name(g->c_type), (long long)g->m, (long long)g->n, (long long)g->k,
          (long long)max1(g->batch), g->trans_a ? ", A transposed" : "", g->trans_b ? ", B transposed" : "",
          rt_gemm_engine_name(e), how);
}

int rt_gemm(RtDevice *dev, const RtGemm *g) {
  if (!dev || !g) return RT_E_ARG;
  int rc = check(dev, g);
  if (rc || !g->m || !g->n) return rc;
  if (!g->k) {
    scale_only(g);
    return RT_OK;
  }
  RtGemmEngine e = (RtGemmEngine)dev->gemm_engine;
  RtGemmEngine pick = e == RT_GEMM_AUTO ? rule(g, rt_cpu()) : e;
  bool all_f32 = g->a_type == RT_F32 && g->b_type == RT_F32 && g->c_type == RT_F32;
  if (dev->rt->gemm_trace) trace(g, pick, all_f32 ? "" : pick == RT_GEMM_ONEDNN ? " (as they are)" : " (widened to f32)");
  if (all_f32) return product_f32(dev, g, pick == RT_GEMM_ONEDNN ? RT_GEMM_ONEDNN_F32 : pick);
  if (pick == RT_GEMM_ONEDNN && !is_f8(g->a_type) && !is_f8(g->b_type) && !is_f8(g->c_type)) {
    bool ran; /* FP8 operands are always widened (exactly) to f32: oneDNN here has no f8 matmul */
    rc = rtdnnl_gemm(dev, g, &ran);
    if (rc || ran) return rc;
  }
  /* widened: the block products follow the f32 rule unless an engine is forced */
  return widened(dev, g, e == RT_GEMM_ONEDNN ? RT_GEMM_ONEDNN_F32 : e);
}
