/* test_sim_steady.c: `shardc sim` from a steady state equals `shardc sim` in full (compiler/sim/
 * simulate.c, "Steady states").
 *
 * The simulator extrapolates what repeats, once it has checked that the timeline repeats exactly
 * (steady_period): a 1f1b or interleaved pipeline of N microbatches from two simulations of fewer,
 * and a loop past the task budget as a block from two runs of some of its iterations. Here each
 * is set against the simulation of everything (SimOptions.full), on the same module:
 *   - pipelines: gpipe, 1f1b, interleaved(2) and interleaved(3) on 2, 3 and 4 stages, with and
 *     without data and tensor parallelism around them, compute-bound and transfer-bound, at
 *     numbers of microbatches where the steady state is used (every one, but gpipe's, whose stages
 *     drift apart and which is always simulated whole): the step, every stage's compute,
 *     communication, exposed communication, bubble and idle time, and every item (runs, time,
 *     exposed time, FLOPs) agree to 1e-9 of the step;
 *   - loops: an FSDP stack (weight gathers prefetched a layer ahead) and a trained MLP stack with
 *     tensor and data parallelism, as blocks from their steady state and as blocks simulated whole;
 *   - at sizes no full simulation reaches: FSDP, communication-bound, at 10^12 layers takes L g + c
 *     (test_sim_program.c derives it for L = 4; here embed 512), with L gathers; a 1f1b pipeline of
 *     2^20 microbatches lies on the line through two pipelines simulated in full (300 and 400
 *     microbatches), and its first stage's fill is Narayanan et al.'s (p - 1)(t_f + t_b) plus its
 *     sends, within the 1.5% test_sim_program.c allows at N = 8. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "pipeline.h"
#include "sim.h"
#include "unit_test.h"

#ifndef SHARDC_SOURCE_STDLIB
#define SHARDC_SOURCE_STDLIB "stdlib"
#endif

static const double V5E_FLOPS = 1.97e14, V5E_HBM = 8.1e11, V5E_ICI = 4.5e10, HOP = 1e-6;

static double roofline(double flops, double bytes) {
  double c = flops / V5E_FLOPS, m = bytes / V5E_HBM;
  return c > m ? c : m;
}

static double mm(double m, double k, double n) { return roofline(2 * m * k * n, 2 * (m * k + k * n + m * n)); }

typedef struct Prog {
  Arena arena;
  Program *p;
  IrModule *m;
  char *diags;
  size_t ndiags;
  FILE *df;
} Prog;

/* Checks src and runs the pass pipeline; false (the case fails) if it does not compile. */
static bool compile(Prog *P, const char *src) {
  memset(P, 0, sizeof *P);
  diag_reset();
  P->df = open_memstream(&P->diags, &P->ndiags);
  diag_configure(P->df, DIAG_MACHINE, false);
  arena_init(&P->arena);
  const char *path = "test_sim_steady.shard";
  FILE *f = fopen(path, "w");
  if (!f) return false;
  fputs(src, f);
  fclose(f);
  ParsedProgram *pp = parse_program(&P->arena, path, SHARDC_SOURCE_STDLIB);
  if (pp && diag_error_count() == 0) {
    SemaOptions so = {0};
    CheckedProgram cp;
    if (check_program(&P->arena, pp, &so, &cp) == EXIT_OK && cp.ir && pipeline_run(cp.ir, cp.prog))
      P->p = cp.prog, P->m = cp.ir;
  }
  remove(path);
  fflush(P->df);
  if (!P->m) ut_fail("the program did not compile: %s\n%s", P->diags ? P->diags : "", src);
  return P->m != NULL;
}

static void prog_free(Prog *P) {
  if (P->df) fclose(P->df);
  free(P->diags);
  arena_free(&P->arena);
  source_free_all();
  intern_reset();
}

static bool simulate(Prog *P, SimOptions o, SimReport *r) {
  o.ideal = true;
  bool ok = sim_program(P->p, P->m, &o, r);
  fflush(P->df);
  if (!ok) ut_fail("the program did not simulate: %s", P->diags ? P->diags : "");
  return ok;
}

/* |got - want| within 1e-9 of the step */
static bool close_to(double got, double want, double step) { return fabs(got - want) <= 1e-9 * fmax(step, fabs(want)); }

