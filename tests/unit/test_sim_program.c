/* test_sim_program.c: `shardc sim`'s translation of programs to the timeline (compiler/sim/sim.h:
 * kernels.c, simulate.c), on small programs whose timelines are derived by hand.
 *
 * Every expected time is a formula in the test over the stdlib's target figures (tpu_v5e: 1.97e14
 * bf16 FLOP/s, 8.1e11 B/s of HBM, 4.5e10 B/s per ICI link one way, 1 us per hop; h100: NVLink
 * 4.5e11), derived in the comment above it, never copied from shardc's output. Ideal mode
 * (--ideal) throughout, where every op costs its roofline max(FLOPs / peak, bytes / HBM) and a
 * collective the book's formula, so that the arithmetic can be done by hand. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devprog.h"
#include "diag.h"
#include "dpwin.h"
#include "pipesim.h"
#include "pipeline.h"
#include "sim.h"
#include "step.h"
#include "unit_test.h"

#ifndef SHARDC_SOURCE_STDLIB
#define SHARDC_SOURCE_STDLIB "stdlib"
#endif

/* v5e and H100 figures (stdlib/targets.shard; hardware-and-costs.md) */
static const double V5E_FLOPS = 1.97e14, V5E_HBM = 8.1e11, V5E_ICI = 4.5e10, HOP = 1e-6;
static const double H100_NVLINK = 4.5e11;

static double roofline(double flops, double bytes) {
  double c = flops / V5E_FLOPS, m = bytes / V5E_HBM;
  return c > m ? c : m;
}

/* A [m, k] x [k, n] bf16 contraction on a v5e at peak: reads both operands and writes the result. */
static double mm(double m, double k, double n) { return roofline(2 * m * k * n, 2 * (m * k + k * n + m * n)); }

typedef struct Run {
  Arena arena;
  Program *p;
  IrModule *m;
  SimReport r;
  bool ok;
  char *diags;
  size_t ndiags;
  FILE *df;
} Run;

/* Writes `src` to a file, checks it (with -D name=value overrides, "name=value;...", and
 * "mesh=NAME" for --mesh), runs the pass pipeline and the simulation. */
static bool run(Run *R, const char *src, const char *defs, bool ideal) {
  memset(R, 0, sizeof *R);
  diag_reset();
  R->df = open_memstream(&R->diags, &R->ndiags);
  diag_configure(R->df, DIAG_MACHINE, false);
  arena_init(&R->arena);
  const char *path = "test_sim_program.shard";
  FILE *f = fopen(path, "w");
  if (!f) return false;
  fputs(src, f);
  fclose(f);
  ParsedProgram *pp = parse_program(&R->arena, path, SHARDC_SOURCE_STDLIB);
  if (pp && diag_error_count() == 0) {
    SemaOptions so = {0};
    DimOverride ov[4];
    char buf[128];
    snprintf(buf, sizeof buf, "%s", defs ? defs : "");
    for (char *tok = strtok(buf, ";"); tok && so.noverrides < 4; tok = strtok(NULL, ";")) {
      char *eq = strchr(tok, '=');
      if (!eq) continue;
      *eq = 0;
      if (strcmp(tok, "mesh") == 0) so.mesh = eq + 1; /* "mesh=NAME": --mesh NAME */
      else ov[so.noverrides++] = (DimOverride){intern_cstr(tok), atoll(eq + 1)};
    }
    so.overrides = ov;
    CheckedProgram cp;
    if (check_program(&R->arena, pp, &so, &cp) == EXIT_OK && cp.ir && pipeline_run(cp.ir, cp.prog)) {
      R->p = cp.prog, R->m = cp.ir;
      SimOptions o = {.ideal = ideal};
      R->ok = sim_program(R->p, R->m, &o, &R->r);
    }
  }
  remove(path);
  fflush(R->df);
  if (!R->ok) ut_fail("the program did not simulate: %s", R->diags ? R->diags : "");
  return R->ok;
}

static void run_free(Run *R) {
  sim_report_free(&R->r);
  if (R->df) fclose(R->df);
  free(R->diags);
  arena_free(&R->arena);
  source_free_all();
  intern_reset();
}

static void near(const char *what, double got, double want) { ut_near(what, got, want, 1e-9); }

/* ---- a chain ----
 * On one device, x[b, d] @ w1[d, f], gelu, @ w2[f, d]: three kernels, each waiting for the one
 * before, on the compute stream. b = 1024, d = 2048, f = 8192:
 *   mm1 = max(2 b d f / C, 2 (b d + d f + b f) / H)   (2 b d f = 3.44e10 FLOPs: 174 us; 58.7 MB: 72 us)
 *   gelu = 2 x 2 b f / H                               (reads and writes [b, f] bf16: 41 us)
 *   mm2 = the same as mm1 with d and f exchanged
 * step = mm1 + gelu + mm2, all compute, nothing exposed, nothing idle. */
