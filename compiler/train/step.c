/* step.c: a `train` step as one IR function (see step.h; docs/training.md).
 *
 * In: the module ir_build made of the step's function (its forward) and the Step's keys. Out: the
 * same module whose main holds, in order: the params and inputs (the entry's arguments, labels,
 * the step count, the optimizer state), the forward (or the microbatch loop holding forward, loss
 * and backward), the loss, the backward (autodiff.c), the optimizer update; outputs the loss, the
 * updated params and the updated state. m->step describes where each piece is.
 *
 * Also a reading of a step's IR: the bytes the forward keeps for the backward (step_saved_bytes);
 * FLOPs are analysis/opcost.h's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"
#include "diag.h"
#include "route.h"
#include "step.h"

typedef VEC(Value *) ValueVec;

static Op *emit(IrModule *m, IrFunc *f, OpKind k, SrcLoc loc, Value **ops, int n, TensorType t, OpPhase ph) {
  Op *op = ir_op_new(m, f, k, loc, ops, n, &t, 1);
  op->phase = (uint8_t)ph;
  ir_append(f, op);
  return op;
}

static Value *emit_v(IrModule *m, IrFunc *f, OpKind k, SrcLoc loc, Value **ops, int n, TensorType t, OpPhase ph) {
  return emit(m, f, k, loc, ops, n, t, ph)->results[0];
}

static Value *emit_cast(IrModule *m, IrFunc *f, SrcLoc loc, Value *x, DType dt, OpPhase ph) {
  if (x->type.dtype == dt) return x;
  TensorType t = x->type;
  t.dtype = dt;
  return emit_v(m, f, OP_CAST, loc, &x, 1, t, ph);
}

/* A value of its own (an order-preserving transpose, as ir_build copies boundary values) where x
 * already has uses, a written type or no defining op of its own: so that a written type put on
 * the result constrains nothing else. nuses: by value id (< nv), the uses of each in f, kept up
 * to date here (one count of f for all the gradients, not one per gradient). */
static Value *own_value(IrModule *m, IrFunc *f, SrcLoc loc, Value *x, OpPhase ph, int *nuses, int nv) {
  int used = x->id >= 0 && x->id < nv ? nuses[x->id] : ir_count_uses(f, x);
  if (!x->spec && x->def && x->def->kind != OP_LOOP && x->def->kind != OP_PARAM && x->def->kind != OP_INPUT &&
      x->def->kind != OP_CONST && x->func == f && used == 0)
    return x;
  if (x->id >= 0 && x->id < nv) nuses[x->id]++;
  return emit_v(m, f, OP_TRANSPOSE, loc, &x, 1, x->type, ph);
}

/* A new input of main (OP_INPUT #index, appended). */
static Value *add_input(IrModule *m, IrFunc *f, Name name, TensorType t, const TypeSpec *spec, SrcLoc loc) {
  Op *op = ir_op_new(m, f, OP_INPUT, loc, NULL, 0, &t, 1);
  op->index = f->ninputs;
  ir_append(f, op);
  Value *v = op->results[0];
  v->name = name;
  v->spec = spec;
  ir_func_push_input(m, f, v);
  return v;
}

static SrcLoc key_loc(const Step *st, StepKey k) { return st->key_loc[k].file ? st->key_loc[k] : st->loc; }

/* ---- shardings of the state ---- */

/* The mesh axes that shard `batch` in the entry's arguments (layout and `@`s). */
static uint16_t batch_axes(const Program *p, const FnDecl *fn) {
  uint16_t mask = 0;
  if (!p->mesh || !fn) return 0;
  for (int i = 0; i < fn->nargs; i++) {
    const TypeSpec *s = &fn->args[i].type;
    Sharding sh;
    if (!layout_apply(p, s, &sh, NULL)) continue;
    for (int d = 0; d < s->rank; d++)
      if (s->dims[d] && strcmp(s->dims[d]->name, "batch") == 0)
        for (int k = 0; k < sh.naxes[d]; k++) mask |= (uint16_t)(1u << sh.axes[d][k]);
  }
  return mask;
}