static const SimItem *find_item(const SimReport *r, const SimItem *x) {
  for (int i = 0; i < r->nitems; i++)
    if (r->items[i].op == x->op && r->items[i].kind == x->kind && strcmp(r->items[i].what, x->what) == 0)
      return &r->items[i];
  return NULL;
}

/* Every figure of the steady-state report against the full one. */
static void same_figures(const char *what, const SimReport *full, const SimReport *st) {
  double T = full->step_s;
  UT_CHECK(close_to(st->step_s, T, T), "%s: step %.12g, in full %.12g", what, st->step_s, T);
  UT_CHECK(close_to(st->compute_s, full->compute_s, T) && close_to(st->comm_s, full->comm_s, T) &&
               close_to(st->exposed_comm_s, full->exposed_comm_s, T) && close_to(st->bubble_s, full->bubble_s, T) &&
               close_to(st->idle_s, full->idle_s, T),
           "%s: compute %.12g comm %.12g exposed %.12g bubble %.12g idle %.12g; in full %.12g %.12g %.12g %.12g %.12g",
           what, st->compute_s, st->comm_s, st->exposed_comm_s, st->bubble_s, st->idle_s, full->compute_s, full->comm_s,
           full->exposed_comm_s, full->bubble_s, full->idle_s);
  UT_CHECK(st->nstages == full->nstages, "%s: %d simulated devices, in full %d", what, st->nstages, full->nstages);
  for (int s = 0; s < st->nstages && s < full->nstages && ut_ok(); s++) {
    const SimStageStats *a = &st->stages[s], *b = &full->stages[s];
    UT_CHECK(close_to(a->compute_s, b->compute_s, T) && close_to(a->comm_s, b->comm_s, T) &&
                 close_to(a->exposed_comm_s, b->exposed_comm_s, T) && close_to(a->bubble_s, b->bubble_s, T) &&
                 close_to(a->idle_s, b->idle_s, T) && close_to(a->end_s, b->end_s, T),
             "%s: stage %d: compute %.12g comm %.12g exposed %.12g bubble %.12g idle %.12g end %.12g; in full %.12g "
             "%.12g %.12g %.12g %.12g %.12g",
             what, s, a->compute_s, a->comm_s, a->exposed_comm_s, a->bubble_s, a->idle_s, a->end_s, b->compute_s,
             b->comm_s, b->exposed_comm_s, b->bubble_s, b->idle_s, b->end_s);
  }
  UT_CHECK(st->nitems == full->nitems, "%s: %d items, in full %d", what, st->nitems, full->nitems);
  for (int i = 0; i < full->nitems && ut_ok(); i++) {
    const SimItem *b = &full->items[i], *a = find_item(st, b);
    UT_CHECK(a, "%s: item '%s' missing", what, b->what);
    if (!a) break;
    UT_CHECK(fabs(a->runs - b->runs) <= 1e-9 * b->runs && close_to(a->time_s, b->time_s, T) &&
                 close_to(a->exposed_s, b->exposed_s, T) && fabs(a->flops - b->flops) <= 1e-9 * b->flops,
             "%s: item '%s': runs %.12g time %.12g exposed %.12g flops %.12g; in full %.12g %.12g %.12g %.12g", what,
             b->what, a->runs, a->time_s, a->exposed_s, a->flops, b->runs, b->time_s, b->exposed_s, b->flops);
  }
}

/* ---- pipelines ---- */

/* A stack of MLP blocks between an input and an output projection (the first and the last stage
 * run more than the others), trained with mse; data and model set the parallelism around the
 * pipeline, embed and hidden whether compute or transfers dominate. */
static void pipe_source(char *buf, size_t n, int data, int p, int model, int mbs, const char *sched, int layers,
                        int embed, int hidden) {
  snprintf(buf, n,
           "import \"targets\"\n"
           "mesh pod = tpu_v5e[data: %d, stage: %d, model: %d]\n"
           "dim batch = %d, embed = %d, e2 = embed, hidden = %d, layers = %d\n"
           "layout pp {\n  batch: data\n  layers: stage\n  hidden: model\n}\n"
           "model blk {\n"
           "  param w1: bf16[embed, hidden]\n  param w2: bf16[hidden, embed]\n"
           "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] { return x + gelu(x @ w1) @ w2 }\n"
           "}\n"
           "model net {\n"
           "  param inp: bf16[embed, e2]\n  param outp: bf16[embed, e2]\n  param blocks: blk[layers]\n"
           "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] {\n"
           "    x = (x @ inp)[e2 -> embed]\n"
           "    for b in blocks { x = b.forward(x) }\n"
           "    return (x @ outp)[e2 -> embed]\n"
           "  }\n"
           "}\n"
           "train net.forward {\n  loss = mse\n  optimizer = adam\n  microbatches = %d\n  schedule = %s\n}\n",
           data, p, model, 4 * data * mbs, embed, hidden, layers, mbs, sched);
}

