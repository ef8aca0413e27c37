/* lower_nn.c: the ops lowered to calls into the runtime's nn kernels (shardrt.h: softmax, the
 * norms, cross entropy, take, pick, attention and their gradients). The index space each kernel
 * walks -- extents, per-tensor strides, dtypes -- is known when lowering, so it is emitted as a
 * constant (RtRows, RtAttn, filled as the C structs and made constants by runtime/rt_api.def's
 * layout, lower_rt.c); the buffers and the device's offsets are the call's arguments. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "lower_int.h"


static bool nn_fail(Lower *L, const Op *op, const char *what) {
  diag_error(op->loc, "run: %s: %s is not lowered yet", ir_op_name(op->kind), what);
  L->failed = true;
  return false;
}

static LLVMValueRef i64c(Lower *L, int64_t v) { return LLVMConstInt(L->i64, (unsigned long long)v, 1); }
static LLVMValueRef i32c(Lower *L, int v) { return LLVMConstInt(L->i32, (unsigned long long)(int64_t)v, 1); }

/* The constant RtRows (rt_api.def's layout). */
static LLVMValueRef rows_const(Lower *L, const RtRows *r) { return lower_rt_const(L, RTS_RtRows, r, "rows"); }

static int64_t ext_of(const Lower *L, const Value *v, int d) { return L->mesh ? v->local[d] : v->type.dims[d]->size; }

static int64_t stride_of(const Lower *L, const Value *v, const Dim *d) {
  int p = tensor_type_find(&v->type, d);
  if (p < 0) return 0;
  int64_t s = 1;
  for (int i = v->type.rank - 1; i > p; i--) s *= ext_of(L, v, i);
  return s;
}

/* RtRows over x's dims but `row`, for tensors t[0..n) (NULL: none). */
static bool rows_desc(Lower *L, const Op *op, const Value *x, const Dim *row, const Value *const *t, int n, RtRows *out) {
  memset(out, 0, sizeof *out);
  int nd = 0;
  for (int i = 0; i < x->type.rank; i++) {
    if (x->type.dims[i] == row) continue;
    if (nd == RT_NN_DIMS) return nn_fail(L, op, "a tensor of this rank");
    out->extent[nd] = ext_of(L, x, i);
    for (int k = 0; k < n; k++) out->stride[k][nd] = t[k] ? stride_of(L, t[k], x->type.dims[i]) : 0;
    nd++;
  }
  out->nd = nd;
  int p = row ? tensor_type_find(&x->type, row) : -1;
  out->n = p >= 0 ? ext_of(L, x, p) : 1;
  for (int k = 0; k < n; k++) {
    out->row_stride[k] = t[k] && row ? stride_of(L, t[k], row) : 0;
    if (t[k] && lower_rt_dtype(t[k]->type.dtype) < 0) return nn_fail(L, op, "this dtype");
    out->dtype[k] = t[k] ? lower_rt_dtype(t[k]->type.dtype) : 0;
  }
  out->size = row ? row->size : 1;
  return true;
}

static LLVMValueRef buf(Lower *L, const Value *v) { return v ? L->buf[v->id] : LLVMConstNull(L->ptr); }

/* The kernel's row dim must be whole on the device (as the interpreter requires). */
static bool row_whole(Lower *L, const Op *op, const Value *x, const Dim *d) {
  int p = tensor_type_find(&x->type, d);
  if (p < 0) return nn_fail(L, op, "a row dim missing from its operand");
  if (ext_of(L, x, p) != d->size) return nn_fail(L, op, "a row dim split over devices");
  return true;
}

