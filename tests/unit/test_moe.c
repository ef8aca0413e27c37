/* test_moe.c: mixture of experts, from `route` to expert parallelism (route.h; docs/moe.md).
 *
 *   route by hand        route's slots against ones worked out by hand from small logits: ties to
 *                        the lower index, first choices before second choices, a full expert
 *                        dropping the choices that reach it later, each group on its own; a
 *                        dispatch and a combine back (each kept token's row, times its kept
 *                        choices)
 *   what it costs        a dispatch and a combine count 0 FLOPs and move their bytes (the route
 *                        pattern as k entries per token), route_grad k dot products per token;
 *                        memory counts a route result as entries, not densely
 *   gradients            the MoE block's step against central finite differences (double
 *                        precision), under each remat policy
 *   expert parallelism   the step on a mesh whose `ep` axis shards the experts, device by device,
 *                        equals the unsharded step (a MoE block; the Mixtral-style decoder alone,
 *                        on two pipeline stages, and under sequence parallelism); the AllToAlls
 *                        are where GShard puts them
 *   the load-balancing loss  layers' moe_mlp.aux_loss against a hand computation
 *   Mixtral 8x7B         the sample's parameter count and active parameters per token from its
 *                        shapes, against the published 46.7e9 and 12.9e9; its plan's AllToAlls
 *                        (count and bytes) against GShard's, by hand
 *
 *   test_moe [NAME]      every case, or those whose name contains NAME */
#define _GNU_SOURCE /* mkstemps */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interp.h"
#include "opcost.h"
#include "route.h"
#include "step.h"
#include "textbook.h"
#include "unit_test.h"

#ifndef MOE_DIR
#define MOE_DIR "tests/unit/moe"
#endif
#ifndef SHARDC_SAMPLES
#define SHARDC_SAMPLES "samples"
#endif

static const char *only;

static bool wanted(const char *name) { return !only || strstr(name, only); }

/* The first op of kind k in f (and its loop bodies), in program order. */
static const Op *find_op(const IrFunc *f, OpKind k, int flag) {
  for (const Op *o = f->first; o; o = o->next) {
    if (o->kind == k && (flag < 0 || o->flag == flag)) return o;
    if (o->kind == OP_LOOP && o->body) {
      const Op *x = find_op(o->body, k, flag);
      if (x) return x;
    }
  }
  return NULL;
}

/* ---- route by hand ---- */

/* Logits of group 0, token by token (three experts); group 1 holds the same rows in reverse token
 * order. */
static const double logits0[6][3] = {{1, 3, 2}, {5, 5, 0}, {0, 4, 1}, {2, 9, 1}, {7, 1, 1}, {0, 0, 0}};

/* Runs entry r.NAME of route.shard on the logits (and x, for roundtrip); the output in *out. */
static bool run_route(const char *entry, const double *x, Tensor **out) {
  InterpProgram ip;
  *out = NULL;
  if (interp_load(&ip, MOE_DIR "/route.shard", NULL, 0, NULL, NULL, entry) != EXIT_OK || !ip.cp.ir) {
    ut_fail("route.shard does not load with --entry %s", entry);
    return false;
  }
  IrModule *m = ip.cp.ir;
  int n = interp_ninputs(m);
  Tensor **in = calloc((size_t)n, sizeof *in);
  for (int i = 0; i < n; i++) in[i] = tensor_new(&m->main->inputs[i]->type);
  for (int g = 0; g < 2; g++)
    for (int t = 0; t < 6; t++)
      for (int e = 0; e < 3; e++) in[0]->data[(g * 6 + t) * 3 + e] = logits0[g ? 5 - t : t][e];
  if (n > 1)
    for (int64_t i = 0; i < in[1]->n; i++) in[1]->data[i] = x[i];
  InterpOptions o = {.precision = INTERP_F64};
  InterpStats st;
  bool ok = interp_run(m, &o, in, NULL, out, &st);
  if (!ok) ut_fail("interp: %s", st.error);
  interp_free_tensors(in, n);
  interp_unload(&ip);
  return ok;
}

