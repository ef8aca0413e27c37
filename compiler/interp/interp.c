/* interp.c: the reference interpreter's core: tensors, rounding, and the walk over the IR.
 *
 * In: an IrModule (before or after partitioning), whole input and param tensors. Out: the entry's
 * outputs, or the first run-time error (a take index out of range, a partitioning mistake found by
 * interp_spmd.c's checks) with the op's line.
 *
 * The walk is lockstep: every op runs on every (active) device before the next op, so collectives
 * see all devices' operands; a global run is the same walk with one device and every value whole
 * (collectives are then the identity). A loop runs its body `count` times: body inputs are the
 * stacked params' slices at the trip's index, the carried values, the invariants; the body's
 * outputs become the next trip's carried values and, after the last trip, the loop's results. In
 * an SPMD run a loop whose stacked params shard the stacking dim is a pipeline: on trip t only
 * the devices of the stage holding layer t compute, and the CollectivePermute at the end of the
 * body hands the carried values to the next stage (interp_spmd.c).
 *
 * Values are doubles, rounded after each op (interp_round): f32 for every float dtype by default,
 * each value's own dtype (bf16, f16, f8 = E4M3 saturating) with INTERP_DTYPE, not at all with
 * INTERP_F64. Integer dtypes truncate toward zero and wrap around their range. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "interp_int.h"
#include "partition.h"
#include "propagate.h"
#include "stages.h"
#include "step.h"

/* ---- tensors ---- */

Tensor *tensor_new_block(const TensorType *t, const int64_t *start, const int64_t *shape) {
  if (!t || t->rank < 0 || t->rank > MAX_RANK) return NULL;
  Tensor *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->type = *t;
  r->n = 1;
  for (int i = 0; i < t->rank; i++) {
    r->shape[i] = shape ? shape[i] : t->dims[i]->size;
    r->start[i] = start ? start[i] : 0;
    if (r->shape[i] < 0 || (r->shape[i] > 0 && r->n > ((int64_t)1 << 40) / r->shape[i])) {
      free(r);
      return NULL;
    }
    r->n *= r->shape[i];
  }
  r->data = calloc((size_t)(r->n > 0 ? r->n : 1), sizeof(double));
  if (!r->data) {
    free(r);
    return NULL;
  }
  return r;
}

Tensor *tensor_new(const TensorType *t) { return tensor_new_block(t, NULL, NULL); }

Tensor *tensor_copy(const Tensor *t) {
  if (!t) return NULL;
  Tensor *r = tensor_new_block(&t->type, t->start, t->shape);
  if (r && t->n) memcpy(r->data, t->data, sizeof(double) * (size_t)t->n);
  return r;
}

void tensor_free(Tensor *t) {
  if (!t) return;
  free(t->data);
  free(t);
}

bool tensor_is_whole(const Tensor *t) {
  for (int i = 0; i < t->type.rank; i++)
    if (t->start[i] != 0 || t->shape[i] != t->type.dims[i]->size) return false;
  return true;
}

static int64_t offset_of(const Tensor *t, const int64_t *idx) {
  int64_t off = 0;
  for (int i = 0; i < t->type.rank; i++) off = off * t->shape[i] + idx[i];
  return off;
}

double tensor_get(const Tensor *t, const int64_t *idx) { return t->data[offset_of(t, idx)]; }
void tensor_set(Tensor *t, const int64_t *idx, double v) { t->data[offset_of(t, idx)] = v; }

void tensor_print(FILE *out, const Tensor *t, int max) {
  fprintf(out, "%s[", dtype_name(t->type.dtype));
  for (int i = 0; i < t->type.rank; i++) {
    fprintf(out, "%s%s=", i ? ", " : "", t->type.dims[i]->name);
    if (t->start[i] != 0 || t->shape[i] != t->type.dims[i]->size)
      fprintf(out, "%lld:%lld", (long long)t->start[i], (long long)(t->start[i] + t->shape[i]));
    else
      fprintf(out, "%lld", (long long)t->shape[i]);
  }
  fprintf(out, "] {");
  int64_t n = max > 0 && max < t->n ? max : t->n;
  for (int64_t i = 0; i < n; i++) fprintf(out, "%s%.6g", i ? ", " : "", t->data[i]);
  fprintf(out, "%s}\n", n < t->n ? ", ..." : "");
}

