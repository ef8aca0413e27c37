/* test_schedule.c: the pipeline schedules (compiler/shard/schedule.h) in bounded form.
 *
 * schedule_build writes each stage's actions with each steady-state unit once (a PipeSpan: runs,
 * stride); the full list, the in-flight peak and the counts are derived from that form. Here the
 * full lists come from a reference generator written from the schedules' definitions (schedule.h,
 * Narayanan et al. 2021) action by action, with no spans, and for every (schedule, p, N, V) of a
 * grid:
 *   - expanding the form gives the reference list exactly (kind, microbatch, chunk, peer, backward);
 *   - the in-flight peak read off the form equals the peak of a walk over the reference list, and
 *     the closed forms: gpipe N; 1f1b min(p - s, N); interleaved's first stage p V + p - 1 chunks
 *     when N > p (Korthikanti et al. 2022), N V when N = p;
 *   - the counted sends equal N (p V - 1) each way (each microbatch crosses every boundary between
 *     consecutive chunks once forward and, training, once backward), and the forms' size does not
 *     grow with N (the same for N and N + 64 p).
 * Then the limits: the full list is dropped past SCHEDULE_LIST_MAX (the form stays, with the same
 * peak and counts), and a form past SCHEDULE_FORM_MAX is refused with a reason. And memory
 * (analysis/bufplan.c), which walks a span's first and last runs only, against the same walk over
 * every run (bufplan_walk_every_run), on pipelined programs under every schedule: every stage's
 * figures and in-flight count alike. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bufplan.h"
#include "diag.h"
#include "memory.h"
#include "pipeline.h"
#include "schedule.h"
#include "unit_test.h"

#ifndef SHARDC_SOURCE_STDLIB
#define SHARDC_SOURCE_STDLIB "stdlib"
#endif

typedef struct Ref {
  PipeAction *v;
  int n, cap;
} Ref;

static void ref_push(Ref *R, int kind, int mb, int chunk, int peer, bool bwd) {
  if (R->n == R->cap) {
    R->cap = R->cap ? 2 * R->cap : 256;
    R->v = realloc(R->v, sizeof *R->v * (size_t)R->cap);
  }
  R->v[R->n++] = (PipeAction){.kind = (uint8_t)kind, .backward = bwd, .mb = mb, .chunk = chunk, .peer = peer};
}

/* One chunk's forward or backward with its region and transfers (schedule.h's list). */
static void ref_unit(Ref *R, int p, int V, int mb, int g, bool bwd) {
  int last = p * V - 1;
  if (!bwd) {
    if (g == 0) ref_push(R, PA_FIRST, mb, g, -1, false);
    else ref_push(R, PA_RECV, mb, g, (g - 1) % p, false);
    ref_push(R, PA_FWD, mb, g, -1, false);
    if (g < last) ref_push(R, PA_SEND, mb, g + 1, (g + 1) % p, false);
    else ref_push(R, PA_LAST, mb, g, -1, false);
  } else {
    if (g < last) ref_push(R, PA_RECV, mb, g, (g + 1) % p, true);
    ref_push(R, PA_BWD, mb, g, -1, true);
    if (g > 0) ref_push(R, PA_SEND, mb, g - 1, (g - 1) % p, true);
    else ref_push(R, PA_FIRST_BWD, mb, g, -1, true);
  }
}

/* The k-th forward (backward) of stage s: Megatron-LM's get_model_chunk_id and microbatch order. */
static void ref_k(Ref *R, int p, int V, int s, int k, bool bwd) {
  int c = (k / p) % V;
  if (bwd) c = V - 1 - c;
  ref_unit(R, p, V, (k / (p * V)) * p + k % p, c * p + s, bwd);
}

static void ref_stage(Ref *R, int kind, int p, int N, int V, int s, bool train) {
  if (!train) {
    for (int k = 0; k < N * V; k++) ref_k(R, p, V, s, k, false);
    return;
  }
  if (kind == SCHED_GPIPE) {
    for (int m = 0; m < N; m++) ref_unit(R, p, V, m, s, false);
    for (int m = 0; m < N; m++) ref_unit(R, p, V, m, s, true);
    return;
  }
  int total = N * V;
  bool il = kind == SCHED_INTERLEAVED && V > 1;
  int warm = !il ? p - s - 1 : N == p ? total : (p - s - 1) * 2 + (V - 1) * p;
  if (warm > total) warm = total;
  int f = 0, b = 0;
  for (; f < warm; f++) ref_k(R, p, V, s, f, false);
  while (f < total) ref_k(R, p, V, s, f++, false), ref_k(R, p, V, s, b++, true);
  while (b < total) ref_k(R, p, V, s, b++, true);
}

