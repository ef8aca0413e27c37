/* test_partition.c: a reference check of partitioned IR that cannot lie.
 *
 * For every .shard file named on the command line (directories are searched recursively), under
 * every mesh and every layout the file declares, the program is lowered (a `train` step whole:
 * forward, loss, backward and optimizer update, step_build), propagated and partitioned, and the result is checked against the definitions alone (none of partition_plan.c's
 * code is used to decide what is right):
 *   - every collective: AllGather over X removes exactly X from the tails of the dims it gathers,
 *     multiplying each such dim's local extent by the sizes removed from it; ReduceScatter removes
 *     X from `partial` and appends it to dims, dividing their extents; AllReduce removes X from
 *     `partial` only; AllToAll moves one axis from the tail of one dim to the tail of another;
 *     CollectivePermute keeps the sharding; none runs over axes of total size 1;
 *   - every other op computes on consistent shards: a dim shared by operands and result has the same
 *     axes everywhere (after the op's local slices, which may only add axes); summed dims' axes
 *     become exactly the result's new partial axes; nonlinear ops never read a partial sum (the
 *     training ops only in the operand they are linear in: an incoming gradient); add/sub read
 *     equally partial operands, mul/div and contract at most one; the dims softmax, the norms,
 *     attention, their gradients and cross entropy reduce over are whole; a reshape keeps each
 *     device's element count; zeros alone may be declared partial;
 *   - every value: no mesh axis twice, every sharded dim divisible by its axes;
 *   - loops: carried values have one sharding (outer, body input, body output, result), slices are
 *     their stacked value minus the leading dim, stacked results their body output plus one (every
 *     stacked value's leading dim over the same axes: a pipeline's stages, or none); the entry's
 *     outputs are not partial sums;
 *   - running propagation (through memory_estimate) and partitioning again changes nothing.
 * Prints PASS/FAIL (or SKIP for programs that do not compile, as error tests do) per configuration
 * and "N passed, N failed"; exits 1 on any failure. */
#define _XOPEN_SOURCE 700
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "ir.h"
#include "localize.h"
#include "memory.h"
#include "partition.h"
#include "propagate.h"
#include "step.h"
#include "unit_pipeline.h"
#include "unit_test.h"

static int npass, nfail, nskip;
static char note_buf[8192];
static int nnotes;

static void note(const char *fmt, ...) {
  if (nnotes++ > 12) return;
  size_t len = strlen(note_buf);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(note_buf + len, sizeof note_buf - len, fmt, ap);
  va_end(ap);
  len = strlen(note_buf);
  if (len + 1 < sizeof note_buf) note_buf[len] = '\n', note_buf[len + 1] = 0;
}

typedef struct Ctx {
  const Program *p;
  const Mesh *mesh;
  int collectives;
  bool localized;       /* after localize_module: no in_shard, every collective has its CollSpec */
} Ctx;

static int axis_size(const Ctx *c, int a) { return c->mesh->axes[a].size; }

static uint16_t dim_mask(const Sharding *s, int d) {
  uint16_t m = 0;
  for (int k = 0; k < s->naxes[d]; k++) m |= (uint16_t)(1u << s->axes[d][k]);
  return m;
}

static int64_t mask_size(const Ctx *c, uint16_t m) {
  int64_t n = 1;
  for (int a = 0; a < c->mesh->naxes; a++)
    if (m & (1u << a)) n *= axis_size(c, a);
  return n;
}

static bool prefix(const Sharding *a, int da, const Sharding *b, int db) { /* a's dim is a prefix of b's */
  if (a->naxes[da] > b->naxes[db]) return false;
  for (int k = 0; k < a->naxes[da]; k++)
    if (a->axes[da][k] != b->axes[db][k]) return false;
  return true;
}

static bool dims_same(const Sharding *a, int da, const Sharding *b, int db) {
  return a->naxes[da] == b->naxes[db] && prefix(a, da, b, db);
}

static const char *vname(const Value *v) {
  static char buf[4][96];
  static int k;
  k = (k + 1) % 4;
  if (v->name) snprintf(buf[k], sizeof buf[k], "%%%d (%s)", v->id, v->name);
  else snprintf(buf[k], sizeof buf[k], "%%%d", v->id);
  return buf[k];
}