/* want[g][e][s]: the token in expert e's slot s of group g, -1 for an empty slot. */
static void check_slots(const Tensor *r, int C, const int want[2][3][3]) {
  for (int g = 0; g < 2; g++)
    for (int t = 0; t < 6; t++)
      for (int e = 0; e < 3; e++)
        for (int s = 0; s < C; s++) {
          double got = r->data[((g * 6 + t) * 3 + e) * C + s], exp = want[g][e][s] == t ? 1 : 0;
          UT_CHECK(got == exp, "group %d token %d expert %d slot %d: %g, expected %g", g, t, e, s, got, exp);
        }
}

static void test_route_by_hand(void) {
  /* top 1, two slots. Group 0's first choices: t0 e1, t1 e0 (5 = 5: the lower index), t2 e1,
   * t3 e1, t4 e0, t5 e0 (all equal). In token order: e1 takes t0, t2 and is full for t3; e0
   * takes t1, t4 and is full for t5. Group 1 (tokens reversed: u = 5 - t): u0 e0, u1 e0 fill
   * e0, u2 e1, u3 e1 fill e1, u4 (e0) and u5 (e1) are dropped. e2 stays empty. */
  static const int top1[2][3][3] = {{{1, 4, -1}, {0, 2, -1}, {-1, -1, -1}},
                                    {{0, 1, -1}, {2, 3, -1}, {-1, -1, -1}}};
  /* top 2, three slots. Group 0's second choices: t0 e2, t1 e1 (tie broken: e0 is first), t2 e2,
   * t3 e0, t4 e1 (1 = 1: e1), t5 e1. First choices fill first, in token order: e1 <- t0, t2, t3
   * (full), e0 <- t1, t4, t5 (full); then second choices: t0 -> e2 slot 0, t1 -> e1 full, t2 -> e2
   * slot 1, t3 -> e0 full, t4, t5 -> e1 full. Group 1: first choices e0 <- u0, u1, u4 and e1 <-
   * u2, u3, u5; second choices u0 e1 (full), u1 e1 (full), u2 e0 (full), u3 e2 slot 0, u4 e1
   * (full), u5 e2 slot 1. */
  static const int top2[2][3][3] = {{{1, 4, 5}, {0, 2, 3}, {0, 2, -1}}, {{0, 1, 4}, {2, 3, 5}, {3, 5, -1}}};
  if (wanted("route.top1")) {
    ut_begin("route.top1: ties to the lower index, a full expert drops later tokens, groups apart");
    Tensor *r;
    if (run_route("r.top1", NULL, &r)) check_slots(r, 2, top1);
    tensor_free(r);
    ut_end();
  }
  if (wanted("route.top2")) {
    ut_begin("route.top2: every first choice before any second choice (GShard's order)");
    Tensor *r;
    if (run_route("r.top2", NULL, &r)) check_slots(r, 3, top2);
    tensor_free(r);
    ut_end();
  }
  if (wanted("route.roundtrip")) {
    /* x[g, t, :] = (100 g + 10 t + 1, 100 g + 10 t + 2); the combine of the dispatch gives each
     * token its row times the number of its choices kept (top2 above): group 0: t0 2 (e1, e2),
     * t1 1, t2 2, t3 1, t4 1, t5 1; group 1: u0 1, u1 1, u2 1, u3 2, u4 1, u5 2. */
    static const int kept[2][6] = {{2, 1, 2, 1, 1, 1}, {1, 1, 1, 2, 1, 2}};
    ut_begin("route.roundtrip: a dispatch then a combine is each token times its kept choices");
    double x[24];
    for (int g = 0; g < 2; g++)
      for (int t = 0; t < 6; t++)
        for (int j = 0; j < 2; j++) x[(g * 6 + t) * 2 + j] = 100 * g + 10 * t + 1 + j;
    Tensor *r;
    if (run_route("r.roundtrip", x, &r))
      for (int g = 0; g < 2; g++)
        for (int t = 0; t < 6; t++)
          for (int j = 0; j < 2; j++) {
            double got = r->data[(g * 6 + t) * 2 + j], want = kept[g][t] * x[(g * 6 + t) * 2 + j];
            UT_CHECK(got == want, "group %d token %d [%d]: %g, expected %g", g, t, j, got, want);
          }
    tensor_free(r);
    ut_end();
  }
}

