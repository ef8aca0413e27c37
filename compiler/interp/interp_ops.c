/* interp_ops.c: the interpreter's kernels: one IR op on blocks of its operands.
 *
 * In: an op and one block of each operand (a whole tensor in a global run, a device's block in an
 * SPMD run: interp_spmd.c has already sliced the operands to what the op computes with). Out: a
 * new tensor of the op's result type whose block along each dim follows from the operands' (a
 * dim keeps the block it has in the operands; split and merge decompose and compose blocks).
 * Because a kernel only ever sees local blocks with their global offsets, the same code is right
 * for both runs: a sum over a dim a device holds in part is that device's partial sum, a mean
 * divides by the dim's global size (so partial means add up), causal compares global indices, and
 * take gathers only the rows the device holds (zeros elsewhere: a masked local gather).
 *
 * Everything computes in double; interp.c rounds the result to the options' precision. The
 * elementwise functions, the activations' gradients and the optimizer's updates are ops.def's
 * scalar functions (ir_scalar: the formulas the lowering builds in f32, operation for operation,
 * e.g. gelu(x) = x/2 (1 + erf(x / sqrt 2)), exact, not the tanh approximation). The other
 * numeric definitions (docs/interpreter.md):
 *   softmax    = exp(x - max) / sum exp(x - max) over the dim; a row that is all -inf gives 0s
 *   rmsnorm    = x / sqrt(mean(x^2) + 1e-5) * scale
 *   layernorm  = (x - mean) / sqrt(mean((x - mean)^2) + 1e-5) * scale + bias
 *   causal     = -inf where the key's global index exceeds the query's
 *   attention  = contract(softmax(causal?(scale * contract(q, k, over: head)), over: key), v,
 *                over: key), intermediates in double, the output rounded once
 * The training ops (gradients, losses, optimizers) follow the formulas of their ir.h comments;
 * attention_grad recomputes the probabilities as the forward does.
 * Integer results truncate toward zero (division), casts from float truncate and saturate. Ops
 * that need a dim whole (softmax, the norms, attention's head and key dims, cross-entropy's
 * classes) report an error when a block holds only part of it: partitioning must have gathered
 * it or rewritten the op. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "interp_int.h"
#include "dropout.h"
#include "route.h"

/* ---- blocks and strides ---- */

static int64_t stride_at(const Tensor *t, int pos) {
  int64_t s = 1;
  for (int i = pos + 1; i < t->type.rank; i++) s *= t->shape[i];
  return s;
}

/* The stride of dim d in t, 0 when t lacks it (broadcast). */
static int64_t stride_of(const Tensor *t, const Dim *d) {
  int p = tensor_type_find(&t->type, d);
  return p < 0 ? 0 : stride_at(t, p);
}

/* The block of dim d among the operands x[0..n) that have it: 1 found (every operand with d holds
 * the same block), 0 error (they differ), -1 none has it. */
static int dim_block(Interp *I, const Op *op, const Dim *d, Tensor *const *x, int n, int64_t *start, int64_t *ext) {
  int found = -1;
  for (int i = 0; i < n; i++) {
    if (!x[i]) continue;
    int p = tensor_type_find(&x[i]->type, d);
    if (p < 0) continue;
    if (found < 0) {
      *start = x[i]->start[p], *ext = x[i]->shape[p];
      found = 1;
    } else if (x[i]->start[p] != *start || x[i]->shape[p] != *ext) {
      interp_fail(I, op, "operands hold different blocks of %s: [%lld, %lld) and [%lld, %lld)", d->name,
                  (long long)*start, (long long)(*start + *ext), (long long)x[i]->start[p],
                  (long long)(x[i]->start[p] + x[i]->shape[p]));
      return 0;
    }
  }
  return found;
}

/* A result of type rt whose every dim takes its block from the operands that have it. */
static Tensor *result_by_name(Interp *I, const Op *op, const TensorType *rt, Tensor *const *x, int n) {
  int64_t st[MAX_RANK], sh[MAX_RANK];
  for (int i = 0; i < rt->rank; i++) {
    int r = dim_block(I, op, rt->dims[i], x, n, &st[i], &sh[i]);
    if (r == 0) return NULL;
    if (r < 0) {
      interp_fail(I, op, "result dim %s is in no operand", rt->dims[i]->name);
      return NULL;
    }
  }
  Tensor *t = tensor_new_block(rt, st, sh);
  if (!t) interp_fail(I, op, "out of memory");
  return t;
}

/* Requires t to hold dim d whole. */
static bool need_whole(Interp *I, const Op *op, const Tensor *t, const Dim *d, const char *why) {
  int p = tensor_type_find(&t->type, d);
  if (p < 0) return interp_fail(I, op, "operand has no dim %s", d->name);
  if (t->start[p] == 0 && t->shape[p] == d->size) return true;
  return interp_fail(I, op, "%s needs dim %s whole, but this block holds [%lld, %lld) of %lld", why, d->name,
                     (long long)t->start[p], (long long)(t->start[p] + t->shape[p]), (long long)d->size);
}

/* The block an op makes of result dim i, a dim no operand holds: the wanted one in an SPMD run,
 * else whole. */
static void made_block(const Interp *I, const TensorType *rt, int i, int64_t *start, int64_t *shape) {
  if (I->want_set) *start = I->want_start[i], *shape = I->want_shape[i];
  else *start = 0, *shape = rt->dims[i]->size;
}

/* ---- nests: odometers over named dims that keep one offset per tensor ---- */

#define NEST_DIMS (2 * MAX_RANK)
#define NEST_TENSORS 6

typedef struct Nest {
  int n, nt;
  int64_t ext[NEST_DIMS];
  int64_t stride[NEST_TENSORS][NEST_DIMS];
  int64_t idx[NEST_DIMS];
  int64_t off[NEST_TENSORS];
  bool done;
} Nest;

static void nest_init(Nest *N, int nt) {
  memset(N, 0, sizeof *N);
  N->nt = nt;
}

/* A loop over dim d with `ext` steps; each tensor of ts (NULL: none) advances by its stride. */
static void nest_dim(Nest *N, const Dim *d, int64_t ext, Tensor *const *ts) {
  int k = N->n++;
  N->ext[k] = ext;
  for (int t = 0; t < N->nt; t++) N->stride[t][k] = ts[t] ? stride_of(ts[t], d) : 0;
}

static void nest_begin(Nest *N, const int64_t *base) {
  memset(N->idx, 0, sizeof N->idx);
  for (int t = 0; t < N->nt; t++) N->off[t] = base ? base[t] : 0;
  N->done = false;
  for (int k = 0; k < N->n; k++)
    if (N->ext[k] <= 0) N->done = true;
}

static void nest_next(Nest *N) {
  for (int k = N->n - 1; k >= 0; k--) {
    if (++N->idx[k] < N->ext[k]) {
      for (int t = 0; t < N->nt; t++) N->off[t] += N->stride[t][k];
      return;
    }
    for (int t = 0; t < N->nt; t++) N->off[t] -= N->stride[t][k] * (N->ext[k] - 1);
    N->idx[k] = 0;
  }
  N->done = true;
}

/* ---- slicing ---- */

Tensor *iop_slice(const Tensor *t, const int64_t *start, const int64_t *shape) {
  for (int i = 0; i < t->type.rank; i++)
    if (start[i] < t->start[i] || start[i] + shape[i] > t->start[i] + t->shape[i]) return NULL;
  Tensor *r = tensor_new_block(&t->type, start, shape);
  if (!r) return NULL;
  Nest N;
  nest_init(&N, 2);
  Tensor *ts[2] = {r, (Tensor *)t};
  int64_t base[2] = {0, 0};
  for (int i = 0; i < t->type.rank; i++) {
    nest_dim(&N, t->type.dims[i], shape[i], ts);
    base[1] += (start[i] - t->start[i]) * stride_at(t, i);
  }
  for (nest_begin(&N, base); !N.done; nest_next(&N)) r->data[N.off[0]] = t->data[N.off[1]];
  return r;
}

Tensor *iop_unstack(const Tensor *t, int64_t i) {
  if (t->type.rank < 1) return NULL;
  int64_t li = i - t->start[0];
  if (li < 0 || li >= t->shape[0]) return NULL;
  TensorType rt = {.dtype = t->type.dtype, .rank = t->type.rank - 1};
  for (int k = 1; k < t->type.rank; k++) rt.dims[k - 1] = t->type.dims[k];
  Tensor *r = tensor_new_block(&rt, t->start + 1, t->shape + 1);
  if (!r) return NULL;
  if (r->n) memcpy(r->data, t->data + li * r->n, sizeof(double) * (size_t)r->n);
  return r;
}

/* ---- elementwise ---- */

static Tensor *k_unary(Interp *I, const Op *op, const Tensor *x) {
  Tensor *r = tensor_new_block(&op->results[0]->type, x->start, x->shape);
  if (!r) return interp_fail(I, op, "out of memory"), NULL;
  for (int64_t i = 0; i < x->n; i++) r->data[i] = ir_scalar(op->kind, op, &x->data[i]);
  return r;
}

