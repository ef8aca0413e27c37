/* interp_int.h: what the interpreter's three files share (not for other stages).
 *
 *   interp.c       tensors, rounding, the lockstep walk over functions and loops, global runs,
 *                  test inputs, loading programs
 *   interp_ops.c   the kernels: one op on local blocks (the same code runs whole tensors)
 *   interp_spmd.c  per-device blocks, the checks around each op, collectives, scatter and
 *                  reassembly, the SPMD comparison */
#ifndef SHARDC_INTERP_INT_H
#define SHARDC_INTERP_INT_H

#include "devprog.h"
#include "interp.h"

#define NORM_EPS 1e-5   /* rmsnorm and layernorm (partition.c's statistics form uses the same) */

typedef struct Interp {
  const IrModule *m;
  InterpOptions opt;
  InterpStats *st;
  bool failed;
  /* devices: 1 for a global run */
  bool spmd;
  const Mesh *mesh;
  int ndev;
  int nvalues;
  Tensor ***vals;       /* [device][value id]: the device's block of the value, or NULL */
  bool *active;         /* [device]: evaluates ops now (false: another pipeline stage's turn) */
  /* the device program (devprog.h): the module's, or (a module without one: a hand-made test's) a
   * bare one of the interpreter's for its groups, blocks, stages and orders */
  DevModule *dev;
  Arena dev_arena;
  /* pipelines (interp_pipe.c) */
  const PipeInfo *pipe; /* the module's pipeline (m->pipeline), or NULL */
  /* the block of its result the op being evaluated must make (SPMD: its result's sharding on the
   * device; the dims an op makes of its own -- a broadcast's, onehot's, take_grad's rows -- are
   * made only there); want_set false: whole */
  bool want_set;
  int64_t want_start[MAX_RANK], want_shape[MAX_RANK];
} Interp;

/* interp.c: set up for `mesh` (NULL: a global run, one device), bind the entry's inputs and
 * params (whole tensors, cut into blocks for an SPMD run), run main, free. */
bool interp_setup(Interp *I, const IrModule *m, const Mesh *mesh, const InterpOptions *o, InterpStats *st);
bool interp_bind(Interp *I, Tensor *const *inputs, Tensor *const *params);
bool interp_exec(Interp *I);
void interp_teardown(Interp *I);

/* Records the first run-time error ("line L: op: message"); returns false for `return fail(...)`. */
bool interp_fail(Interp *I, const Op *op, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The device's block of value v (NULL with an error when unset). */
Tensor *interp_val(Interp *I, int dev, const Value *v);
void interp_set(Interp *I, int dev, const Value *v, Tensor *t); /* frees what v held */
/* Rounds every element to what t's dtype holds under the options (interp_round_value). */
void interp_round(const Interp *I, Tensor *t);

/* A ring attention's blocks on one device, in the order the ring brings them (index 0: the
 * device's own, j: the device j places back along the ring): q, k, v, and in the backward o and
 * do. */
typedef struct RingBlocks {
  int n;
  Tensor **q, **k, **v, **o, **dout;
} RingBlocks;

/* interp_ops.c: one device's ring attention (interp_spmd.c gathers the blocks). */
Tensor *iop_ring_attention(Interp *I, const Op *op, const RingBlocks *R);

/* The logical index of storage position p along d (the device program's storage order of d: a
 * causal ring's zigzag) in an SPMD run, p itself otherwise. */
int64_t interp_logical_index(const Interp *I, const Dim *d, int64_t p);
/* A whole tensor (a main input or output) into (to_storage) or out of the device program's storage
 * orders along each of its dims (dev_dim_order: a causal ring's zigzag, an interleaved pipeline's
 * stacked rows); a copy, a plain one in a global run. */
Tensor *interp_storage_permute(const Interp *I, const Tensor *t, bool to_storage);

/* interp_ops.c: op (not a loop, input, param or collective) on blocks x[0..noperands); the
 * result's blocks follow from the operands'. NULL after an error. */
Tensor *iop_eval(Interp *I, const Op *op, Tensor *const *x);
/* Slice of t to the block start/shape (which t must contain). */
Tensor *iop_slice(const Tensor *t, const int64_t *start, const int64_t *shape);
/* The stacked tensor t (leading dim the stacking dim) at global index i of that dim, without it. */
Tensor *iop_unstack(const Tensor *t, int64_t i);

/* interp_spmd.c */
bool spmd_op(Interp *I, const Op *op);           /* one non-collective op on every active device */
bool spmd_collective(Interp *I, const Op *op);   /* a collective on every active device */
bool spmd_loop_check(Interp *I, const Op *op);   /* the loop's shardings agree with its body's */
/* interp_pipe.c: an OP_PIPELINE, its stages in the schedule's order; the walk of a function
 * (interp.c), which it runs each region with. */
bool interp_pipeline(Interp *I, const Op *op);
bool interp_eval_func(Interp *I, const IrFunc *f);
/* The block of v that device dev holds under v's sharding (false with an error if a sharded dim
 * does not divide, or an input or param is partial). */
bool spmd_block(Interp *I, const Op *op, const Value *v, int dev, int64_t *start, int64_t *shape);
#endif
