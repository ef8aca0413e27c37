/* test_textbook.c: the plans shardc picks for the samples' layouts, per layer and microbatch,
 * against what the literature says each strategy needs (analysis/textbook.h). The figures are
 * derived here from the samples' shapes, never read off shardc's output:
 *
 *   GPT-3 175B (samples/gpt3_175b.shard, a100_1536 = [data: 12, stage: 16, model: 8]): 1536
 *   sequences in 128 microbatches = 12 per microbatch, 1 per data shard; an activation [1, 2048,
 *   12288] bf16 = 50,331,648 B. Full recomputation.
 *     ptd     Megatron TP: at most 6 AllReduces per layer (2 forward, 2 backward, 2 recomputed),
 *             each 2 x 7/8 x 50,331,648 = 88,080,384 B per device
 *     ptd_sp  Megatron-SP: at most 6 AllGathers and 6 ReduceScatters, each 7/8 x 50,331,648 =
 *             44,040,192 B; in all no more time than ptd's AllReduces (Korthikanti et al.)
 *     the pipeline: 16 stages, 15 boundaries, a send each way per microbatch: 30, each of
 *             50,331,648 / 8 = 6,291,456 B (the activation is replicated over model: each rank
 *             sends its eighth and the receivers all-gather, Narayanan et al.'s scatter-gather)
 *   LLaMA 3 405B pipeline (llama3_405b_pp.shard, pp_tp_sp on h100_14k = [data: 128, stage: 14,
 *   model: 8]): an activation [1, 8192, 16384] bf16 = 268,435,456 B; Megatron-SP: at most 6 + 6,
 *   each 7/8 x 268,435,456 = 234,881,024 B, and no AllToAll.
 *   LLaMA 3 8B (llama3_8b.shard, fsdp_tp on v5p_256 = [data: 64, model: 4], 2 microbatches): 512 /
 *   2 / 64 = 4 sequences of 8192 x 4096 bf16 = 268,435,456 B; Megatron TP at most 6 AllReduces of
 *   2 x 3/4 x 268,435,456 = 402,653,184 B; FSDP over data: 9 weights per layer, each gathered
 *   forward and again backward (18) and its gradient reduce-scattered (9).
 *   LLaMA 3 70B (llama3_70b.shard, fsdp_tp_sp on h100_512 = [data: 64, model: 8]): 8 sequences of
 *   8192 x 8192 per data shard, 1.07 GB of activation: Megatron-SP's 12 collectives of 7/8 of it
 *   per layer move more than gathering the layer's weights over model too, so the plan gathers the
 *   weights (FSDP over (data, model): 18 gathers, 9 scatters) and says why, with the factor. */
#include <stdio.h>
#include <string.h>

#include "diag.h"
#include "interp.h"
#include "sim.h"
#include "textbook.h"
#include "unit_test.h"

#ifndef SHARDC_SAMPLES
#define SHARDC_SAMPLES "samples"
#endif

typedef struct Loaded {
  InterpProgram ip;
  LayerCensus c;
  TextbookRow rows[TEXTBOOK_MAX_ROWS];
  int n;
  bool ok;
} Loaded;

static FILE *quiet;

static bool load(Loaded *L, const char *file, const char *mesh, const char *layout) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", SHARDC_SAMPLES, file);
  diag_reset();
  diag_configure(quiet, DIAG_MACHINE, false);
  memset(L, 0, sizeof *L);
  if (interp_load(&L->ip, path, NULL, 0, layout, mesh, NULL) != EXIT_OK || !L->ip.cp.ir) {
    ut_fail("%s does not load", file);
    return false;
  }
  L->ip.cp.ir->weigh.want = true; /* as explain and sim ask: the unbound plan weighed, never taken */
  if (!interp_partition(&L->ip)) {
    ut_fail("%s: the pass pipeline fails", file);
    return false;
  }
  layer_census(L->ip.cp.ir, L->ip.cp.prog->mesh, &L->c);
  L->n = textbook_compare(&L->ip.arena, L->ip.cp.ir, L->ip.cp.prog, &L->c, L->rows);
  return L->ok = true;
}

/* The row for a strategy (by the start of its name) and kind, or NULL. */
static const TextbookRow *row(const Loaded *L, const char *strategy, CollKind k) {
  for (int i = 0; i < L->n; i++)
    if (strncmp(L->rows[i].strategy, strategy, strlen(strategy)) == 0 && L->rows[i].kind == k) return &L->rows[i];
  return NULL;
}

static double activation_time(const LayerCensus *c) {
  double t = 0;
  for (int k = 0; k < CENSUS_KINDS; k++) t += c->time_s[ROLE_ACTIVATION][k];
  return t;
}

