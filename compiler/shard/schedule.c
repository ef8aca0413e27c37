/* schedule.c: each pipeline stage's actions in order (see schedule.h). */
#include <string.h>

#include "schedule.h"

typedef VEC(PipeAction) ActVec;

typedef struct Sched {
  Arena *a;
  const PipeInfo *pi;
  ActVec acts;
  int s;                /* the stage whose list is being built */
} Sched;

static void push(Sched *S, PipeActionKind k, int mb, int chunk, int peer, bool backward) {
  PipeAction x = {.kind = (uint8_t)k, .backward = backward, .mb = mb, .chunk = chunk, .peer = peer};
  VEC_PUSH(S->a, S->acts, x);
}

/* The forward of the model's chunk g of microbatch mb, with what surrounds it on its stage. */
static void forward(Sched *S, int mb, int g) {
  int p = S->pi->stages, last = p * S->pi->chunks - 1;
  if (g == 0) push(S, PA_FIRST, mb, g, -1, false);
  else push(S, PA_RECV, mb, g, (g - 1) % p, false);
  push(S, PA_FWD, mb, g, -1, false);
  if (g < last) push(S, PA_SEND, mb, g + 1, (g + 1) % p, false);
  else push(S, PA_LAST, mb, g, -1, false);
}

/* The backward of chunk g: its gradient arrives from chunk g + 1 (the last chunk's from PA_LAST on
 * the same stage) and leaves for chunk g - 1. */
static void backward(Sched *S, int mb, int g) {
  int p = S->pi->stages, last = p * S->pi->chunks - 1;
  if (g < last) push(S, PA_RECV, mb, g, (g + 1) % p, true);
  push(S, PA_BWD, mb, g, -1, true);
  if (g > 0) push(S, PA_SEND, mb, g - 1, (g - 1) % p, true);
  else push(S, PA_FIRST_BWD, mb, g, -1, true);
}

/* Virtual microbatch k of stage s in the interleaved order: its microbatch and model chunk. */
static void virtual_mb(const PipeInfo *pi, int s, int k, bool bwd, int *mb, int *g) {
  int p = pi->stages, V = pi->chunks;
  int c = (k / p) % V;
  if (bwd) c = V - 1 - c;
  *mb = (k / (p * V)) * p + k % p;
  *g = c * p + s;
}

static void stage_list(Sched *S, bool train) {
  const PipeInfo *pi = S->pi;
  int p = pi->stages, N = pi->microbatches, s = S->s, V = pi->chunks;
  if (!train) {
    for (int k = 0; k < N * V; k++) {
      int mb, g;
      virtual_mb(pi, s, k, false, &mb, &g);
      forward(S, mb, g);
    }
    return;
  }
  if (pi->schedule == SCHED_GPIPE) {
    for (int mb = 0; mb < N; mb++) forward(S, mb, s);
    for (int mb = 0; mb < N; mb++) backward(S, mb, s);
    return;
  }
  int total = N * V;
  bool interleaved = pi->schedule == SCHED_INTERLEAVED && V > 1; /* interleaved(1) is 1f1b */
  /* Megatron-LM: with as many microbatches as stages, the interleaved schedule runs every forward
   * first (its steady state would have nothing to alternate with) */
  int warm = !interleaved ? p - s - 1 : N == p ? total : (p - s - 1) * 2 + (V - 1) * p;
  if (warm > total) warm = total;
  int f = 0, b = 0;
  for (; f < warm; f++) {
    int mb, g;
    virtual_mb(pi, s, f, false, &mb, &g);
    forward(S, mb, g);
  }
  while (f < total) {
    int mb, g;
    virtual_mb(pi, s, f++, false, &mb, &g);
    forward(S, mb, g);
    virtual_mb(pi, s, b++, true, &mb, &g);
    backward(S, mb, g);
  }
  while (b < total) {
    int mb, g;
    virtual_mb(pi, s, b++, true, &mb, &g);
    backward(S, mb, g);
  }
}

int schedule_in_flight(const PipeInfo *pi, int s) {
  int cur = 0, peak = 0;
  for (int i = pi->first_action[s]; i < pi->first_action[s + 1]; i++) {
    const PipeAction *x = &pi->actions[i];
    if (x->kind == PA_FWD) cur++;
    if (x->kind == PA_BWD) cur--;
    if (cur > peak) peak = cur;
  }
  return peak;
}

bool schedule_build(Arena *a, PipeInfo *pi, bool train, const char **why) {
  int p = pi->stages;
  if (pi->schedule == SCHED_INTERLEAVED && pi->chunks > 1 && train && pi->microbatches % p != 0) {
    *why = "the interleaved schedule needs the microbatches to divide by the stages";
    return false;
  }
  Sched S = {.a = a, .pi = pi};
  pi->first_action = ARENA_ARRAY(a, int, p + 1);
  for (S.s = 0; S.s < p; S.s++) {
    pi->first_action[S.s] = S.acts.len;
    stage_list(&S, train);
  }
  pi->first_action[p] = S.acts.len;
  pi->actions = S.acts.data;
  pi->in_flight_max[0] = schedule_in_flight(pi, 0);
  pi->in_flight_max[1] = schedule_in_flight(pi, p - 1);
  return true;
}

const char *schedule_name(Arena *a, const PipeInfo *pi) {
  if (pi->schedule == SCHED_INTERLEAVED) return arena_printf(a, "interleaved(%d)", pi->chunks);
  return pi->schedule == SCHED_GPIPE ? "gpipe" : "1f1b";
}
