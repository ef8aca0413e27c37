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
#include "devprog.h"
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

static void add_largest(MemoryReport *r, MemBuffer b) {
  if (b.bytes <= 0) return;
  if (r->nlargest == MEM_MAX_LARGEST && r->largest[MEM_MAX_LARGEST - 1].bytes >= b.bytes) return;
  int i = r->nlargest < MEM_MAX_LARGEST ? r->nlargest++ : MEM_MAX_LARGEST - 1;
  r->largest[i] = b;
  for (; i > 0 && r->largest[i].bytes > r->largest[i - 1].bytes; i--) {
    MemBuffer t = r->largest[i];
    r->largest[i] = r->largest[i - 1];
    r->largest[i - 1] = t;
  }
}

const char *memory_where(Arena *a, const Program *p, SrcLoc loc) {
  if (!loc.file) return "(no location)";
  if (p && loc.file == p->main_file) { /* relative to the program: its base name */
    const char *slash = strrchr(loc.file->path, '/');
    return arena_printf(a, "%s:%d", slash ? slash + 1 : loc.file->path, loc.line);
  }
  return partition_where(a, p, loc); /* stdlib files relative to the stdlib, others by base name */
}

/* A value's name for a reader: the param's path, the value's name, a loop's result by what its
 * body yields ("h (stacked over the loop)"), else the op over its operand ("cast(contract)"). */
static const char *value_name(Arena *a, const IrModule *m, const Value *v, int depth) {
  if (v->def && v->def->kind == OP_PARAM && v->def->index >= 0 && v->def->index < m->nparams)
    return arena_printf(a, "param %s", m->params[v->def->index].path);
  if (v->name) return v->name;
  const Op *d = v->def;
  if (!d) return "an input";
  if (d->kind == OP_LOOP && d->body) {
    for (int r = 0; r < d->nresults; r++)
      if (d->results[r] == v && r < d->body->noutputs && d->body->outputs[r]->name)
        return arena_printf(a, "%s (each iteration's, stacked)", d->body->outputs[r]->name);
    return "a loop's stacked result";
  }
  const char *op = ir_op_label(d);
  if (depth > 0 || d->noperands < 1 || !d->operands[0]) return op;
  return arena_printf(a, "%s(%s)", op, value_name(a, m, d->operands[0], depth + 1));
}

static const char *buffer_name(Arena *a, const IrModule *m, const Value *v) { return value_name(a, m, v, 0); }

/* "[batch 8, seq 8192, vocab 128256]": the per-device extents */
static const char *buffer_shape(Arena *a, const Value *v) {
  char buf[512];
  int k = snprintf(buf, sizeof buf, "[");
  for (int i = 0; i < v->type.rank && k < (int)sizeof buf - 64; i++) {
    int64_t e = v->local[i] > 0 ? v->local[i] : v->type.dims[i]->size;
    k += snprintf(buf + k, sizeof buf - (size_t)k, "%s%s %lld", i ? ", " : "", v->type.dims[i]->name, (long long)e);
  }
  snprintf(buf + k, sizeof buf - (size_t)k, "]");
  return arena_printf(a, "%s", buf);
}

/* "activations: f32 logits [batch 8, seq 8192, vocab 128256]", "param: bf16 param
 * blocks.attn.wq [...]", "activations kept for the backward (8 microbatch chunks in flight)". */
static MemBuffer buffer_of(Arena *a, const IrModule *m, const BufLive *b) {
  static const char *const what[BUF__COUNT] = {"param", "gradient", "optimizer state", "activations", "temporary"};
  const Value *v = b->v;
  MemBuffer r = {.cls = what[b->cls], .loc = v->def ? v->def->loc : (SrcLoc){0}, .bytes = b->bytes};
  r.name = buffer_name(a, m, v);
  r.dtype = dtype_name(v->type.dtype);
  r.shape = buffer_shape(a, v);
  if (b->count > 1)
    r.what = arena_printf(a, "activations kept for the backward (%d microbatch chunks in flight), each %s %s %s",
                          b->count, r.dtype, r.name, r.shape);
  else
    r.what = arena_printf(a, "%s: %s %s %s", r.cls, r.dtype, r.name, r.shape);
  return r;
}

/* The step's resident state per device of pipeline stage `stage` (0 without a pipeline; memory.h's
 * MemResident): the params whose op runs there (Op.place: the embedding on the first stage, the
 * head on the last, the stacked layers' share everywhere), and each such param's gradient and
 * optimizer state. A gradient's size is that of the reduced gradient: followed through its
 * collectives (zero = 2's reduce-scatter) and casts. */
