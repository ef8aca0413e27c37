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
 * Buckets form in program order, one open bucket per key (kind, axes, dtype, phase). A member
 * joins in one of two ways, the bucket's second member fixing which:
 *   hoist  its operand already exists where the bucket's first member runs: the members move up
 *          to the first (an FSDP layer's weights gathered where the first is needed; the
 *          gradients a loop made, reduced together right after it);
 *   sink   no member's result has been read yet: the members move down to the last (a layer's
 *          gradients wait for the bucket's last; zero's gathers of the updated params). */
#include <limits.h>
#include <stdint.h>
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
  /* the function being bucketed: each op's predecessor in it (NULL: the first) and an order key
   * (increasing along the function), open addressing by op, kept up to date by move_before, so
   * that neither a move nor a question of order walks the function */
  const Op **pkey;
  Op **pval;
  int64_t *kval;
  size_t pcap;
  int *uses;            /* by value id: the reads of it in the function (its ops' operands, its
                           outputs), as ir_count_uses counts them */
} BW;

static size_t prev_slot(const BW *W, const Op *op) {
  uint64_t x = (uint64_t)(uintptr_t)op;
  x = (x ^ (x >> 31)) * 0x9e3779b97f4a7c15ull;
  size_t j = (size_t)(x ^ (x >> 29)) & (W->pcap - 1);
  while (W->pkey[j] && W->pkey[j] != op) j = (j + 1) & (W->pcap - 1);
  return j;
}

static void set_prev(BW *W, const Op *op, Op *prev) {
  size_t j = prev_slot(W, op);
  W->pkey[j] = op;
  W->pval[j] = prev;
}

#define KEY_GAP ((int64_t)1 << 20)

static int64_t key_of(const BW *W, const Op *op) { return W->kval[prev_slot(W, op)]; }

/* Order keys from scratch: the ops of f in order, KEY_GAP apart. */
static void keys_renumber(BW *W, const IrFunc *f) {
  int64_t k = 0;
  for (const Op *o = f->first; o; o = o->next) W->kval[prev_slot(W, o)] = k += KEY_GAP;
}

/* f's ops with their predecessors and order keys, for move_before; the reads of every value. */
static void prev_build(BW *W, IrFunc *f) {
  size_t n = 0;
  for (const Op *o = f->first; o; o = o->next) n++;
  W->pcap = 16;
  while (W->pcap < 2 * n + 2) W->pcap *= 2;
  W->pkey = ARENA_ARRAY(W->a, const Op *, W->pcap);
  W->pval = ARENA_ARRAY(W->a, Op *, W->pcap);
  W->kval = ARENA_ARRAY(W->a, int64_t, W->pcap);
  Op *prev = NULL;
  for (Op *o = f->first; o; prev = o, o = o->next) set_prev(W, o, prev);
  keys_renumber(W, f);
  W->uses = ARENA_ARRAY(W->a, int, W->m->nvalues + 1);
  for (const Op *o = f->first; o; o = o->next)
    for (int i = 0; i < o->noperands; i++)
      if (o->operands[i] && o->operands[i]->id >= 0 && o->operands[i]->id < W->m->nvalues) W->uses[o->operands[i]->id]++;
  for (int i = 0; i < f->noutputs; i++)
    if (f->outputs[i] && f->outputs[i]->id >= 0 && f->outputs[i]->id < W->m->nvalues) W->uses[f->outputs[i]->id]++;
}

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

typedef enum { MODE_ANY, MODE_HOIST, MODE_SINK } Mode;

