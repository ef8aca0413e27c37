/* autodiff.c: reverse-mode differentiation of IR regions (see autodiff.h).
 *
 * One context (Ctx) per region being differentiated: the top region (a step's function or its
 * microbatch body), whose backward goes at its own end, and one per stacked loop body, whose
 * backward goes into a new region, the body of the reverse loop. A context runs in four stages:
 *
 *   1. needs     which values depend on a differentiable root (the `wrt` values at the top; in a
 *                loop body, the inputs whose outer operand needs one, carried ones to a fixed
 *                point). Only those get gradients.
 *   2. prepare   every forward loop of the region gets its backward body built now, before the
 *                region's own walk, so that the residuals it stacks are added to the forward loop
 *                (Op.nstacked) while nothing has copied that loop yet.
 *   3. recompute under remat = full, a loop context copies the whole forward body into the
 *                backward body first.
 *   4. walk      the region's ops in reverse: each op with a gradient on its result adds its
 *                operands' gradients (accumulated with OP_ADD, conformed to each operand's type:
 *                broadcast dims summed away, transposed to its order, cast to its dtype).
 *
 * Backward ops read forward values through fwd_value(): at the top the value itself (marked
 * saved); in a loop context a stacked-param slice, an invariant, a residual (a new stacked output
 * of the forward loop) or a recomputed copy, per the remat policy. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"
#include "diag.h"
#include "route.h"

typedef VEC(Value *) ValueVec;
typedef VEC(int) IntVec;

typedef struct Ad {
  IrModule *m;
  RematKind remat;
  bool failed;
} Ad;

/* Where an input of a backward loop body comes from, in the enclosing context. */
typedef struct SliceSrc {
  Value *outer;         /* a stacked operand of the forward loop (a param stack), or NULL ... */
  int residual;         /* ... the residual's index (the forward loop's stacked result) */
} SliceSrc;

/* The backward of one forward loop, built in `prepare` and emitted by the walk. */
typedef struct LoopGrad {
  Op *loop;             /* the forward loop */
  IrFunc *body;         /* the backward body */
  ValueVec sl_in;       /* backward body slice inputs ... */
  VEC(SliceSrc) sl_src; /* ... and where each comes from */
  ValueVec car_in;      /* carried inputs: the gradients of the forward's carried values, then
                           the accumulators of invariants' gradients */
  IntVec car_src;       /* the forward loop operand each one is the gradient of */
  int ncar_grads;       /* car_in[0, ncar_grads): carried gradients */
  ValueVec inv_in, inv_outer; /* invariant inputs and the forward values they stand for */
  IntVec stk_src;       /* stacked outputs: gradient of forward loop operand stk_src[i] (a slice) */
  ValueVec res;         /* forward body values stacked for the backward */
  int res_first;        /* the forward loop's result index of res[0] */
} LoopGrad;

typedef struct Ctx {
  Ad *ad;
  IrFunc *fwd;          /* the forward region */
  IrFunc *out;          /* where backward ops go (fwd itself at the top) */
  bool top;
  LoopGrad *lg;         /* loop contexts: the backward being built */
  Op **fops;            /* fwd's ops in order, taken before anything was appended */
  int nfops;
  int nneeds;
  uint8_t *needs;       /* by value id (< nneeds) */
  int n;
  Value **grad;         /* by forward value id (< n) */
  Value **fmap;         /* loop contexts: by forward value id, the value standing for it in out */
  VEC(LoopGrad *) loops;
} Ctx;

/* ---- emitting ---- */

static bool is_float(DType d) { return d >= 0 && d < DT__COUNT && !dtype_is_int(d); }

static Op *emit_op(IrModule *m, IrFunc *f, OpKind k, SrcLoc loc, Value **ops, int n, TensorType t, int phase) {
  Op *op = ir_op_new(m, f, k, loc, ops, n, &t, 1);
  op->phase = (uint8_t)phase;
  ir_append(f, op);
  return op;
}

static void op_set_dims(IrModule *m, Op *op, Dim *const *dims, int n) {
  op->dims = ARENA_ARRAY(m->arena, Dim *, n > 0 ? n : 1);
  for (int i = 0; i < n; i++) op->dims[i] = dims[i];
  op->ndims = n;
}

Value *ad_const(IrModule *m, IrFunc *f, double x, DType dt, SrcLoc loc, OpPhase phase) {
  TensorType t = {.dtype = dt, .rank = 0};
  Op *op = emit_op(m, f, OP_CONST, loc, NULL, 0, t, phase);
  op->scalar = x;
  return op->results[0];
}

Value *ad_zeros(IrModule *m, IrFunc *f, TensorType t, SrcLoc loc, OpPhase phase) {
  Value *z = ad_const(m, f, 0, t.dtype, loc, phase);
  if (t.rank == 0) return z;
  Op *op = emit_op(m, f, OP_BROADCAST, loc, &z, 1, t, phase);
  op_set_dims(m, op, t.dims, t.rank);
  return op->results[0];
}

/* a's dims, then b's that a lacks (language.md's result-dims rule), in dtype dt. */
static TensorType union_type(const TensorType *a, const TensorType *b, DType dt) {
  TensorType t = *a;
  t.dtype = dt;
  for (int i = 0; i < b->rank && t.rank < MAX_RANK; i++)
    if (tensor_type_find(&t, b->dims[i]) < 0) t.dims[t.rank++] = b->dims[i];
  return t;
}

static TensorType drop_dims(const TensorType *t, Dim *const *drop, int n) {
  TensorType r = {.dtype = t->dtype};
  for (int i = 0; i < t->rank; i++) {
    bool d = false;
    for (int k = 0; k < n; k++) d |= drop[k] == t->dims[i];
    if (!d) r.dims[r.rank++] = t->dims[i];
  }
  return r;
}

/* Backward ops of a context: at the end of its out region, PHASE_BACKWARD. */
static Op *bop(Ctx *c, OpKind k, SrcLoc loc, Value **ops, int n, TensorType t) {
  return emit_op(c->ad->m, c->out, k, loc, ops, n, t, PHASE_BACKWARD);
}

