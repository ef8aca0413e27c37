/* test_memory.c: check's memory figures, read off the buffer plan (compiler/analysis/bufplan.h),
 * against hand derivations: a pipeline's activations per schedule and stage, its params per
 * stage, FSDP's gathered weights, a renamed view kept once, a gradient held once.
 *
 * Programs: the .shard files of tests/unit/memory/, loaded as `shardc check` loads them (interp_load: parse,
 * sema, the step's IR), then the pass pipeline and memory_estimate. Every expected figure is
 * written out below from the program's dims; none is copied from this program's output.
 * Prints PASS/FAIL per case and `N passed, N failed`; exits 1 on any failure. */
#include <stdio.h>
#include <string.h>

#include "bufplan.h"
#include "diag.h"
#include "interp.h"
#include "memory.h"
#include "step.h"
#include "unit_test.h"

#ifndef MEMORY_TEST_DIR
#define MEMORY_TEST_DIR "tests/unit/memory"
#endif

static FILE *quiet;

/* Loads a program (mesh, layout, entry as given; NULL: the defaults) and runs the pass pipeline and
 * the memory model, with one schedule override (1 + ScheduleKind, 0: as written). */
static bool load(InterpProgram *ip, MemoryReport *r, const char *file, const char *const *defs, int ndefs,
                 const char *entry, int schedule, int interleave) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", MEMORY_TEST_DIR, file);
  diag_reset();
  diag_configure(quiet, DIAG_MACHINE, false);
  if (interp_load(ip, path, defs, ndefs, NULL, NULL, entry) != EXIT_OK || !ip->cp.ir) {
    ut_fail("%s does not load", file);
    return false;
  }
  if (schedule && ip->cp.prog->step) {
    ip->cp.prog->step->schedule = (ScheduleKind)(schedule - 1);
    ip->cp.prog->step->interleave = interleave;
  }
  if (!interp_partition(ip)) {
    ut_fail("%s: the pass pipeline fails", file);
    return false;
  }
  memory_estimate(ip->cp.prog, ip->cp.ir, r);
  return true;
}

/* ---- a pipeline: activations per schedule and stage, params per stage ----
 *
 * pipe_lm.shard: batch 32 over data 2, 8 microbatches, seq 16, embed 64, hidden 256, vocab 512,
 * 8 layers over 4 stages, remat = full. A block keeps its input for the backward: per microbatch
 * and layer, rows = 32 / 8 / 2 x 16 = 32 rows of embed 64 in bf16 = 4096 bytes. A chunk holds
 * Lc = 8 / (4 V) layers. In flight on stage s (schedule.h; Narayanan et al. 2021; Korthikanti et
 * al. 2022): gpipe N = 8 chunks; 1f1b min(p - s, N); interleaved(2) with N != p, (p - s - 1) 2 +
 * (V - 1) p warm-up forwards then one more before the first backward: 11 - 2s chunks of Lc = 1
 * layer (on the first stage (1 + (p - 1) / (p V)) p = 5.5 stage-loads of 2 chunks: 11). The peak
 * of each stage is during its first backward, with that many chunks' residuals live. */
