/* memory.c: memory fit per device, FLOPs per step, and suggestions (see memory.h).
 *
 * The model, per device, after sharding:
 *   params       every flattened param's local bytes (its layout sharding; a stacked param's
 *                leading `layers` dim counts too, so `layers@stage` divides it).
 *   grads        training only: the params' bytes again (gradients have their param's dtype); with
 *                `zero = 2` further divided over the axes that shard `batch`.
 *   optimizer    adam: 8 bytes (two f32 moments) per local param element; sgd: none; a `master`
 *                copy adds 4 per element. With `zero >= 1` divided over the axes that shard `batch`.
 *   activations  training only: the tensors the forward saves for the backward (SAVED_* table below:
 *                what each op's backward reads), each counted once, per microbatch (a tensor with
 *                the `batch` dim is 1/microbatches of its full-batch size), times the microbatches
 *                in flight (1 without a pipeline; gpipe: all; 1f1b: up to the stage count). Under
 *                `remat = full` a stacked loop keeps only each iteration's carried input; under
 *                `dots` it keeps its contraction and attention outputs and its carried input.
 *   temporaries  gathered FSDP weights of one layer (or of the largest param used outside the
 *                loop), the recompute buffer of one layer when remat is on, the f32 gradient
 *                accumulator when microbatches > 1 (training), and twice the largest single
 *                intermediate (an op's output and, training, its gradient).
 * FLOPs (language.md): each contraction 2 x the product of its distinct dims, global; attention its
 * two contractions; a loop times its count; training 3x the forward plus recomputation (remat =
 * full re-runs each loop body's forward; fused attention always recomputes its scores). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "diag.h"
#include "memory.h"
#include "shard.h"

/* What an op's backward reads, by op kind. SAVED_NONE for ops whose gradient needs only shapes. */
enum {
  SAVED_NONE = 0,
  SAVED_OPERANDS = 1,  /* every tensor operand that is not a param */
  SAVED_OPERAND0 = 2,  /* the first operand */
  SAVED_RESULT = 4,    /* the op's output */
  SAVED_STATS = 8,     /* f32 statistics: one per row reduced over dims[0] (norms, attention) */
  SAVED_OPERAND1 = 16, /* the second operand (take: the indices) */
};
static int saved_kind(OpKind k) {
  switch (k) {
  case OP_CONTRACT: case OP_MUL: case OP_DIV: return SAVED_OPERANDS;
  case OP_EXP: case OP_SQRT: case OP_RSQRT: case OP_TANH: case OP_SIGMOID: case OP_SOFTMAX:
    return SAVED_RESULT;
  case OP_LOG: case OP_RELU: case OP_GELU: case OP_SILU: return SAVED_OPERAND0;
  case OP_MAX: return SAVED_OPERAND0 | SAVED_RESULT;
  case OP_RMSNORM: case OP_LAYERNORM: return SAVED_OPERAND0 | SAVED_STATS;
  case OP_TAKE: return SAVED_OPERAND1;
  case OP_ATTENTION: return SAVED_OPERANDS | SAVED_RESULT | SAVED_STATS;
  default: return SAVED_NONE;
  }
}

typedef struct Walk {
  const Program *p;
  IrModule *m;
  const Dim *batch;     /* the dim named `batch`, or NULL */
  int micro;            /* microbatches */
  uint8_t *is_param;    /* by value id: a param or a stacked param's slice */
  uint8_t *seen;        /* by value id: already counted in the current set */
  int64_t largest_value;
  const Value *largest_value_v;
} Walk;

static int64_t value_bytes(const Walk *w, const Value *v) {
  int64_t b = sharding_local_bytes(&v->type, &v->sharding, w->p->mesh);
  if (w->batch && w->micro > 1 && tensor_type_find(&v->type, w->batch) >= 0) b /= w->micro;
  return b;
}

/* f32 statistics of a norm / attention: x's local elements without the reduced dim. */
static int64_t stats_bytes(const Walk *w, const Op *op) {
  const Value *x = op->kind == OP_ATTENTION ? op->results[0] : op->operands[0];
  const Dim *over = op->ndims > 0 ? op->dims[0] : NULL;
  int pos = over ? tensor_type_find(&x->type, over) : -1;
  int64_t b = value_bytes(w, x) / dtype_bytes(x->type.dtype) * 4;
  if (pos >= 0) {
    int64_t ext = sharding_local_extent(&x->type, &x->sharding, w->p->mesh, pos);
    if (ext > 0) b /= ext;
  }
  return b * (op->kind == OP_LAYERNORM ? 2 : 1);
}

static int64_t count_value(Walk *w, const Value *v) {
  if (!v || w->is_param[v->id] || w->seen[v->id]) return 0;
  if (v->def && v->def->kind == OP_CONST) return 0;
  w->seen[v->id] = 1;
  return value_bytes(w, v);
}

