/* ir_route.c: which values keep a route's pattern, which contractions dispatch and combine
 * (see route.h).
 *
 * In: a module at any stage (built, differentiated, partitioned, localised, pipelined). Out: the
 * marks, recomputed from scratch in program order: a value's mark follows from its op and its
 * operands' marks; a region input's from what it stands for (a loop's slice or invariant operand,
 * a pipeline region's operand or the saved output of its forward chunk); a loop's stacked result
 * from the body output it stacks. Carried values are never patterned (each iteration's would have
 * to agree), nor is anything a rename makes (the route's dims would change names). */
#include <string.h>

#include "route.h"

/* Every dim of a is a dim of b. */
static bool dims_within(const TensorType *a, const TensorType *b) {
  for (int i = 0; i < a->rank; i++)
    if (tensor_type_find(b, a->dims[i]) < 0) return false;
  return true;
}

/* The route p's pattern is read against: a route op with its three dims, all in p's type. */
static const Op *route_of(const Value *p) {
  const Op *R = p ? p->route : NULL;
  if (!R || R->ndims < 3) return NULL;
  for (int j = 0; j < 3; j++)
    if (tensor_type_find(&p->type, R->dims[j]) < 0) return NULL;
  return R;
}

/* a * b keeps a's pattern when b has only dims of a and lacks the slot dim (language.md), or
 * has the same pattern (a product of two: zero where either is). */
static const Op *product_keeps(const Value *a, const Value *b) {
  const Op *R = route_of(a);
  if (!R || !dims_within(&b->type, &a->type)) return NULL;
  if (tensor_type_find(&b->type, R->dims[2]) < 0 || b->route == R) return R;
  return NULL;
}

/* The pattern op's result keeps, or NULL. */
static const Op *result_route(const Op *op) {
  if (op->nresults != 1) return NULL;
  const Value *r = op->results[0];
  /* the data moved or cast, not changed: a cast, a transpose, a slice, every collective */
  if (ir_op_is_collective(op->kind) || op->kind == OP_CAST || op->kind == OP_TRANSPOSE || op->kind == OP_SLICE) {
    const Op *R = op->noperands == 1 ? route_of(op->operands[0]) : NULL;
    return R && tensor_type_same_dims(&r->type, &op->operands[0]->type) ? R : NULL;
  }
  switch (op->kind) { /* kept: how a pattern survives a product or a sum is each op's own */
  case OP_ROUTE: return op->ndims >= 3 ? op : NULL;
  case OP_ROUTE_GRAD: return op->noperands == 3 ? route_of(op->operands[0]) : NULL;
  case OP_MUL: {
    if (op->noperands != 2) return NULL;
    const Op *R = product_keeps(op->operands[0], op->operands[1]);
    return R ? R : product_keeps(op->operands[1], op->operands[0]);
  }
  case OP_ADD: { /* gradients accumulated: the sum of two with one pattern */
    if (op->noperands != 2) return NULL;
    const Op *R = route_of(op->operands[0]);
    return R && route_of(op->operands[1]) == R && tensor_type_same_dims(&op->operands[0]->type, &r->type) &&
                   tensor_type_same_dims(&op->operands[1]->type, &r->type)
               ? R
               : NULL;
  }
  default: return NULL;
  }
}

static RouteContract classify(const Op *op, int *patterned) {
  if (patterned) *patterned = -1;
  if (op->kind != OP_CONTRACT || op->noperands != 2) return CONTRACT_DENSE;
  for (int i = 0; i < 2; i++) {
    const Value *p = op->operands[i], *x = op->operands[1 - i];
    const Op *R = route_of(p);
    if (!R) continue;
    const Dim *e = R->dims[0], *t = R->dims[1], *c = R->dims[2];
    RouteContract k = CONTRACT_DENSE;
    if (op->ndims == 1 && op->dims[0] == t && tensor_type_find(&x->type, c) < 0) k = CONTRACT_DISPATCH;
    if (op->ndims == 2 && ((op->dims[0] == e && op->dims[1] == c) || (op->dims[0] == c && op->dims[1] == e)) &&
        tensor_type_find(&x->type, t) < 0)
      k = CONTRACT_COMBINE;
    if (k == CONTRACT_DENSE) continue;
    if (patterned) *patterned = i;
    return k;
  }
  return CONTRACT_DENSE;
}