static const char *CHAIN =
    "import \"targets\"\n"
    "mesh one = tpu_v5e[x: 1]\n"
    "dim b = 1024, d = 2048, f = 8192\n"
    "model m {\n"
    "  param w1: bf16[d, f]\n"
    "  param w2: bf16[f, d]\n"
    "  fn forward(x: bf16[b, d]) -> bf16[b, d] {\n"
    "    return gelu(x @ w1) @ w2\n"
    "  }\n"
    "}\n";

static void test_chain(void) {
  ut_begin("a chain: matmul, gelu, matmul back to back at their rooflines");
  Run R;
  if (run(&R, CHAIN, NULL, true)) {
    double b = 1024, d = 2048, f = 8192;
    double want = mm(b, d, f) + 2 * 2 * b * f / V5E_HBM + mm(b, f, d);
    near("step", R.r.step_s, want);
    near("compute", R.r.compute_s, want);
    near("no communication", R.r.comm_s + 1, 1);
    near("no idle", R.r.idle_s + 1, 1);
    /* MFU: the two contractions' 2 x 2 b d f FLOPs over step x 1 device x peak */
    near("mfu", R.r.mfu, 4 * b * d * f / (want * V5E_FLOPS));
  }
  run_free(&R);
  ut_end();
}

/* ---- fusion ----
 * gelu(x * 2 + 1) on [b, f] bf16: three elementwise ops that a compiler fuses into one kernel,
 * which reads x once and writes the result once: 2 x 2 b f bytes, not 3 x that. */
static const char *FUSED =
    "import \"targets\"\n"
    "mesh one = tpu_v5e[x: 1]\n"
    "dim b = 1024, f = 8192\n"
    "model m {\n"
    "  fn forward(x: bf16[b, f]) -> bf16[b, f] {\n"
    "    return gelu(x * 2 + 1)\n"
    "  }\n"
    "}\n";

static void test_fusion(void) {
  ut_begin("an elementwise chain is one kernel moving its external bytes");
  Run R;
  if (run(&R, FUSED, NULL, true)) {
    double b = 1024, f = 8192;
    near("step", R.r.step_s, 2 * 2 * b * f / V5E_HBM);
    int fused = 0, ops = 0;
    for (int i = 0; i < R.r.nitems; i++)
      if (R.r.items[i].kind == SIMK_FUSED) fused++, ops += R.r.items[i].runs > 0;
    UT_CHECK(fused == 1, "one fused kernel, got %d", fused);
    SimCosts c;
    sim_costs_build(&R.arena, R.m, R.p->mesh, true, &c);
    int nk = 0;
    for (int i = 0; i < c.nkernels; i++) nk += c.kernels[i].kind == SIMK_FUSED;
    UT_CHECK(nk == 1, "the costs hold one fused kernel, got %d", nk);
    for (int i = 0; i < c.nkernels; i++)
      if (c.kernels[i].kind == SIMK_FUSED) UT_CHECK(c.kernels[i].nops == 3, "3 ops in it, got %d", c.kernels[i].nops);
  }
  run_free(&R);
  ut_end();
}

/* ---- FSDP: weight gathers overlap the layers ----
 * Four layers x @ w with w[embed@data, e2] gathered over data (2 devices, an open ring of 2 on a
 * v5e): g = V / W x (X - 1) / X = (E E 2) / W / 2 per layer. Layer i's gather needs nothing the
 * loop computes, so it may start once layer i - 1 has started (one layer ahead):
 *   gathers 0 and 1 are ready at 0 (nothing runs before the loop), gather i >= 2 when layer i - 2
 *   ends; each layer's matmul (time c) waits for its gather.
 * Communication-bound (g > c): gather i runs [i g, (i + 1) g], layer i [(i + 1) g, (i + 1) g + c]:
 *   step = L g + c, exposed = step - L c.
 * Compute-bound (c > g): gather 0 [0, g], layer i [g + i c, g + (i + 1) c]; gather i + 1 is done
 *   before layer i ends: step = g + L c, exposed = g. */
static const char *FSDP =
    "import \"targets\"\n"
    "mesh pod = tpu_v5e[data: 2]\n"
    "dim batch = 64, embed = 4096, e2 = embed, layers = 4\n"
    "layout fsdp {\n"
    "  batch: data\n"
    "  embed: data\n"
    "}\n"
    "model lin {\n"
    "  param w: bf16[embed, e2]\n"
    "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] {\n"
    "    return (x @ w)[e2 -> embed]\n"
    "  }\n"
    "}\n"
    "model net {\n"
    "  param blocks: lin[layers]\n"
    "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] {\n"
    "    for b in blocks { x = b.forward(x) }\n"
    "    return x\n"
    "  }\n"
    "}\n";