/* The stacked dim's trips that one device runs: count / the axes sharding the stacked operand's
 * leading dim (pipeline stages). */
static int64_t loop_trips_per_device(const Walk *w, const Op *loop, int64_t *stages) {
  int64_t s = 1;
  if (loop->nslices > 0) {
    const Value *st = loop->operands[0];
    for (int k = 0; k < st->sharding.naxes[0]; k++) s *= w->p->mesh->axes[st->sharding.axes[0][k]].size;
  }
  if (stages) *stages = s;
  return s > 0 ? (loop->count + s - 1) / s : loop->count;
}

static void track_largest(Walk *w, IrFunc *f) {
  for (Op *op = f->first; op; op = op->next) {
    for (int r = 0; r < op->nresults; r++) {
      const Value *v = op->results[r];
      if (w->is_param[v->id] || op->kind == OP_LOOP) continue;
      int64_t b = value_bytes(w, v);
      if (b > w->largest_value) { w->largest_value = b; w->largest_value_v = v; }
    }
    if (op->kind == OP_LOOP && op->body) track_largest(w, op->body);
  }
}

/* Bytes saved by the ops of f (nested loops per their policy), for one microbatch. */
static int64_t saved_in_func(Walk *w, IrFunc *f, RematKind remat, bool in_loop);

static int64_t saved_by_op(Walk *w, const Op *op) {
  int k = saved_kind(op->kind);
  int64_t b = 0;
  if (k & SAVED_OPERANDS)
    for (int i = 0; i < op->noperands; i++) b += count_value(w, op->operands[i]);
  if ((k & SAVED_OPERAND0) && op->noperands > 0) b += count_value(w, op->operands[0]);
  if ((k & SAVED_OPERAND1) && op->noperands > 1) b += count_value(w, op->operands[1]);
  if ((k & SAVED_RESULT) && op->nresults > 0) b += count_value(w, op->results[0]);
  if (k & SAVED_STATS) b += stats_bytes(w, op);
  return b;
}

static int64_t saved_by_loop(Walk *w, const Op *loop, RematKind remat) {
  IrFunc *b = loop->body;
  int64_t per_iter = 0;
  if (remat == REMAT_NONE) {
    per_iter = saved_in_func(w, b, remat, true);
  } else {
    /* full and dots keep each iteration's carried input (the block input) */
    for (int i = loop->nslices; i < loop->nslices + loop->ncarried && i < b->ninputs; i++)
      per_iter += value_bytes(w, b->inputs[i]);
    if (remat == REMAT_DOTS)
      for (Op *op = b->first; op; op = op->next)
        if (op->kind == OP_CONTRACT || op->kind == OP_ATTENTION) per_iter += count_value(w, op->results[0]);
  }
  return per_iter * loop_trips_per_device(w, loop, NULL);
}

static int64_t saved_in_func(Walk *w, IrFunc *f, RematKind remat, bool in_loop) {
  int64_t b = 0;
  for (Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_LOOP && op->body) b += saved_by_loop(w, op, remat);
    else if (!(in_loop && remat != REMAT_NONE)) b += saved_by_op(w, op);
  }
  return b;
}

/* ---- FLOPs ---- */
/* The product of the distinct dims of a (without `drop`) and b, and `add`: a contraction's size. */
static double prod_union(const TensorType *a, const TensorType *b, const Dim *drop, const Dim *add) {
  const Dim *seen[2 * MAX_RANK + 1];
  int n = 0;
  double f = 1;
  const TensorType *ts[2] = {a, b};
  for (int t = 0; t < 2; t++)
    for (int i = 0; i < ts[t]->rank; i++) {
      const Dim *d = ts[t]->dims[i];
      if (t == 0 && d == drop) continue; /* `drop` leaves the first tensor only */
      bool dup = false;
      for (int j = 0; j < n; j++) dup |= seen[j] == d;
      if (!dup) { seen[n++] = d; f *= (double)d->size; }
    }
  if (add) {
    bool dup = false;
    for (int j = 0; j < n; j++) dup |= seen[j] == add;
    if (!dup) f *= (double)add->size;
  }
  return f;
}

/* Forward FLOPs of f (global), and separately the score FLOPs of fused attention (recomputed in
 * the backward) and the FLOPs inside loop bodies (what full remat recomputes). */
