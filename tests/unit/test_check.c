/* test_check.c: `shardc check`'s memory model (compiler/memory.c) against the book's figures.
 *
 * The programs are .shard files in tests/check/ and samples/, run through the real front half
 * (check_load: parse, sema, IR) and memory_estimate, on the meshes and layouts each case names.
 * Every expected figure is the book's ("How to Scale Your Model"), or arithmetic on a model's
 * published shape written out here, never a number copied from this program's output.
 * Prints PASS/FAIL per case and `N passed, N failed`; exits 1 on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "memory.h"
#include "unit_test.h"

#ifndef SHARDC_SOURCE_DIR
#define SHARDC_SOURCE_DIR "."
#endif

typedef struct Loaded {
  Arena arena;
  CheckedProgram cp;
  MemoryReport r;
  bool ok;
} Loaded;

/* Runs check's front half and memory model on a file of the repository. */
static void load(Loaded *L, const char *rel, const char *mesh, const char *layout, FILE *quiet) {
  static char path[1024];
  snprintf(path, sizeof path, "%s/%s", SHARDC_SOURCE_DIR, rel);
  Options o = {.argv0 = "test_check", .command = "check", .input = path, .mesh = mesh, .layout = layout};
  diag_reset();
  diag_configure(quiet, DIAG_MACHINE, false);
  arena_init(&L->arena);
  L->ok = check_load(&o, &L->arena, &L->cp) == EXIT_OK && L->cp.ir;
  if (!L->ok) {
    ut_fail("%s (mesh %s, layout %s) did not check", rel, mesh ? mesh : "default", layout ? layout : "default");
    return;
  }
  memory_estimate(L->cp.prog, L->cp.ir, &L->r);
}

static void unload(Loaded *L) { arena_free(&L->arena); }