static int64_t ext(const Ctx *c, const Value *v, const Sharding *s, int d) {
  return sharding_local_extent(&v->type, s, c->mesh, d);
}

/* ---- values ---- */

static bool check_value(Ctx *c, const Value *v) {
  bool ok = true;
  uint16_t used = v->sharding.partial;
  for (int d = 0; d < v->type.rank; d++) {
    uint16_t m = dim_mask(&v->sharding, d);
    if (m & used) ok = false, note("%s uses a mesh axis twice", vname(v));
    used |= m;
    int64_t n = mask_size(c, m);
    if (v->type.dims[d]->size % n != 0)
      ok = false, note("%s: dim %s (%lld) not divisible by %lld", vname(v), v->type.dims[d]->name,
                       (long long)v->type.dims[d]->size, (long long)n);
  }
  return ok;
}

/* ---- collectives ---- */

static bool check_collective(Ctx *c, const Op *op) {
  const Value *x = op->operands[0], *y = op->results[0];
  const Sharding *A = &x->sharding, *B = &y->sharding;
  uint16_t X = op->axes;
  c->collectives++;
  if (!tensor_type_equal(&x->type, &y->type)) {
    note("%s at line %d changes the type", ir_op_name(op->kind), op->loc.line);
    return false;
  }
  if (mask_size(c, X) <= 1) {
    note("%s at line %d runs over axes of size 1", ir_op_name(op->kind), op->loc.line);
    return false;
  }
  int rank = x->type.rank;
  if (c->localized) {
    /* the CollSpec names exactly the axes the collective runs over (those with more than one
     * device), each once, and a part's dim where the shardings say it changes */
    const CollSpec *cs = op->coll;
    if (!cs) return note("%s at line %d has no CollSpec after localisation", ir_op_name(op->kind), op->loc.line), false;
    uint16_t named = 0, real = 0;
    for (int a = 0; a < c->mesh->naxes; a++)
      if ((X >> a & 1) && axis_size(c, a) > 1) real |= (uint16_t)(1u << a);
    for (int k = 0; k < cs->nparts; k++)
      for (int j = 0; j < cs->parts[k].naxes; j++) {
        uint16_t bit = (uint16_t)(1u << cs->parts[k].axes[j]);
        if ((named & bit) && !(op->kind == OP_ALL_TO_ALL && k == 1))
          return note("%s at line %d names an axis twice", ir_op_name(op->kind), op->loc.line), false;
        named |= bit;
      }
    if (op->kind != OP_ALL_REDUCE && named != real)
      return note("%s at line %d: its CollSpec names axes %#x, it runs over %#x", ir_op_name(op->kind), op->loc.line,
                  named, real), false;
    for (int k = 0; op->kind != OP_PERMUTE && k < cs->nparts; k++) {
      int d = cs->parts[k].dim;
      if (d < 0 || d >= rank || dims_same(A, d, B, d))
        return note("%s at line %d: CollSpec part %d names dim %d, which does not change", ir_op_name(op->kind),
                    op->loc.line, k, d), false;
    }
  }
  switch (op->kind) {
  case OP_ALL_GATHER: {
    if (A->partial != B->partial) return note("all_gather at line %d changes partial", op->loc.line), false;
    uint16_t removed = 0;
    for (int d = 0; d < rank; d++) {
      if (!prefix(B, d, A, d)) return note("all_gather at line %d: dim %d is not a prefix", op->loc.line, d), false;
      uint16_t r = 0;
      for (int k = B->naxes[d]; k < A->naxes[d]; k++) r |= (uint16_t)(1u << A->axes[d][k]);
      if (ext(c, y, B, d) != ext(c, x, A, d) * mask_size(c, r))
        return note("all_gather at line %d: extent of dim %d does not grow by the axes removed", op->loc.line, d), false;
      removed |= r;
    }
    if (removed != X) return note("all_gather at line %d removes axes %#x, runs over %#x", op->loc.line, removed, X), false;
    return true;
  }
  case OP_REDUCE_SCATTER: {
    if ((A->partial & X) != X || B->partial != (A->partial & ~X))
      return note("reduce_scatter at line %d: partial %#x -> %#x over %#x", op->loc.line, A->partial, B->partial, X), false;
    uint16_t added = 0;
    for (int d = 0; d < rank; d++) {
      if (!prefix(A, d, B, d)) return note("reduce_scatter at line %d: dim %d not extended", op->loc.line, d), false;
      uint16_t r = 0;
      for (int k = A->naxes[d]; k < B->naxes[d]; k++) r |= (uint16_t)(1u << B->axes[d][k]);
      if (ext(c, y, B, d) * mask_size(c, r) != ext(c, x, A, d))
        return note("reduce_scatter at line %d: extent of dim %d", op->loc.line, d), false;
      added |= r;
    }
    if (added != X) return note("reduce_scatter at line %d scatters %#x over %#x", op->loc.line, added, X), false;
    return true;
  }
  case OP_ALL_REDUCE:
    if ((A->partial & X) != X || B->partial != (A->partial & ~X))
      return note("all_reduce at line %d: partial %#x -> %#x over %#x", op->loc.line, A->partial, B->partial, X), false;
    for (int d = 0; d < rank; d++)
      if (!dims_same(A, d, B, d)) return note("all_reduce at line %d changes dim %d", op->loc.line, d), false;
    if (op->reduce_max != x->partial_max) return note("all_reduce at line %d: max/sum mismatch", op->loc.line), false;
    return true;
  case OP_ALL_TO_ALL: {
    if (A->partial != B->partial) return note("all_to_all at line %d changes partial", op->loc.line), false;
    int from = -1, to = -1;
    for (int d = 0; d < rank; d++) {
      if (dims_same(A, d, B, d)) continue;
      if (A->naxes[d] == B->naxes[d] + 1 && prefix(B, d, A, d) && X == (1u << A->axes[d][A->naxes[d] - 1])) from = d;
      else if (B->naxes[d] == A->naxes[d] + 1 && prefix(A, d, B, d) && X == (1u << B->axes[d][B->naxes[d] - 1])) to = d;
      else return note("all_to_all at line %d: dim %d changes otherwise", op->loc.line, d), false;
    }
    if (from < 0 || to < 0) return note("all_to_all at line %d moves nothing", op->loc.line), false;
    int64_t n = mask_size(c, X);
    if (ext(c, y, B, from) != ext(c, x, A, from) * n || ext(c, y, B, to) * n != ext(c, x, A, to))
      return note("all_to_all at line %d: extents", op->loc.line), false;
    return true;
  }
  case OP_PERMUTE:
    if (A->partial != B->partial) return note("permute at line %d changes partial", op->loc.line), false;
    for (int d = 0; d < rank; d++)
      if (!dims_same(A, d, B, d)) return note("permute at line %d changes dim %d", op->loc.line, d), false;
    return true;
  default: return true;
  }
}