/* The written type of a param's optimizer state (or, zero = 2, gradient): the param's, in dtype
 * dt, and when `zero` applies also sharded over the batch axes the param leaves free, on its
 * first dim they divide (every dim's axes then written out as `@`s). Where those axes divide no
 * dim, *flat (when given) is set to their product and *flat_axes to them: the state is Megatron's
 * flattened, padded shard (step.h's StepParam.flat), which the written type cannot say. */
static const TypeSpec *state_spec_flat(IrModule *m, const Program *p, const TypeSpec *ps, DType dt, uint16_t bmask,
                                       bool zero, int64_t *flat, uint16_t *flat_axes) {
  TypeSpec *s = ARENA_NEW(m->arena, TypeSpec);
  *s = *ps;
  s->dtype = dt;
  if (!zero || !p->mesh || !bmask) return s;
  Sharding sh;
  if (!layout_apply(p, ps, &sh, NULL)) return s;
  uint16_t used = 0;
  for (int d = 0; d < ps->rank; d++)
    for (int k = 0; k < sh.naxes[d]; k++) used |= (uint16_t)(1u << sh.axes[d][k]);
  uint16_t fr = (uint16_t)(bmask & ~used);
  if (!fr) return s;
  int64_t frp = 1;
  int nfr = 0;
  for (int a = 0; a < p->mesh->naxes; a++)
    if (fr & (1u << a)) frp *= p->mesh->axes[a].size, nfr++;
  for (int d = 0; d < ps->rank; d++) {
    int64_t cur = 1;
    for (int k = 0; k < sh.naxes[d]; k++) cur *= p->mesh->axes[sh.axes[d][k]].size;
    if (!ps->dims[d] || ps->dims[d]->size % (cur * frp) != 0 || sh.naxes[d] + nfr > MAX_AXES_PER_DIM) continue;
    for (int i = 0; i < ps->rank; i++) {
      s->nat[i] = sh.naxes[i];
      for (int k = 0; k < sh.naxes[i]; k++) s->at[i][k] = p->mesh->axes[sh.axes[i][k]].name;
    }
    for (int a = 0; a < p->mesh->naxes; a++)
      if (fr & (1u << a)) s->at[d][s->nat[d]++] = p->mesh->axes[a].name;
    return s;
  }
  if (flat && frp > 1) *flat = frp, *flat_axes = fr;
  return s;
}

static const TypeSpec *state_spec(IrModule *m, const Program *p, const TypeSpec *ps, DType dt, uint16_t bmask,
                                  bool zero) {
  return state_spec_flat(m, p, ps, dt, bmask, zero, NULL, NULL);
}

/* ---- the loss ---- */

/* cross_entropy: mean over every label position of logsumexp(y) - y[label]; mse: mean of
 * (f32(y) - f32(labels))^2 over every element. f32[] either way. */
static Value *build_loss(IrModule *m, IrFunc *f, const Step *st, Value *y, Value *labels) {
  SrcLoc loc = key_loc(st, SK_LOSS);
  Value *per;
  if (st->loss == LOSS_CROSS_ENTROPY) {
    Value *ops[2] = {y, labels};
    TensorType t = labels->type;
    t.dtype = DT_F32;
    Op *op = emit(m, f, OP_CROSS_ENTROPY, loc, ops, 2, t, PHASE_LOSS);
    op->dims = ARENA_ARRAY(m->arena, Dim *, 1);
    op->dims[0] = y->type.dims[y->type.rank - 1];
    op->ndims = 1;
    per = op->results[0];
  } else {
    Value *d[2] = {emit_cast(m, f, loc, y, DT_F32, PHASE_LOSS), emit_cast(m, f, loc, labels, DT_F32, PHASE_LOSS)};
    TensorType t = d[0]->type;
    Value *diff = emit_v(m, f, OP_SUB, loc, d, 2, t, PHASE_LOSS);
    Value *sq[2] = {diff, diff};
    per = emit_v(m, f, OP_MUL, loc, sq, 2, t, PHASE_LOSS);
  }
  if (per->type.rank == 0) return per;
  TensorType s = {.dtype = DT_F32, .rank = 0};
  Op *mean = emit(m, f, OP_MEAN, loc, &per, 1, s, PHASE_LOSS);
  mean->dims = ARENA_ARRAY(m->arena, Dim *, per->type.rank);
  for (int i = 0; i < per->type.rank; i++) mean->dims[i] = per->type.dims[i];
  mean->ndims = per->type.rank;
  mean->results[0]->name = intern_cstr("loss");
  return mean->results[0];
}

