/* interp_spmd.c: the interpreter per device: blocks, the checks around each op, collectives.
 *
 * In: a partitioned IrModule (every value sharded, collectives inserted), the mesh, whole inputs
 * and params. Out: the entry's outputs reassembled from the devices' blocks, or the first
 * partitioning mistake found, named by its op.
 *
 * Blocks. Devices are numbered major to minor over the mesh axes (device = sum of coordinate x
 * stride, the last axis varying fastest). A dim sharded over axes (a1, ..., ak) (major to minor) is
 * cut into prod(size(ai)) equal blocks; a device holds block number = its coordinates on
 * a1..ak read as a mixed-radix number (a1 most significant). A value whose sharding has `partial`
 * axes holds, on each device, one summand: the value is the sum of the blocks over the devices
 * that differ only in those axes (or their maximum, Value.partial_max).
 *
 * Each op, on each device:
 *   1. reads every operand as the op computes with it: Op.in_shard[i] when set (the device slices
 *      the block it holds to the finer one), then every dim that the result keeps is sliced to the
 *      result's block on this device (a device may always take part of what it holds; counted in
 *      InterpStats.implicit_slices);
 *   2. runs the kernel (interp_ops.c) on those blocks;
 *   3. checks that it computed the block the result's sharding assigns to the device (a larger
 *      one is sliced: an op "computes its part directly"), and that the result is a partial sum
 *      over exactly the axes its sharding says: the axes of the summed dims its operands hold in
 *      part (contracted, reduced, take's table rows) plus the partial axes passed through linear
 *      ops (add and sub of equally partial operands; mul, div's numerator, contract, take's table,
 *      neg, casts, reshapes, renames, causal of one), while nonlinear ops read no partial sum, no
 *      operand is sharded over another's partial axes, and unreduced maxima reach nothing but a
 *      max-AllReduce.
 * Collectives exchange blocks between the devices of each group (the devices that differ only on
 * the op's axes): AllGather and AllToAll assemble the result's block from the group's operand
 * blocks (every element must come from inside the group), AllReduce sums (or maxes) the group's
 * blocks, ReduceScatter sums and keeps the device's block, CollectivePermute shifts blocks by one
 * along its axes (a ring) -- or, in a pipeline's loop body (Op.coll_period), hands the carried
 * values from the stage that just ran its last layer to the next stage. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interp_int.h"
#include "partition.h"

/* ---- devices and axes ---- */

/* Axes of size 1 change nothing: masks drop them before any comparison. */
static uint16_t real_axes(const Interp *I, uint16_t mask) {
  uint16_t r = 0;
  for (int a = 0; a < I->mesh->naxes; a++)
    if ((mask >> a & 1) && I->mesh->axes[a].size > 1) r |= (uint16_t)(1u << a);
  return r;
}

static uint16_t dim_axes(const Interp *I, const Sharding *s, int d) {
  uint16_t m = 0;
  for (int k = 0; k < s->naxes[d] && k < MAX_AXES_PER_DIM; k++)
    if (s->axes[d][k] >= 0 && s->axes[d][k] < 16) m |= (uint16_t)(1u << s->axes[d][k]);
  return real_axes(I, m);
}

static uint16_t used_axes(const Interp *I, const Sharding *s, int rank) {
  uint16_t m = 0;
  for (int d = 0; d < rank; d++) m |= dim_axes(I, s, d);
  return m;
}

static const char *axes_text(const Interp *I, uint16_t mask, char *buf, size_t n) {
  size_t len = 0;
  buf[0] = 0;
  if (!mask) snprintf(buf, n, "none");
  for (int a = 0; a < I->mesh->naxes && len + 1 < n; a++)
    if (mask >> a & 1) len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? ", " : "", I->mesh->axes[a].name);
  return buf;
}

/* Each dim's axes as a list of those larger than 1 (equal lists mean equal blocks everywhere). */
static bool same_blocks(const Interp *I, const Sharding *a, const Sharding *b, int rank) {
  for (int d = 0; d < rank; d++) {
    int8_t x[MAX_AXES_PER_DIM], y[MAX_AXES_PER_DIM];
    int nx = 0, ny = 0;
    for (int k = 0; k < a->naxes[d] && k < MAX_AXES_PER_DIM; k++)
      if (I->mesh->axes[a->axes[d][k]].size > 1) x[nx++] = a->axes[d][k];
    for (int k = 0; k < b->naxes[d] && k < MAX_AXES_PER_DIM; k++)
      if (I->mesh->axes[b->axes[d][k]].size > 1) y[ny++] = b->axes[d][k];
    if (nx != ny || memcmp(x, y, (size_t)nx) != 0) return false;
  }
  return true;
}

static bool same_sharding(const Interp *I, const Sharding *a, const Sharding *b, int rank) {
  return same_blocks(I, a, b, rank) && real_axes(I, a->partial) == real_axes(I, b->partial);
}

