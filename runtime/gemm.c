/* gemm.c: the contraction entry the lowering calls: row-major C = alpha op(A) op(B) + beta C
 * over a batch, on OpenBLAS's cblas_sgemm (one thread: rt_run set it). bf16 and f16 operands
 * are widened to f32 block by block in scratch buffers taken from the device's allocator (so
 * they count towards its peak, within a sixteenth of the operands' bytes or of what the device
 * holds), and a bf16
 * or f16 C is accumulated in f32 and rounded once. */
#include <cblas.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "dtype.h"
#include "rt_internal.h"

static bool is_float(RtDtype t) { return t == RT_F32 || t == RT_BF16 || t == RT_F16; }

static int64_t max1(int64_t x) { return x > 1 ? x : 1; }

static int bad(RtDevice *dev, const char *what, long long got, long long want) {
  return rtrun_fail(dev, RT_E_ARG, "gemm: %s is %lld, needs at least %lld", what, got, want);
}

/* Widens a rows x cols matrix (leading dim ld) of type t into a dense f32 one. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("tree-vectorize"))) /* the bf16 loop below (GCC vectorises at O3 only) */
#endif
static void widen(float *dst, const void *src, RtDtype t, int64_t rows, int64_t cols, int64_t ld) {
  size_t es = rt_dtype_size(t);
  if (t == RT_BF16) { /* exact: the bf16 bits are the f32's upper half (a loop the compiler vectorises) */
    for (int64_t i = 0; i < rows; i++) {
      const uint16_t *s = (const uint16_t *)src + i * ld;
      uint32_t *d = (uint32_t *)(dst + i * cols);
      for (int64_t j = 0; j < cols; j++) d[j] = (uint32_t)s[j] << 16;
    }
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

int rt_gemm(RtDevice *dev, const RtGemm *g) {
  if (!dev || !g) return RT_E_ARG;
  int rc = check(dev, g);
  if (rc || !g->m || !g->n) return rc;
  int64_t batch = g->batch ? g->batch : 1;
  enum CBLAS_TRANSPOSE ta = g->trans_a ? CblasTrans : CblasNoTrans, tb = g->trans_b ? CblasTrans : CblasNoTrans;
  size_t as = rt_dtype_size(g->a_type), bs = rt_dtype_size(g->b_type), cs = rt_dtype_size(g->c_type);

  if (g->a_type == RT_F32 && g->b_type == RT_F32 && g->c_type == RT_F32) {
    for (int64_t i = 0; i < batch; i++)
      cblas_sgemm(CblasRowMajor, ta, tb, (int)g->m, (int)g->n, (int)g->k, g->alpha,
                  (const float *)g->a + i * g->stride_a, (int)g->lda, (const float *)g->b + i * g->stride_b,
                  (int)g->ldb, g->beta, (float *)g->c + i * g->stride_c, (int)g->ldc);
    return RT_OK;
  }

  /* bf16 and f16 go through f32 block by block: C in blocks of bm x bn accumulated in f32 over
   * blocks of bk along K, each block of A and B widened as it is used. The scratch stays within a
   * sixteenth of the operands' own bytes or of what the device holds now, whichever is larger:
   * the buffer plan (`check`) does not count it, and the measured peak should agree with the plan.
   * Blocks are kept square: widening again costs about 1 / block of the product's time. */
  bool wa = g->a_type != RT_F32 && g->k, wb = g->b_type != RT_F32 && g->k, wc = g->c_type != RT_F32;
  int64_t bm = max1(g->m), bn = max1(g->n), bk = max1(g->k);
  double own = (double)(g->m * g->k) * (double)as + (double)(g->k * g->n) * (double)bs + (double)(g->m * g->n) * (double)cs;
  pthread_mutex_lock(&dev->mem.lock);
  double held = (double)dev->mem.current;
  pthread_mutex_unlock(&dev->mem.lock);
  double budget = (own > held ? own : held) / 16;
  for (;;) {
    double sc = 4.0 * ((wa ? (double)(bm * bk) : 0) + (wb ? (double)(bk * bn) : 0) + (wc ? (double)(bm * bn) : 0));
    if (sc <= budget || (bm == 1 && bn == 1 && bk == 1)) break;
    int64_t *big = &bm; /* halve the largest dim that holds scratch */
    if ((wb || wc) && bn > *big) big = &bn;
    if ((wa || wb) && bk > *big) big = &bk;
    if (*big == 1) big = bm > 1 ? &bm : bn > 1 ? &bn : &bk;
    *big = (*big + 1) / 2;
  }
  float *a32 = NULL, *b32 = NULL, *c32 = NULL;
  if (wa) rc = rt_alloc(dev, (size_t)(bm * bk) * sizeof(float), "gemm: A widened to f32", (void **)&a32);
  if (!rc && wb) rc = rt_alloc(dev, (size_t)(bk * bn) * sizeof(float), "gemm: B widened to f32", (void **)&b32);
  if (!rc && wc) rc = rt_alloc(dev, (size_t)(bm * bn) * sizeof(float), "gemm: C in f32", (void **)&c32);
  for (int64_t i = 0; !rc && i < batch; i++) {
    const char *A = (const char *)g->a + (size_t)(i * g->stride_a) * as;
    const char *Bm = (const char *)g->b + (size_t)(i * g->stride_b) * bs;
    char *C = (char *)g->c + (size_t)(i * g->stride_c) * cs;
    for (int64_t i0 = 0; i0 < g->m; i0 += bm) {
      int64_t mb = g->m - i0 < bm ? g->m - i0 : bm;
      for (int64_t j0 = 0; j0 < g->n; j0 += bn) {
        int64_t nb = g->n - j0 < bn ? g->n - j0 : bn;
        char *c = C + (size_t)(i0 * g->ldc + j0) * cs;
        float *cf = (float *)c;
        int64_t ldc = g->ldc;
        if (c32) {
          if (g->beta != 0) widen(c32, c, g->c_type, mb, nb, g->ldc);
          cf = c32;
          ldc = max1(nb);
        }
        for (int64_t k0 = 0; k0 < g->k || k0 == 0; k0 += bk) {
          int64_t kb = g->k - k0 < bk ? g->k - k0 : bk;
          /* A's block (rows i0.., columns k0..; stored transposed: the other way round), B's */
          const void *a = A + (size_t)(g->trans_a ? k0 * g->lda + i0 : i0 * g->lda + k0) * as;
          const void *b = Bm + (size_t)(g->trans_b ? j0 * g->ldb + k0 : k0 * g->ldb + j0) * bs;
          int64_t lda = g->lda, ldb = g->ldb;
          if (a32 && kb) {
            if (g->trans_a) widen(a32, a, g->a_type, kb, mb, g->lda), lda = max1(mb);
            else widen(a32, a, g->a_type, mb, kb, g->lda), lda = max1(kb);
            a = a32;
          }
          if (b32 && kb) {
            if (g->trans_b) widen(b32, b, g->b_type, nb, kb, g->ldb), ldb = max1(kb);
            else widen(b32, b, g->b_type, kb, nb, g->ldb), ldb = max1(nb);
            b = b32;
          }
          /* With k = 0 the A and B pointers are not read, but BLAS wants them valid. */
          cblas_sgemm(CblasRowMajor, ta, tb, (int)mb, (int)nb, (int)kb, g->alpha, kb ? a : cf, (int)lda,
                      kb ? b : cf, (int)ldb, k0 ? 1.0f : g->beta, cf, (int)ldc);
          if (!g->k) break;
        }
        if (c32) narrow(c, g->c_type, g->ldc, c32, mb, nb);
      }
    }
  }
  rt_free(dev, a32);
  rt_free(dev, b32);
  rt_free(dev, c32);
  return rc;
}