/* a op b broadcast by dim name: the result's dims are a's then b's new ones. */
static Tensor *k_binary(Interp *I, const Op *op, Tensor *a, Tensor *b) {
  const TensorType *rt = &op->results[0]->type;
  Tensor *x[2] = {a, b};
  Tensor *r = result_by_name(I, op, rt, x, 2);
  if (!r) return NULL;
  bool int_div = op->kind == OP_DIV && dtype_is_int(rt->dtype);
  Nest N;
  nest_init(&N, 3);
  Tensor *ts[3] = {r, a, b};
  for (int i = 0; i < rt->rank; i++) nest_dim(&N, rt->dims[i], r->shape[i], ts);
  for (nest_begin(&N, NULL); !N.done; nest_next(&N)) {
    double uv[2] = {a->data[N.off[1]], b->data[N.off[2]]};
    if (int_div && uv[1] == 0) {
      tensor_free(r);
      return interp_fail(I, op, "integer division by zero"), NULL;
    }
    double z = ir_scalar(op->kind, op, uv);
    r->data[N.off[0]] = int_div ? trunc(z) : z;
  }
  return r;
}

/* Casts round through the target dtype; from float to integer: toward zero, saturating at the
 * integer type's range, NaN to 0. */
static Tensor *k_cast(Interp *I, const Op *op, const Tensor *x) {
  const TensorType *rt = &op->results[0]->type;
  Tensor *r = tensor_new_block(rt, x->start, x->shape);
  if (!r) return interp_fail(I, op, "out of memory"), NULL;
  double lo = rt->dtype == DT_I8 ? -128.0 : -2147483648.0, hi = rt->dtype == DT_I8 ? 127.0 : 2147483647.0;
  for (int64_t i = 0; i < x->n; i++) {
    double v = x->data[i];
    if (dtype_is_int(rt->dtype)) v = isnan(v) ? 0 : v < lo ? lo : v > hi ? hi : trunc(v);
    r->data[i] = v;
  }
  return r;
}

/* ---- contractions and reductions ---- */

/* Sum over `over` of a * b into a tensor of type rt (a's kept dims, then b's): each contracted
 * dim must be held alike by both (the sum is over the block they hold). */
static Tensor *contract_into(Interp *I, const Op *op, Tensor *a, Tensor *b, Dim *const *over, int nover,
                             const TensorType *rt) {
  Tensor *x[2] = {a, b};
  for (int j = 0; j < 2; j++)
    for (int i = 0; i < x[j]->type.rank; i++) {
      const Dim *d = x[j]->type.dims[i];
      bool summed = false;
      for (int k = 0; k < nover; k++) summed |= over[k] == d;
      if (!summed && tensor_type_find(rt, d) < 0)
        return interp_fail(I, op, "dim %s is neither contracted nor in the result", d->name), NULL;
    }
  Tensor *r = result_by_name(I, op, rt, x, 2);
  if (!r) return NULL;
  Tensor *ts[3] = {r, a, b};
  Nest outer, inner;
  nest_init(&outer, 3);
  nest_init(&inner, 3);
  for (int i = 0; i < rt->rank; i++) nest_dim(&outer, rt->dims[i], r->shape[i], ts);
  for (int k = 0; k < nover; k++) {
    int64_t s, e;
    if (tensor_type_find(&a->type, over[k]) < 0 || tensor_type_find(&b->type, over[k]) < 0) {
      tensor_free(r);
      return interp_fail(I, op, "contracted dim %s is missing from an operand", over[k]->name), NULL;
    }
    if (dim_block(I, op, over[k], x, 2, &s, &e) <= 0) {
      tensor_free(r);
      return NULL;
    }
    nest_dim(&inner, over[k], e, ts);
  }
  for (nest_begin(&outer, NULL); !outer.done; nest_next(&outer)) {
    double s = 0;
    for (nest_begin(&inner, outer.off); !inner.done; nest_next(&inner)) s += a->data[inner.off[1]] * b->data[inner.off[2]];
    r->data[outer.off[0]] = s;
  }
  return r;
}

/* sum / mean / max over op->dims; mean divides by the dims' global sizes. */
static Tensor *k_reduce(Interp *I, const Op *op, Tensor *x) {
  const TensorType *rt = &op->results[0]->type;
  Tensor *r = result_by_name(I, op, rt, &x, 1);
  if (!r) return NULL;
  Tensor *ts[2] = {r, x};
  Nest outer, inner;
  nest_init(&outer, 2);
  nest_init(&inner, 2);
  for (int i = 0; i < rt->rank; i++) nest_dim(&outer, rt->dims[i], r->shape[i], ts);
  double count = 1;
  for (int k = 0; k < op->ndims; k++) {
    int p = tensor_type_find(&x->type, op->dims[k]);
    if (p < 0) {
      tensor_free(r);
      return interp_fail(I, op, "reduced dim %s is not in the operand", op->dims[k]->name), NULL;
    }
    nest_dim(&inner, op->dims[k], x->shape[p], ts);
    count *= (double)op->dims[k]->size;
  }
  for (nest_begin(&outer, NULL); !outer.done; nest_next(&outer)) {
    double s = op->kind == OP_MAX ? -INFINITY : 0;
    for (nest_begin(&inner, outer.off); !inner.done; nest_next(&inner)) {
      double v = x->data[inner.off[1]];
      if (op->kind != OP_MAX) s += v;
      else if (v > s || isnan(v)) s = isnan(s) ? s : v;
    }
    r->data[outer.off[0]] = op->kind == OP_MEAN ? s / (op->divisor > 0 ? op->divisor : count) : s;
  }
  return r;
}

/* An outer nest over x's dims but d, with tensors ts (x first); *sd[i] = ts[i]'s stride of d. */
static void rows_over(Nest *N, Tensor *const *ts, int nt, const Dim *d, int64_t *sd) {
  const Tensor *x = ts[0];
  nest_init(N, nt);
  for (int i = 0; i < x->type.rank; i++)
    if (x->type.dims[i] != d) nest_dim(N, x->type.dims[i], x->shape[i], ts);
  for (int t = 0; t < nt; t++) sd[t] = ts[t] ? stride_of(ts[t], d) : 0;
}

/* The max of a row of n values at stride sd (NaN if any is NaN) and, in *sum, the sum of
 * exp(x - max): where softmax and cross entropy's logsumexp both start. */
static double row_max_sumexp(const double *row, int64_t n, int64_t sd, double *sum) {
  double m = -INFINITY, s = 0;
  for (int64_t j = 0; j < n; j++)
    if (row[j * sd] > m || isnan(row[j * sd])) m = isnan(m) ? m : row[j * sd];
  for (int64_t j = 0; j < n; j++) s += exp(row[j * sd] - m);
  *sum = s;
  return m;
}

static Tensor *softmax_of(Interp *I, const Op *op, Tensor *x, const Dim *d) {
  if (!need_whole(I, op, x, d, "softmax")) return NULL;
  Tensor *r = tensor_new_block(&x->type, x->start, x->shape);
  if (!r) return interp_fail(I, op, "out of memory"), NULL;
  r->type.dtype = op->results[0]->type.dtype;
  int64_t n = x->shape[tensor_type_find(&x->type, d)], sd[2];
  Tensor *ts[2] = {x, r};
  Nest N;
  rows_over(&N, ts, 2, d, sd);
  for (nest_begin(&N, NULL); !N.done; nest_next(&N)) {
    const double *xr = x->data + N.off[0];
    double *rr = r->data + N.off[1];
    double s, m = row_max_sumexp(xr, n, sd[0], &s);
    if (m == -INFINITY) { /* every position masked: nothing to attend to */
      for (int64_t j = 0; j < n; j++) rr[j * sd[1]] = 0;
      continue;
    }
    for (int64_t j = 0; j < n; j++) rr[j * sd[1]] = exp(xr[j * sd[0]] - m) / s;
  }
  return r;
}

/* rmsnorm(x, scale) / layernorm(x, scale, bias) over d; scale and bias broadcast by name. */
static Tensor *k_norm(Interp *I, const Op *op, Tensor *const *x) {
  const Dim *d = op->dims[0];
  Tensor *in = x[0], *scale = x[1], *bias = op->kind == OP_LAYERNORM ? x[2] : NULL;
  if (!need_whole(I, op, in, d, ir_op_name(op->kind))) return NULL;
  for (int i = 0; i < in->type.rank; i++) {
    int64_t s, e;
    if (dim_block(I, op, in->type.dims[i], x, op->kind == OP_LAYERNORM ? 3 : 2, &s, &e) <= 0) return NULL;
  }
  Tensor *r = tensor_new_block(&op->results[0]->type, in->start, in->shape);
  if (!r) return interp_fail(I, op, "out of memory"), NULL;
  int64_t n = in->shape[tensor_type_find(&in->type, d)], sd[4];
  Tensor *ts[4] = {in, r, scale, bias};
  Nest N;
  rows_over(&N, ts, 4, d, sd);
  double size = (double)d->size;
  for (nest_begin(&N, NULL); !N.done; nest_next(&N)) {
    const double *xr = in->data + N.off[0];
    double mu = 0, var = 0;
    if (op->kind == OP_LAYERNORM) {
      for (int64_t j = 0; j < n; j++) mu += xr[j * sd[0]];
      mu /= size;
    }
    for (int64_t j = 0; j < n; j++) {
      double c = xr[j * sd[0]] - mu;
      var += c * c;
    }
    double inv = 1 / sqrt(var / size + NORM_EPS);
    for (int64_t j = 0; j < n; j++) {
      double y = (xr[j * sd[0]] - mu) * inv * scale->data[N.off[2] + j * sd[2]];
      if (bias) y += bias->data[N.off[3] + j * sd[3]];
      r->data[N.off[1] + j * sd[1]] = y;
    }
  }
  return r;
}

