/* schedule.c: each pipeline stage's actions in order (see schedule.h): written in bounded form,
 * then expanded into the full list when it is small enough to keep. */
#include <stdio.h>
#include <string.h>

#include "checked.h"
#include "schedule.h"

typedef VEC(PipeAction) ActVec;

typedef struct Sched {
  Arena *a;
  const PipeInfo *pi;
  ActVec acts;          /* the form, every stage's */
  PipeSpan *spans;      /* [2 stages] */
  int s;                /* the stage whose form is being written */
  int nspan;            /* spans of stage s so far */
} Sched;

static void push(Sched *S, PipeActionKind k, int mb, int chunk, int peer, bool backward) {
  PipeAction x = {.kind = (uint8_t)k, .backward = backward, .mb = mb, .chunk = chunk, .peer = peer};
  VEC_PUSH(S->a, S->acts, x);
}

/* The actions written between span_begin and span_end run `reps` times, each run `stride`
 * microbatches above the one before. */
static int span_begin(const Sched *S) { return S->acts.len; }

static void span_end(Sched *S, int first, int reps, int stride) {
  PipeSpan *sp = &S->spans[2 * S->s + S->nspan++];
  *sp = (PipeSpan){.first = first, .len = S->acts.len - first, .reps = reps, .stride = stride};
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

/* Virtual microbatch k of stage s in the interleaved order: its microbatch and model chunk. Adding
 * p V to k adds p to the microbatch and keeps the chunk: the period of the steady state. */
static void virtual_mb(const PipeInfo *pi, int s, int k, bool bwd, int *mb, int *g) {
  int p = pi->stages, V = pi->chunks;
  int c = (k / p) % V;
  if (bwd) c = V - 1 - c;
  *mb = (k / (p * V)) * p + k % p;
  *g = c * p + s;
}

static void fwd_k(Sched *S, int k) {
  int mb, g;
  virtual_mb(S->pi, S->s, k, false, &mb, &g);
  forward(S, mb, g);
}

static void bwd_k(Sched *S, int k) {
  int mb, g;
  virtual_mb(S->pi, S->s, k, true, &mb, &g);
  backward(S, mb, g);
}

/* Stage S->s's form. The full list (schedule.h's orders) is, for every k in order:
 *   forward alone    fwd_k(k), k < N V
 *   gpipe            every microbatch's forward, then every microbatch's backward
 *   1f1b, interl.    fwd_k(f) for f < warm; then pairs j: fwd_k(warm + j), bwd_k(j) while
 *                    warm + j < N V; then bwd_k(b) for the remaining b < N V
 * and a run of k (or j) that repeats with period u = p V (u = 1 without interleaving: virtual_mb
 * is then the identity) is written once as a span of stride u / V microbatches. */
static void stage_form(Sched *S, bool train) {
  const PipeInfo *pi = S->pi;
  int p = pi->stages, N = pi->microbatches, s = S->s, V = pi->chunks;
  int total = N * V;
  if (train && pi->schedule == SCHED_GPIPE) {
    int x = span_begin(S);
    forward(S, 0, s);
    span_end(S, x, N, 1);
    x = span_begin(S);
    backward(S, 0, s);
    span_end(S, x, N, 1);
    return;
  }
  bool interleaved = pi->schedule == SCHED_INTERLEAVED && V > 1; /* interleaved(1) is 1f1b */
  int u = interleaved || !train ? p * V : 1; /* the period in virtual microbatches */
  if (!train) {
    int reps = total / u, k = 0;
    if (reps >= 2) {
      int x = span_begin(S);
      for (; k < u; k++) fwd_k(S, k);
      span_end(S, x, reps, u / V);
      k = reps * u;
    }
    for (; k < total; k++) fwd_k(S, k);
    return;
  }
  /* Megatron-LM: with as many microbatches as stages, the interleaved schedule runs every forward
   * first (its steady state would have nothing to alternate with) */
  int warm = !interleaved ? p - s - 1 : N == p ? total : (p - s - 1) * 2 + (V - 1) * p;
  if (warm > total) warm = total;
  for (int f = 0; f < warm; f++) fwd_k(S, f);
  int pairs = total - warm, reps = pairs / u, j = 0;
  if (reps >= 2) {
    int x = span_begin(S);
    for (; j < u; j++) fwd_k(S, warm + j), bwd_k(S, j);
    span_end(S, x, reps, u / V);
    j = reps * u;
  }
  for (; j < pairs; j++) fwd_k(S, warm + j), bwd_k(S, j);
  for (int b = pairs; b < total; b++) bwd_k(S, b);
}

/* An upper bound on the form's actions over every stage, before writing it (a form too large to
 * write is an error, not an allocation): per stage at most 2 N V forwards and backwards, and at
 * most the warm-up, two steady units and the drain; each is at most 3 actions. */
static double form_bound(const PipeInfo *pi, bool train) {
  double p = pi->stages, V = pi->chunks, N = pi->microbatches, total = N * V, per;
  bool interleaved = pi->schedule == SCHED_INTERLEAVED && V > 1;
  double unit = interleaved || !train ? p * V : 1;
  if (!train) per = total < 3 * unit ? total : 3 * unit;
  else if (pi->schedule == SCHED_GPIPE) per = 2;
  else {
    double warm = interleaved ? (V + 1) * p : p;
    per = 2 * warm + 4 * unit + 2;
    if (per > 2 * total) per = 2 * total;
  }
  return 3 * p * per;
}

const PipeSpan *schedule_span_at(const PipeInfo *pi, int s, int i) {
  const PipeSpan *sp = &pi->spans[2 * s];
  for (int k = 0; k < 2; k++)
    if (sp[k].len > 0 && sp[k].first == i) return &sp[k];
  return NULL;
}

int64_t schedule_expand(const PipeInfo *pi, int s, PipeAction *out, int64_t cap) {
  int64_t n = 0;
  for (int i = pi->first_form[s]; i < pi->first_form[s + 1];) {
    const PipeSpan *sp = schedule_span_at(pi, s, i);
    if (!sp) {
      if (n < cap) out[n] = pi->form[i];
      n++, i++;
      continue;
    }
    for (int r = 0; r < sp->reps; r++)
      for (int t = 0; t < sp->len; t++, n++)
        if (n < cap) {
          out[n] = pi->form[i + t];
          out[n].mb += r * sp->stride;
        }
    i += sp->len;
  }
  return n;
}

/* Stage s's actions that match (kind < 0: every action), counted without expanding. */
static int64_t stage_count(const PipeInfo *pi, int s, int kind, bool backward) {
  int64_t n = 0;
  for (int i = pi->first_form[s]; i < pi->first_form[s + 1];) {
    const PipeSpan *sp = schedule_span_at(pi, s, i);
    int len = sp ? sp->len : 1, reps = sp ? sp->reps : 1;
    for (int t = i; t < i + len; t++) {
      const PipeAction *x = &pi->form[t];
      if (kind < 0 || (x->kind == kind && (kind < PA_SEND || x->backward == backward))) n = sat_add(n, reps);
    }
    i += len;
  }
  return n;
}

int64_t schedule_count(const PipeInfo *pi, int kind, bool backward) {
  int64_t n = 0;
  for (int s = 0; s < pi->stages; s++) n = sat_add(n, stage_count(pi, s, kind, backward));
  return n;
}

/* The in-flight count goes up by one at each forward and down at each backward. Within a span run
 * r times its value at any action is its value in the first run plus (r - 1) times what one run
 * adds, so the peak is in the first run or the last: the span is walked for its first run, then
 * again from where its last run starts. */
int schedule_in_flight(const PipeInfo *pi, int s) {
  int64_t cur = 0, peak = 0;
  for (int i = pi->first_form[s]; i < pi->first_form[s + 1];) {
    const PipeSpan *sp = schedule_span_at(pi, s, i);
    int len = sp ? sp->len : 1, runs = sp && sp->reps > 1 ? 2 : 1;
    int64_t start = cur;
    for (int run = 0; run < runs; run++) {
      if (run == 1) cur = start + (int64_t)(sp->reps - 1) * (cur - start);
      for (int t = i; t < i + len; t++) {
        cur += pi->form[t].kind == PA_FWD ? 1 : pi->form[t].kind == PA_BWD ? -1 : 0;
        if (cur > peak) peak = cur;
      }
    }
    i += len;
  }
  return peak > INT32_MAX ? INT32_MAX : (int)peak;
}

bool schedule_build(Arena *a, PipeInfo *pi, bool train, const char **why) {
  int p = pi->stages;
  if (pi->schedule == SCHED_INTERLEAVED && pi->chunks > 1 && train && pi->microbatches % p != 0) {
    *why = "the interleaved schedule needs the microbatches to divide by the stages";
    return false;
  }
  double bound = form_bound(pi, train);
  if (bound > (double)SCHEDULE_FORM_MAX) {
    *why = arena_printf(a,
                        "a pipeline of %d stages x %d chunk%s is too large to schedule: its schedule's bounded form "
                        "would hold up to %.3g actions (it grows as stages^2 x chunks), more than the limit of %lld",
                        p, pi->chunks, pi->chunks == 1 ? "" : "s", bound, (long long)SCHEDULE_FORM_MAX);
    return false;
  }
  if ((int64_t)pi->microbatches * pi->chunks > INT32_MAX / 2) {
    *why = arena_printf(a, "%d microbatches x %d chunks is more than the %d microbatch-chunks a schedule may hold",
                        pi->microbatches, pi->chunks, INT32_MAX / 2);
    return false;
  }
  Sched S = {.a = a, .pi = pi, .spans = ARENA_ARRAY(a, PipeSpan, 2 * (int64_t)p + 1)};
  pi->first_form = ARENA_ARRAY(a, int, p + 1);
  for (S.s = 0; S.s < p; S.s++) {
    pi->first_form[S.s] = S.acts.len;
    S.nspan = 0;
    stage_form(&S, train);
  }
  pi->first_form[p] = S.acts.len;
  pi->form = S.acts.data;
  pi->spans = S.spans;
  int64_t total = 0;
  for (int s = 0; s < p; s++) total = sat_add(total, stage_count(pi, s, -1, false));
  pi->nactions = total;
  pi->actions = NULL;
  pi->first_action = NULL;
  if (total <= SCHEDULE_LIST_MAX) {
    pi->actions = ARENA_ARRAY(a, PipeAction, total + 1);
    pi->first_action = ARENA_ARRAY(a, int, p + 1);
    int64_t n = 0;
    for (int s = 0; s < p; s++) {
      pi->first_action[s] = (int)n;
      n += schedule_expand(pi, s, pi->actions + n, total - n);
    }
    pi->first_action[p] = (int)n;
  }
  pi->in_flight_max[0] = schedule_in_flight(pi, 0);
  pi->in_flight_max[1] = schedule_in_flight(pi, p - 1);
  return true;
}

const char *schedule_name(Arena *a, const PipeInfo *pi) {
  if (pi->schedule == SCHED_INTERLEAVED) return arena_printf(a, "interleaved(%d)", pi->chunks);
  return pi->schedule == SCHED_GPIPE ? "gpipe" : "1f1b";
}