bool lower_nn_rows(Lower *L, const Op *op, void (*new_buffer)(Lower *, const Value *)) {
  const Dim *d = op->dims[0];
  const Value *res = op->results[0], *x = op->operands[0];
  RtRows desc;
  /* max_grad counts the ties in the block a device holds (the interpreter's rule); the others
   * need the whole row */
  if (op->kind != OP_MAX_GRAD && !row_whole(L, op, x, d)) return false;
  switch (op->kind) { /* kept: each op its runtime kernel and operands */
  case OP_SOFTMAX: {
    const Value *t[2] = {x, res};
    if (!rows_desc(L, op, x, d, t, 2, &desc)) return false;
    new_buffer(L, res);
    LLVMValueRef av[3] = {rows_const(L, &desc), buf(L, x), buf(L, res)};
    lower_rt(L, RTFN_rt_nn_softmax, av, 3);
    return true;
  }
  case OP_RMSNORM: case OP_LAYERNORM: {
    bool ln = op->kind == OP_LAYERNORM;
    const Value *t[4] = {x, op->operands[1], ln ? op->operands[2] : NULL, res};
    if (!rows_desc(L, op, x, d, t, 4, &desc)) return false;
    new_buffer(L, res);
    LLVMValueRef av[6] = {rows_const(L, &desc), i32c(L, ln), buf(L, x), buf(L, t[1]), buf(L, t[2]), buf(L, res)};
    lower_rt(L, RTFN_rt_nn_norm, av, 6);
    return true;
  }
  case OP_SOFTMAX_GRAD: {
    const Value *t[3] = {x, op->operands[1], res};
    if (!rows_desc(L, op, x, d, t, 3, &desc)) return false;
    new_buffer(L, res);
    LLVMValueRef av[4] = {rows_const(L, &desc), buf(L, x), buf(L, t[1]), buf(L, res)};
    lower_rt(L, RTFN_rt_nn_softmax_grad, av, 4);
    return true;
  }
  case OP_RMSNORM_GRAD: case OP_LAYERNORM_GRAD: {
    const Value *t[4] = {x, op->operands[1], op->operands[2], res};
    if (!rows_desc(L, op, x, d, t, 4, &desc)) return false;
    new_buffer(L, res);
    LLVMValueRef av[6] = {rows_const(L, &desc), i32c(L, op->kind == OP_LAYERNORM_GRAD), buf(L, x), buf(L, t[1]), buf(L, t[2]), buf(L, res)};
    lower_rt(L, RTFN_rt_nn_norm_grad, av, 6);
    return true;
  }
  case OP_CROSS_ENTROPY: case OP_CROSS_ENTROPY_GRAD: {
    bool grad = op->kind == OP_CROSS_ENTROPY_GRAD;
    const Value *labels = op->operands[1];
    if (labels->type.dtype != DT_I32) return nn_fail(L, op, "labels that are not i32");
    const Value *t[4] = {x, labels, grad ? op->operands[2] : res, grad ? res : NULL};
    if (!rows_desc(L, op, x, d, t, 4, &desc)) return false;
    new_buffer(L, res);
    LLVMValueRef av[8] = {L->dev, rows_const(L, &desc), i32c(L, grad), buf(L, x), buf(L, labels),
                          grad ? buf(L, op->operands[2]) : LLVMConstNull(L->ptr), buf(L, res), i32c(L, op->loc.line)};
    lower_check_rc(L, lower_rt(L, RTFN_rt_nn_cross_entropy, av, 8));
    return true;
  }
  case OP_MAX_GRAD: {
    if (op->ndims != 1) return nn_fail(L, op, "a max over several dims");
    const Value *t[4] = {x, op->operands[1], op->operands[2], res};
    if (!rows_desc(L, op, x, d, t, 4, &desc)) return false;
    new_buffer(L, res);
    LLVMValueRef av[5] = {rows_const(L, &desc), buf(L, x), buf(L, t[1]), buf(L, t[2]), buf(L, res)};
    lower_rt(L, RTFN_rt_nn_max_grad, av, 5);
    return true;
  }
  default: return nn_fail(L, op, "this op");
  }
}

/* onehot (the result's row dims[0]) and pick (x's row dims[0]): the row may be split over devices,
 * row_offset its block's first global index. */