/* ---- microbatches ---- */

static Dim *find_batch(const Program *p) {
  for (int i = 0; i < p->ndims; i++)
    if (p->dims[i] && strcmp(p->dims[i]->name, "batch") == 0) return p->dims[i];
  return NULL;
}

/* forward ops `fw` (removed from main), main's args and labels: the loop over microbatches (see
 * step.h); `pipe`: a pipeline will schedule it. Sets *loss and grads[] (f32 accumulators, main
 * values). */
static bool build_micro(IrModule *m, const Program *p, const Step *st, Op **fw, int nfw, Value *y, Value *labels,
                        bool pipe, Value **loss, Value **acc) {
  IrFunc *f = m->main;
  StepInfo *si = m->step;
  int N = st->microbatches;
  SrcLoc loc = key_loc(st, SK_MICROBATCHES);
  Dim *batch = find_batch(p);
  if (!batch || batch->size % N != 0) {
    diag_error(loc, "microbatches = %d must divide the dim 'batch'", N);
    return false;
  }
  for (int i = 0; i < m->nparams; i++)
    if (tensor_type_find(&m->params[i].type, batch) >= 0) {
      diag_error(m->params[i].loc, "param %s has the dim 'batch', which microbatches split", m->params[i].path);
      return false;
    }
  Dim *mb = ARENA_NEW(m->arena, Dim), *md = ARENA_NEW(m->arena, Dim);
  *mb = (Dim){.name = batch->name, .size = batch->size / N, .id = -1, .loc = batch->loc};
  *md = (Dim){.name = intern_cstr("microbatch"), .size = N, .id = -1, .loc = loc};
  si->micro_dim = md;
  si->micro_batch = mb;
  AdClone cl = {.m = m, .from = batch, .to = mb, .phase = -1};

  /* main's inputs holding `batch` become stacked slices; the others, and the params, invariants */
  int nin = si->nargs + 1;
  Value **ins = ARENA_ARRAY(m->arena, Value *, nin);
  for (int i = 0; i < si->nargs; i++) ins[i] = f->inputs[i];
  ins[si->nargs] = labels;
  ValueVec sl_outer = {0}, sl_src = {0}, inv_outer = {0};
  bool any = false;
  for (int i = 0; i < nin; i++) {
    Value *x = ins[i];
    int pos = tensor_type_find(&x->type, batch);
    if (pos < 0) {
      VEC_PUSH(m->arena, inv_outer, x);
      continue;
    }
    any = true;
    if (x->type.rank + 1 > MAX_RANK) {
      diag_error(loc, "input %s would need %d dims split into microbatches (at most %d)", x->name ? x->name : "?",
                 x->type.rank + 1, MAX_RANK);
      return false;
    }
    TensorType t = {.dtype = x->type.dtype};
    for (int d = 0; d < x->type.rank; d++) {
      if (d == pos) t.dims[t.rank++] = mb, t.dims[t.rank++] = md;
      else t.dims[t.rank++] = x->type.dims[d];
    }
    Op *sp = emit(m, f, OP_SPLIT, loc, &x, 1, t, PHASE_FORWARD);
    sp->dims = ARENA_ARRAY(m->arena, Dim *, 3);
    sp->dims[0] = batch, sp->dims[1] = mb, sp->dims[2] = md;
    sp->ndims = 3;
    TensorType u = {.dtype = x->type.dtype, .rank = x->type.rank + 1};
    u.dims[0] = md;
    for (int d = 0; d < x->type.rank; d++) u.dims[d + 1] = d == pos ? mb : x->type.dims[d];
    Value *sv = sp->results[0];
    VEC_PUSH(m->arena, sl_outer, emit_v(m, f, OP_TRANSPOSE, loc, &sv, 1, u, PHASE_FORWARD));
    VEC_PUSH(m->arena, sl_src, x);
  }
  if (!any) {
    diag_error(loc, "microbatches split the dim 'batch', and no input of %s has it", m->entry ? m->entry->name : "the entry");
    return false;
  }
  for (int i = 0; i < m->nparams; i++) VEC_PUSH(m->arena, inv_outer, si->params[i].value);

  /* the body: slices, carried (loss, accumulators), invariants */
  IrFunc *B = ir_func_new(m, intern_cstr("microbatch"), f);
  int n0 = m->nvalues;
  Value **map = calloc((size_t)n0 + 1, sizeof(Value *));
  if (!map) abort();
  for (int i = 0; i < sl_src.len; i++) {
    Value *x = sl_src.data[i];
    Value *in = ir_func_add_input(m, B, ad_subst_type(&cl, x->type), x->name);
    in->spec = ad_subst_spec(&cl, x->spec);
    map[x->id] = in;
  }
  Value *loss_in = ir_func_add_input(m, B, (TensorType){.dtype = DT_F32}, intern_cstr("loss"));
  Value **acc_in = ARENA_ARRAY(m->arena, Value *, m->nparams + 1);
  uint16_t bmask = batch_axes(p, m->entry);
  for (int i = 0; i < m->nparams; i++) {
    TensorType t = m->params[i].type;
    t.dtype = DT_F32;
    acc_in[i] = ir_func_add_input(m, B, t, m->params[i].path);
    /* zero = 2 shards the gradients themselves: each microbatch's is reduce-scattered into an
     * accumulator of the optimizer state's shard. Under a pipeline the stages' schedule adds each
     * microbatch's gradients chunk by chunk into whole accumulators (shard/stages.c), so there
     * zero = 2 reduce-scatters them once per step, after the last microbatch, on each stage (as
     * Megatron's distributed optimizer does with pipelines); the gradient kept is the shard */
    if (st->zero >= 2 && !pipe) acc_in[i]->spec = state_spec(m, p, &m->params[i].spec, DT_F32, bmask, true);
  }
  Value **pin = ARENA_ARRAY(m->arena, Value *, m->nparams + 1);
  for (int i = 0; i < inv_outer.len; i++) {
    Value *x = inv_outer.data[i];
    Value *in = ir_func_add_input(m, B, x->type, x->name);
    in->spec = x->spec;
    map[x->id] = in;
  }
  for (int i = 0; i < m->nparams; i++) pin[i] = map[si->params[i].value->id];

  for (int i = 0; i < nfw; i++) {
    Op *op = fw[i];
    Value **ops = ARENA_ARRAY(m->arena, Value *, op->noperands + 1);
    for (int k = 0; k < op->noperands; k++) ops[k] = op->operands[k]->id < n0 ? map[op->operands[k]->id] : NULL;
    Op *c = ad_clone_op(&cl, op, B, ops);
    for (int k = 0; k < op->nresults; k++) map[op->results[k]->id] = c->results[k];
  }
  Value *yb = map[y->id], *lb = map[labels->id];
  free(map);
  if (!yb || !lb) {
    diag_error(loc, "internal error: the microbatch body lost the forward's output");
    return false;
  }
  SrcLoc lloc = key_loc(st, SK_LOSS);
  Value *l = build_loss(m, B, st, yb, lb);
  Value *sc[2] = {l, ad_const(m, B, 1.0 / N, DT_F32, lloc, PHASE_LOSS)};
  l = emit_v(m, B, OP_MUL, lloc, sc, 2, l->type, PHASE_LOSS);
  Value **g = ARENA_ARRAY(m->arena, Value *, m->nparams + 1);
  if (!autodiff_append(m, B, l, NULL, pin, m->nparams, st->remat, g)) return false;

  B->noutputs = 1 + m->nparams;
  B->outputs = ARENA_ARRAY(m->arena, Value *, B->noutputs);
  Value *lo[2] = {loss_in, l};
  B->outputs[0] = emit_v(m, B, OP_ADD, lloc, lo, 2, loss_in->type, PHASE_ACCUMULATE);
  for (int i = 0; i < m->nparams; i++) {
    Value *a[2] = {acc_in[i], emit_cast(m, B, loc, g[i], DT_F32, PHASE_ACCUMULATE)};
    B->outputs[1 + i] = emit_v(m, B, OP_ADD, loc, a, 2, acc_in[i]->type, PHASE_ACCUMULATE);
  }

  /* the loop: slices, then zero-initialised accumulators, then invariants */
  int nops = sl_outer.len + 1 + m->nparams + inv_outer.len;
  Value **ops = ARENA_ARRAY(m->arena, Value *, nops);
  TensorType *types = ARENA_ARRAY(m->arena, TensorType, 1 + m->nparams);
  int k = 0;
  for (int i = 0; i < sl_outer.len; i++) ops[k++] = sl_outer.data[i];
  ops[k++] = ad_const(m, f, 0, DT_F32, loc, PHASE_ACCUMULATE);
  types[0] = loss_in->type;
  for (int i = 0; i < m->nparams; i++) {
    ops[k++] = ad_zeros(m, f, acc_in[i]->type, loc, PHASE_ACCUMULATE);
    types[1 + i] = acc_in[i]->type;
  }
  for (int i = 0; i < inv_outer.len; i++) ops[k++] = inv_outer.data[i];
  Op *L = ir_op_new(m, f, OP_LOOP, loc, ops, nops, types, 1 + m->nparams);
  L->body = B;
  L->count = N;
  L->stack_dim = md;
  L->index = -1;
  L->nslices = sl_outer.len;
  L->ncarried = 1 + m->nparams;
  L->phase = PHASE_ACCUMULATE;
  ir_append(f, L);
  si->micro_loop = L;
  L->results[0]->name = intern_cstr("loss");
  *loss = L->results[0];
  for (int i = 0; i < m->nparams; i++) {
    L->results[1 + i]->name = m->params[i].path;
    acc[i] = L->results[1 + i];
  }
  return true;
}

