/* cmm.h: collective matmuls, a transformation of the device program (devprog.h's DevCmm;
 * language.md, Steps: tp_overlap; docs/passes.md, "Collective matmuls").
 *
 * In: a module whose device program is built (devprog_build), the program (its mesh's target for
 * the cost model, its step's tp_overlap). Out: DevOp.cmm on each tensor-parallel AllGather that
 * runs as a ring of n - 1 permutes overlapped with partial contractions, and on the contraction it
 * feeds. Chosen where all of these hold:
 *   - the step says tp_overlap = on (the default; a forward entry has no step keys: on);
 *   - the AllGather is tensor-parallel (its axes shard no `batch` and are no pipeline's stage
 *     axes), one collective of one part over its own groups (not a bucket, not a subset), of a
 *     runtime dtype, in natural storage order;
 *   - its result is read once, by a contraction (not a route's dispatch or combine) in the same
 *     function, not a function output; the contraction's result keeps the gathered dim at the
 *     gathered extent and its other operand does not have it (the partial contractions write
 *     disjoint blocks of the result: Megatron-SP's AllGather of the sequence before a column-
 *     parallel matmul);
 *   - it pays by the cost model (calibrated, the simulator's): with C the contraction's time, A the
 *     AllGather's, c one partial contraction (its gathered group 1/n) and s one permute of a block,
 *     c + (n - 1) max(c, s) < C + A.
 * The ReduceScatter side (DevCmm.scatter, on the collective and on the contraction): a
 * tensor-parallel ReduceScatter (not a bucket, not a subset, a sum) whose operand is a contraction's
 * result read by it alone (not a route's dispatch or combine, the same function and stages), the
 * scattered dim kept from one operand or both (a batch dim) at the same extent, natural storage
 * order; or such an AllReduce, cut along the first of the result's dims that can be (its local
 * extent a multiple of n), then the blocks' AllGather (whole). It pays when c + (n - 1) max(c, s)
 * (+ the AllGather's time, for an AllReduce) < C + A, c the product of one block. A ReduceScatter
 * of a sum of contractions (the backward's input gradients of Megatron's column-parallel matmuls)
 * runs whole.
 * SHARDC_CMM=always (tests only) chooses both sides whatever they cost; SHARDC_CMM=scatter the
 * ReduceScatter side only. Returns how many it chose. */
#ifndef SHARDC_CMM_H
#define SHARDC_CMM_H

#include "ir.h"
#include "program.h"

int cmm_module(IrModule *m, const Program *p);

#endif