static void resident_state(const Program *p, const IrModule *m, int stage, MemResident *rs) {
  memset(rs, 0, sizeof *rs);
  const Mesh *mesh = p->mesh;
  const IrFunc *f = m->main;
  const PipeInfo *pi = m->pipeline ? m->pipeline->pipe : NULL;
  for (const Op *op = f->first; op; op = op->next)
    if (op->kind == OP_PARAM && op->nresults == 1 && (!pi || dev_stage_runs(dev_op_runs(op), stage, pi->stages)))
      rs->params = sat_add(rs->params, sharding_local_bytes(&op->results[0]->type, &op->results[0]->sharding, mesh));
  const StepInfo *si = m->step;
  for (int j = 0; si && j < si->nparams; j++) {
    const StepParam *sp = &si->params[j];
    const Op *pop = sp->value ? sp->value->def : NULL;
    if (pi && pop && !dev_stage_runs(dev_op_runs(pop), stage, pi->stages)) continue; /* another stage's */
    const Value *g = sp->grad;
    for (const Op *op = f->first; g && op; op = op->next) {
      /* not a slice: under zero = 1 the whole reduced gradient is held, the optimizer reads a slice */
      bool carries = ir_op_is_collective(op->kind) || op->kind == OP_CAST || op->kind == OP_TRANSPOSE;
      if (carries && op->noperands == 1 && op->nresults == 1 && op->operands[0] == g) g = op->results[0];
    }
    if (g) {
      int64_t b = sharding_local_bytes(&g->type, &g->sharding, mesh);
      /* zero = 2 over the flattened params: the flat buffer's shard */
      if (si->step && si->step->zero >= 2) b = step_flat_bytes(sp, b, dtype_bytes(g->type.dtype));
      rs->grads = sat_add(rs->grads, b);
    }
    const int ins[3] = {sp->in_master, sp->in_m, sp->in_v};
    for (int q = 0; q < 3; q++) {
      if (ins[q] < 0 || ins[q] >= f->ninputs) continue;
      const Value *v = f->inputs[ins[q]];
      int64_t b = step_flat_bytes(sp, sharding_local_bytes(&v->type, &v->sharding, mesh), dtype_bytes(v->type.dtype));
      if (q == 0) rs->master = sat_add(rs->master, b);
      else rs->moments = sat_add(rs->moments, b);
    }
  }
  rs->total = sat_add(sat_add(rs->params, rs->grads), sat_add(rs->moments, rs->master));
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
    for (int i = 0; i < b->nlargest; i++) add_largest(r, buffer_of(m->arena, m, &b->largest[i]));
    if (b->peak_op)
      r->peak_at = arena_printf(m->arena, "%s at %s", ir_op_label(b->peak_op), memory_where(m->arena, p, b->peak_op->loc));
  }
  r->fits = (double)r->total <= r->capacity;
  /* resident state: each stage's under a pipeline, and the largest of them is the device's */
  resident_state(p, m, 0, &r->resident);
  for (int s = 0; r->stages && s < r->nstages; s++) {
    resident_state(p, m, s, &r->stages[s].resident);
    if (r->stages[s].resident.total > r->resident.total || s == 0) r->resident = r->stages[s].resident;
  }

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
  (void)p;
  char b[32];
  const MemResident *rs = &r->resident;
  if (r->training) {
    struct { const char *k; int64_t v; const char *why; } res[] = {
        {"params", rs->params, ""},
        {"grads", rs->grads, "  (each param's, after its reduction)"},
        {"optimizer", rs->moments, "  (adam's moments m and v)"},
        {"master", rs->master, "  (master copies of the params)"}};
    fprintf(out, "resident state per device (held between steps):\n");
    for (size_t i = 0; i < ARRAY_LEN(res); i++) {
      if (i >= 2 && res[i].v == 0) continue;
      memory_format_bytes(b, sizeof b, (double)res[i].v);
      fprintf(out, "  %-12s %12s%s\n", res[i].k, b, res[i].v ? res[i].why : "");
    }
    memory_format_bytes(b, sizeof b, (double)rs->total);
    fprintf(out, "  %-12s %12s\n", "total", b);
  }
  struct { const char *k; int64_t v; } rows[] = {
      {"params", r->params}, {"grads", r->grads}, {"optimizer", r->optimizer},
      {"activations", r->activations}, {"temporaries", r->temporaries}};
  if (r->peak_at) fprintf(out, "peak memory per device, by class (at the %s):\n", r->peak_at);
  else fprintf(out, "peak memory per device, by class:\n");
  for (size_t i = 0; i < ARRAY_LEN(rows); i++) {
    memory_format_bytes(b, sizeof b, (double)rows[i].v);
    fprintf(out, "  %-12s %12s", rows[i].k, b);
    if (i == 1 && r->training && rows[i].v == 0 && rs->grads > 0) fprintf(out, "  (no gradient is live at the peak)");
    if (i == 2 && r->training && rows[i].v > 0) fprintf(out, "  (moments and master copies)");
    fputc('\n', out);
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
  if (!r->training) return;
  /* what each stage's devices hold between steps: their own layers (the first stage the embedding,
   * the last the head), the layers' gradients and optimizer state */
  fprintf(out, "resident state per pipeline stage (each device of the stage, between steps):\n  %5s %10s %10s %10s %10s %10s\n",
          "stage", "params", "grads", "optimizer", "master", "total");
  for (int s = 0; s < r->nstages; s++) {
    const MemResident *x = &r->stages[s].resident;
    char f[5][32];
    int64_t v[5] = {x->params, x->grads, x->moments, x->master, x->total};
    for (int i = 0; i < 5; i++) memory_format_bytes(f[i], sizeof f[i], (double)v[i]);
    fprintf(out, "  %5d %10s %10s %10s %10s %10s\n", r->stages[s].stage, f[0], f[1], f[2], f[3], f[4]);
  }
}
