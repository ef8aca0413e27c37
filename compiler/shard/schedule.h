/* schedule.h: the order in which each pipeline stage runs its work (gpipe, 1f1b, interleaved(V)).
 *
 * A pure function of the pipeline's shape: p stages, V chunks of layers per stage (the model's
 * chunk g = c p + s is stage s's local chunk c), N microbatches. Each stage's list holds, in the
 * order the stage runs them: the regions (PA_FIRST before the model's chunk 0, PA_LAST after its
 * last chunk, PA_FIRST_BWD after chunk 0's backward), each chunk's forward and backward, and the
 * transfers between stages (a send after the region that makes the value, a receive before the
 * region that reads it; sends are asynchronous, a receive waits for its send). The interpreter,
 * the runtime and the simulator all run these lists; memory reads the activations in flight
 * from them.
 *
 *   gpipe          every forward, then every backward (microbatch order)
 *   1f1b           PipeDream-flush as Megatron-LM runs it: stage s runs min(p - s - 1, N) forwards,
 *                  then alternates one forward and one backward, then drains the backwards
 *   interleaved(V) Megatron-LM's interleaved schedule (Narayanan et al. 2021): virtual microbatch k
 *                  of a stage is chunk (k / p) mod V of microbatch (k / (pV)) p + k mod p
 *                  (backward: chunk V - 1 - (k / p) mod V); (p - s - 1) 2 + (V - 1) p warmup
 *                  forwards (all N V of them when N = p), then one forward one backward; needs N
 *                  divisible by p */
#ifndef SHARDC_SCHEDULE_H
#define SHARDC_SCHEDULE_H

#include "ir.h"

/* Fills pi->actions, pi->first_action and pi->in_flight_max from pi->stages, chunks,
 * microbatches and schedule (arena-allocated); `backward`: a train step (else forwards only).
 * Returns false, with *why set, when the shape cannot be scheduled (interleaved with N not
 * divisible by p). */
bool schedule_build(Arena *a, PipeInfo *pi, bool backward, const char **why);

/* The peak, over stage s's actions, of chunks whose forward has run and backward has not. */
int schedule_in_flight(const PipeInfo *pi, int s);

/* "1f1b", "gpipe", "interleaved(2)" */
const char *schedule_name(Arena *a, const PipeInfo *pi);
#endif