/* ---- data movement ---- */

static Tensor *k_rename(Interp *I, const Op *op, const Tensor *x) {
  Tensor *r = tensor_copy(x);
  if (!r) return interp_fail(I, op, "out of memory"), NULL;
  r->type = op->results[0]->type;
  return r;
}

static Tensor *k_transpose(Interp *I, const Op *op, Tensor *x) {
  const TensorType *rt = &op->results[0]->type;
  Tensor *r = result_by_name(I, op, rt, &x, 1);
  if (!r) return NULL;
  Tensor *ts[2] = {r, x};
  Nest N;
  nest_init(&N, 2);
  for (int i = 0; i < rt->rank; i++) nest_dim(&N, rt->dims[i], r->shape[i], ts);
  for (nest_begin(&N, NULL); !N.done; nest_next(&N)) r->data[N.off[0]] = x->data[N.off[1]];
  return r;
}

/* The block [s, s + len) of a dim of size prod(sizes) seen as parts sizes[0..n) (major to minor):
 * each part's block, when the elements form a rectangle in the parts (else false). */
static bool split_block(int64_t s, int64_t len, const int64_t *sizes, int n, int64_t *ps, int64_t *pe) {
  for (int i = 0; i < n; i++) {
    int64_t inner = 1;
    for (int j = i + 1; j < n; j++) inner *= sizes[j];
    if (len >= inner) {
      if (s % inner || len % inner) return false;
      ps[i] = s / inner, pe[i] = len / inner;
      s = 0, len = inner;
    } else {
      if (s / inner != (s + len - 1) / inner) return false;
      ps[i] = s / inner, pe[i] = 1;
      s %= inner;
    }
  }
  return true;
}

/* split(x, d -> parts) and merge(x, parts -> d): elements move by global index. For a split the
 * result's part dims hold the rectangle the operand's block of d covers; for a merge the merged
 * dim holds the parts' blocks composed (contiguous, or an error). */
static Tensor *k_reshape(Interp *I, const Op *op, Tensor *x) {
  const TensorType *rt = &op->results[0]->type;
  bool split = op->kind == OP_SPLIT;
  int nparts = op->ndims - 1;
  Dim *const *parts = split ? op->dims + 1 : op->dims;
  const Dim *whole = split ? op->dims[0] : op->dims[nparts];
  int64_t sizes[MAX_RANK], ps[MAX_RANK], pe[MAX_RANK], ws, we;
  for (int i = 0; i < nparts; i++) sizes[i] = parts[i]->size;
  int64_t st[MAX_RANK], sh[MAX_RANK];
  if (split) {
    int p = tensor_type_find(&x->type, whole);
    if (p < 0) return interp_fail(I, op, "operand has no dim %s", whole->name), NULL;
    ws = x->start[p], we = x->shape[p];
    if (!split_block(ws, we, sizes, nparts, ps, pe))
      return interp_fail(I, op, "the block [%lld, %lld) of %s is not a rectangle of its parts", (long long)ws,
                         (long long)(ws + we), whole->name), NULL;
  } else {
    for (int i = 0; i < nparts; i++) {
      int p = tensor_type_find(&x->type, parts[i]);
      if (p < 0) return interp_fail(I, op, "operand has no dim %s", parts[i]->name), NULL;
      ps[i] = x->start[p], pe[i] = x->shape[p];
    }
    /* contiguous: some parts held one index each, then at most one held in part, then whole ones */
    int k = 0;
    while (k < nparts && pe[k] == 1 && sizes[k] != 1) k++;
    bool ok = true;
    for (int i = k + 1; i < nparts; i++) ok &= ps[i] == 0 && pe[i] == sizes[i];
    if (!ok) return interp_fail(I, op, "the parts' blocks do not merge into one contiguous block of %s", whole->name), NULL;
    ws = 0, we = 1;
    for (int i = 0; i < nparts; i++) ws = ws * sizes[i] + ps[i], we *= pe[i];
  }
  for (int i = 0; i < rt->rank; i++) {
    const Dim *d = rt->dims[i];
    int pi = -1;
    for (int j = 0; j < nparts; j++)
      if (parts[j] == d) pi = j;
    if (split && pi >= 0) {
      st[i] = ps[pi], sh[i] = pe[pi];
    } else if (!split && d == whole) {
      st[i] = ws, sh[i] = we;
    } else {
      int p = tensor_type_find(&x->type, d);
      if (p < 0) return interp_fail(I, op, "result dim %s is not in the operand", d->name), NULL;
      st[i] = x->start[p], sh[i] = x->shape[p];
    }
  }
  Tensor *r = tensor_new_block(rt, st, sh);
  if (!r) return interp_fail(I, op, "out of memory"), NULL;
  /* The nest walks the result; dims shared with x advance both. The reshaped dim's offset in x is
   * computed from the global index. */
  Tensor *ts[2] = {r, x};
  Nest N;
  nest_init(&N, 2);
  for (int i = 0; i < rt->rank; i++) nest_dim(&N, rt->dims[i], sh[i], ts);
  int rpos[MAX_RANK]; /* split: result position of each part; merge: [0] = the merged dim's */
  int64_t xstride[MAX_RANK], xstart[MAX_RANK];
  if (split) {
    for (int j = 0; j < nparts; j++) rpos[j] = tensor_type_find(rt, parts[j]);
    int p = tensor_type_find(&x->type, whole);
    xstride[0] = stride_at(x, p), xstart[0] = x->start[p];
  } else {
    rpos[0] = tensor_type_find(rt, whole);
    for (int j = 0; j < nparts; j++) {
      int p = tensor_type_find(&x->type, parts[j]);
      xstride[j] = stride_at(x, p), xstart[j] = x->start[p];
    }
  }
  for (nest_begin(&N, NULL); !N.done; nest_next(&N)) {
    int64_t off = N.off[1];
    if (split) {
      int64_t g = 0;
      for (int j = 0; j < nparts; j++) g = g * sizes[j] + st[rpos[j]] + N.idx[rpos[j]];
      off += (g - xstart[0]) * xstride[0];
    } else {
      int64_t g = ws + N.idx[rpos[0]];
      for (int j = nparts - 1; j >= 0; j--) {
        off += (g % sizes[j] - xstart[j]) * xstride[j];
        g /= sizes[j];
      }
    }
    r->data[N.off[0]] = x->data[off];
  }
  return r;
}

/* take(table, idx): idx's dims, then table's dims after its rows. A row outside the block of
 * rows this table holds gives zeros (the masked local gather); outside the table, an error. */
static Tensor *k_take(Interp *I, const Op *op, Tensor *table, Tensor *idx) {
  const TensorType *rt = &op->results[0]->type;
  Tensor *x[2] = {idx, table};
  Tensor *r = result_by_name(I, op, rt, x, 2);
  if (!r) return NULL;
  const Dim *rows = table->type.dims[0];
  int64_t row_stride = stride_at(table, 0);
  Tensor *ts[3] = {r, idx, table};
  Nest outer, inner;
  nest_init(&outer, 3);
  nest_init(&inner, 3);
  for (int i = 0; i < idx->type.rank; i++) nest_dim(&outer, idx->type.dims[i], idx->shape[i], ts);
  for (int i = 1; i < table->type.rank; i++) nest_dim(&inner, table->type.dims[i], table->shape[i], ts);
  for (nest_begin(&outer, NULL); !outer.done; nest_next(&outer)) {
    double v = idx->data[outer.off[1]];
    if (!(v >= 0 && v < (double)rows->size)) {
      tensor_free(r);
      return interp_fail(I, op, "take: index %.0f out of range [0, %lld) of %s", v, (long long)rows->size,
                         rows->name), NULL;
    }
    int64_t local = (int64_t)v - table->start[0];
    if (local < 0 || local >= table->shape[0]) continue; /* not held here: zeros */
    int64_t base[3] = {outer.off[0], 0, local * row_stride};
    for (nest_begin(&inner, base); !inner.done; nest_next(&inner)) r->data[inner.off[0]] = table->data[inner.off[2]];
  }
  return r;
}

/* `fill` where the logical index along k exceeds the one along q (a zigzag-stored sequence's
 * logical index: interp_logical_index). */