static void func_flops(IrFunc *f, double *total, double *attn_scores, double *in_loops, double scale) {
  for (Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_CONTRACT && op->noperands == 2) {
      *total += scale * 2 * prod_union(&op->operands[0]->type, &op->operands[1]->type, NULL, NULL);
    } else if (op->kind == OP_ATTENTION && op->noperands == 3 && op->ndims >= 2) {
      double qk = 2 * prod_union(&op->operands[0]->type, &op->operands[1]->type, NULL, NULL);
      /* p = q's dims without head, plus the key dim; then p . v */
      double pv = 2 * prod_union(&op->operands[0]->type, &op->operands[2]->type, op->dims[0], op->dims[1]);
      *total += scale * (qk + pv);
      *attn_scores += scale * qk;
    } else if (op->kind == OP_LOOP && op->body) {
      double t = 0, a = 0, l = 0;
      func_flops(op->body, &t, &a, &l, scale * (double)op->count);
      *total += t;
      *attn_scores += a;
      *in_loops += t;
    }
  }
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

static int64_t axes_product(const Mesh *m, uint16_t mask) {
  int64_t n = 1;
  for (int a = 0; a < m->naxes; a++)
    if (mask & (1u << a)) n *= m->axes[a].size;
  return n;
}

static uint16_t sharding_axes(const Sharding *s, int rank) {
  uint16_t mask = 0;
  for (int i = 0; i < rank; i++)
    for (int k = 0; k < s->naxes[i]; k++) mask |= (uint16_t)(1u << s->axes[i][k]);
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

static const Op *first_loop(IrFunc *f) {
  for (Op *op = f->first; op; op = op->next)
    if (op->kind == OP_LOOP && op->body) return op;
  return NULL;
}

void memory_estimate(const Program *p, IrModule *m, MemoryReport *r) {
  memset(r, 0, sizeof *r);
  r->devices = p->mesh ? p->mesh->devices : 1;
  r->capacity = p->mesh ? p->mesh->target->hbm : 0;
  if (!p->mesh || !m || !m->main) return;
  shard_assign(m, p);

  const Step *st = p->step;
  r->training = st && st->kind == STEP_TRAIN;
  Walk w = {.p = p, .m = m, .batch = program_find_dim(p, intern_cstr("batch")),
            .micro = r->training && st->microbatches > 1 ? st->microbatches : 1};
  w.is_param = ARENA_ARRAY(m->arena, uint8_t, m->nvalues + 1);
  w.seen = ARENA_ARRAY(m->arena, uint8_t, m->nvalues + 1);
  mark_params(&w, m->main);
  uint16_t bmask = batch_axes(&w);

  /* params, grads, optimizer */
  int64_t local_elems_total = 0, gathered_outside_max = 0, gathered_layer = 0;
  const Op *loop = first_loop(m->main);
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
    local_elems_total += le;
    uint16_t used = sharding_axes(&s, ip->type.rank);
    int64_t zero_div = axes_product(p->mesh, (uint16_t)(bmask & ~used));
    if (r->training) {
      r->grads += st->zero >= 2 ? lb / zero_div : lb;
      int64_t per = (st->optimizer == OPT_ADAM ? 8 : 0) + (st->master != DT_NONE ? 4 : 0);
      r->optimizer += (st->zero >= 1 ? le / zero_div : le) * per;
    }
    add_largest(r, arena_printf(m->arena, "param %s", ip->path), ip->loc, lb);
    /* FSDP: a param sharded over an axis that also shards the batch is gathered before use. */
    int64_t fsdp = axes_product(p->mesh, (uint16_t)(used & bmask));
    if (fsdp > 1) {
      int64_t gathered = lb * fsdp;
      if (ip->stack_depth > 0) {
        int64_t lay = sharding_local_extent(&ip->type, &s, p->mesh, 0);
        gathered_layer += lay > 0 ? gathered / lay : gathered;
      } else if (gathered > gathered_outside_max) {
        gathered_outside_max = gathered;
      }
    }
  }

  /* activations */
  int64_t in_flight = 1, stages = 1;
  if (loop) loop_trips_per_device(&w, loop, &stages);
  if (r->training) {
    RematKind remat = st->remat;
    r->activations = saved_in_func(&w, m->main, remat, false);
    /* the loss keeps the output (cross_entropy: its softmax, in f32) */
    if (m->main->noutputs > 0) {
      const Value *out = m->main->outputs[0];
      int64_t ob = value_bytes(&w, out);
      if (st->loss == LOSS_CROSS_ENTROPY) ob = ob / dtype_bytes(out->type.dtype) * 4;
      if (!w.seen[out->id]) r->activations += ob;
    }
    if (stages > 1) {
      in_flight = st->schedule == SCHED_GPIPE ? st->microbatches
                                              : (st->microbatches < stages ? st->microbatches : stages);
    }
    r->activations *= in_flight;
    if (loop)
      add_largest(r, arena_printf(m->arena, "activations saved by the stacked loop (x%lld layers)",
                                  (long long)loop->count),
                  loop->loc, r->activations);
  }

  /* temporaries */
  track_largest(&w, m->main);
  int64_t gathered = gathered_layer > gathered_outside_max ? gathered_layer : gathered_outside_max;
  int64_t recompute = 0;
  if (r->training && loop && st->remat != REMAT_NONE) {
    memset(w.seen, 0, (size_t)m->nvalues + 1);
    recompute = saved_in_func(&w, loop->body, REMAT_NONE, true);
  }
  int64_t accum = r->training && st->microbatches > 1 ? local_elems_total * 4 : 0;
  r->temporaries = gathered + recompute + accum + w.largest_value * (r->training ? 2 : 1);
  if (w.largest_value_v)
    add_largest(r, w.largest_value_v->name
                       ? arena_printf(m->arena, "intermediate '%s'", w.largest_value_v->name)
                       : "largest intermediate",
                w.largest_value_v->def ? w.largest_value_v->def->loc : (SrcLoc){0}, w.largest_value);
  if (r->training) add_largest(r, "optimizer state", st->loc, r->optimizer);

  r->total = r->params + r->grads + r->optimizer + r->activations + r->temporaries;
  r->fits = (double)r->total <= r->capacity;

  /* FLOPs */
  double fwd = 0, scores = 0, in_loops = 0;
  func_flops(m->main, &fwd, &scores, &in_loops, 1);
  if (r->training) {
    r->model_flops_per_step = 3 * fwd;
    r->recompute_flops = scores + (st->remat == REMAT_FULL ? in_loops : 0);
  } else {
    r->model_flops_per_step = fwd;
  }
  r->flops_per_step = r->model_flops_per_step + r->recompute_flops;
}