/* ---- ops ---- */

static bool nonlinear(OpKind k) {
  return (k >= OP_EXP && k <= OP_SILU) || k == OP_SOFTMAX || k == OP_RMSNORM || k == OP_LAYERNORM ||
         k == OP_CAUSAL || k == OP_ATTENTION || k == OP_TAKE || k == OP_MAX || k == OP_ROUTE;
}

/* The training ops (ir.h's definitions): the one operand each is linear in, which alone may be a
 * partial sum (-1: none may; -2: not a training op). */
static int training_linear_operand(OpKind k) {
  switch (k) {
  case OP_BROADCAST: case OP_CAUSAL_GRAD: case OP_PICK: return 0;
  case OP_RELU_GRAD: case OP_GELU_GRAD: case OP_SILU_GRAD: case OP_SOFTMAX_GRAD: case OP_TAKE_GRAD: return 1;
  case OP_MAX_GRAD: case OP_RMSNORM_GRAD: case OP_LAYERNORM_GRAD: case OP_CROSS_ENTROPY_GRAD: return 2;
  case OP_ATTENTION_GRAD: case OP_CROSS_ENTROPY: case OP_SGD_UPDATE: case OP_ADAM_MOMENT: case OP_ADAM_UPDATE:
  case OP_ONEHOT:
    return -1;
  default: return -2;
  }
}