static void test_pipeline_activations(void) {
  static const char *defs[] = {"batch=32"};
  const double row_bytes = 32.0 * 64 * 2; /* one layer, one microbatch, one device */
  const int p = 4, N = 8;
  static const struct { int kind, V; const char *name; } sched[] = {
      {SCHED_GPIPE, 1, "gpipe"}, {SCHED_1F1B, 1, "1f1b"}, {SCHED_INTERLEAVED, 2, "interleaved(2)"}};
  for (size_t k = 0; k < 3; k++) {
    char name[96];
    snprintf(name, sizeof name, "pipeline activations per stage, %s", sched[k].name);
    ut_begin(name);
    InterpProgram ip;
    MemoryReport r;
    if (load(&ip, &r, "pipe_lm.shard", defs, 1, NULL, 1 + sched[k].kind, sched[k].V)) {
      UT_CHECK(r.nstages == p, "%d stages reported, expected %d", r.nstages, p);
      int V = sched[k].V;
      double chunk = (8.0 / (p * V)) * row_bytes;
      for (int s = 0; s < r.nstages && s < p; s++) {
        int in_flight = sched[k].kind == SCHED_GPIPE ? N
                        : sched[k].kind == SCHED_1F1B ? (p - s < N ? p - s : N)
                                                      : (p - s - 1) * 2 + (V - 1) * p + 1;
        UT_CHECK(r.stages[s].in_flight == in_flight, "stage %d: %d chunks in flight, expected %d", s,
                 r.stages[s].in_flight, in_flight);
        /* the last stage's peak also holds the loss's saved logits (its own region): at least */
        if (s < p - 1)
          ut_near(arena_printf(&ip.arena, "stage %d activations", s), (double)r.stages[s].activations,
                  in_flight * chunk, 0);
        else
          UT_CHECK((double)r.stages[s].activations >= in_flight * chunk, "last stage: %lld bytes of activations",
                   (long long)r.stages[s].activations);
      }
    }
    interp_unload(&ip);
    ut_end();
  }
}

/* Params per stage: a stage holds its 2 layers' w_in and w_out (2 x 2 x 64 x 256 x 2 bytes =
 * 131072), the first also the embedding (512 x 64 x 2 = 65536), the last the unembedding (64 x
 * 512 x 2 = 65536); no stage holds what another stage reads. sgd: no optimizer state. */
static void test_pipeline_params(void) {
  ut_begin("pipeline params per stage: the embedding on the first, the unembedding on the last");
  InterpProgram ip;
  MemoryReport r;
  if (load(&ip, &r, "pipe_lm.shard", NULL, 0, NULL, 0, 0)) {
    double layers = 2.0 * 2 * 64 * 256 * 2, table = 512.0 * 64 * 2;
    for (int s = 0; s < r.nstages; s++) {
      double want = layers + (s == 0 ? table : 0) + (s == r.nstages - 1 ? table : 0);
      ut_near(arena_printf(&ip.arena, "stage %d params", s), (double)r.stages[s].params, want, 0);
      UT_CHECK(r.stages[s].optimizer == 0, "stage %d: optimizer state under sgd", s);
    }
    /* per_device is the stage with the largest total */
    int64_t worst = 0;
    for (int s = 0; s < r.nstages; s++)
      if (r.stages[s].total > worst) worst = r.stages[s].total;
    UT_CHECK(r.total == worst, "per_device total %lld, the largest stage's %lld", (long long)r.total, (long long)worst);
  }
  interp_unload(&ip);
  ut_end();
}

/* ---- FSDP: one layer's gathered weights at a time ----
 *
 * fsdp_stack.shard, a forward: x bf16[16, 32, 128] with batch over data 4, 4 layers of w_in
 * [128, 512] and w_out [512, 128] with embed over data. Per device: rows = 16 / 4 x 32 = 128.
 *   X  = 128 x 128 x 2 = 32768    (x, the block's output)
 *   Hh = 128 x 512 x 2 = 131072   (x @ w_in, gelu of it in place)
 *   W  = 128 x 512 x 2 = 131072   (one weight, gathered)
 *   P  = 4 layers x 2 weights x 128 x 512 x 2 / 4 = 262144   (the params, sharded)
 * Both gathers are far below the bucket cap (bucket.h), so a layer gathers w_in and w_out as one
 * bucket, as FSDP gathers a wrapped layer: both are live when x @ w_in is made (2W + Hh), then
 * w_in is freed, gelu runs in place, and the second contraction holds Hh + W + X. The body's peak
 * is 2W + Hh; around the loop the input x and the loop's result (a buffer of its own: an input is
 * the caller's). Peak: P + 2X + 2W + Hh, never more than one layer's weights. */
