/* ir_scalar.c: ops.def's scalar functions (its fn column), evaluated in double.
 *
 * In: an op kind with a scalar function (OpInfo.fn), its operands at one element, and the op for
 * its attributes (scalar, flag). Out: the element of the result, unrounded. The interpreter maps
 * it over tensors (interp_ops.c) and ir_build.c folds constants with it; the LLVM lowering builds
 * the same expressions in f32 from the same table (codegen/lower_math.c), so both compute one
 * formula, operation for operation. Integer division (toward zero, an error by zero) is the
 * interpreter's own. */
#include <math.h>

#include "ir.h"

double ir_scalar(OpKind k, const Op *op, const double *v) {
  double T0 = 0, T1 = 0;
  (void)T0, (void)T1;
#define X0 v[0]
#define X1 v[1]
#define X2 v[2]
#define X3 v[3]
#define S (op ? op->scalar : 0)
#define K(c) ((double)(c))
#define ADD(a, b) ((a) + (b))
#define SUB(a, b) ((a) - (b))
#define MUL(a, b) ((a) * (b))
#define DIV(a, b) ((a) / (b))
#define NEG(a) (-(a))
#define EXP(a) exp(a)
#define LOG(a) log(a)
#define SQRT(a) sqrt(a)
#define TANH(a) tanh(a)
#define ERF(a) erf(a)
#define POW(a, b) pow(a, b)
#define SELECT(c, a, b) ((c) ? (a) : (b))
#define LE(a, b) ((a) <= (b))
#define GT(a, b) ((a) > (b))
#define IF_FLAG(a, b) (op && op->flag ? (a) : (b))
#define LET(t, e, body) ((t) = (e), (body))
#define FN(e) return (e);
#define NOFN return NAN;
  switch (k) {
#define OP(e, nm, ar, cl, fl, li, co, lo, at, cv, fn, gr) \
  case e:                                                 \
    fn
#include "ops.def"
  default: return NAN;
  }
#include "ops_fn_end.h"
}