/* The axes are real mesh axes, each used once over the dims and the partial set. */
static bool valid_sharding(Interp *I, const Op *op, const Value *v) {
  const Sharding *s = &v->sharding;
  uint16_t seen = 0;
  for (int d = 0; d < v->type.rank; d++) {
    if (s->naxes[d] > MAX_AXES_PER_DIM) return interp_fail(I, op, "dim %d lists %d axes", d, s->naxes[d]);
    for (int k = 0; k < s->naxes[d]; k++) {
      int a = s->axes[d][k];
      if (a < 0 || a >= I->mesh->naxes) return interp_fail(I, op, "axis #%d is not an axis of the mesh", a);
      if (seen >> a & 1) return interp_fail(I, op, "axis %s shards two dims of one value", I->mesh->axes[a].name);
      seen |= (uint16_t)(1u << a);
    }
  }
  if (s->partial >> I->mesh->naxes) return interp_fail(I, op, "partial over an axis the mesh lacks");
  if (real_axes(I, s->partial) & real_axes(I, seen)) {
    char b[128];
    return interp_fail(I, op, "the value is both sharded over and a partial sum over %s",
                       axes_text(I, real_axes(I, s->partial & seen), b, sizeof b));
  }
  return true;
}

/* The block of a value of type t under sharding s on device dev: the device program's (its groups
 * per dim, dev_sharding_block), once the dims are checked to divide. */
static bool block_under(Interp *I, const Op *op, const TensorType *t, const Sharding *s, int dev, int64_t *start,
                        int64_t *shape) {
  for (int i = 0; i < t->rank; i++) {
    int64_t nb = 1;
    for (int k = 0; k < s->naxes[i] && k < MAX_AXES_PER_DIM; k++) {
      int a = s->axes[i][k];
      if (a < 0 || a >= I->mesh->naxes) return interp_fail(I, op, "axis #%d is not an axis of the mesh", a);
      nb *= I->mesh->axes[a].size;
    }
    int64_t size = t->dims[i]->size;
    if (nb < 1 || size % nb)
      return interp_fail(I, op, "dim %s (%lld) does not divide into %lld blocks", t->dims[i]->name, (long long)size,
                         (long long)nb);
  }
  dev_sharding_block(I->dev, t, s, dev, start, shape);
  return true;
}

/* The device program's groups over a set of axes; whether devices a and b are in one of them. */
static const DevGroups *groups_of(const Interp *I, uint16_t axes) { return dev_groups_mask(I->dev, axes); }

static bool same_group(const Interp *I, int a, int b, uint16_t axes) {
  const DevGroups *g = groups_of(I, axes);
  return g->group_of[a] == g->group_of[b];
}

bool spmd_block(Interp *I, const Op *op, const Value *v, int dev, int64_t *start, int64_t *shape) {
  if (!valid_sharding(I, op, v)) return false;
  if (v->def && (v->def->kind == OP_INPUT || v->def->kind == OP_PARAM) && real_axes(I, v->sharding.partial))
    return interp_fail(I, op, "an input or param cannot be a partial sum");
  return block_under(I, op, &v->type, &v->sharding, dev, start, shape);
}

static bool holds(const Tensor *t, const int64_t *start, const int64_t *shape) {
  for (int i = 0; i < t->type.rank; i++)
    if (start[i] < t->start[i] || start[i] + shape[i] > t->start[i] + t->shape[i]) return false;
  return true;
}

static bool same_block(const Tensor *t, const int64_t *start, const int64_t *shape) {
  for (int i = 0; i < t->type.rank; i++)
    if (start[i] != t->start[i] || shape[i] != t->shape[i]) return false;
  return true;
}

/* Slices take the stacked operand minus its leading dim; carried values keep one sharding from
 * the operand through the body to the result; invariants enter as they are. No loop shards its
 * stacking dim: a pipeline's layers run in its chunk regions (interp_pipe.c), a chunk at a time. */
bool spmd_loop_check(Interp *I, const Op *op) {
  const IrFunc *b = op->body;
  for (int i = 0; i < op->noperands; i++) {
    const Value *x = op->operands[i], *in = b->inputs[i];
    if (!valid_sharding(I, op, x) || !valid_sharding(I, op, in)) return false;
    if (i < op->nslices) {
      Sharding s = {0};
      for (int d = 1; d < x->type.rank; d++) {
        s.naxes[d - 1] = x->sharding.naxes[d];
        memcpy(s.axes[d - 1], x->sharding.axes[d], sizeof s.axes[0]);
      }
      s.partial = x->sharding.partial;
      if (!same_sharding(I, &s, &in->sharding, in->type.rank)) {
        char a[256], c[256];
        sharding_format(a, sizeof a, &x->type, &x->sharding, I->mesh);
        sharding_format(c, sizeof c, &in->type, &in->sharding, I->mesh);
        return interp_fail(I, op, "stacked operand %d is %s, but its slice in the body is %s", i, a, c);
      }
      if (dim_axes(I, &x->sharding, 0))
        return interp_fail(I, op, "a stacked operand shards the stacking dim (a pipeline's loop outside its "
                           "pipeline op)");
      continue;
    }
    if (!same_sharding(I, &x->sharding, &in->sharding, x->type.rank)) {
      char a[256], c[256];
      sharding_format(a, sizeof a, &x->type, &x->sharding, I->mesh);
      sharding_format(c, sizeof c, &in->type, &in->sharding, I->mesh);
      return interp_fail(I, op, "operand %d is %s, but the body input it enters as is %s", i, a, c);
    }
  }
  for (int i = 0; i < op->ncarried; i++) {
    const Value *in = b->inputs[op->nslices + i], *out = b->outputs[i], *r = op->results[i];
    if (!same_sharding(I, &in->sharding, &out->sharding, in->type.rank) ||
        !same_sharding(I, &in->sharding, &r->sharding, in->type.rank)) {
      char a[256], c[256], e[256];
      sharding_format(a, sizeof a, &in->type, &in->sharding, I->mesh);
      sharding_format(c, sizeof c, &out->type, &out->sharding, I->mesh);
      sharding_format(e, sizeof e, &r->type, &r->sharding, I->mesh);
      return interp_fail(I, op, "carried value %d changes sharding: body input %s, body output %s, result %s", i, a, c, e);
    }
  }
  for (int j = 0; j < op->nstacked; j++) {
    const Value *out = b->outputs[op->ncarried + j], *r = op->results[op->ncarried + j];
    if (!valid_sharding(I, op, r)) return false;
    Sharding s = {0};
    for (int d = 1; d < r->type.rank; d++) {
      s.naxes[d - 1] = r->sharding.naxes[d];
      memcpy(s.axes[d - 1], r->sharding.axes[d], sizeof s.axes[0]);
    }
    s.partial = r->sharding.partial;
    if (!same_sharding(I, &s, &out->sharding, out->type.rank)) {
      char a[256], c[256];
      sharding_format(a, sizeof a, &r->type, &r->sharding, I->mesh);
      sharding_format(c, sizeof c, &out->type, &out->sharding, I->mesh);
      return interp_fail(I, op, "stacked result %d is %s, but the body output it stacks is %s", j, a, c);
    }
  }
  return true;
}

