/* pipesim.c: pipeline schedules on the timeline (pipesim.h): the IR's action orders
 * (shard/schedule.c) seen as forwards and backwards, and their simulation.
 *
 * In: (schedule, p stages, N microbatches, V chunks). Out: per stage, its forwards and backwards
 * in execution order; the timeline of a whole pipeline built from them. The orders are those of
 * GPipe, of PipeDream-flush as Megatron-LM runs it (1F1B), and of Megatron-LM's interleaved
 * schedule (Narayanan et al. 2021). */
#include <stdlib.h>
#include <string.h>

#include "pipesim.h"
#include "schedule.h"

static const char *const pipe_names[] = {[SCHED_GPIPE] = "gpipe", [SCHED_1F1B] = "1f1b",
                                         [SCHED_INTERLEAVED] = "interleaved"};

const char *sim_pipe_name(ScheduleKind k) {
  if ((int)k < 0 || k > SCHED_INTERLEAVED) return "?";
  return pipe_names[k];
}

bool sim_pipe_from_name(const char *s, ScheduleKind *out) {
  if (!s) return false;
  for (int k = 0; k <= SCHED_INTERLEAVED; k++)
    if (strcmp(s, pipe_names[k]) == 0) {
      if (out) *out = (ScheduleKind)k;
      return true;
    }
  return false;
}

/* Limits that keep 2 N V and N p V in int. */
enum { PIPE_MAX = 1 << 20 };

bool sim_pipe_valid(ScheduleKind kind, int p, int n, int v, const char **why) {
  const char *w = NULL;
  if ((int)kind < 0 || kind > SCHED_INTERLEAVED) w = "unknown schedule";
  else if (p < 1 || n < 1 || v < 1) w = "stages, microbatches and chunks must be at least 1";
  else if (p > PIPE_MAX || n > PIPE_MAX || v > PIPE_MAX || (double)n * p * v > (double)(1 << 20))
    w = "schedule too large"; /* (sim_pipe_build holds every action) */
  else if (kind != SCHED_INTERLEAVED && v != 1) w = "gpipe and 1f1b have one chunk per stage";
  else if (kind == SCHED_INTERLEAVED && v > 1 && n % p != 0)
    w = "the interleaved schedule needs the microbatches to be a multiple of the stages";
  if (why) *why = w;
  return w == NULL;
}

/* The schedule the IR would carry for this shape (shard/schedule.c), in an arena the caller frees. */
static bool schedule_of(Arena *a, ScheduleKind kind, int p, int n, int v, PipeInfo *pi) {
  memset(pi, 0, sizeof *pi);
  pi->stages = p, pi->chunks = v, pi->microbatches = n, pi->schedule = kind;
  const char *why;
  return schedule_build(a, pi, true, &why);
}

int sim_pipe_actions(ScheduleKind kind, int p, int n, int v, int stage, SimPipeStep *out, int cap) {
  if (!sim_pipe_valid(kind, p, n, v, NULL) || stage < 0 || stage >= p) return -1;
  Arena a;
  arena_init(&a);
  PipeInfo pi;
  int k = -1;
  if (schedule_of(&a, kind, p, n, v, &pi)) {
    /* the stage's list, expanded from its bounded form (the full list may not be kept) */
    int64_t len = schedule_expand(&pi, stage, NULL, 0);
    PipeAction *acts = mem_alloc(sizeof *acts * (size_t)len, "a pipeline schedule's actions");
    schedule_expand(&pi, stage, acts, len);
    k = 0;
    for (int64_t i = 0; i < len; i++) {
      const PipeAction *x = &acts[i];
      if (x->kind != PA_FWD && x->kind != PA_BWD) continue;
      SimPipeStep st = {stage, x->kind == PA_BWD, x->mb, x->chunk / p};
      if (out && k < cap) out[k] = st;
      k++;
    }
    free(acts);
  }
  arena_free(&a);
  return k;
}

int sim_pipe_in_flight(ScheduleKind kind, int p, int n, int v, int stage) {
  if (!sim_pipe_valid(kind, p, n, v, NULL) || stage < 0 || stage >= p) return -1;
  Arena a;
  arena_init(&a);
  PipeInfo pi;
  int r = schedule_of(&a, kind, p, n, v, &pi) ? schedule_in_flight(&pi, stage) : -1;
  arena_free(&a);
  return r;
}

/* ---- the pipeline on a timeline ---- */

static double call(PipeDurationFn f, void *ctx, const SimPipeStep *a) { return f ? f(ctx, a) : 0; }