static Value *bval(Ctx *c, OpKind k, SrcLoc loc, Value **ops, int n, TensorType t) {
  return bop(c, k, loc, ops, n, t)->results[0];
}

static Value *bdims(Ctx *c, OpKind k, SrcLoc loc, Value **ops, int n, TensorType t, Dim *const *dims, int nd) {
  Op *op = bop(c, k, loc, ops, n, t);
  op_set_dims(c->ad->m, op, dims, nd);
  return op->results[0];
}

static Value *cst(Ctx *c, double x, DType dt, SrcLoc loc) {
  return ad_const(c->ad->m, c->out, x, dt, loc, PHASE_BACKWARD);
}

/* Elementwise binary op (broadcast by dim name), in a's dtype. */
static Value *bin(Ctx *c, OpKind k, SrcLoc loc, Value *a, Value *b) {
  Value *ops[2] = {a, b};
  return bval(c, k, loc, ops, 2, union_type(&a->type, &b->type, a->type.dtype));
}

static Value *un(Ctx *c, OpKind k, SrcLoc loc, Value *a) { return bval(c, k, loc, &a, 1, a->type); } /* k(a) */
static Value *neg(Ctx *c, SrcLoc loc, Value *a) { return un(c, OP_NEG, loc, a); }

static Value *cast(Ctx *c, SrcLoc loc, Value *a, DType dt) {
  if (a->type.dtype == dt) return a;
  TensorType t = a->type;
  t.dtype = dt;
  return bval(c, OP_CAST, loc, &a, 1, t);
}

/* g made exactly of type want: the dims want lacks summed away (broadcasting in the forward),
 * the dims it has that g lacks broadcast, the dim order want's, the dtype want's (widened before
 * summing, narrowed after). */
static Value *conform(Ctx *c, Value *g, const TensorType *want, SrcLoc loc) {
  if (g->type.dtype != want->dtype && dtype_bytes(want->dtype) > dtype_bytes(g->type.dtype))
    g = cast(c, loc, g, want->dtype);
  Dim *extra[MAX_RANK];
  int ne = 0;
  for (int i = 0; i < g->type.rank; i++)
    if (tensor_type_find(want, g->type.dims[i]) < 0) extra[ne++] = g->type.dims[i];
  if (ne) g = bdims(c, OP_SUM, loc, &g, 1, drop_dims(&g->type, extra, ne), extra, ne);
  g = cast(c, loc, g, want->dtype);
  if (g->type.rank < want->rank) {
    Dim *add[MAX_RANK];
    int na = 0;
    for (int i = 0; i < want->rank; i++)
      if (tensor_type_find(&g->type, want->dims[i]) < 0) add[na++] = want->dims[i];
    return bdims(c, OP_BROADCAST, loc, &g, 1, *want, add, na);
  }
  if (!tensor_type_equal(&g->type, want)) g = bval(c, OP_TRANSPOSE, loc, &g, 1, *want);
  return g;
}

static Value *zeros(Ctx *c, TensorType t, SrcLoc loc) { return ad_zeros(c->ad->m, c->out, t, loc, PHASE_BACKWARD); }

/* ---- cloning ---- */

TensorType ad_subst_type(const AdClone *cl, TensorType t) {
  if (cl->from)
    for (int i = 0; i < t.rank; i++)
      if (t.dims[i] == cl->from) t.dims[i] = cl->to;
  return t;
}

const TypeSpec *ad_subst_spec(const AdClone *cl, const TypeSpec *s) {
  if (!s || !cl->from) return s;
  bool has = false;
  for (int i = 0; i < s->rank; i++) has |= s->dims[i] == cl->from;
  if (!has) return s;
  TypeSpec *r = ARENA_NEW(cl->m->arena, TypeSpec);
  *r = *s;
  for (int i = 0; i < r->rank; i++)
    if (r->dims[i] == cl->from) r->dims[i] = cl->to;
  return r;
}

static IrFunc *clone_body(const AdClone *cl, const IrFunc *src, IrFunc *parent) {
  IrModule *m = cl->m;
  IrFunc *b = ir_func_new(m, src->name, parent);
  int n = m->nvalues;
  Value **map = calloc((size_t)(n > 0 ? n : 1), sizeof(Value *));
  if (!map) abort();
  for (int i = 0; i < src->ninputs; i++) {
    const Value *in = src->inputs[i];
    Value *x = ir_func_add_input(m, b, ad_subst_type(cl, in->type), in->name);
    x->spec = ad_subst_spec(cl, in->spec);
    if (in->id < n) map[in->id] = x;
  }
  for (const Op *op = src->first; op; op = op->next) {
    Value **ops = ARENA_ARRAY(m->arena, Value *, op->noperands + 1);
    for (int i = 0; i < op->noperands; i++) ops[i] = op->operands[i]->id < n ? map[op->operands[i]->id] : NULL;
    Op *c = ad_clone_op(cl, op, b, ops);
    for (int i = 0; i < op->nresults; i++)
      if (op->results[i]->id < n) map[op->results[i]->id] = c->results[i];
  }
  b->noutputs = src->noutputs;
  b->outputs = ARENA_ARRAY(m->arena, Value *, src->noutputs + 1);
  for (int i = 0; i < src->noutputs; i++) b->outputs[i] = src->outputs[i]->id < n ? map[src->outputs[i]->id] : NULL;
  free(map);
  return b;
}