/* The dims op sums over (their axes become partial) and the dims it needs whole. */
static bool summed_dim(const Op *op, const Dim *d) {
  if (op->kind == OP_CONTRACT || op->kind == OP_SUM || op->kind == OP_MEAN || op->kind == OP_MAX ||
      op->kind == OP_ROUTE_GRAD) /* (route_grad: a contraction at its pattern's entries) */
    for (int j = 0; j < op->ndims; j++)
      if (op->dims[j] == d) return true;
  if (op->kind == OP_TAKE) return op->operands[0]->type.rank > 0 && op->operands[0]->type.dims[0] == d;
  if (op->kind == OP_TAKE_GRAD) return tensor_type_find(&op->operands[0]->type, d) >= 0; /* the positions */
  if (op->kind == OP_PICK) return op->ndims > 0 && op->dims[0] == d;
  if (op->kind == OP_ATTENTION_GRAD && (op->index == 1 || op->index == 2) && op->ndims > 0) /* dk, dv */
    return d != op->dims[0] && tensor_type_find(&op->operands[0]->type, d) >= 0 &&
           tensor_type_find(&op->results[0]->type, d) < 0;
  return false;
}

static bool whole_dim(const Op *op, const Dim *d) {
  switch (op->kind) {
  case OP_SOFTMAX: case OP_RMSNORM: case OP_LAYERNORM: case OP_SOFTMAX_GRAD: case OP_RMSNORM_GRAD:
  case OP_LAYERNORM_GRAD: case OP_CROSS_ENTROPY: case OP_CROSS_ENTROPY_GRAD:
    return op->ndims > 0 && op->dims[0] == d; /* sharded, partitioning rewrites them (statistics) */
  case OP_ATTENTION: case OP_ATTENTION_GRAD: /* a ring's key dim: checked by ring_ok */
    return op->ndims >= 2 && (op->dims[0] == d || (op->dims[1] == d && !op->ring));
  case OP_ROUTE: /* top-k along the experts, slots filled in order of the tokens */
    return op->ndims >= 2 && (op->dims[0] == d || op->dims[1] == d);
  default: return false;
  }
}

/* Ring attention (language.md, Context parallelism): q's query dim and k's and v's key dim are
 * sharded over exactly the ring's axes, in the same order, and no other dim of q over any of them;
 * the result is no partial sum over them (the ring sums every block itself). */
static bool ring_ok(Ctx *c, const Op *op) {
  if (!op->ring) return true;
  const Value *q = op->operands[0], *k = op->operands[1], *v = op->operands[2];
  int qd = tensor_type_find(&q->type, op->dims[2]), kd = tensor_type_find(&k->type, op->dims[1]);
  int vd = tensor_type_find(&v->type, op->dims[1]);
  bool ok = qd >= 0 && kd >= 0 && vd >= 0 && dim_mask(&q->sharding, qd) == op->ring &&
            dims_same(&q->sharding, qd, &k->sharding, kd) && dims_same(&k->sharding, kd, &v->sharding, vd);
  for (int d = 0; ok && d < q->type.rank; d++)
    if (d != qd && (dim_mask(&q->sharding, d) & op->ring)) ok = false;
  if (ok && (op->results[0]->sharding.partial & op->ring)) ok = false;
  if (!ok) note("%s at line %d: not a ring over %s as its operands are sharded", ir_op_name(op->kind), op->loc.line, "its axes");
  (void)c;
  return ok;
}

/* Zeros (a constant 0, or its broadcast): a partial sum of zeros over any axes. */
static bool zeros(const Op *op) {
  const Op *z = op->kind == OP_BROADCAST && op->operands[0]->def ? op->operands[0]->def : op;
  return z->kind == OP_CONST && z->scalar == 0;
}

static const Dim *renamed(const Op *op, const Dim *d) {
  if (op->kind == OP_RENAME)
    for (int j = 0; j + 1 < op->ndims; j += 2)
      if (op->dims[j] == d) return op->dims[j + 1];
  return d;
}

static int64_t local_elems(const Ctx *c, const Value *v, const Sharding *s) {
  int64_t n = 1;
  for (int d = 0; d < v->type.rank; d++) n *= ext(c, v, s, d);
  return n;
}