static int walk_in_flight(const PipeAction *v, int n) {
  int cur = 0, peak = 0;
  for (int i = 0; i < n; i++) {
    cur += v[i].kind == PA_FWD ? 1 : v[i].kind == PA_BWD ? -1 : 0;
    if (cur > peak) peak = cur;
  }
  return peak;
}

static bool same(const PipeAction *a, const PipeAction *b) {
  return a->kind == b->kind && a->backward == b->backward && a->mb == b->mb && a->chunk == b->chunk &&
         a->peer == b->peer;
}

static bool build(Arena *a, PipeInfo *pi, int kind, int p, int N, int V, bool train, const char **why) {
  memset(pi, 0, sizeof *pi);
  pi->stages = p, pi->microbatches = N, pi->chunks = V, pi->schedule = kind;
  return schedule_build(a, pi, train, why);
}

static const char *const names[] = {"gpipe", "1f1b", "interleaved"};

/* One shape: the form expands to the reference, and what is read off it. */
static void check_shape(int kind, int p, int N, int V, bool train, int *checked) {
  Arena a;
  arena_init(&a);
  PipeInfo pi;
  const char *why = NULL;
  if (!build(&a, &pi, kind, p, N, V, train, &why)) {
    ut_fail("%s p=%d N=%d V=%d: refused: %s", names[kind], p, N, V, why ? why : "?");
    arena_free(&a);
    return;
  }
  int64_t total = 0;
  for (int s = 0; s < p && ut_ok(); s++) {
    Ref R = {0};
    ref_stage(&R, kind, p, N, V, s, train);
    PipeAction *got = malloc(sizeof *got * (size_t)(R.n + 1));
    int64_t n = schedule_expand(&pi, s, got, R.n);
    UT_CHECK(n == R.n, "%s p=%d N=%d V=%d stage %d: %lld actions expanded, the reference has %d", names[kind], p, N,
             V, s, (long long)n, R.n);
    for (int i = 0; i < R.n && i < n && ut_ok(); i++)
      UT_CHECK(same(&got[i], &R.v[i]), "%s p=%d N=%d V=%d stage %d: action %d is kind %d mb %d chunk %d, want kind %d mb %d chunk %d",
               names[kind], p, N, V, s, i, got[i].kind, got[i].mb, got[i].chunk, R.v[i].kind, R.v[i].mb, R.v[i].chunk);
    /* the full list, where kept, is the same */
    if (schedule_listed(&pi)) {
      int len = pi.first_action[s + 1] - pi.first_action[s];
      UT_CHECK(len == R.n, "%s p=%d N=%d V=%d stage %d: listed %d actions, want %d", names[kind], p, N, V, s, len, R.n);
      for (int i = 0; i < R.n && i < len && ut_ok(); i++)
        UT_CHECK(same(&pi.actions[pi.first_action[s] + i], &R.v[i]), "%s p=%d N=%d V=%d stage %d: listed action %d differs",
                 names[kind], p, N, V, s, i);
    }
    int want = walk_in_flight(R.v, R.n);
    UT_CHECK(schedule_in_flight(&pi, s) == want, "%s p=%d N=%d V=%d stage %d: in flight %d, the walk %d", names[kind], p,
             N, V, s, schedule_in_flight(&pi, s), want);
    /* the closed forms of the peak */
    if (train) {
      int cf = -1;
      if (kind == SCHED_GPIPE) cf = N;
      else if (kind == SCHED_1F1B || V == 1) cf = p - s < N ? p - s : N;
      else if (s == 0) cf = N == p ? N * V : p * V + p - 1;
      if (cf >= 0)
        UT_CHECK(want == cf, "%s p=%d N=%d V=%d stage %d: the walk's peak %d, the closed form %d", names[kind], p, N, V,
                 s, want, cf);
    }
    total += R.n;
    free(got);
    free(R.v);
  }
  if (ut_ok())
    UT_CHECK(pi.nactions == total, "%s p=%d N=%d V=%d: nactions %lld, want %lld", names[kind], p, N, V,
           (long long)pi.nactions, (long long)total);
  int64_t crossings = (int64_t)N * (p * V - 1);
  UT_CHECK(schedule_count(&pi, PA_SEND, false) == crossings && schedule_count(&pi, PA_RECV, false) == crossings,
           "%s p=%d N=%d V=%d: %lld activation sends, want N (p V - 1) = %lld", names[kind], p, N, V,
           (long long)schedule_count(&pi, PA_SEND, false), (long long)crossings);
  UT_CHECK(schedule_count(&pi, PA_SEND, true) == (train ? crossings : 0), "%s p=%d N=%d V=%d: %lld gradient sends",
           names[kind], p, N, V, (long long)schedule_count(&pi, PA_SEND, true));
  UT_CHECK(schedule_count(&pi, PA_FWD, false) == (int64_t)N * p * V, "%s p=%d N=%d V=%d: forwards %lld", names[kind], p,
           N, V, (long long)schedule_count(&pi, PA_FWD, false));
  /* the form's size does not grow with N */
  if (N >= 4 * p) {
    Arena b;
    arena_init(&b);
    PipeInfo big;
    if (build(&b, &big, kind, p, N + 64 * p, V, train, &why))
      UT_CHECK(big.first_form[p] == pi.first_form[p], "%s p=%d N=%d V=%d: the form has %d actions, %d for N + 64 p",
               names[kind], p, N, V, pi.first_form[p], big.first_form[p]);
    arena_free(&b);
  }
  (*checked)++;
  arena_free(&a);
}