/* ---- the step ---- */

/* A layout that shards a stacked param's stacking dim over devices pipelines the layers: the step
 * then runs as microbatches (one or more) that a pipeline schedules (shard/stages.c). */
static bool pipelined(const IrModule *m, const Program *p) {
  for (int i = 0; p->mesh && i < m->nparams; i++) {
    const IrParam *ip = &m->params[i];
    Sharding s;
    if (!ip->stack_depth || !layout_apply(p, &ip->spec, &s, NULL)) continue;
    int64_t n = 1;
    for (int k = 0; k < s.naxes[0]; k++) n *= p->mesh->axes[s.axes[0][k]].size;
    if (n > 1) return true;
  }
  return false;
}

static Name pname(IrModule *m, const char *prefix, Name path) {
  return intern_cstr(arena_printf(m->arena, "%s%s", prefix, path));
}

bool step_build_module(IrModule *m, const Program *p) {
  const Step *st = p->step;
  IrFunc *f = m->main;
  if (!st || st->kind != STEP_TRAIN || !f) return true;
  if (f->noutputs != 1 || !f->outputs[0]) {
    diag_error(st->loc, "a train step needs its function to return one tensor");
    return false;
  }
  Value *y = f->outputs[0];
  const FnDecl *fn = m->entry;
  SrcLoc lloc = key_loc(st, SK_LOSS), oloc = key_loc(st, SK_OPTIMIZER);
  if (dtype_is_int(y->type.dtype)) {
    diag_error(lloc, "the loss needs a float output, and %s returns %s", fn ? fn->name : "the function",
               dtype_name(y->type.dtype));
    return false;
  }
  if (st->loss == LOSS_CROSS_ENTROPY && y->type.rank < 1) {
    diag_error(lloc, "cross_entropy needs an output with a class dim (its last), and %s returns a scalar",
               fn ? fn->name : "the function");
    return false;
  }

  StepInfo *si = ARENA_NEW(m->arena, StepInfo);
  m->step = si;
  si->step = st;
  si->nargs = f->ninputs;
  si->in_t = -1;
  si->nparams = m->nparams;
  si->params = ARENA_ARRAY(m->arena, StepParam, m->nparams + 1);
  for (int i = 0; i < m->nparams; i++)
    si->params[i] = (StepParam){.param = i, .in_master = -1, .in_m = -1, .in_v = -1, .out_master = -1,
                                .out_m = -1, .out_v = -1};

  /* take the forward out of main: inputs go first */
  int nfw = 0;
  for (Op *o = f->first; o; o = o->next) nfw += o->kind != OP_PARAM && o->kind != OP_INPUT;
  Op **fw = ARENA_ARRAY(m->arena, Op *, nfw + 1);
  nfw = 0;
  Op *kept = NULL; /* (unlinked in one pass: ir_remove of each would walk past every param) */
  for (Op *o = f->first, *next; o; o = next) {
    next = o->next;
    if (o->kind == OP_PARAM) si->params[o->index].value = o->results[0];
    o->next = NULL;
    if (o->kind == OP_PARAM || o->kind == OP_INPUT) {
      if (kept) kept->next = o;
      else f->first = o;
      kept = o;
      continue;
    }
    fw[nfw++] = o;
  }
  if (!kept) f->first = NULL;
  f->last = kept;
  for (int i = 0; i < m->nparams; i++)
    if (!si->params[i].value) {
      diag_error(m->params[i].loc, "internal error: param %s has no value", m->params[i].path);
      return false;
    }

  /* labels, the step count, the state */
  TypeSpec *ls = ARENA_NEW(m->arena, TypeSpec);
  if (fn) *ls = fn->ret;
  else *ls = (TypeSpec){.dtype = y->type.dtype, .rank = y->type.rank};
  if (!fn)
    for (int i = 0; i < y->type.rank; i++) ls->dims[i] = y->type.dims[i];
  if (st->loss == LOSS_CROSS_ENTROPY) {
    ls->rank--;
    ls->dtype = DT_I32;
  }
  si->in_labels = f->ninputs;
  Value *labels = add_input(m, f, intern_cstr("labels"), tensor_type_from_spec(ls), ls, lloc);
  Value *t = NULL;
  if (st->optimizer == OPT_ADAM) {
    si->in_t = f->ninputs;
    t = add_input(m, f, intern_cstr("step"), (TensorType){.dtype = DT_F32}, NULL, oloc);
  }
  uint16_t bmask = batch_axes(p, fn);
  Value **master = ARENA_ARRAY(m->arena, Value *, m->nparams + 1);
  Value **mom = ARENA_ARRAY(m->arena, Value *, m->nparams + 1);
  Value **vel = ARENA_ARRAY(m->arena, Value *, m->nparams + 1);
  for (int i = 0; i < m->nparams; i++) {
    const IrParam *ip = &m->params[i];
    StepParam *sp = &si->params[i];
    const TypeSpec *ss = state_spec_flat(m, p, &ip->spec, DT_F32, bmask, st->zero >= 1, &sp->flat, &sp->flat_axes);
    TensorType t32 = ip->type;
    t32.dtype = DT_F32;
    if (st->master != DT_NONE && ip->type.dtype != DT_F32) {
      sp->in_master = f->ninputs;
      master[i] = add_input(m, f, pname(m, "master.", ip->path), t32, ss, oloc);
    }
    if (st->optimizer == OPT_ADAM) {
      sp->in_m = f->ninputs;
      mom[i] = add_input(m, f, pname(m, "adam.m.", ip->path), t32, ss, oloc);
      sp->in_v = f->ninputs;
      vel[i] = add_input(m, f, pname(m, "adam.v.", ip->path), t32, ss, oloc);
    }
  }

  /* forward, loss, backward */
  Value **grads = ARENA_ARRAY(m->arena, Value *, m->nparams + 1);
  Value *loss;
  bool pipe = pipelined(m, p);
  if (st->microbatches > 1 || pipe) {
    if (!build_micro(m, p, st, fw, nfw, y, labels, pipe, &loss, grads)) return false;
    for (int i = 0; i < m->nparams; i++) {
      Value *g = grads[i];
      if (g->type.dtype != m->params[i].type.dtype) g = emit_cast(m, f, oloc, g, m->params[i].type.dtype, PHASE_ACCUMULATE);
      grads[i] = g;
    }
  } else {
    for (int i = 0; i < nfw; i++) ir_append(f, fw[i]);
    loss = build_loss(m, f, st, y, labels);
    Value **wrt = ARENA_ARRAY(m->arena, Value *, m->nparams + 1);
    for (int i = 0; i < m->nparams; i++) wrt[i] = si->params[i].value;
    if (!autodiff_append(m, f, loss, NULL, wrt, m->nparams, st->remat, grads)) return false;
  }
  si->loss = loss;

  /* gradients: their own values with the param's written type; under zero the state's sharding, so
   * that a gradient is reduce-scattered onto the shard the optimizer updates (and the updated
   * param gathered back), never all-reduced whole */
  int nv = m->nvalues;
  int *nuses = ARENA_ARRAY(m->arena, int, nv > 0 ? nv : 1);
  for (const Op *op = f->first; op; op = op->next)
    for (int k = 0; k < op->noperands; k++)
      if (op->operands[k] && op->operands[k]->id >= 0 && op->operands[k]->id < nv) nuses[op->operands[k]->id]++;
  for (int k = 0; k < f->noutputs; k++)
    if (f->outputs[k] && f->outputs[k]->id >= 0 && f->outputs[k]->id < nv) nuses[f->outputs[k]->id]++;
  for (int i = 0; i < m->nparams; i++) {
    const IrParam *ip = &m->params[i];
    Value *g = own_value(m, f, oloc, grads[i], grads[i]->def && grads[i]->def->phase == PHASE_ACCUMULATE
                                                  ? PHASE_ACCUMULATE : PHASE_BACKWARD, nuses, nv);
    g->spec = st->zero >= 1 ? state_spec(m, p, &ip->spec, ip->type.dtype, bmask, true) : &ip->spec;
    if (!g->name) g->name = pname(m, "grad.", ip->path);
    si->params[i].grad = g;
  }

  /* the optimizer */
  ValueVec outs = {0};
  VEC_PUSH(m->arena, outs, loss);
  Value **newp = ARENA_ARRAY(m->arena, Value *, m->nparams + 1);
  Value **newmaster = ARENA_ARRAY(m->arena, Value *, m->nparams + 1);
  Value **newm = ARENA_ARRAY(m->arena, Value *, m->nparams + 1);
  Value **newv = ARENA_ARRAY(m->arena, Value *, m->nparams + 1);
  for (int i = 0; i < m->nparams; i++) {
    const IrParam *ip = &m->params[i];
    StepParam *sp = &si->params[i];
    Value *g = sp->grad;
    Value *cur = sp->in_master >= 0 ? master[i] : sp->value;
    Value *upd;
    if (st->optimizer == OPT_ADAM) {
      Value *a[2] = {mom[i], g};
      Op *mo = emit(m, f, OP_ADAM_MOMENT, oloc, a, 2, mom[i]->type, PHASE_UPDATE);
      mo->scalar = IR_ADAM_BETA1;
      Value *b[2] = {vel[i], g};
      Op *vo = emit(m, f, OP_ADAM_MOMENT, oloc, b, 2, vel[i]->type, PHASE_UPDATE);
      vo->scalar = IR_ADAM_BETA2;
      vo->flag = 1;
      newm[i] = mo->results[0];
      newv[i] = vo->results[0];
      newm[i]->spec = mom[i]->spec;
      newv[i]->spec = vel[i]->spec;
      newm[i]->name = mom[i]->name;
      newv[i]->name = vel[i]->name;
      Value *u[4] = {cur, newm[i], newv[i], t};
      Op *uo = emit(m, f, OP_ADAM_UPDATE, oloc, u, 4, cur->type, PHASE_UPDATE);
      uo->scalar = st->lr;
      upd = uo->results[0];
    } else {
      Value *u[2] = {cur, g};
      Op *uo = emit(m, f, OP_SGD_UPDATE, oloc, u, 2, cur->type, PHASE_UPDATE);
      uo->scalar = st->lr;
      upd = uo->results[0];
    }
    if (sp->in_master >= 0) {
      newmaster[i] = upd;
      upd->spec = master[i]->spec;
      upd->name = master[i]->name;
      upd = emit_cast(m, f, oloc, upd, ip->type.dtype, PHASE_UPDATE);
    }
    upd->spec = &ip->spec;
    upd->name = ip->path;
    newp[i] = upd;
  }
  for (int i = 0; i < m->nparams; i++) {
    si->params[i].out_param = outs.len;
    VEC_PUSH(m->arena, outs, newp[i]);
  }
  for (int i = 0; i < m->nparams; i++) {
    StepParam *sp = &si->params[i];
    if (sp->in_master >= 0) {
      sp->out_master = outs.len;
      VEC_PUSH(m->arena, outs, newmaster[i]);
    }
    if (sp->in_m >= 0) {
      sp->out_m = outs.len;
      VEC_PUSH(m->arena, outs, newm[i]);
      sp->out_v = outs.len;
      VEC_PUSH(m->arena, outs, newv[i]);
    }
  }
  f->outputs = outs.data;
  f->noutputs = outs.len;
  f->name = intern_cstr(arena_printf(m->arena, "%s.step", f->name ? f->name : "train"));
  return true;
}