typedef struct Bucket {
  OpKind kind;
  uint16_t axes;
  DType dtype;
  uint8_t phase;
  int64_t bytes;
  OpVec ops;
  bool open;
  Mode mode;            /* how its members come together, fixed by the second member */
  bool read;            /* a member's result has been read since it ran: no sinking past that */
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

/* Whether x exists where `first` runs in f (an input of f, or made by an op before it). */
static bool exists_before(const BW *W, const IrFunc *f, const Value *x, const Op *first) {
  if (!x->def || x->func != f) return true;
  return key_of(W, x->def) < key_of(W, first);
}

/* A cast or view read by nothing else, which may move up with the collective that reads it. */
static bool movable_def(const BW *W, const IrFunc *f, const Value *x) {
  const Op *d = x->def;
  return d && d->func == f && d->noperands == 1 && d->nresults == 1 &&
         (d->kind == OP_CAST || d->kind == OP_RENAME || d->kind == OP_TRANSPOSE || d->kind == OP_SLICE) &&
         x->id >= 0 && x->id < W->m->nvalues && W->uses[x->id] == 1;
}

/* Whether x can be had at position `at`: it exists there, or it is made from what exists there
 * by a short chain of movable casts and views (moved up with the collective). */
static bool can_have_before(const BW *W, const IrFunc *f, const Value *x, const Op *first) {
  for (int depth = 0; depth < 4; depth++) {
    if (exists_before(W, f, x, first)) return true;
    if (!movable_def(W, f, x)) return false;
    x = x->def->operands[0];
  }
  return false;
}

/* The ops a hoisted member brings along: the chain of casts and views making its operand that
 * is not made before the bucket's first member (deepest first), then the member. */
static int hoisted_chain(const BW *W, const IrFunc *f, Op *op, const Op *first, Op **chain) {
  Op *rev[5];
  int n = 0;
  rev[n++] = op;
  for (const Value *x = op->operands[0]; n < 5 && movable_def(W, f, x); x = x->def->operands[0]) {
    if (exists_before(W, f, x, first)) break;
    rev[n++] = x->def;
  }
  for (int i = 0; i < n; i++) chain[i] = rev[n - 1 - i];
  return n;
}

/* Moves ops[0..n) (ops of f, pos not among them) to just before pos, in this order (pos NULL or
 * not in f: to f's end): what ir_remove then ir_insert_before of each does, each op unlinked
 * through its predecessor (W's map of f) rather than by a walk over f. Duplicates are told apart
 * by a mark in Op.bucket while it runs. */
static void move_before(BW *W, IrFunc *f, Op **ops, int n, Op *pos) {
  int *saved = ARENA_ARRAY(W->a, int, n > 0 ? n : 1);
  Op **mv = ARENA_ARRAY(W->a, Op *, n > 0 ? n : 1);
  int m = 0;
  for (int i = n - 1; i >= 0; i--) { /* an op listed twice ends at its last place, as moved twice */
    if (ops[i]->bucket == INT_MIN) continue;
    saved[m] = ops[i]->bucket;
    ops[i]->bucket = INT_MIN;
    mv[m++] = ops[i];
  }
  for (int i = 0; i < m / 2; i++) { /* back in order */
    Op *t = mv[i];
    mv[i] = mv[m - 1 - i];
    mv[m - 1 - i] = t;
    int u = saved[i];
    saved[i] = saved[m - 1 - i];
    saved[m - 1 - i] = u;
  }
  for (int i = 0; i < m; i++) { /* unlinked, in turn */
    Op *o = mv[i], *p = W->pval[prev_slot(W, o)], *nx = o->next;
    if (p) p->next = nx;
    else f->first = nx;
    if (nx) set_prev(W, nx, p);
    else f->last = p;
    o->next = NULL;
  }
  for (int i = 0; i < m; i++) {
    mv[i]->bucket = saved[i];
    mv[i]->func = f;
    mv[i]->next = i + 1 < m ? mv[i + 1] : NULL;
    if (i > 0) set_prev(W, mv[i], mv[i - 1]);
  }
  if (m == 0) return;
  size_t j = pos ? prev_slot(W, pos) : 0;
  int64_t lo, hi;
  if (!pos || !W->pkey[j]) {
    Op *last = f->last;
    if (last) last->next = mv[0];
    else f->first = mv[0];
    set_prev(W, mv[0], last);
    f->last = mv[m - 1];
    lo = last ? key_of(W, last) : 0;
    hi = lo + (int64_t)(m + 1) * KEY_GAP;
  } else {
    Op *before = W->pval[j];
    mv[m - 1]->next = pos;
    set_prev(W, pos, mv[m - 1]);
    if (before) before->next = mv[0];
    else f->first = mv[0];
    set_prev(W, mv[0], before);
    lo = before ? key_of(W, before) : key_of(W, pos) - (int64_t)(m + 1) * KEY_GAP;
    hi = key_of(W, pos);
  }
  /* the moved ops' keys between their new neighbours' (or all renumbered, where no room is left) */
  if (hi - lo <= m) {
    keys_renumber(W, f);
    return;
  }
  for (int i = 0; i < m; i++) W->kval[prev_slot(W, mv[i])] = lo + (hi - lo) / (m + 1) * (i + 1);
}

/* Moves the members next to each other (hoisted up to the first, or sunk down to the last) and
 * numbers them, when there are two or more. */
static void close_bucket(BW *W, IrFunc *f, Bucket *b) {
  b->open = false;
  if (b->ops.len < 2) return;
  int id = ++W->next_id;
  if (b->mode == MODE_HOIST) {
    /* the later members' chains go just before the first (what they read exists there), the
     * later members right after it: the members run back to back */
    Op *first = b->ops.data[0];
    OpVec chains = {0};
    for (int i = 1; i < b->ops.len; i++) {
      Op *chain[5];
      int n = hoisted_chain(W, f, b->ops.data[i], first, chain);
      for (int j = 0; j + 1 < n; j++) VEC_PUSH(W->a, chains, chain[j]);
    }
    move_before(W, f, chains.data, chains.len, first);
    /* the later members right after the first, in order (before what follows it once they are
     * out of the way) */
    Op *at = first->next;
    while (at) {
      bool member = false;
      for (int i = 1; i < b->ops.len && !member; i++) member = at == b->ops.data[i];
      if (!member) break;
      at = at->next;
    }
    move_before(W, f, b->ops.data + 1, b->ops.len - 1, at);
  } else {
    move_before(W, f, b->ops.data, b->ops.len - 1, b->ops.data[b->ops.len - 1]);
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
  BucketVec open = {0};
  prev_build(W, f);
  /* closing a bucket moves only ops before the current one (its members and their chains), so
   * the walk goes on from the current op */
  for (Op *op = f->first; op; op = op->next) {
    /* a read of a member's result: a sinking bucket closes, an undecided one can only hoist */
    for (int i = 0; i < open.len; i++) {
      Bucket *b = &open.data[i];
      if (!b->open || !reads_any(op, b)) continue;
      if (b->mode == MODE_SINK) close_bucket(W, f, b);
      else b->read = true;
    }
    bool gather = is_gather(W, op), reduction = !gather && is_reduction(W, op);
    if (ir_op_is_collective(op->kind)) op->role = gather ? ROLE_WEIGHT : reduction ? ROLE_GRADIENT : ROLE_ACTIVATION;
    if (!gather && !reduction) continue;
    int64_t bytes = coll_bytes(W, op);
    if (bytes >= BUCKET_CAP_BYTES) continue;
    DType dt = op->results[0]->type.dtype;
    Bucket *b = NULL;
    for (int i = 0; i < open.len && !b; i++) {
      Bucket *c = &open.data[i];
      if (c->open && c->kind == op->kind && c->axes == op->axes && c->dtype == dt && c->phase == op->phase) b = c;
    }
    if (b) {
      bool hoist = b->mode != MODE_SINK && can_have_before(W, f, op->operands[0], b->ops.data[0]);
      bool sink = b->mode != MODE_HOIST && !b->read;
      if (b->bytes + bytes > BUCKET_CAP_BYTES || (!hoist && !sink)) {
        close_bucket(W, f, b);
        b = NULL;
      } else if (b->mode == MODE_ANY) {
        b->mode = hoist ? MODE_HOIST : MODE_SINK; /* hoisting first: the bucket runs as early as it can */
      }
    }
    if (!b) {
      for (int i = 0; i < open.len && !b; i++)
        if (!open.data[i].open) b = &open.data[i]; /* reuse a closed slot */
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
