/* test_step_spmd.c: a sharded training step computes what the unsharded step computes.
 *
 * Each case loads a program's `train` step (step_build: forward, loss, backward, optimizer update),
 * evaluates it globally in the reference interpreter (every value whole), then propagates and
 * partitions it for a mesh and layout and evaluates it device by device (interp_run_spmd: each
 * device holds its blocks, collectives exchange them, and every op checks that it computed the
 * block and the partial sums its sharding says). Every output -- the loss, each updated param,
 * each updated optimizer moment -- must agree within 1e-4 of the reference's scale (f32).
 *
 * Beyond the numbers, each case states what the book says the step's collectives are (the
 * phases of docs/training.md): data parallelism all-reduces the gradients, FSDP gathers weights
 * in the forward and again in the backward and reduce-scatters the gradients, tensor parallelism
 * mirrors its activation collectives in the backward, and a vocab-sharded cross entropy never
 * gathers the logits.
 *
 *   test_step_spmd                      every case
 *   test_step_spmd NAME                 the cases whose name contains NAME, with each output's error
 *   test_step_spmd FILE MESH LAYOUT [dim=N ...]
 *                                       one program, verbosely, with no claims about collectives (MESH
 *                                       may be inline: 'h100[x: 2]'; the differential tester's cases:
 *                                       tests/diff/TRIAGE.md) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interp.h"
#include "bucket.h"
#include "opcost.h"
#include "partition.h"
#include "step.h"
#include "unit_test.h"

#ifndef STEP_SPMD_DIR
#define STEP_SPMD_DIR "tests/unit/step_spmd"
#endif
#ifndef SHARDC_SAMPLES
#define SHARDC_SAMPLES "samples"
#endif
#ifndef STEP_MLP
#define STEP_MLP "tests/explain/step_mlp.shard"
#endif

#define TOLERANCE 1e-4
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static const char *only; /* argv[1]: run the matching cases, verbosely */

/* ---- counting collectives ---- */

/* Collectives by kind (OP_ALL_GATHER ..) and phase class (0 forward and loss, 1 backward, 2
 * optimizer), over f and its loop bodies, each counted once (not times its trips). */
typedef struct Census {
  int n[3][5];
  int logits_gathers; /* all_gathers of the cross entropy's logits over their class dim */
} Census;

static int coll_index(OpKind k) {
  switch (k) {
  case OP_ALL_GATHER: return 0;
  case OP_REDUCE_SCATTER: return 1;
  case OP_ALL_REDUCE: return 2;
  case OP_ALL_TO_ALL: return 3;
  case OP_PERMUTE: return 4;
  default: return -1;
  }
}

static int phase_class(int ph) {
  if (ph == PHASE_FORWARD || ph == PHASE_LOSS) return 0;
  return ph == PHASE_UPDATE ? 2 : 1;
}

static void census(const IrFunc *f, const TensorType *logits, Census *c) {
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_LOOP && op->body) census(op->body, logits, c);
    for (int r = 0; op->kind == OP_PIPELINE && r < PR__COUNT; r++)
      if (op->pipe->region[r]) census(op->pipe->region[r], logits, c);
    int k = coll_index(op->kind);
    if (k < 0) continue;
    c->n[phase_class(op->phase)][k]++;
    const TensorType *t = &op->results[0]->type;
    int d = logits ? tensor_type_find(t, logits->dims[logits->rank - 1]) : -1;
    if (op->kind == OP_ALL_GATHER && d >= 0 && tensor_type_same_dims(t, logits) &&
        op->results[0]->sharding.naxes[d] < op->operands[0]->sharding.naxes[d])
      c->logits_gathers++;
  }
}

/* The type of the logits the step's cross_entropy reads (its class dim last), if it has one. */
static const TensorType *logits_type(const IrFunc *f) {
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_CROSS_ENTROPY && op->noperands > 0) return &op->operands[0]->type;
    if (op->kind == OP_LOOP && op->body) {
      const TensorType *t = logits_type(op->body);
      if (t) return t;
    }
  }
  return NULL;
}