bool tensor_diff(const Tensor *a, const Tensor *b, double *max_abs, double *max_rel) {
  *max_abs = *max_rel = INFINITY;
  if (a->type.rank != b->type.rank || a->n != b->n) return false;
  for (int i = 0; i < a->type.rank; i++)
    if (a->type.dims[i] != b->type.dims[i] || a->start[i] != b->start[i] || a->shape[i] != b->shape[i]) return false;
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < a->n; i++) {
    double x = a->data[i], y = b->data[i];
    if (isfinite(y) && fabs(y) > scale) scale = fabs(y);
    if (isnan(x) && isnan(y)) continue;
    if (!isfinite(x) || !isfinite(y)) {
      if (x != y) worst = INFINITY;
      continue;
    }
    if (fabs(x - y) > worst) worst = fabs(x - y);
  }
  *max_abs = worst;
  *max_rel = worst == 0 ? 0 : scale > 0 ? worst / scale : INFINITY;
  return true;
}

/* ---- rounding ---- */

/* x rounded to nearest-even with `mant` fraction bits, exponents down to emin (subnormals below),
 * magnitudes above maxv overflowing to infinity or saturating at maxv. */
static double round_format(double x, int mant, int emin, double maxv, bool saturate) {
  if (x == 0 || isnan(x)) return x;
  if (isinf(x)) return saturate ? copysign(maxv, x) : x;
  int e;
  frexp(x, &e);
  int ex = e - 1 < emin ? emin : e - 1;
  double q = ldexp(1.0, ex - mant);
  double r = nearbyint(x / q) * q;
  if (fabs(r) > maxv) return saturate ? copysign(maxv, x) : copysign(INFINITY, x);
  return r;
}

double interp_round_value(InterpPrecision p, DType dt, double x) {
  if (dtype_is_int(dt)) {
    if (isnan(x)) return 0;
    double lo = dt == DT_I8 ? -128.0 : -2147483648.0, span = dt == DT_I8 ? 256.0 : 4294967296.0;
    if (isinf(x)) return x < 0 ? lo : lo + span - 1;
    x = trunc(x);
    if (x < lo || x > lo + span - 1) {
      x = fmod(x - lo, span);
      if (x < 0) x += span;
      x += lo;
    }
    return x;
  }
  if (p == INTERP_F64) return x;
  if (p == INTERP_F32 || dt == DT_F32) return (double)(float)x;
  switch (dt) {
  case DT_BF16: return round_format(x, 7, -126, 3.3895313892515355e38, false);
  case DT_F16: return round_format(x, 10, -14, 65504.0, false);
  case DT_F8E4M3: return round_format(x, 3, -6, 448.0, true);  /* saturating, as the casts of TE */
  case DT_F8E5M2: return round_format(x, 2, -14, 57344.0, false); /* IEEE-like: overflows to infinity */
  default: return (double)(float)x;
  }
}

void interp_round(const Interp *I, Tensor *t) {
  if (!dtype_is_int(t->type.dtype) && I->opt.precision == INTERP_F64) return;
  for (int64_t i = 0; i < t->n; i++) t->data[i] = interp_round_value(I->opt.precision, t->type.dtype, t->data[i]);
}

/* ---- the interpreter's state ---- */

bool interp_fail(Interp *I, const Op *op, const char *fmt, ...) {
  if (I->failed) return false;
  I->failed = true;
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (op)
    snprintf(I->st->error, sizeof I->st->error, "line %d: %s: %s", op->loc.line, ir_op_name(op->kind), msg);
  else
    snprintf(I->st->error, sizeof I->st->error, "%s", msg);
  return false;
}

Tensor *interp_val(Interp *I, int dev, const Value *v) {
  if (!v || v->id < 0 || v->id >= I->nvalues) return NULL;
  return I->vals[dev][v->id];
}

void interp_set(Interp *I, int dev, const Value *v, Tensor *t) {
  if (!v || v->id < 0 || v->id >= I->nvalues) {
    tensor_free(t);
    return;
  }
  tensor_free(I->vals[dev][v->id]);
  I->vals[dev][v->id] = t;
}

