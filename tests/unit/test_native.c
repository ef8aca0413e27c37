/* test_native.c: the LLVM lowering (compiler/codegen) against the reference interpreter. Each case
 * loads a program, runs it in the interpreter globally (each value rounded to its dtype, as the
 * native code stores it), then lowers it twice -- globally, and per device after the pass pipeline
 * -- JIT-compiles both and runs them on the runtime (one thread per device), and compares every
 * output (for a train step: the loss, the updated params and optimizer state) with the
 * interpreter's. The expected values come from the interpreter, not from the lowering. A mutation
 * case perturbs one device's result and checks that the comparison catches it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "interp.h"
#include "lower.h"
#include "run_host.h"
#include "unit_test.h"

static FILE *diag_sink;

static void print_diags(void) {
  if (!diag_sink) return;
  rewind(diag_sink);
  char line[512];
  while (fgets(line, sizeof line, diag_sink)) printf("      %s", line);
}

/* Largest |a - b| over the largest |b|. */
static double rel_diff(const Tensor *a, const Tensor *b) {
  double d = 0, s = 0;
  for (int64_t i = 0; i < b->n; i++) {
    s = fmax(s, fabs(b->data[i]));
    double e = fabs(a->data[i] - b->data[i]);
    if (isnan(e)) e = INFINITY;
    d = fmax(d, e);
  }
  return s > 0 ? d / s : d;
}

static int run_and_compare(const char *what, const IrModule *m, const Mesh *mesh, void *fn, Tensor *const *in,
                           Tensor *const *pa, Tensor *const *ref, double tol, double perturb) {
  char err[512];
  RtConfig cfg = {.timeout_s = 20};
  RunSide *s = run_side_open(m, mesh, (RtEntry)fn, &cfg, err, sizeof err);
  int bad = 0;
  if (!s || !run_side_fill(s, in, pa, NULL, NULL, 0, err, sizeof err) || !run_side_step(s, err, sizeof err)) {
    ut_fail("%s: %s", what, err);
    run_side_close(s);
    return 1;
  }
  if (perturb != 0) run_side_perturb(s, 0, perturb);
  for (int j = 0; j < interp_noutputs(m); j++) {
    Tensor *got = run_side_output(s, j);
    double r = got ? rel_diff(got, ref[j]) : INFINITY;
    if (!(r <= tol)) {
      bad++;
      if (getenv("NATIVE_VERBOSE"))
        for (int64_t e = 0; e < got->n && e < 8; e++) printf("      [%lld] native %.6g interpreter %.6g\n", (long long)e, got->data[e], ref[j]->data[e]);
      if (perturb == 0) ut_fail("%s: output %d differs from the interpreter by %g (relative to its largest value; tolerance %g)", what, j, r, tol);
    }
    tensor_free(got);
  }
  run_side_close(s);
  return bad;
}

/* path under layout/mesh (entry NULL: the train step); tol relative to each output's largest value. */
static void native_case(const char *path, const char *const *defs, int ndefs, const char *layout, const char *mesh, const char *entry,
                        double tol, bool mutate) {
  char what[256];
  snprintf(what, sizeof what, "native.%s.%s.%s%s%s", strrchr(path, '/') + 1, mesh ? mesh : "default", layout ? layout : "default",
           entry ? "" : ".step", mutate ? ".mutation" : "");
  ut_begin(what);
  diag_reset();
  if (diag_sink) fclose(diag_sink);
  diag_sink = tmpfile();
  diag_configure(diag_sink ? diag_sink : stderr, DIAG_TEXT, false);
  InterpProgram ip;
  if (interp_load(&ip, path, defs, ndefs, layout, mesh, entry) != 0 || !ip.cp.ir) {
    ut_fail("%s did not load", path);
    print_diags();
    ut_end();
    return;
  }
  IrModule *m = ip.cp.ir;
  Tensor **in = interp_random_inputs(m, 7), **pa = interp_random_params(m, 7);
  int n = interp_noutputs(m);
  Tensor **ref = calloc((size_t)n, sizeof *ref);
  InterpStats st;
  InterpOptions o = {.precision = INTERP_DTYPE};
  Lowered *lw = lower_new();
  char err[512];
  void *fns[2] = {0};
  const char *names[2] = {"global", "device"};
  if (!interp_run(m, &o, in, pa, ref, &st)) ut_fail("interpreter: %s", st.error);
  else if (!lower_function(lw, m, NULL, "global")) ut_fail("global lowering failed"), print_diags();
  else if (!interp_partition(&ip)) ut_fail("partitioning failed");
  else if (!lower_function(lw, m, ip.cp.prog->mesh, "device")) ut_fail("per-device lowering failed"), print_diags();
  else if (!lower_finish(lw, err, sizeof err) || !lower_jit(lw, names, 2, fns, err, sizeof err)) ut_fail("%s", err);
  else if (!mutate) {
    run_and_compare("one device", m, NULL, fns[0], in, pa, ref, tol, 0);
    run_and_compare("sharded", m, ip.cp.prog->mesh, fns[1], in, pa, ref, tol, 0);
  } else {
    int bad = run_and_compare("sharded, perturbed", m, ip.cp.prog->mesh, fns[1], in, pa, ref, tol, 1.0);
    UT_CHECK(bad > 0, "adding 1 to one device's first output element went unnoticed");
  }
  lower_free(lw);
  interp_free_tensors(in, interp_ninputs(m));
  interp_free_tensors(pa, m->nparams);
  interp_free_tensors(ref, n);
  interp_unload(&ip);
  source_free_all();
  intern_reset();
  ut_end();
}

