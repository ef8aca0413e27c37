/* bucket.c: small weight and gradient collectives fused into buckets (bucket.h).
 *
 * Which collectives qualify is a question of dataflow, asked once for the module:
 *   weights    forward from every param: through views, casts, slices, collectives and into loop
 *              bodies (a stacked param's slice, an invariant). An AllGather of such a value, or
 *              any AllGather of the optimizer update (zero's gather of the updated params), is a
 *              weight's.
 *   gradients  backward from every step gradient: through views, casts, slices, collectives, the
 *              accumulation's adds, and out of loops (a loop result to its body output). An
 *              AllReduce or ReduceScatter of or to such a value is a gradient's.
 * Activation collectives (tensor parallelism's) are never bucketed: they sit on the critical
 * path, one after the op that needs them.
 *
 * Buckets form in program order, one open bucket per key (kind, axes, dtype, phase):
 *   reductions  sink: a reduction joins the open bucket while no member's result has been read
 *               yet; the members move down to the last one (a gradient waits for the bucket).
 *   gathers     hoist: a gather joins while its operand already exists where the bucket's first
 *               member runs; the members move up to the first one. */
#include <string.h>

#include "bucket.h"
#include "step.h"

typedef struct BW {
  IrModule *m;
  const Program *p;
  Arena *a;
  uint8_t *weight, *grad; /* by value id */
  int next_id;
  int formed;
} BW;

static bool passes_through(OpKind k) {
  return k == OP_RENAME || k == OP_SPLIT || k == OP_MERGE || k == OP_CAST || k == OP_TRANSPOSE || k == OP_SLICE ||
         ir_op_is_collective(k);
}

/* ---- weights, forward ---- */

static void mark_weights(BW *W, IrFunc *f) {
  for (Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_PARAM) W->weight[op->results[0]->id] = 1;
    if (passes_through(op->kind) && op->noperands >= 1 && W->weight[op->operands[0]->id])
      W->weight[op->results[0]->id] = 1;
    if (op->kind == OP_LOOP && op->body) {
      for (int i = 0; i < op->noperands && i < op->body->ninputs; i++) {
        bool carried = i >= op->nslices && i < op->nslices + op->ncarried;
        if (!carried && W->weight[op->operands[i]->id]) W->weight[op->body->inputs[i]->id] = 1;
      }
      mark_weights(W, op->body);
    }
  }
}

/* ---- gradients, backward ---- */

static void grad_value(BW *W, const Value *v);

static void grad_func_outputs(BW *W, const Op *loop, int r) {
  if (loop->body && r < loop->body->noutputs) grad_value(W, loop->body->outputs[r]);
}

static void grad_value(BW *W, const Value *v) {
  if (!v || W->grad[v->id]) return;
  W->grad[v->id] = 1;
  const Op *d = v->def;
  if (!d) return;
  if (passes_through(d->kind) && d->noperands >= 1) {
    grad_value(W, d->operands[0]);
  } else if (d->kind == OP_ADD && d->phase == PHASE_ACCUMULATE) {
    for (int i = 0; i < d->noperands; i++) grad_value(W, d->operands[i]);
  } else if (d->kind == OP_LOOP) {
    for (int r = 0; r < d->nresults; r++)
      if (d->results[r] == v) grad_func_outputs(W, d, r);
  }
}

/* ---- forming ---- */

typedef VEC(Op *) OpVec;

typedef struct Bucket {
  OpKind kind;
  uint16_t axes;
  DType dtype;
  uint8_t phase;
  int64_t bytes;
  OpVec ops;
  bool open;
} Bucket;

typedef VEC(Bucket) BucketVec;

static int64_t coll_bytes(const BW *W, const Op *op) {
  const Value *x = op->operands[0], *r = op->results[0];
  int64_t a = sharding_local_bytes(&x->type, &x->sharding, W->p->mesh);
  int64_t b = sharding_local_bytes(&r->type, &r->sharding, W->p->mesh);
  return a > b ? a : b;
}

static bool is_gather(const BW *W, const Op *op) {
  return op->kind == OP_ALL_GATHER && (W->weight[op->operands[0]->id] || op->phase == PHASE_UPDATE);
}

static bool is_reduction(const BW *W, const Op *op) {
  return (op->kind == OP_ALL_REDUCE || op->kind == OP_REDUCE_SCATTER) && !op->reduce_max &&
         (W->grad[op->results[0]->id] || W->grad[op->operands[0]->id]);
}

/* Moves the members next to each other (reductions down to the last, gathers up to the first)
 * and numbers them, when there are two or more. */