/* ---- what it costs ---- */

/* moe_layer.shard's step, unpartitioned: B = 4 sequences of S = 8 tokens, embed D = 64, each
 * expert's hidden H = 256, E = 4 experts of C = 3 slots, k = 2, L = 2 layers. Per layer the
 * forward contracts the gate (2 B S D E = 16,384) and the experts on their slots (3 x 2 B E C D H
 * = 4,718,592): 4,734,976, and nothing for the dispatch and the combine. The backward doubles
 * every contraction and adds route_grad, the combine weights' gradient: one dot product over D per
 * entry, 2 x (B S k = 64 entries) x D = 8,192. Full remat recomputes the forward once. */
static void test_costs(void) {
  if (!wanted("costs")) return;
  ut_begin("costs: dispatch and combine count 0 FLOPs, route_grad its entries, a route result is held as entries");
  InterpProgram ip;
  if (interp_load(&ip, MOE_DIR "/moe_layer.shard", NULL, 0, "ep", NULL, NULL) != EXIT_OK || !ip.cp.ir) {
    ut_fail("moe_layer.shard does not load");
    ut_end();
    return;
  }
  IrModule *m = ip.cp.ir;
  const Op *disp = find_op(m->main, OP_CONTRACT, CONTRACT_DISPATCH), *comb = find_op(m->main, OP_CONTRACT, CONTRACT_COMBINE);
  const Op *route = find_op(m->main, OP_ROUTE, -1), *rg = find_op(m->main, OP_ROUTE_GRAD, -1);
  UT_CHECK(disp && comb && route && rg, "the step lacks a dispatch, a combine, a route or a route_grad");
  if (disp && comb && route && rg) {
    OpCost c;
    opcost(disp, false, &c);
    UT_CHECK(c.flops == 0, "the dispatch counts %g FLOPs", c.flops);
    opcost(comb, false, &c);
    UT_CHECK(c.flops == 0, "the combine counts %g FLOPs", c.flops);
    opcost(rg, false, &c);
    UT_CHECK(c.flops == 2.0 * 64 * 64, "route_grad counts %g FLOPs, expected 2 x 64 entries x 64", c.flops);
    /* the route reads f32[4, 8, 4] (512 bytes) and writes 2 entries per token of 8 bytes of
     * indices and a 4-byte value: 32 tokens x 2 x 12 = 768 bytes, not the dense 1,536 */
    opcost(route, false, &c);
    UT_CHECK(c.bytes == 512 + 768, "the route moves %g bytes, expected 1280", c.bytes);
    UT_CHECK(ir_route_density(route->results[0]) == 0.5, "density %g", ir_route_density(route->results[0]));
  }
  StepFlops sf;
  step_flops(m, &sf);
  double fwd = 2 * (16384.0 + 4718592.0);
  UT_CHECK(sf.forward == fwd, "forward FLOPs %.0f, expected %.0f", sf.forward, fwd);
  UT_CHECK(sf.recompute == fwd, "recomputed FLOPs %.0f, expected %.0f", sf.recompute, fwd);
  UT_CHECK(sf.backward == 2 * fwd + 2 * 8192.0, "backward FLOPs %.0f, expected %.0f", sf.backward, 2 * fwd + 2 * 8192.0);
  interp_unload(&ip);
  ut_end();
}

/* ---- gradients ---- */

/* The step with its outputs replaced by (loss, every param's gradient), globally, in double. */
typedef struct Grads {
  double loss;
  Tensor **g;
  int n;
} Grads;