/* Collectives over the mesh axis `axis` by kind, [0] inside the microbatch loop's body (at any
 * depth), [1] outside it. */
static void census_axis(const IrModule *m, const IrFunc *f, int axis, bool in_micro, int n[2][5], int runs[2][5]) {
  int bucket = 0;
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_LOOP && op->body)
      census_axis(m, op->body, axis, in_micro || (m->step && op == m->step->micro_loop), n, runs);
    int k = coll_index(op->kind);
    if (k < 0 || !(op->axes & (1u << axis))) continue;
    n[in_micro ? 0 : 1][k]++;
    if (!op->bucket || op->bucket != bucket) runs[in_micro ? 0 : 1][k]++; /* a bucket runs once */
    bucket = op->bucket;
  }
}

/* The runs the gradients' (or params') collectives make when buckets (bucket.h) fuse those below
 * the cap: per dtype, one run for each at or above it, and one for all the smaller ones (the
 * claim holds when those fit one bucket: -1 otherwise). `f32`: every one moves in f32 (zero = 2's
 * reductions into the f32 accumulators), else in its param's dtype. */
static int bucketed_runs(const IrModule *m, const Mesh *mesh, bool f32) {
  int runs = 0;
  for (int dt = 0; dt < DT__COUNT; dt++) {
    int64_t small = 0;
    for (int i = 0; i < m->step->nparams; i++) {
      const Value *v = m->step->params[i].value;
      if ((f32 ? DT_F32 : (int)v->type.dtype) != dt) continue;
      int64_t b = sharding_local_bytes(&v->type, &v->sharding, mesh) / dtype_bytes(v->type.dtype) * (f32 ? 4 : dtype_bytes(v->type.dtype));
      if (b >= BUCKET_CAP_BYTES) runs++;
      else small += b;
    }
    if (small > BUCKET_CAP_BYTES) return -1;
    runs += small > 0;
  }
  return runs;
}

/* The gradient transformations of zero (ZeRO, Rajbhandari et al.) on a layout whose `data` axis
 * shards only the batch, so that every collective over it is a gradient's or the loss's. With P
 * params and two microbatches:
 *   zero = 0  nothing over data inside the microbatch loop (each device accumulates its unreduced
 *             gradients); after it P + 1 AllReduces (the gradients, the loss), nothing else
 *   zero = 1  nothing inside; after it P ReduceScatters onto the optimizer state's shard, P
 *             AllGathers of the updated params, 1 AllReduce (the loss): no gradient AllReduce
 *   zero = 2  P ReduceScatters inside (each microbatch's gradients into a sharded accumulator), no
 *             AllReduce there; after it P AllGathers and the loss's AllReduce */
static void check_zero(const IrModule *m, const Mesh *mesh, int zero) {
  int axis = mesh_axis_index(mesh, intern_cstr("data"));
  UT_CHECK(axis >= 0 && m->step && m->step->micro_loop, "the case needs a `data` axis and microbatches");
  if (axis < 0 || !m->step || !m->step->micro_loop) return;
  int n[2][5], runs[2][5];
  memset(n, 0, sizeof n);
  memset(runs, 0, sizeof runs);
  census_axis(m, m->main, axis, false, n, runs);
  int P = m->nparams;
  int want[2][5] = {{0}};
  want[1][2] = 1; /* the loss */
  if (zero == 0) want[1][2] += P;
  if (zero >= 1) want[1][0] = P;
  if (zero == 1) want[1][1] = P;
  if (zero == 2) want[0][1] = P;
  static const char *kinds[] = {"all_gathers", "reduce_scatters", "all_reduces", "all_to_alls", "permutes"};
  for (int w = 0; w < 2; w++)
    for (int k = 0; k < 5; k++)
      UT_CHECK(n[w][k] == want[w][k], "zero = %d: %d %s over data %s the microbatch loop, expected %d", zero, n[w][k],
               kinds[k], w ? "after" : "inside", want[w][k]);
  /* and in buckets: the P gradient collectives after the loop run as bucketed_runs() */
  int br = bucketed_runs(m, mesh, false), brf = bucketed_runs(m, mesh, zero == 2);
  UT_CHECK(br > 0 && brf > 0, "the small gradients do not fit one bucket: the claim needs another model");
  int k = zero == 0 ? 2 : 1, w = zero == 2 ? 0 : 1;
  int want_runs = brf + (k == 2); /* the loss's AllReduce runs on its own */
  UT_CHECK(runs[w][k] == want_runs, "zero = %d: %d runs of %s over data %s the microbatch loop, expected %d (buckets)",
           zero, runs[w][k], kinds[k], w ? "after" : "inside", want_runs);
  if (zero >= 1)
    UT_CHECK(runs[1][0] == br, "zero = %d: %d runs of all_gathers over data after the loop, expected %d (buckets)", zero,
             runs[1][0], br);
}