bool lower_nn_select(Lower *L, const Op *op, LLVMValueRef row_offset, LowerNewBuffer new_buffer) {
  const Value *res = op->results[0];
  const Dim *d = op->dims[0];
  RtRows desc;
  if (op->kind == OP_ONEHOT) {
    const Value *idx = op->operands[0];
    if (idx->type.dtype != DT_I32) return nn_fail(L, op, "indices that are not i32");
    const Value *t[2] = {res, idx};
    if (tensor_type_find(&res->type, d) < 0 || !rows_desc(L, op, res, d, t, 2, &desc)) return false;
    new_buffer(L, res);
    LLVMValueRef av[6] = {L->dev, rows_const(L, &desc), buf(L, idx), buf(L, res), row_offset, i32c(L, op->loc.line)};
    lower_check_rc(L, lower_rt(L, RTFN_rt_nn_onehot, av, 6));
    return true;
  }
  const Value *x = op->operands[0], *idx = op->operands[1];
  if (idx->type.dtype != DT_I32) return nn_fail(L, op, "indices that are not i32");
  const Value *t[3] = {x, idx, res};
  if (tensor_type_find(&x->type, d) < 0 || !rows_desc(L, op, x, d, t, 3, &desc)) return false;
  new_buffer(L, res);
  LLVMValueRef av[7] = {L->dev, rows_const(L, &desc), buf(L, x), buf(L, idx), buf(L, res), row_offset, i32c(L, op->loc.line)};
  lower_check_rc(L, lower_rt(L, RTFN_rt_nn_pick, av, 7));
  return true;
}

bool lower_nn_route(Lower *L, const Op *op, LowerNewBuffer new_buffer) {
  const Value *res = op->results[0], *l = op->operands[0];
  const Dim *E = op->dims[0], *T = op->dims[1], *C = op->dims[2];
  if (res->type.dtype != DT_F32) return nn_fail(L, op, "a route pattern that is not f32");
  if (!row_whole(L, op, l, E) || !row_whole(L, op, l, T)) return false;
  int pc = tensor_type_find(&res->type, C);
  if (pc < 0 || ext_of(L, res, pc) != C->size) return nn_fail(L, op, "a slot dim split over devices");
  /* the outer dims: the logits' but the expert and token dims */
  RtRows desc;
  memset(&desc, 0, sizeof desc);
  int nd = 0;
  for (int i = 0; i < l->type.rank; i++) {
    const Dim *d = l->type.dims[i];
    if (d == E || d == T) continue;
    if (nd == RT_NN_DIMS) return nn_fail(L, op, "a tensor of this rank");
    desc.extent[nd] = ext_of(L, l, i);
    desc.stride[0][nd] = stride_of(L, l, d);
    desc.stride[1][nd] = stride_of(L, res, d);
    nd++;
  }
  desc.nd = nd;
  desc.dtype[0] = lower_rt_dtype(l->type.dtype);
  desc.dtype[1] = 0;
  if (desc.dtype[0] < 0 || l->type.dtype == DT_I32) return nn_fail(L, op, "logits of this dtype");
  int64_t n = 1;
  for (int i = 0; i < res->type.rank; i++) n *= ext_of(L, res, i);
  new_buffer(L, res);
  /* slots fill in the tokens' logical order: under a causal ring the per-device program stores the
   * sequence in zigzag order (the device program's storage order of T), so the kernel gets each
   * logical token's storage position (issue 18: Mixtral's routing with seq sharded dropped other
   * tokens than on one device) */
  LLVMValueRef order = LLVMConstNull(L->ptr);
  RtOrder ord = L->mesh ? dev_dim_order(L->m->dev, T, -1) : (RtOrder){RT_ORDER_NATURAL, 0, 0, 0};
  bool permuted = false;
  for (int64_t p = 0; L->mesh && p < T->size && !permuted; p++) permuted = rt_order_logical(&ord, p) != p;
  if (permuted) { /* a constant array of T entries */
    LLVMValueRef *e = malloc(sizeof *e * (size_t)T->size);
    if (!e) return nn_fail(L, op, "out of memory");
    for (int64_t p = 0; p < T->size; p++) e[rt_order_logical(&ord, p)] = i64c(L, p);
    order = LLVMAddGlobal(L->M, LLVMArrayType2(L->i64, (uint64_t)T->size), "route_order");
    LLVMSetInitializer(order, LLVMConstArray2(L->i64, e, (uint64_t)T->size));
    LLVMSetGlobalConstant(order, 1);
    LLVMSetLinkage(order, LLVMPrivateLinkage);
    free(e);
  }
  LLVMValueRef av[15] = {L->dev, rows_const(L, &desc), i32c(L, op->index), i64c(L, E->size), i64c(L, T->size),
                         i64c(L, C->size), i64c(L, stride_of(L, l, E)), i64c(L, stride_of(L, l, T)), i64c(L, stride_of(L, res, E)),
                         i64c(L, stride_of(L, res, T)), i64c(L, stride_of(L, res, C)), buf(L, l), buf(L, res), i64c(L, n), order};
  lower_check_rc(L, lower_rt(L, RTFN_rt_nn_route, av, 15));
  return true;
}