/* ---- ops ---- */

/* The dims an op sums over: held in part on a device, they leave its result a partial sum. */
static int summed_dims(const Op *op, const Dim **out) {
  int n = 0;
  switch (op->kind) { /* kept: which dims an op sums over is its own */
  case OP_CONTRACT: case OP_SUM: case OP_MEAN: case OP_MAX: case OP_ROUTE_GRAD:
    for (int k = 0; k < op->ndims; k++) out[n++] = op->dims[k];
    return n;
  case OP_TAKE: /* the table's rows: a masked local gather */
    if (op->operands[0]->type.rank > 0) out[n++] = op->operands[0]->type.dims[0];
    return n;
  case OP_PICK: /* the picked dim: a masked local pick */
    if (op->ndims > 0) out[n++] = op->dims[0];
    return n;
  case OP_TAKE_GRAD: /* the index positions */
    for (int i = 0; i < op->operands[0]->type.rank; i++) out[n++] = op->operands[0]->type.dims[i];
    return n;
  case OP_ATTENTION_GRAD: { /* dk, dv: the scores' dims k (v) lacks */
    if (op->index != 1 && op->index != 2) return 0;
    const Value *q = op->operands[0], *kv = op->operands[op->index];
    for (int i = 0; i < q->type.rank; i++)
      if (q->type.dims[i] != op->dims[0] && tensor_type_find(&kv->type, q->type.dims[i]) < 0) out[n++] = q->type.dims[i];
    return n;
  }
  default: return 0;
  }
}

/* The partial axes the op's result has, from the operands' (eff: the shardings it computes with);
 * false with an error when the op cannot read them. */
static bool derive_partial(Interp *I, const Op *op, const Sharding *eff, uint16_t *out, bool *is_max) {
  int n = op->noperands;
  uint16_t P[16] = {0}, D[16] = {0}, any = 0;
  char b1[128], b2[128];
  for (int i = 0; i < n && i < 16; i++) {
    P[i] = real_axes(I, eff[i].partial);
    D[i] = used_axes(I, &eff[i], op->operands[i]->type.rank);
    any |= P[i];
    if (P[i] && op->operands[i]->partial_max)
      return interp_fail(I, op, "operand %d holds unreduced maxima over %s; only a max all_reduce may read them", i,
                         axes_text(I, P[i], b1, sizeof b1));
  }
  for (int i = 0; i < n && i < 16; i++)
    for (int j = 0; j < n && j < 16; j++)
      if (P[i] & D[j])
        return interp_fail(I, op, "operand %d is a partial sum over %s, which shards operand %d", i,
                           axes_text(I, P[i] & D[j], b1, sizeof b1), j);
  uint16_t made = 0;
  const Dim *sd[2 * MAX_RANK];
  int ns = summed_dims(op, sd);
  for (int k = 0; k < ns; k++)
    for (int i = 0; i < n; i++) {
      int p = tensor_type_find(&op->operands[i]->type, sd[k]);
      if (p < 0) continue;
      made |= dim_axes(I, &eff[i], p);
      break;
    }
  *is_max = false;
  int lin = ir_op_info(op->kind)->lin; /* ops.def: the operand it is linear in (>= 0), or a rule below */
  if (lin >= 0) {
    for (int i = 0; i < n && i < 16; i++)
      if (i != lin && P[i])
        return interp_fail(I, op, "%s is not linear in operand %d, a partial sum over %s", ir_op_name(op->kind), i,
                           axes_text(I, P[i], b1, sizeof b1));
    *out = (lin < 16 ? P[lin] : 0) | made;
    return true;
  }
  if (op->kind == OP_MAX) { /* a max over a dim held in part: unreduced maxima */
    if (P[0]) return interp_fail(I, op, "%s is not linear, but reads a partial sum over %s", ir_op_name(op->kind),
                                 axes_text(I, any, b1, sizeof b1));
    *out = made;
    *is_max = made != 0;
    return true;
  }
  switch ((OpLin)lin) { /* the arithmetic's rules */
  case LIN_SUM: /* every operand alike */
    if (P[0] != P[1])
      return interp_fail(I, op, "adds a partial sum over %s to one over %s", axes_text(I, P[0], b1, sizeof b1),
                         axes_text(I, P[1], b2, sizeof b2));
    *out = P[0];
    return true;
  case LIN_ONE: { /* a product: one factor at most (route_grad's operand 0 is its pattern, never one) */
    int first = op->kind == OP_ROUTE_GRAD ? 1 : 0, np = 0;
    if (first && P[0]) return interp_fail(I, op, "reads its pattern as a partial sum");
    uint16_t o = made;
    for (int i = first; i < n && i < 16; i++) np += P[i] != 0, o |= P[i];
    if (np > 1) return interp_fail(I, op, "multiplies two partial sums");
    *out = o;
    return true;
  }
  case LIN_FIRST: /* a quotient: the numerator */
    if (P[1]) return interp_fail(I, op, "divides by a partial sum");
    *out = P[0];
    return true;
  default:
    if (any) break;
    *out = made;
    return true;
  }
  return interp_fail(I, op, "%s is not linear, but reads a partial sum over %s", ir_op_name(op->kind),
                     axes_text(I, any, b1, sizeof b1));
}

