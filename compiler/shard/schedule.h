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
 *                  divisible by p
 *
 * Bounded form. A stage's list is a warm-up, a steady state and a drain; the steady state repeats
 * one unit (1f1b: a forward and a backward; interleaved: p V of each, p microbatches; gpipe's
 * forwards and backwards: one microbatch's) whose actions differ from run to run only by their
 * microbatch. So each stage is also described in O(p V) actions whatever N is (PipeInfo.form):
 * its list with each repeating unit written once, as a PipeSpan that says how many times it runs
 * and by how many microbatches each run advances. Expanding every span gives the list exactly.
 * Memory (analysis/bufplan.c), explain and the simulator read the form, so that their time and
 * memory do not grow with N; the full list (PipeInfo.actions), which the interpreter and the
 * runtime execute action by action, is kept only up to SCHEDULE_LIST_MAX actions. */
#ifndef SHARDC_SCHEDULE_H
#define SHARDC_SCHEDULE_H

#include "ir.h"

/* The most actions a schedule's full list may hold (PipeInfo.actions; about 6 p N V for a train
 * step): 2^20, 16 MiB. Above it only the bounded form exists: check, explain and sim answer;
 * run and build refuse (docs/language.md, "Limits"). */
#define SCHEDULE_LIST_MAX ((int64_t)1 << 20)
/* The most actions the bounded form may hold over every stage (O(p^2 V): the warm-up and the
 * steady unit of each stage): 2^22. A pipeline beyond it is an error at its schedule. */
#define SCHEDULE_FORM_MAX ((int64_t)1 << 22)

/* Fills pi's schedule from pi->stages, chunks, microbatches and schedule (arena-allocated): the
 * bounded form (form, first_form, spans), nactions, the full list (actions, first_action) when
 * nactions <= SCHEDULE_LIST_MAX, and in_flight_max. `backward`: a train step (else forwards
 * only). Returns false, with *why set (arena-allocated or static), when the shape cannot be
 * scheduled: interleaved with N not divisible by p, or a form over SCHEDULE_FORM_MAX. */
bool schedule_build(Arena *a, PipeInfo *pi, bool backward, const char **why);

/* The peak, over stage s's actions, of chunks whose forward has run and backward has not (read
 * off the bounded form). */
int schedule_in_flight(const PipeInfo *pi, int s);

/* How many actions of this kind (PipeActionKind; for PA_SEND and PA_RECV only those carrying a
 * gradient when `backward`, an activation otherwise; for the others `backward` is ignored) the
 * schedule runs over every stage. */
int64_t schedule_count(const PipeInfo *pi, int kind, bool backward);

/* Whether pi->actions lists the whole schedule (the interpreter and the runtime need it). */
static inline bool schedule_listed(const PipeInfo *pi) { return pi->actions != NULL && pi->first_action != NULL; }

/* Writes stage s's full list into out (room for cap actions) by expanding its form; returns how
 * many actions the stage runs (only the first cap are written). */
int64_t schedule_expand(const PipeInfo *pi, int s, PipeAction *out, int64_t cap);

/* The span of stage s's form that starts at form index i (first_form[s] <= i < first_form[s+1]),
 * or NULL. A stage's form is walked: for each index i, its span's actions reps times over (the
 * microbatch `stride` higher each run), or the one action. */
const PipeSpan *schedule_span_at(const PipeInfo *pi, int s, int i);

/* "1f1b", "gpipe", "interleaved(2)" */
const char *schedule_name(Arena *a, const PipeInfo *pi);
#endif
