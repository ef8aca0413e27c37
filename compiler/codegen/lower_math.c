/* lower_math.c: exp, tanh and erf in f32 as straight-line LLVM IR (polynomials, selects and bit
 * operations), so that the elementwise loops calling them vectorise: without a vector math library
 * LLVM turns `llvm.exp` on vectors back into one `expf` call per lane, and `tanhf`, `erff` are
 * opaque libm calls. In: an f32 value; out: an f32 value. Accuracy (a C transcription of these
 * steps against libm in double, every 1e-4 over [-20, 20]): exp within 1.4 ulp (Cephes' expf
 * reduction and polynomial), tanh within 1e-7 absolute (an odd polynomial below 0.625, else from
 * exp), erf within 4e-7 absolute (Abramowitz and Stegun 7.1.26 with the exp above; a series below
 * 0.5). The interpreter comparisons (unit.native) cover them as ops. NaN stays NaN, exp's overflow
 * gives infinity and its underflow 0. Then lower_scalar: ops.def's scalar functions (the
 * elementwise ops, the activations' gradients, the optimizer's updates) built from the table's
 * expressions, the same ones the interpreter evaluates in double (ir_scalar.c). */
#include <math.h>

#include "lower_int.h"

static LLVMValueRef cf(Lower *L, double v) { return LLVMConstReal(L->f32, v); }

static LLVMValueRef poly(Lower *L, LLVMValueRef x, const double *c, int n) { /* c[0] x^(n-1) + ... + c[n-1] */
  LLVMValueRef p = cf(L, c[0]);
  for (int i = 1; i < n; i++) p = LLVMBuildFAdd(L->B, LLVMBuildFMul(L->B, p, x, ""), cf(L, c[i]), "");
  return p;
}

/* 2^n for an i32 n in [-126, 127]: the float with exponent field n + 127. */
static LLVMValueRef pow2i(Lower *L, LLVMValueRef n) {
  LLVMValueRef e = LLVMBuildShl(L->B, LLVMBuildAdd(L->B, n, LLVMConstInt(L->i32, 127, 0), ""), LLVMConstInt(L->i32, 23, 0), "");
  return LLVMBuildBitCast(L->B, e, L->f32, "");
}

static LLVMValueRef sel(Lower *L, LLVMRealPredicate p, LLVMValueRef a, LLVMValueRef b, LLVMValueRef t, LLVMValueRef f) {
  return LLVMBuildSelect(L->B, LLVMBuildFCmp(L->B, p, a, b, ""), t, f, "");
}

/* exp(x) = 2^n e^r, n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts), e^r by Cephes'
 * degree-5 polynomial; 2^n as two factors, so that results down to the subnormals stay exact. */
LLVMValueRef lower_exp(Lower *L, LLVMValueRef x) {
  LLVMBuilderRef B = L->B;
  LLVMValueRef xc = sel(L, LLVMRealOGT, x, cf(L, 88.72283935546875), cf(L, 88.72283935546875), x);
  xc = sel(L, LLVMRealOLT, xc, cf(L, -103.972084045410), cf(L, -103.972084045410), xc);
  xc = sel(L, LLVMRealUNO, x, x, cf(L, 0), xc); /* NaN: computed on 0, the NaN restored below */
  LLVMValueRef t = LLVMBuildFAdd(B, LLVMBuildFMul(B, xc, cf(L, 1.44269504088896341), ""), cf(L, 0.5), "");
  LLVMValueRef fl = lower_intrinsic(L, "llvm.floor", &t, 1);
  LLVMValueRef n = LLVMBuildFPToSI(B, fl, L->i32, "");
  LLVMValueRef r = LLVMBuildFSub(B, xc, LLVMBuildFMul(B, fl, cf(L, 0.693359375), ""), "");
  r = LLVMBuildFSub(B, r, LLVMBuildFMul(B, fl, cf(L, -2.12194440e-4), ""), "");
  static const double c[6] = {1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1};
  LLVMValueRef p = poly(L, r, c, 6);
  LLVMValueRef y = LLVMBuildFAdd(B, LLVMBuildFAdd(B, LLVMBuildFMul(B, p, LLVMBuildFMul(B, r, r, ""), ""), r, ""), cf(L, 1), "");
  LLVMValueRef n1 = LLVMBuildAShr(B, n, LLVMConstInt(L->i32, 1, 0), "");
  LLVMValueRef n2 = LLVMBuildSub(B, n, n1, "");
  y = LLVMBuildFMul(B, LLVMBuildFMul(B, y, pow2i(L, n1), ""), pow2i(L, n2), "");
  y = sel(L, LLVMRealOGT, x, cf(L, 88.72283935546875), cf(L, INFINITY), y);
  y = sel(L, LLVMRealOLT, x, cf(L, -103.972084045410), cf(L, 0), y);
  return sel(L, LLVMRealUNO, x, x, x, y);
}

/* tanh: x + x^3 P(x^2) (Cephes' tanhf) below |x| = 0.625, else sign(x) (1 - 2 / (e^(2|x|) + 1)). */
LLVMValueRef lower_tanh(Lower *L, LLVMValueRef x) {
  LLVMBuilderRef B = L->B;
  LLVMValueRef ax = lower_intrinsic(L, "llvm.fabs", &x, 1);
  LLVMValueRef z = LLVMBuildFMul(B, x, x, "");
  static const double c[5] = {-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1};
  LLVMValueRef small = LLVMBuildFAdd(B, LLVMBuildFMul(B, LLVMBuildFMul(B, poly(L, z, c, 5), z, ""), x, ""), x, "");
  LLVMValueRef e = lower_exp(L, LLVMBuildFMul(B, ax, cf(L, 2), ""));
  LLVMValueRef big = LLVMBuildFSub(B, cf(L, 1), LLVMBuildFDiv(B, cf(L, 2), LLVMBuildFAdd(B, e, cf(L, 1), ""), ""), "");
  LLVMValueRef args[2] = {big, x};
  big = lower_intrinsic(L, "llvm.copysign", args, 2);
  return sel(L, LLVMRealOLT, ax, cf(L, 0.625), small, big);
}