static bool run_grads(IrModule *m, Tensor **inputs, Tensor **params, Grads *out, char *err, size_t nerr) {
  IrFunc *f = m->main;
  int n = m->nparams;
  Value **saved = f->outputs;
  int nsaved = f->noutputs;
  Value **outs = calloc((size_t)n + 1, sizeof(Value *));
  outs[0] = m->step->loss;
  for (int i = 0; i < n; i++) outs[1 + i] = m->step->params[i].grad;
  f->outputs = outs;
  f->noutputs = n + 1;
  Tensor **res = calloc((size_t)n + 1, sizeof(Tensor *));
  InterpOptions o = {.precision = INTERP_F64};
  InterpStats st = {0};
  bool ok = interp_run(m, &o, inputs, params, res, &st);
  f->outputs = saved;
  f->noutputs = nsaved;
  free(outs);
  if (!ok) {
    snprintf(err, nerr, "%s", st.error);
    free(res);
    return false;
  }
  out->loss = res[0] && res[0]->n == 1 ? res[0]->data[0] : NAN;
  tensor_free(res[0]);
  out->g = res + 1;
  out->n = n;
  return true;
}

static void grads_free(Grads *g) {
  for (int i = 0; g->g && i < g->n; i++) tensor_free(g->g[i]);
  if (g->g) free(g->g - 1);
  memset(g, 0, sizeof *g);
}

/* moe_layer.shard with its train keys replaced, written to a temporary file (path: its name). */
static bool write_variant(const char *keys, char *path, size_t npath) {
  FILE *in = fopen(MOE_DIR "/moe_layer.shard", "r");
  if (!in) return false;
  char text[8192];
  size_t n = fread(text, 1, sizeof text - 1, in);
  fclose(in);
  text[n] = 0;
  char *train = strstr(text, "train net.forward {");
  if (!train) return false;
  *train = 0;
  snprintf(path, npath, "/tmp/test_moe_XXXXXX.shard");
  int fd = mkstemps(path, 6);
  FILE *out = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!out) return false;
  /* imports of the stdlib resolve wherever the file is */
  fprintf(out, "%strain net.forward { loss = mse  optimizer = sgd  %s }\n", text, keys);
  fclose(out);
  return true;
}

/* Central differences of the loss against the params (an even spread of 30 elements of each; embed
 * 8 and hidden 16), in double precision: a perturbation of 1e-6 changes no routing decision of these random logits, so
 * the loss is smooth there and the gate's gradient (through the probabilities) must match. */
static void fd_check(const char *keys, const char *batch) {
  char name[160];
  snprintf(name, sizeof name, "gradient: the MoE block against finite differences, %s", keys);
  if (!wanted(name)) return;
  ut_begin(name);
  char path[64];
  InterpProgram ip;
  const char *defs[3] = {"embed=8", "hidden=16", batch}; /* small: every element's run is a whole step */
  if (!write_variant(keys, path, sizeof path) ||
      interp_load(&ip, path, defs, batch ? 3 : 2, "ep", NULL, NULL) != EXIT_OK || !ip.cp.ir || !ip.cp.ir->step) {
    ut_fail("the variant does not load");
    ut_end();
    return;
  }
  IrModule *m = ip.cp.ir;
  Tensor **inputs = interp_random_inputs(m, 7), **params = interp_random_params(m, 11);
  Grads base = {0};
  char err[512] = "";
  int gate = -1;
  for (int i = 0; i < m->nparams; i++)
    if (strstr(m->params[i].path, "moe.gate")) gate = i;
  UT_CHECK(gate >= 0, "no gate param");
  if (!run_grads(m, inputs, params, &base, err, sizeof err)) {
    ut_fail("interp: %s", err);
  } else {
    const double h = 1e-6;
    for (int i = 0; i < m->nparams && ut_ok(); i++) {
      Tensor *p = params[i], *g = base.g[i];
      UT_CHECK(g && g->n == p->n, "gradient of %s has %lld elements", m->params[i].path, (long long)(g ? g->n : -1));
      if (!g || g->n != p->n) break;
      double gmax = 0;
      for (int64_t k = 0; k < g->n; k++) gmax = fmax(gmax, fabs(g->data[k]));
      UT_CHECK(gmax > 0, "the gradient of %s is zero", m->params[i].path);
      int64_t step = p->n <= 30 ? 1 : p->n / 30;
      for (int64_t k = 0; k < p->n && ut_ok(); k += step) {
        double x = p->data[k];
        Grads a = {0}, b = {0};
        p->data[k] = x + h;
        bool ok = run_grads(m, inputs, params, &a, err, sizeof err);
        p->data[k] = x - h;
        ok = ok && run_grads(m, inputs, params, &b, err, sizeof err);
        p->data[k] = x;
        if (!ok) {
          ut_fail("interp: %s", err);
        } else {
          double fd = (a.loss - b.loss) / (2 * h), an = g->data[k];
          UT_CHECK(fabs(fd - an) <= 1e-4 * fmax(gmax, 1e-9), "d loss / d %s[%lld]: analytic %.9g, finite difference %.9g",
                   m->params[i].path, (long long)k, an, fd);
        }
        grads_free(&a);
        grads_free(&b);
      }
    }
  }
  grads_free(&base);
  interp_free_tensors(inputs, interp_ninputs(m));
  interp_free_tensors(params, m->nparams);
  interp_unload(&ip);
  remove(path);
  ut_end();
}