static void mask_causal(const Interp *I, Tensor *t, const Dim *q, const Dim *k, double fill) {
  int pq = tensor_type_find(&t->type, q), pk = tensor_type_find(&t->type, k);
  if (pq < 0 || pk < 0) return;
  Nest N;
  nest_init(&N, 1);
  for (int i = 0; i < t->type.rank; i++) nest_dim(&N, t->type.dims[i], t->shape[i], &t);
  for (nest_begin(&N, NULL); !N.done; nest_next(&N))
    if (interp_logical_index(I, k, t->start[pk] + N.idx[pk]) > interp_logical_index(I, q, t->start[pq] + N.idx[pq]))
      t->data[N.off[0]] = fill;
}

static Tensor *k_causal(Interp *I, const Op *op, const Tensor *x) {
  Tensor *r = tensor_copy(x);
  if (!r) return interp_fail(I, op, "out of memory"), NULL;
  mask_causal(I, r, op->dims[0], op->dims[1], -INFINITY);
  return r;
}

/* x * mask / (1 - p) (dropout.h): the mask of each element's global (logical) index over dims[]. */
static Tensor *k_dropout(Interp *I, const Op *op, const Tensor *x) {
  Tensor *r = tensor_copy(x);
  if (!r) return interp_fail(I, op, "out of memory"), NULL;
  int pos[MAX_RANK];
  for (int k = 0; k < op->ndims; k++)
    if ((pos[k] = tensor_type_find(&r->type, op->dims[k])) < 0) return interp_fail(I, op, "dropout: a dim is missing"), NULL;
  uint64_t key = dropout_key((uint64_t)op->index, 0), thr = dropout_threshold(op->scalar);
  float scale = dropout_scale(op->scalar);
  Nest N;
  nest_init(&N, 1);
  for (int i = 0; i < r->type.rank; i++) nest_dim(&N, r->type.dims[i], r->shape[i], &r);
  for (nest_begin(&N, NULL); !N.done; nest_next(&N)) {
    uint64_t g = 0;
    for (int k = 0; k < op->ndims; k++)
      g = g * (uint64_t)op->dims[k]->size + (uint64_t)interp_logical_index(I, op->dims[k], r->start[pos[k]] + N.idx[pos[k]]);
    double v = r->data[N.off[0]];
    r->data[N.off[0]] = dropout_keep(key, g, thr) ? v * (double)scale : 0.0; /* exact: rounded to f32 as the lowering */
  }
  return r;
}

/* ---- training ops (ir.h's semantics comments; docs/training.md) ---- */

/* ops.def's scalar function of op over operands x[0..n) broadcast by dim name (each dim's block from
 * the operands having it): the activations' gradients, the optimizer's updates. */
static Tensor *k_map(Interp *I, const Op *op, Tensor *const *x, int n) {
  const TensorType *rt = &op->results[0]->type;
  Tensor *r = result_by_name(I, op, rt, x, n);
  if (!r) return NULL;
  Tensor *ts[NEST_TENSORS] = {r};
  for (int i = 0; i < n; i++) ts[i + 1] = x[i];
  Nest N;
  nest_init(&N, n + 1);
  for (int i = 0; i < rt->rank; i++) nest_dim(&N, rt->dims[i], r->shape[i], ts);
  double v[NEST_TENSORS];
  for (nest_begin(&N, NULL); !N.done; nest_next(&N)) {
    for (int i = 0; i < n; i++) v[i] = x[i]->data[N.off[i + 1]];
    r->data[N.off[0]] = ir_scalar(op->kind, op, v);
  }
  return r;
}

/* x repeated along the result's added dims (held whole here; an SPMD run slices the result). */
static Tensor *k_broadcast(Interp *I, const Op *op, Tensor *x) {
  const TensorType *rt = &op->results[0]->type;
  int64_t st[MAX_RANK], sh[MAX_RANK];
  for (int i = 0; i < rt->rank; i++) {
    int p = tensor_type_find(&x->type, rt->dims[i]);
    if (p < 0) made_block(I, rt, i, &st[i], &sh[i]);
    else st[i] = x->start[p], sh[i] = x->shape[p];
  }
  Tensor *r = tensor_new_block(rt, st, sh);
  if (!r) return interp_fail(I, op, "out of memory"), NULL;
  Tensor *ts[2] = {r, x};
  Nest N;
  nest_init(&N, 2);
  for (int i = 0; i < rt->rank; i++) nest_dim(&N, rt->dims[i], sh[i], ts);
  for (nest_begin(&N, NULL); !N.done; nest_next(&N)) r->data[N.off[0]] = x->data[N.off[1]];
  return r;
}

/* (x, y, dy) of y = max(x, over: dims): dy / n where x equals its reduction's max, else 0; n
 * counts the ties in the block this device holds (exact whenever the maximum is unique). */
static Tensor *k_max_grad(Interp *I, const Op *op, Tensor *const *x) {
  Tensor *in = x[0], *y = x[1], *dy = x[2];
  for (int i = 0; i < y->type.rank; i++) {
    int64_t s, e;
    if (dim_block(I, op, y->type.dims[i], x, 3, &s, &e) <= 0) return NULL;
  }
  Tensor *r = tensor_new_block(&op->results[0]->type, in->start, in->shape);
  if (!r) return interp_fail(I, op, "out of memory"), NULL;
  Tensor *ts[4] = {r, in, y, dy};
  Nest outer, inner;
  nest_init(&outer, 4);
  nest_init(&inner, 4);
  for (int i = 0; i < y->type.rank; i++) nest_dim(&outer, y->type.dims[i], y->shape[i], ts);
  for (int k = 0; k < op->ndims; k++) {
    int p = tensor_type_find(&in->type, op->dims[k]);
    if (p < 0) {
      tensor_free(r);
      return interp_fail(I, op, "reduced dim %s is not in x", op->dims[k]->name), NULL;
    }
    nest_dim(&inner, op->dims[k], in->shape[p], ts);
  }
  for (nest_begin(&outer, NULL); !outer.done; nest_next(&outer)) {
    double m = y->data[outer.off[2]], g = dy->data[outer.off[3]], n = 0;
    for (nest_begin(&inner, outer.off); !inner.done; nest_next(&inner)) n += in->data[inner.off[1]] == m;
    for (nest_begin(&inner, outer.off); !inner.done; nest_next(&inner))
      r->data[inner.off[0]] = in->data[inner.off[1]] == m ? g / n : 0;
  }
  return r;
}

/* (y, dy) of y = softmax(x, over: d): y (dy - sum over d of dy y). */
static Tensor *k_softmax_grad(Interp *I, const Op *op, Tensor *const *x) {
  Tensor *y = x[0], *dy = x[1];
  const Dim *d = op->dims[0];
  if (!need_whole(I, op, y, d, "softmax_grad")) return NULL;
  for (int i = 0; i < y->type.rank; i++) {
    int64_t s, e;
    if (dim_block(I, op, y->type.dims[i], x, 2, &s, &e) <= 0) return NULL;
  }
  Tensor *r = tensor_new_block(&op->results[0]->type, y->start, y->shape);
  if (!r) return interp_fail(I, op, "out of memory"), NULL;
  int64_t n = y->shape[tensor_type_find(&y->type, d)], sd[3];
  Tensor *ts[3] = {y, dy, r};
  Nest N;
  rows_over(&N, ts, 3, d, sd);
  for (nest_begin(&N, NULL); !N.done; nest_next(&N)) {
    double s = 0;
    for (int64_t j = 0; j < n; j++) s += dy->data[N.off[1] + j * sd[1]] * y->data[N.off[0] + j * sd[0]];
    for (int64_t j = 0; j < n; j++)
      r->data[N.off[2] + j * sd[2]] = y->data[N.off[0] + j * sd[0]] * (dy->data[N.off[1] + j * sd[1]] - s);
  }
  return r;
}

/* (x, scale, dy) of rmsnorm / layernorm over d (ir.h's formulas; eps NORM_EPS). */
static Tensor *k_norm_grad(Interp *I, const Op *op, Tensor *const *x) {
  const Dim *d = op->dims[0];
  Tensor *in = x[0], *scale = x[1], *dy = x[2];
  if (!need_whole(I, op, in, d, ir_op_name(op->kind))) return NULL;
  for (int i = 0; i < in->type.rank; i++) {
    int64_t s, e;
    if (dim_block(I, op, in->type.dims[i], x, 3, &s, &e) <= 0) return NULL;
  }
  Tensor *r = tensor_new_block(&op->results[0]->type, in->start, in->shape);
  if (!r) return interp_fail(I, op, "out of memory"), NULL;
  int64_t n = in->shape[tensor_type_find(&in->type, d)], sd[4];
  Tensor *ts[4] = {in, r, scale, dy};
  Nest N;
  rows_over(&N, ts, 4, d, sd);
  double size = (double)d->size;
  bool ln = op->kind == OP_LAYERNORM_GRAD;
#define X_(j) in->data[N.off[0] + (j) * sd[0]]
#define E_(j) (dy->data[N.off[3] + (j) * sd[3]] * scale->data[N.off[2] + (j) * sd[2]])
  for (nest_begin(&N, NULL); !N.done; nest_next(&N)) {
    double mu = 0, var = 0, me = 0, mex = 0;
    if (ln) {
      for (int64_t j = 0; j < n; j++) mu += X_(j);
      mu /= size;
    }
    for (int64_t j = 0; j < n; j++) var += (X_(j) - mu) * (X_(j) - mu);
    double rs = 1 / sqrt(var / size + NORM_EPS);
    for (int64_t j = 0; j < n; j++) {
      me += E_(j);
      mex += E_(j) * (X_(j) - mu) * rs;
    }
    me /= size, mex /= size;
    for (int64_t j = 0; j < n; j++) {
      double xh = (X_(j) - mu) * rs;
      r->data[N.off[1] + j * sd[1]] = ln ? rs * (E_(j) - me - xh * mex) : rs * (E_(j) - xh * mex);
    }
  }
#undef X_
#undef E_
  return r;
}