static bool check_op(Ctx *c, const Op *op) {
  if (op->nresults != 1 || op->kind == OP_INPUT || op->kind == OP_PARAM || op->kind == OP_CONST) return true;
  const Value *r = op->results[0];
  const Sharding *R = &r->sharding;
  Sharding in[8];
  int n = op->noperands < 8 ? op->noperands : 8;
  bool ok = true;
  if (c->localized && op->in_shard) ok = false, note("%s at line %d still reads through in_shard", ir_op_name(op->kind), op->loc.line);
  for (int i = 0; i < n; i++) {
    const Value *v = op->operands[i];
    in[i] = op->in_shard ? op->in_shard[i] : v->sharding;
    if (in[i].partial != v->sharding.partial) ok = false, note("op at line %d slices partial axes", op->loc.line);
    for (int d = 0; d < v->type.rank; d++)
      if (!prefix(&v->sharding, d, &in[i], d))
        ok = false, note("%s at line %d: a local slice of %s removes axes", ir_op_name(op->kind), op->loc.line, vname(v));
  }
  if (op->kind == OP_SLICE) { /* localisation's explicit slice: a finer block of what it reads */
    for (int d = 0; d < r->type.rank; d++)
      if (!prefix(&in[0], d, R, d))
        ok = false, note("slice at line %d: the result does not refine %s's %s", op->loc.line, vname(op->operands[0]),
                         r->type.dims[d]->name);
    if (in[0].partial != R->partial) ok = false, note("slice at line %d changes partial", op->loc.line);
    return ok;
  }
  if (op->kind == OP_SPLIT || op->kind == OP_MERGE) {
    if (local_elems(c, op->operands[0], &in[0]) != local_elems(c, r, R))
      ok = false, note("%s at line %d changes the elements per device", ir_op_name(op->kind), op->loc.line);
    if (in[0].partial != R->partial) ok = false, note("%s at line %d changes partial", ir_op_name(op->kind), op->loc.line);
    return ok;
  }
  /* partial sums: who may read them */
  int npartial = 0;
  for (int i = 0; i < n; i++) npartial += in[i].partial != 0;
  if (nonlinear(op->kind) && npartial)
    ok = false, note("%s at line %d reads a partial sum", ir_op_name(op->kind), op->loc.line);
  int lin = training_linear_operand(op->kind);
  for (int i = 0; lin > -2 && i < n; i++)
    if (in[i].partial && i != lin)
      ok = false, note("%s at line %d reads a partial sum as operand %d, which it is not linear in", ir_op_name(op->kind),
                       op->loc.line, i);
  if ((op->kind == OP_ADD || op->kind == OP_SUB) && n == 2 && in[0].partial != in[1].partial)
    ok = false, note("%s at line %d adds unequally partial operands", ir_op_name(op->kind), op->loc.line);
  if ((op->kind == OP_MUL || op->kind == OP_CONTRACT || op->kind == OP_DIV || op->kind == OP_ROUTE_GRAD) && npartial > 1)
    ok = false, note("%s at line %d multiplies two partial sums", ir_op_name(op->kind), op->loc.line);
  if (op->kind == OP_ROUTE_GRAD && n == 3 && in[0].partial)
    ok = false, note("route_grad at line %d reads its pattern as a partial sum", op->loc.line);
  if (op->kind == OP_DIV && n == 2 && in[1].partial) ok = false, note("div at line %d divides by a partial sum", op->loc.line);
  if (op->kind == OP_CAST && in[0].partial && dtype_bytes(r->type.dtype) > dtype_bytes(op->operands[0]->type.dtype) &&
      op->phase != PHASE_ACCUMULATE) /* the microbatch accumulators sum unreduced gradients in f32 */
    ok = false, note("cast at line %d widens a partial sum", op->loc.line);
  /* shared dims agree; summed dims' axes become the new partial axes */
  uint16_t summed = 0, passed = 0;
  for (int i = 0; i < n; i++) {
    const Value *v = op->operands[i];
    passed |= in[i].partial;
    for (int d = 0; d < v->type.rank; d++) {
      const Dim *dim = renamed(op, v->type.dims[d]);
      if (whole_dim(op, v->type.dims[d]) && in[i].naxes[d])
        ok = false, note("%s at line %d: %s's %s must be whole", ir_op_name(op->kind), op->loc.line, vname(v), dim->name);
      if (summed_dim(op, v->type.dims[d])) summed |= dim_mask(&in[i], d);
      int e = tensor_type_find(&r->type, dim);
      bool result_slice = !c->localized && whole_dim(op, v->type.dims[d]) && e >= 0 && prefix(&in[i], d, R, e);
      /* (computed whole and sliced after; localised, that slice is an OP_SLICE of its own) */
      if (e >= 0 && !dims_same(&in[i], d, R, e) && !result_slice)
        ok = false, note("%s at line %d: %s's %s disagrees with the result", ir_op_name(op->kind), op->loc.line, vname(v),
                         dim->name);
      for (int j = 0; j < n; j++) { /* the same dim in another operand */
        if (j == i) continue;
        int f = tensor_type_find(&op->operands[j]->type, v->type.dims[d]);
        if (f >= 0 && op->kind != OP_RENAME && !dims_same(&in[i], d, &in[j], f))
          ok = false, note("%s at line %d: operands disagree on %s", ir_op_name(op->kind), op->loc.line, dim->name);
      }
    }
  }
  if (op->ring) { /* the ring sums over the query and key blocks itself */
    ok &= ring_ok(c, op);
    summed &= (uint16_t)~op->ring;
  }
  if (zeros(op) && !summed && !passed) {
    /* zeros may be declared partial (a microbatch loop's accumulators start so) */
  } else if (op->kind == OP_MAX) {
    if (R->partial != summed || (summed && !r->partial_max))
      ok = false, note("max at line %d: partial %#x for summed axes %#x", op->loc.line, R->partial, summed);
  } else if (summed || R->partial) {
    uint16_t want = (uint16_t)(summed | passed);
    if (R->partial != want)
      ok = false, note("%s at line %d: result partial %#x, expected %#x", ir_op_name(op->kind), op->loc.line, R->partial, want);
  }
  return ok;
}