bool sim_pipe_build(SimGraph *g, ScheduleKind kind, int p, int n, int v, const int *compute_streams,
                    const int *p2p_streams, PipeDurationFn dur, PipeDurationFn xfer, void *ctx, int *ids) {
  if (!g || !compute_streams || !sim_pipe_valid(kind, p, n, v, NULL)) return false;
  int per = 2 * n * v, pv = p * v;
  size_t slots = (size_t)n * (size_t)pv;
  const char *what = "a pipeline schedule's timeline";
  SimPipeStep *acts = mem_alloc(sizeof *acts * (size_t)per * (size_t)p, what);
  int *fwd = mem_alloc(sizeof *fwd * slots, what), *bwd = mem_alloc(sizeof *bwd * slots, what);
  int *fsend = mem_alloc(sizeof *fsend * slots, what), *bsend = mem_alloc(sizeof *bsend * slots, what);
  for (size_t i = 0; i < slots; i++) fwd[i] = bwd[i] = fsend[i] = bsend[i] = -1;
  sim_graph_reserve(g, sim_task_count(g) + 2 * per * p, 0);
  for (int s = 0; s < p; s++) {
    SimPipeStep *a = acts + (size_t)s * per;
    sim_pipe_actions(kind, p, n, v, s, a, per);
    for (int k = 0; k < per; k++) {
      int j = a[k].chunk * p + s; /* virtual stage */
      size_t slot = (size_t)a[k].microbatch * pv + j;
      const char *name = a[k].backward ? "backward" : "forward";
      int t = sim_task_add(g, compute_streams[s], call(dur, ctx, &a[k]), name, (SrcLoc){0});
      if (ids) ids[(size_t)s * per + k] = t;
      if (a[k].backward) bwd[slot] = t;
      else fwd[slot] = t;
      /* the transfer to the next (forward) or previous (backward) virtual stage */
      int to = a[k].backward ? j - 1 : j + 1;
      if (p2p_streams && p > 1 && to >= 0 && to < pv) {
        int x = sim_task_add(g, p2p_streams[s], call(xfer, ctx, &a[k]),
                             a[k].backward ? "send grad" : "send activation", (SrcLoc){0});
        if (a[k].backward) bsend[slot] = x;
        else fsend[slot] = x;
      }
    }
  }
  for (int m = 0; m < n; m++)
    for (int j = 0; j < pv; j++) {
      size_t slot = (size_t)m * pv + j;
      if (fsend[slot] >= 0) sim_dep_add(g, fwd[slot], fsend[slot], 0);
      if (bsend[slot] >= 0) sim_dep_add(g, bwd[slot], bsend[slot], 0);
      if (j > 0) { /* forward after the previous virtual stage's forward */
        size_t prev = slot - 1;
        if (fsend[prev] >= 0) sim_dep_add(g, fsend[prev], fwd[slot], 0);
        else {
          SimPipeStep from = {(j - 1) % p, false, m, (j - 1) / p};
          sim_dep_add(g, fwd[prev], fwd[slot], p > 1 ? call(xfer, ctx, &from) : 0);
        }
      }
      if (j < pv - 1) { /* backward after the next virtual stage's backward */
        size_t next = slot + 1;
        if (bsend[next] >= 0) sim_dep_add(g, bsend[next], bwd[slot], 0);
        else {
          SimPipeStep from = {(j + 1) % p, true, m, (j + 1) / p};
          sim_dep_add(g, bwd[next], bwd[slot], p > 1 ? call(xfer, ctx, &from) : 0);
        }
      }
      sim_dep_add(g, fwd[slot], bwd[slot], 0);
    }
  free(acts);
  free(fwd);
  free(bwd);
  free(fsend);
  free(bsend);
  return true;
}

typedef struct Uniform {
  double f, b, x;
} Uniform;

static double uniform_dur(void *ctx, const SimPipeStep *a) {
  const Uniform *u = ctx;
  return a->backward ? u->b : u->f;
}

static double uniform_xfer(void *ctx, const SimPipeStep *a) {
  (void)a;
  return ((const Uniform *)ctx)->x;
}

bool sim_pipe_simulate(ScheduleKind kind, int p, int n, int v, double fwd_s, double bwd_s, double p2p_s,
                       PipeResult *out) {
  if (out) memset(out, 0, sizeof *out);
  if (!sim_pipe_valid(kind, p, n, v, NULL)) return false;
  SimGraph *g = sim_graph_new();
  int *cs = mem_alloc(sizeof *cs * (size_t)p, "a pipeline's streams"), *ps = mem_alloc(sizeof *ps * (size_t)p, "a pipeline's streams");
  for (int s = 0; s < p; s++) {
    int d = sim_device_add(g, "stage", 1);
    cs[s] = sim_stream_add(g, d, SIM_STREAM_COMPUTE, NULL);
    ps[s] = sim_stream_add(g, d, SIM_STREAM_P2P, NULL);
  }
  Uniform u = {fwd_s, bwd_s, p2p_s};
  bool ok = sim_pipe_build(g, kind, p, n, v, cs, ps, uniform_dur, uniform_xfer, &u, NULL) && sim_run(g);
  if (ok && out) {
    out->step_s = sim_makespan(g);
    out->ideal_s = (double)n * v * (fwd_s + bwd_s);
    out->bubble_s = out->step_s - out->ideal_s;
    out->bubble_fraction = out->step_s > 0 ? out->bubble_s / out->step_s : 0;
    out->bubble_over_ideal = out->ideal_s > 0 ? out->bubble_s / out->ideal_s : 0;
  }
  free(cs);
  free(ps);
  sim_graph_free(g);
  return ok;
}