/* (idx, dy) of take(table, idx): the table's type, each row the sum of the dy rows whose index
 * names it (rows held whole here; an SPMD run slices the result). */
static Tensor *k_take_grad(Interp *I, const Op *op, Tensor *idx, Tensor *dy) {
  const TensorType *rt = &op->results[0]->type;
  if (rt->rank < 1) return interp_fail(I, op, "the table type has no rows"), NULL;
  const Dim *rows = rt->dims[0];
  int64_t st[MAX_RANK], sh[MAX_RANK];
  made_block(I, rt, 0, &st[0], &sh[0]);
  for (int i = 1; i < rt->rank; i++) {
    int p = tensor_type_find(&dy->type, rt->dims[i]);
    if (p < 0) return interp_fail(I, op, "dy has no dim %s", rt->dims[i]->name), NULL;
    st[i] = dy->start[p], sh[i] = dy->shape[p];
  }
  for (int i = 0; i < idx->type.rank; i++) {
    int64_t s, e;
    Tensor *x[2] = {idx, dy};
    if (dim_block(I, op, idx->type.dims[i], x, 2, &s, &e) <= 0) return NULL;
  }
  Tensor *r = tensor_new_block(rt, st, sh);
  if (!r) return interp_fail(I, op, "out of memory"), NULL;
  int64_t row_stride = stride_at(r, 0);
  Tensor *ts[3] = {r, idx, dy};
  Nest outer, inner;
  nest_init(&outer, 3);
  nest_init(&inner, 3);
  for (int i = 0; i < idx->type.rank; i++) nest_dim(&outer, idx->type.dims[i], idx->shape[i], ts);
  for (int i = 1; i < rt->rank; i++) nest_dim(&inner, rt->dims[i], sh[i], ts);
  for (nest_begin(&outer, NULL); !outer.done; nest_next(&outer)) {
    double v = idx->data[outer.off[1]];
    if (!(v >= 0 && v < (double)rows->size)) {
      tensor_free(r);
      return interp_fail(I, op, "take: index %.0f out of range [0, %lld) of %s", v, (long long)rows->size,
                         rows->name), NULL;
    }
    int64_t local = (int64_t)v - r->start[0];
    if (local < 0 || local >= r->shape[0]) continue; /* a row another device holds */
    int64_t base[3] = {local * row_stride, 0, outer.off[2]};
    for (nest_begin(&inner, base); !inner.done; nest_next(&inner)) r->data[inner.off[0]] += dy->data[inner.off[2]];
  }
  return r;
}

static Tensor *k_causal_grad(Interp *I, const Op *op, const Tensor *dy) {
  Tensor *r = tensor_copy(dy);
  if (!r) return interp_fail(I, op, "out of memory"), NULL;
  mask_causal(I, r, op->dims[0], op->dims[1], 0);
  return r;
}

/* The label's row of logits along d, its logsumexp, and the label (false: out of range). */
static bool ce_row(Interp *I, const Op *op, const double *row, int64_t n, int64_t sd, double label, double *lse) {
  if (!(label >= 0 && label < (double)n))
    return interp_fail(I, op, "label %.0f out of range [0, %lld) of %s", label, (long long)n, op->dims[0]->name);
  double s, m = row_max_sumexp(row, n, sd, &s);
  *lse = m + log(s);
  return true;
}

/* (logits, labels) -> logsumexp over d of logits - logits[label], labels' dims;
 * (logits, labels, dl) -> (softmax(logits) - onehot(label)) * dl, logits' type. */
static Tensor *k_cross_entropy(Interp *I, const Op *op, Tensor *const *x) {
  const Dim *d = op->dims[0];
  Tensor *logits = x[0], *labels = x[1], *dl = op->kind == OP_CROSS_ENTROPY_GRAD ? x[2] : NULL;
  if (!need_whole(I, op, logits, d, ir_op_name(op->kind))) return NULL;
  for (int i = 0; i < labels->type.rank; i++) {
    int64_t s, e;
    if (dim_block(I, op, labels->type.dims[i], x, dl ? 3 : 2, &s, &e) <= 0) return NULL;
  }
  Tensor *r = dl ? tensor_new_block(&op->results[0]->type, logits->start, logits->shape)
                 : result_by_name(I, op, &op->results[0]->type, &labels, 1);
  if (!r) return I->failed ? NULL : (interp_fail(I, op, "out of memory"), NULL);
  int64_t n = d->size, sd[4];
  Tensor *ts[4] = {logits, labels, dl ? dl : NULL, r};
  Nest N;
  rows_over(&N, ts, 4, d, sd);
  for (nest_begin(&N, NULL); !N.done; nest_next(&N)) {
    const double *row = logits->data + N.off[0];
    double label = labels->data[N.off[1]], lse = 0;
    if (!ce_row(I, op, row, n, sd[0], label, &lse)) {
      tensor_free(r);
      return NULL;
    }
    if (!dl) {
      r->data[N.off[3]] = lse - row[(int64_t)label * sd[0]];
      continue;
    }
    double g = dl->data[N.off[2]];
    for (int64_t j = 0; j < n; j++)
      r->data[N.off[3] + j * sd[3]] = (exp(row[j * sd[0]] - lse) - (j == (int64_t)label)) * g;
  }
  return r;
}

/* (x, idx) along d: x's element at idx per position, 0 where idx falls outside the block of d
 * held here (a vocab-parallel cross entropy's picked logits: a partial sum over d's axes). */
static Tensor *k_pick(Interp *I, const Op *op, Tensor *x, Tensor *idx) {
  const Dim *d = op->dims[0];
  int p = tensor_type_find(&x->type, d);
  if (p < 0) return interp_fail(I, op, "pick: x has no dim %s", d->name), NULL;
  Tensor *xs[2] = {x, idx};
  for (int i = 0; i < idx->type.rank; i++) {
    int64_t s, e;
    if (dim_block(I, op, idx->type.dims[i], xs, 2, &s, &e) <= 0) return NULL;
  }
  Tensor *r = result_by_name(I, op, &op->results[0]->type, &idx, 1);
  if (!r) return NULL;
  int64_t sd[3];
  Tensor *ts[3] = {x, idx, r};
  Nest N;
  rows_over(&N, ts, 3, d, sd);
  for (nest_begin(&N, NULL); !N.done; nest_next(&N)) {
    double v = idx->data[N.off[1]];
    if (!(v >= 0 && v < (double)d->size)) {
      tensor_free(r);
      return interp_fail(I, op, "pick: index %.0f out of range [0, %lld) of %s", v, (long long)d->size, d->name), NULL;
    }
    int64_t local = (int64_t)v - x->start[p];
    r->data[N.off[2]] = local >= 0 && local < x->shape[p] ? x->data[N.off[0] + local * sd[0]] : 0;
  }
  return r;
}

/* (idx) -> 1 where the index along d equals idx, else 0: d whole here (an SPMD run slices it),
 * the other dims idx's blocks. */
static Tensor *k_onehot(Interp *I, const Op *op, Tensor *idx) {
  const TensorType *rt = &op->results[0]->type;
  const Dim *d = op->dims[0];
  int64_t st[MAX_RANK], sh[MAX_RANK];
  for (int i = 0; i < rt->rank; i++) {
    int p = tensor_type_find(&idx->type, rt->dims[i]);
    if (p < 0) made_block(I, rt, i, &st[i], &sh[i]);
    else st[i] = idx->start[p], sh[i] = idx->shape[p];
  }
  Tensor *r = tensor_new_block(rt, st, sh);
  if (!r) return interp_fail(I, op, "out of memory"), NULL;
  int pd = tensor_type_find(rt, d);
  int64_t sd = stride_of(r, d), d0 = pd >= 0 ? r->start[pd] : 0, dn = pd >= 0 ? r->shape[pd] : d->size;
  Tensor *ts[2] = {idx, r};
  Nest N;
  nest_init(&N, 2);
  for (int i = 0; i < idx->type.rank; i++) nest_dim(&N, idx->type.dims[i], idx->shape[i], ts);
  for (nest_begin(&N, NULL); !N.done; nest_next(&N)) {
    double v = idx->data[N.off[0]];
    if (!(v >= 0 && v < (double)d->size)) {
      tensor_free(r);
      return interp_fail(I, op, "onehot: index %.0f out of range [0, %lld) of %s", v, (long long)d->size, d->name),
             NULL;
    }
    if ((int64_t)v >= d0 && (int64_t)v < d0 + dn) r->data[N.off[1] + ((int64_t)v - d0) * sd] = 1;
  }
  return r;
}

