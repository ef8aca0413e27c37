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
 * no grads, optimizer state or activations. */
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

/* The mesh axes that shard `batch` in the entry's inputs (the suggestions' FSDP test). */
static uint16_t batch_axes(const IrModule *m, const Dim *batch) {
  uint16_t mask = 0;
  IrFunc *f = m->main;
  for (int i = 0; batch && i < f->ninputs; i++) {
    const Value *v = f->inputs[i];
    int pos = -1;
    for (int d = 0; d < v->type.rank; d++)
      if (v->type.dims[d]->name == batch->name) pos = d;
    if (pos < 0) continue;
    for (int k = 0; k < v->sharding.naxes[pos]; k++) mask |= (uint16_t)(1u << v->sharding.axes[pos][k]);
  }
  return mask;
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
  bufplan_build(m->arena, m, p, &bp);
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

/* ---- suggestions ---- */

/* Re-estimate p changed by the caller, quietly (layout warnings belong to the real program). */
static void estimate_quiet(const Program *q, IrModule *m, MemoryReport *r) {
  diag_push_quiet();
  /* A changed step (remat, microbatches, zero) is a different IR; a changed layout or mesh only
   * changes shardings, but propagation writes them into the IR: build afresh either way. */
  IrModule *mq = check_build_ir(m->arena, q);
  if (mq) memory_estimate(q, mq, r);
  else memset(r, 0, sizeof *r), r->total = INT64_MAX;
  diag_pop_quiet();
}

static bool layout_has_rule(const Layout *l, Name dim, Name axis) {
  for (int i = 0; l && i < l->nrules; i++)
    if (l->rules[i].dim == dim) {
      for (int k = 0; k < l->rules[i].naxes; k++)
        if (l->rules[i].axes[k] == axis) return true;
    }
  return false;
}

static bool param_has_dim(const IrModule *m, const Dim *d) {
  for (int i = 0; i < m->nparams; i++)
    if (tensor_type_find(&m->params[i].type, d) >= 0) return true;
  return false;
}

static void push_suggestion(MemSuggestion *all, int *n, int max, const MemSuggestion *s) {
  if (s->saved <= 0) return;
  /* keep the `max` best, best first: a full list replaces its worst only with a better one */
  if (*n == max && all[max - 1].saved >= s->saved) return;
  int i = *n < max ? (*n)++ : max - 1;
  all[i] = *s;
  for (; i > 0 && all[i].saved > all[i - 1].saved; i--) {
    MemSuggestion t = all[i];
    all[i] = all[i - 1];
    all[i - 1] = t;
  }
}

void memory_format_bytes(char *buf, size_t n, double b) {
  const char *unit[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  int u = 0;
  double x = b < 0 ? -b : b;
  while (x >= 1000 && u < 5) { x /= 1000; u++; }
  snprintf(buf, n, u == 0 ? "%s%.0f %s" : "%s%.2f %s", b < 0 ? "-" : "", x, unit[u]);
}

/* FSDP over `axis` for the params with `dim`: gathered forward and backward, gradients
 * reduce-scattered. Bytes and time per step, from the cost model on the mesh. */
static void fsdp_comm(const Program *q, const IrModule *m, const Dim *d, int axis, char *out, size_t n) {
  double gathered = 0;
  for (int i = 0; i < m->nparams; i++) {
    const IrParam *ip = &m->params[i];
    if (tensor_type_find(&ip->type, d) < 0) continue;
    Sharding s;
    ShardOrigin o;
    if (!layout_apply(q, &ip->spec, &s, &o)) continue;
    gathered += (double)sharding_local_bytes(&ip->type, &s, q->mesh) * q->mesh->axes[axis].size;
  }
  CollCost ag, rs;
  cost_collective(q->mesh, COLL_ALL_GATHER, (uint16_t)(1u << axis), gathered, true, &ag);
  cost_collective(q->mesh, COLL_REDUCE_SCATTER, (uint16_t)(1u << axis), gathered, true, &rs);
  char b[32];
  memory_format_bytes(b, sizeof b, 2 * ag.bytes_per_device + rs.bytes_per_device);
  snprintf(out, n, "AllGather of those weights over '%s' in forward and backward, ReduceScatter of "
           "their gradients: %s sent per device per step, about %.3g s on %s",
           q->mesh->axes[axis].name, b, 2 * ag.time_s + rs.time_s, ag.link_name);
}

int memory_suggest(const Program *p, IrModule *m, const MemoryReport *base, MemSuggestion *out, int max) {
  int n = 0;
  if (!p->mesh || max <= 0) return 0;

  /* 1. shard a param dim over a mesh axis: one more layout rule */
  const Layout *L = p->layout;
  for (int di = 0; di < p->ndims; di++) {
    const Dim *d = p->dims[di];
    if (!param_has_dim(m, d)) continue;
    for (int a = 0; a < p->mesh->naxes; a++) {
      const MeshAxis *ax = &p->mesh->axes[a];
      if (ax->size <= 1 || layout_has_rule(L, d->name, ax->name)) continue;
      /* layout_apply skips a rule whose axis does not divide the dim (and every dim named so
       * divides d's size), so the changed program would be this one: no need to re-estimate it. */
      if (d->size > 0 && d->size % ax->size != 0) continue;
      Layout nl = {.name = L ? L->name : intern_cstr("suggested"), .loc = L ? L->loc : (SrcLoc){0}};
      nl.nrules = (L ? L->nrules : 0) + 1;
      nl.rules = ARENA_ARRAY(m->arena, LayoutRule, nl.nrules);
      if (L) memcpy(nl.rules, L->rules, sizeof(LayoutRule) * (size_t)L->nrules);
      LayoutRule *r = &nl.rules[nl.nrules - 1];
      r->dim = d->name;
      r->axes[0] = ax->name;
      r->naxes = 1;
      r->loc = nl.loc;
      Program q = *p;
      q.layout = &nl;
      MemoryReport rep;
      estimate_quiet(&q, m, &rep);
      MemSuggestion s = {.saved = base->total - rep.total, .new_total = rep.total, .fits = rep.fits};
      snprintf(s.text, sizeof s.text, "shard '%s' over '%s': add `%s: %s` to layout %s", d->name,
               ax->name, d->name, ax->name, nl.name);
      if (base->training && p->step) {
        /* is `a` a batch axis? then this is FSDP */
        if (batch_axes(m, program_find_dim(p, intern_cstr("batch"))) & (1u << a)) fsdp_comm(&q, m, d, a, s.comm, sizeof s.comm);
      }
      if (!s.comm[0])
        snprintf(s.comm, sizeof s.comm, "collectives over '%s' where ops meet '%s' (run `shardc explain "
                 "--layout ...` on the changed layout for the plan)", ax->name, d->name);
      push_suggestion(out, &n, max, &s);
    }
  }

  if (base->training && p->step) {
    /* 2. rematerialisation */
    static const struct { RematKind k; const char *name; } rem[] = {{REMAT_FULL, "full"}, {REMAT_DOTS, "dots"}};
    for (size_t i = 0; i < ARRAY_LEN(rem); i++) {
      if (p->step->remat == rem[i].k) continue;
      Step st = *p->step;
      st.remat = rem[i].k;
      Program q = *p;
      q.step = &st;
      MemoryReport rep;
      estimate_quiet(&q, m, &rep);
      MemSuggestion s = {.saved = base->total - rep.total, .new_total = rep.total, .fits = rep.fits};
      snprintf(s.text, sizeof s.text, "set `remat = %s` in the train step", rem[i].name);
      double extra = rep.flops_per_step - base->flops_per_step;
      snprintf(s.comm, sizeof s.comm, "no communication; %+.3g FLOPs per step recomputed (%+.1f%%)", extra,
               base->flops_per_step > 0 ? 100 * extra / base->flops_per_step : 0);
      push_suggestion(out, &n, max, &s);
    }
    /* 3. more microbatches */
    const Dim *batch = program_find_dim(p, intern_cstr("batch"));
    int64_t batch_shards = sharding_axes_product(p->mesh, batch_axes(m, batch));
    for (int mul = 2; batch && mul <= 16; mul *= 2) {
      Step st = *p->step;
      st.microbatches = p->step->microbatches * mul;
      /* each microbatch's rows must still divide over the axes that shard `batch` */
      if (batch->size % st.microbatches || (batch->size / st.microbatches) % batch_shards) break;
      Program q = *p;
      q.step = &st;
      MemoryReport rep;
      estimate_quiet(&q, m, &rep);
      MemSuggestion s = {.saved = base->total - rep.total, .new_total = rep.total, .fits = rep.fits};
      snprintf(s.text, sizeof s.text, "set `microbatches = %d` in the train step", st.microbatches);
      snprintf(s.comm, sizeof s.comm, "no new communication; %dx smaller matmuls per microbatch", st.microbatches);
      push_suggestion(out, &n, max, &s);
    }
    /* 4. ZeRO: shard optimizer state (and gradients) over the batch axes */
    for (int z = p->step->zero + 1; z <= 2; z++) {
      Step st = *p->step;
      st.zero = z;
      Program q = *p;
      q.step = &st;
      MemoryReport rep;
      estimate_quiet(&q, m, &rep);
      MemSuggestion s = {.saved = base->total - rep.total, .new_total = rep.total, .fits = rep.fits};
      snprintf(s.text, sizeof s.text, "set `zero = %d` in the train step", z);
      snprintf(s.comm, sizeof s.comm, "the gradient AllReduce becomes a ReduceScatter plus an AllGather of "
               "the updated params over the batch axes: the same bytes");
      push_suggestion(out, &n, max, &s);
    }
  }

  /* 5. a bigger mesh: each axis doubled in turn, where the target can form the result */
  for (int a = 0; a < p->mesh->naxes; a++) {
    Mesh big = *p->mesh;
    big.axes[a].size *= 2;
    diag_push_quiet();
    bool ok = mesh_form(&big);
    diag_pop_quiet();
    if (!ok) continue;
    Program q = *p;
    q.mesh = &big;
    MemoryReport rep;
    estimate_quiet(&q, m, &rep);
    MemSuggestion s = {.saved = base->total - rep.total, .new_total = rep.total, .fits = rep.fits};
    snprintf(s.text, sizeof s.text, "double mesh axis '%s' to %d (%lld devices)", big.axes[a].name, big.axes[a].size,
             (long long)big.devices);
    snprintf(s.comm, sizeof s.comm, "collectives over '%s' span twice the devices (%s)", big.axes[a].name,
             cost_link_name(big.axes[a].link));
    push_suggestion(out, &n, max, &s);
  }
  return n;
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