static bool check_func(Ctx *c, const IrFunc *f) {
  bool ok = true;
  for (int i = 0; i < f->ninputs; i++) ok &= check_value(c, f->inputs[i]);
  for (const Op *op = f->first; op; op = op->next) {
    for (int i = 0; i < op->nresults; i++) ok &= check_value(c, op->results[i]);
    if (ir_op_is_collective(op->kind)) ok &= check_collective(c, op);
    else if (op->kind != OP_LOOP) ok &= check_op(c, op);
    if (op->kind != OP_LOOP || !op->body) continue;
    const IrFunc *b = op->body;
    for (int i = 0; i < op->noperands && i < b->ninputs; i++) {
      const Value *o = op->operands[i], *in = b->inputs[i];
      if (i < op->nslices) {
        for (int d = 1; d < o->type.rank; d++)
          if (!dims_same(&o->sharding, d, &in->sharding, d - 1)) ok = false, note("loop line %d: slice %d", op->loc.line, i);
      } else if (!sharding_equal(&o->sharding, &in->sharding, in->type.rank)) {
        ok = false, note("loop at line %d: operand %d differs from the body's input", op->loc.line, i);
      }
    }
    for (int r = 0; r < op->ncarried && r < b->noutputs; r++) {
      const Value *in = b->inputs[op->nslices + r], *out = b->outputs[r], *res = op->results[r];
      if (!sharding_equal(&in->sharding, &out->sharding, in->type.rank) ||
          !sharding_equal(&in->sharding, &res->sharding, in->type.rank))
        ok = false, note("loop at line %d: carried value %d changes sharding", op->loc.line, r);
    }
    /* stacked results: each iteration's body output is one row, sharded alike; the stacking dim of
     * every stacked value (slices and stacked results) has the same axes: the pipeline's stages */
    uint16_t stages = 0;
    bool first = true;
    for (int i = 0; i < op->nslices + op->nresults; i++) {
      bool slice = i < op->nslices;
      int r = i - op->nslices;
      if (!slice && r < op->ncarried) continue;
      const Value *v = slice ? op->operands[i] : op->results[r];
      if (!slice && r < b->noutputs) {
        const Value *out = b->outputs[r];
        bool same = out->sharding.partial == v->sharding.partial;
        for (int d = 1; d < v->type.rank; d++) same &= dims_same(&v->sharding, d, &out->sharding, d - 1);
        if (!same) ok = false, note("loop at line %d: stacked result %d differs from its body output", op->loc.line, r);
      }
      uint16_t m = v->type.rank > 0 ? dim_mask(&v->sharding, 0) : 0;
      if (!first && m != stages)
        ok = false, note("loop at line %d: stacked values shard the stacking dim differently", op->loc.line);
      stages = m, first = false;
    }
    ok &= check_func(c, b);
  }
  return ok;
}