/* scale * q . k over the head dim, masked under causal (the whole key dim, or one ring block);
 * *st gets the scores' type. */
static Tensor *attention_scores(Interp *I, const Op *op, Tensor *q, Tensor *k, TensorType *st) {
  Dim *hd = op->dims[0];
  *st = (TensorType){.dtype = DT_F32};
  for (int i = 0; i < q->type.rank; i++)
    if (q->type.dims[i] != hd) st->dims[st->rank++] = q->type.dims[i];
  for (int i = 0; i < k->type.rank; i++)
    if (k->type.dims[i] != hd && tensor_type_find(&q->type, k->type.dims[i]) < 0) {
      if (st->rank == MAX_RANK) return interp_fail(I, op, "attention scores have too many dims"), NULL;
      st->dims[st->rank++] = k->type.dims[i];
    }
  Tensor *s = contract_into(I, op, q, k, &hd, 1, st);
  if (!s) return NULL;
  for (int64_t i = 0; i < s->n; i++) s->data[i] *= op->scalar;
  if (op->flag) mask_causal(I, s, op->dims[2], op->dims[1], -INFINITY);
  return s;
}

/* The scores of attention(q, k, v) as the forward computes them: softmax over the key dim of
 * scale * contract(q, k, over: head), causally masked; *st gets their type. */
static Tensor *attention_probs(Interp *I, const Op *op, Tensor *q, Tensor *k, Tensor *v, TensorType *st) {
  Dim *hd = op->dims[0], *kd = op->dims[1];
  if (!need_whole(I, op, q, hd, ir_op_name(op->kind)) || !need_whole(I, op, k, hd, ir_op_name(op->kind)) ||
      !need_whole(I, op, k, kd, ir_op_name(op->kind)) || !need_whole(I, op, v, kd, ir_op_name(op->kind)))
    return NULL;
  Tensor *s = attention_scores(I, op, q, k, st);
  if (!s) return NULL;
  Tensor *p = softmax_of(I, op, s, kd);
  tensor_free(s);
  if (p) p->type.dtype = DT_F32;
  return p;
}

/* The fused attention, as the chain it replaced: scores = contract(q, k, over: head) * scale,
 * optionally masked, softmax over the key dim, contract with v over the key dim. */
static Tensor *k_attention(Interp *I, const Op *op, Tensor *q, Tensor *k, Tensor *v) {
  TensorType st;
  Tensor *p = attention_probs(I, op, q, k, v, &st);
  if (!p) return NULL;
  Tensor *o = contract_into(I, op, p, v, &op->dims[1], 1, &op->results[0]->type);
  tensor_free(p);
  return o;
}

/* (q, k, v, o, do) -> dq, dk or dv (Op.index 0, 1, 2), by ir.h's formulas: with p the recomputed
 * probabilities, dp = do . v over the dims o has from v only (VO), D = sum over VO of do * o,
 * ds = p (dp - D); dq = scale ds . k over the key dim, dk = scale ds . q and dv = p . do summed
 * over the dims k (v) lacks. */
static Tensor *k_attention_grad(Interp *I, const Op *op, Tensor *const *x) {
  Tensor *q = x[0], *k = x[1], *v = x[2], *o = x[3], *dout = x[4];
  const TensorType *rt = &op->results[0]->type;
  TensorType st;
  Tensor *p = attention_probs(I, op, q, k, v, &st);
  if (!p) return NULL;
  Dim *vo[MAX_RANK];
  int nvo = 0;
  TensorType dt = {.dtype = DT_F32};
  for (int i = 0; i < o->type.rank; i++) {
    Dim *d = o->type.dims[i];
    if (tensor_type_find(&st, d) >= 0) {
      dt.dims[dt.rank++] = d;
    } else {
      vo[nvo++] = d;
      if (!need_whole(I, op, v, d, "attention_grad") || !need_whole(I, op, o, d, "attention_grad")) {
        tensor_free(p);
        return NULL;
      }
    }
  }
  Tensor *dp = contract_into(I, op, dout, v, vo, nvo, &st);
  Tensor *D = dp ? contract_into(I, op, dout, o, vo, nvo, &dt) : NULL;
  Tensor *r = NULL;
  if (dp && D) {
    /* ds = p (dp - D), in place in dp */
    Tensor *ts[3] = {p, dp, D};
    Nest N;
    nest_init(&N, 3);
    for (int i = 0; i < st.rank; i++) nest_dim(&N, st.dims[i], p->shape[i], ts);
    for (nest_begin(&N, NULL); !N.done; nest_next(&N))
      dp->data[N.off[1]] = p->data[N.off[0]] * (dp->data[N.off[1]] - D->data[N.off[2]]);
    Dim *over[MAX_RANK];
    int nover = 0;
    if (op->index == 0) {
      r = contract_into(I, op, dp, k, &op->dims[1], 1, rt);
    } else if (op->index == 1) {
      for (int i = 0; i < st.rank; i++)
        if (tensor_type_find(&k->type, st.dims[i]) < 0) over[nover++] = st.dims[i];
      r = contract_into(I, op, dp, q, over, nover, rt);
    } else if (op->index == 2) {
      for (int i = 0; i < st.rank; i++)
        if (tensor_type_find(&v->type, st.dims[i]) < 0) over[nover++] = st.dims[i];
      r = contract_into(I, op, p, dout, over, nover, rt);
    } else {
      interp_fail(I, op, "index %d is not 0 (dq), 1 (dk) or 2 (dv)", op->index);
    }
    if (r && op->index != 2)
      for (int64_t i = 0; i < r->n; i++) r->data[i] *= op->scalar;
  }
  tensor_free(p);
  tensor_free(dp);
  tensor_free(D);
  return r;
}

/* ---- routing (route.h) ---- */

/* route(l, top: k, over: e, tokens: t, slots: c), by ir.h's definition: per group (an index of
 * l's dims but e and t), each token's k choices (the largest logits along e, the lower index
 * first among equals; a NaN is never larger), then the slots: all first choices in order of t,
 * then all second choices, ..., each taking its expert's next slot while there is one. e and t
 * whole here; the result holds l's blocks and c whole. */
static Tensor *k_route(Interp *I, const Op *op, Tensor *l) {
  const TensorType *rt = &op->results[0]->type;
  const Dim *e = op->dims[0], *t = op->dims[1], *c = op->dims[2];
  int k = op->index;
  if (!need_whole(I, op, l, e, "route") || !need_whole(I, op, l, t, "route")) return NULL;
  int64_t st[MAX_RANK], sh[MAX_RANK];
  for (int i = 0; i < rt->rank; i++) {
    int p = tensor_type_find(&l->type, rt->dims[i]);
    if (p >= 0) st[i] = l->start[p], sh[i] = l->shape[p];
    else st[i] = 0, sh[i] = rt->dims[i]->size; /* the slot dim */
  }
  Tensor *r = tensor_new_block(rt, st, sh);
  int64_t E = e->size, T = t->size, C = c->size;
  int *choice = r ? malloc(sizeof(int) * (size_t)(T * k)) : NULL;
  int64_t *fill = choice ? calloc((size_t)E, sizeof *fill) : NULL;
  /* slots fill in order of the tokens' logical positions: under a causal ring the sequence is
   * stored in zigzag order (interp_logical_index), and order[i] is the storage position of the
   * i-th token */
  int64_t *order = fill ? malloc(sizeof *order * (size_t)(T > 0 ? T : 1)) : NULL;
  if (!order) {
    free(choice), free(fill);
    tensor_free(r);
    return interp_fail(I, op, "out of memory"), NULL;
  }
  for (int64_t p = 0; p < T; p++) order[interp_logical_index(I, t, p)] = p;
  int64_t le = stride_of(l, e), lt = stride_of(l, t), re = stride_of(r, e), rtk = stride_of(r, t), rc = stride_of(r, c);
  Tensor *ts[2] = {l, r};
  Nest N;
  nest_init(&N, 2);
  for (int i = 0; i < l->type.rank; i++)
    if (l->type.dims[i] != e && l->type.dims[i] != t) nest_dim(&N, l->type.dims[i], l->shape[i], ts);
  for (nest_begin(&N, NULL); !N.done; nest_next(&N)) {
    for (int64_t j = 0; j < T; j++) { /* token j's choices, best first */
      const double *row = l->data + N.off[0] + j * lt;
      for (int q = 0; q < k; q++) {
        int best = -1;
        double bv = 0;
        for (int64_t x = 0; x < E; x++) {
          bool taken = false;
          for (int p = 0; p < q; p++) taken |= choice[j * k + p] == x;
          double v = isnan(row[x * le]) ? -INFINITY : row[x * le];
          if (!taken && (best < 0 || v > bv)) best = (int)x, bv = v;
        }
        choice[j * k + q] = best;
      }
    }
    memset(fill, 0, sizeof *fill * (size_t)E);
    for (int q = 0; q < k; q++)
      for (int64_t i = 0; i < T; i++) {
        int64_t j = order[i];
        int x = choice[j * k + q];
        if (fill[x] < C) r->data[N.off[1] + j * rtk + x * re + fill[x]++ * rc] = 1;
      }
  }
  free(choice);
  free(fill);
  free(order);
  return r;
}