static void test_gradients(void) {
  fd_check("remat = none", NULL);
  fd_check("remat = full", NULL);
  fd_check("remat = dots  microbatches = 2", "batch=8"); /* (each microbatch 4 rows: one per device) */
}

/* ---- expert parallelism ---- */

/* AllToAlls over `axis` by phase (forward and loss, recompute, backward), each op once. */
static void count_a2a(const IrFunc *f, int axis, int n[3], int *other_axes) {
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_LOOP && op->body) count_a2a(op->body, axis, n, other_axes);
    for (int r = 0; op->kind == OP_PIPELINE && r < PR__COUNT; r++)
      if (op->pipe->region[r]) count_a2a(op->pipe->region[r], axis, n, other_axes);
    if (op->kind != OP_ALL_TO_ALL) continue;
    if (op->axes != (1u << axis)) (*other_axes)++;
    n[op->phase == PHASE_RECOMPUTE ? 1 : op->phase == PHASE_BACKWARD ? 2 : 0]++;
  }
}

/* A step (adam, full remat) on [data: 2, ep: 2] (and [stage: 2, ...]), device by device, against
 * the unsharded step: every output (loss, params, moments) within 1e-4 of its scale (f32). Under
 * `ep` each layer moves the dispatched slots to their experts and the experts' outputs back (2
 * AllToAlls over ep), again in the backward's recomputation (2), and the gradients of both the
 * other way (2): GShard's 2 + 2 + 2 per layer, appearing once each in the loop bodies. `dp` (every
 * weight replicated) moves none. */
static void ep_case(const char *file, const char *mesh, const char *layout, const int want[3]) {
  char name[160];
  snprintf(name, sizeof name, "expert parallelism: the sharded step equals the unsharded one, %s on %s, layout %s", file,
           mesh, layout);
  if (!wanted(name)) return;
  ut_begin(name);
  InterpProgram ip;
  char path[512];
  snprintf(path, sizeof path, "%s/%s", MOE_DIR, file);
  if (interp_load(&ip, path, NULL, 0, layout, mesh, NULL) != EXIT_OK || !ip.cp.ir) {
    ut_fail("%s does not load", file);
    ut_end();
    return;
  }
  IrModule *m = ip.cp.ir;
  Tensor **in = interp_random_inputs(m, 5), **pa = interp_random_params(m, 5);
  int n = interp_noutputs(m);
  Tensor **ref = calloc((size_t)n, sizeof *ref);
  InterpOptions o = {.precision = INTERP_F32};
  InterpStats st;
  if (!interp_run(m, &o, in, pa, ref, &st)) {
    ut_fail("the global run fails: %s", st.error);
  } else if (!interp_partition(&ip)) {
    ut_fail("propagation and partitioning fail");
  } else {
    int a2a[3] = {0}, other = 0;
    count_a2a(m->main, mesh_axis_index(ip.cp.prog->mesh, intern_cstr("ep")), a2a, &other);
    static const char *ph[] = {"forward", "recompute", "backward"};
    for (int k = 0; k < 3; k++)
      UT_CHECK(a2a[k] == want[k], "%d AllToAlls in the %s, expected %d", a2a[k], ph[k], want[k]);
    UT_CHECK(other == 0, "%d AllToAlls over other axes than ep", other);
    InterpCheck chk;
    bool ran = interp_check_spmd(m, ip.cp.prog->mesh, &o, in, pa, ref, &chk);
    UT_CHECK(ran, "the SPMD run fails: %s", chk.stats.error);
    for (int i = 0; ran && i < chk.noutputs; i++) {
      const Value *v = m->main->outputs[i];
      if (only) printf("    %-34s max rel %.3g\n", v->name ? v->name : "?", chk.max_rel[i]);
      UT_CHECK(chk.max_rel[i] <= 1e-4, "output %d (%s) differs from the unsharded step by %.3g (relative)", i,
               v->name ? v->name : "?", chk.max_rel[i]);
    }
    interp_check_free(&chk);
  }
  interp_free_tensors(in, interp_ninputs(m));
  interp_free_tensors(pa, m->nparams);
  interp_free_tensors(ref, n);
  interp_unload(&ip);
  ut_end();
}

