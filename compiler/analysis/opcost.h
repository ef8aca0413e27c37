/* opcost.h: what one run of one op costs: FLOPs and HBM bytes moved. The one cost function check,
 * explain and sim read (language.md's FLOP counting; the bytes of the roofline).
 *
 * FLOPs: a contraction counts 2 x the product of its distinct dims (a dispatch or a combine of a
 * route's pattern 0, route_grad 2 x its entries x its contracted dims: route.h); the fused attention its two
 * contractions (QK over q's and k's dims, PV over q's dims without the head dim, the key dim and
 * v's); its backward (ir.h's OP_ATTENTION_GRAD) dq = QK + PV, dk = QK, dv = PV + QK, where dv's QK
 * is the recomputed scores (counted apart: not in the model's FLOPs); every other op 0.
 * Bytes: the operands read and the results written, each once, at their size (a route-patterned value
 * as its entries, ir_route_density; a slice: the block it
 * keeps, read and written; a rename, split or merge: none, they are views); the fused attention
 * reads q, k, v (and its backward o and do) and writes its result, never the scores (flash
 * attention). Collectives, loops, pipelines, inputs, params and constants cost 0 here (their
 * children and the cost model price them). */
#ifndef SHARDC_OPCOST_H
#define SHARDC_OPCOST_H

#include "ir.h"

typedef struct OpCost {
  double flops;           /* everything the op computes, recomputation included */
  double recompute_flops; /* of which: attention_grad's recomputed scores */
  double bytes;           /* HBM traffic */
} OpCost;

/* One run of op: `local` on one device (each dim at its local extent, Value.local: the module must
 * be localised), else global (each dim at its size). */
void opcost(const Op *op, bool local, OpCost *out);

/* FLOPs of a whole step (or forward) as its IR states them, global: every op times the runs a step
 * makes of it (loop trips, microbatches, a pipeline's regions per microbatch and chunk). */
typedef struct StepFlops {
  double total;         /* everything, recomputation included */
  double forward;       /* PHASE_FORWARD and PHASE_LOSS ops */
  double backward;      /* PHASE_BACKWARD ops, without the scores attention_grad recomputes */
  double recompute;     /* PHASE_RECOMPUTE ops and attention_grad's recomputed scores */
} StepFlops;
void step_flops(const IrModule *m, StepFlops *out);

/* The ideal time of a step's collectives on one device (cost_collective, peak figures), each times
 * the runs a step makes of it (loops; a pipeline's regions as one stage that runs them runs them,
 * its transfers left out; a bucket's members each alone): the suggestions' measure of the
 * communication a change adds. */
double step_comm_seconds(const IrModule *m, const Mesh *mesh);
/* The ideal time of a step's ops on one device: each op's roofline at its local extents
 * (cost_op_time, peak figures) times the runs a step makes of it, as step_comm_seconds counts. A
 * localised module. */
double step_compute_seconds(const IrModule *m, const Mesh *mesh);

/* How many times one step runs each region of a pipeline (per stage that runs it): PR_FIRST,
 * PR_LAST, PR_FIRST_BWD once per microbatch; a chunk region once per microbatch and chunk the
 * stage holds (V); `global`: summed over every stage (the chunk regions: N p V). */
double opcost_region_runs(const PipeInfo *pi, int region, bool global);
/* A causal ring attention's work on the device at ring rank `rank`: the (query, key) position
 * pairs its query block keeps unmasked, sum over its storage positions p of 1 + the logical index
 * of p (the device program's query order, DevRing.qorder); 0 for any other op. Under the zigzag order every rank's is the same. */
double opcost_ring_pairs(const IrModule *m, const Op *op, int rank);

#endif