/* Slices operand x (local block) so that each dim the result keeps holds the result's block. The
 * result's dim i corresponds to x's dim of the same name (a rename: the same position). */
static Tensor *slice_to_result(Interp *I, const Op *op, Tensor *x, const int64_t *rs, const int64_t *rsh,
                               bool *sliced) {
  const TensorType *rt = &op->results[0]->type;
  int64_t st[MAX_RANK], sh[MAX_RANK];
  bool need = false;
  for (int i = 0; i < x->type.rank; i++) {
    st[i] = x->start[i], sh[i] = x->shape[i];
    int p = op->kind == OP_RENAME ? i : tensor_type_find(rt, x->type.dims[i]);
    if (p < 0 || p >= rt->rank) continue;
    if (x->start[i] == rs[p] && x->shape[i] == rsh[p]) continue;
    if (rs[p] < x->start[i] || rs[p] + rsh[p] > x->start[i] + x->shape[i]) {
      interp_fail(I, op, "the result's block [%lld, %lld) of %s is not held by an operand, which holds [%lld, %lld)",
                  (long long)rs[p], (long long)(rs[p] + rsh[p]), rt->dims[p]->name, (long long)x->start[i],
                  (long long)(x->start[i] + x->shape[i]));
      return NULL;
    }
    st[i] = rs[p], sh[i] = rsh[p];
    need = true;
  }
  *sliced = need;
  return need ? iop_slice(x, st, sh) : x;
}

/* The device program's offsets (DevOp.offs, from localisation's Op.offs) are the blocks this device
 * holds: each one's global start (an OP_SLICE's: within its operand's block) and extent, against
 * the blocks the run tracks. The lowering computes global indices from these alone. */
static bool check_offsets(Interp *I, const Op *op, int dev, Tensor *const *x, const int64_t *rs, const int64_t *rsh) {
  const TensorType *rt = &op->results[0]->type;
  if (!op->dev && op->noffs) return interp_fail(I, op, "offsets outside a device program");
  for (int k = 0; op->dev && k < op->dev->noffs; k++) {
    const DevOffset *di = &op->dev->offs[k];
    int64_t off = dev_block_start(di->groups, dev, di->extent);
    int64_t start = -1, ext = -1;
    int p = tensor_type_find(rt, di->dim);
    if (op->kind == OP_SLICE) {
      int q = tensor_type_find(&x[0]->type, di->dim);
      if (p < 0 || q < 0) return interp_fail(I, op, "slice: offset of a dim it does not have");
      off += x[0]->start[q];
      start = rs[p], ext = rsh[p];
    } else if (p >= 0 && op->kind != OP_TAKE && op->kind != OP_PICK) {
      start = rs[p], ext = rsh[p];
    } else {
      for (int i = 0; i < op->noperands && start < 0; i++) {
        int q = tensor_type_find(&x[i]->type, di->dim);
        if (q >= 0) start = x[i]->start[q], ext = x[i]->shape[q];
      }
    }
    if (start < 0) return interp_fail(I, op, "an offset names dim %s, which it does not hold", di->dim->name);
    if (start != off || ext != di->extent)
      return interp_fail(I, op, "on device %d the offset of %s is %lld (extent %lld), but the block held starts at "
                         "%lld (extent %lld)", dev, di->dim->name, (long long)off, (long long)di->extent,
                         (long long)start, (long long)ext);
  }
  return true;
}

/* ---- ring attention ----
 *
 * Each device's ring: its group of the device program's ring (DevRing: over the key dim's axes, in
 * their tuple's order), by rank; the block that reaches device r at step j is that of rank r - j
 * (mod n), as a +1 CollectivePermute passes them. The kernel (interp_ops.c's iop_ring_attention)
 * merges them. */