int main(void) {
  FILE *quiet = fopen("/dev/null", "w");
  if (!quiet) quiet = stderr;
  Loaded L;

  /* LLaMA 3 70B: 80 layers, embed 8192, MLP 28672, 64 query heads, 8 KV heads, head 128, vocab
   * 128256, untied: about 70.6e9 params. */
  ut_begin("llama3_70b: about 70.6e9 params");
  load(&L, "samples/llama3_70b.shard", NULL, NULL, quiet);
  if (L.ok) ut_near("params", (double)L.r.param_count, 70.6e9, 0.005);
  unload(&L);
  ut_end();

  ut_begin("llama2_13b: about 13.0e9 params");
  load(&L, "tests/check/llama2_13b_params.shard", NULL, NULL, quiet);
  if (L.ok) ut_near("params", (double)L.r.param_count, 13.0e9, 0.005);
  unload(&L);
  ut_end();

  /* bf16 params and Adam without a master copy: ~140 GB of params and ~560 GB of optimizer state
   * in total (2 and 8 bytes per param). Pure data parallelism: every chip holds all of it, which
   * fits on no single chip (the largest HBM, b200's, is 192 GB). */
  static const char *one_chip[] = {"one_v4", "one_v5e", "one_v5p", "one_v6e",
                                   "one_a100", "one_h100", "one_h200", "one_b200"};
  for (size_t i = 0; i < sizeof one_chip / sizeof *one_chip; i++) {
    char name[128];
    snprintf(name, sizeof name, "llama3_70b bf16 + adam, pure DP on %s: 140 GB + 560 GB, does not fit", one_chip[i]);
    ut_begin(name);
    load(&L, "tests/check/llama3_70b_book.shard", one_chip[i], "dp", quiet);
    if (L.ok) {
      ut_near("param bytes in total", (double)L.r.param_bytes, 140e9, 0.02);
      ut_near("optimizer bytes in total", (double)L.r.optimizer * (double)L.r.devices, 560e9, 0.02);
      if (L.r.fits) ut_fail("pure DP of 70B fits on %s", one_chip[i]);
      if ((double)(L.r.params + L.r.optimizer) <= L.r.capacity)
        ut_fail("params + optimizer (%lld) fit in %s's HBM", (long long)(L.r.params + L.r.optimizer), one_chip[i]);
    }
    unload(&L);
    ut_end();
  }

  /* FSDP over 4096 v5p chips: (140 + 560) GB / 4096 = 171 MB per chip, under 200 MB. */
  ut_begin("llama3_70b FSDP over 4096 tpu_v5p chips: params + optimizer under 200 MB per chip");
  load(&L, "tests/check/llama3_70b_book.shard", "v5p_4096", "fsdp", quiet);
  if (L.ok) {
    double per = (double)(L.r.params + L.r.optimizer);
    if (per >= 200e6) ut_fail("params + optimizer per chip = %.4g B, want < 200 MB", per);
    ut_near("params + optimizer per chip", per, 700e9 / 4096, 0.02);
  }
  unload(&L);
  ut_end();

  /* FLOPs: a training step is 6 x params x tokens for the matmul params (forward 2, backward 4),
   * plus attention 12 B T^2 N H... with full remat the stacked blocks' forward runs again: 8N. */
  ut_begin("llama2_13b step FLOPs: about 6 N T plus attention, plus a block forward (2 N T) for full remat");
  load(&L, "tests/check/llama2_13b_params.shard", NULL, NULL, quiet);
  if (L.ok) {
    double tokens = 256.0 * 4096, layers = 40, embed = 5120, heads = 40, head = 128, seq = 4096;
    double vocab = 32000;
    double n_matmul = (double)L.r.param_count - 2 * vocab * embed - (2 * layers + 1) * embed; /* no embedding lookup, no norms */
    double attn = 12 * 256.0 * seq * seq * heads * head * layers;                             /* the book's 12 B T^2 N H, x layers */
    double model = 6 * (n_matmul + vocab * embed) * tokens + attn;                            /* unembed is a matmul */
    ut_near("model flops per step", L.r.model_flops_per_step, model, 0.01);
    /* recompute: each block's forward once more (its matmuls 2 N_blocks T, its attention 4 B T^2 N H per
     * layer), plus fused attention's scores again in the backward (2 B T^2 N H per layer). */
    double n_blocks = n_matmul;
    double recompute = 2 * n_blocks * tokens + 4 * 256.0 * seq * seq * heads * head * layers +
                       2 * 256.0 * seq * seq * heads * head * layers;
    ut_near("recomputation flops", L.r.recompute_flops, recompute, 0.01);
  }
  unload(&L);
  ut_end();

  /* FSDP by appending `embed: data` to data parallelism over (data, model): per device, one
   * sequence of 8192 tokens. Reduced per layer, the temporaries hold at most a layer's unreduced
   * gradient (0.856e9 params x 2 B = 1.7 GB), the f32 logits and their gradient (8192 x 128256 x 4 B
   * = 4.2 GB each) and a layer's recomputed activations; left unreduced until after the backward
   * loop they would hold every layer's: 68.5e9 x 2 B = 137 GB. */
  ut_begin("llama3_70b dp + `embed: data`: each layer's gradient reduced in the backward loop");
  load(&L, "tests/check/llama3_70b_fsdp_grads.shard", NULL, NULL, quiet);
  if (L.ok) {
    if ((double)L.r.temporaries > 1.7e9 + 2 * 4.2e9 + 6e9)
      ut_fail("temporaries %.4g B: more than a layer's gradient, the logits and their gradient, and a layer's "
              "recompute", (double)L.r.temporaries);
    if (!L.r.fits) ut_fail("does not fit: total %.4g B", (double)L.r.total);
  }
  unload(&L);
  ut_end();

  /* Remat on a stack of MLP blocks: N = 2 x embed x hidden matmul params per layer.
   * none: 6 N per token; full: 8 N (one more forward); dots: no matmul recomputed.
   * Activations kept per layer and device (batch/4 x seq rows, bf16), what each backward reads:
   * none keeps x (for w_in's gradient), x @ w_in (gelu's gradient) and gelu's output (w_out's
   * gradient); full keeps only x, the block input; dots keeps x and x @ w_in, the contraction
   * outputs some gradient reads (the second contraction's output feeds only the residual add,
   * whose gradient reads nothing). */
  {
    static const struct { RematKind k; const char *name; double flops_ratio; } pol[] = {
        {REMAT_NONE, "none", 6}, {REMAT_FULL, "full", 8}, {REMAT_DOTS, "dots", 6}};
    double rows = 32.0 / 4 * 512, embed = 1024, hidden_local = 4096.0 / 2, layers = 8;
    double tokens = 32.0 * 512, n = 2 * 1024.0 * 4096 * layers;
    double act[3] = {
        layers * rows * (embed + 2 * hidden_local) * 2,          /* none: x, x@w_in, gelu(x@w_in) */
        layers * rows * embed * 2,                               /* full: x */
        layers * rows * (embed + hidden_local) * 2,              /* dots: x, x@w_in */
    };
    for (int i = 0; i < 3; i++) {
      char name[160];
      snprintf(name, sizeof name, "stacked MLP, remat = %s: %.0fN FLOPs per token, its activations", pol[i].name,
               pol[i].flops_ratio);
      ut_begin(name);
      load(&L, "tests/check/stacked_mlp.shard", NULL, NULL, quiet);
      if (L.ok) {
        L.cp.prog->step->remat = pol[i].k;
        IrModule *m = check_build_ir(&L.arena, L.cp.prog);
        if (m) memory_estimate(L.cp.prog, m, &L.r);
        else ut_fail("the step with remat = %s did not build", pol[i].name);
        ut_near("step flops", L.r.flops_per_step, pol[i].flops_ratio * n * tokens, 0.001);
        ut_near("model flops", L.r.model_flops_per_step, 6 * n * tokens, 0.001);
        /* the activations live at the plan's peak, in the layers' backward: every layer's residuals.
         * (mse's gradient reads y - labels, an f32 [batch/4, seq, embed] the forward saves, but the
         * loss's gradient is made before the layers' backward starts: it is dead by the peak.) */
        ut_near("activations", (double)L.r.activations, act[i], 0.001);
      }
      unload(&L);
      ut_end();
    }
  }

  if (quiet != stderr) fclose(quiet);
  return ut_summary();
}
