/* test_bind.c: a layout binds every value (language.md, Layouts: "A layout binds").
 *
 * For every .shard file named (directories searched), under every mesh and layout it declares (a
 * train step whole, as test_partition does), this propagates shardings (propagate_module) and walks
 * every value of the step, loop bodies included. For each value without a written type, the
 * layout's mapping of its type is computed independently here, by layout_map_dims (the rules in
 * order, a route's expert dim first where its tokens dim is absent, each rule skipped where its axes
 * are taken [a multi-axis rule keeping the rest], missing from the mesh, the pipeline's, or not
 * dividing); every dim that mapping shards (a bound dim) must carry exactly those axes. The
 * exceptions are the documented ones (docs/passes.md, section 6):
 *   - a value with a written type (a typed let, a function boundary, a param, a gradient's copy with
 *     its param's type): it overrides the layout, and is not checked here;
 *   - the logits a route reads: their tokens dim is whole (route reads it so);
 *   - a loop body's carried output: it is the carried value, held as the carried input is (the
 *     input is checked: by the layout, or by its written type);
 *   - zeros a loop reads as a carried initial value (an accumulator's start): any block of zeros;
 * Dims the mapping leaves unsharded (open dims: no rule maps them after the skips) are
 * propagation's choice and are not checked; nor are partial sums (not dim shardings: a deferred
 * reduction). A value fails when a bound dim holds other axes; the test prints the first few.
 *
 * It can fail: any propagation that leaves a value sharded as its op's plan would have it rather
 * than as the layout says (the free search's derivation, for one) is caught. Prints PASS/FAIL per
 * configuration and "N passed, N failed".
 *
 * Then the newcomers' cases of issue 18 (tests/unit/bind/), each of which main (9c897d7) got wrong:
 *   newcomer_tp.shard  LLaMA 3 70B's shapes under data parallelism and Megatron TP+SP over `model`:
 *                      the layer's collectives over model are Megatron-SP's, at most 6 AllGathers
 *                      and 6 ReduceScatters of the activation (7/8 of [8, 8192, 8192] bf16 =
 *                      939,524,096 B each) and no weight gathered over model (main gathered the
 *                      weights over model too, with 5 activation AllGathers and 1 ReduceScatter per
 *                      layer); explain's weighing finds the unbound plan cheaper and names the rule;
 *   newcomer_ep.shard  Mixtral's shapes under `batch: (data, ep)`, `expert: ep`, microbatches 1,
 *                      SwiGLU experts of hidden 2048: the slots move to the experts by AllToAll (4
 *                      per layer forward and backward, 6 with the recomputation), the 3 experts'
 *                      weights are never gathered, and with ep across nodes the step simulates
 *                      slower than with ep inside one (main: no AllToAll, the experts' weights
 *                      gathered, the two meshes equally fast). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bucket.h"
#include "diag.h"
#include "explain_textbook.h"
#include "ir.h"
#include "partition.h"
#include "pipeline.h"
#include "propagate.h"
#include "sim.h"
#include "step.h"
#include "textbook.h"
#include "unit_pipeline.h"
#include "unit_test.h"

static int npass, nfail, nskip;
static long nchecked;

typedef struct Walk {
  const Program *p;
  long checked, bad;
  char first[3][1024];
} Walk;

static bool dims_equal(const Sharding *a, int da, const Sharding *b, int db) {
  return a->naxes[da] == b->naxes[db] && memcmp(a->axes[da], b->axes[db], a->naxes[da]) == 0;
}

/* The zeros a loop starts a carried value from (a constant 0 or its broadcast). */
static bool zeros(const Value *v) {
  const Op *d = v->def;
  if (d && d->kind == OP_BROADCAST && d->noperands == 1) d = d->operands[0]->def;
  return d && d->kind == OP_CONST && d->scalar == 0;
}

static void check_value(Walk *W, const Value *v, const Dim *whole, const char *where) {
  if (!v || v->spec || v->type.rank == 0) return;
  Sharding want;
  layout_map_dims(W->p, (Dim *const *)v->type.dims, v->type.rank, &want, NULL, false);
  W->checked++;
  for (int d = 0; d < v->type.rank; d++) {
    if (!want.naxes[d] || v->type.dims[d] == whole) continue;
    if (dims_equal(&v->sharding, d, &want, d)) continue;
    if (W->bad < 3) {
      char got[256], exp[256];
      sharding_format(got, sizeof got, &v->type, &v->sharding, W->p->mesh);
      sharding_format(exp, sizeof exp, &v->type, &want, W->p->mesh);
      snprintf(W->first[W->bad], sizeof W->first[0], "%s %s%s%s at line %d: %s, where the layout binds %s: %s", where,
               v->def ? ir_op_name(v->def->kind) : "input", v->name ? " " : "", v->name ? v->name : "",
               v->def ? v->def->loc.line : 0, got, v->type.dims[d]->name, exp);
    }
    W->bad++;
    return;
  }
}