bool interp_setup(Interp *I, const IrModule *m, const Mesh *mesh, const InterpOptions *o, InterpStats *st) {
  memset(I, 0, sizeof *I);
  memset(st, 0, sizeof *st);
  I->m = m;
  I->st = st;
  if (o) I->opt = *o;
  I->spmd = mesh != NULL;
  I->mesh = mesh;
  I->ndev = mesh ? (int)mesh->devices : 1;
  I->nvalues = m->nvalues;
  if (!m->main) return interp_fail(I, NULL, "the module has no entry function");
  if (I->ndev < 1 || I->ndev > 4096) return interp_fail(I, NULL, "cannot simulate %d devices", I->ndev);
  I->vals = calloc((size_t)I->ndev, sizeof *I->vals);
  I->active = calloc((size_t)I->ndev, sizeof *I->active);
  if (!I->vals || !I->active) return interp_fail(I, NULL, "out of memory");
  arena_init(&I->dev_arena);
  I->dev = m->dev && m->dev->mesh == mesh ? m->dev : devprog_bare(&I->dev_arena, m, mesh);
  if (I->spmd && m->pipeline && m->pipeline->pipe) I->pipe = m->pipeline->pipe;
  for (int d = 0; d < I->ndev; d++) {
    I->active[d] = true;
    I->vals[d] = calloc((size_t)(I->nvalues > 0 ? I->nvalues : 1), sizeof(Tensor *));
    if (!I->vals[d]) return interp_fail(I, NULL, "out of memory");
  }
  return true;
}

void interp_teardown(Interp *I) {
  for (int d = 0; I->vals && d < I->ndev; d++) {
    if (!I->vals[d]) continue;
    for (int i = 0; i < I->nvalues; i++) tensor_free(I->vals[d][i]);
    free(I->vals[d]);
  }
  free(I->vals);
  free(I->active);
  arena_free(&I->dev_arena);
  I->dev = NULL;
  I->vals = NULL;
  I->active = NULL;
}

/* Every OP_INPUT / OP_PARAM of main takes its whole tensor (checked against the value's type),
 * cut to each device's block in an SPMD run, rounded to the options' precision. */
/* ---- storage orders (the device program's: dev_dim_order) ---- */
int64_t interp_logical_index(const Interp *I, const Dim *d, int64_t p) {
  if (!I->spmd) return p;
  RtOrder o = dev_dim_order(I->dev, d, -1);
  return rt_order_logical(&o, p);
}

Tensor *interp_storage_permute(const Interp *I, const Tensor *t, bool to_storage) {
  Tensor *r = tensor_copy(t);
  if (!r || !I->spmd) return r;
  for (int ax = 0; ax < t->type.rank; ax++) {
    RtOrder o = dev_dim_order(I->dev, t->type.dims[ax], ax);
    if (o.kind == RT_ORDER_NATURAL) continue;
    /* along dim ax: storage position p holds logical position rt_order_logical(p) */
    Tensor *src = tensor_copy(r);
    if (!src) return tensor_free(r), NULL;
    int64_t inner = 1, outer = 1, len = t->shape[ax];
    for (int i = ax + 1; i < t->type.rank; i++) inner *= t->shape[i];
    for (int i = 0; i < ax; i++) outer *= t->shape[i];
    for (int64_t o2 = 0; o2 < outer; o2++)
      for (int64_t p = 0; p < len; p++) {
        int64_t l = rt_order_logical(&o, p);
        int64_t to = to_storage ? p : l, from = to_storage ? l : p;
        memcpy(r->data + (o2 * len + to) * inner, src->data + (o2 * len + from) * inner, sizeof(double) * (size_t)inner);
      }
    tensor_free(src);
  }
  return r;
}