static void test_expert_parallel(void) {
  static const int ep[3] = {2, 2, 2}, none[3] = {0, 0, 0};
  ep_case("moe_layer.shard", "pod", "ep", ep);
  ep_case("moe_layer.shard", "pod", "dp", none);
  /* the decoder: the same per layer; under a pipeline the layers' ops are in the stages' regions
   * (a chunk's forward, a chunk's backward with its recomputation), each appearing once */
  ep_case("mixtral_tiny.shard", "pod", "ep", ep);
  ep_case("mixtral_tiny.shard", "pipe", "pp_ep", ep);
  /* sequence parallelism: no expert is sharded, and route reads the logits gathered along seq. The
   * one AllToAll is the loss's, not an expert's: the layout binds the per-token losses to seq@ep,
   * and at this size moving a microbatch's f32 logits (f32[2, 8, 16] per device, half of it sent:
   * 512 B) from vocab to seq shards costs less than the vocab-parallel cross entropy's three statistics AllReduces (plan choice) */
  static const int loss_only[3] = {1, 0, 0};
  ep_case("mixtral_tiny.shard", "pod", "tp_sp", loss_only);
}

/* ---- the load-balancing loss ---- */

/* layers' moe_mlp.aux_loss with the gate the identity (embed = expert = 3), so that the logits are
 * x: route.shard's logits, both groups (the second reversed). From test_route_by_hand's top 2 with
 * 3 slots, the kept choices per expert are 3, 3, 2 in each group: f = (3, 3, 2) / 6. P is the mean
 * softmax of the six rows, the same for both groups; the loss is 3 (f . P). */
static void test_aux_loss(void) {
  if (!wanted("aux")) return;
  ut_begin("aux loss: Switch Transformer's expert x sum of f x P, by hand");
  InterpProgram ip;
  if (interp_load(&ip, MOE_DIR "/aux.shard", NULL, 0, NULL, NULL, NULL) != EXIT_OK || !ip.cp.ir) {
    ut_fail("aux.shard does not load");
    ut_end();
    return;
  }
  IrModule *m = ip.cp.ir;
  Tensor *x = tensor_new(&m->main->inputs[0]->type);
  for (int g = 0; g < 2; g++)
    for (int t = 0; t < 6; t++)
      for (int e = 0; e < 3; e++) x->data[(g * 6 + t) * 3 + e] = logits0[g ? 5 - t : t][e];
  Tensor **pa = calloc((size_t)m->nparams, sizeof *pa);
  for (int i = 0; i < m->nparams; i++) {
    pa[i] = tensor_new(&m->params[i].type);
    if (strstr(m->params[i].path, "gate") && !strstr(m->params[i].path, "w_gate"))
      for (int k = 0; k < 3; k++) pa[i]->data[k * 3 + k] = 1; /* gate[embed, expert] = I */
  }
  double P[3] = {0};
  for (int t = 0; t < 6; t++) {
    double z = 0;
    for (int e = 0; e < 3; e++) z += exp(logits0[t][e]);
    for (int e = 0; e < 3; e++) P[e] += exp(logits0[t][e]) / z / 6;
  }
  double want = 3 * (3.0 / 6 * P[0] + 3.0 / 6 * P[1] + 2.0 / 6 * P[2]);
  Tensor *out = NULL;
  InterpOptions o = {.precision = INTERP_F64};
  InterpStats st;
  if (!interp_run(m, &o, &x, pa, &out, &st)) ut_fail("interp: %s", st.error);
  else ut_near("aux loss", out->data[0], want, 1e-12);
  tensor_free(out);
  tensor_free(x);
  interp_free_tensors(pa, m->nparams);
  interp_unload(&ip);
  ut_end();
}