static void test_pipelines(void) {
  ut_begin(NULL);
  static const struct {
    const char *sched;
    int v;
  } scheds[] = {{"gpipe", 1}, {"1f1b", 1}, {"interleaved(2)", 2}, {"interleaved(3)", 3}};
  static const struct {
    int data, model, embed, hidden;
  } kinds[] = {{1, 1, 1024, 4096}, {2, 2, 1024, 4096}, {1, 2, 8192, 256}};
  int cases = 0, steady = 0;
  char src[4096], what[160];
  for (int si = 0; si < 4; si++)
    for (int p = 2; p <= 4; p++)
      for (int ki = 0; ki < 3; ki++) {
        int v = scheds[si].v, P = v > 1 ? p : 1;
        /* numbers of microbatches where the steady state costs less than the whole (simulate.c: a
         * probe of 24 units, then k and k + cP, c up to 8): 1f1b from about 100, interleaved from
         * about 100 p */
        int ns[3] = {P == 1 ? 130 : 110 * p, P == 1 ? 157 : 131 * p, P == 1 ? 211 : 160 * p};
        for (int ni = 0; ni < 3 && ut_ok(); ni++) {
          int N = ns[ni];
          pipe_source(src, sizeof src, kinds[ki].data, p, kinds[ki].model, N, scheds[si].sched, 2 * p * v, kinds[ki].embed,
                      kinds[ki].hidden);
          snprintf(what, sizeof what, "%s p=%d N=%d (data %d, model %d, embed %d, hidden %d)", scheds[si].sched, p, N,
                   kinds[ki].data, kinds[ki].model, kinds[ki].embed, kinds[ki].hidden);
          Prog P0;
          if (compile(&P0, src)) {
            SimReport full, st;
            if (simulate(&P0, (SimOptions){.full = true}, &full) && simulate(&P0, (SimOptions){0}, &st)) {
              UT_CHECK(full.microbatches_simulated == 0, "%s: the full simulation extrapolated", what);
              if (st.microbatches_simulated > 0) steady++;
              /* gpipe's forwards and backwards are two runs whose stages drift apart: always whole */
              if (si == 0) UT_CHECK(st.microbatches_simulated == 0, "%s: gpipe from a steady state", what);
              same_figures(what, &full, &st);
            }
            sim_report_free(&full);
            sim_report_free(&st);
          }
          prog_free(&P0);
          cases++;
        }
      }
  /* the steady state must be what is tested: every case but gpipe's */
  UT_CHECK(steady == cases * 3 / 4, "%d of %d cases used the steady state, want every one but gpipe's (%d)", steady,
           cases, cases * 3 / 4);
  char name[160];
  snprintf(name, sizeof name, "pipelines from the steady state = in full (%d cases, %d from the steady state)", cases,
           steady);
  ut_end_as(name);
}

/* ---- loops ---- */

static const char *FSDP_FMT =
    "import \"targets\"\n"
    "mesh pod = tpu_v5e[data: 2]\n"
    "dim batch = 64, embed = %d, e2 = embed, layers = %lld\n"
    "layout fsdp {\n  batch: data\n  embed: data\n}\n"
    "model lin {\n  param w: bf16[embed, e2]\n"
    "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] { return (x @ w)[e2 -> embed] }\n}\n"
    "model net {\n  param blocks: lin[layers]\n"
    "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] {\n"
    "    for b in blocks { x = b.forward(x) }\n    return x\n  }\n}\n";