/* ---- the cases ---- */

/* What the book says about a case's collectives. `exact`: the collectives of the forward (with the
 * loss) and of the backward, as AllGather, ReduceScatter, AllReduce, AllToAll counts (each op once,
 * not times its trips); NULL: only the bounds below. */
typedef struct Expect {
  const int *exact;                                         /* [8]: forward AG RS AR A2A, backward ... */
  int fwd_gathers, bwd_gathers, bwd_scatters, bwd_reduces; /* at least this many */
  int max_bwd_gathers;                                      /* at most (-1: no claim) */
  bool no_logits_gather;
  int zero;             /* 1 + the step's zero: where its gradients are reduced over `data` (see
                           check_zero); 0: no claim */
} Expect;

typedef struct Case {
  const char *file;
  const char *const *defs;
  int ndefs;
  const char *mesh, *layout;
  Expect e;
  int schedule;         /* a pipeline's schedule in place of the file's: 1 + ScheduleKind (0: as written) */
  int interleave;       /* V for interleaved(V) */
} Case;

static const char *mlp_small[] = {"batch=8", "seq=4", "embed=16", "hidden=32"};
static const char *none[] = {"seq=4"};
static const char *step_small[] = {"batch=8", "seq=4", "embed=16", "hidden=32", "layers=2"};

static const char *output_name(const IrModule *m, int i) {
  const Value *v = m->main->outputs[i];
  return v && v->name ? v->name : "?";
}