bool interp_bind(Interp *I, Tensor *const *inputs, Tensor *const *params) {
  const IrModule *m = I->m;
  for (const Op *op = m->main->first; op; op = op->next) {
    if (op->kind != OP_INPUT && op->kind != OP_PARAM) continue;
    bool in = op->kind == OP_INPUT;
    int n = in ? m->main->ninputs : m->nparams;
    if (op->index < 0 || op->index >= n) return interp_fail(I, op, "index %d out of range", op->index);
    const Tensor *w = in ? inputs[op->index] : params[op->index];
    const Value *v = op->results[0];
    const char *what = in ? "input" : "param";
    if (!w) return interp_fail(I, op, "%s %d is missing", what, op->index);
    bool same = w->type.rank == v->type.rank && tensor_is_whole(w);
    for (int i = 0; same && i < v->type.rank; i++) same = w->type.dims[i] == v->type.dims[i];
    if (!same) {
      char a[256], b[256];
      return interp_fail(I, op, "%s %d is %s, expected %s", what, op->index, tensor_type_format(a, sizeof a, &w->type),
                         tensor_type_format(b, sizeof b, &v->type));
    }
    for (int d = 0; d < I->ndev; d++) {
      Tensor *t;
      if (I->spmd) {
        int64_t st[MAX_RANK], sh[MAX_RANK];
        if (!spmd_block(I, op, v, d, st, sh)) return false;
        Tensor *ws = interp_storage_permute(I, w, true); /* a ring's zigzag, an interleaved pipeline's rows */
        t = ws ? iop_slice(ws, st, sh) : NULL;
        tensor_free(ws);
      } else {
        t = tensor_copy(w);
      }
      if (!t) return interp_fail(I, op, "out of memory");
      t->type.dtype = v->type.dtype;
      interp_round(I, t);
      interp_set(I, d, v, t);
    }
  }
  return true;
}

/* ---- the walk ---- */

static bool eval_func(Interp *I, const IrFunc *f);

#define MAX_OPERANDS 16

static bool eval_plain(Interp *I, const Op *op) {
  if (op->noperands > MAX_OPERANDS) return interp_fail(I, op, "too many operands (%d)", op->noperands);
  if (op->nresults != 1) return interp_fail(I, op, "expected one result");
  Tensor *x[MAX_OPERANDS];
  for (int i = 0; i < op->noperands; i++) x[i] = interp_val(I, 0, op->operands[i]);
  Tensor *r = iop_eval(I, op, x);
  if (!r) return false;
  interp_set(I, 0, op->results[0], r);
  I->st->ops++;
  return true;
}

/* Writes one iteration's value y (a body output) as row `row` of the stacked result block t. */
static bool put_row(Interp *I, const Op *op, Tensor *t, const Tensor *y, int64_t row) {
  int64_t li = row - t->start[0];
  if (li < 0 || li >= t->shape[0]) return interp_fail(I, op, "the stacked result's block lacks row %lld", (long long)row);
  bool same = y->type.rank == t->type.rank - 1 && y->n * t->shape[0] == t->n;
  for (int i = 0; same && i < y->type.rank; i++) same = y->start[i] == t->start[i + 1] && y->shape[i] == t->shape[i + 1];
  if (!same) return interp_fail(I, op, "a stacked body output's block differs from its result's");
  memcpy(t->data + li * y->n, y->data, sizeof(double) * (size_t)y->n);
  return true;
}

/* Trip by trip, in lockstep over the active devices. Iteration k reads row k of the stacked
 * operands (count-1-k for a reverse loop) and writes that row of the stacked results. */