Op *ad_clone_op(const AdClone *cl, const Op *src, IrFunc *dst, Value *const *operands) {
  IrModule *m = cl->m;
  TensorType *types = ARENA_ARRAY(m->arena, TensorType, src->nresults + 1);
  for (int i = 0; i < src->nresults; i++) types[i] = ad_subst_type(cl, src->results[i]->type);
  Op *op = ir_op_new(m, dst, src->kind, src->loc, (Value **)operands, src->noperands, types, src->nresults);
  for (int i = 0; i < src->nresults; i++) {
    op->results[i]->name = src->results[i]->name;
    op->results[i]->spec = ad_subst_spec(cl, src->results[i]->spec);
  }
  if (src->ndims) {
    op_set_dims(m, op, src->dims, src->ndims);
    for (int i = 0; i < op->ndims; i++)
      if (cl->from && op->dims[i] == cl->from) op->dims[i] = cl->to;
  }
  op->scalar = src->scalar;
  op->index = src->index;
  op->flag = src->flag;
  op->loc2 = src->loc2;
  op->count = src->count;
  op->stack_dim = src->stack_dim;
  op->nslices = src->nslices;
  op->ncarried = src->ncarried;
  op->nstacked = src->nstacked;
  op->reverse = src->reverse;
  op->phase = (uint8_t)(cl->phase >= 0 ? cl->phase : src->phase);
  ir_append(dst, op);
  if (src->kind == OP_LOOP && src->body) op->body = clone_body(cl, src->body, dst);
  return op;
}

/* ---- contexts ---- */

static bool needs(const Ctx *c, const Value *v) { return v && v->id < c->nneeds && c->needs[v->id]; }

/* Forward propagation of `needs` through f's ops: a float result needs a gradient when any
 * operand does (a loop's results: when any of its operands does). A route's never does (the gate
 * learns through the probabilities its result is multiplied with). */
static void needs_forward(Ctx *c, const IrFunc *f) {
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_PARAM || op->kind == OP_INPUT || op->kind == OP_CONST || op->kind == OP_ROUTE) continue;
    bool any = false;
    for (int i = 0; i < op->noperands; i++) any |= needs(c, op->operands[i]);
    for (int i = 0; i < op->nresults; i++) {
      Value *r = op->results[i];
      if (r->id < c->nneeds) c->needs[r->id] = any && is_float(r->type.dtype);
    }
  }
}

static Ctx *ctx_new(Ad *ad, IrFunc *fwd, IrFunc *out, LoopGrad *lg) {
  IrModule *m = ad->m;
  Ctx *c = ARENA_NEW(m->arena, Ctx);
  c->ad = ad;
  c->fwd = fwd;
  c->out = out;
  c->lg = lg;
  c->top = lg == NULL;
  for (Op *o = fwd->first; o; o = o->next) c->nfops++;
  c->fops = ARENA_ARRAY(m->arena, Op *, c->nfops + 1);
  int i = 0;
  for (Op *o = fwd->first; o; o = o->next) c->fops[i++] = o;
  c->nneeds = m->nvalues;
  c->needs = ARENA_ARRAY(m->arena, uint8_t, c->nneeds + 1);
  return c;
}

/* After `prepare` (which may add results to forward loops): the gradient and copy tables. */
static void ctx_tables(Ctx *c) {
  IrModule *m = c->ad->m;
  c->n = m->nvalues;
  c->grad = ARENA_ARRAY(m->arena, Value *, c->n + 1);
  c->fmap = ARENA_ARRAY(m->arena, Value *, c->n + 1);
}

static void add_grad(Ctx *c, Value *v, Value *g, SrcLoc loc) {
  if (!g || !needs(c, v) || v->id >= c->n) return;
  g = conform(c, g, &v->type, loc);
  Value *old = c->grad[v->id];
  c->grad[v->id] = old ? bin(c, OP_ADD, loc, old, g) : g;
}

static void fail(Ctx *c, SrcLoc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(Ctx *c, SrcLoc loc, const char *fmt, ...) {
  if (!c->ad->failed) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    diag_error(loc, "%s", msg);
  }
  c->ad->failed = true;
}

/* ---- forward values seen from the backward ---- */

static Value *fwd_value(Ctx *c, Value *v);

static int input_index(const IrFunc *f, const Value *v) {
  if (v->def || v->func != f) return -1;
  for (int i = 0; i < f->ninputs; i++)
    if (f->inputs[i] == v) return i;
  return -1;
}

/* A stacked value the backward body reads one row of per iteration. */
static Value *new_slice(Ctx *c, TensorType t, Name name, Value *outer, int residual) {
  LoopGrad *lg = c->lg;
  Value *in = ir_func_add_input(c->ad->m, lg->body, t, name);
  VEC_PUSH(c->ad->m->arena, lg->sl_in, in);
  SliceSrc s = {outer, residual};
  VEC_PUSH(c->ad->m->arena, lg->sl_src, s);
  return in;
}

/* v, a forward body value, is kept: the forward loop stacks it (a result with the stacking dim). */
static Value *residual(Ctx *c, Value *v) {
  LoopGrad *lg = c->lg;
  if (v->type.rank + 1 > MAX_RANK) {
    fail(c, v->def ? v->def->loc : lg->loop->loc,
         "saving this value for the backward would need %d dims with the stacking dim %s (at most %d)",
         v->type.rank + 1, lg->loop->stack_dim ? lg->loop->stack_dim->name : "?", MAX_RANK);
    return zeros(c, v->type, lg->loop->loc);
  }
  int r = lg->res.len;
  VEC_PUSH(c->ad->m->arena, lg->res, v);
  return new_slice(c, v->type, v->name, NULL, r);
}

/* The copy of a forward op in the backward body, its operands seen from there. */
static void recompute(Ctx *c, Op *op) {
  if (op->nresults > 0 && c->fmap[op->results[0]->id]) return;
  IrModule *m = c->ad->m;
  Value **ops = ARENA_ARRAY(m->arena, Value *, op->noperands + 1);
  for (int i = 0; i < op->noperands; i++) ops[i] = fwd_value(c, op->operands[i]);
  AdClone cl = {.m = m, .phase = PHASE_RECOMPUTE};
  Op *k = ad_clone_op(&cl, op, c->out, ops);
  for (int i = 0; i < op->nresults; i++)
    if (op->results[i]->id < c->n) c->fmap[op->results[i]->id] = k->results[i];
}