static void test_gpt3(void) {
  ut_begin("GPT-3 ptd: Megatron TP, at most 6 AllReduces of 2 x 7/8 x [1, 2048, 12288] bf16 per layer");
  Loaded tp, sp;
  double act = 1.0 * 2048 * 12288 * 2;
  if (load(&tp, "gpt3_175b.shard", "a100_1536", "ptd")) {
    const TextbookRow *r = row(&tp, "Megatron tensor parallelism", COLL_ALL_REDUCE);
    UT_CHECK(r != NULL, "no Megatron TP row");
    if (r) {
      UT_CHECK(r->got >= 5 && r->got <= 6, "%d AllReduces per layer, the book 5 or 6", r->got);
      ut_near("bytes per AllReduce", r->got_bytes, 2 * 7.0 / 8 * act, 1e-9);
    }
    UT_CHECK(tp.c.n[ROLE_ACTIVATION][COLL_ALL_GATHER] == 0 && tp.c.n[ROLE_ACTIVATION][COLL_ALL_TO_ALL] == 0,
             "activation gathers or all-to-alls under plain TP");
    const TextbookRow *p = row(&tp, "pipeline", COLL_PERMUTE);
    UT_CHECK(p && p->got == 30, "pipeline sends per microbatch: %d, the book 2 x 15", p ? p->got : -1);
    /* the activation is replicated over model: Megatron's scatter-gather sends 1/8 from each */
    if (p) ut_near("bytes per pipeline send", p->got_bytes, act / 8, 1e-9);
  }
  ut_end();
  /* The tied embedding's gradient: accumulated on the first and the last stage, then AllReduced
   * between those two alone. f32[vocab / 8, embed] = 6288 x 12288 x 4 = 309,067,776 B; a group of 2
   * sends 2 (2 - 1) / 2 = 1 x that, over the network (the stages sit on different nodes) at 25 GB/s
   * per GPU: 12.36 ms at peak. Priced over all 16 stages it would read 2 x 15/16 x V. */
  ut_begin("GPT-3 ptd: the tied embedding's gradient AllReduce between the first and last stage");
  if (tp.ok) {
    const Op *tied = NULL;
    for (const Op *op = tp.ip.cp.ir->main->first; op; op = op->next)
      if (op->kind == OP_ALL_REDUCE && op->coll && op->coll->ngroup == 2) tied = op;
    UT_CHECK(tied != NULL, "no AllReduce between two stages");
    if (tied) {
      double v = 50304.0 / 8 * 12288 * 4;
      CollCost cc;
      double t = sim_collective_seconds(tp.ip.cp.prog->mesh, tied, true, &cc);
      ut_near("the gradient's bytes", sim_value_bytes(tied->operands[0]), v, 1e-12);
      ut_near("bytes per device", cc.bytes_per_device, v, 1e-12);
      ut_near("seconds at peak", t, v / 2.5e10, 1e-3);
    }
  }
  ut_end();
  ut_begin("GPT-3 ptd_sp: Megatron-SP, at most 6 + 6 of 7/8 x the activation, no more time than ptd");
  if (load(&sp, "gpt3_175b.shard", "a100_1536", "ptd_sp")) {
    for (int k = COLL_ALL_GATHER; k <= COLL_REDUCE_SCATTER; k++) {
      const TextbookRow *r = row(&sp, "Megatron sequence parallelism", (CollKind)k);
      UT_CHECK(r != NULL, "no Megatron-SP row for %s", coll_kind_name((CollKind)k));
      if (!r) continue;
      UT_CHECK(r->got >= 5 && r->got <= 6, "%d %s per layer, the book 5 or 6", r->got, coll_kind_name((CollKind)k));
      ut_near(coll_kind_name((CollKind)k), r->got_bytes, 7.0 / 8 * act, 1e-9);
    }
    UT_CHECK(sp.c.n[ROLE_ACTIVATION][COLL_ALL_REDUCE] == 0, "AllReduces of activations under SP");
    if (tp.ok)
      UT_CHECK(activation_time(&sp.c) <= activation_time(&tp.c) * (1 + 1e-9),
               "SP's activation collectives take %g s per layer, TP's %g s", activation_time(&sp.c),
               activation_time(&tp.c));
  }
  ut_end();
  if (tp.ok) interp_unload(&tp.ip);
  if (sp.ok) interp_unload(&sp.ip);
}