static bool eval_loop(Interp *I, const Op *op) {
  const IrFunc *b = op->body;
  int nc = op->ncarried, ns = op->nstacked, nd = I->ndev;
  if (!b || b->ninputs != op->noperands || ns < 0 || b->noutputs != nc + ns || op->nresults != nc + ns)
    return interp_fail(I, op, "malformed loop");
  if (I->spmd && !spmd_loop_check(I, op)) return false;
  int nv = nc + ns > 0 ? nc + ns : 1;
  Tensor **car = calloc((size_t)(nd * nv), sizeof *car); /* [d * nv + i]: carried, then stacked */
  if (!car) return interp_fail(I, op, "out of memory");
  bool ok = true;
  for (int d = 0; d < nd && ok; d++) {
    if (!I->active[d]) continue;
    for (int i = 0; i < nc && ok; i++) {
      Tensor *x = interp_val(I, d, op->operands[op->nslices + i]);
      if (!x) ok = interp_fail(I, op, "carried operand %d has no value", i);
      car[d * nv + i] = x ? tensor_copy(x) : NULL;
    }
    for (int j = 0; j < ns && ok; j++) {
      const Value *r = op->results[nc + j];
      int64_t s0[MAX_RANK], s1[MAX_RANK];
      if (I->spmd && !spmd_block(I, op, r, d, s0, s1)) ok = false;
      else if (!(car[d * nv + nc + j] = tensor_new_block(&r->type, I->spmd ? s0 : NULL, I->spmd ? s1 : NULL)))
        ok = interp_fail(I, op, "out of memory");
    }
  }
  for (int64_t k = 0; k < op->count && ok; k++) {
    int64_t row = op->reverse ? op->count - 1 - k : k;
    for (int d = 0; d < nd && ok; d++) {
      if (!I->active[d]) continue;
      for (int i = 0; i < b->ninputs && ok; i++) {
        Tensor *x;
        if (i < op->nslices) {
          Tensor *s = interp_val(I, d, op->operands[i]);
          x = s ? iop_unstack(s, row) : NULL;
          if (!x) ok = interp_fail(I, op, "device %d does not hold row %lld of stacked operand %d", d, (long long)row, i);
        } else if (i < op->nslices + nc) {
          x = tensor_copy(car[d * nv + i - op->nslices]);
        } else {
          x = tensor_copy(interp_val(I, d, op->operands[i]));
          if (!x) ok = interp_fail(I, op, "invariant operand %d has no value", i);
        }
        interp_set(I, d, b->inputs[i], x);
      }
    }
    if (!ok || !eval_func(I, b)) {
      ok = false;
      break;
    }
    for (int d = 0; d < nd && ok; d++) {
      if (!I->active[d]) continue;
      for (int i = 0; i < nc && ok; i++) {
        Tensor *y = tensor_copy(interp_val(I, d, b->outputs[i]));
        if (!y) ok = interp_fail(I, op, "body output %d has no value on device %d", i, d);
        tensor_free(car[d * nv + i]);
        car[d * nv + i] = y;
      }
      for (int j = 0; j < ns && ok; j++) {
        const Tensor *y = interp_val(I, d, b->outputs[nc + j]);
        ok = y ? put_row(I, op, car[d * nv + nc + j], y, row)
               : interp_fail(I, op, "stacked body output %d has no value on device %d", j, d);
      }
    }
  }
  for (int d = 0; d < nd; d++)
    for (int i = 0; i < nc + ns; i++) {
      if (ok && I->active[d]) interp_set(I, d, op->results[i], car[d * nv + i]);
      else tensor_free(car[d * nv + i]);
    }
  free(car);
  return ok;
}

static bool eval_op(Interp *I, const Op *op) {
  switch (op->kind) { /* kept: bound values and regions run here, not as kernels */
  case OP_INPUT:
  case OP_PARAM:
    for (int d = 0; d < I->ndev; d++)
      if (I->active[d] && !interp_val(I, d, op->results[0])) return interp_fail(I, op, "not bound");
    return true;
  case OP_LOOP: return eval_loop(I, op);
  case OP_PIPELINE: return interp_pipeline(I, op);
  default: break;
  }
  if (ir_op_is_collective(op->kind)) {
    if (I->spmd) return spmd_collective(I, op);
    Tensor *x = tensor_copy(interp_val(I, 0, op->operands[0]));
    if (!x) return interp_fail(I, op, "operand has no value");
    interp_set(I, 0, op->results[0], x);
    I->st->ops++;
    return true;
  }
  return I->spmd ? spmd_op(I, op) : eval_plain(I, op);
}

static bool eval_func(Interp *I, const IrFunc *f) {
  for (const Op *op = f->first; op; op = op->next) {
    /* an op of main placed on some pipeline stages runs on their devices alone (the device program's
     * stages; a loop's body runs where its loop does, which is already active) */
    uint8_t runs = f == I->m->main ? dev_op_runs(op) : PLACE_ALL;
    if (!runs || !I->spmd || !I->pipe) {
      if (!eval_op(I, op)) return false;
      continue;
    }
    for (int d = 0; d < I->ndev; d++) I->active[d] = dev_runs_on(I->dev, runs, d);
    bool ok = eval_op(I, op);
    for (int d = 0; d < I->ndev; d++) I->active[d] = true;
    if (!ok) return false;
  }
  return true;
}

bool interp_eval_func(Interp *I, const IrFunc *f) { return eval_func(I, f); }

