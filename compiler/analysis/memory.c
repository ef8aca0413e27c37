/* memory.c: memory fit per device, FLOPs per step, and suggestions (see memory.h).
 *
 * The model, per device, after sharding (language.md's memory keys):
 *   params       every flattened param's local bytes (its layout sharding; a stacked param's
 *                leading `layers` dim counts too, so `layers@stage` divides it).
 *   grads        training only: the params' bytes again (gradients have their param's dtype); with
 *                `zero = 2` further divided over the axes that shard `batch`.
 *   optimizer    adam: 8 bytes (two f32 moments) per local param element; sgd: none; a `master`
 *                copy adds 4 per element. With `zero >= 1` divided over the axes that shard `batch`.
 *   activations  training only, read from the step's IR (step.h): every value the backward reads
 *                that the forward made (Value.saved; a stacked loop's residuals count each layer
 *                its device holds), for one microbatch, times the microbatches in flight (1 without
 *                a pipeline; gpipe: all; 1f1b: up to the stage count). What is saved follows the
 *                remat policy, which the step builder applied to the IR.
 *   temporaries  the peak, over the step's program order, of the bytes of values alive at once
 *                that no other key counts (peak_temporaries): gathered FSDP weights of a layer,
 *                what a backward iteration recomputes under remat, the f32 microbatch gradient
 *                accumulators, the logits and their gradient, each at its local size, read from
 *                the IR after the collectives are inserted.
 * Shardings are those propagation gives (shard.h) on p's mesh under p's layout. FLOPs are the
 * step IR's (step_flops: contractions 2 x the product of their distinct dims, fused attention its
 * two contractions, the backward as its ops state, recomputation counted separately). Without a
 * train step the entry's forward is analysed, with no grads, optimizer state or activations. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "diag.h"
#include "memory.h"
#include "shard.h"
#include "step.h"
#include "pipeline.h"
#include "partition.h"

typedef struct Walk {
  const Program *p;
  IrModule *m;
  const Dim *batch;     /* the dim named `batch`, or NULL */
  uint8_t *is_param;    /* by value id: a param, or a stacked param's slice in a loop body */
  uint8_t *counted;     /* by value id: counted under another key (saved activation, grad,
                           optimizer state, the step's inputs and outputs): not a temporary */
  int *last_use;        /* by value id: index of the last op of its function that reads it */
  const Value *peak_v;  /* the largest temporary live at the peak, for the report */
} Walk;

static int64_t value_bytes(const Walk *w, const Value *v) {
  return sharding_local_bytes(&v->type, &v->sharding, w->p->mesh);
}

/* The stacked dim's trips one device runs: count / the axes sharding the stacked operand's leading
 * dim (the pipeline stages, returned in *stages). */
static int64_t loop_trips_per_device(const Walk *w, const Op *loop, int64_t *stages) {
  int64_t s = 1;
  if (loop->nslices > 0) {
    const Value *st = loop->operands[0];
    for (int k = 0; k < st->sharding.naxes[0]; k++) s *= w->p->mesh->axes[st->sharding.axes[0][k]].size;
  }
  if (stages) *stages = s;
  return s > 0 ? (loop->count + s - 1) / s : loop->count;
}

/* Peak temporaries: the most bytes of values that are alive at once and counted under no other
 * key, walking f in program order. A value is alive from the op that makes it to the last op of
 * its function that reads it (a loop reads every value its body uses: regions are isolated), or to
 * the end if f returns it. At a loop op, its body's own peak (one iteration) adds to what is alive
 * around it. So the gathered FSDP weights of one layer, the values a backward iteration recomputes
 * under remat, the microbatch gradient accumulators, and the logits and their gradient all appear
 * as what they are: values alive together. */