/* Whether v's trailing dims are exactly dims[0..n), in order. */
static bool trailing(const Value *v, Dim *const *dims, int n) {
  if (v->type.rank < n) return false;
  for (int i = 0; i < n; i++)
    if (v->type.dims[v->type.rank - n + i] != dims[i]) return false;
  return true;
}

bool lower_nn_take(Lower *L, const Op *op, LLVMValueRef row_offset, void (*new_buffer)(Lower *, const Value *)) {
  const Value *res = op->results[0];
  bool grad = op->kind == OP_TAKE_GRAD;
  const Value *table = grad ? res : op->operands[0], *idx = grad ? op->operands[0] : op->operands[1];
  const Value *rows_of = grad ? op->operands[1] : res; /* dy or out: idx's dims, then the table's rest */
  if (idx->type.dtype != DT_I32) return nn_fail(L, op, "indices that are not i32");
  Dim *const *rest = table->type.dims + 1;
  int nrest = table->type.rank - 1;
  if (!trailing(rows_of, rest, nrest)) return nn_fail(L, op, "a result whose table dims are not its last dims");
  int64_t row_elems = 1;
  for (int i = 1; i < table->type.rank; i++) row_elems *= ext_of(L, table, i);
  RtRows desc;
  const Value *t[3] = {idx, rows_of, table};
  if (!rows_desc(L, op, idx, NULL, t, 3, &desc)) return false;
  new_buffer(L, res);
  LLVMValueRef av[10] = {L->dev, rows_const(L, &desc), buf(L, idx), grad ? buf(L, op->operands[1]) : buf(L, table), buf(L, res),
                         i64c(L, ext_of(L, table, 0)), row_offset, i64c(L, table->type.dims[0]->size), i64c(L, row_elems),
                         i32c(L, op->loc.line)};
  lower_check_rc(L, lower_rt(L, grad ? RTFN_rt_nn_take_grad : RTFN_rt_nn_take, av, 10));
  return true;
}