static void test_fsdp_overlap(void) {
  double E = 4096, L = 4, g = E * E * 2 / V5E_ICI / 2;
  ut_begin("FSDP, communication-bound: gathers back to back, each layer after its gather");
  Run R;
  if (run(&R, FSDP, NULL, true)) {
    double c = mm(32, E, E); /* 64 rows over 2 devices */
    UT_CHECK(g > c, "the case is communication-bound (g %.3g, c %.3g)", g, c);
    near("step = L g + c", R.r.step_s, L * g + c);
    near("comm = L g", R.r.comm_s, L * g);
    near("exposed = step - L c", R.r.exposed_comm_s, L * g + c - L * c);
  }
  run_free(&R);
  ut_end();
  ut_begin("FSDP, compute-bound: only the first gather is exposed (prefetch one layer ahead)");
  if (run(&R, FSDP, "batch=16384", true)) {
    double c = mm(8192, E, E);
    UT_CHECK(c > g, "the case is compute-bound (g %.3g, c %.3g)", g, c);
    near("step = g + L c", R.r.step_s, g + L * c);
    near("exposed = g", R.r.exposed_comm_s, g);
    near("compute = L c", R.r.compute_s, L * c);
  }
  run_free(&R);
  ut_end();
}

/* ---- data parallelism: gradient reductions overlap the backward ----
 * The same four layers, data parallel over 2 devices, trained (mse, sgd). The backward loop
 * all-reduces each layer's weight gradient (2 V / W x (X - 1) / X on the open ring of 2, V = E E
 * 2) as soon as it is made, while the next layer's backward runs: only the last layer's
 * reduction (and the update waiting for it) is exposed. Compute-bound: 2 matmuls of 8192 x 4096
 * x 4096 per layer backward (1.4 ms each) against a 746 us reduction. */
static const char *DP =
    "import \"targets\"\n"
    "mesh pod = tpu_v5e[data: 2]\n"
    "dim batch = 16384, embed = 4096, e2 = embed, layers = 4\n"
    "layout dp {\n"
    "  batch: data\n"
    "}\n"
    "model lin {\n"
    "  param w: bf16[embed, e2]\n"
    "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] {\n"
    "    return (x @ w)[e2 -> embed]\n"
    "  }\n"
    "}\n"
    "model net {\n"
    "  param blocks: lin[layers]\n"
    "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] {\n"
    "    for b in blocks { x = b.forward(x) }\n"
    "    return x\n"
    "  }\n"
    "}\n"
    "train net.forward {\n"
    "  loss = mse\n"
    "  optimizer = sgd\n"
    "}\n";

static void test_dp_overlap(void) {
  ut_begin("data parallel: each layer's gradient all-reduce hides behind the next layer's backward");
  Run R;
  if (run(&R, DP, NULL, true)) {
    double E = 4096, ar = 2 * E * E * 2 / V5E_ICI / 2;
    near("exposed = the last layer's all-reduce", R.r.exposed_comm_s, ar);
    /* the loss's all-reduce of one f32 runs beside the backward: latency-bound, 2 x 1 hop */
    near("comm = 4 reductions + the loss's", R.r.comm_s, 4 * ar + 2 * HOP);
    near("step = compute + exposed", R.r.step_s, R.r.compute_s + ar);
  }
  run_free(&R);
  ut_end();
}

/* ---- the overlap keys (overlap.c) ----
 * dp_overlap = off: the same DP program, its gradient all-reduces blocking: each waits for the
 *   layer's backward before it and the next layer's backward waits for it, so all four are exposed
 *   (4 ar), and the loss's all-reduce of one f32 too (2 hops): exposed = 4 ar + 2 hops.
 * grad_reduce = f32: the bf16 gradients reduced as f32, twice the bytes: ar' = 2 ar; with
 *   dp_overlap on only the last layer's is exposed: 2 ar; comm = 4 x 2 ar + the loss's 2 hops. */
static void with_keys(char *out, size_t n, const char *src, const char *keys) {
  const char *at = strstr(src, "  optimizer = sgd\n");
  if (!at) {
    snprintf(out, n, "%s", src);
    return;
  }
  snprintf(out, n, "%.*s  optimizer = sgd\n%s%s", (int)(at - src), src, keys, at + strlen("  optimizer = sgd\n"));
}

static void test_dp_keys(void) {
  double E = 4096, ar = 2 * E * E * 2 / V5E_ICI / 2;
  char src[4096];
  Run R;
  ut_begin("dp_overlap = off: every gradient all-reduce exposed (blocking)");
  with_keys(src, sizeof src, DP, "  dp_overlap = off\n");
  if (run(&R, src, NULL, true)) {
    near("exposed = 4 ar + the loss's 2 hops", R.r.exposed_comm_s, 4 * ar + 2 * HOP);
    near("step = compute + exposed", R.r.step_s, R.r.compute_s + 4 * ar + 2 * HOP);
  }
  run_free(&R);
  ut_end();
  ut_begin("grad_reduce = f32: bf16 gradients reduced in f32 bytes (twice the time)");
  with_keys(src, sizeof src, DP, "  grad_reduce = f32\n");
  if (run(&R, src, NULL, true)) {
    near("exposed = the last layer's all-reduce, 2 ar", R.r.exposed_comm_s, 2 * ar);
    near("comm = 4 x 2 ar + the loss's", R.r.comm_s, 8 * ar + 2 * HOP);
  }
  run_free(&R);
  ut_end();
}

