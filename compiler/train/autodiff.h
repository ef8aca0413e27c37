/* autodiff.h: reverse-mode automatic differentiation as an IR-to-IR transform.
 *
 * In: a region (a function or a microbatch loop body) holding a forward computation that ends in
 * a rank-0 float loss, and the values to differentiate with respect to (the params, or the body
 * inputs standing for them). Out: the same region with the backward appended after its last op:
 * ordinary IR (contractions, elementwise ops, the *_GRAD ops of ir.h), so that propagation,
 * partitioning, the interpreter and the cost model treat it like any other code.
 *
 * Stacked loops. The backward of an OP_LOOP is one OP_LOOP with `reverse` set, over the same
 * stacking dim: its body is the gradient of the forward body. What that body reads of the forward
 * comes, per the remat policy, either from the forward loop's stacked outputs (residuals, one row
 * per iteration, marked Value.saved) or from forward ops cloned into it (PHASE_RECOMPUTE):
 *   none   every forward value the backward reads is a residual;
 *   full   only each iteration's carried input (the block input) is a residual; the whole forward
 *          body is re-run at the top of the backward body;
 *   dots   carried inputs and the outputs of contractions and fused attentions are residuals; the
 *          other ops the backward needs are re-run.
 * The gradients of the stacked params leave the backward loop stacked (its stacked outputs); those
 * of loop invariants are summed over the iterations in carried accumulators.
 * docs/training.md gives each op's gradient rule. */
#ifndef SHARDC_AUTODIFF_H
#define SHARDC_AUTODIFF_H

#include "ir.h"

/* Appends to f (a region of m) the backward of `loss` (a rank-0 float value of f) and sets
 * grads[i] = d loss / d wrt[i] for each i: a value of f of exactly wrt[i]'s type (a zero tensor
 * where the loss does not depend on it). `seed` is the gradient flowing into the loss (NULL: 1).
 * Forward values of f the backward reads are marked Value.saved (not params, inputs or constants);
 * stacked loops follow `remat`. New ops get PHASE_BACKWARD (clones PHASE_RECOMPUTE). Returns false
 * after reporting a located error (an op that cannot be differentiated, a residual that would
 * exceed MAX_RANK dims). */
bool autodiff_append(IrModule *m, IrFunc *f, Value *loss, Value *seed, Value *const *wrt, int nwrt,
                     RematKind remat, Value **grads);

/* ---- pieces step.c shares ---- */

/* Copying ops between regions, optionally renaming one dim everywhere (types, op dims, written
 * types): the microbatch loop runs the forward with `batch` replaced by the per-microbatch dim. */
typedef struct AdClone {
  IrModule *m;
  const Dim *from;      /* replaced by `to` in every type, op dim list and spec; NULL: none */
  Dim *to;
  int phase;            /* every copy gets this OpPhase; -1 keeps each op's own */
} AdClone;

/* A copy of src at the end of dst with the given operands (values of dst, src's operands mapped);
 * a loop's body is copied whole (a new region whose parent is dst). Results keep their names and
 * written types; they are not marked saved. */
Op *ad_clone_op(const AdClone *cl, const Op *src, IrFunc *dst, Value *const *operands);
TensorType ad_subst_type(const AdClone *cl, TensorType t);
const TypeSpec *ad_subst_spec(const AdClone *cl, const TypeSpec *s);

/* A rank-0 constant, and a tensor of zeros of type t (OP_BROADCAST of a constant), at the end of f. */
Value *ad_const(IrModule *m, IrFunc *f, double x, DType dt, SrcLoc loc, OpPhase phase);
Value *ad_zeros(IrModule *m, IrFunc *f, TensorType t, SrcLoc loc, OpPhase phase);
#endif