static bool policy_keeps(const Ctx *c, const Value *v) {
  switch (c->ad->remat) {
  case REMAT_NONE: return true;
  case REMAT_DOTS: return v->def && (v->def->kind == OP_CONTRACT || v->def->kind == OP_ATTENTION);
  case REMAT_SELECTIVE: return !(v->def && v->def->kind == OP_ATTENTION); /* the attention core recomputed */
  default: return false;
  }
}

/* What the backward reads for forward value v. At the top: v itself, marked saved unless it is a
 * param, an input or a constant. In a loop body: a slice of the stacked param, the invariant, a
 * residual (always for the carried input: the block's input), a copied constant, or, per the
 * policy, a residual or a recomputed copy. */
static Value *fwd_value(Ctx *c, Value *v) {
  if (c->top) {
    if (v->def && v->def->kind != OP_PARAM && v->def->kind != OP_INPUT && v->def->kind != OP_CONST) {
      v->saved = true;
      if (v->def->kind == OP_ATTENTION) v->saved_attention = v->def;
    }
    return v;
  }
  if (v->id < c->n && c->fmap[v->id]) return c->fmap[v->id];
  LoopGrad *lg = c->lg;
  Op *L = lg->loop;
  Value *r;
  int k = input_index(c->fwd, v);
  if (k >= 0) {
    if (k < L->nslices) {
      r = new_slice(c, v->type, v->name, L->operands[k], -1);
    } else if (k < L->nslices + L->ncarried) {
      r = residual(c, v);
    } else {
      r = ir_func_add_input(c->ad->m, lg->body, v->type, v->name);
      VEC_PUSH(c->ad->m->arena, lg->inv_in, r);
      VEC_PUSH(c->ad->m->arena, lg->inv_outer, L->operands[k]);
    }
  } else if (!v->def || v->func != c->fwd) {
    fail(c, L->loc, "internal error: the backward reads a value from outside the loop body");
    r = zeros(c, v->type, L->loc);
  } else if (v->def->kind == OP_CONST) {
    r = ad_const(c->ad->m, c->out, v->def->scalar, v->type.dtype, v->def->loc, PHASE_BACKWARD);
  } else if (v->def->kind == OP_RENAME) {
    /* a rename is a view: kept as its source (x[seq -> kseq] and x are one residual) and renamed
     * again in the backward, whatever the policy */
    recompute(c, v->def);
    r = v->id < c->n ? c->fmap[v->id] : NULL;
    if (!r) r = zeros(c, v->type, v->def->loc);
  } else if (policy_keeps(c, v)) {
    r = residual(c, v);
  } else {
    recompute(c, v->def);
    r = v->id < c->n ? c->fmap[v->id] : NULL;
    if (!r) r = zeros(c, v->type, v->def->loc);
  }
  if (v->id < c->n) c->fmap[v->id] = r;
  return r;
}

#define X(v) fwd_value(c, (v))

/* ---- the rules ---- */

static void backprop_loop(Ctx *c, Op *op);

/* Contraction z = a . b over C: da = g . b over the dims of z that a lacks (b's free dims); with
 * none, the product g * b. Symmetrically for b. */
static Value *contract_grad(Ctx *c, SrcLoc loc, Value *g, Value *other, const TensorType *self) {
  Dim *over[MAX_RANK];
  int n = 0;
  for (int i = 0; i < g->type.rank; i++)
    if (tensor_type_find(self, g->type.dims[i]) < 0) over[n++] = g->type.dims[i];
  Value *o = X(other);
  /* FP8 (fp8_contract_grad): an e5m2 gradient with an e4m3 operand makes a bf16 result */
  bool fp8 = dtype_is_f8(g->type.dtype) && dtype_is_f8(o->type.dtype);
  if (n == 0 && fp8) return bin(c, OP_MUL, loc, cast(c, loc, g, DT_BF16), cast(c, loc, o, DT_BF16));
  if (n == 0) return bin(c, OP_MUL, loc, g, o);
  /* the operand order whose result comes out in self's order, when one does */
  DType rd = dtype_contract_result(g->type.dtype);
  TensorType t1 = union_type(&g->type, &o->type, rd), t2 = union_type(&o->type, &g->type, rd), want = *self;
  want.dtype = rd;
  t1 = drop_dims(&t1, over, n);
  t2 = drop_dims(&t2, over, n);
  bool swap = !tensor_type_equal(&t1, &want) && tensor_type_equal(&t2, &want);
  Value *ops[2] = {swap ? o : g, swap ? g : o};
  return bdims(c, OP_CONTRACT, loc, ops, 2, swap ? t2 : t1, over, n);
}

/* Where the gradient of an FP8 operand goes: an operand cast from a wider float in this function
 * (`f8e4m3(w)`, as Transformer Engine casts its bf16 master weights and activations) passes its
 * bf16 gradient straight to that value, as the cast's own rule would, without rounding it to the
 * operand's FP8 format on the way; any other FP8 value gets it rounded to its dtype. */
static Value *fp8_grad_target(Ctx *c, Value *v) {
  const Op *d = v->def;
  if (!d || d->kind != OP_CAST || d->noperands != 1) return v;
  Value *x = d->operands[0];
  DType dt = x->type.dtype;
  if (dtype_is_int(dt) || dtype_is_f8(dt) || x->id >= c->n || !needs(c, x)) return v;
  return x;
}

/* The contraction z (bf16) = a . b of FP8 operands (Transformer Engine's hybrid recipe): the
 * gradient g is cast to f8e5m2 and contracted with the other FP8 operand, each result bf16
 * (f32 accumulation), so the backward's two contractions run at the FP8 rate as the forward's. */
static void fp8_contract_grad(Ctx *c, SrcLoc loc, Value *g, Value *a, Value *b) {
  Value *g8 = cast(c, loc, g, DT_F8E5M2);
  if (needs(c, a)) add_grad(c, fp8_grad_target(c, a), contract_grad(c, loc, g8, b, &a->type), loc);
  if (needs(c, b)) add_grad(c, fp8_grad_target(c, b), contract_grad(c, loc, g8, a, &b->type), loc);
}