static void test_forms(void) {
  ut_begin(NULL);
  int checked = 0;
  for (int kind = SCHED_GPIPE; kind <= SCHED_INTERLEAVED; kind++)
    for (int p = 1; p <= 7; p++)
      for (int V = 1; V <= (kind == SCHED_INTERLEAVED ? 4 : 1); V++)
        for (int N = 1; N <= 40; N++) {
          if (kind == SCHED_INTERLEAVED && V > 1 && N % p) continue;
          check_shape(kind, p, N, V, true, &checked);
        }
  for (int p = 1; p <= 5; p++)
    for (int N = 1; N <= 12; N++) check_shape(SCHED_GPIPE, p, N, 1, false, &checked);
  char name[96];
  snprintf(name, sizeof name, "schedule.forms (%d shapes: expanded = reference, in flight, counts)", checked);
  ut_end_as(name);
}

/* Past SCHEDULE_LIST_MAX: no full list, the same figures from the form; a form past
 * SCHEDULE_FORM_MAX: refused. */
static void test_limits(void) {
  ut_begin("schedule.limits");
  Arena a;
  arena_init(&a);
  PipeInfo pi;
  const char *why = NULL;
  /* 1f1b, p = 14, N = 1048576: 14 N (6 actions per microbatch on a middle stage) > 2^20 */
  ut_true("1f1b N = 2^20 builds", build(&a, &pi, SCHED_1F1B, 14, 1 << 20, 1, true, &why));
  ut_true("not listed", !schedule_listed(&pi));
  UT_CHECK(pi.nactions > SCHEDULE_LIST_MAX, "nactions %lld", (long long)pi.nactions);
  UT_CHECK(pi.first_form[14] < 1000, "the form holds %d actions", pi.first_form[14]);
  UT_CHECK(pi.in_flight_max[0] == 14 && pi.in_flight_max[1] == 1, "in flight %d, %d", pi.in_flight_max[0],
           pi.in_flight_max[1]);
  UT_CHECK(schedule_count(&pi, PA_SEND, false) == (int64_t)13 << 20, "sends %lld",
           (long long)schedule_count(&pi, PA_SEND, false));
  /* gpipe with 2^20 microbatches: in flight N on every stage */
  ut_true("gpipe N = 2^20 builds", build(&a, &pi, SCHED_GPIPE, 4, 1 << 20, 1, true, &why));
  UT_CHECK(pi.in_flight_max[0] == 1 << 20 && pi.in_flight_max[1] == 1 << 20, "gpipe in flight %d", pi.in_flight_max[0]);
  /* interleaved(4) on 8 stages, N = 8 * 2^16: first stage p V + p - 1 = 39 */
  ut_true("interleaved N = 2^19 builds", build(&a, &pi, SCHED_INTERLEAVED, 8, 8 << 16, 4, true, &why));
  UT_CHECK(pi.in_flight_max[0] == 39, "interleaved in flight %d", pi.in_flight_max[0]);
  /* 4096 stages of 1f1b: a form of about 3 p^2 = 5e7 actions */
  why = NULL;
  ut_true("4096 stages refused", !build(&a, &pi, SCHED_1F1B, 4096, 8192, 1, true, &why));
  UT_CHECK(why && strstr(why, "too large to schedule"), "why: %s", why ? why : "(none)");
  why = NULL;
  ut_true("N x V past 2^30 refused", !build(&a, &pi, SCHED_INTERLEAVED, 2, 1 << 29, 8, true, &why) && why);
  arena_free(&a);
  ut_end();
}