/* erf(x) = sign(x) (1 - (a1 t + ... + a5 t^5) e^(-x^2)), t = 1 / (1 + p |x|) (Abramowitz and
 * Stegun 7.1.26); below |x| = 0.5 the series x (2/sqrt(pi)) (1 - x^2/3 + x^4/10 - x^6/42 + x^8/216 - x^10/1320),
 * whose relative error stays small where erf itself is small. */
LLVMValueRef lower_erf(Lower *L, LLVMValueRef x) {
  LLVMBuilderRef B = L->B;
  LLVMValueRef ax = lower_intrinsic(L, "llvm.fabs", &x, 1);
  LLVMValueRef t = LLVMBuildFDiv(B, cf(L, 1), LLVMBuildFAdd(B, cf(L, 1), LLVMBuildFMul(B, ax, cf(L, 0.3275911), ""), ""), "");
  static const double a[6] = {1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592, 0};
  LLVMValueRef q = poly(L, t, a, 6);
  LLVMValueRef e = lower_exp(L, LLVMBuildFNeg(B, LLVMBuildFMul(B, ax, ax, ""), ""));
  LLVMValueRef big = LLVMBuildFSub(B, cf(L, 1), LLVMBuildFMul(B, q, e, ""), "");
  LLVMValueRef args[2] = {big, x};
  big = lower_intrinsic(L, "llvm.copysign", args, 2);
  LLVMValueRef z = LLVMBuildFMul(B, x, x, "");
  static const double s[6] = {-1.0 / 1320, 1.0 / 216, -1.0 / 42, 1.0 / 10, -1.0 / 3, 1};
  LLVMValueRef small = LLVMBuildFMul(B, LLVMBuildFMul(B, poly(L, z, s, 6), x, ""), cf(L, 1.1283791670955126), "");
  return sel(L, LLVMRealOLT, ax, cf(L, 0.5), small, big);
}

/* ---- ops.def's scalar functions ---- */

static LLVMValueRef m_add(Lower *L, bool ints, LLVMValueRef a, LLVMValueRef b) {
  return ints ? LLVMBuildAdd(L->B, a, b, "") : LLVMBuildFAdd(L->B, a, b, "");
}
static LLVMValueRef m_sub(Lower *L, bool ints, LLVMValueRef a, LLVMValueRef b) {
  return ints ? LLVMBuildSub(L->B, a, b, "") : LLVMBuildFSub(L->B, a, b, "");
}
static LLVMValueRef m_mul(Lower *L, bool ints, LLVMValueRef a, LLVMValueRef b) {
  return ints ? LLVMBuildMul(L->B, a, b, "") : LLVMBuildFMul(L->B, a, b, "");
}
static LLVMValueRef m_neg(Lower *L, bool ints, LLVMValueRef a) {
  return ints ? LLVMBuildNeg(L->B, a, "") : LLVMBuildFNeg(L->B, a, "");
}
static LLVMValueRef m_intrinsic1(Lower *L, const char *name, LLVMValueRef a) { return lower_intrinsic(L, name, &a, 1); }
static LLVMValueRef m_intrinsic2(Lower *L, const char *name, LLVMValueRef a, LLVMValueRef b) {
  LLVMValueRef args[2] = {a, b};
  return lower_intrinsic(L, name, args, 2);
}

/* The table's expression words as LLVM builder calls, in f32 (ADD SUB MUL NEG in i32 under ints:
 * OPF_INT ops on integers); exp, tanh and erf the vectorisable ones above. */
LLVMValueRef lower_scalar(Lower *L, const Op *op, LLVMValueRef *v, bool ints) {
  LLVMValueRef T0 = NULL, T1 = NULL;
  (void)T0, (void)T1;
#define X0 v[0]
#define X1 v[1]
#define X2 v[2]
#define X3 v[3]
#define S (op->scalar)
#define K(c) cf(L, (c))
#define ADD(a, b) m_add(L, ints, a, b)
#define SUB(a, b) m_sub(L, ints, a, b)
#define MUL(a, b) m_mul(L, ints, a, b)
#define DIV(a, b) LLVMBuildFDiv(L->B, a, b, "")
#define NEG(a) m_neg(L, ints, a)
#define EXP(a) lower_exp(L, a)
#define LOG(a) m_intrinsic1(L, "llvm.log", a)
#define SQRT(a) m_intrinsic1(L, "llvm.sqrt", a)
#define TANH(a) lower_tanh(L, a)
#define ERF(a) lower_erf(L, a)
#define POW(a, b) m_intrinsic2(L, "llvm.pow", a, b)
#define SELECT(c, a, b) LLVMBuildSelect(L->B, c, a, b, "")
#define LE(a, b) LLVMBuildFCmp(L->B, LLVMRealOLE, a, b, "")
#define GT(a, b) LLVMBuildFCmp(L->B, LLVMRealOGT, a, b, "")
#define IF_FLAG(a, b) (op->flag ? (a) : (b))
#define LET(t, e, body) ((t) = (e), (body))
#define FN(e) return (e);
#define NOFN return NULL;
  switch (op->kind) {
#define OP(e, nm, ar, cl, fl, li, co, lo, at, cv, fn, gr) \
  case e:                                                 \
    fn
#include "ops.def"
  default: return NULL;
  }
#include "ops_fn_end.h"
}