static void mark_func(IrFunc *f);

static void mark_loop(Op *op) {
  IrFunc *b = op->body;
  for (int i = 0; i < b->ninputs; i++) {
    bool carried = i >= op->nslices && i < op->nslices + op->ncarried;
    const Value *outer = i < op->noperands ? op->operands[i] : NULL;
    Value *in = b->inputs[i];
    in->route = carried || !outer ? NULL : outer->route;
    in->route = route_of(in);
  }
  mark_func(b);
  for (int r = 0; r < op->nresults; r++) {
    Value *res = op->results[r];
    res->route = NULL;
    if (r >= op->ncarried && r < b->noutputs && b->outputs[r]) {
      res->route = b->outputs[r]->route;
      res->route = route_of(res);
    }
  }
}

static void mark_pipeline(Op *op) {
  PipeInfo *pi = op->pipe;
  for (int g = 0; g < PR__COUNT; g++) {
    IrFunc *R = pi->region[g];
    if (!R) continue;
    for (int i = 0; i < R->ninputs; i++) {
      const PipeSlot *s = &pi->in[g][i];
      const Op *rt = NULL;
      if ((s->kind == PIN_ENV || s->kind == PIN_CHUNK) && s->index >= 0 && s->index < op->noperands)
        rt = op->operands[s->index]->route;
      else if (s->kind == PIN_SAVED && pi->region[PR_CHUNK_FWD] && s->index >= 0 &&
               s->index < pi->region[PR_CHUNK_FWD]->noutputs)
        rt = pi->region[PR_CHUNK_FWD]->outputs[s->index]->route;
      R->inputs[i]->route = rt;
      R->inputs[i]->route = route_of(R->inputs[i]);
    }
    mark_func(R);
  }
  for (int r = 0; r < op->nresults; r++) op->results[r]->route = NULL;
}

static void mark_func(IrFunc *f) {
  for (Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_LOOP && op->body) {
      mark_loop(op);
      continue;
    }
    if (op->kind == OP_PIPELINE && op->pipe) {
      mark_pipeline(op);
      continue;
    }
    for (int r = 0; r < op->nresults; r++) op->results[r]->route = NULL;
    if (op->nresults == 1) op->results[0]->route = result_route(op);
    if (op->kind == OP_CONTRACT) op->flag = (int)classify(op, NULL);
  }
}

void ir_route_mark_func(IrFunc *f) {
  if (f) mark_func(f);
}

void ir_route_mark(IrModule *m) {
  if (!m || !m->main) return;
  for (int i = 0; i < m->main->ninputs; i++) m->main->inputs[i]->route = NULL;
  mark_func(m->main);
}

RouteContract ir_route_contract(const Op *op, int *patterned) {
  if (patterned) *patterned = -1;
  if (!op || op->kind != OP_CONTRACT || op->flag == CONTRACT_DENSE) return CONTRACT_DENSE;
  classify(op, patterned); /* (-1 while a pass has put unmarked values in front of it) */
  return (RouteContract)op->flag;
}

double ir_route_fill(const Value *v) {
  const Op *R = route_of(v);
  if (!R) return 1;
  double f = R->index / ((double)R->dims[0]->size * (double)R->dims[2]->size);
  return f > 0 && f < 1 ? f : 1;
}

double ir_route_density(const Value *v) {
  if (!route_of(v)) return 1;
  double db = dtype_bytes(v->type.dtype), d = ir_route_fill(v) * (ROUTE_INDEX_BYTES + db) / db;
  return d > 0 && d < 1 ? d : 1;
}

Value *ir_route_source(Value *v) {
  for (int guard = 0; v && v->route && guard < 256; guard++) {
    const Op *d = v->def;
    if (!d) return NULL;
    if (d->kind == OP_ROUTE) return v;
    Value *next = NULL;
    for (int i = 0; i < d->noperands && !next; i++)
      if (d->operands[i]->route == v->route) next = d->operands[i];
    v = next;
  }
  return NULL;
}

const char *ir_op_label(const Op *op) {
  switch (ir_route_contract(op, NULL)) {
  case CONTRACT_DISPATCH: return "dispatch";
  case CONTRACT_COMBINE: return "combine";
  default: return ir_op_name(op->kind);
  }
}