static void run_case(const Case *c) {
  char name[256];
  const char *base = strrchr(c->file, '/') ? strrchr(c->file, '/') + 1 : c->file;
  static const char *const sched[] = {"", ".gpipe", ".1f1b", ".interleaved"};
  snprintf(name, sizeof name, "step.%.*s.%s.%s%s", (int)(strlen(base) - 6), base, c->mesh, c->layout, sched[c->schedule]);
  if (only && !strstr(name, only)) return;
  ut_begin(name);
  InterpProgram ip;
  if (interp_load(&ip, c->file, c->defs, c->ndefs, c->layout, c->mesh, NULL) != EXIT_OK || !ip.cp.ir) {
    ut_fail("%s does not load", c->file);
    ut_end();
    return;
  }
  IrModule *m = ip.cp.ir;
  UT_CHECK(m->step != NULL, "%s has no train step", c->file);
  if (c->schedule && ip.cp.prog->step) { /* read by the pipeline pass (interp_partition) */
    ip.cp.prog->step->schedule = (ScheduleKind)(c->schedule - 1);
    ip.cp.prog->step->interleave = c->interleave;
  }
  Tensor **in = interp_random_inputs(m, 11), **pa = interp_random_params(m, 11);
  int n = interp_noutputs(m);
  Tensor **ref = calloc((size_t)n, sizeof *ref);
  InterpOptions o = {.precision = INTERP_F32};
  InterpStats st;
  if (!m->step) {
  } else if (!interp_run(m, &o, in, pa, ref, &st)) {
    ut_fail("the global run fails: %s", st.error);
  } else if (!interp_partition(&ip)) {
    ut_fail("propagation and partitioning fail");
  } else {
    if (getenv("STEP_SPMD_DUMP")) ir_print(stdout, m);
    UT_CHECK(!c->schedule || m->pipeline, "the layout made no pipeline");
    InterpCheck chk;
    bool ran = interp_check_spmd(m, ip.cp.prog->mesh, &o, in, pa, ref, &chk);
    UT_CHECK(ran, "the SPMD run fails: %s", chk.stats.error);
    if (ran) {
      for (int i = 0; i < chk.noutputs; i++) {
        if (only) printf("    %-28s max rel %.3g, max abs %.3g\n", output_name(m, i), chk.max_rel[i], chk.max_abs[i]);
        UT_CHECK(chk.max_rel[i] <= TOLERANCE, "output %d (%s) differs from the unsharded step by %.3g (relative)", i,
                 output_name(m, i), chk.max_rel[i]);
      }
      UT_CHECK(chk.stats.replica_diff <= TOLERANCE, "replicated outputs differ between devices by %g",
               chk.stats.replica_diff);
    }
    interp_check_free(&chk);
    Census cs;
    memset(&cs, 0, sizeof cs);
    census(m->main, logits_type(m->main), &cs);
    if (only)
      printf("    forward AG %d RS %d AR %d A2A %d; backward AG %d RS %d AR %d A2A %d; update AG %d RS %d AR %d\n",
             cs.n[0][0], cs.n[0][1], cs.n[0][2], cs.n[0][3], cs.n[1][0], cs.n[1][1], cs.n[1][2], cs.n[1][3], cs.n[2][0],
             cs.n[2][1], cs.n[2][2]);
    const Expect *e = &c->e;
    static const char *kinds[] = {"all_gathers", "reduce_scatters", "all_reduces", "all_to_alls"};
    for (int k = 0; e->exact && k < 8; k++)
      UT_CHECK(cs.n[k / 4][k % 4] == e->exact[k], "%d %s in the %s, expected %d", cs.n[k / 4][k % 4], kinds[k % 4],
               k < 4 ? "forward and loss" : "backward", e->exact[k]);
    UT_CHECK(cs.n[0][0] >= e->fwd_gathers, "%d all_gathers in the forward, expected at least %d", cs.n[0][0],
             e->fwd_gathers);
    UT_CHECK(cs.n[1][0] >= e->bwd_gathers, "%d all_gathers in the backward, expected at least %d", cs.n[1][0],
             e->bwd_gathers);
    UT_CHECK(e->max_bwd_gathers < 0 || cs.n[1][0] <= e->max_bwd_gathers,
             "%d all_gathers in the backward, expected at most %d", cs.n[1][0], e->max_bwd_gathers);
    UT_CHECK(cs.n[1][1] >= e->bwd_scatters, "%d reduce_scatters in the backward, expected at least %d", cs.n[1][1],
             e->bwd_scatters);
    UT_CHECK(cs.n[1][2] >= e->bwd_reduces, "%d all_reduces in the backward, expected at least %d", cs.n[1][2],
             e->bwd_reduces);
    if (e->zero) check_zero(m, ip.cp.prog->mesh, e->zero - 1);
    UT_CHECK(!e->no_logits_gather || cs.logits_gathers == 0, "the logits are gathered over their class dim (%d times)",
             cs.logits_gathers);
  }
  interp_free_tensors(in, interp_ninputs(m));
  interp_free_tensors(pa, m->nparams);
  interp_free_tensors(ref, n);
  interp_unload(&ip);
  ut_end();
}