static void test_fsdp(void) {
  ut_begin("fsdp: the gathered weights of the layer being run, one bucket at a time");
  InterpProgram ip;
  MemoryReport r;
  if (load(&ip, &r, "fsdp_stack.shard", NULL, 0, NULL, 0, 0)) {
    double X = 128.0 * 128 * 2, Hh = 128.0 * 512 * 2, W = 128.0 * 512 * 2, P = 4.0 * 2 * 128 * 512 * 2 / 4;
    ut_near("params", (double)r.params, P, 0);
    ut_near("temporaries", (double)r.temporaries, 2 * X + 2 * W + Hh, 0);
    ut_near("total", (double)r.total, P + 2 * X + 2 * W + Hh, 0);
  }
  interp_unload(&ip);
  ut_end();
}

/* ---- remat = none: a renamed view is one residual ----
 *
 * rename_view.shard: per layer the block reads x, s = x . x[seq -> kseq], o = s . x[seq -> kseq].
 * The backward keeps x (the block's input; its rename is made again in the backward), s and o:
 * 3 stacked residuals, not 4. Per device: rows = 16 / 4 x 32 = 128; x, o: 128 x 64 x 2 = 16384;
 * s: 4 x 32 x 32 x 2 = 8192. 4 layers: 4 x (16384 + 16384 + 8192) = 163840. The peak is at the
 * loss, where mse's f32 y - labels (128 x 64 x 4 = 32768, saved for its gradient) is live too. */
static void test_rename_view(void) {
  ut_begin("remat = none: x and x[seq -> kseq] are one residual");
  InterpProgram ip;
  MemoryReport r;
  if (load(&ip, &r, "rename_view.shard", NULL, 0, NULL, 0, 0)) {
    const Op *fwd = NULL;
    for (const Op *op = ip.cp.ir->main->first; op && !fwd; op = op->next)
      if (op->kind == OP_LOOP && !op->reverse) fwd = op;
    UT_CHECK(fwd && fwd->nstacked == 3, "the forward loop stacks %d residuals, expected 3 (x, s, o)",
             fwd ? fwd->nstacked : -1);
    ut_near("activations", (double)r.activations, 4 * (16384.0 + 16384 + 8192) + 32768, 0);
  }
  interp_unload(&ip);
  ut_end();
}

/* ---- a gradient is held once ----
 * A step gives each gradient a value of its own with the param's written type (step.c's
 * own_value): a transpose that keeps the dim order. The plan makes it a view of what it copies, so
 * the gradient has one buffer. */
static void test_grads_once(void) {
  ut_begin("a gradient's copy with the param's written type is a view: held once");
  InterpProgram ip;
  MemoryReport r;
  if (load(&ip, &r, "rename_view.shard", NULL, 0, NULL, 0, 0)) {
    BufPlan bp;
    bufplan_build(&ip.arena, ip.cp.ir, ip.cp.prog, &bp);
    const StepInfo *si = ip.cp.ir->step;
    int views = 0;
    for (int i = 0; si && i < si->nparams; i++) {
      const Value *g = si->params[i].grad;
      if (!g->def || g->def->kind != OP_TRANSPOSE) continue;
      views++;
      const Value *src = g->def->operands[0];
      UT_CHECK(bp.root[g->id] == bp.root[src->id], "grad %s has a buffer of its own (root %d, its source's %d)",
               g->name ? g->name : "?", bp.root[g->id], bp.root[src->id]);
    }
    UT_CHECK(views > 0, "no gradient was a copy: the case tests nothing");
  }
  interp_unload(&ip);
  ut_end();
}

int main(void) {
  quiet = fopen("/dev/null", "w");
  if (!quiet) quiet = stderr;
  test_pipeline_activations();
  test_pipeline_params();
  test_fsdp();
  test_rename_view();
  test_grads_once();
  if (quiet != stderr) fclose(quiet);
  return ut_summary();
}
