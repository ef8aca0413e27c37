/* plan_estimate.h: `shardc plan`'s fast estimate of a candidate's step time and memory per device,
 * in closed form from figures that do not change between candidates (the model's dims, its
 * parameter count and step FLOPs, the target's peak and bandwidths), so that ranking a strategy
 * takes microseconds where checking and simulating its program takes 5 to 30 ms. The search ranks
 * every strategy by it and simulates only the best (plan_search.c, PLAN_SIMULATE); the estimate
 * never decides a printed figure: every candidate printed was checked and simulated.
 *
 * The terms (per device, one step; docs/plan.md "The estimate"):
 *   compute   model FLOPs x recomputation / (devices x peak x matmul_efficiency)
 *   bubble    (compute + exposed TP) x (stages - 1) / (microbatches x V)
 *   TP        4 AllReduce-equivalents of the tokens' activations a layer (6 at full remat), a
 *             quarter exposed with tp_overlap on (collective matmuls), all with it off
 *   DP/FSDP   the gradients' AllReduce (or ReduceScatter + AllGather), FSDP's gathers, behind the
 *             backward of the last microbatch (FSDP: behind the whole compute), at least a layer's
 *   CP, EP    the ring's K/V (a fifth exposed), the experts' AllToAlls (all exposed)
 * Bandwidths: an axis's groups within a GPU's NVLink domain (the mesh's innermost node_size
 * devices) move at nvlink_bw, else network_bw; TPU axes at twice ici_bw (a ring both ways).
 * Memory: params, grads and optimizer state over the strategy's sharding, plus activations in
 * flight by remat (Korthikanti et al.'s per-layer bytes, flash attention: no scores kept). */
#ifndef SHARDC_PLAN_ESTIMATE_H
#define SHARDC_PLAN_ESTIMATE_H

#include "plan_search.h"

typedef struct PlanModel {
  const Target *target;
  int64_t devices;
  int64_t batch, seq, embed, heads, kv_heads, hidden, vocab, experts, layers;
  double params;           /* parameter count */
  double state_bytes;      /* global params + grads */
  double opt_bytes;        /* global optimizer state and master copies */
  double model_flops;      /* global, one step, no recomputation */
} PlanModel;

/* Fills c->estimate_s, c->estimate_memory and c->estimate_fits for c's strategy and step keys. */
void plan_estimate(const PlanModel *m, PlanCand *c);
#endif