bool interp_exec(Interp *I) { return !I->failed && eval_func(I, I->m->main); }

/* ---- global runs ---- */

bool interp_run(const IrModule *m, const InterpOptions *o, Tensor *const *inputs, Tensor *const *params,
                Tensor **outputs, InterpStats *st) {
  InterpStats local;
  if (!st) st = &local;
  Interp I;
  bool ok = interp_setup(&I, m, NULL, o, st) && interp_bind(&I, inputs, params) && interp_exec(&I);
  for (int i = 0; ok && i < m->main->noutputs; i++) {
    outputs[i] = tensor_copy(interp_val(&I, 0, m->main->outputs[i]));
    if (!outputs[i]) ok = interp_fail(&I, NULL, "output %d has no value", i);
  }
  interp_teardown(&I);
  return ok;
}

/* ---- test inputs ---- */

int interp_ninputs(const IrModule *m) { return m && m->main ? m->main->ninputs : 0; }
int interp_noutputs(const IrModule *m) { return m && m->main ? m->main->noutputs : 0; }

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static double uniform(uint64_t *s) { return (double)(splitmix(s) >> 11) * 0x1.0p-53; } /* [0, 1) */

/* The loop of f->parent whose body is f. */
static const Op *loop_of_body(const IrFunc *f) {
  if (!f->parent) return NULL;
  for (const Op *op = f->parent->first; op; op = op->next)
    if (op->kind == OP_LOOP && op->body == f) return op;
  return NULL;
}

/* The main input v comes from, through ops that only move or relabel data and through loop
 * operands; -1 when it is computed. */
static int trace_input(const Value *v) {
  while (v) {
    if (v->def) {
      OpKind k = v->def->kind;
      if (k == OP_INPUT) return v->def->index;
      if (k == OP_TRANSPOSE || k == OP_RENAME || k == OP_SPLIT || k == OP_MERGE || k == OP_CAST ||
          ir_op_is_collective(k)) {
        v = v->def->operands[0];
        continue;
      }
      return -1;
    }
    const IrFunc *f = v->func;
    const Op *loop = f ? loop_of_body(f) : NULL;
    if (!loop) return -1;
    int pos = -1;
    for (int i = 0; i < f->ninputs; i++)
      if (f->inputs[i] == v) pos = i;
    if (pos < 0 || pos >= loop->noperands) return -1;
    v = loop->operands[pos];
  }
  return -1;
}

/* range[i]: the fewest rows of a table input i indexes. */
static void index_ranges(const IrFunc *f, int64_t *range, int n) {
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_LOOP && op->body) index_ranges(op->body, range, n);
    int64_t rows = 0;
    if (op->kind == OP_TAKE && op->noperands == 2 && op->operands[0]->type.rank > 0)
      rows = op->operands[0]->type.dims[0]->size; /* the table's rows */
    else if ((op->kind == OP_CROSS_ENTROPY || op->kind == OP_CROSS_ENTROPY_GRAD) && op->ndims > 0)
      rows = op->dims[0]->size; /* the classes */
    else
      continue;
    int i = trace_input(op->operands[1]);
    if (i >= 0 && i < n && rows > 0 && (range[i] == 0 || rows < range[i])) range[i] = rows;
  }
}

void interp_index_ranges(const IrModule *m, int64_t *range) {
  int n = interp_ninputs(m);
  for (int i = 0; i < n; i++) range[i] = 0;
  index_ranges(m->main, range, n);
}

static Tensor *random_tensor(const TensorType *t, uint64_t seed, double scale, double center, int64_t irange) {
  Tensor *r = tensor_new(t);
  if (!r) return NULL;
  uint64_t s = seed;
  for (int64_t i = 0; i < r->n; i++) {
    double u = uniform(&s);
    if (dtype_is_int(t->dtype)) r->data[i] = floor(u * (double)irange);
    else r->data[i] = interp_round_value(INTERP_DTYPE, t->dtype, center + (2 * u - 1) * scale);
  }
  return r;
}

