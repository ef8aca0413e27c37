/* memory.c: memory fit per device, FLOPs per step, and suggestions (see memory.h).
 *
 * The figures are the buffer plan's (bufplan.h): `total` is its peak on the device that needs most
 * (under a pipeline, each stage's device: per_stage), and the other keys split that peak by class:
 *   params       the params the device holds (a param read on one pipeline stage only is held
 *                there alone); an updated param is written over its param
 *   grads        a param's gradient from its last reduction to the optimizer (microbatch
 *                accumulators are temporaries)
 *   optimizer    adam's moments, a master copy (sharded by `zero` where the step says)
 *   activations  what the forward keeps for the backward, live at the peak: one microbatch's
 *                without a pipeline; with one, the residuals of the microbatch chunks in flight at
 *                the stage's peak (the schedule's: gpipe all, 1f1b up to p on the first stage,
 *                interleaved(V) (1 + (p-1)/(pV)) times that)
 *   temporaries  everything else live at the peak: gathered weights, recomputation, accumulators,
 *                logits and their gradient, activations in transit between stages.
 * FLOPs are the step IR's (opcost.h). Without a train step the entry's forward is analysed, with
 * no grads, optimizer state or activations. What to change when it does not fit: fitsearch.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bufplan.h"
#include "checked.h"
#include "cost.h"
#include "diag.h"
#include "memory.h"
#include "route.h"
#include "opcost.h"
#include "partition.h"
#include "pipeline.h"
#include "shard.h"
#include "step.h"

static void add_largest(MemoryReport *r, const char *what, SrcLoc loc, int64_t bytes) {
  if (bytes <= 0) return;
  if (r->nlargest == MEM_MAX_LARGEST && r->largest[MEM_MAX_LARGEST - 1].bytes >= bytes) return;
  int i = r->nlargest < MEM_MAX_LARGEST ? r->nlargest++ : MEM_MAX_LARGEST - 1;
  r->largest[i] = (MemBuffer){what, loc, bytes};
  for (; i > 0 && r->largest[i].bytes > r->largest[i - 1].bytes; i--) {
    MemBuffer t = r->largest[i];
    r->largest[i] = r->largest[i - 1];
    r->largest[i - 1] = t;
  }
}

/* "param embedding", "blocks.attn.wq's gradient", "the logits at line 40", "activations kept for
 * the backward (8 microbatch chunks in flight)". */
static const char *buffer_text(Arena *a, const IrModule *m, const BufLive *b) {
  const Value *v = b->v;
  static const char *const what[BUF__COUNT] = {"param", "gradient", "optimizer state", "activations", "temporary"};
  if (b->count > 1) return arena_printf(a, "activations kept for the backward (%d microbatch chunks in flight)", b->count);
  if (v->def && v->def->kind == OP_PARAM && v->def->index >= 0 && v->def->index < m->nparams)
    return arena_printf(a, "param %s", m->params[v->def->index].path);
  const char *op = v->def ? ir_op_label(v->def) : "value";
  if (v->name) return arena_printf(a, "%s %s (the %s)", what[b->cls], v->name, op);
  return arena_printf(a, "%s: the %s's result", what[b->cls], op);
}