/* ---- Mixtral 8x7B ---- */

/* Marks, in a forward loop body, the values computed per slot (a dispatch's result and what is
 * computed from it, up to a combine) and returns which of the body's stacked-param slices a
 * contraction reads against one of them: the experts' weights. */
static void expert_slices(const IrFunc *b, int nslices, bool *is_expert) {
  bool *slot = calloc((size_t)(b->inputs[b->ninputs - 1]->id + 100000), sizeof *slot);
  for (const Op *o = b->first; o; o = o->next) {
    bool any = ir_route_contract(o, NULL) == CONTRACT_DISPATCH;
    for (int i = 0; i < o->noperands && o->kind != OP_LOOP; i++) any |= slot[o->operands[i]->id];
    if (ir_route_contract(o, NULL) == CONTRACT_COMBINE) any = false;
    for (int r = 0; r < o->nresults; r++) slot[o->results[r]->id] = any;
    if (o->kind != OP_CONTRACT || o->noperands != 2) continue;
    for (int i = 0; i < 2; i++)
      for (int k = 0; k < nslices; k++)
        if (o->operands[i] == b->inputs[k] && slot[o->operands[1 - i]->id]) is_expert[k] = true;
  }
  free(slot);
}

/* The sample's params from the shapes the IR holds (stacked params with their layers): every
 * element, and per token those it runs: an expert's weights (a param a contraction reads against
 * the dispatched slots) count k = 2 of the 8 experts, everything else (the router's gate too) in
 * full. The expected figures are the sample header's hand count: 46,702,792,704 in all (46.7e9)
 * and 12,879,925,248 active (12.9e9), Mistral AI's published figures. */
static void test_mixtral(void) {
  if (!wanted("mixtral")) return;
  ut_begin("mixtral 8x7b: 46.7e9 params, 12.9e9 active per token, from the shapes");
  InterpProgram ip;
  if (interp_load(&ip, SHARDC_SAMPLES "/mixtral_8x7b.shard", NULL, 0, NULL, NULL, "mixtral.forward") != EXIT_OK ||
      !ip.cp.ir) {
    ut_fail("samples/mixtral_8x7b.shard does not load");
    ut_end();
    return;
  }
  IrModule *m = ip.cp.ir;
  const Op *loop = find_op(m->main, OP_LOOP, -1), *r = find_op(m->main, OP_ROUTE, -1);
  UT_CHECK(loop && r, "no stacked loop or no route");
  bool *expert_param = calloc((size_t)m->nparams + 1, sizeof *expert_param);
  int top = r ? r->index : 0, nexp = 0;
  double experts = r ? (double)r->dims[0]->size : 1;
  if (loop) {
    bool is_expert[64] = {false};
    expert_slices(loop->body, loop->nslices < 64 ? loop->nslices : 64, is_expert);
    for (int k = 0; k < loop->nslices && k < 64; k++) {
      const Op *d = loop->operands[k]->def;
      if (is_expert[k] && d && d->kind == OP_PARAM && d->index < m->nparams) expert_param[d->index] = true, nexp++;
    }
  }
  double all = 0, active = 0;
  for (int i = 0; i < m->nparams; i++) {
    double n = (double)tensor_type_elements(&m->params[i].type);
    all += n;
    active += expert_param[i] ? n * top / experts : n;
  }
  UT_CHECK(top == 2 && experts == 8, "route picks %d of %g experts", top, experts);
  UT_CHECK(nexp == 3, "%d params are the experts' (w_gate, w_up, w_down expected)", nexp);
  UT_CHECK(all == 46702792704.0, "%.0f params, expected 46,702,792,704", all);
  UT_CHECK(active == 12879925248.0, "%.0f active params, expected 12,879,925,248", active);
  UT_CHECK(fabs(all / 1e9 - 46.7) < 0.05 && fabs(active / 1e9 - 12.9) < 0.05, "%.2fe9 and %.2fe9", all / 1e9,
           active / 1e9);
  free(expert_param);
  interp_unload(&ip);
  ut_end();
}

