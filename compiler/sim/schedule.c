/* schedule.c: pipeline schedules (schedule.h): action orders, microbatches in flight, and their
 * simulation on the timeline engine.
 *
 * In: (schedule, p stages, N microbatches, V chunks). Out: per stage, its forwards and backwards
 * in execution order; the timeline of a whole pipeline built from them. The orders are those of
 * GPipe, of PipeDream-flush as Megatron-LM runs it (1F1B), and of Megatron-LM's interleaved
 * schedule (Narayanan et al. 2021), written from the rules in schedule.h. */
#include <stdlib.h>
#include <string.h>

#include "schedule.h"

static const char *const pipe_names[] = {
#define X(e, s) [e] = s,
  PIPE_SCHEDULES(X)
#undef X
};

const char *sim_pipe_name(PipeSchedule k) {
  if ((int)k < 0 || k >= PIPE__COUNT) return "?";
  return pipe_names[k];
}

bool sim_pipe_from_name(const char *s, PipeSchedule *out) {
  if (!s) return false;
  for (int k = 0; k < PIPE__COUNT; k++)
    if (strcmp(s, pipe_names[k]) == 0) {
      if (out) *out = (PipeSchedule)k;
      return true;
    }
  return false;
}

/* Limits that keep 2 N V and N p V in int. */
enum { PIPE_MAX = 1 << 20 };

bool sim_pipe_valid(PipeSchedule kind, int p, int n, int v, const char **why) {
  const char *w = NULL;
  if ((int)kind < 0 || kind >= PIPE__COUNT) w = "unknown schedule";
  else if (p < 1 || n < 1 || v < 1) w = "stages, microbatches and chunks must be at least 1";
  else if (p > PIPE_MAX || n > PIPE_MAX || v > PIPE_MAX || (double)n * p * v > (double)(1 << 28))
    w = "schedule too large";
  else if (kind != PIPE_INTERLEAVED && v != 1) w = "gpipe and 1f1b have one chunk per stage";
  else if (kind == PIPE_INTERLEAVED && v > 1 && n % p != 0)
    w = "the interleaved schedule needs the microbatches to be a multiple of the stages";
  if (why) *why = w;
  return w == NULL;
}

/* The k-th forward (or backward) of an interleaved stage: chunk and microbatch. */
static void interleaved_at(int p, int v, int k, bool backward, int *chunk, int *mb) {
  int in_group = k % (p * v);
  int c = in_group / p;
  *chunk = backward ? v - 1 - c : c;
  *mb = (k / (p * v)) * p + k % p;
}

int sim_pipe_actions(PipeSchedule kind, int p, int n, int v, int stage, PipeAction *out, int cap) {
  if (!sim_pipe_valid(kind, p, n, v, NULL) || stage < 0 || stage >= p) return -1;
  if (kind == PIPE_INTERLEAVED && v == 1) kind = PIPE_1F1B;
  int total = n * v, k = 0, nf = 0, nb = 0;
#define EMIT(bw)                                                                      \
  do {                                                                                \
    PipeAction a = {stage, (bw), 0, 0};                                               \
    if (kind == PIPE_INTERLEAVED) interleaved_at(p, v, (bw) ? nb : nf, (bw), &a.chunk, &a.microbatch); \
    else a.microbatch = (bw) ? nb : nf;                                               \
    if ((bw)) nb++;                                                                   \
    else nf++;                                                                        \
    if (out && k < cap) out[k] = a;                                                   \
    k++;                                                                              \
  } while (0)
  if (kind == PIPE_GPIPE) {
    for (int i = 0; i < n; i++) EMIT(false);
    for (int i = 0; i < n; i++) EMIT(true);
    return k;
  }
  int warmup;
  if (kind == PIPE_1F1B) warmup = p - stage - 1;
  else warmup = n == p ? total : (p - stage - 1) * 2 + (v - 1) * p;
  if (warmup > total) warmup = total;
  for (int i = 0; i < warmup; i++) EMIT(false);
  for (int i = 0; i < total - warmup; i++) {
    EMIT(false);
    EMIT(true);
  }
  for (int i = 0; i < warmup; i++) EMIT(true);
#undef EMIT
  return k;
}

int sim_pipe_in_flight(PipeSchedule kind, int p, int n, int v, int stage) {
  int total = sim_pipe_actions(kind, p, n, v, stage, NULL, 0);
  if (total < 0) return -1;
  PipeAction *a = malloc(sizeof *a * (size_t)total);
  if (!a) abort();
  sim_pipe_actions(kind, p, n, v, stage, a, total);
  int cur = 0, peak = 0;
  for (int i = 0; i < total; i++) {
    cur += a[i].backward ? -1 : 1;
    if (cur > peak) peak = cur;
  }
  free(a);
  return peak;
}

/* ---- the pipeline on a timeline ---- */

static double call(PipeDurationFn f, void *ctx, const PipeAction *a) { return f ? f(ctx, a) : 0; }

bool sim_pipe_build(SimGraph *g, PipeSchedule kind, int p, int n, int v, const int *compute_streams,
                    const int *p2p_streams, PipeDurationFn dur, PipeDurationFn xfer, void *ctx, int *ids) {
  if (!g || !compute_streams || !sim_pipe_valid(kind, p, n, v, NULL)) return false;
  int per = 2 * n * v, pv = p * v;
  size_t slots = (size_t)n * (size_t)pv;
  PipeAction *acts = malloc(sizeof *acts * (size_t)per * (size_t)p);
  int *fwd = malloc(sizeof *fwd * slots), *bwd = malloc(sizeof *bwd * slots);
  int *fsend = malloc(sizeof *fsend * slots), *bsend = malloc(sizeof *bsend * slots);
  if (!acts || !fwd || !bwd || !fsend || !bsend) abort();
  for (size_t i = 0; i < slots; i++) fwd[i] = bwd[i] = fsend[i] = bsend[i] = -1;
  sim_graph_reserve(g, sim_task_count(g) + 2 * per * p, 0);
  for (int s = 0; s < p; s++) {
    PipeAction *a = acts + (size_t)s * per;
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
          PipeAction from = {(j - 1) % p, false, m, (j - 1) / p};
          sim_dep_add(g, fwd[prev], fwd[slot], p > 1 ? call(xfer, ctx, &from) : 0);
        }
      }
      if (j < pv - 1) { /* backward after the next virtual stage's backward */
        size_t next = slot + 1;
        if (bsend[next] >= 0) sim_dep_add(g, bsend[next], bwd[slot], 0);
        else {
          PipeAction from = {(j + 1) % p, true, m, (j + 1) / p};
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

static double uniform_dur(void *ctx, const PipeAction *a) {
  const Uniform *u = ctx;
  return a->backward ? u->b : u->f;
}

static double uniform_xfer(void *ctx, const PipeAction *a) {
  (void)a;
  return ((const Uniform *)ctx)->x;
}

bool sim_pipe_simulate(PipeSchedule kind, int p, int n, int v, double fwd_s, double bwd_s, double p2p_s,
                       PipeResult *out) {
  if (out) memset(out, 0, sizeof *out);
  if (!sim_pipe_valid(kind, p, n, v, NULL)) return false;
  SimGraph *g = sim_graph_new();
  int *cs = malloc(sizeof *cs * (size_t)p), *ps = malloc(sizeof *ps * (size_t)p);
  if (!cs || !ps) abort();
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
