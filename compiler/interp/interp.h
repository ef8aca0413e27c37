/* interp.h: the reference interpreter of the IR: a plain evaluator that is the oracle for
 * gradient checks, for "the sharded program computes what the unsharded one computes", and for
 * the native lowering.
 *
 * Two ways to run a module's entry (m->main):
 *   interp_run       globally: every value whole, collectives the identity.
 *   interp_run_spmd  per device of a mesh, in lockstep: each value is the device's block of it
 *                    (Value.sharding: per dim an ordered tuple of mesh axes, major to minor; plus
 *                    `partial` axes over which the blocks are unreduced sums), each op computes
 *                    on local blocks, collectives exchange blocks between the simulated devices,
 *                    and the outputs are reassembled from the devices' blocks. Every op checks
 *                    that what it computes is the block its result's sharding says (shapes,
 *                    block offsets, partial axes): a partitioning mistake is a run-time error
 *                    naming the op, not a silently wrong number.
 * interp_check_spmd compares the two. docs/interpreter.md states every semantic decision (gelu
 * formula, norm epsilon, masks, rounding, the block layout, collectives).
 *
 * Values are held in double precision and rounded after every op to what the options say
 * (f32 for float dtypes by default; or each value's own dtype; or not at all, for finite
 * differences). Integer dtypes hold integers (exact in a double). */
#ifndef SHARDC_INTERP_H
#define SHARDC_INTERP_H

#include <stdio.h>

#include "pipeline.h"
#include "ir.h"

/* ---- tensors ----
 * A block of a tensor of type `type`: `shape[i]` elements along dim i starting at global index
 * `start[i]` (a whole tensor: start 0, shape = the dims' sizes). Row-major in the type's dim order. */
typedef struct Tensor {
  TensorType type;
  int64_t shape[MAX_RANK];
  int64_t start[MAX_RANK];
  int64_t n;        /* elements: the product of shape */
  double *data;
} Tensor;

Tensor *tensor_new(const TensorType *t);   /* whole, zero-filled; NULL if too large */
Tensor *tensor_new_block(const TensorType *t, const int64_t *start, const int64_t *shape);
Tensor *tensor_copy(const Tensor *t);
void tensor_free(Tensor *t);
bool tensor_is_whole(const Tensor *t);
/* Element at a local multi-index (one per dim). */
double tensor_get(const Tensor *t, const int64_t *idx);
void tensor_set(Tensor *t, const int64_t *idx, double v);
/* "f32[batch=2, seq=3] {1, 2, ...}" (at most `max` values; 0: all). */
void tensor_print(FILE *out, const Tensor *t, int max);

/* Largest |a - b| over the elements, and that divided by the largest |b| (the error relative to
 * the reference's scale). A NaN or infinity on one side only counts as an infinite difference;
 * the same NaN or infinity on both sides as none. Returns false if the types or blocks differ. */
bool tensor_diff(const Tensor *a, const Tensor *b, double *max_abs, double *max_rel);

/* ---- running ---- */

typedef enum {
  INTERP_F32,    /* every float value rounded to f32 after each op (default) */
  INTERP_DTYPE,  /* rounded to its own dtype: bf16, f16, f8e4m3, f8e5m2 or f32 */
  INTERP_F64     /* no rounding: double throughout (finite differences) */
} InterpPrecision;

typedef struct InterpOptions {
  InterpPrecision precision;
} InterpOptions;

/* x as a value of dtype dt holds it under precision p (round to nearest even; bf16 and f16
 * overflow to infinity, f8e4m3 saturates at 448, f8e5m2 overflows to infinity; integers truncate toward zero and wrap). */
double interp_round_value(InterpPrecision p, DType dt, double x);

typedef struct InterpStats {
  char error[512];          /* the first run-time error ("line 12: take: index 70 out of range
                               [0, 64)"), "" when none */
  int64_t ops;              /* ops evaluated, over every device and loop trip */
  int64_t implicit_slices;  /* SPMD: operands an op read sliced to its result's block beyond
                               Op.in_shard (a device slicing a value it holds; legal, counted) */
  double replica_diff;      /* SPMD: largest difference between copies of a replicated output */
} InterpStats;