static void close_bucket(BW *W, IrFunc *f, Bucket *b) {
  b->open = false;
  if (b->ops.len < 2) return;
  int id = ++W->next_id;
  if (b->kind == OP_ALL_GATHER) {
    Op *at = b->ops.data[0]->next; /* after the first */
    for (int i = 1; i < b->ops.len; i++) {
      Op *c = b->ops.data[i];
      if (c != at) {
        ir_remove(f, c);
        if (at) ir_insert_before(f, at, c);
        else ir_append(f, c);
      } else {
        at = c->next;
      }
    }
  } else {
    Op *last = b->ops.data[b->ops.len - 1];
    for (int i = 0; i + 1 < b->ops.len; i++) {
      ir_remove(f, b->ops.data[i]);
      ir_insert_before(f, last, b->ops.data[i]);
    }
  }
  for (int i = 0; i < b->ops.len; i++) b->ops.data[i]->bucket = id;
  W->formed++;
}

static bool reads_any(const Op *op, const Bucket *b) {
  for (int i = 0; i < op->noperands; i++)
    for (int k = 0; k < b->ops.len; k++)
      if (op->operands[i] == b->ops.data[k]->results[0]) return true;
  return false;
}

static void bucket_func(BW *W, IrFunc *f) {
  for (Op *op = f->first; op; op = op->next)
    if (op->kind == OP_LOOP && op->body) bucket_func(W, op->body);
  /* each op's position, for the gathers' "its operand exists there" */
  int n = 0;
  for (Op *op = f->first; op; op = op->next) n++;
  Op **order = ARENA_ARRAY(W->a, Op *, n + 1);
  n = 0;
  for (Op *op = f->first; op; op = op->next) order[n++] = op;
  BucketVec open = {0};
  for (int k = 0; k < n; k++) {
    Op *op = order[k];
    /* a reduction bucket closes before the first read of one of its results */
    for (int i = 0; i < open.len; i++)
      if (open.data[i].open && open.data[i].kind != OP_ALL_GATHER && reads_any(op, &open.data[i]))
        close_bucket(W, f, &open.data[i]);
    bool gather = is_gather(W, op), reduction = !gather && is_reduction(W, op);
    if (!gather && !reduction) continue;
    int64_t bytes = coll_bytes(W, op);
    if (bytes >= BUCKET_CAP_BYTES) continue;
    DType dt = op->results[0]->type.dtype;
    Bucket *b = NULL;
    for (int i = 0; i < open.len && !b; i++) {
      Bucket *c = &open.data[i];
      if (c->open && c->kind == op->kind && c->axes == op->axes && c->dtype == dt && c->phase == op->phase) b = c;
    }
    if (b && gather) { /* the operand must exist where the bucket's first gather runs */
      const Value *x = op->operands[0];
      const Op *first = b->ops.data[0];
      bool ready = !x->def || x->func != f;
      for (int j = 0; j < k && !ready && order[j] != first; j++) ready = order[j] == x->def;
      if (!ready) b = NULL;
    }
    if (b && b->bytes + bytes > BUCKET_CAP_BYTES) {
      close_bucket(W, f, b);
      b = NULL;
    }
    if (!b) {
      for (int i = 0; i < open.len && !b; i++)
        if (!open.data[i].open && open.data[i].kind == op->kind && open.data[i].axes == op->axes &&
            open.data[i].dtype == dt && open.data[i].phase == op->phase)
          b = &open.data[i]; /* reuse the slot of a closed bucket of the same key */
      if (!b) {
        VEC_PUSH(W->a, open, ((Bucket){0}));
        b = &open.data[open.len - 1];
      }
      *b = (Bucket){.kind = op->kind, .axes = op->axes, .dtype = dt, .phase = op->phase, .open = true};
    }
    VEC_PUSH(W->a, b->ops, op);
    b->bytes += bytes;
  }
  for (int i = 0; i < open.len; i++)
    if (open.data[i].open) close_bucket(W, f, &open.data[i]);
}

int bucket_module(IrModule *m, const Program *p) {
  if (!m || !m->main || !p || !p->mesh) return 0;
  Arena a;
  arena_init(&a);
  BW W = {.m = m, .p = p, .a = &a};
  int nv = m->nvalues + 1;
  W.weight = ARENA_ARRAY(&a, uint8_t, nv);
  W.grad = ARENA_ARRAY(&a, uint8_t, nv);
  mark_weights(&W, m->main);
  for (int i = 0; m->step && i < m->step->nparams; i++) grad_value(&W, m->step->params[i].grad);
  bucket_func(&W, m->main);
  arena_free(&a);
  return W.formed;
}