static void walk_func(Walk *W, const IrFunc *f, const bool *carried_out, const bool *init_zero, int nvalues) {
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_LOOP && op->body) {
      const IrFunc *b = op->body;
      for (int i = op->nslices; i < op->nslices + op->ncarried && i < b->ninputs; i++)
        check_value(W, b->inputs[i], NULL, "carried input");
      walk_func(W, b, carried_out, init_zero, nvalues);
    }
    if (op->kind == OP_PARAM || op->kind == OP_INPUT || op->kind == OP_CONST || op->nresults != 1) continue;
    const Value *r = op->results[0];
    if (r->id >= 0 && r->id < nvalues && (carried_out[r->id] || init_zero[r->id])) continue;
    /* the logits a route reads: its tokens dim whole */
    const Dim *whole = NULL;
    for (const Op *u = f->first; u; u = u->next)
      if (u->kind == OP_ROUTE && u->noperands == 1 && u->operands[0] == r && u->ndims >= 2) whole = u->dims[1];
    check_value(W, r, whole, "value");
  }
}

static void mark(const IrFunc *f, bool *carried_out, bool *init_zero, int nvalues) {
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind != OP_LOOP || !op->body) continue;
    const IrFunc *b = op->body;
    for (int r = 0; r < op->ncarried && r < b->noutputs; r++)
      if (b->outputs[r] && b->outputs[r]->id < nvalues) carried_out[b->outputs[r]->id] = true;
    for (int i = op->nslices; i < op->nslices + op->ncarried && i < op->noperands; i++)
      if (zeros(op->operands[i]) && op->operands[i]->id < nvalues) init_zero[op->operands[i]->id] = true;
    mark(b, carried_out, init_zero, nvalues);
  }
}

static void run_config(const char *path, const char *mesh, const char *layout) {
  Arena a;
  arena_init(&a);
  diag_reset();
  ParsedProgram *pp = parse_program(&a, path, unit_stdlib_dir());
  int res = -1;
  Walk W = {0};
  if (pp && pp->nfiles > 0 && diag_error_count() == 0) {
    SemaOptions so = {.mesh = mesh, .layout = layout};
    Program *p = sema_program(&a, pp, &so);
    if (!p->usage_error && diag_error_count() == 0 && p->entry && p->mesh) {
      IrModule *m = step_build(&a, p);
      if (m && diag_error_count() == 0) {
        propagate_module(m, p);
        W.p = p;
        int n = m->nvalues > 0 ? m->nvalues : 1;
        bool *carried_out = calloc((size_t)n, 1), *init_zero = calloc((size_t)n, 1);
        if (!carried_out || !init_zero) abort();
        mark(m->main, carried_out, init_zero, m->nvalues);
        walk_func(&W, m->main, carried_out, init_zero, m->nvalues);
        free(carried_out);
        free(init_zero);
        res = W.bad == 0; /* (a program whose every value is written has nothing to check) */
      }
    }
  }
  arena_free(&a);
  printf("%s %s mesh=%s layout=%s: %ld values checked, %ld not as the layout binds them\n",
         res < 0 ? "SKIP" : res ? "PASS" : "FAIL", path, mesh ? mesh : "-", layout ? layout : "-", W.checked, W.bad);
  for (int i = 0; i < 3 && i < W.bad; i++) printf("  %s\n", W.first[i]);
  nchecked += W.checked;
  if (res < 0) nskip++;
  else if (res == 0) nfail++;
  else npass++;
}

static void run_file(const char *path) {
  char *meshes[32], *layouts[32];
  int nm, nl;
  unit_declared(path, meshes, &nm, layouts, &nl, 32);
  for (int i = 0; i < nm; i++)
    for (int j = 0; j < nl; j++) run_config(path, meshes[i], layouts[j]);
  for (int i = 0; i < nm; i++) free(meshes[i]);
  for (int j = 0; j < nl; j++) free(layouts[j]);
}

/* ---- the newcomers' cases ---- */

typedef struct Loaded {
  Arena arena;
  CheckedProgram cp;
  LayerCensus c;
  bool ok;
} Loaded;

static bool load(Loaded *L, const char *path, const char *mesh, const char *const *defs, int ndefs) {
  memset(L, 0, sizeof *L);
  arena_init(&L->arena);
  diag_reset();
  ParsedProgram *pp = parse_program(&L->arena, path, unit_stdlib_dir());
  DimOverride ov[4];
  SemaOptions so = {.mesh = mesh, .overrides = ov};
  for (int i = 0; i < ndefs && i < 4; i++) {
    const char *eq = strchr(defs[i], '=');
    ov[so.noverrides++] = (DimOverride){intern_cstr(arena_printf(&L->arena, "%.*s", (int)(eq - defs[i]), defs[i])),
                                        atoll(eq + 1)};
  }
  if (!pp || diag_error_count() || check_program(&L->arena, pp, &so, &L->cp) != EXIT_OK || !L->cp.ir) {
    ut_fail("%s does not check", path);
    return false;
  }
  L->cp.ir->weigh.want = true; /* as explain and sim do */
  if (!pipeline_run(L->cp.ir, L->cp.prog)) {
    ut_fail("%s: the pass pipeline fails", path);
    return false;
  }
  layer_census(L->cp.ir, L->cp.prog->mesh, &L->c);
  return L->ok = true;
}