static bool spmd_ring(Interp *I, const Op *op) {
  const Value *res = op->results[0];
  if (!valid_sharding(I, op, res)) return false;
  if (!op->dev || !op->dev->ring) return interp_fail(I, op, "a ring attention outside a device program");
  const DevGroups *G = op->dev->ring->groups;
  int n = G->size;
  bool bwd = op->kind == OP_ATTENTION_GRAD;
  if (op->noperands < (bwd ? 5 : 3)) return interp_fail(I, op, "ring attention with %d operands", op->noperands);
  Tensor **q = calloc((size_t)n, sizeof *q), **k = calloc((size_t)n, sizeof *k), **v = calloc((size_t)n, sizeof *v);
  Tensor **o = calloc((size_t)n, sizeof *o), **dout = calloc((size_t)n, sizeof *dout);
  int *by_rank = calloc((size_t)n, sizeof *by_rank);
  bool ok = q && k && v && o && dout && by_rank;
  if (!ok) interp_fail(I, op, "out of memory");
  for (int d = 0; ok && d < I->ndev; d++) {
    if (!I->active[d]) continue;
    for (int r = 0; r < n; r++) by_rank[r] = G->members[G->group_of[d] * n + r];
    int r = G->rank_of[d];
    for (int j = 0; j < n && ok; j++) {
      int src = by_rank[((r - j) % n + n) % n];
      q[j] = interp_val(I, src, op->operands[0]);
      k[j] = interp_val(I, src, op->operands[1]);
      v[j] = interp_val(I, src, op->operands[2]);
      o[j] = bwd ? interp_val(I, src, op->operands[3]) : NULL;
      dout[j] = bwd ? interp_val(I, src, op->operands[4]) : NULL;
      if (!q[j] || !k[j] || !v[j] || (bwd && (!o[j] || !dout[j]))) ok = interp_fail(I, op, "a ring block is missing");
    }
    if (!ok) break;
    int64_t rs[MAX_RANK], rsh[MAX_RANK];
    if (!block_under(I, op, &res->type, &res->sharding, d, rs, rsh)) {
      ok = false;
      break;
    }
    RingBlocks R = {.n = n, .q = q, .k = k, .v = v, .o = o, .dout = dout};
    Tensor *t = iop_ring_attention(I, op, &R);
    if (!t) {
      ok = false;
      break;
    }
    if (!same_block(t, rs, rsh)) {
      tensor_free(t);
      ok = interp_fail(I, op, "ring attention computes another block than its result's on device %d", d);
      break;
    }
    t->type.dtype = res->type.dtype;
    interp_round(I, t);
    interp_set(I, d, res, t);
    I->st->ops++;
  }
  free(q), free(k), free(v), free(o), free(dout), free(by_rank);
  return ok;
}

bool spmd_op(Interp *I, const Op *op) {
  if (dev_op_ring(op)) return spmd_ring(I, op); /* the device program's ring attention */
  int n = op->noperands;
  if (I->m->localized && op->in_shard)
    return interp_fail(I, op, "reads an operand sliced (in_shard) in a localised module: an implicit slice");
  const Value *res = op->results[0];
  if (n > 16) return interp_fail(I, op, "too many operands (%d)", n);
  if (op->nresults != 1) return interp_fail(I, op, "expected one result");
  if (!valid_sharding(I, op, res)) return false;
  Sharding eff[16];
  for (int i = 0; i < n; i++) {
    eff[i] = op->in_shard ? op->in_shard[i] : op->operands[i]->sharding;
    if (real_axes(I, eff[i].partial) != real_axes(I, op->operands[i]->sharding.partial))
      return interp_fail(I, op, "in_shard changes operand %d's partial axes", i);
  }
  uint16_t partial = 0;
  bool is_max = false;
  if (!derive_partial(I, op, eff, &partial, &is_max)) return false;
  /* zeros (a constant 0, or one broadcast) are a partial sum of zeros over any axes: a step's
   * microbatch accumulators start so */
  const Op *z = op->kind == OP_BROADCAST && op->operands[0]->def ? op->operands[0]->def : op;
  if (!partial && z->kind == OP_CONST && z->scalar == 0 && !res->partial_max) partial = real_axes(I, res->sharding.partial);
  char b1[128], b2[128];
  if (partial != real_axes(I, res->sharding.partial) || (partial && is_max != res->partial_max))
    return interp_fail(I, op, "computes %s over %s, but its result is declared %s over %s",
                       is_max ? "unreduced maxima" : "a partial sum", axes_text(I, partial, b1, sizeof b1),
                       res->partial_max ? "unreduced maxima" : "a partial sum",
                       axes_text(I, real_axes(I, res->sharding.partial), b2, sizeof b2));
  bool by_name = op->kind != OP_SPLIT && op->kind != OP_MERGE && op->kind != OP_CONST && op->kind != OP_SLICE;
  for (int d = 0; d < I->ndev; d++) {
    if (!I->active[d]) continue;
    int64_t rs[MAX_RANK], rsh[MAX_RANK];
    if (!block_under(I, op, &res->type, &res->sharding, d, rs, rsh)) return false;
    Tensor *x[16], *own[16] = {0};
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
      x[i] = interp_val(I, d, op->operands[i]);
      if (!x[i]) {
        ok = interp_fail(I, op, "operand %d has no value on device %d", i, d);
        break;
      }
      if (op->in_shard && !same_blocks(I, &eff[i], &op->operands[i]->sharding, op->operands[i]->type.rank)) {
        int64_t st[MAX_RANK], sh[MAX_RANK];
        if (!block_under(I, op, &op->operands[i]->type, &eff[i], d, st, sh)) {
          ok = false;
          break;
        }
        if (!holds(x[i], st, sh)) {
          ok = interp_fail(I, op, "in_shard asks operand %d for a block device %d does not hold", i, d);
          break;
        }
        x[i] = own[i] = iop_slice(x[i], st, sh);
      }
      if (by_name) {
        bool sliced = false;
        Tensor *y = slice_to_result(I, op, x[i], rs, rsh, &sliced);
        if (!y) {
          ok = false;
          break;
        }
        if (sliced && I->m->localized) {
          tensor_free(y);
          ok = interp_fail(I, op, "reads operand %d sliced to its result's block: an implicit slice (localisation "
                           "should have made it an OP_SLICE)", i);
          break;
        }
        if (sliced) {
          if (d == 0 && getenv("SHARDC_INTERP_DEBUG"))
            fprintf(stderr, "interp: %s at line %d reads operand %d sliced\n", ir_op_name(op->kind), op->loc.line, i);
          I->st->implicit_slices++;
          tensor_free(own[i]);
          x[i] = own[i] = y;
        }
      }
    }
    if (ok && I->m->localized && !check_offsets(I, op, d, x, rs, rsh)) ok = false;
    I->want_set = true;
    memcpy(I->want_start, rs, sizeof rs);
    memcpy(I->want_shape, rsh, sizeof rsh);
    Tensor *r = ok ? iop_eval(I, op, x) : NULL;
    I->want_set = false;
    for (int i = 0; i < n; i++) tensor_free(own[i]);
    if (!r) return false;
    if (!same_block(r, rs, rsh) && I->m->localized) {
      tensor_free(r);
      return interp_fail(I, op, "computes another block than its result's on device %d: an implicit slice "
                         "(localisation should have made it an OP_SLICE)", d);
    }
    if (!same_block(r, rs, rsh)) {
      if (!holds(r, rs, rsh)) {
        tensor_free(r);
        return interp_fail(I, op, "computes a block on device %d that is not the one its result's sharding assigns", d);
      }
      Tensor *s = iop_slice(r, rs, rsh);
      if (d == 0 && getenv("SHARDC_INTERP_DEBUG"))
        fprintf(stderr, "interp: %s at line %d computes more than its block\n", ir_op_name(op->kind), op->loc.line);
      tensor_free(r);
      r = s;
      I->st->implicit_slices++;
    }
    interp_set(I, d, res, r);
    I->st->ops++;
  }
  return true;
}