/* ---- overlap windows (shard/dpwin.h): the gradient reduced during the last microbatch ----
 * The DP program with microbatches = 2: each device runs 16384 / 2 / 2 = 4096 rows per microbatch.
 * The microbatch loop sums each microbatch's [layers, embed, e2] gradient unreduced into an f32
 * accumulator, and the step reduces it once after the loop (one AllReduce of L E E bf16). Its
 * window: issued in L pieces, piece i (E E 2 bytes: p = E E 2 / W on the open ring of 2) when
 * iteration i of the LAST microbatch's backward layer loop has made that layer's gradient; done
 * before the update. Each backward iteration (two 4096 x E x E contractions, c_b = 2 mm) is longer
 * than a piece, so pieces 1 .. L-1 hide behind the next iteration. The last piece is issued when the
 * backward loop ends; what the program still computes before the update reads the reduction:
 *   R = the loss's accumulation (f32 scalars: 12 B) + the gradients' accumulation (a fused cast and
 *       add over L E E elements: reads bf16 and f32, writes f32, 10 B each) + the cast of the sum to
 *       bf16 before the reduction (6 B each), all at HBM speed,
 * so it hides min(p, R): exposed = max(0, p - R). The loss's AllReduce (one f32, 2 hops) runs beside
 * the compute after the pieces. dp_overlap = off: the whole reduction (L p) and the loss's (2 hops)
 * are exposed, so step(off) - step(on) = L p + 2 hops - max(0, p - R).
 *   layers = 4: R = 4 E E 16 / H + 12 / H = 1.33 ms > p = 746 us: nothing exposed.
 *   layers = 2: R = 663 us < p: 82.9 us exposed. */
static void test_dp_windows(void) {
  double E = 4096, p = E * E * 2 / V5E_ICI, cb = 2 * mm(4096, E, E);
  char src[4096];
  with_keys(src, sizeof src, DP, "  microbatches = 2\n");
  char off[4096];
  with_keys(off, sizeof off, DP, "  microbatches = 2\n  dp_overlap = off\n");
  for (int L = 4; L >= 2; L -= 2) {
    double R = (L * E * E * 16 + 12) / V5E_HBM, exposed = p > R ? p - R : 0;
    char defs[32];
    snprintf(defs, sizeof defs, "layers=%d", L);
    ut_begin(L == 4 ? "microbatches = 2, 4 layers: the last microbatch's per-layer pieces hide the reduction"
                    : "microbatches = 2, 2 layers: the last piece exposed by p - R");
    UT_CHECK(cb > p, "each backward iteration (%.3g) is longer than a piece (%.3g)", cb, p);
    UT_CHECK(L == 4 ? R > p : R < p, "the case (R %.3g, p %.3g)", R, p);
    Run R1, R2;
    double on_step = 0;
    if (run(&R1, src, defs, true)) {
      on_step = R1.r.step_s;
      near("exposed = max(0, p - R)", R1.r.exposed_comm_s + 1, exposed + 1);
      near("comm = L p + the loss's 2 hops", R1.r.comm_s, L * p + 2 * HOP);
      near("step = compute + exposed", R1.r.step_s, R1.r.compute_s + exposed);
      /* the window as the device program states it */
      const DevWindow *w = NULL;
      for (const Op *op = R1.m->main->first; op && !w; op = op->next)
        if (op->kind == OP_ALL_REDUCE && op->dev && op->dev->win && op->role == ROLE_GRADIENT) w = op->dev->win;
      UT_CHECK(w && w->kind == DPW_GRADIENT, "the gradient's window");
      if (w) {
        UT_CHECK(w->pieces == L, "%d pieces, got %lld", L, (long long)w->pieces);
        UT_CHECK(w->via == R1.m->step->micro_loop, "issued in the microbatch loop's last run");
        UT_CHECK(w->before && w->before->kind == OP_SGD_UPDATE, "done before the update");
      }
    }
    run_free(&R1);
    if (run(&R2, off, defs, true)) {
      near("off: exposed = L p + 2 hops", R2.r.exposed_comm_s, L * p + 2 * HOP);
      near("step(off) - step(on) = L p + 2 hops - max(0, p - R)", R2.r.step_s - on_step, L * p + 2 * HOP - exposed);
    }
    run_free(&R2);
    ut_end();
  }
}