static int64_t peak_temporaries(Walk *w, IrFunc *f, const Op *loop) {
  /* A loop body's carried outputs are written over the carried buffers the enclosing function
   * holds (a loop's state is updated in place): counted there, not here. */
  for (int i = 0; loop && i < loop->ncarried && i < f->noutputs; i++) w->counted[f->outputs[i]->id] = 1;
  int n = 0;
  for (Op *op = f->first; op; op = op->next) {
    for (int i = 0; i < op->noperands; i++) w->last_use[op->operands[i]->id] = n;
    n++;
  }
  for (int i = 0; i < f->noutputs; i++) w->last_use[f->outputs[i]->id] = n;
  int64_t live = 0, peak = 0;
  /* values of f that die at op index k, freed after it: a small list per index */
  typedef VEC(const Value *) ValVec;
  ValVec *dies = ARENA_ARRAY(w->m->arena, ValVec, n + 1);
  int k = 0;
  for (Op *op = f->first; op; op = op->next, k++) {
    int64_t made = 0;
    const Value *big = NULL;
    for (int r = 0; r < op->nresults; r++) {
      const Value *v = op->results[r];
      if (w->is_param[v->id] || w->counted[v->id]) continue;
      int64_t b = value_bytes(w, v);
      made += b;
      if (!big || b > value_bytes(w, big)) big = v;
      int last = w->last_use[v->id] >= k ? w->last_use[v->id] : k;
      VEC_PUSH(w->m->arena, dies[last], v);
    }
    int64_t inner = op->kind == OP_LOOP && op->body ? peak_temporaries(w, op->body, op) : 0;
    /* An elementwise op may write its result over an operand this op is the last to read (buffer
     * reuse, as XLA's assignment does: a gradient accumulator `acc = acc + g` needs no new
     * buffer). Only the peak at this op changes: the operand dies here either way. */
    int64_t reused = 0;
    if (op->kind == OP_LOOP) {
      /* carried results reuse the carried operands this loop is the last to read */
      for (int r = 0; r < op->ncarried && r < op->nresults; r++) {
        const Value *in = op->operands[op->nslices + r], *out = op->results[r];
        if (!w->is_param[out->id] && !w->counted[out->id] && !w->is_param[in->id] && !w->counted[in->id] &&
            w->last_use[in->id] == k)
          reused += value_bytes(w, out);
      }
    } else if (made > 0 && op->nresults == 1 && (ir_op_is_elementwise(op->kind) || op->kind == OP_CAST)) {
      int64_t rb = value_bytes(w, op->results[0]);
      for (int i = 0; i < op->noperands && !reused; i++) {
        const Value *v = op->operands[i];
        if (v->func == f && w->last_use[v->id] == k && !w->is_param[v->id] && !w->counted[v->id] &&
            value_bytes(w, v) >= rb)
          reused = rb;
      }
    }
    if (live + made - reused + inner > peak) {
      peak = live + made - reused + inner;
      if (big) w->peak_v = big;
    }
    live += made;
    for (int i = 0; i < dies[k].len; i++) live -= value_bytes(w, dies[k].data[i]);
  }
  return peak;
}

/* What the other memory keys already count: values the backward reads (activations), gradients,
 * and the step's inputs (data, labels, optimizer state) and outputs (updated params and state). */
static void mark_counted(Walk *w, IrFunc *f) {
  for (Op *op = f->first; op; op = op->next) {
    for (int r = 0; r < op->nresults; r++)
      if (op->results[r]->saved) w->counted[op->results[r]->id] = 1;
    if (op->kind == OP_LOOP && op->body) mark_counted(w, op->body);
  }
}

/* The forward stacked loop: the first loop over stacked params that is not a backward loop
 * (inside the microbatch loop when there is one). */
static const Op *forward_stack_loop(IrFunc *f) {
  for (Op *op = f->first; op; op = op->next) {
    if (op->kind != OP_LOOP || !op->body || op->reverse) continue;
    if (op->nslices > 0) return op;
    const Op *in = forward_stack_loop(op->body);
    if (in) return in;
  }
  return NULL;
}

/* ---- params, grads, optimizer ---- */
static uint16_t batch_axes(const Walk *w) {
  uint16_t mask = 0;
  IrFunc *f = w->m->main;
  for (int i = 0; i < f->ninputs; i++) {
    const Value *v = f->inputs[i];
    int pos = w->batch ? tensor_type_find(&v->type, w->batch) : -1;
    if (pos < 0) continue;
    for (int k = 0; k < v->sharding.naxes[pos]; k++) mask |= (uint16_t)(1u << v->sharding.axes[pos][k]);
  }
  return mask;
}

static void add_largest(MemoryReport *r, const char *what, SrcLoc loc, int64_t bytes) {
  if (bytes <= 0) return;
  int i = r->nlargest < MEM_MAX_LARGEST ? r->nlargest++ : MEM_MAX_LARGEST - 1;
  if (i == MEM_MAX_LARGEST - 1 && r->nlargest == MEM_MAX_LARGEST && r->largest[i].bytes >= bytes) return;
  r->largest[i] = (MemBuffer){what, loc, bytes};
  for (; i > 0 && r->largest[i].bytes > r->largest[i - 1].bytes; i--) {
    MemBuffer t = r->largest[i];
    r->largest[i] = r->largest[i - 1];
    r->largest[i - 1] = t;
  }
}

static void mark_params(Walk *w, IrFunc *f) {
  for (Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_PARAM) w->is_param[op->results[0]->id] = 1;
    if (op->kind == OP_LOOP && op->body) {
      for (int i = 0; i < op->nslices && i < op->body->ninputs; i++)
        if (w->is_param[op->operands[i]->id]) w->is_param[op->body->inputs[i]->id] = 1;
      mark_params(w, op->body);
    }
  }
}