/* ---- collectives ---- */

/* A collective with a group (a tied param's first and last stage) reduces among the devices of its
 * subset groups (the device program's); every device runs it only where the op is placed. */
static bool in_coll_group(const Interp *I, const Op *op, uint16_t A, int e) {
  (void)I, (void)A;
  const DevColl *c = op->dev ? op->dev->coll : NULL;
  return !c || !c->groups->subset || c->groups->group_of[e] >= 0;
}

/* Applies x onto r where their blocks overlap: copy (mode 0), add (1), max (2); marks covered. */
static void overlap(Tensor *r, const Tensor *x, int mode, unsigned char *covered) {
  int rank = r->type.rank;
  int64_t lo[MAX_RANK], hi[MAX_RANK], idx[MAX_RANK];
  for (int i = 0; i < rank; i++) {
    lo[i] = r->start[i] > x->start[i] ? r->start[i] : x->start[i];
    int64_t re = r->start[i] + r->shape[i], xe = x->start[i] + x->shape[i];
    hi[i] = re < xe ? re : xe;
    if (lo[i] >= hi[i]) return;
    idx[i] = lo[i];
  }
  for (;;) {
    int64_t ro = 0, xo = 0;
    for (int i = 0; i < rank; i++) {
      ro = ro * r->shape[i] + (idx[i] - r->start[i]);
      xo = xo * x->shape[i] + (idx[i] - x->start[i]);
    }
    double v = x->data[xo];
    if (mode == 0) r->data[ro] = v;
    else if (mode == 1) r->data[ro] += v;
    else if (!covered[ro]) r->data[ro] = v;
    else if (isnan(v) || v > r->data[ro]) r->data[ro] = isnan(r->data[ro]) ? r->data[ro] : v;
    covered[ro] = 1;
    int i = rank - 1;
    while (i >= 0 && ++idx[i] == hi[i]) idx[i] = lo[i], i--;
    if (i < 0) break;
  }
}