/* tp_overlap: an MLP tensor-parallel over model = 4 (hidden@model), trained. The second matmul
 * leaves a partial sum: an AllReduce (A) of what that matmul (C) makes. The backward has none (dh =
 * dy w2^T and both weight gradients are local; x is an input, whose gradient is not made). The
 * device program runs it as a collective matmul (shard/cmm.c: the reduce-scatter ring at the matmul,
 * then an AllGather of the blocks), so its ReduceScatter half (A/2) runs in n = 4 chunks beside the
 * matmul's: C/n + (n-1) max(C/n, (A/2)/(n-1)); what exceeds C is exposed, the AllGather half
 * (A/2) stays. Compute-bound (hidden = 32768: C/n > (A/2)/(n-1)): the kernel keeps exactly A/2.
 * Communication-bound (hidden = 256): it keeps A/2 + (C/n + A/2 - C) = A - C (n-1)/n. A and C are
 * read from the kernels priced without the key (sim_costs_build), the formula is the test's. */
static const char *TP =
    "import \"targets\"\n"
    "mesh pod = tpu_v5e[model: 4]\n"
    "dim batch = 4096, embed = 4096, hidden = 32768\n"
    "layout tp {\n"
    "  hidden: model\n"
    "}\n"
    "model mlp {\n"
    "  param w1: bf16[embed, hidden]\n"
    "  param w2: bf16[hidden, embed]\n"
    "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] {\n"
    "    return gelu(x @ w1) @ w2\n"
    "  }\n"
    "}\n"
    "train mlp.forward {\n"
    "  loss = mse\n"
    "  optimizer = sgd\n"
    "}\n";

static void check_tp(const char *defs, bool compute_bound) {
  Run R;
  if (!run(&R, TP, defs, true)) {
    run_free(&R);
    return;
  }
  double step_on = R.r.step_s;
  SimCosts c0, c1;
  sim_costs_build(&R.arena, R.m, R.p->mesh, true, &c0);
  sim_costs_build(&R.arena, R.m, R.p->mesh, true, &c1);
  SimOverlap on = {true, true, DT_NONE}, off = {false, true, DT_NONE};
  sim_costs_overlap(&c1, R.m, &on);
  int checked = 0;
  for (int i = 0; i < c0.nkernels; i++) {
    const SimKernel *k0 = &c0.kernels[i], *k1 = &c1.kernels[i];
    if (k0->kind != SIMK_COLLECTIVE || k0->coll_kind != COLL_ALL_REDUCE || k0->nins < 1) continue;
    const Value *v = k0->ins[0];
    int pi = v && v->id < c0.nvalues ? c0.kernel_of[v->id] : -1;
    if (pi < 0 || c0.kernels[pi].kind != SIMK_MATMUL) continue;
    /* the device program runs it as the reduce-scatter ring (shard/cmm.c chose it: it pays) */
    const DevCmm *dcm = k0->anchor && k0->anchor->dev ? k0->anchor->dev->cmm : NULL;
    UT_CHECK(dcm && dcm->scatter && dcm->coll == k0->anchor && dcm->contract == c0.kernels[pi].anchor,
             "the all-reduce is the device program's reduce-scatter ring at its matmul");
    double A = k0->time_s, C = c0.kernels[pi].time_s, n = 4, h = A / 2;
    double chunk = C / n, step = h / (n - 1), pair = chunk + (n - 1) * (chunk > step ? chunk : step);
    double want = h + (pair - C > 0 ? pair - C : 0);
    if (compute_bound) ut_true("compute-bound as the comment derives: C/n > (A/2)/(n-1)", chunk > step);
    else ut_true("communication-bound as the comment derives", chunk < step);
    near(compute_bound ? "keeps A/2" : "keeps A - C (n-1)/n", k1->time_s, compute_bound ? A / 2 : A - C * (n - 1) / n);
    near("the formula", k1->time_s, want);
    near("hidden = A - kept", k1->hidden_s, A - k1->time_s);
    ut_true("marked overlapped", k1->overlapped);
    checked++;
  }
  UT_CHECK(checked == 1, "one all-reduce after a matmul (the forward's), got %d", checked);
  /* off: nothing changes */
  SimCosts c2;
  sim_costs_build(&R.arena, R.m, R.p->mesh, true, &c2);
  sim_costs_overlap(&c2, R.m, &off);
  for (int i = 0; i < c2.nkernels; i++) {
    UT_CHECK(!c2.kernels[i].overlapped, "tp_overlap = off overlaps nothing (kernel %d)", i);
    near("tp_overlap = off: the kernel's own time", c2.kernels[i].time_s, c0.kernels[i].time_s);
  }
  run_free(&R);
  /* and the whole step: on (the default) is faster than off */
  char src[4096];
  with_keys(src, sizeof src, TP, "  tp_overlap = off\n");
  if (run(&R, src, defs, true)) ut_true("step with tp_overlap on < off", step_on < R.r.step_s);
  run_free(&R);
}