/* The gradient of the patterned operand `self` of a dispatch or a combine (route.h): what
 * contract_grad would give, g . other over the dims of g that self lacks, but only at the route's
 * entries (an OP_ROUTE_GRAD masked by the route's result): elsewhere self is zero, and whatever
 * reads the gradient of a patterned value multiplies it by the pattern again. So it is k dot
 * products per token, never the dense [tokens, experts, slots] product. */
static Value *route_contract_grad(Ctx *c, SrcLoc loc, Value *g, Value *other, Value *self) {
  Dim *over[MAX_RANK];
  int n = 0;
  for (int i = 0; i < g->type.rank; i++)
    if (tensor_type_find(&self->type, g->type.dims[i]) < 0) over[n++] = g->type.dims[i];
  Value *mask = ir_route_source(self);
  Value *ops[3] = {X(mask ? mask : self), g, X(other)};
  TensorType t = self->type;
  t.dtype = g->type.dtype;
  return bdims(c, OP_ROUTE_GRAD, loc, ops, 3, t, over, n);
}

/* The normalised x of a norm, in f32, from ordinary ops: rmsnorm(f32(x), 1) or
 * layernorm(f32(x), 1, 0). Its product with the incoming gradient, summed over the dims the
 * scale lacks, is the scale's gradient. */
static Value *normalised(Ctx *c, Op *op) {
  SrcLoc loc = op->loc;
  Value *x = cast(c, loc, X(op->operands[0]), DT_F32);
  Value *ops[3] = {x, cst(c, 1, DT_F32, loc), NULL};
  int n = 2;
  if (op->kind == OP_LAYERNORM) ops[n++] = cst(c, 0, DT_F32, loc);
  Op *k = bop(c, op->kind, loc, ops, n, x->type);
  op_set_dims(c->ad->m, k, op->dims, op->ndims);
  return k->results[0];
}

/* The gradient of a one-operand elementwise op y = f(a) whose ops.def entry gives it as an
 * expression D(...) of the incoming gradient g, x = a and y: the table's words as ops of the
 * backward (numbers as constants of y's dtype). NULL for every other op. */
static Value *table_grad(Ctx *c, Op *op, Value *g, SrcLoc loc) {
  Value *a = op->operands[0], *y = op->results[0], *T0 = NULL, *T1 = NULL;
  DType dt = y->type.dtype;
  (void)a, (void)y, (void)T0, (void)T1, (void)dt;
#define G g
#define Y X(y)
#define X0 X(a)
#define K(v) cst(c, (v), dt, loc)
#define ADD(p, q) bin(c, OP_ADD, loc, p, q)
#define SUB(p, q) bin(c, OP_SUB, loc, p, q)
#define MUL(p, q) bin(c, OP_MUL, loc, p, q)
#define DIV(p, q) bin(c, OP_DIV, loc, p, q)
#define NEG(p) neg(c, loc, p)
#define GOP(k) bval(c, k, loc, (Value *[2]){X(a), g}, 2, a->type)
#define UN(k, p) un(c, k, loc, p)
#define LET(t, e, body) ((t) = (e), (body))
#define D(e) return (e);
#define GRAD_RULE return NULL;
  switch (op->kind) {
#define OP(e, nm, ar, cl, fl, li, co, lo, at, cv, fn, gr) \
  case e:                                                 \
    gr
#include "ops.def"
  default: return NULL;
  }
#undef G
#undef Y
#undef X0
#undef K
#undef ADD
#undef SUB
#undef MUL
#undef DIV
#undef NEG
#undef GOP
#undef UN
#undef LET
#undef D
#undef GRAD_RULE
}

