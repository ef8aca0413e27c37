/* gemm.c: the contraction entry the lowering calls: row-major C = alpha op(A) op(B) + beta C
 * over a batch, on OpenBLAS's cblas_sgemm (one thread: rt_run set it). bf16 and f16 operands
 * are widened to f32 in scratch buffers taken from the device's allocator (so they count
 * towards its peak), and a bf16 or f16 C is accumulated in f32 and rounded once. */
#include <cblas.h>
#include <limits.h>
#include <string.h>

#include "dtype.h"
#include "rt_internal.h"

static bool is_float(RtDtype t) { return t == RT_F32 || t == RT_BF16 || t == RT_F16; }

static int64_t max1(int64_t x) { return x > 1 ? x : 1; }

static int bad(RtDevice *dev, const char *what, long long got, long long want) {
  return rtrun_fail(dev, RT_E_ARG, "gemm: %s is %lld, needs at least %lld", what, got, want);
}

/* Widens a rows x cols matrix (leading dim ld) of type t into a dense f32 one. */
static void widen(float *dst, const void *src, RtDtype t, int64_t rows, int64_t cols, int64_t ld) {
  size_t es = rt_dtype_size(t);
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
  /* A as stored: a_rows x a_cols; B likewise. */
  int64_t a_rows = g->trans_a ? g->k : g->m, a_cols = g->trans_a ? g->m : g->k;
  int64_t b_rows = g->trans_b ? g->n : g->k, b_cols = g->trans_b ? g->k : g->n;
  size_t as = rt_dtype_size(g->a_type), bs = rt_dtype_size(g->b_type), cs = rt_dtype_size(g->c_type);

  if (g->a_type == RT_F32 && g->b_type == RT_F32 && g->c_type == RT_F32) {
    for (int64_t i = 0; i < batch; i++)
      cblas_sgemm(CblasRowMajor, ta, tb, (int)g->m, (int)g->n, (int)g->k, g->alpha,
                  (const float *)g->a + i * g->stride_a, (int)g->lda, (const float *)g->b + i * g->stride_b,
                  (int)g->ldb, g->beta, (float *)g->c + i * g->stride_c, (int)g->ldc);
    return RT_OK;
  }

  float *a32 = NULL, *b32 = NULL, *c32 = NULL;
  if (g->a_type != RT_F32 && g->k)
    rc = rt_alloc(dev, (size_t)(a_rows * a_cols) * sizeof(float), "gemm: A widened to f32", (void **)&a32);
  if (!rc && g->b_type != RT_F32 && g->k)
    rc = rt_alloc(dev, (size_t)(b_rows * b_cols) * sizeof(float), "gemm: B widened to f32", (void **)&b32);
  if (!rc && g->c_type != RT_F32)
    rc = rt_alloc(dev, (size_t)(g->m * g->n) * sizeof(float), "gemm: C in f32", (void **)&c32);
  for (int64_t i = 0; !rc && i < batch; i++) {
    const void *a = (const char *)g->a + (size_t)(i * g->stride_a) * as;
    const void *b = (const char *)g->b + (size_t)(i * g->stride_b) * bs;
    void *c = (char *)g->c + (size_t)(i * g->stride_c) * cs;
    int64_t lda = g->lda, ldb = g->ldb, ldc = g->ldc;
    if (a32) widen(a32, a, g->a_type, a_rows, a_cols, lda), a = a32, lda = max1(a_cols);
    if (b32) widen(b32, b, g->b_type, b_rows, b_cols, ldb), b = b32, ldb = max1(b_cols);
    float *cf = c;
    if (c32) {
      if (g->beta != 0) widen(c32, c, g->c_type, g->m, g->n, ldc);
      cf = c32;
      ldc = g->n;
    }
    /* With k = 0 the A and B pointers are not read, but BLAS wants them valid. */
    cblas_sgemm(CblasRowMajor, ta, tb, (int)g->m, (int)g->n, (int)g->k, g->alpha, a ? a : cf, (int)lda,
                b ? b : cf, (int)ldb, g->beta, cf, (int)ldc);
    if (c32) narrow(c, g->c_type, g->ldc, c32, g->m, g->n);
  }
  rt_free(dev, a32);
  rt_free(dev, b32);
  rt_free(dev, c32);
  return rc;
}