/* The entry's inputs (main->inputs order, by OP_INPUT index), params (m->params order) and
 * outputs (main->outputs order) are whole tensors. outputs[i] receive new tensors (the caller
 * frees them). Returns false on a run-time error (st->error says which; st may be NULL). */
bool interp_run(const IrModule *m, const InterpOptions *o, Tensor *const *inputs, Tensor *const *params,
                Tensor **outputs, InterpStats *st);

/* The same, per device of `mesh` after propagation and partitioning: inputs and params are cut
 * into each device's block by their values' shardings, outputs reassembled (partial sums
 * summed; a replicated output is taken from the device whose coordinates on its replicated axes
 * are 0 -- on a pipeline's stage axes, the stage that ran its last trip -- and the other copies
 * are compared with it into st->replica_diff). */
bool interp_run_spmd(const IrModule *m, const Mesh *mesh, const InterpOptions *o, Tensor *const *inputs,
                     Tensor *const *params, Tensor **outputs, InterpStats *st);

/* The SPMD run against `reference` (the global outputs: usually interp_run on the module before
 * partitioning; NULL: interp_run on m itself, collectives as the identity). */
typedef struct InterpCheck {
  int noutputs;
  double *max_abs, *max_rel;  /* per output (malloc'd; interp_check_free) */
  double worst_abs, worst_rel;
  InterpStats stats;          /* of the SPMD run */
} InterpCheck;
bool interp_check_spmd(const IrModule *m, const Mesh *mesh, const InterpOptions *o, Tensor *const *inputs,
                       Tensor *const *params, Tensor *const *reference, InterpCheck *out);
void interp_check_free(InterpCheck *c);

/* ---- test inputs ---- */

int interp_ninputs(const IrModule *m);   /* main's inputs */
int interp_noutputs(const IrModule *m);
/* Deterministic pseudo-random whole tensors for the entry's inputs and params (the same seed
 * gives the same values on every machine), rounded to their dtypes. Floats: inputs uniform in
 * [-1, 1); params uniform in [-1, 1) / sqrt(fan-in), fan-in being the first dim after any
 * stacking dims (rank-1 params such as norm scales: 1 + that, so they sit near 1). Integers: an
 * input read as take's index or as cross_entropy's labels is uniform over the table's rows or the
 * classes (the fewest if several); other integers in [0, 8). A train step's inputs (m->step):
 * adam's step count is 1, second moments are in [0, 0.01), first moments in [-0.05, 0.05), a
 * master copy holds its param's values (the same seed's). Arrays of interp_ninputs(m) /
 * m->nparams tensors; interp_free_tensors frees them. */
Tensor **interp_random_inputs(const IrModule *m, uint64_t seed);
/* Per input of main (interp_ninputs(m) of them): the number of rows or classes an integer input
 * indexes (its take's table rows or its cross entropy's classes, the fewest if several), else 0. */
void interp_index_ranges(const IrModule *m, int64_t *range);
Tensor **interp_random_params(const IrModule *m, uint64_t seed);
void interp_free_tensors(Tensor **t, int n);

/* ---- programs ---- */

/* A .shard file loaded as check_load does (parse with imports, sema_program with these choices,
 * ir_build), without the driver: `defines` are "dim=N" strings (-D); layout / mesh / entry may be
 * NULL (the defaults). Returns EXIT_OK with ip->cp.ir built, or EXIT_PROGRAM_ERROR /
 * EXIT_USAGE (diagnostics printed). interp_unload frees everything. */
typedef struct InterpProgram {
  Arena arena;
  CheckedProgram cp;
} InterpProgram;
int interp_load(InterpProgram *ip, const char *path, const char *const *defines, int ndefines, const char *layout,
                const char *mesh, const char *entry);
void interp_unload(InterpProgram *ip);

/* Propagation and partitioning of a loaded module (what explain does); false if partitioning
 * reported an error. */
bool interp_partition(InterpProgram *ip);

#endif