static void backprop_op(Ctx *c, Op *op) {
  if (ir_op_info(op->kind)->cls == OC_LEAF) return;
  if (op->kind == OP_LOOP) {
    backprop_loop(c, op);
    return;
  }
  if (op->nresults != 1) return;
  Value *y = op->results[0];
  Value *g = y->id < c->n ? c->grad[y->id] : NULL;
  if (!g) return;
  bool any = false;
  for (int i = 0; i < op->noperands; i++) any |= needs(c, op->operands[i]);
  if (!any) return;
  SrcLoc loc = op->loc;
  Value *a = op->noperands > 0 ? op->operands[0] : NULL;
  Value *b = op->noperands > 1 ? op->operands[1] : NULL;
  DType dt = y->type.dtype;
  if (ir_op_info(op->kind)->dgrad) { /* the table's expression (ops.def) */
    add_grad(c, a, table_grad(c, op, g, loc), loc);
    return;
  }
  switch (op->kind) { /* the ops with rules of their own */
  case OP_ADD:
    add_grad(c, a, g, loc);
    add_grad(c, b, g, loc);
    break;
  case OP_SUB:
    add_grad(c, a, g, loc);
    if (needs(c, b)) add_grad(c, b, neg(c, loc, conform(c, g, &b->type, loc)), loc);
    break;
  case OP_MUL:
    if (needs(c, a)) add_grad(c, a, bin(c, OP_MUL, loc, g, X(b)), loc);
    if (needs(c, b)) add_grad(c, b, bin(c, OP_MUL, loc, g, X(a)), loc);
    break;
  case OP_DIV: {
    Value *t = bin(c, OP_DIV, loc, g, X(b)); /* g / b */
    add_grad(c, a, t, loc);
    if (needs(c, b)) add_grad(c, b, neg(c, loc, bin(c, OP_DIV, loc, bin(c, OP_MUL, loc, t, X(a)), X(b))), loc);
    break;
  }
  case OP_SUM: case OP_MEAN: {
    Value *s = g;
    if (op->kind == OP_MEAN) {
      double n = 1;
      for (int i = 0; i < op->ndims; i++) n *= (double)op->dims[i]->size;
      s = bin(c, OP_MUL, loc, g, cst(c, 1 / n, dt, loc));
    }
    add_grad(c, a, s, loc); /* conform broadcasts it back over the reduced dims */
    break;
  }
  case OP_MAX: {
    Value *ops[3] = {X(a), X(y), g};
    add_grad(c, a, bdims(c, OP_MAX_GRAD, loc, ops, 3, a->type, op->dims, op->ndims), loc);
    break;
  }
  case OP_SOFTMAX: {
    Value *ops[2] = {X(y), g};
    add_grad(c, a, bdims(c, OP_SOFTMAX_GRAD, loc, ops, 2, y->type, op->dims, op->ndims), loc);
    break;
  }
  case OP_RMSNORM: case OP_LAYERNORM: {
    if (needs(c, a)) {
      Value *ops[3] = {X(a), X(b), g};
      OpKind k = op->kind == OP_RMSNORM ? OP_RMSNORM_GRAD : OP_LAYERNORM_GRAD;
      add_grad(c, a, bdims(c, k, loc, ops, 3, a->type, op->dims, op->ndims), loc);
    }
    if (needs(c, b) || (op->noperands > 2 && needs(c, op->operands[2]))) {
      Value *gf = cast(c, loc, g, DT_F32);
      if (needs(c, b)) add_grad(c, b, bin(c, OP_MUL, loc, gf, normalised(c, op)), loc);
      if (op->noperands > 2) add_grad(c, op->operands[2], gf, loc);
    }
    break;
  }
  case OP_CONTRACT: {
    int pat;
    bool routed = ir_route_contract(op, &pat) != CONTRACT_DENSE && pat >= 0;
    if (!routed && dtype_is_f8(a->type.dtype) && dtype_is_f8(b->type.dtype)) {
      fp8_contract_grad(c, loc, g, a, b);
      break;
    }
    if (needs(c, a))
      add_grad(c, a, routed && pat == 0 ? route_contract_grad(c, loc, g, b, a) : contract_grad(c, loc, g, b, &a->type),
               loc);
    if (needs(c, b))
      add_grad(c, b, routed && pat == 1 ? route_contract_grad(c, loc, g, a, b) : contract_grad(c, loc, g, a, &b->type),
               loc);
    break;
  }
  case OP_ROUTE: /* no gradient (needs_forward): its result never has one */
    break;
  case OP_RENAME: {
    int np = op->ndims / 2;
    Dim **rev = ARENA_ARRAY(c->ad->m->arena, Dim *, 2 * np + 1);
    for (int i = 0; i < np; i++) { /* the pairs undone in reverse order */
      rev[2 * i] = op->dims[2 * (np - 1 - i) + 1];
      rev[2 * i + 1] = op->dims[2 * (np - 1 - i)];
    }
    TensorType t = g->type;
    for (int i = 0; i < np; i++) {
      int pos = tensor_type_find(&t, rev[2 * i]);
      if (pos >= 0) t.dims[pos] = rev[2 * i + 1];
    }
    add_grad(c, a, bdims(c, OP_RENAME, loc, &g, 1, t, rev, 2 * np), loc);
    break;
  }
  case OP_SPLIT: case OP_MERGE: {
    /* split d -> (d1..dn) is undone by merge (d1..dn) -> d, and the reverse */
    int n = op->ndims;
    Dim **dims = ARENA_ARRAY(c->ad->m->arena, Dim *, n + 1);
    TensorType t = {.dtype = g->type.dtype};
    if (op->kind == OP_SPLIT) {
      for (int i = 1; i < n; i++) dims[i - 1] = op->dims[i];
      dims[n - 1] = op->dims[0];
      int first = MAX_RANK;
      for (int i = 1; i < n; i++) {
        int p = tensor_type_find(&g->type, op->dims[i]);
        if (p >= 0 && p < first) first = p;
      }
      for (int i = 0; i < g->type.rank; i++) {
        bool part = false;
        for (int k = 1; k < n; k++) part |= op->dims[k] == g->type.dims[i];
        if (i == first) t.dims[t.rank++] = op->dims[0];
        else if (!part) t.dims[t.rank++] = g->type.dims[i];
      }
      add_grad(c, a, bdims(c, OP_MERGE, loc, &g, 1, t, dims, n), loc);
    } else {
      dims[0] = op->dims[n - 1];
      for (int i = 0; i + 1 < n; i++) dims[i + 1] = op->dims[i];
      for (int i = 0; i < g->type.rank; i++) {
        if (g->type.dims[i] == op->dims[n - 1])
          for (int k = 0; k + 1 < n; k++) t.dims[t.rank++] = op->dims[k];
        else
          t.dims[t.rank++] = g->type.dims[i];
      }
      add_grad(c, a, bdims(c, OP_SPLIT, loc, &g, 1, t, dims, n), loc);
    }
    break;
  }
  case OP_TAKE: {
    Value *ops[2] = {X(b), g};
    add_grad(c, a, bval(c, OP_TAKE_GRAD, loc, ops, 2, a->type), loc);
    break;
  }
  case OP_CAUSAL:
    add_grad(c, a, bdims(c, OP_CAUSAL_GRAD, loc, &g, 1, g->type, op->dims, op->ndims), loc);
    break;
  case OP_DROPOUT: { /* linear: the same mask (the same seed, dims and global indices) on dy */
    g = conform(c, g, &op->results[0]->type, loc);
    Value *d = bdims(c, OP_DROPOUT, loc, &g, 1, g->type, op->dims, op->ndims);
    d->def->scalar = op->scalar;
    d->def->index = op->index;
    add_grad(c, a, d, loc);
    break;
  }
  case OP_CAST: case OP_TRANSPOSE: case OP_BROADCAST:
    add_grad(c, a, g, loc); /* conform casts, transposes or sums back */
    break;
  case OP_ATTENTION: {
    Value *ops[5] = {X(op->operands[0]), X(op->operands[1]), X(op->operands[2]), X(y), g};
    for (int i = 0; i < 3; i++) {
      if (!needs(c, op->operands[i])) continue;
      Op *k = bop(c, OP_ATTENTION_GRAD, loc, ops, 5, op->operands[i]->type);
      op_set_dims(c->ad->m, k, op->dims, op->ndims);
      k->scalar = op->scalar;
      k->flag = op->flag;
      k->index = i;
      k->loc2 = op->loc2;
      add_grad(c, op->operands[i], k->results[0], loc);
    }
    break;
  }
  case OP_CROSS_ENTROPY: {
    Value *ops[3] = {X(a), X(b), g};
    add_grad(c, a, bdims(c, OP_CROSS_ENTROPY_GRAD, loc, ops, 3, a->type, op->dims, op->ndims), loc);
    break;
  }
  default:
    fail(c, loc, "cannot differentiate the op '%s' (only forward ops have gradients)", ir_op_name(op->kind));
    break;
  }
}