/* The rules each kind follows between its operand's sharding S and its result's T over axes A. */
static bool collective_rules(Interp *I, const Op *op, uint16_t A) {
  const Value *x = op->operands[0], *r = op->results[0];
  const Sharding *S = &x->sharding, *T = &r->sharding;
  int rank = x->type.rank;
  uint16_t Sp = real_axes(I, S->partial), Tp = real_axes(I, T->partial);
  char b1[128], b2[128];
  if (!valid_sharding(I, op, x) || !valid_sharding(I, op, r)) return false;
  switch (op->kind) { /* kept: each collective's rules its own */
  case OP_ALL_REDUCE:
  case OP_REDUCE_SCATTER:
    if (A & ~Sp)
      return interp_fail(I, op, "reduces over %s, but the operand is a partial sum over %s only",
                         axes_text(I, A, b1, sizeof b1), axes_text(I, Sp, b2, sizeof b2));
    if (Tp != (Sp & ~A)) return interp_fail(I, op, "the result keeps the wrong partial axes");
    if (op->kind == OP_ALL_REDUCE && !same_blocks(I, S, T, rank))
      return interp_fail(I, op, "an all_reduce must keep the operand's blocks");
    if (op->reduce_max != x->partial_max)
      return interp_fail(I, op, "combines by %s, but the operand holds %s", op->reduce_max ? "max" : "sum",
                         x->partial_max ? "unreduced maxima" : "partial sums");
    if (op->kind == OP_REDUCE_SCATTER && x->partial_max) return interp_fail(I, op, "a reduce_scatter cannot take a max");
    return true;
  case OP_ALL_GATHER:
  case OP_ALL_TO_ALL:
  case OP_PERMUTE:
    if (Sp != Tp) return interp_fail(I, op, "changes the partial axes");
    if (Sp & A) return interp_fail(I, op, "moves blocks across the axes of a partial sum");
    if (op->kind == OP_PERMUTE && !same_blocks(I, S, T, rank))
      return interp_fail(I, op, "a collective_permute must keep the operand's blocks");
    if (op->kind == OP_ALL_GATHER && (used_axes(I, T, rank) & ~used_axes(I, S, rank)))
      return interp_fail(I, op, "an all_gather cannot shard a dim further");
    return true;
  default: return interp_fail(I, op, "not a collective");
  }
}

/* A ring shift by one over A: the device of rank j in its group over A (the device program's, mesh
 * order) receives from rank j - 1. */
static bool permute(Interp *I, const Op *op, uint16_t A) {
  const Value *x = op->operands[0], *res = op->results[0];
  if (dev_op_period(op) > 0) return interp_fail(I, op, "a pipeline transfer outside its pipeline op");
  int nd = I->ndev;
  Tensor **out = calloc((size_t)nd, sizeof *out);
  if (!out) return interp_fail(I, op, "out of memory");
  bool ok = true;
  const DevGroups *g = groups_of(I, A);
  for (int d = 0; d < nd && ok; d++) {
    if (!I->active[d]) continue;
    int n = g->size, src = g->members[g->group_of[d] * n + (g->rank_of[d] + n - 1) % n];
    Tensor *v = interp_val(I, (int)src, x);
    if (!v || !I->active[src]) ok = interp_fail(I, op, "device %lld has no operand to send", (long long)src);
    else out[d] = tensor_copy(v);
  }
  /* what arrives is the receiver's block of the result: same shape, the receiver's offsets */
  for (int d = 0; d < nd && ok; d++) {
    if (!out[d]) continue;
    int64_t st[MAX_RANK], sh[MAX_RANK];
    if (!block_under(I, op, &res->type, &res->sharding, d, st, sh)) {
      ok = false;
      break;
    }
    for (int i = 0; i < res->type.rank && ok; i++) {
      if (out[d]->shape[i] != sh[i]) ok = interp_fail(I, op, "the block sent to device %d has another shape", d);
      out[d]->start[i] = st[i];
    }
  }
  for (int d = 0; d < nd; d++) {
    if (ok && out[d]) {
      interp_set(I, d, res, out[d]);
      I->st->ops++;
    } else {
      tensor_free(out[d]);
    }
  }
  free(out);
  return ok;
}

bool spmd_collective(Interp *I, const Op *op) {
  uint16_t A = real_axes(I, op->axes);
  if (op->axes >> I->mesh->naxes) return interp_fail(I, op, "runs over an axis the mesh lacks");
  if (!collective_rules(I, op, A)) return false;
  if (op->kind == OP_PERMUTE) return permute(I, op, A);
  const Value *x = op->operands[0], *res = op->results[0];
  bool reduce = op->kind == OP_ALL_REDUCE || op->kind == OP_REDUCE_SCATTER;
  int mode = !reduce ? 0 : op->reduce_max ? 2 : 1;
  int nd = I->ndev;
  Tensor **out = calloc((size_t)nd, sizeof *out);
  if (!out) return interp_fail(I, op, "out of memory");
  bool ok = true;
  for (int d = 0; d < nd && ok; d++) {
    if (!I->active[d]) continue;
    int64_t st[MAX_RANK], sh[MAX_RANK];
    if (!block_under(I, op, &res->type, &res->sharding, d, st, sh)) {
      ok = false;
      break;
    }
    Tensor *r = tensor_new_block(&res->type, st, sh);
    unsigned char *covered = r ? calloc((size_t)(r->n > 0 ? r->n : 1), 1) : NULL;
    if (!r || !covered) {
      tensor_free(r);
      free(covered);
      ok = interp_fail(I, op, "out of memory");
      break;
    }
    for (int e = 0; e < nd && ok; e++) {
      if (!same_group(I, d, e, A) || !in_coll_group(I, op, A, e)) continue;
      const Tensor *v = interp_val(I, e, x);
      if (!I->active[e] || !v) {
        ok = interp_fail(I, op, "device %d of the group has no operand (an idle pipeline stage?)", e);
        break;
      }
      if (reduce && !holds(v, st, sh)) {
        ok = interp_fail(I, op, "device %d does not hold the block device %d reduces", e, d);
        break;
      }
      overlap(r, v, mode, covered);
    }
    for (int64_t i = 0; ok && i < r->n; i++)
      if (!covered[i])
        ok = interp_fail(I, op, "device %d's result needs elements no device of its group over these axes holds", d);
    free(covered);
    if (ok) {
      interp_round(I, r);
      out[d] = r;
    } else {
      tensor_free(r);
    }
  }
  for (int d = 0; d < nd; d++) {
    if (ok && out[d]) {
      interp_set(I, d, res, out[d]);
      I->st->ops++;
    } else {
      tensor_free(out[d]);
    }
  }
  free(out);
  return ok;
}