/* A dispatch or a combine (route.h) as the indexed copy it is: for each nonzero entry of the
 * patterned operand p, the other operand's row there (its dims p lacks) times the entry, added
 * into the result's row there. A dispatch's slot gets at most one token; a combine's token adds
 * up its k entries. The contracted dims are held alike by both operands (the sum is over the
 * block they hold: a partial sum where it is part). */
static Tensor *k_routed(Interp *I, const Op *op, Tensor *a, Tensor *b, int pat) {
  const TensorType *rt = &op->results[0]->type;
  Tensor *x2[2] = {a, b};
  Tensor *p = x2[pat], *x = x2[1 - pat];
  for (int k = 0; k < op->ndims; k++) {
    int64_t s0, e0;
    if (tensor_type_find(&a->type, op->dims[k]) < 0 || tensor_type_find(&b->type, op->dims[k]) < 0)
      return interp_fail(I, op, "contracted dim %s is missing from an operand", op->dims[k]->name), NULL;
    if (dim_block(I, op, op->dims[k], x2, 2, &s0, &e0) <= 0) return NULL;
  }
  Tensor *r = result_by_name(I, op, rt, x2, 2);
  if (!r) return NULL;
  Tensor *ts[3] = {r, p, x};
  Nest outer, inner;
  nest_init(&outer, 3);
  nest_init(&inner, 3);
  for (int i = 0; i < p->type.rank; i++) nest_dim(&outer, p->type.dims[i], p->shape[i], ts);
  for (int i = 0; i < x->type.rank; i++)
    if (tensor_type_find(&p->type, x->type.dims[i]) < 0) nest_dim(&inner, x->type.dims[i], x->shape[i], ts);
  for (nest_begin(&outer, NULL); !outer.done; nest_next(&outer)) {
    double v = p->data[outer.off[1]];
    if (v == 0) continue;
    for (nest_begin(&inner, outer.off); !inner.done; nest_next(&inner))
      r->data[inner.off[0]] += v * x->data[inner.off[2]];
  }
  return r;
}

/* route_grad(p, a, b): at each nonzero entry of p, the sum over dims[] of a * b there; 0
 * elsewhere. */
static Tensor *k_route_grad(Interp *I, const Op *op, Tensor *const *x) {
  const TensorType *rt = &op->results[0]->type;
  Tensor *p = x[0], *a = x[1], *b = x[2];
  Tensor *r = result_by_name(I, op, rt, x, 3);
  if (!r) return NULL;
  Tensor *ts[4] = {r, p, a, b};
  Nest outer, inner;
  nest_init(&outer, 4);
  nest_init(&inner, 4);
  for (int i = 0; i < rt->rank; i++) nest_dim(&outer, rt->dims[i], r->shape[i], ts);
  for (int k = 0; k < op->ndims; k++) {
    int64_t s0, e0;
    Tensor *ab[2] = {a, b};
    if (tensor_type_find(&a->type, op->dims[k]) < 0 || tensor_type_find(&b->type, op->dims[k]) < 0) {
      tensor_free(r);
      return interp_fail(I, op, "contracted dim %s is missing from an operand", op->dims[k]->name), NULL;
    }
    if (dim_block(I, op, op->dims[k], ab, 2, &s0, &e0) <= 0) {
      tensor_free(r);
      return NULL;
    }
    nest_dim(&inner, op->dims[k], e0, ts);
  }
  for (nest_begin(&outer, NULL); !outer.done; nest_next(&outer)) {
    if (p->data[outer.off[1]] == 0) continue;
    double s = 0;
    for (nest_begin(&inner, outer.off); !inner.done; nest_next(&inner)) s += a->data[inner.off[2]] * b->data[inner.off[3]];
    r->data[outer.off[0]] = s;
  }
  return r;
}

/* ---- ring attention (interp_spmd.c's spmd_ring; language.md, Context parallelism) ----
 *
 * One device's part of a ring: R->q[0] (and o, do) its query block, R->k[j], R->v[j] (and the
 * query blocks R->q[j], ...) those of the device j places back along the ring, the order in which
 * the ring brings them. The forward merges the key blocks by online softmax, step by step; the
 * backward recomputes each query block's logsumexp over every key block, then sums each pair's
 * contribution: dq over the key blocks that visit, dk and dv of the device's own block over the
 * query blocks it visits. */

/* A tensor of the rows of s (s without the key dim kd), filled with v. */
static Tensor *row_tensor(const Tensor *s, const Dim *kd, double v) {
  TensorType t = s->type;
  int64_t st[MAX_RANK], sh[MAX_RANK];
  int r = 0;
  for (int i = 0; i < s->type.rank; i++)
    if (s->type.dims[i] != kd) t.dims[r] = s->type.dims[i], st[r] = s->start[i], sh[r] = s->shape[i], r++;
  t.rank = r;
  Tensor *x = tensor_new_block(&t, st, sh);
  for (int64_t i = 0; x && i < x->n; i++) x->data[i] = v;
  return x;
}

/* Multiplies each element of t by f's value for its row (f lacks some of t's dims: broadcast). */
static void scale_rows(Tensor *t, Tensor *f, bool divide) {
  Tensor *ts[2] = {t, f};
  Nest N;
  nest_init(&N, 2);
  for (int i = 0; i < t->type.rank; i++) nest_dim(&N, t->type.dims[i], t->shape[i], ts);
  for (nest_begin(&N, NULL); !N.done; nest_next(&N)) {
    double x = f->data[N.off[1]];
    t->data[N.off[0]] = divide ? (x > 0 ? t->data[N.off[0]] / x : 0) : t->data[N.off[0]] * x;
  }
}

/* The online softmax over one more key block: with M, L the running row max and sum of
 * exponentials, s the block's scores: M' = max(M, rowmax s), L = L e^(M - M') + sum e^(s - M');
 * *alpha (if asked) gets e^(M - M') per row, and s becomes e^(s - M'). */
static void online_step(Tensor *s, const Dim *kd, Tensor *M, Tensor *L, Tensor *alpha) {
  Tensor *ts[4] = {s, M, L, alpha};
  int64_t sd[4];
  Nest N;
  rows_over(&N, ts, 4, kd, sd);
  int64_t n = s->shape[tensor_type_find(&s->type, kd)];
  for (nest_begin(&N, NULL); !N.done; nest_next(&N)) {
    double *row = s->data + N.off[0], m = M->data[N.off[1]];
    double mn = m;
    for (int64_t j = 0; j < n; j++) mn = row[j * sd[0]] > mn ? row[j * sd[0]] : mn;
    double a = mn == -INFINITY ? 1 : exp(m - mn), sum = 0;
    for (int64_t j = 0; j < n; j++) {
      row[j * sd[0]] = mn == -INFINITY ? 0 : exp(row[j * sd[0]] - mn);
      sum += row[j * sd[0]];
    }
    M->data[N.off[1]] = mn;
    L->data[N.off[2]] = L->data[N.off[2]] * a + sum;
    if (alpha) alpha->data[N.off[3]] = a;
  }
}

static Tensor *ring_forward(Interp *I, const Op *op, const RingBlocks *R) {
  Tensor *acc = NULL, *M = NULL, *L = NULL, *alpha = NULL;
  bool ok = true;
  for (int j = 0; j < R->n && ok; j++) {
    TensorType st;
    Tensor *s = attention_scores(I, op, R->q[0], R->k[j], &st);
    if (!s) return tensor_free(acc), tensor_free(M), tensor_free(L), tensor_free(alpha), NULL;
    if (!M) {
      M = row_tensor(s, op->dims[1], -INFINITY);
      L = row_tensor(s, op->dims[1], 0);
      alpha = row_tensor(s, op->dims[1], 1);
    }
    online_step(s, op->dims[1], M, L, alpha);
    Tensor *pv = contract_into(I, op, s, R->v[j], &op->dims[1], 1, &op->results[0]->type);
    tensor_free(s);
    if (!pv) {
      ok = false;
      break;
    }
    if (!acc) {
      acc = pv;
    } else {
      scale_rows(acc, alpha, false);
      for (int64_t i = 0; i < acc->n; i++) acc->data[i] += pv->data[i];
      tensor_free(pv);
    }
  }
  if (ok && acc) scale_rows(acc, L, true);
  tensor_free(M);
  tensor_free(L);
  tensor_free(alpha);
  if (!ok) return tensor_free(acc), NULL;
  return acc;
}