/* The runtime's structs as the lowering lays them out (runtime/rt_api.def, LLVM's data layout for
 * the host) against the C compiler's offsets and sizes, field by field. */
static void test_rt_layouts(void) {
  ut_begin("rt_api.def: every struct the lowering builds has C's layout (LLVM's offsets and sizes = offsetof, sizeof)");
  char err[256];
  UT_CHECK(lower_rt_check_layouts(err, sizeof err), "%s", err);
  ut_end();
}

int main(int argc, char **argv) {
  if (argc >= 3) { /* one case: test_native FILE LAYOUT [ENTRY] (no entry: the train step) */
    native_case(argv[1], NULL, 0, argv[2][0] ? argv[2] : NULL, NULL, argc > 3 ? argv[3] : NULL, 2e-2, false);
    return ut_summary();
  }
  test_rt_layouts();
  const char *ops = NATIVE_TEST_DIR "/ops.shard";
  const char *mlp_mb = INTERP_TEST_DIR "/mlp_sgd_mb.shard";
  const char *mlp = SHARDC_SAMPLES "/mlp.shard";
  /* forward: elementwise, reductions, broadcasts, casts, contractions (bf16 and f32) */
  const char *ops_layouts[] = {"tp", "fsdp", "dp"};
  for (int i = 0; i < 3; i++) {
    native_case(ops, NULL, 0, ops_layouts[i], NULL, "ops.forward", 2e-2, false);
    native_case(ops, NULL, 0, ops_layouts[i], NULL, NULL, 2e-2, false);
  }
  native_case(ops, NULL, 0, "tp", NULL, "ops.forward", 2e-2, true);
  /* train steps: sgd with two microbatches (a loop), adam (moments, master copy) */
  const char *mb_layouts[] = {"fsdp_tp", "dp", "tp"};
  for (int i = 0; i < 3; i++) native_case(mlp_mb, NULL, 0, mb_layouts[i], NULL, NULL, 2e-2, false);
  const char *small[] = {"batch=8", "seq=4", "embed=16", "hidden=32"};
  const char *mlp_layouts[] = {"fsdp_tp", "dp", "fsdp", "tp"};
  for (int i = 0; i < 4; i++) {
    native_case(mlp, small, 4, mlp_layouts[i], NULL, "mlp.forward", 2e-2, false);
    native_case(mlp, small, 4, mlp_layouts[i], NULL, NULL, 2e-2, false);
  }
  /* a LLaMA: take (vocab-parallel under vocab_tp), rmsnorm, fused grouped attention, silu, stacked
   * layers (a loop); the step: cross entropy (vocab-parallel: pick, onehot), two microbatches, full
   * remat, every gradient kernel, adam */
  const char *llama = INTERP_TEST_DIR "/llama_small.shard";
  const char *llama_layouts[] = {"fsdp_tp", "fsdp_tp_sp", "vocab_tp"};
  for (int i = 0; i < 3; i++) {
    native_case(llama, NULL, 0, llama_layouts[i], NULL, "llama.forward", 2e-2, false);
    native_case(llama, NULL, 0, llama_layouts[i], NULL, NULL, 2e-2, false);
  }
  /* mixture of experts: route, dispatch and combine as dense products, the AllToAlls of expert
   * parallelism, route_grad. Only layouts whose sums are not split: with bf16 partial sums (tp_sp)
   * the rounding can flip a top-k choice, a discontinuity no tolerance covers (docs/run.md). */
  const char *moe = MOE_TEST_DIR "/mixtral_tiny.shard", *layer = MOE_TEST_DIR "/moe_layer.shard";
  native_case(moe, NULL, 0, "ep", NULL, "mixtral.forward", 2e-2, false);
  native_case(moe, NULL, 0, "ep", NULL, NULL, 2e-2, false);
  native_case(layer, NULL, 0, "ep", NULL, NULL, 2e-2, false);
  native_case(layer, NULL, 0, "dp", NULL, NULL, 2e-2, false);
  /* ring attention (context parallelism, runtime/nn_ring.c): the sequence over ctx, K/V round the
   * ring; causal in zigzag order (the host loads and reads the blocks in it) and full, forward and
   * train step (dq, dk, dv by the lse-based backward) on rings of 2, 4 and 8; grouped queries in
   * f32 at sgd's lr 100, where the updated params show the gradients; a perturbed device */
  const char *ring_causal = STEP_SPMD_DIR "/ring_causal.shard", *ring_full = STEP_SPMD_DIR "/ring_full.shard";
  const char *gqa_causal = NATIVE_TEST_DIR "/ring_f32_causal.shard", *gqa_full = NATIVE_TEST_DIR "/ring_f32_full.shard";
  const char *rings[] = {"ring2", "ring4", "ring8"};
  for (int i = 0; i < 3; i++) {
    native_case(ring_causal, NULL, 0, "cp", rings[i], "causal_net.forward", 2e-2, false);
    native_case(ring_causal, NULL, 0, "cp", rings[i], NULL, 2e-2, false);
    native_case(ring_full, NULL, 0, "cp", rings[i], "full_net.forward", 2e-2, false);
    native_case(ring_full, NULL, 0, "cp", rings[i], NULL, 2e-2, false);
    native_case(gqa_causal, NULL, 0, "cp", rings[i], NULL, 1e-4, false);
    native_case(gqa_full, NULL, 0, "cp", rings[i], NULL, 1e-4, false);
  }
  native_case(ring_causal, NULL, 0, "cp", "ring4", NULL, 2e-2, true);
  /* the long-context LLaMA's model and layout (rings inside stacked layers, full remat, tensor
   * parallelism over model) on ctx 2 x model 2 and ctx 4 */
  const char *llama_long = NATIVE_TEST_DIR "/llama_long_small.shard";
  const char *ctx_meshes[] = {"ctx2", "ctx4"};
  for (int i = 0; i < 2; i++) {
    native_case(llama_long, NULL, 0, NULL, ctx_meshes[i], "llama.forward", 2e-2, false);
    native_case(llama_long, NULL, 0, NULL, ctx_meshes[i], NULL, 2e-2, false);
  }
  /* pipelines (layers@stage, tensor parallel within a stage): the train step under each schedule
   * (rt_pipeline running the IR's per-stage action lists, interleaved(2) with its stacked dims in
   * storage order), 2 and 4 stages; and a perturbed device on a pipeline must be caught */
  const char *pipes[] = {NATIVE_TEST_DIR "/pipe/pipe_gpipe.shard", NATIVE_TEST_DIR "/pipe/pipe_1f1b.shard",
                         NATIVE_TEST_DIR "/pipe/pipe_interleaved.shard"};
  static const char *four_stages[] = {"layers=8"};
  for (int i = 0; i < 3; i++) native_case(pipes[i], NULL, 0, "pp", NULL, NULL, 2e-2, false);
  for (int i = 0; i < 3; i++) native_case(pipes[i], four_stages, 1, "pp", "pipe4", NULL, 2e-2, false);
  native_case(pipes[1], NULL, 0, "pp", NULL, NULL, 2e-2, true);
  return ut_summary();
}