/* ---- loops ---- */

static void walk(Ctx *c);
static void prepare_loops(Ctx *c);

/* The `needs` of a loop body: inputs from the enclosing context's operands, carried ones to a
 * fixed point (a carried value that comes to depend on a root in one iteration does so in the
 * next). */
static void body_needs(Ctx *outer, Ctx *c, Op *L) {
  IrFunc *B = L->body;
  int nc = L->ncarried;
  uint8_t *carried = ARENA_ARRAY(c->ad->m->arena, uint8_t, nc + 1);
  for (int j = 0; j < nc; j++) carried[j] = needs(outer, L->operands[L->nslices + j]);
  for (int round = 0; round <= nc; round++) {
    memset(c->needs, 0, (size_t)c->nneeds);
    for (int k = 0; k < B->ninputs && k < L->noperands; k++) {
      Value *in = B->inputs[k];
      bool nd = k >= L->nslices && k < L->nslices + nc ? carried[k - L->nslices] : needs(outer, L->operands[k]);
      if (in->id < c->nneeds) c->needs[in->id] = nd && is_float(in->type.dtype);
    }
    needs_forward(c, B);
    bool changed = false;
    for (int j = 0; j < nc && j < B->noutputs; j++)
      if (needs(c, B->outputs[j]) && !carried[j] && is_float(B->outputs[j]->type.dtype)) carried[j] = 1, changed = true;
    if (!changed) break;
  }
}

/* Builds the backward body of forward loop L (of context `outer`) and stacks the residuals it
 * reads onto L. NULL when no operand of L needs a gradient. */
static LoopGrad *prepare_loop(Ctx *outer, Op *L) {
  bool any = false;
  for (int k = 0; k < L->noperands; k++) any |= needs(outer, L->operands[k]);
  if (!any || !L->body) return NULL;
  Ad *ad = outer->ad;
  IrModule *m = ad->m;
  IrFunc *B = L->body;
  LoopGrad *lg = ARENA_NEW(m->arena, LoopGrad);
  lg->loop = L;
  lg->body = ir_func_new(m, B->name ? intern_cstr(arena_printf(m->arena, "%s.grad", B->name)) : NULL, outer->out);
  Ctx *c = ctx_new(ad, B, lg->body, lg);
  body_needs(outer, c, L);

  /* carried inputs: the carried values' gradients, then invariants' accumulators */
  for (int j = 0; j < L->ncarried; j++) {
    Value *in = B->inputs[L->nslices + j];
    if (!needs(c, in)) continue;
    VEC_PUSH(m->arena, lg->car_in, ir_func_add_input(m, lg->body, in->type, in->name));
    VEC_PUSH(m->arena, lg->car_src, L->nslices + j);
  }
  lg->ncar_grads = lg->car_in.len;
  for (int k = L->nslices + L->ncarried; k < L->noperands && k < B->ninputs; k++) {
    Value *in = B->inputs[k];
    if (!needs(c, in)) continue;
    VEC_PUSH(m->arena, lg->car_in, ir_func_add_input(m, lg->body, in->type, in->name));
    VEC_PUSH(m->arena, lg->car_src, k);
  }

  prepare_loops(c);
  ctx_tables(c);
  if (ad->remat == REMAT_FULL)
    for (int i = 0; i < c->nfops; i++) recompute(c, c->fops[i]);
  for (int i = 0; i < lg->ncar_grads; i++) {
    int j = lg->car_src.data[i] - L->nslices;
    if (j < B->noutputs) add_grad(c, B->outputs[j], lg->car_in.data[i], L->loc);
  }
  walk(c);

  /* outputs: carried gradients, accumulators, then the slices' gradients (stacked) */
  ValueVec outs = {0};
  for (int i = 0; i < lg->car_in.len; i++) {
    Value *in = B->inputs[lg->car_src.data[i]];
    Value *g = in->id < c->n ? c->grad[in->id] : NULL;
    if (i < lg->ncar_grads) VEC_PUSH(m->arena, outs, g ? g : zeros(c, in->type, L->loc));
    else VEC_PUSH(m->arena, outs, g ? bin(c, OP_ADD, L->loc, lg->car_in.data[i], g) : lg->car_in.data[i]);
  }
  for (int k = 0; k < L->nslices; k++) {
    Value *in = B->inputs[k];
    if (!needs(c, in)) continue;
    Value *g = in->id < c->n ? c->grad[in->id] : NULL;
    VEC_PUSH(m->arena, outs, g ? g : zeros(c, in->type, L->loc));
    VEC_PUSH(m->arena, lg->stk_src, k);
  }
  lg->body->outputs = outs.data;
  lg->body->noutputs = outs.len;

  /* the forward loop stacks the residuals */
  lg->res_first = L->nresults;
  if (lg->res.len) {
    Value **no = ARENA_ARRAY(m->arena, Value *, B->noutputs + lg->res.len);
    if (B->noutputs) memcpy(no, B->outputs, sizeof(Value *) * (size_t)B->noutputs);
    for (int i = 0; i < lg->res.len; i++) {
      Value *v = lg->res.data[i];
      no[B->noutputs + i] = v;
      TensorType t = {.dtype = v->type.dtype, .rank = v->type.rank + 1};
      t.dims[0] = L->stack_dim;
      for (int d = 0; d < v->type.rank; d++) t.dims[d + 1] = v->type.dims[d];
      Value *r = ir_op_add_result(m, L, t);
      r->name = v->name;
      if (outer->top) {
        r->saved = true;
        if (v->def && v->def->kind == OP_ATTENTION) r->saved_attention = v->def;
      }
    }
    B->outputs = no;
    B->noutputs += lg->res.len;
    L->nstacked += lg->res.len;
  }

  /* the backward body's inputs in the loop's order: slices, carried, invariants */
  IrFunc *bb = lg->body;
  int n = lg->sl_in.len + lg->car_in.len + lg->inv_in.len;
  bb->inputs = ARENA_ARRAY(m->arena, Value *, n + 1);
  bb->ninputs = bb->cap_inputs = 0;
  for (int i = 0; i < lg->sl_in.len; i++) bb->inputs[bb->ninputs++] = lg->sl_in.data[i];
  for (int i = 0; i < lg->car_in.len; i++) bb->inputs[bb->ninputs++] = lg->car_in.data[i];
  for (int i = 0; i < lg->inv_in.len; i++) bb->inputs[bb->ninputs++] = lg->inv_in.data[i];
  bb->cap_inputs = bb->ninputs;
  return lg;
}