static void test_405b_pp(void) {
  ut_begin("LLaMA 3 405B pp_tp_sp: Megatron-SP's 6 + 6 per layer, no AllToAll");
  Loaded L;
  if (load(&L, "llama3_405b_pp.shard", NULL, "pp_tp_sp")) {
    double act = 1.0 * 8192 * 16384 * 2;
    for (int k = COLL_ALL_GATHER; k <= COLL_REDUCE_SCATTER; k++) {
      const TextbookRow *r = row(&L, "Megatron sequence parallelism", (CollKind)k);
      UT_CHECK(r && r->got >= 5 && r->got <= 6, "%d %s per layer, the book 5 or 6", r ? r->got : -1,
               coll_kind_name((CollKind)k));
      if (r) ut_near(coll_kind_name((CollKind)k), r->got_bytes, 7.0 / 8 * act, 1e-9);
    }
    UT_CHECK(L.c.n[ROLE_ACTIVATION][COLL_ALL_TO_ALL] == 0, "%d AllToAlls per layer",
             L.c.n[ROLE_ACTIVATION][COLL_ALL_TO_ALL]);
    UT_CHECK(L.c.n[ROLE_WEIGHT][COLL_ALL_GATHER] == 0, "%d weight gathers per layer: the layout's tensor parallelism "
             "keeps the weights sharded", L.c.n[ROLE_WEIGHT][COLL_ALL_GATHER]);
    interp_unload(&L.ip);
  }
  ut_end();
}

static void test_8b(void) {
  ut_begin("LLaMA 3 8B fsdp_tp: Megatron TP (6 AllReduces) and FSDP (2 gathers, 1 scatter per weight)");
  Loaded L;
  if (load(&L, "llama3_8b.shard", NULL, "fsdp_tp")) {
    const TextbookRow *r = row(&L, "Megatron tensor parallelism", COLL_ALL_REDUCE);
    UT_CHECK(r && r->got >= 5 && r->got <= 6, "%d AllReduces per layer", r ? r->got : -1);
    if (r) ut_near("bytes per AllReduce", r->got_bytes, 2 * 3.0 / 4 * (4.0 * 8192 * 4096 * 2), 1e-9);
    UT_CHECK(L.c.nweights == 9 && L.c.nweights_gathered == 9, "%d of %d weights sharded over data, the layer has 9",
             L.c.nweights_gathered, L.c.nweights);
    UT_CHECK(L.c.n[ROLE_WEIGHT][COLL_ALL_GATHER] == 18, "%d weight gathers per layer, the book 2 x 9",
             L.c.n[ROLE_WEIGHT][COLL_ALL_GATHER]);
    UT_CHECK(L.c.grad_scatters_dp == 9, "%d gradient scatters per layer, the book 9", L.c.grad_scatters_dp);
    interp_unload(&L.ip);
  }
  ut_end();
}

static void test_70b(void) {
  ut_begin("LLaMA 3 70B fsdp_tp_sp: Megatron-SP as the layout binds it, and the unbound plan's saving said");
  Loaded L;
  if (load(&L, "llama3_70b.shard", NULL, "fsdp_tp_sp")) {
    double act = 8.0 * 8192 * 8192 * 2; /* 8 sequences per data shard, [8, 8192, 8192] bf16 */
    for (int k = COLL_ALL_GATHER; k <= COLL_REDUCE_SCATTER; k++) {
      const TextbookRow *r = row(&L, "Megatron sequence parallelism", (CollKind)k);
      UT_CHECK(r && r->got >= 5 && r->got <= 6, "%d %s per layer, the book 5 or 6", r ? r->got : -1,
               coll_kind_name((CollKind)k));
      if (r) ut_near(coll_kind_name((CollKind)k), r->got_bytes, 7.0 / 8 * act, 1e-9);
    }
    /* FSDP over data alone: the weights keep their model shards (never gathered over model) */
    UT_CHECK(L.c.n[ROLE_WEIGHT][COLL_ALL_GATHER] == 18 && L.c.grad_scatters_dp == 9,
             "FSDP: %d gathers and %d scatters per layer, the book 18 and 9", L.c.n[ROLE_WEIGHT][COLL_ALL_GATHER],
             L.c.grad_scatters_dp);
    UT_CHECK(L.c.axes[ROLE_WEIGHT] == 1u, "the weights are gathered over axes %#x, not data alone",
             L.c.axes[ROLE_WEIGHT]);
    const struct LayoutWeigh *w = &L.ip.cp.ir->weigh;
    UT_CHECK(w->done && w->cheaper && w->free_s < w->bound_s && w->rule && w->nvalues > 0,
             "weighed %d cheaper %d: bound %g s, unbound %g s", w->done, w->cheaper, w->bound_s, w->free_s);
    interp_unload(&L.ip);
  }
  ut_end();
}

int main(void) {
  quiet = fopen("/dev/null", "w");
  test_gpt3();
  test_405b_pp();
  test_8b();
  test_70b();
  if (quiet) fclose(quiet);
  return ut_summary();
}
