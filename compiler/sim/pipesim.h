/* pipesim.h: pipeline schedules on the timeline: which stage runs which microbatch's forward or
 * backward, when, and what a uniform pipeline's step comes to.
 *
 * In: the schedule (gpipe, 1f1b, interleaved), p stages, N microbatches, V model chunks per stage.
 * Out: each stage's forwards and backwards in execution order -- read off the one schedule the IR
 * carries (shard/schedule.h: the memory model counts the microbatches in flight from it, the
 * interpreter and the runtime execute it) -- and the schedule's step time and bubble for given
 * per-chunk forward, backward and transfer times, simulated on the timeline engine (timeline.h).
 *
 * The model is cut into p V virtual stages; virtual stage j = chunk c on stage j mod p, with
 * c = j / p (Megatron-LM's interleaving: stage s holds layers of chunks s, s + p, ...). A forward
 * of microbatch m on virtual stage j needs that microbatch's forward on j - 1 (then a transfer
 * when they sit on different stages); its backward needs the backward on j + 1 (the last virtual
 * stage's backward follows its own forward: the loss).
 *
 *   gpipe        (Huang et al. 2019) every forward, then every backward, microbatches in order.
 *                In flight at the peak: N on every stage.
 *   1f1b         (PipeDream-flush; Narayanan et al. 2021, Megatron-LM's non-interleaved schedule)
 *                stage s runs min(p - s - 1, N) warm-up forwards, then alternates one forward and
 *                one backward, then drains the remaining backwards. In flight: min(p - s, N).
 *   interleaved  (Narayanan et al. 2021 section 2.2.2, Megatron-LM's
 *                forward_backward_pipelining_with_interleaving) with V chunks per stage; needs
 *                N a multiple of p. The k-th forward of a stage runs chunk (k mod pV) / p on
 *                microbatch (k / pV) p + k mod p, the k-th backward chunk V - 1 - (k mod pV) / p
 *                on the same microbatch formula; warm-up (p - s - 1) 2 + (V - 1) p forwards (all
 *                N V when N = p), then one forward and one backward alternately, then the rest of
 *                the backwards. In flight on the first stage: p V + p - 1 chunk activations, i.e.
 *                (1 + (p - 1) / (p V)) p microbatches' worth (Korthikanti et al. 2022).
 *                interleaved with V = 1 is 1f1b.
 * Closed forms the tests check (no transfer time; t_f, t_b a microbatch's forward and backward
 * through a whole stage, so a chunk takes t_f / V, t_b / V):
 *   gpipe, 1f1b   step (N + p - 1)(t_f + t_b); bubble (p - 1)(t_f + t_b), i.e. (p - 1) / N of the
 *                 ideal N (t_f + t_b) and (p - 1) / (N + p - 1) of the step.
 *   interleaved   bubble (p - 1)(t_f + t_b) / V: (p - 1) / (V N) of the ideal.
 */
#ifndef SHARDC_SIM_PIPESIM_H
#define SHARDC_SIM_PIPESIM_H

#include "ir.h"
#include "timeline.h"

/* The schedules are language.md's (program.h's ScheduleKind: SCHED_GPIPE, SCHED_1F1B,
 * SCHED_INTERLEAVED). */
const char *sim_pipe_name(ScheduleKind k);                 /* "gpipe", ...; "?" */
bool sim_pipe_from_name(const char *s, ScheduleKind *out); /* false if s names none */

/* One step of a stage's program. */
typedef struct SimPipeStep {
  int stage;      /* 0 .. p-1 */
  bool backward;  /* false: forward */
  int microbatch; /* 0 .. N-1 */
  int chunk;      /* 0 .. V-1: the model chunk on this stage (virtual stage chunk p + stage) */
} SimPipeStep;

/* Whether (kind, p, n, v) is a schedule this module can produce: p, n, v >= 1; gpipe and 1f1b
 * take v = 1; interleaved needs n a multiple of p. *why (if not NULL) says what is wrong. */
bool sim_pipe_valid(ScheduleKind kind, int p, int n, int v, const char **why);

/* Writes stage's actions in execution order to out (room for cap; 2 N V are needed) and returns
 * how many there are (2 N V), or -1 when the schedule is not valid or stage is out of range. When
 * cap is smaller only the first cap are written. */
int sim_pipe_actions(ScheduleKind kind, int p, int n, int v, int stage, SimPipeStep *out, int cap);

/* The most microbatch-chunks whose forward stage has run and whose backward it has not yet, at
 * any point of its program (chunk activations held: divide by V for microbatches' worth). -1 when
 * not valid. */
int sim_pipe_in_flight(ScheduleKind kind, int p, int n, int v, int stage);

/* Duration of an action (a chunk's forward or backward), or of the transfer after it. */
typedef double (*PipeDurationFn)(void *ctx, const SimPipeStep *a);

/* Adds a schedule's tasks to g: stage s's actions, in order, on compute_streams[s]; after each
 * forward (backward) whose next (previous) virtual stage sits on another stage, a transfer task
 * of duration xfer(ctx, action) on p2p_streams[s], which the receiver's action waits for (with
 * p2p_streams NULL the transfer is a lag on the dependency, occupying no stream; xfer NULL means
 * 0). Task ids go to ids[s * 2 N V + k] for the k-th action of stage s when ids is not NULL.
 * False (nothing added) when the schedule is not valid. */
bool sim_pipe_build(SimGraph *g, ScheduleKind kind, int p, int n, int v, const int *compute_streams,
                    const int *p2p_streams, PipeDurationFn dur, PipeDurationFn xfer, void *ctx, int *ids);

/* What a uniform pipeline's step comes to. */
typedef struct PipeResult {
  double step_s;          /* the makespan */
  double ideal_s;         /* one stage's busy time: N V (t_fwd + t_bwd) per chunk */
  double bubble_s;        /* step_s - ideal_s: the first stage's idle time */
  double bubble_fraction; /* bubble_s / step_s */
  double bubble_over_ideal; /* bubble_s / ideal_s: the paper's (p - 1) / N, (p - 1) / (V N) */
} PipeResult;

/* Simulates (kind, p, n, v) with every chunk's forward taking fwd_s, its backward bwd_s, and each
 * transfer between stages p2p_s (on p2p streams). False when the schedule is not valid or the
 * timeline could not schedule every task (which would be a bug in the action order). */
bool sim_pipe_simulate(ScheduleKind kind, int p, int n, int v, double fwd_s, double bwd_s, double p2p_s,
                       PipeResult *out);

#endif