/* A stack of MLP blocks between two projections, pipelined over `stages`, with n microbatches. */
static bool memory_of(int stages, int n, const char *sched, int layers, bool every_run, MemoryReport *r, Arena *a) {
  char src[2048];
  snprintf(src, sizeof src,
           "import \"targets\"\n"
           "mesh pod = tpu_v5e[data: 2, stage: %d, model: 2]\n"
           "dim batch = %d, embed = 256, e2 = embed, hidden = 1024, layers = %d\n"
           "layout pp {\n  batch: data\n  layers: stage\n  hidden: model\n}\n"
           "model blk {\n  param w1: bf16[embed, hidden]\n  param w2: bf16[hidden, embed]\n"
           "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] { return x + gelu(x @ w1) @ w2 }\n}\n"
           "model net {\n  param inp: bf16[embed, e2]\n  param blocks: blk[layers]\n"
           "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] {\n"
           "    x = (x @ inp)[e2 -> embed]\n    for b in blocks { x = b.forward(x) }\n    return x\n  }\n}\n"
           "train net.forward {\n  loss = mse\n  optimizer = adam\n  microbatches = %d\n  schedule = %s\n}\n",
           stages, 2 * n, layers, n, sched);
  const char *path = "test_schedule.shard";
  FILE *f = fopen(path, "w");
  if (!f) return false;
  fputs(src, f);
  fclose(f);
  diag_reset();
  char *diags = NULL;
  size_t nd = 0;
  FILE *df = open_memstream(&diags, &nd);
  diag_configure(df, DIAG_MACHINE, false);
  bool ok = false;
  ParsedProgram *pp = parse_program(a, path, SHARDC_SOURCE_STDLIB);
  if (pp && diag_error_count() == 0) {
    SemaOptions so = {0};
    CheckedProgram cp;
    if (check_program(a, pp, &so, &cp) == EXIT_OK && cp.ir && pipeline_run(cp.ir, cp.prog)) {
      bufplan_walk_every_run = every_run;
      memory_estimate(cp.prog, cp.ir, r);
      bufplan_walk_every_run = false;
      ok = cp.ir->pipeline != NULL;
    }
  }
  fclose(df);
  if (!ok) ut_fail("%s p=%d N=%d: did not compile to a pipeline: %s", sched, stages, n, diags ? diags : "");
  free(diags);
  remove(path);
  return ok;
}

static void test_memory(void) {
  ut_begin(NULL);
  static const char *const scheds[] = {"gpipe", "1f1b", "interleaved(2)"};
  int cases = 0;
  for (int si = 0; si < 3; si++)
    for (int p = 2; p <= 4; p++)
      for (int n = p; n <= 6 * p && ut_ok(); n += si == 2 ? p : 3) {
        Arena a, b;
        arena_init(&a), arena_init(&b);
        MemoryReport x, y;
        int layers = 2 * p * (si == 2 ? 2 : 1);
        if (memory_of(p, n, scheds[si], layers, false, &x, &a) && memory_of(p, n, scheds[si], layers, true, &y, &b)) {
          UT_CHECK(x.total == y.total && x.nstages == y.nstages, "%s p=%d N=%d: total %lld, every run %lld", scheds[si], p,
                   n, (long long)x.total, (long long)y.total);
          for (int s = 0; s < x.nstages && s < y.nstages; s++) {
            const MemStage *u = &x.stages[s], *v = &y.stages[s];
            UT_CHECK(u->total == v->total && u->activations == v->activations && u->temporaries == v->temporaries &&
                         u->in_flight == v->in_flight,
                     "%s p=%d N=%d stage %d: total %lld act %lld temp %lld in flight %d; every run %lld %lld %lld %d",
                     scheds[si], p, n, s, (long long)u->total, (long long)u->activations, (long long)u->temporaries,
                     u->in_flight, (long long)v->total, (long long)v->activations, (long long)v->temporaries,
                     v->in_flight);
          }
        }
        arena_free(&a), arena_free(&b);
        source_free_all();
        intern_reset();
        cases++;
      }
  char name[128];
  snprintf(name, sizeof name, "schedule.memory (%d programs: first and last runs = every run)", cases);
  ut_end_as(name);
}

int main(void) {
  test_forms();
  test_limits();
  test_memory();
  return ut_summary();
}