void memory_estimate(const Program *p, IrModule *m, MemoryReport *r) {
  memset(r, 0, sizeof *r);
  r->devices = p->mesh ? p->mesh->devices : 1;
  r->capacity = p->mesh ? p->mesh->target->hbm : 0;
  if (!p->mesh || !m || !m->main) return;
  pipeline_run(m, p); /* the caller ran it and saw its errors; it does nothing then */

  const Step *st = p->step;
  r->training = st && st->kind == STEP_TRAIN;
  Walk w = {.p = p, .m = m, .batch = program_find_dim(p, intern_cstr("batch"))};
  w.is_param = ARENA_ARRAY(m->arena, uint8_t, m->nvalues + 1);
  mark_params(&w, m->main);
  uint16_t bmask = batch_axes(&w);

  /* params, grads, optimizer */
  const Op *loop = forward_stack_loop(m->main);
  for (int i = 0; i < m->nparams; i++) {
    const IrParam *ip = &m->params[i];
    Sharding s;
    ShardOrigin o;
    if (!layout_apply(p, &ip->spec, &s, &o)) memset(&s, 0, sizeof s);
    int64_t elems = tensor_type_elements(&ip->type);
    r->param_count += elems;
    r->param_bytes += tensor_type_bytes(&ip->type);
    int64_t lb = sharding_local_bytes(&ip->type, &s, p->mesh);
    int64_t le = lb / dtype_bytes(ip->type.dtype);
    r->params += lb;
    uint16_t used = sharding_axes_used(&s, ip->type.rank);
    int64_t zero_div = sharding_axes_product(p->mesh, (uint16_t)(bmask & ~used));
    if (r->training) {
      r->grads += st->zero >= 2 ? lb / zero_div : lb;
      int64_t per = (st->optimizer == OPT_ADAM ? 8 : 0) + (st->master != DT_NONE ? 4 : 0);
      r->optimizer += (st->zero >= 1 ? le / zero_div : le) * per;
    }
    add_largest(r, arena_printf(m->arena, "param %s", ip->path), ip->loc, lb);
  }

  /* activations */
  int64_t in_flight = 1, stages = 1;
  if (loop) loop_trips_per_device(&w, loop, &stages);
  if (r->training) {
    r->activations = m->step ? step_saved_bytes(m, p->mesh) : 0;
    if (stages > 1) {
      in_flight = st->schedule == SCHED_GPIPE ? st->microbatches
                                              : (st->microbatches < stages ? st->microbatches : stages);
    }
    r->activations *= in_flight;
    add_largest(r, in_flight > 1 ? arena_printf(m->arena, "activations saved for the backward (%lld microbatches in flight)",
                                                (long long)in_flight)
                                   : "activations saved for the backward",
                st->loc, r->activations);
  }

  /* temporaries */
  /* The collectives propagation implies are inserted (partition.h: idempotent, and it freezes
   * the shardings): their results, such as gathered weights, are temporaries like any value. */
  w.counted = ARENA_ARRAY(m->arena, uint8_t, m->nvalues + 1);
  w.last_use = ARENA_ARRAY(m->arena, int, m->nvalues + 1);
  mark_counted(&w, m->main);
  for (int i = 0; i < m->main->ninputs; i++) w.counted[m->main->inputs[i]->id] = 1;
  for (int i = 0; i < m->main->noutputs; i++) w.counted[m->main->outputs[i]->id] = 1;
  for (int i = 0; m->step && i < m->step->nparams; i++)
    if (m->step->params[i].grad) w.counted[m->step->params[i].grad->id] = 1;
  r->temporaries = peak_temporaries(&w, m->main, NULL);
  if (w.peak_v)
    add_largest(r, w.peak_v->name ? arena_printf(m->arena, "temporaries at their peak (around '%s')", w.peak_v->name)
                                  : "temporaries at their peak",
                w.peak_v->def ? w.peak_v->def->loc : (SrcLoc){0}, r->temporaries);
  if (r->training) add_largest(r, "optimizer state", st->loc, r->optimizer);

  r->total = r->params + r->grads + r->optimizer + r->activations + r->temporaries;
  r->fits = (double)r->total <= r->capacity;

  /* FLOPs */
  /* language.md fixes the count: the backward is 2x the forward (even where the IR skips a
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
  /* keep the `max` best, best first */
  int i = *n < max ? (*n)++ : max - 1;
  if (*n == max && i == max - 1 && all[i].saved >= s->saved) return;
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
  Walk w = {.p = p, .m = m};
  (void)w;

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
        Walk wb = {.p = &q, .m = m, .batch = program_find_dim(p, intern_cstr("batch"))};
        if (batch_axes(&wb) & (1u << a)) fsdp_comm(&q, m, d, a, s.comm, sizeof s.comm);
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
    Walk wb = {.p = p, .m = m, .batch = batch};
    int64_t batch_shards = sharding_axes_product(p->mesh, batch_axes(&wb));
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
}