static void test_tp_overlap(void) {
  ut_begin("tp_overlap: a compute-bound all-reduce after a matmul keeps only its AllGather half");
  check_tp(NULL, true);
  ut_end();
  ut_begin("tp_overlap: a communication-bound one keeps A - C (n-1)/n");
  check_tp("hidden=256", false);
  ut_end();
}

/* remat = selective: what remat = none keeps but the attention core, recomputed in the backward:
 * the attention's two contractions run once more per layer, 2 x 2 B S S H D FLOPs (q k over head,
 * p v over kseq), so flops_per_step rises by L x 4 B S^2 H D over remat = none, and the model FLOPs
 * (MFU's) do not change. GPT of stdlib/models/gpt.shard, B 4, S 64, H 2, D 64, L 2: 16,777,216. */
static const char *GPT =
    "import \"targets\"\n"
    "import \"models/gpt\"\n"
    "mesh m = tpu_v5e[model: 2]\n"
    "dim batch = 4, seq = 64, kseq = seq\n"
    "dim embed = 128, hidden = 512\n"
    "dim heads = 2, head = 64\n"
    "dim vocab = 256, layers = 2\n"
    "layout tp {\n  heads: model\n  hidden: model\n  vocab: model\n}\n"
    "train gpt.forward {\n"
    "  loss = cross_entropy\n"
    "  optimizer = sgd\n"
    "REMAT"
    "}\n";

static void test_remat_selective(void) {
  ut_begin("remat = selective: + L x 4 B S^2 H D recomputed FLOPs over remat = none, same model FLOPs");
  char src[2048];
  const char *at = strstr(GPT, "REMAT");
  double f[2] = {0}, mf[2] = {0};
  const char *keys[2] = {"  remat = none\n", "  remat = selective\n"};
  for (int i = 0; i < 2; i++) {
    snprintf(src, sizeof src, "%.*s%s%s", (int)(at - GPT), GPT, keys[i], at + 5);
    Run R;
    if (run(&R, src, NULL, true)) f[i] = R.r.flops_per_step, mf[i] = R.r.model_flops_per_step;
    run_free(&R);
  }
  double L = 2, B = 4, S = 64, H = 2, D = 64;
  near("recomputed attention", f[1] - f[0], L * 4 * B * S * S * H * D);
  near("model FLOPs unchanged", mf[1], mf[0]);
  ut_end();
}

/* ---- FSDP training: the prefetch goes one layer ahead, no further ----
 * The same four layers under FSDP (w[embed@data, e2]), trained. Forward: layer i's gather (g)
 * overlaps layer i - 1; backward (reverse): the loop re-gathers each w (g) and reduce-scatters its
 * gradient (the same g: V / W (X - 1) / X with V = E E 2). Compute-bound: exposed are the
 * forward's first gather, the backward's first gather -- which may start only once the op before
 * the backward loop runs, not during the forward, where an unlimited prefetch would have hidden
 * it (and held every layer's weights) -- and the last reduce-scatter: 3 g. */
static void test_fsdp_train(void) {
  ut_begin("FSDP training: exposed are the first gather of each loop and the last reduce-scatter");
  char src[2048];
  snprintf(src, sizeof src, "%s", DP);
  char *at = strstr(src, "layout dp {\n  batch: data\n");
  Run R;
  if (!at) ut_fail("the program text changed");
  else {
    char fsdp[2048];
    snprintf(fsdp, sizeof fsdp, "%.*slayout dp {\n  batch: data\n  embed: data\n%s", (int)(at - src), src,
             at + strlen("layout dp {\n  batch: data\n"));
    if (run(&R, fsdp, NULL, true)) {
      double E = 4096, g = E * E * 2 / V5E_ICI / 2;
      near("exposed = 3 g", R.r.exposed_comm_s, 3 * g);
      near("comm = 4 + 4 gathers, 4 reduce-scatters and the loss's all-reduce", R.r.comm_s, 12 * g + 2 * HOP);
    }
    run_free(&R);
  }
  ut_end();
}

/* ---- pipelines: the bubble against the closed forms ----
 * Eight layers x @ w over 4 stages (2 layers each, or 2 chunks of 1 with interleaved(2)), 8
 * microbatches of 8 rows, mse and sgd. Per chunk of k layers on a v5e at peak:
 *   forward   t_f = k mm(8, E, E)                     (x @ w)
 *   backward  t_b = k (mm(8, E, E) + mm(E, 8, E)) + a  (dx = dy w^T; dw = x^T dy over the batch)
 *             a = (2 + 4 + 4) k E E / H                 the f32 accumulation of the chunk's
 *                                                       gradient: read bf16 and f32, write f32
 *   transfer  x = 8 E 2 / W + T_hop                    (a microbatch's activation, one ICI hop)
 * The first stage's bubble is then what sim_pipe_simulate gives for (p, N, V, t_f, t_b, x), whose
 * closed forms (p - 1)(t_f + t_b) (gpipe, 1f1b) and (p - 1)(t_f + t_b) / V (interleaved, per
 * chunk times) test_sim.c checks; with transfers each of the p V - 1 boundaries between virtual
 * stages adds x on the way in and x on the way out: bubble = (p - 1)(t_f + t_b) (per chunk
 * times) + 2 (p V - 1) x. sim_pipe_simulate counts the first stage's sends as bubble; sim reports
 * a send as (exposed) communication, so the two add up to it. The loss region runs on the last
 * stage after each microbatch's forward, on the backward's critical path: it moves < 1.6 MB
 * (casts and elementwise ops over [8, 4096] f32), under 2 us at 8.1e11 B/s, so it may add up to
 * N x 2 us = 16 us to the bubble (1.5% of the smallest). */