static void unload(Loaded *L) { arena_free(&L->arena); }

static uint16_t axis_bit(const Loaded *L, const char *name) {
  int a = mesh_axis_index(L->cp.prog->mesh, intern_cstr(name));
  return a >= 0 ? (uint16_t)(1u << a) : 0;
}

static void newcomer_tp(const char *dir) {
  ut_begin("newcomer: a tensor-parallel layout explains as Megatron's collectives, not weight gathers");
  Loaded L;
  char path[1024];
  snprintf(path, sizeof path, "%s/newcomer_tp.shard", dir);
  if (load(&L, path, NULL, NULL, 0)) {
    uint16_t model = axis_bit(&L, "model");
    const LayerCensus *c = &L.c;
    double act = 7.0 / 8 * (8.0 * 8192 * 8192 * 2); /* (n-1)/n of the activation a data shard holds */
    UT_CHECK(c->loop && (c->axes[ROLE_ACTIVATION] & model), "no activation collective over model in the layer");
    for (int k = COLL_ALL_GATHER; k <= COLL_REDUCE_SCATTER; k++) {
      int n = c->n[ROLE_ACTIVATION][k];
      UT_CHECK(n >= 5 && n <= 6, "%d activation %s per layer, Megatron-SP has 5 or 6", n, coll_kind_name((CollKind)k));
      if (n) ut_near(coll_kind_name((CollKind)k), c->bytes[ROLE_ACTIVATION][k] / n, act, 1e-9);
    }
    UT_CHECK(!(c->axes[ROLE_WEIGHT] & model) && c->n[ROLE_WEIGHT][COLL_ALL_GATHER] == 0,
             "%d weight gathers in the layer (over axes %#x): the layout keeps the weights sharded over model",
             c->n[ROLE_WEIGHT][COLL_ALL_GATHER], c->axes[ROLE_WEIGHT]);
    const struct LayoutWeigh *w = &L.cp.ir->weigh;
    UT_CHECK(w->done && w->cheaper && w->free_s < w->bound_s && w->rule, "weighed %d cheaper %d (%g s against %g s)",
             w->done, w->cheaper, w->free_s, w->bound_s);
    const char *text = layout_weigh_text(&L.arena, L.cp.ir, L.cp.prog);
    UT_CHECK(text && strstr(text, "layout rule `") && strstr(text, "would save"), "the line: %s", text ? text : "(none)");
    unload(&L);
  }
  ut_end();
}

static double sim_step(Loaded *L) {
  SimOptions o = {.ideal = false};
  SimReport r;
  if (!sim_program(L->cp.prog, L->cp.ir, &o, &r)) return -1;
  double t = r.step_s;
  sim_report_free(&r);
  return t;
}

static void newcomer_ep(const char *dir) {
  ut_begin("newcomer: `expert: ep` is expert parallelism, slower with ep across nodes than inside one");
  static const char *const defs[] = {"hidden=2048"};
  double step[2] = {-1, -1};
  static const char *const meshes[2] = {"ep_in_node", "ep_across"};
  for (int i = 0; i < 2; i++) {
    Loaded L;
    char path[1024];
    snprintf(path, sizeof path, "%s/newcomer_ep.shard", dir);
    if (!load(&L, path, meshes[i], defs, 1)) continue;
    uint16_t ep = axis_bit(&L, "ep");
    const LayerCensus *c = &L.c;
    UT_CHECK(c->ep_n[COLL_ALL_TO_ALL] == 6 && c->ep_axes == ep,
             "%s: %d AllToAlls of the slots per layer over %#x, expected 6 over ep (2 forward, 2 recomputed, 2 "
             "backward)", meshes[i], c->ep_n[COLL_ALL_TO_ALL], c->ep_axes);
    UT_CHECK(c->nweights_ep == 3, "%s: %d of the layer's weights are the experts' kept on ep, expected 3", meshes[i],
             c->nweights_ep);
    step[i] = sim_step(&L);
    unload(&L);
  }
  UT_CHECK(step[0] > 0 && step[1] > step[0], "ep inside a node %g s, across nodes %g s: across must be slower",
           step[0], step[1]);
  ut_end();
}

int main(int argc, char **argv) {
  FILE *devnull = fopen("/dev/null", "w");
  diag_configure(devnull ? devnull : stderr, DIAG_MACHINE, false);
  const char *newcomers = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--newcomers") == 0 && i + 1 < argc) {
      newcomers = argv[++i];
      continue;
    }
    if (!ut_each_shard(argv[i], run_file)) {
      fprintf(stderr, "test_bind: cannot read %s\n", argv[i]);
      nfail++;
    }
  }
  printf("%d passed, %d failed (%d skipped); %ld values checked\n", npass, nfail, nskip, nchecked);
  int bad = nfail > 0 || npass == 0 || nchecked == 0;
  if (newcomers) {
    newcomer_tp(newcomers);
    newcomer_ep(newcomers);
    bad |= ut_summary() != 0;
  }
  if (devnull) fclose(devnull);
  return bad;
}
