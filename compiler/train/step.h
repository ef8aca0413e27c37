/* step.h: a whole training step as one IR function.
 *
 * In: the checked Program whose entry is the function of a `train` step, and the module ir_build
 * made of its forward. Out: the same module whose main is the step (docs/training.md):
 *
 *   inputs   the entry's arguments, then `labels` (cross_entropy: i32 shaped like the output
 *            minus its last dim; mse: the output's type; both with the output's written sharding),
 *            then, for adam, `step` (f32[], the step count t, 1 on the first step), then per param
 *            in m->params order its optimizer state: `master.PATH` (f32, when `master = f32` and
 *            the param is not f32 already), `adam.m.PATH`, `adam.v.PATH` (f32, adam).
 *   body     the forward as ir_build made it, the loss (f32 mean over every label position of the
 *            global batch), the backward (autodiff.h), the optimizer update. With
 *            `microbatches = N > 1` the forward, loss and backward run in one OP_LOOP over N
 *            microbatches (see below) whose carried values are the f32 loss and gradient
 *            accumulators.
 *   outputs  the loss (f32[]), the updated params in m->params order, then per param its updated
 *            state in the same order as the inputs.
 * Gradients have their param's type and the param's written sharding (with `zero = 2` also sharded
 * over the axes that shard `batch`, like the optimizer state under `zero >= 1`).
 *
 * Microbatches. The global `batch` dim (size B) is split into a stacking dim `microbatch` (size N)
 * and a new Dim also named `batch` (size B / N, so the layout's `batch` rule shards it): each input
 * holding `batch` is split(batch -> (batch', microbatch)) and transposed to lead with
 * `microbatch`: microbatch i holds the rows b with b % N == i, so that a device holding a
 * contiguous block of `batch` holds its share of every microbatch with no communication. Inside
 * the loop every type uses batch' in place of batch. */
#ifndef SHARDC_STEP_H
#define SHARDC_STEP_H

#include "ir.h"

/* One param's part of the step. Positions are in main's inputs / outputs; -1 where there is none. */
typedef struct StepParam {
  int param;            /* index in m->params */
  Value *value;         /* main's OP_PARAM value */
  Value *grad;          /* main's value holding its gradient: the param's type */
  int in_master, in_m, in_v;
  int out_param, out_master, out_m, out_v;
  int64_t flat;         /* zero >= 1 where the batch axes the param leaves free divide none of its
                           dims: their product D (else 0). The state is then Megatron's flattened,
                           padded shard: ceil(n / D) of the n elements each device's param block
                           holds (step_flat_bytes). Only the memory model reads it: the IR keeps
                           the state whole on each device and all-reduces the gradient (issue 19) */
  uint16_t flat_axes;   /* those axes (bits of the mesh's) */
} StepParam;

typedef struct StepInfo {
  const Step *step;
  int nargs;            /* main inputs [0, nargs) are the entry's own arguments */
  int in_labels;        /* == nargs */
  int in_t;             /* adam's step count, or -1 */
  Value *loss;          /* main's value of output 0 */
  StepParam *params;    /* one per m->params entry, in that order */
  int nparams;
  Op *micro_loop;       /* the microbatch loop, or NULL (microbatches = 1) */
  Dim *micro_dim;       /* its stacking dim, size N */
  Dim *micro_batch;     /* batch within one microbatch, size batch / N, named `batch` */
} StepInfo;

/* ir_build, then, when p->step is a train step (p->entry its function), the whole step in the
 * same module (m->step set). NULL after errors (diagnostics reported). */
IrModule *step_build(Arena *a, const Program *p);

/* The step from a module ir_build made for p->step's function (step_build's second half).
 * Returns false after reporting errors. */
bool step_build_module(IrModule *m, const Program *p);

/* Activations: per device, the bytes the forward keeps for the backward, for one microbatch: every
 * value marked Value.saved (in main and in the microbatch loop's body; a stacked loop's residuals
 * are its stacked results, so they count every layer), at its local size under its sharding on
 * `mesh`, plus the f32 softmax statistics of each saved attention output (one per query row).
 * The caller multiplies by the microbatches in flight (pipelines). */
int64_t step_saved_bytes(const IrModule *m, const Mesh *mesh);

/* A value of param sp's state (or, zero = 2, its reduced gradient) of `bytes` per device as the IR
 * holds it, in elements of `elem` bytes: its bytes as Megatron's flattened, padded shard when
 * sp->flat > 1 (ceil(elements / flat) x elem), else `bytes`. */
int64_t step_flat_bytes(const StepParam *sp, int64_t bytes, int64_t elem);

#endif