/* log of the softmax's denominator for query block q over every key block (its row tensor). */
static Tensor *ring_lse(Interp *I, const Op *op, Tensor *q, Tensor *const *k, int n) {
  Tensor *M = NULL, *L = NULL;
  for (int j = 0; j < n; j++) {
    TensorType st;
    Tensor *s = attention_scores(I, op, q, k[j], &st);
    if (!s) return tensor_free(M), tensor_free(L), NULL;
    if (!M) M = row_tensor(s, op->dims[1], -INFINITY), L = row_tensor(s, op->dims[1], 0);
    online_step(s, op->dims[1], M, L, NULL);
    tensor_free(s);
  }
  for (int64_t i = 0; M && i < M->n; i++) M->data[i] = L->data[i] > 0 ? M->data[i] + log(L->data[i]) : -INFINITY;
  tensor_free(L);
  return M;
}

/* One (query block, key block) pair's contribution to dq, dk or dv (Op.index), by
 * k_attention_grad's formulas with p = e^(s - lse) for the query block's logsumexp. */
static Tensor *ring_pair_grad(Interp *I, const Op *op, Tensor *q, Tensor *k, Tensor *v, Tensor *o, Tensor *dout,
                              Tensor *lse) {
  TensorType st;
  Tensor *p = attention_scores(I, op, q, k, &st);
  if (!p) return NULL;
  Tensor *ts[2] = {p, lse};
  Nest N;
  nest_init(&N, 2);
  for (int i = 0; i < p->type.rank; i++) nest_dim(&N, p->type.dims[i], p->shape[i], ts);
  for (nest_begin(&N, NULL); !N.done; nest_next(&N)) {
    double l = lse->data[N.off[1]];
    p->data[N.off[0]] = l == -INFINITY ? 0 : exp(p->data[N.off[0]] - l);
  }
  Dim *vo[MAX_RANK];
  int nvo = 0;
  TensorType dt = {.dtype = DT_F32};
  for (int i = 0; i < o->type.rank; i++) {
    Dim *d = o->type.dims[i];
    if (tensor_type_find(&st, d) >= 0) dt.dims[dt.rank++] = d;
    else vo[nvo++] = d;
  }
  const TensorType *rt = &op->results[0]->type;
  Tensor *r = NULL;
  Dim *over[MAX_RANK];
  int nover = 0;
  if (op->index == 2) {
    for (int i = 0; i < st.rank; i++)
      if (tensor_type_find(&v->type, st.dims[i]) < 0) over[nover++] = st.dims[i];
    r = contract_into(I, op, p, dout, over, nover, rt);
    tensor_free(p);
    return r;
  }
  Tensor *dp = contract_into(I, op, dout, v, vo, nvo, &st);
  Tensor *D = dp ? contract_into(I, op, dout, o, vo, nvo, &dt) : NULL;
  if (dp && D) {
    Tensor *t3[3] = {p, dp, D};
    nest_init(&N, 3);
    for (int i = 0; i < st.rank; i++) nest_dim(&N, st.dims[i], p->shape[i], t3);
    for (nest_begin(&N, NULL); !N.done; nest_next(&N))
      dp->data[N.off[1]] = p->data[N.off[0]] * (dp->data[N.off[1]] - D->data[N.off[2]]);
    if (op->index == 0) {
      r = contract_into(I, op, dp, k, &op->dims[1], 1, rt);
    } else {
      for (int i = 0; i < st.rank; i++)
        if (tensor_type_find(&k->type, st.dims[i]) < 0) over[nover++] = st.dims[i];
      r = contract_into(I, op, dp, q, over, nover, rt);
    }
    for (int64_t i = 0; r && i < r->n; i++) r->data[i] *= op->scalar;
  }
  tensor_free(p);
  tensor_free(dp);
  tensor_free(D);
  return r;
}

static Tensor *ring_backward(Interp *I, const Op *op, const RingBlocks *R) {
  Tensor *sum = NULL;
  for (int j = 0; j < R->n; j++) {
    /* dq: the own query block against the key block j; dk, dv: query block j against the own key
     * block */
    int qi = op->index == 0 ? 0 : j, ki = op->index == 0 ? j : 0;
    Tensor *lse = ring_lse(I, op, R->q[qi], R->k, R->n); /* (over every key block, in any order) */
    Tensor *c = lse ? ring_pair_grad(I, op, R->q[qi], R->k[ki], R->v[ki], R->o[qi], R->dout[qi], lse) : NULL;
    tensor_free(lse);
    if (!c) return tensor_free(sum), NULL;
    if (!sum) {
      sum = c;
      continue;
    }
    for (int64_t i = 0; i < sum->n; i++) sum->data[i] += c->data[i];
    tensor_free(c);
  }
  return sum;
}

Tensor *iop_ring_attention(Interp *I, const Op *op, const RingBlocks *R) {
  if (R->n < 1) return interp_fail(I, op, "a ring of no devices"), NULL;
  return op->kind == OP_ATTENTION ? ring_forward(I, op, R) : ring_backward(I, op, R);
}

/* ---- the dispatcher ---- */

Tensor *iop_eval(Interp *I, const Op *op, Tensor *const *x) {
  const TensorType *rt = &op->results[0]->type;
  for (int i = 0; i < op->noperands; i++)
    if (!x[i]) return interp_fail(I, op, "operand %d has no value", i), NULL;
  Tensor *r = NULL;
  const OpInfo *info = ir_op_info(op->kind);
  if (info->fn) { /* ops.def's scalar function over the elements */
    if (info->cls == OC_EW_UNARY) r = k_unary(I, op, x[0]);
    else if (info->cls == OC_EW_BINARY) r = k_binary(I, op, x[0], x[1]);
    else r = k_map(I, op, x, op->noperands);
  } else switch (op->kind) { /* the other kernels, each its own */
  case OP_CONST:
    r = tensor_new(rt);
    if (r && r->n == 1) r->data[0] = op->scalar;
    else interp_fail(I, op, "a constant must be rank 0");
    break;
  case OP_CONTRACT: {
    int pat;
    if (ir_route_contract(op, &pat) != CONTRACT_DENSE && pat >= 0) r = k_routed(I, op, x[0], x[1], pat);
    else r = contract_into(I, op, x[0], x[1], op->dims, op->ndims, rt);
    break;
  }
  case OP_SUM: case OP_MEAN: case OP_MAX: r = k_reduce(I, op, x[0]); break;
  case OP_SOFTMAX: r = softmax_of(I, op, x[0], op->dims[0]); break;
  case OP_RMSNORM: case OP_LAYERNORM: r = k_norm(I, op, x); break;
  case OP_RENAME: r = k_rename(I, op, x[0]); break;
  case OP_SPLIT: case OP_MERGE: r = k_reshape(I, op, x[0]); break;
  case OP_TAKE: r = k_take(I, op, x[0], x[1]); break;
  case OP_CAUSAL: r = k_causal(I, op, x[0]); break;
  case OP_DROPOUT: r = k_dropout(I, op, x[0]); break;
  case OP_CAST: r = k_cast(I, op, x[0]); break;
  case OP_TRANSPOSE: r = k_transpose(I, op, x[0]); break;
  case OP_ATTENTION: r = k_attention(I, op, x[0], x[1], x[2]); break;
  case OP_BROADCAST: r = k_broadcast(I, op, x[0]); break;
  case OP_MAX_GRAD: r = k_max_grad(I, op, x); break;
  case OP_SOFTMAX_GRAD: r = k_softmax_grad(I, op, x); break;
  case OP_RMSNORM_GRAD: case OP_LAYERNORM_GRAD: r = k_norm_grad(I, op, x); break;
  case OP_TAKE_GRAD: r = k_take_grad(I, op, x[0], x[1]); break;
  case OP_CAUSAL_GRAD: r = k_causal_grad(I, op, x[0]); break;
  case OP_ATTENTION_GRAD: r = k_attention_grad(I, op, x); break;
  case OP_CROSS_ENTROPY: case OP_CROSS_ENTROPY_GRAD: r = k_cross_entropy(I, op, x); break;
  case OP_PICK: r = k_pick(I, op, x[0], x[1]); break;
  case OP_SLICE: /* the device's block (an SPMD run wants it); a global run holds it all */
    r = I->want_set ? iop_slice(x[0], I->want_start, I->want_shape) : tensor_copy(x[0]);
    if (!r) return interp_fail(I, op, "slice: the operand does not hold the block"), NULL;
    break;
  case OP_ONEHOT: r = k_onehot(I, op, x[0]); break;
  case OP_ROUTE: r = k_route(I, op, x[0]); break;
  case OP_ROUTE_GRAD: r = k_route_grad(I, op, x); break;
  /* not kernels: interp.c and interp_spmd.c run the leaves, regions and collectives */
  default:
    interp_fail(I, op, "'%s' is not a kernel", ir_op_name(op->kind));
    break;
  }
  if (!r) return NULL;
  r->type.dtype = rt->dtype;
  interp_round(I, r);
  return r;
}