void memory_estimate(const Program *p, IrModule *m, MemoryReport *r) {
  memset(r, 0, sizeof *r);
  r->devices = p->mesh ? p->mesh->devices : 1;
  r->capacity = p->mesh ? p->mesh->target->hbm : 0;
  if (!p->mesh || !m || !m->main) return;
  pipeline_run(m, p); /* the caller ran it and saw its errors; it does nothing then */
  const Step *st = p->step;
  r->training = st && st->kind == STEP_TRAIN;
  for (int i = 0; i < m->nparams; i++) { /* each within 2^62 (sema); their sum saturates */
    r->param_count = sat_add(r->param_count, tensor_type_elements(&m->params[i].type));
    r->param_bytes = sat_add(r->param_bytes, tensor_type_bytes(&m->params[i].type));
  }
  BufPlan bp;
  const char *was = mem_activity("planning the buffers per device");
  bufplan_build(m->arena, m, p, &bp);
  mem_activity(was);
  if (m->pipeline) {
    r->nstages = bp.nstages;
    r->stages = ARENA_ARRAY(m->arena, MemStage, bp.nstages);
  }
  for (int s = 0; s < bp.nstages; s++) {
    const BufStage *b = &bp.stages[s];
    MemStage ms = {.stage = s, .params = b->by_class[BUF_PARAM], .grads = b->by_class[BUF_GRAD],
                   .optimizer = b->by_class[BUF_OPT], .activations = b->by_class[BUF_ACT],
                   .temporaries = b->by_class[BUF_TEMP], .total = b->peak, .in_flight = b->in_flight};
    if (r->stages) r->stages[s] = ms;
    if (s != bp.worst) continue;
    r->params = ms.params, r->grads = ms.grads, r->optimizer = ms.optimizer;
    r->activations = ms.activations, r->temporaries = ms.temporaries, r->total = ms.total;
    for (int i = 0; i < b->nlargest; i++)
      add_largest(r, buffer_text(m->arena, m, &b->largest[i]), b->largest[i].v->def ? b->largest[i].v->def->loc
                                                                                      : (SrcLoc){0},
                  b->largest[i].bytes);
  }
  r->fits = (double)r->total <= r->capacity;

  /* FLOPs: language.md fixes the count: the backward is 2x the forward (even where the IR skips a
   * gradient nobody needs, such as the input's), plus the recomputation the IR does. */
  StepFlops fl;
  step_flops(m, &fl);
  r->model_flops_per_step = (r->training ? 3 : 1) * fl.forward;
  r->recompute_flops = r->training ? fl.recompute : 0;
  r->flops_per_step = r->model_flops_per_step + r->recompute_flops;
}

void memory_format_bytes(char *buf, size_t n, double b) {
  const char *unit[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  int u = 0;
  double x = b < 0 ? -b : b;
  while (x >= 1000 && u < 5) { x /= 1000; u++; }
  snprintf(buf, n, u == 0 ? "%s%.0f %s" : "%s%.2f %s", b < 0 ? "-" : "", x, unit[u]);
}

/* ---- text ---- */
void memory_print_text(FILE *out, const Program *p, const MemoryReport *r) {
  char b[32];
  struct { const char *k; int64_t v; } rows[] = {
      {"params", r->params}, {"grads", r->grads}, {"optimizer", r->optimizer},
      {"activations", r->activations}, {"temporaries", r->temporaries}};
  fprintf(out, "memory per device:\n");
  for (size_t i = 0; i < ARRAY_LEN(rows); i++) {
    memory_format_bytes(b, sizeof b, (double)rows[i].v);
    fprintf(out, "  %-12s %12s\n", rows[i].k, b);
  }
  memory_format_bytes(b, sizeof b, (double)r->total);
  char c[32];
  memory_format_bytes(c, sizeof c, r->capacity);
  fprintf(out, "  %-12s %12s of %s HBM (%.1f%%): %s\n", "total", b, c,
          r->capacity > 0 ? 100.0 * (double)r->total / r->capacity : 0.0, r->fits ? "fits" : "DOES NOT FIT");
  if (r->nstages <= 0) return;
  /* a pipeline: each stage's device (the figures above are the largest's) */
  fprintf(out, "per pipeline stage:\n  %5s %10s %10s %10s %12s %12s %10s %9s\n", "stage", "params", "grads", "optimizer",
          "activations", "temporaries", "total", "in flight");
  for (int s = 0; s < r->nstages; s++) {
    const MemStage *m = &r->stages[s];
    char f[6][32];
    int64_t v[6] = {m->params, m->grads, m->optimizer, m->activations, m->temporaries, m->total};
    for (int i = 0; i < 6; i++) memory_format_bytes(f[i], sizeof f[i], (double)v[i]);
    fprintf(out, "  %5d %10s %10s %10s %12s %12s %10s %9d\n", m->stage, f[0], f[1], f[2], f[3], f[4], f[5], m->in_flight);
  }
}
