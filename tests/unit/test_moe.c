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
 *                        equals the unsharded step; the AllToAlls are where the book puts them
 *   Mixtral 8x7B         the sample's parameter count and active parameters per token from its
 *                        shapes, against the published 46.7e9 and 12.9e9
 *
 *   test_moe [NAME]      every case, or those whose name contains NAME */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bufplan.h"
#include "interp.h"
#include "opcost.h"
#include "partition.h"
#include "route.h"
#include "step.h"
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

int main(int argc, char **argv) {
  if (argc > 1) only = argv[1];
  test_route_by_hand();
  return ut_summary();
}