int main(int argc, char **argv) {
  if (argc >= 4 && strstr(argv[1], ".shard")) { /* FILE MESH LAYOUT [dim=N ...] */
    only = "step.";
    Case c = {argv[1], (const char *const *)argv + 4, argc - 4, argv[2], argv[3], {.max_bwd_gathers = -1}, 0, 0};
    run_case(&c);
    return ut_summary();
  }
  if (argc > 1) only = argv[1];
  static const char *llama = STEP_SPMD_DIR "/llama_tiny.shard";
  static const char *llama_mb = STEP_SPMD_DIR "/llama_tiny_mb.shard";
  static const char *mlp = SHARDC_SAMPLES "/mlp.shard";
  static const char *gpt = STEP_SPMD_DIR "/gpt_tiny.shard";
  static const char *ring_causal = STEP_SPMD_DIR "/ring_causal.shard";
  static const char *ring_full = STEP_SPMD_DIR "/ring_full.shard";
  static const char *zero0 = STEP_SPMD_DIR "/llama_tiny_zero0.shard";
  static const char *zero1 = STEP_SPMD_DIR "/llama_tiny_zero1.shard";
  static const char *zero2 = STEP_SPMD_DIR "/llama_tiny_zero2.shard";
  static const char *pp_zero2 = STEP_SPMD_DIR "/llama_tiny_pp_zero2.shard";
  static const char *four_layers[] = {"seq=4", "layers=4"};
  static const char *step_mlp = STEP_MLP;
  const Case cases[] = {
    /* mlp on pod = [data: 4, model: 2] (x needs no gradient, so the backward reads w_out for dh
     * and not w_in; the loss's AllReduce counts with the forward):
     *   dp       gradients AllReduced over (data, model)
     *   fsdp     w_in, w_out gathered; w_out gathered again; both gradients reduce-scattered
     *   tp       the output's AllReduce over model (its type is replicated over model); the
     *            gradients AllReduced over data
     *   fsdp_tp  fsdp's gathers over data and tp's AllReduce; gradients reduce-scattered */
    {mlp, mlp_small, 4, "pod", "dp", {.exact = (const int[8]){0, 0, 1, 0, 0, 0, 2, 0}, .max_bwd_gathers = 0}, 0, 0},
    {mlp, mlp_small, 4, "pod", "fsdp", {.exact = (const int[8]){2, 0, 1, 0, 1, 2, 0, 0}, .max_bwd_gathers = -1}, 0, 0},
    {mlp, mlp_small, 4, "pod", "tp", {.exact = (const int[8]){0, 0, 2, 0, 0, 0, 2, 0}, .max_bwd_gathers = -1}, 0, 0},
    {mlp, mlp_small, 4, "pod", "fsdp_tp", {.exact = (const int[8]){2, 0, 2, 0, 1, 2, 0, 0}, .max_bwd_gathers = -1}, 0, 0},
    /* the stacked residual MLP of tests/explain/step_mlp.shard (the book's per-layer table there):
     * every layer's input needs its gradient, so the backward gathers both weights again under
     * FSDP and mirrors the forward's AllReduce under TP */
    {step_mlp, step_small, 5, "pod", "dp", {.exact = (const int[8]){0, 0, 1, 0, 0, 0, 2, 0}, .max_bwd_gathers = 0}, 0, 0},
    {step_mlp, step_small, 5, "pod", "fsdp", {.exact = (const int[8]){2, 0, 1, 0, 2, 2, 0, 0}, .max_bwd_gathers = -1}, 0, 0},
    {step_mlp, step_small, 5, "pod", "tp", {.exact = (const int[8]){0, 0, 2, 0, 0, 0, 3, 0}, .max_bwd_gathers = -1}, 0, 0},
    {step_mlp, step_small, 5, "pod", "fsdp_tp", {.exact = (const int[8]){2, 0, 2, 0, 2, 2, 1, 0}, .max_bwd_gathers = -1}, 0, 0},
    /* the tiny LLaMA */
    {llama, none, 1, "pod", "fsdp_tp", {.fwd_gathers = 1, .bwd_gathers = 1, .bwd_scatters = 1, .max_bwd_gathers = -1,
                                       .no_logits_gather = true}, 0, 0},
    {llama, none, 1, "pod", "fsdp_tp_sp", {.max_bwd_gathers = -1, .no_logits_gather = true}, 0, 0},
    {llama, none, 1, "pod", "dp", {.bwd_reduces = 1, .max_bwd_gathers = 0}, 0, 0},
    {llama, none, 1, "pod", "fsdp", {.fwd_gathers = 1, .bwd_gathers = 1, .bwd_scatters = 1, .max_bwd_gathers = -1}, 0, 0},
    {llama, none, 1, "pipe", "pp", {.max_bwd_gathers = -1}, 0, 0},
    /* two microbatches, full remat */
    {llama_mb, none, 1, "pod", "fsdp_tp", {.fwd_gathers = 1, .bwd_gathers = 1, .bwd_scatters = 1,
                                          .max_bwd_gathers = -1, .no_logits_gather = true}, 0, 0},
    {llama_mb, none, 1, "pod", "dp", {.bwd_reduces = 1, .max_bwd_gathers = 0}, 0, 0},
    {llama_mb, none, 1, "pipe", "pp", {.max_bwd_gathers = -1}, 0, 0},
    /* ring attention (language.md, Context parallelism) over 2, 4 and 8 devices, causal (in
     * zigzag order) and not: no gather of k or v anywhere; the forward's only collective is the
     * loss's AllReduce, the backward's the AllReduces of the 4 weight gradients (one bucket) */
    {ring_causal, NULL, 0, "ring2", "cp", {.exact = (const int[8]){0, 0, 1, 0, 0, 0, 4, 0}, .max_bwd_gathers = 0}, 0, 0},
    {ring_causal, NULL, 0, "ring4", "cp", {.exact = (const int[8]){0, 0, 1, 0, 0, 0, 4, 0}, .max_bwd_gathers = 0}, 0, 0},
    {ring_causal, NULL, 0, "ring8", "cp", {.exact = (const int[8]){0, 0, 1, 0, 0, 0, 4, 0}, .max_bwd_gathers = 0}, 0, 0},
    {ring_full, NULL, 0, "ring2", "cp", {.exact = (const int[8]){0, 0, 1, 0, 0, 0, 4, 0}, .max_bwd_gathers = 0}, 0, 0},
    {ring_full, NULL, 0, "ring4", "cp", {.exact = (const int[8]){0, 0, 1, 0, 0, 0, 4, 0}, .max_bwd_gathers = 0}, 0, 0},
    {ring_full, NULL, 0, "ring8", "cp", {.exact = (const int[8]){0, 0, 1, 0, 0, 0, 4, 0}, .max_bwd_gathers = 0}, 0, 0},
    /* zero = 0, 1, 2 on data and tensor parallelism (check_zero) */
    {zero0, none, 1, "pod", "dp_tp", {.max_bwd_gathers = -1, .no_logits_gather = true, .zero = 1}, 0, 0},
    {zero1, none, 1, "pod", "dp_tp", {.max_bwd_gathers = -1, .no_logits_gather = true, .zero = 2}, 0, 0},
    {zero2, none, 1, "pod", "dp_tp", {.max_bwd_gathers = -1, .no_logits_gather = true, .zero = 3}, 0, 0},
    /* zero = 2 under a pipeline: each stage's gradients reduce-scattered over data after the last
     * microbatch (issue 19) */
    {pp_zero2, none, 1, "pipe", "pp", {.max_bwd_gathers = -1}, 0, 0},
    {pp_zero2, none, 1, "pipe", "pp", {.max_bwd_gathers = -1}, 1 + SCHED_GPIPE, 1},
    /* the same pipeline under each schedule (interleaved(2): 4 layers, 2 chunks of 1 per stage) */
    {llama_mb, none, 1, "pipe", "pp", {.max_bwd_gathers = -1}, 1 + SCHED_GPIPE, 1},
    {llama_mb, none, 1, "pipe", "pp", {.max_bwd_gathers = -1}, 1 + SCHED_1F1B, 1},
    {llama_mb, four_layers, 2, "pipe", "pp", {.max_bwd_gathers = -1}, 1 + SCHED_INTERLEAVED, 2},
    /* a tied embedding on both ends of the pipeline */
    {gpt, none, 1, "pipe", "pp", {.max_bwd_gathers = -1}, 0, 0},
  };
  for (size_t i = 0; i < ARRAY_LEN(cases); i++) run_case(&cases[i]);
  /* the causal ring's zigzag balance: every device's query block keeps as many (query, key) pairs
   * unmasked. seq = 32 over n devices, chunks of c = 32 / 2n; device i holds chunks i and 2n-1-i:
   * its pairs are sum over both chunks of (logical index + 1) = c (i c + (c+1)/2) + c ((2n-1-i) c +
   * (c+1)/2) = c^2 (2n - 1) + c (c + 1), the same for every i. Contiguous blocks (device i holding
   * [i S/n, (i+1) S/n)) would give device n-1 the most, (2n-1)/1 times device 0's for large S. */
  static const char *ring_meshes[] = {"ring2", "ring4", "ring8"};
  for (int k = 0; k < 3; k++) {
    char name[64];
    snprintf(name, sizeof name, "ring.zigzag_balance.%s", ring_meshes[k]);
    if (only && !strstr(name, only)) continue;
    ut_begin(name);
    InterpProgram ip;
    if (interp_load(&ip, ring_causal, NULL, 0, "cp", ring_meshes[k], NULL) != EXIT_OK || !ip.cp.ir ||
        !interp_partition(&ip)) {
      ut_fail("%s does not load and partition", ring_causal);
    } else {
      const Op *att = NULL;
      for (const Op *op = ip.cp.ir->main->first; op && !att; op = op->next)
        if (op->kind == OP_ATTENTION) att = op;
      UT_CHECK(att && att->ring, "the attention is not a ring");
      int n = 2 << k;
      double c = 32.0 / (2 * n), want = c * c * (2 * n - 1) + c * (c + 1);
      for (int r = 0; att && r < n; r++)
        ut_near(arena_printf(&ip.arena, "pairs on device %d", r), opcost_ring_pairs(ip.cp.ir, att, r), want, 0);
      double first = 0, last = 0; /* the same blocks stored contiguously: unbalanced */
      for (int64_t p = 0; p < 32 / n; p++) first += p + 1, last += 32 - 32 / n + p + 1;
      UT_CHECK(last > first, "contiguous blocks would be balanced too (%g, %g): the test cannot fail", first, last);
    }
    interp_unload(&ip);
    ut_end();
  }
  /* the same claims at LLaMA 3 8B's sizes (propagated and partitioned, not run), where each
   * layer's gradient is large enough that reducing it once per microbatch shows in the time */
  static const char *llama8b[] = {"batch=512", "seq=8192", "embed=4096", "hidden=14336", "heads=32",
                                  "kv_heads=8", "head=128", "vocab=128256", "layers=32"};
  const char *zeros[] = {zero0, zero1, zero2};
  for (int z = 0; z < 3; z++) {
    char name[64];
    snprintf(name, sizeof name, "zero%d.at_8b_sizes", z);
    if (only && !strstr(name, only)) continue;
    ut_begin(name);
    InterpProgram ip;
    if (interp_load(&ip, zeros[z], llama8b, (int)ARRAY_LEN(llama8b), "dp_tp", "pod", NULL) != EXIT_OK || !ip.cp.ir) {
      ut_fail("%s does not load", zeros[z]);
    } else {
      UT_CHECK(interp_partition(&ip), "propagation and partitioning fail");
      check_zero(ip.cp.ir, ip.cp.prog->mesh, z);
      interp_unload(&ip);
    }
    ut_end();
  }
  return ut_summary();
}
