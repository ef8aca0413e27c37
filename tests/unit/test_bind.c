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
 * configuration and "N passed, N failed". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "ir.h"
#include "partition.h"
#include "propagate.h"
#include "step.h"
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

int main(int argc, char **argv) {
  FILE *devnull = fopen("/dev/null", "w");
  diag_configure(devnull ? devnull : stderr, DIAG_MACHINE, false);
  for (int i = 1; i < argc; i++)
    if (!ut_each_shard(argv[i], run_file)) {
      fprintf(stderr, "test_bind: cannot read %s\n", argv[i]);
      nfail++;
    }
  printf("%d passed, %d failed (%d skipped); %ld values checked\n", npass, nfail, nskip, nchecked);
  if (devnull) fclose(devnull);
  return nfail > 0 || npass == 0 || nchecked == 0 ? 1 : 0;
}