static const char *PIPE_FMT =
    "import \"targets\"\n"
    "mesh pod = tpu_v5e[stage: 4]\n"
    "dim batch = 64, embed = 4096, e2 = embed, layers = 8\n"
    "layout pp {\n"
    "  layers: stage\n"
    "}\n"
    "model lin {\n"
    "  param w: bf16[embed, e2]\n"
    "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] {\n"
    "    return (x @ w)[e2 -> embed]\n"
    "  }\n"
    "}\n"
    "model net {\n"
    "  param blocks: lin[layers]\n"
    "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] {\n"
    "    for b in blocks { x = b.forward(x) }\n"
    "    return x\n"
    "  }\n"
    "}\n"
    "train net.forward {\n"
    "  loss = mse\n"
    "  optimizer = sgd\n"
    "  microbatches = 8\n"
    "  schedule = %s\n"
    "}\n";

static void test_pipeline(ScheduleKind kind, const char *sched, int v) {
  char name[128], src[2048];
  snprintf(name, sizeof name, "pipeline %s: the first stage's bubble is the closed form's", sched);
  ut_begin(name);
  snprintf(src, sizeof src, PIPE_FMT, sched);
  Run R;
  if (run(&R, src, NULL, true)) {
    double E = 4096, k = 2.0 / v;
    double tf = k * mm(8, E, E), a = 10 * k * E * E / V5E_HBM, tb = k * (mm(8, E, E) + mm(E, 8, E)) + a;
    double x = 8 * E * 2 / V5E_ICI + HOP;
    PipeResult pr;
    ut_true("closed form simulated", sim_pipe_simulate(kind, 4, 8, v, tf, tb, x, &pr));
    UT_CHECK(R.r.nstages == 4, "4 simulated devices, got %d", R.r.nstages);
    if (R.r.nstages == 4) {
      const SimStageStats *s0 = &R.r.stages[0];
      double got = s0->bubble_s + s0->exposed_comm_s, extra = got - pr.bubble_s;
      UT_CHECK(extra >= -1e-9 && extra <= 8 * 2e-6,
               "bubble and sends of the first stage %.6g, sim_pipe_simulate's %.6g: the loss region may add 0 to 16 us",
               got, pr.bubble_s);
      double closed = 3 * (tf + tb) + 2 * (4 * v - 1) * x;
      ut_near("against (p - 1)(t_f + t_b) + 2 (p V - 1) x", got, closed, 0.015);
    }
  }
  run_free(&R);
  ut_end();
}

/* ---- attention: flash, or materialized as before flash attention ----
 * The fused attention of q, k, v: bf16[1, 1024, 8, 64] (batch, sequence, heads, head), causal.
 * Flash attention at peak (stdlib tpu_v5e) is its FLOPs, 2 x 2 x 8 x 1024 x 1024 x 64 = 2.15e9
 * (QK and PV, no causal discount when ideal): 10.9 us, against 4.2 MB of q, k, v, o. A target
 * with `attention = materialized` runs three kernels, each memory-bound here:
 *   S = Q K^T   reads q and k (1 MiB each), writes S (8 x 1024 x 1024 bf16 = 16 MiB): 23.3 us
 *   softmax     reads S, writes P: 32 MiB: 41.4 us
 *   O = P V     reads P and v, writes o: 18 MiB: 23.3 us                 in all 88.0 us */
static const char *ATTN =
    "import \"targets\"\n"
    "target v5e_old {\n"
    "  base = tpu_v5e\n"
    "  attention = materialized\n"
    "}\n"
    "mesh old = v5e_old[x: 1]\n"
    "mesh flash = tpu_v5e[x: 1]\n"
    "dim b = 1, s = 1024, ks = s, h = 8, d = 64\n"
    "model att {\n"
    "  fn forward(q: bf16[b, s, h, d], k: bf16[b, ks, h, d], v: bf16[b, ks, h, d]) -> bf16[b, s, h, d] {\n"
    "    let sc = contract(q, k, over: d) * 0.125\n"
    "    let p = softmax(causal(sc, s, ks), over: ks)\n"
    "    return contract(p, v, over: ks)\n"
    "  }\n"
    "}\n";