/* ---- runs ---- */

/* Output v assembled from the devices' blocks (see interp.h). A device that does not hold v (a
 * value of a pipeline stage it is not on) is skipped; of the copies of a replicated block, the one
 * of the lowest-numbered device holding it is taken and the others compared with it. */
static Tensor *reassemble(Interp *I, const Value *v) {
  int rank = v->type.rank;
  const Sharding *s = &v->sharding;
  uint16_t P = real_axes(I, s->partial), used = used_axes(I, s, rank);
  uint16_t rep = real_axes(I, (uint16_t)((1u << I->mesh->naxes) - 1)) & ~P & ~used;
  Tensor *g = tensor_new(&v->type);
  unsigned char *covered = g ? calloc((size_t)(g->n > 0 ? g->n : 1), 1) : NULL;
  if (!g || !covered) {
    tensor_free(g);
    free(covered);
    interp_fail(I, NULL, "out of memory");
    return NULL;
  }
  int mode = !P ? 0 : v->partial_max ? 2 : 1;
  for (int d = 0; d < I->ndev; d++) {
    const Tensor *x = interp_val(I, d, v);
    if (!x) continue;
    int r = d;
    for (int e = 0; e < d; e++)
      if (same_group(I, d, e, rep) && interp_val(I, e, v)) {
        r = e;
        break;
      }
    if (r == d) {
      overlap(g, x, mode, covered);
      continue;
    }
    double da, dr;
    const Tensor *y = interp_val(I, r, v);
    if (y && tensor_diff(x, y, &da, &dr)) {
      if (da > I->st->replica_diff) I->st->replica_diff = da;
    } else {
      I->st->replica_diff = INFINITY;
    }
  }
  for (int64_t i = 0; !I->failed && i < g->n; i++)
    if (!covered[i]) interp_fail(I, NULL, "the devices' blocks do not cover an output");
  free(covered);
  if (I->failed) {
    tensor_free(g);
    return NULL;
  }
  interp_round(I, g);
  return g;
}

bool interp_run_spmd(const IrModule *m, const Mesh *mesh, const InterpOptions *o, Tensor *const *inputs,
                     Tensor *const *params, Tensor **outputs, InterpStats *st) {
  InterpStats local;
  if (!st) st = &local;
  Interp I;
  bool ok = interp_setup(&I, m, mesh, o, st) && interp_bind(&I, inputs, params) && interp_exec(&I);
  for (int i = 0; ok && i < m->main->noutputs; i++) {
    Tensor *st = reassemble(&I, m->main->outputs[i]);
    outputs[i] = st ? interp_storage_permute(&I, st, false) : NULL; /* back from storage order */
    tensor_free(st);
    ok = outputs[i] != NULL;
  }
  interp_teardown(&I);
  return ok;
}

bool interp_check_spmd(const IrModule *m, const Mesh *mesh, const InterpOptions *o, Tensor *const *inputs,
                       Tensor *const *params, Tensor *const *reference, InterpCheck *out) {
  memset(out, 0, sizeof *out);
  int n = interp_noutputs(m);
  out->noutputs = n;
  out->max_abs = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  out->max_rel = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  Tensor **ref = calloc((size_t)(n > 0 ? n : 1), sizeof *ref), **got = calloc((size_t)(n > 0 ? n : 1), sizeof *got);
  bool ok = out->max_abs && out->max_rel && ref && got;
  if (!ok) snprintf(out->stats.error, sizeof out->stats.error, "out of memory");
  if (ok && !reference) {
    ok = interp_run(m, o, inputs, params, ref, &out->stats);
    if (!ok) {
      char tmp[sizeof out->stats.error];
      snprintf(tmp, sizeof tmp, "global run: %.490s", out->stats.error);
      memcpy(out->stats.error, tmp, sizeof tmp);
    }
  }
  ok = ok && interp_run_spmd(m, mesh, o, inputs, params, got, &out->stats);
  for (int i = 0; ok && i < n; i++) {
    const Tensor *want = reference ? reference[i] : ref[i];
    if (!tensor_diff(got[i], want, &out->max_abs[i], &out->max_rel[i])) {
      snprintf(out->stats.error, sizeof out->stats.error, "output %d: the SPMD result has another type", i);
      ok = false;
    }
    if (out->max_abs[i] > out->worst_abs || isnan(out->max_abs[i])) out->worst_abs = out->max_abs[i];
    if (out->max_rel[i] > out->worst_rel || isnan(out->max_rel[i])) out->worst_rel = out->max_rel[i];
  }
  if (!ok && !out->stats.error[0]) snprintf(out->stats.error, sizeof out->stats.error, "failed");
  if (!ok) out->worst_abs = out->worst_rel = INFINITY;
  interp_free_tensors(ref, n);
  interp_free_tensors(got, n);
  return ok;
}

void interp_check_free(InterpCheck *c) {
  free(c->max_abs);
  free(c->max_rel);
  c->max_abs = c->max_rel = NULL;
}