IrModule *step_build(Arena *a, const Program *p) {
  IrModule *m = ir_build(a, p);
  if (!m || !p->step || p->step->kind != STEP_TRAIN) return m;
  int before = diag_error_count();
  if (!step_build_module(m, p) || diag_error_count() > before) return NULL;
  ir_route_mark(m); /* the whole step: its loops' residuals and their slices too */
  return m;
}

/* ---- reading a step ---- */

static int64_t saved_in(const IrFunc *f, const Mesh *mesh) {
  int64_t b = 0;
  for (const Op *op = f->first; op; op = op->next) {
    for (int r = 0; r < op->nresults; r++) {
      const Value *v = op->results[r];
      if (!v->saved) continue;
      int64_t vb = sharding_local_bytes(&v->type, &v->sharding, mesh);
      b += ir_route_density(v) < 1 ? (int64_t)((double)vb * ir_route_density(v)) : vb; /* route.h's entries */
      const Op *at = v->saved_attention;
      if (at && at->nresults == 1 && at->noperands == 3) {
        /* the statistics: one f32 per query row: v's local elements over the dims the
         * attention's output has from its values only */
        int64_t elems = vb / dtype_bytes(v->type.dtype);
        const TensorType *o = &at->results[0]->type, *q = &at->operands[0]->type;
        for (int d = 0; d < o->rank; d++) {
          if (tensor_type_find(q, o->dims[d]) >= 0) continue;
          int pos = tensor_type_find(&v->type, o->dims[d]);
          int64_t ext = pos >= 0 ? sharding_local_extent(&v->type, &v->sharding, mesh, pos) : 1;
          if (ext > 0) elems /= ext;
        }
        b += elems * 4;
      }
    }
    if (op->kind == OP_LOOP && op->body) b += saved_in(op->body, mesh);
  }
  return b;
}

int64_t step_saved_bytes(const IrModule *m, const Mesh *mesh) {
  return m && m->main ? saved_in(m->main, mesh) : 0;
}

int64_t step_flat_bytes(const StepParam *sp, int64_t bytes, int64_t elem) {
  if (!sp || sp->flat <= 1 || elem <= 0 || bytes <= 0 || bytes == INT64_MAX) return bytes;
  int64_t n = bytes / elem;
  return (n / sp->flat + (n % sp->flat != 0)) * elem;
}