static void prepare_loops(Ctx *c) {
  for (int i = 0; i < c->nfops; i++) {
    Op *op = c->fops[i];
    if (op->kind != OP_LOOP) continue;
    LoopGrad *lg = prepare_loop(c, op);
    if (lg) VEC_PUSH(c->ad->m->arena, c->loops, lg);
  }
}

/* The reverse loop: operands from the enclosing context, results' gradients added to the forward
 * loop's operands. Skipped when no carried result of L has a gradient. */
static void backprop_loop(Ctx *c, Op *L) {
  LoopGrad *lg = NULL;
  for (int i = 0; i < c->loops.len; i++)
    if (c->loops.data[i]->loop == L) lg = c->loops.data[i];
  if (!lg) return;
  bool seeded = false;
  for (int i = 0; i < lg->ncar_grads; i++) {
    Value *r = L->results[lg->car_src.data[i] - L->nslices];
    seeded |= r->id < c->n && c->grad[r->id];
  }
  if (!seeded) return;
  IrModule *m = c->ad->m;
  int ns = lg->sl_in.len, nc = lg->car_in.len, ni = lg->inv_in.len, nk = lg->stk_src.len;
  Value **ops = ARENA_ARRAY(m->arena, Value *, ns + nc + ni + 1);
  for (int i = 0; i < ns; i++) {
    SliceSrc s = lg->sl_src.data[i];
    ops[i] = X(s.outer ? s.outer : L->results[lg->res_first + s.residual]);
  }
  for (int i = 0; i < nc; i++) {
    if (i < lg->ncar_grads) {
      Value *r = L->results[lg->car_src.data[i] - L->nslices];
      Value *g = r->id < c->n ? c->grad[r->id] : NULL;
      ops[ns + i] = g ? g : zeros(c, r->type, L->loc);
    } else {
      ops[ns + i] = zeros(c, lg->car_in.data[i]->type, L->loc);
    }
  }
  for (int i = 0; i < ni; i++) ops[ns + nc + i] = X(lg->inv_outer.data[i]);
  TensorType *types = ARENA_ARRAY(m->arena, TensorType, nc + nk + 1);
  for (int i = 0; i < nc; i++) types[i] = lg->car_in.data[i]->type;
  for (int i = 0; i < nk; i++) types[nc + i] = L->operands[lg->stk_src.data[i]]->type;
  Op *R = ir_op_new(m, c->out, OP_LOOP, L->loc, ops, ns + nc + ni, types, nc + nk);
  R->body = lg->body;
  R->count = L->count;
  R->stack_dim = L->stack_dim;
  R->index = L->index;
  R->nslices = ns;
  R->ncarried = nc;
  R->nstacked = nk;
  R->reverse = true;
  R->phase = PHASE_BACKWARD;
  ir_append(c->out, R);
  for (int i = 0; i < nc; i++) add_grad(c, L->operands[lg->car_src.data[i]], R->results[i], L->loc);
  for (int i = 0; i < nk; i++) add_grad(c, L->operands[lg->stk_src.data[i]], R->results[nc + i], L->loc);
  for (int i = 0; i < nk; i++) { /* a stacked param's gradient, named after it (explain's reasons) */
    const Value *p = L->operands[lg->stk_src.data[i]];
    if (p->name) R->results[nc + i]->name = intern_cstr(arena_printf(c->ad->m->arena, "grad.%s", p->name));
  }
}

static void walk(Ctx *c) {
  for (int i = c->nfops - 1; i >= 0 && !c->ad->failed; i--) backprop_op(c, c->fops[i]);
}

/* ---- the entry point ---- */

bool autodiff_append(IrModule *m, IrFunc *f, Value *loss, Value *seed, Value *const *wrt, int nwrt,
                     RematKind remat, Value **grads) {
  Ad ad = {.m = m, .remat = remat};
  ir_route_mark_func(f); /* the forward's dispatches and combines (a step's copy of it is new) */
  Ctx *c = ctx_new(&ad, f, f, NULL);
  for (int i = 0; i < nwrt; i++)
    if (wrt[i] && wrt[i]->id < c->nneeds && is_float(wrt[i]->type.dtype)) c->needs[wrt[i]->id] = 1;
  needs_forward(c, f);
  prepare_loops(c);
  ctx_tables(c);
  if (loss && needs(c, loss)) c->grad[loss->id] = seed ? seed : cst(c, 1, loss->type.dtype, loss->def ? loss->def->loc : (SrcLoc){0});
  walk(c);
  for (int i = 0; i < nwrt; i++) {
    Value *g = wrt[i] && wrt[i]->id < c->n ? c->grad[wrt[i]->id] : NULL;
    grads[i] = g ? g : zeros(c, wrt[i]->type, loss && loss->def ? loss->def->loc : (SrcLoc){0});
  }
  ir_route_mark_func(f); /* the backward's */
  return !ad.failed;
}