/* ---- suggestions ---- */

/* Re-estimate p changed by the caller, quietly (layout warnings belong to the real program). */
static void estimate_quiet(const Program *q, IrModule *m, MemoryReport *r) {
  diag_push_quiet();
  memory_estimate(q, m, r);
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

static void fmt_bytes(char *buf, size_t n, double b) {
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
  fmt_bytes(b, sizeof b, 2 * ag.bytes_per_device + rs.bytes_per_device);
  snprintf(out, n, "AllGather of those weights over '%s' in forward and backward, ReduceScatter of "
           "their gradients: %s sent per device per step, about %.3g s on %s",
           q->mesh->axes[axis].name, b, 2 * ag.time_s + rs.time_s, ag.link_name);
}

int memory_suggest(const Program *p, IrModule *m, const MemoryReport *base, MemSuggestion *out, int max) {
  int n = 0;
  if (!p->mesh || max <= 0) return 0;
  Walk w = {.p = p, .m = m};
  (void)w;
  char b[32];

  /* 1. shard a param dim over a mesh axis: one more layout rule */
  const Layout *L = p->layout;
  for (int di = 0; di < p->ndims; di++) {
    const Dim *d = p->dims[di];
    if (!param_has_dim(m, d)) continue;
    for (int a = 0; a < p->mesh->naxes; a++) {
      const MeshAxis *ax = &p->mesh->axes[a];
      if (ax->size <= 1 || layout_has_rule(L, d->name, ax->name)) continue;
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
    for (int mul = 2; batch && mul <= 16; mul *= 2) {
      Step st = *p->step;
      st.microbatches = p->step->microbatches * mul;
      if (batch->size % st.microbatches) break;
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

  /* 5. a bigger mesh: twice the most-major axis, if the target can form it */
  if (p->mesh->naxes > 0) {
    Mesh big = *p->mesh;
    big.axes[0].size *= 2;
    diag_push_quiet();
    bool ok = mesh_form(&big);
    diag_pop_quiet();
    if (ok) {
      Program q = *p;
      q.mesh = &big;
      MemoryReport rep;
      estimate_quiet(&q, m, &rep);
      MemSuggestion s = {.saved = base->total - rep.total, .new_total = rep.total, .fits = rep.fits};
      snprintf(s.text, sizeof s.text, "double mesh axis '%s' to %d (%lld devices)", big.axes[0].name,
               big.axes[0].size, (long long)big.devices);
      fmt_bytes(b, sizeof b, (double)base->params);
      snprintf(s.comm, sizeof s.comm, "collectives over '%s' span twice the devices (%s)", big.axes[0].name,
               cost_link_name(big.axes[0].link));
      push_suggestion(out, &n, max, &s);
    }
  }
  memory_estimate(p, m, &(MemoryReport){0}); /* restore p's shardings on the IR */
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
    fmt_bytes(b, sizeof b, (double)rows[i].v);
    fprintf(out, "  %-12s %12s\n", rows[i].k, b);
  }
  fmt_bytes(b, sizeof b, (double)r->total);
  char c[32];
  fmt_bytes(c, sizeof c, r->capacity);
  fprintf(out, "  %-12s %12s of %s HBM (%.1f%%): %s\n", "total", b, c,
          r->capacity > 0 ? 100.0 * (double)r->total / r->capacity : 0.0, r->fits ? "fits" : "DOES NOT FIT");
}