/* Param i's values for `seed` (see interp.h). */
static Tensor *param_tensor(const IrModule *m, int i, uint64_t seed) {
  const IrParam *p = &m->params[i];
  int lead = p->stack_depth, own = p->type.rank - lead;
  double fan_in = own > 0 ? (double)p->type.dims[lead]->size : 1;
  uint64_t s = seed * 0x100000001b3ULL + (uint64_t)i * 2 + 2;
  return random_tensor(&p->type, s, 1 / sqrt(fan_in), own == 1 ? 1.0 : 0.0, 8);
}

Tensor **interp_random_inputs(const IrModule *m, uint64_t seed) {
  int n = interp_ninputs(m);
  Tensor **t = calloc((size_t)(n > 0 ? n : 1), sizeof *t);
  int64_t *range = calloc((size_t)(n > 0 ? n : 1), sizeof *range);
  if (!t || !range) {
    free(t);
    free(range);
    return NULL;
  }
  index_ranges(m->main, range, n);
  const StepInfo *si = m->step;
  for (int i = 0; i < n; i++) {
    uint64_t s = seed * 0x100000001b3ULL + (uint64_t)i * 2 + 1;
    const TensorType *ty = &m->main->inputs[i]->type;
    double scale = 1.0, center = 0.0;
    const IrParam *master = NULL;
    for (int k = 0; si && k < si->nparams; k++) {
      const StepParam *sp = &si->params[k];
      if (i == sp->in_v) scale = center = 0.005; /* a second moment: in [0, 0.01) */
      if (i == sp->in_m) scale = 0.05;
      if (i == sp->in_master && sp->param >= 0 && sp->param < m->nparams) master = &m->params[sp->param];
    }
    if (si && i == si->in_t) {
      t[i] = tensor_new(ty); /* adam's step count: the first step */
      if (t[i]) t[i]->data[0] = 1;
    } else if (master) {
      /* the master copy holds the param's own values (interp_random_params with this seed) */
      int p = (int)(master - m->params);
      t[i] = param_tensor(m, p, seed);
      if (t[i]) t[i]->type.dtype = ty->dtype;
    } else {
      t[i] = random_tensor(ty, s, scale, center, range[i] > 0 ? range[i] : 8);
    }
  }
  free(range);
  return t;
}

Tensor **interp_random_params(const IrModule *m, uint64_t seed) {
  int n = m->nparams;
  Tensor **t = calloc((size_t)(n > 0 ? n : 1), sizeof *t);
  if (!t) return NULL;
  for (int i = 0; i < n; i++) t[i] = param_tensor(m, i, seed);
  return t;
}

void interp_free_tensors(Tensor **t, int n) {
  if (!t) return;
  for (int i = 0; i < n; i++) tensor_free(t[i]);
  free(t);
}

/* ---- programs ---- */

int interp_load(InterpProgram *ip, const char *path, const char *const *defines, int ndefines, const char *layout,
                const char *mesh, const char *entry) {
  memset(ip, 0, sizeof *ip);
  arena_init(&ip->arena);
  CheckedProgram *cp = &ip->cp;
  int before = diag_error_count();
  SemaOptions so = {.mesh = mesh, .layout = layout, .entry = entry};
  so.overrides = ARENA_ARRAY(&ip->arena, DimOverride, ndefines + 1);
  for (int i = 0; i < ndefines; i++) {
    const char *eq = strchr(defines[i], '=');
    char *end = NULL;
    long long v = eq ? strtoll(eq + 1, &end, 10) : 0;
    if (!eq || eq == defines[i] || !end || *end || v <= 0) {
      fprintf(stderr, "shardc: -D needs name=N with N > 0, found '%s'\n", defines[i]);
      return EXIT_USAGE;
    }
    so.overrides[so.noverrides++] = (DimOverride){intern(defines[i], (size_t)(eq - defines[i])), v};
  }
  cp->parsed = parse_program(&ip->arena, path, stdlib_locate(NULL));
  if (!cp->parsed || cp->parsed->nfiles == 0 || diag_error_count() > before) return EXIT_PROGRAM_ERROR;
  return check_program(&ip->arena, cp->parsed, &so, cp);
}

void interp_unload(InterpProgram *ip) {
  arena_free(&ip->arena);
  memset(ip, 0, sizeof *ip);
}

bool interp_partition(InterpProgram *ip) {
  if (!ip->cp.ir || !ip->cp.prog) return false;
  return pipeline_run(ip->cp.ir, ip->cp.prog);
}