/* ---- driving ---- */

/* One configuration: returns 1 pass, 0 fail, -1 skip. */
static int run_config(const char *path, const char *mesh, const char *layout, char *label, size_t nlabel) {
  Arena a;
  arena_init(&a);
  diag_reset();
  ParsedProgram *pp = parse_program(&a, path, unit_stdlib_dir());
  int res = -1;
  snprintf(label, nlabel, "%s mesh=%s layout=%s", path, mesh ? mesh : "-", layout ? layout : "-");
  if (pp && pp->nfiles > 0 && diag_error_count() == 0) {
    SemaOptions so = {.mesh = mesh, .layout = layout};
    Program *p = sema_program(&a, pp, &so);
    if (!p->usage_error && diag_error_count() == 0 && p->entry && p->mesh) {
      IrModule *m = step_build(&a, p); /* a train step whole; else the entry alone */
      if (m && diag_error_count() == 0) {
        propagate_module(m, p);
        bool parted = partition_module(m, p);
        if (parted && diag_error_count() == 0) {
          Ctx c = {.p = p, .mesh = p->mesh};
          note_buf[0] = 0;
          nnotes = 0;
          bool ok = ir_verify(m, NULL);
          if (!ok) note("ir_verify fails");
          ok &= check_func(&c, m->main);
          for (int i = 0; i < m->main->noutputs; i++)
            if (m->main->outputs[i]->sharding.partial) ok = false, note("an output is a partial sum");
          /* localised: no implicit slice is left, every collective states its runtime facts, and
           * every op computes on operands held exactly as it computes with them */
          int before = c.collectives;
          if (!localize_module(m, p)) ok = false, note("localisation reports an error");
          int implicit = localize_count_implicit(m);
          if (implicit) ok = false, note("localisation left %d implicit slices, collectives or extents", implicit);
          c.collectives = 0;
          c.localized = true;
          ok &= check_func(&c, m->main);
          if (c.collectives != before)
            ok = false, note("localisation changed the collectives: %d -> %d", before, c.collectives);
          if (!ir_verify(m, NULL)) ok = false, note("ir_verify fails after localisation");
          MemoryReport mr;
          memory_estimate(p, m, &mr); /* reads the localised module */
          size_t len = strlen(label);
          snprintf(label + len, nlabel - len, " (%d collectives)", c.collectives);
          res = ok ? 1 : 0;
        }
      }
    }
  }
  arena_free(&a);
  return res;
}

static void run_file(const char *path) {
  char *meshes[32], *layouts[32];
  int nm, nl;
  unit_declared(path, meshes, &nm, layouts, &nl, 32);
  for (int i = 0; i < nm; i++)
    for (int j = 0; j < nl; j++) {
      char label[1024];
      int r = run_config(path, meshes[i], layouts[j], label, sizeof label);
      if (r < 0) {
        nskip++;
        printf("SKIP %s (does not compile)\n", label);
      } else if (r == 0) {
        nfail++;
        printf("FAIL %s\n%s", label, note_buf);
      } else {
        npass++;
        printf("PASS %s\n", label);
      }
    }
  for (int i = 0; i < nm; i++) free(meshes[i]);
  for (int j = 0; j < nl; j++) free(layouts[j]);
}

static void run_path(const char *path) {
  if (!ut_each_shard(path, run_file)) {
    fprintf(stderr, "test_partition: cannot read %s\n", path);
    nfail++;
  }
}

int main(int argc, char **argv) {
  FILE *devnull = fopen("/dev/null", "w");
  diag_configure(devnull ? devnull : stderr, DIAG_MACHINE, false);
  for (int i = 1; i < argc; i++) run_path(argv[i]);
  printf("%d passed, %d failed (%d skipped)\n", npass, nfail, nskip);
  if (devnull) fclose(devnull);
  return nfail > 0 || npass == 0 ? 1 : 0;
}