/* The sample's plan against GShard's count, per layer and microbatch: one sequence per (data, ep)
 * device, so the dispatch buffer is 1 x 8 x 1024 x 4096 x 2 = 67,108,864 bytes and an AllToAll
 * over ep's 8 devices sends 7/8 of it, 58,720,256; 2 AllToAlls forward, 2 recomputed (remat =
 * full), 2 backward. Tensor parallelism keeps its Megatron count beside them (6 AllReduces of the
 * [1, 4096, 4096] bf16 residual stream, 2 x 3/4 x 33,554,432 = 50,331,648 bytes each). */
static void test_mixtral_plan(void) {
  if (!wanted("mixtral plan")) return;
  ut_begin("mixtral plan: 6 AllToAlls of 58.7 MB per layer and microbatch, Megatron's 6 AllReduces");
  InterpProgram ip;
  if (interp_load(&ip, SHARDC_SAMPLES "/mixtral_8x7b.shard", NULL, 0, NULL, NULL, NULL) != EXIT_OK || !ip.cp.ir ||
      !interp_partition(&ip)) {
    ut_fail("samples/mixtral_8x7b.shard does not load and partition");
    ut_end();
    return;
  }
  LayerCensus c;
  layer_census(ip.cp.ir, ip.cp.prog->mesh, &c);
  Arena a;
  arena_init(&a);
  TextbookRow rows[TEXTBOOK_MAX_ROWS];
  int n = textbook_compare(&a, ip.cp.ir, ip.cp.prog, &c, rows);
  bool ep = false, tp = false;
  for (int i = 0; i < n; i++) {
    const TextbookRow *r = &rows[i];
    if (strstr(r->strategy, "expert parallelism over ep") && r->kind == COLL_ALL_TO_ALL) {
      ep = true;
      UT_CHECK(r->got == 6 && r->want == 6, "%d AllToAlls, the book %d", r->got, r->want);
      UT_CHECK(r->got_bytes == 58720256.0 && r->want_bytes == 58720256.0, "%.0f bytes each, the book %.0f",
               r->got_bytes, r->want_bytes);
      UT_CHECK(!r->differs, "marked as more than the book");
    }
    if (strstr(r->strategy, "Megatron tensor parallelism over model") && r->kind == COLL_ALL_REDUCE) {
      tp = true;
      UT_CHECK(r->got == 6 && r->got_bytes == 50331648.0, "%d AllReduces of %.0f bytes", r->got, r->got_bytes);
    }
    UT_CHECK(!strstr(r->strategy, "FSDP") || strstr(r->strategy, "1 of the layer's"),
             "the experts' weights counted as FSDP's: %s", r->strategy);
  }
  UT_CHECK(ep && tp, "no expert parallelism row (%d) or no tensor parallelism row (%d)", ep, tp);
  UT_CHECK(c.nweights_ep == 3, "%d of the layer's weights are the experts', expected 3", c.nweights_ep);
  arena_free(&a);
  interp_unload(&ip);
  ut_end();
}

int main(int argc, char **argv) {
  if (argc > 1) only = argv[1];
  test_route_by_hand();
  test_costs();
  test_gradients();
  test_expert_parallel();
  test_aux_loss();
  test_mixtral();
  test_mixtral_plan();
  return ut_summary();
}