/* RtAttn: batch dims (o's but the query and value dims), then per tensor q, k, v, o, do its strides. */
bool lower_nn_attention(Lower *L, const Op *op, LLVMValueRef q_off, LLVMValueRef k_off, void (*new_buffer)(Lower *, const Value *)) {
  bool grad = op->kind == OP_ATTENTION_GRAD;
  const Value *q = op->operands[0], *k = op->operands[1], *v = op->operands[2];
  const Value *o = grad ? op->operands[3] : op->results[0], *dout = grad ? op->operands[4] : NULL;
  const Dim *H = op->dims[0], *K = op->dims[1], *Q = op->dims[2];
  if (op->flag && !dev_op_ring(op) && L->mesh && (dev_dim_order(L->m->dev, Q, -1).kind != RT_ORDER_NATURAL ||
                                            dev_dim_order(L->m->dev, K, -1).kind != RT_ORDER_NATURAL))
    return nn_fail(L, op, "a causal mask over a zigzag-ordered sequence");
  int pk = tensor_type_find(&k->type, K);
  if (pk < 0) return nn_fail(L, op, "a key dim missing from k");
  if (!dev_op_ring(op) && ext_of(L, k, pk) != K->size) return nn_fail(L, op, "a key dim split over devices"); /* a ring's is */
  const Dim *Dv = NULL;
  int ndv = 0;
  for (int i = 0; i < v->type.rank; i++) {
    const Dim *d = v->type.dims[i];
    if (d != K && (d == H || tensor_type_find(&q->type, d) < 0)) Dv = d, ndv++;
  }
  if (ndv != 1) return nn_fail(L, op, "a value tensor without exactly one value dim");
  RtAttn a;
  memset(&a, 0, sizeof a);
  const Value *t[5] = {q, k, v, o, dout};
  int nb = 0;
  for (int i = 0; i < o->type.rank; i++) {
    const Dim *d = o->type.dims[i];
    if (d == Q || d == Dv) continue;
    if (nb == RT_NN_DIMS) return nn_fail(L, op, "a tensor of this rank");
    a.extent[nb] = ext_of(L, o, i);
    for (int j = 0; j < 5; j++) a.stride[j][nb] = t[j] ? stride_of(L, t[j], d) : 0;
    nb++;
  }
  a.nb = nb;
  a.nq = ext_of(L, o, tensor_type_find(&o->type, Q));
  a.nk = ext_of(L, k, pk);
  a.nh = ext_of(L, q, tensor_type_find(&q->type, H));
  a.nv = ext_of(L, v, tensor_type_find(&v->type, Dv));
  for (int j = 0; j < 5; j++) {
    if (!t[j]) continue;
    bool qo = j == 0 || j == 3 || j == 4, kv = j == 1 || j == 2;
    a.sq[j] = qo ? stride_of(L, t[j], Q) : 0;
    a.sk[j] = kv ? stride_of(L, t[j], K) : 0;
    a.sh[j] = j <= 1 ? stride_of(L, t[j], H) : 0;
    a.sv[j] = j >= 2 ? stride_of(L, t[j], Dv) : 0;
    if (lower_rt_dtype(t[j]->type.dtype) < 0 || t[j]->type.dtype == DT_I32) return nn_fail(L, op, "this dtype");
    a.dtype[j] = lower_rt_dtype(t[j]->type.dtype);
  }
  a.causal = op->flag ? 1 : 0;
  /* every dim of each tensor has a role */
  for (int j = 0; j < 5; j++)
    for (int i = 0; t[j] && i < t[j]->type.rank; i++) {
      const Dim *d = t[j]->type.dims[i];
      bool ok = tensor_type_find(&o->type, d) >= 0 || d == K || d == H;
      if (!ok) return nn_fail(L, op, "an operand dim outside the attention's index space");
    }
  if (grad && (op->index < 0 || op->index > 2)) return nn_fail(L, op, "a gradient index other than 0, 1, 2");
  if (dev_op_ring(op)) {
    new_buffer(L, op->results[0]);
    return lower_ring_attention(L, op, lower_rt_const(L, RTS_RtAttn, &a, "attn"), q_off); /* lower_ring.c */
  }
  /* dq, dk and dv are three ops of the same operands (autodiff.c), one backward kernel: the first
   * of them in program order computes all three, the others find their results made */
  const Op *sib[3] = {NULL, NULL, NULL};
  if (grad) {
    if (L->buf[op->results[0]->id]) return true; /* made by an earlier sibling */
    for (const Op *o = op->func ? op->func->first : op; o; o = o->next) {
      bool same = o->kind == OP_ATTENTION_GRAD && o->noperands == 5 && o->index >= 0 && o->index <= 2 &&
                  o->scalar == op->scalar && o->flag == op->flag && o->ndims == op->ndims && !dev_op_ring(o);
      for (int i = 0; same && i < 5; i++) same = o->operands[i] == op->operands[i];
      for (int i = 0; same && i < op->ndims; i++) same = o->dims[i] == op->dims[i];
      if (same && !sib[o->index] && (o == op || !L->buf[o->results[0]->id])) sib[o->index] = o;
      if (!op->func) break;
    }
    sib[op->index] = op;
    for (int i = 0; i < 3; i++)
      if (sib[i]) new_buffer(L, sib[i]->results[0]);
  } else new_buffer(L, op->results[0]);
  LLVMValueRef desc = lower_rt_const(L, RTS_RtAttn, &a, "attn");
  if (!grad) {
    LLVMValueRef av[9] = {L->dev, desc, LLVMConstReal(L->f64, op->scalar), q_off, k_off, buf(L, q), buf(L, k), buf(L, v), buf(L, o)};
    lower_check_rc(L, lower_rt(L, RTFN_rt_nn_attention, av, 9));
  } else {
    LLVMValueRef av[13] = {L->dev, desc, LLVMConstReal(L->f64, op->scalar), q_off, k_off, buf(L, q), buf(L, k), buf(L, v), buf(L, o),
                           buf(L, dout), LLVMConstNull(L->ptr), LLVMConstNull(L->ptr), LLVMConstNull(L->ptr)};
    for (int i = 0; i < 3; i++) /* index 0 dq, 1 dk, 2 dv */
      if (sib[i]) av[10 + i] = buf(L, sib[i]->results[0]);
    lower_check_rc(L, lower_rt(L, RTFN_rt_nn_attention_grad, av, 13));
  }
  return true;
}