static const char *MLP_FMT =
    "import \"targets\"\n"
    "mesh pod = tpu_v5e[data: 4, model: 2]\n"
    "dim batch = 32, seq = 512, embed = 1024, hidden = 4096, layers = %lld\n"
    "layout tp {\n  batch: data\n  embed: data\n  hidden: model\n}\n"
    "model block {\n  param w_in: bf16[embed, hidden]\n  param w_out: bf16[hidden, embed]\n"
    "  fn forward(x: bf16[batch, seq, embed]) -> bf16[batch, seq, embed] { return x + gelu(x @ w_in) @ w_out }\n}\n"
    "model stack {\n  param blocks: block[layers]\n"
    "  fn forward(x: bf16[batch, seq, embed]) -> bf16[batch, seq, embed] {\n"
    "    for b in blocks { x = b.forward(x) }\n    return x\n  }\n}\n"
    "train stack.forward {\n  loss = mse\n  optimizer = adam\n  remat = %s\n}\n";

static void test_loops(void) {
  ut_begin(NULL);
  char src[4096], what[128];
  int cases = 0;
  /* past the iterations a block's steady state takes (simulate.c: 3 (24 + 8) periods) */
  static const long long layers[] = {150, 233, 400, 1001};
  for (int prog = 0; prog < 4; prog++)
    for (int li = 0; li < 4 && ut_ok(); li++) {
      if (prog < 2) snprintf(src, sizeof src, FSDP_FMT, prog == 0 ? 4096 : 512, layers[li]);
      else snprintf(src, sizeof src, MLP_FMT, layers[li], prog == 2 ? "none" : "full");
      snprintf(what, sizeof what, "%s, %lld layers", prog < 2 ? (prog == 0 ? "FSDP comm-bound" : "FSDP compute-bound")
                                                              : (prog == 2 ? "MLP train" : "MLP train, remat full"),
               layers[li]);
      Prog P0;
      if (compile(&P0, src)) {
        /* a budget of 50 tasks makes every loop a block */
        SimReport full, st;
        if (simulate(&P0, (SimOptions){.max_tasks = 50, .full = true}, &full) &&
            simulate(&P0, (SimOptions){.max_tasks = 50}, &st)) {
          UT_CHECK(st.steady_loops > 0 && full.steady_loops == st.steady_loops, "%s: %d and %d loops as blocks", what,
                   full.steady_loops, st.steady_loops);
          same_figures(what, &full, &st);
        }
        sim_report_free(&full);
        sim_report_free(&st);
      }
      prog_free(&P0);
      cases++;
    }
  char name[128];
  snprintf(name, sizeof name, "loops as blocks from the steady state = whole (%d cases)", cases);
  ut_end_as(name);
}

/* ---- at sizes nothing else reaches ---- */

/* FSDP, communication-bound (test_sim_program.c): each layer's gather g = E^2 2 B / ICI / 2 (half
 * the weight arrives over one link), its matmul c; the gathers run back to back, the last matmul
 * after the last gather: step L g + c, comm L g. L = 10^12, E = 512 (g = 5.8 us > c = 0.71 us, and
 * the stacked weights, 2^62 bytes at most, hold 10^12 layers). */
static void test_fsdp_huge(void) {
  ut_begin("FSDP of 10^12 layers: step = L g + c, comm = L g, L gathers");
  double E = 512, L = 1e12, g = E * E * 2 / V5E_ICI / 2, c = mm(32, E, E);
  char src[4096];
  snprintf(src, sizeof src, FSDP_FMT, (int)E, (long long)L);
  Prog P0;
  if (compile(&P0, src)) {
    SimReport r;
    if (simulate(&P0, (SimOptions){0}, &r)) {
      ut_near("step", r.step_s, L * g + c, 1e-9);
      ut_near("comm", r.comm_s, L * g, 1e-9);
      UT_CHECK(r.tasks < 1000, "%lld tasks", (long long)r.tasks);
      const SimItem *ag = NULL;
      for (int i = 0; i < r.nitems; i++)
        if (r.items[i].kind == SIMK_COLLECTIVE) ag = &r.items[i];
      UT_CHECK(ag && fabs(ag->runs - L) <= 1e-9 * L, "the gather runs %.6g times, want %.6g", ag ? ag->runs : 0, L);
    }
    sim_report_free(&r);
  }
  prog_free(&P0);
  ut_end();
}

/* test_sim_program.c's pipeline (4 stages of 2 layers, embed 4096, 8 rows per microbatch), 1f1b,
 * at N microbatches. */