static void test_attention(void) {
  ut_begin("attention: flash at its FLOPs; materialized as three kernels moving the scores");
  Run R;
  double mib = 1048576, sc = 16 * mib;
  if (run(&R, ATTN, "mesh=flash", true)) near("flash", R.r.step_s, 2 * 2 * 8 * 1024.0 * 1024 * 64 / V5E_FLOPS);
  run_free(&R);
  if (run(&R, ATTN, "mesh=old", true))
    near("materialized", R.r.step_s, (2 * mib + sc) / V5E_HBM + 2 * sc / V5E_HBM + (sc + 2 * mib) / V5E_HBM);
  run_free(&R);
  ut_end();
}

/* ---- a collective alone: the book's AllGather ----
 * bf16[4096, 65536] gathered over the 8 GPUs of one H100 node: V (N - 1) / (N W) = 536870912 x
 * 7/8 / 4.5e11 = 1.044 ms at peak (hardware-and-costs.md), measured about 1.5 ms: the calibrated
 * default within 10% of it. */
static const char *GATHER =
    "import \"targets\"\n"
    "mesh node = h100[tp: 8]\n"
    "dim rows = 4096, cols = 65536\n"
    "model gather {\n"
    "  fn forward(x: bf16[rows@tp, cols]) -> bf16[rows, cols] {\n"
    "    return x\n"
    "  }\n"
    "}\n";

static void test_book_allgather(void) {
  ut_begin("the book's AllGather in an 8xH100 node: 1.044 ms ideal, ~1.5 ms calibrated");
  Run R;
  if (run(&R, GATHER, NULL, true)) near("ideal", R.r.step_s, 536870912.0 * 7 / 8 / H100_NVLINK);
  run_free(&R);
  if (run(&R, GATHER, NULL, false)) ut_near("calibrated", R.r.step_s, 1.5e-3, 0.10);
  run_free(&R);
  ut_end();
}

/* ---- the book's Pop Quiz 2 (sharding.md): a v5e {X: 8, Y: 4}, AllGather over Y, an open ring of 4 ----
 * bf16[2048, 8192] (V = 33,554,432 bytes): max(T_hop (Y - 1), V / W x (Y - 1) / Y) = 33554432 /
 * 4.5e10 x 3/4 = 559.24 us (the book: "about 560 us"). bf16[256, 256] (131,072 bytes): the
 * bandwidth term is 2.2 us, the latency term 3 hops x 1 us = 3 us, which wins. */
static const char *POPQUIZ =
    "import \"targets\"\n"
    "mesh slice = tpu_v5e[X: 8, Y: 4]\n"
    "dim rows = 2048, cols = 8192\n"
    "model gather {\n"
    "  fn forward(x: bf16[rows@Y, cols]) -> bf16[rows, cols] {\n"
    "    return x\n"
    "  }\n"
    "}\n";

static void test_book_popquiz(void) {
  ut_begin("the book's Pop Quiz 2 on a v5e: 559 us bandwidth-bound, 3 us latency-bound, at peak");
  Run R;
  if (run(&R, POPQUIZ, NULL, true)) near("bf16[2048, 8192]", R.r.step_s, 33554432.0 / V5E_ICI * 3 / 4);
  run_free(&R);
  if (run(&R, POPQUIZ, "rows=256;cols=256", true)) near("bf16[256, 256]", R.r.step_s, 3 * HOP);
  run_free(&R);
  ut_end();
}

/* ---- the API the runtime reads: durations per op add up to the step on a chain ---- */
static void test_op_durations(void) {
  ut_begin("sim_costs_op_seconds over a chain's ops adds up to its step");
  Run R;
  if (run(&R, CHAIN, NULL, false)) {
    SimCosts c;
    sim_costs_build(&R.arena, R.m, R.p->mesh, false, &c);
    double sum = 0;
    for (const Op *op = R.m->main->first; op; op = op->next) sum += sim_costs_op_seconds(&c, op);
    near("sum of op durations", sum, R.r.step_s);
    /* an op alone: the first contraction's sim_op_seconds is its kernel's time */
    for (const Op *op = R.m->main->first; op; op = op->next)
      if (op->kind == OP_CONTRACT) {
        near("sim_op_seconds of a contraction", sim_op_seconds(R.p->mesh, op, false, NULL),
             sim_costs_op_seconds(&c, op));
        break;
      }
  }
  run_free(&R);
  ut_end();
}

int main(void) {
  test_chain();
  test_fusion();
  test_fsdp_overlap();
  test_dp_overlap();
  test_dp_windows();
  test_dp_keys();
  test_tp_overlap();
  test_remat_selective();
  test_fsdp_train();
  test_pipeline(SCHED_GPIPE, "gpipe", 1);
  test_pipeline(SCHED_1F1B, "1f1b", 1);
  test_pipeline(SCHED_INTERLEAVED, "interleaved(2)", 2);
  test_attention();
  test_book_allgather();
  test_book_popquiz();
  test_op_durations();
  return ut_summary();
}