static void lin_pipe(char *src, size_t n, int N) {
  snprintf(src, n,
           "import \"targets\"\n"
           "mesh pod = tpu_v5e[stage: 4]\n"
           "dim batch = %d, embed = 4096, e2 = embed, layers = 8\n"
           "layout pp {\n  layers: stage\n}\n"
           "model lin {\n  param w: bf16[embed, e2]\n"
           "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] { return (x @ w)[e2 -> embed] }\n}\n"
           "model net {\n  param blocks: lin[layers]\n"
           "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] {\n"
           "    for b in blocks { x = b.forward(x) }\n    return x\n  }\n}\n"
           "train net.forward {\n  loss = mse\n  optimizer = sgd\n  microbatches = %d\n  schedule = 1f1b\n}\n",
           8 * N, N);
}

/* At 2^20 microbatches, from the steady state, against the line through two simulations in full
 * (N = 300 and 400, each past its warm-up, 100 a multiple of any cycle up to 4): every figure
 * F(2^20) = F(300) + (2^20 - 300) / 100 (F(400) - F(300)). And the first stage's fill, the part
 * of its idle time that does not grow with N, is Narayanan et al.'s (p - 1)(t_f + t_b) with t_f =
 * 2 mm(8, E, E) per stage, t_b = 2 (mm(8, E, E) + mm(E, 8, E)) + the gradient's accumulation a,
 * plus its sends' 2 (p - 1) x (x = 8 E 2 / ICI + hop), within the 1.5% test_sim_program.c allows. */
static void test_pipeline_huge(void) {
  ut_begin("1f1b of 2^20 microbatches = the line through 300 and 400 simulated in full; its fill");
  int N = 1 << 20, n1 = 300, n2 = 400;
  char src[4096];
  SimReport r[3];
  memset(r, 0, sizeof r);
  int ns[3] = {n1, n2, N};
  bool ok = true;
  for (int i = 0; i < 3 && ok; i++) {
    lin_pipe(src, sizeof src, ns[i]);
    Prog P0;
    ok = compile(&P0, src) && simulate(&P0, (SimOptions){.full = i < 2}, &r[i]);
    prog_free(&P0);
  }
  if (ok) {
    const SimReport *a = &r[0], *b = &r[1], *x = &r[2];
    double m = (double)(N - n1) / (n2 - n1);
    UT_CHECK(x->microbatches_simulated > 0 && x->microbatches_simulated < 100, "simulated from %d microbatches",
             x->microbatches_simulated);
    ut_near("step", x->step_s, a->step_s + m * (b->step_s - a->step_s), 1e-9);
    for (int s = 0; s < 4 && s < x->nstages; s++) {
      const SimStageStats *p = &a->stages[s], *q = &b->stages[s], *z = &x->stages[s];
      ut_near("compute", z->compute_s, p->compute_s + m * (q->compute_s - p->compute_s), 1e-9);
      ut_near("exposed", z->exposed_comm_s, p->exposed_comm_s + m * (q->exposed_comm_s - p->exposed_comm_s), 1e-9);
      ut_near("bubble", z->bubble_s, p->bubble_s + m * (q->bubble_s - p->bubble_s), 1e-9);
    }
    double E = 4096, tf = 2 * mm(8, E, E), aa = 10 * 2 * E * E / V5E_HBM, tb = 2 * (mm(8, E, E) + mm(E, 8, E)) + aa;
    double xx = 8 * E * 2 / V5E_ICI + HOP;
    /* the fill: the first stage's bubble and exposed sends less what grows with N */
    double g0 = a->stages[0].bubble_s + a->stages[0].exposed_comm_s, g1 = b->stages[0].bubble_s + b->stages[0].exposed_comm_s;
    double fill = g0 - n1 * (g1 - g0) / (n2 - n1);
    ut_near("the first stage's fill", fill, 3 * (tf + tb) + 2 * 3 * xx, 0.015);
    UT_CHECK(x->tasks < 10000, "%lld tasks", (long long)x->tasks);
  }
  for (int i = 0; i < 3; i++) sim_report_free(&r[i]);
  ut_end();
}

int main(void) {
  test_pipelines();
  test_loops();
  test_fsdp_huge();
  test_pipeline_huge();
  return ut_summary();
}
