/* ir.c: the IR's building blocks: the op table, values and ops, tensor types, shardings.
 *
 * In: requests from ir_build.c and from the passes (propagation, partitioning, autodiff). Out: ops
 * allocated from the module's arena, linked in program order in their function, each result a
 * Value with a fresh id. Nothing here knows about the language's rules; ir_build.c checks them.
 * Also the structural verifier every pass can run after itself (ir_verify). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "ir.h"

/* ---- the op table (ops.def) ---- */

/* fn and grad are read here only for whether an op has them (OpInfo.fn, OpInfo.dgrad). */
#define FN(e) true
#define NOFN false
#define D(e) true
#define GRAD_RULE false
static const OpInfo op_table[OP__COUNT] = {
#define OP(e, nm, ar, cl, fl, li, co, lo, at, cv, fnc, grc) \
  [e] = {.name = nm, .arity = ar, .cls = cl, .flags = fl, .lin = li, .cost = co, .lower = lo, .attrs = at, \
         .coll = cv, .fn = fnc, .dgrad = grc},
#include "ops.def"
};
#undef FN
#undef NOFN
#undef D
#undef GRAD_RULE

static const OpInfo no_op = {.name = "?", .arity = -2, .lin = LIN_NONE, .coll = NOCOLL};

const OpInfo *ir_op_info(OpKind k) {
  if ((int)k < 0 || k >= OP__COUNT) return &no_op;
  return &op_table[k];
}

const char *ir_op_name(OpKind k) { return ir_op_info(k)->name; }

bool ir_op_is_collective(OpKind k) { return ir_op_info(k)->cls == OC_COLLECTIVE; }

bool ir_op_is_elementwise(OpKind k) {
  OpClass c = (OpClass)ir_op_info(k)->cls;
  return c == OC_EW_UNARY || c == OC_EW_BINARY;
}

OpKind ir_coll_op(int k) {
  for (int e = 0; e < OP__COUNT; e++)
    if (op_table[e].coll == k && k != NOCOLL) return (OpKind)e;
  return OP_PERMUTE;
}

/* ---- modules, functions, values, ops ---- */

IrModule *ir_module_new(Arena *a, const Program *p) {
  IrModule *m = ARENA_NEW(a, IrModule);
  m->arena = a;
  m->prog = p;
  return m;
}

IrFunc *ir_func_new(IrModule *m, Name name, IrFunc *parent) {
  IrFunc *f = ARENA_NEW(m->arena, IrFunc);
  f->name = name;
  f->parent = parent;
  return f;
}

static Value *value_new(IrModule *m, IrFunc *f, TensorType t) {
  Value *v = ARENA_NEW(m->arena, Value);
  v->id = m->nvalues++;
  v->type = t;
  v->func = f;
  v->shard_source = SHARD_FREE;
  return v;
}

/* Appends v to f's inputs (growing the array in the arena). */
void ir_func_push_input(IrModule *m, IrFunc *f, Value *v) {
  if (f->ninputs == f->cap_inputs) {
    int ncap = f->cap_inputs ? f->cap_inputs * 2 : 8;
    Value **nd = ARENA_ARRAY(m->arena, Value *, ncap);
    if (f->ninputs) memcpy(nd, f->inputs, sizeof(Value *) * (size_t)f->ninputs);
    f->inputs = nd;
    f->cap_inputs = ncap;
  }
  f->inputs[f->ninputs++] = v;
}

/* A region input: def is NULL; the caller (loop building) says what it stands for. */
Value *ir_func_add_input(IrModule *m, IrFunc *f, TensorType t, Name name) {
  Value *v = value_new(m, f, t);
  v->name = name;
  ir_func_push_input(m, f, v);
  return v;
}

Op *ir_op_new(IrModule *m, IrFunc *f, OpKind kind, SrcLoc loc, Value **operands, int n,
              const TensorType *results, int nresults) {
  Op *op = ARENA_NEW(m->arena, Op);
  op->kind = kind;
  op->loc = loc;
  op->func = f;
  if (n > 0) {
    op->operands = ARENA_ARRAY(m->arena, Value *, n);
    memcpy(op->operands, operands, sizeof(Value *) * (size_t)n);
  }
  op->noperands = n;
  if (nresults > 0) {
    op->results = ARENA_ARRAY(m->arena, Value *, nresults);
    for (int i = 0; i < nresults; i++) {
      op->results[i] = value_new(m, f, results[i]);
      op->results[i]->def = op;
    }
  }
  op->nresults = nresults;
  op->dim_index = op->dim_index2 = -1;
  return op;
}

void ir_append(IrFunc *f, Op *op) {
  op->next = NULL;
  op->func = f;
  if (f->last) f->last->next = op;
  else f->first = op;
  f->last = op;
}

void ir_insert_before(IrFunc *f, Op *pos, Op *op) {
  if (!pos) {
    ir_append(f, op);
    return;
  }
  op->func = f;
  if (f->first == pos) {
    op->next = pos;
    f->first = op;
    return;
  }
  for (Op *o = f->first; o; o = o->next) {
    if (o->next == pos) {
      op->next = pos;
      o->next = op;
      return;
    }
  }
  ir_append(f, op); /* pos was not in f: keep the op rather than lose it */
}

void ir_remove(IrFunc *f, Op *op) {
  Op *prev = NULL;
  for (Op *o = f->first; o; prev = o, o = o->next) {
    if (o != op) continue;
    if (prev) prev->next = o->next;
    else f->first = o->next;
    if (f->last == o) f->last = prev;
    o->next = NULL;
    return;
  }
}

Op *ir_emit(IrModule *m, IrFunc *f, OpKind kind, SrcLoc loc, Value **operands, int n, TensorType result) {
  Op *op = ir_op_new(m, f, kind, loc, operands, n, &result, 1);
  ir_append(f, op);
  return op;
}

Value *ir_result(const Op *op) { return op && op->nresults > 0 ? op->results[0] : NULL; }

Value *ir_op_add_result(IrModule *m, Op *op, TensorType t) {
  Value **nr = ARENA_ARRAY(m->arena, Value *, op->nresults + 1);
  if (op->nresults) memcpy(nr, op->results, sizeof(Value *) * (size_t)op->nresults);
  Value *v = value_new(m, op->func, t);
  v->def = op;
  nr[op->nresults++] = v;
  op->results = nr;
  return v;
}

int ir_replace_uses(IrFunc *f, const Value *from, Value *to) {
  int n = 0;
  for (Op *o = f->first; o; o = o->next)
    for (int i = 0; i < o->noperands; i++)
      if (o->operands[i] == from) o->operands[i] = to, n++;
  for (int i = 0; i < f->noutputs; i++)
    if (f->outputs[i] == from) f->outputs[i] = to, n++;
  return n;
}

int ir_count_uses(const IrFunc *f, const Value *v) {
  int n = 0;
  for (const Op *o = f->first; o; o = o->next)
    for (int i = 0; i < o->noperands; i++) n += o->operands[i] == v;
  for (int i = 0; i < f->noutputs; i++) n += f->outputs[i] == v;
  return n;
}

/* ---- tensor types ---- */

int tensor_type_find(const TensorType *t, const Dim *d) {
  for (int i = 0; i < t->rank; i++)
    if (t->dims[i] == d) return i;
  return -1;
}

static double local_extent(const Value *v, int i) { return (double)(v->local[i] > 0 ? v->local[i] : v->type.dims[i]->size); }

DType ir_op_rate_dtype(const Op *op) {
  if (op->kind == OP_CONTRACT && op->noperands == 2) return op->operands[0]->type.dtype;
  return op->nresults > 0 ? op->results[0]->type.dtype : DT_NONE;
}

MatmulShape ir_matmul_shape(const Op *op) {
  const Value *a = op->operands[0], *b = op->operands[1];
  MatmulShape s = {1, 1, 1, 1};
  for (int i = 0; i < a->type.rank; i++) {
    const Dim *d = a->type.dims[i];
    bool in_b = tensor_type_find(&b->type, d) >= 0, contracted = false;
    for (int k = 0; k < op->ndims; k++) contracted |= op->dims[k] == d;
    if (!in_b) s.m *= local_extent(a, i);
    else if (contracted) s.k *= local_extent(a, i);
    else s.batch *= local_extent(a, i);
  }
  for (int i = 0; i < b->type.rank; i++)
    if (tensor_type_find(&a->type, b->type.dims[i]) < 0) s.n *= local_extent(b, i);
  return s;
}

/* Products saturate at INT64_MAX: a size that large is reported by whoever asks (memory fit
 * says "does not fit"), never wrapped into a small or negative number. */
static int64_t mul_sat(int64_t a, int64_t b) {
  if (a <= 0 || b <= 0) return 0;
  if (a > INT64_MAX / b) return INT64_MAX;
  return a * b;
}

int64_t tensor_type_elements(const TensorType *t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) n = mul_sat(n, t->dims[i] ? t->dims[i]->size : 0);
  return n;
}

int64_t tensor_type_bytes(const TensorType *t) {
  return mul_sat(tensor_type_elements(t), dtype_bytes(t->dtype));
}

bool tensor_type_same_dims(const TensorType *a, const TensorType *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (tensor_type_find(b, a->dims[i]) < 0) return false;
  return true;
}

bool tensor_type_equal(const TensorType *a, const TensorType *b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->dims[i] != b->dims[i]) return false;
  return true;
}

TensorType tensor_type_from_spec(const TypeSpec *s) {
  TensorType t = {.dtype = s->dtype, .rank = s->rank};
  for (int i = 0; i < s->rank && i < MAX_RANK; i++) t.dims[i] = s->dims[i];
  return t;
}

/* ---- formatting ---- */

/* Appends to a fixed buffer, truncating at its end (always NUL-terminated). */
typedef struct Buf {
  char *s;
  size_t n, len;
} Buf;

static void buf_put(Buf *b, const char *text) {
  size_t k = strlen(text);
  if (b->len + 1 >= b->n) return;
  size_t room = b->n - b->len - 1;
  size_t c = k < room ? k : room;
  memcpy(b->s + b->len, text, c);
  b->len += c;
  b->s[b->len] = 0;
}

static void buf_axis(Buf *b, const Mesh *m, int a) {
  if (m && a >= 0 && a < m->naxes && m->axes[a].name) {
    buf_put(b, m->axes[a].name);
  } else {
    char tmp[16];
    snprintf(tmp, sizeof tmp, "#%d", a);
    buf_put(b, tmp);
  }
}

char *tensor_type_format(char *buf, size_t n, const TensorType *t) {
  return sharding_format(buf, n, t, NULL, NULL);
}

/* bf16[batch@data, hidden@model], f32[seq@(ctx, model)], then {sum: model} or {sum: (data, model)}
 * when the value is an unreduced partial sum. */
char *sharding_format(char *buf, size_t n, const TensorType *t, const Sharding *s, const Mesh *m) {
  if (!buf || n == 0) return buf;
  buf[0] = 0;
  Buf b = {buf, n, 0};
  buf_put(&b, t->dtype == DT_NONE ? "?" : dtype_name(t->dtype));
  buf_put(&b, "[");
  for (int i = 0; i < t->rank; i++) {
    if (i) buf_put(&b, ", ");
    buf_put(&b, t->dims[i] && t->dims[i]->name ? t->dims[i]->name : "?");
    int na = s ? s->naxes[i] : 0;
    if (na > MAX_AXES_PER_DIM) na = MAX_AXES_PER_DIM;
    if (na == 0) continue;
    buf_put(&b, "@");
    if (na > 1) buf_put(&b, "(");
    for (int k = 0; k < na; k++) {
      if (k) buf_put(&b, ", ");
      buf_axis(&b, m, s->axes[i][k]);
    }
    if (na > 1) buf_put(&b, ")");
  }
  buf_put(&b, "]");
  if (s && s->partial) {
    int cnt = 0;
    for (int a = 0; a < 16; a++) cnt += (s->partial >> a) & 1;
    buf_put(&b, "{sum: ");
    if (cnt > 1) buf_put(&b, "(");
    int k = 0;
    for (int a = 0; a < 16; a++) {
      if (!((s->partial >> a) & 1)) continue;
      if (k++) buf_put(&b, ", ");
      buf_axis(&b, m, a);
    }
    if (cnt > 1) buf_put(&b, ")");
    buf_put(&b, "}");
  }
  return buf;
}

/* The extent of dim `dim` on one device: ceil(size / product of the dim's axes' sizes). Whether it
 * divides evenly is checked where shardings are chosen; here an uneven split rounds up (the
 * largest shard) so that memory is never underestimated. */
int64_t sharding_local_extent(const TensorType *t, const Sharding *s, const Mesh *m, int dim) {
  if (dim < 0 || dim >= t->rank || !t->dims[dim]) return 0;
  int64_t size = t->dims[dim]->size;
  if (!s || !m) return size;
  int64_t parts = 1;
  int na = s->naxes[dim] > MAX_AXES_PER_DIM ? MAX_AXES_PER_DIM : s->naxes[dim];
  for (int k = 0; k < na; k++) {
    int a = s->axes[dim][k];
    if (a >= 0 && a < m->naxes && m->axes[a].size > 0) parts = mul_sat(parts, m->axes[a].size);
  }
  if (parts <= 1) return size;
  return size / parts + (size % parts != 0);
}

int64_t sharding_local_bytes(const TensorType *t, const Sharding *s, const Mesh *m) {
  int64_t n = dtype_bytes(t->dtype);
  for (int i = 0; i < t->rank; i++) n = mul_sat(n, sharding_local_extent(t, s, m, i));
  return n;
}

/* ---- the verifier ---- */

typedef struct Verify {
  const IrModule *m;
  FILE *err;
  unsigned char *defined; /* by value id */
  int nvalues;
  int problems;
} Verify;

static void vfail(Verify *v, const IrFunc *f, const Op *op, const char *what, int arg) {
  v->problems++;
  if (!v->err) return;
  fprintf(v->err, "ir_verify: %s: ", f && f->name ? f->name : "?");
  if (op) fprintf(v->err, "%s (line %d): ", ir_op_name(op->kind), op->loc.line);
  fprintf(v->err, what, arg);
  fputc('\n', v->err);
}

static bool vmark(Verify *v, const Value *x) {
  if (!x || x->id < 0 || x->id >= v->nvalues) return false;
  if (v->defined[x->id]) return false;
  v->defined[x->id] = 1;
  return true;
}

static bool vdefined(Verify *v, const Value *x) {
  return x && x->id >= 0 && x->id < v->nvalues && v->defined[x->id];
}

static TensorType drop_first(const TensorType *t) {
  TensorType r = {.dtype = t->dtype, .rank = t->rank > 0 ? t->rank - 1 : 0};
  for (int i = 1; i < t->rank; i++) r.dims[i - 1] = t->dims[i];
  return r;
}

static void verify_func(Verify *v, const IrFunc *f) {
  /* A region's inputs are defined on entry; main's are OP_INPUT results, defined by their ops. */
  for (int i = 0; i < f->ninputs; i++) {
    const Value *x = f->inputs[i];
    if (!x || x->func != f) vfail(v, f, NULL, "input %d does not belong to the function", i);
    else if (x->def && (x->def->kind != OP_INPUT || f->parent)) vfail(v, f, NULL, "input %d has a defining op", i);
    else if (!x->def && !vmark(v, x)) vfail(v, f, NULL, "input %d defined twice", i);
  }
  for (const Op *op = f->first; op; op = op->next) {
    if (op->func != f) vfail(v, f, op, "op's func is not its list's function%.0d", 0);
    int ar = ir_op_info(op->kind)->arity;
    if (ar == -2) vfail(v, f, op, "bad op kind %d", (int)op->kind);
    else if (ar >= 0 && op->noperands != ar) vfail(v, f, op, "has %d operands", op->noperands);
    for (int i = 0; i < op->noperands; i++) {
      const Value *x = op->operands[i];
      if (!x) vfail(v, f, op, "operand %d is NULL", i);
      else if (x->func != f) vfail(v, f, op, "operand %d comes from another region", i);
      else if (!vdefined(v, x)) vfail(v, f, op, "operand %d is used before its definition", i);
    }
    if (op->kind != OP_LOOP && op->kind != OP_PIPELINE && op->nresults != 1)
      vfail(v, f, op, "has %d results", op->nresults);
    if (op->kind == OP_PIPELINE) {
      const PipeInfo *pi = op->pipe;
      if (!pi) vfail(v, f, op, "pipeline without its info%.0d", 0);
      for (int r = 0; pi && r < PR__COUNT; r++) {
        const IrFunc *R = pi->region[r];
        if (!R) continue;
        if (R->parent != f) vfail(v, f, op, "region %d's parent is not the function", r);
        for (int i = 0; i < R->ninputs; i++) {
          PipeSlot sl = pi->in[r][i];
          if ((sl.kind == PIN_ENV || sl.kind == PIN_CHUNK) && (sl.index < 0 || sl.index >= op->noperands))
            vfail(v, f, op, "a region input names operand %d", sl.index);
        }
        for (int i = 0; i < R->noutputs; i++) {
          PipeSlot sl = pi->out[r][i];
          if ((sl.kind == POUT_ACC || sl.kind == POUT_RESULT) && (sl.index < 0 || sl.index >= op->nresults))
            vfail(v, f, op, "a region output names result %d", sl.index);
        }
        verify_func(v, R);
      }
    }
    if (op->kind == OP_LOOP) {
      const IrFunc *body = op->body;
      if (!body) {
        vfail(v, f, op, "loop without a body%.0d", 0);
      } else {
        int ninv = op->noperands - op->nslices - op->ncarried;
        if (body->parent != f) vfail(v, f, op, "loop body's parent is not the function%.0d", 0);
        if (ninv < 0 || op->nslices < 0 || op->ncarried < 0)
          vfail(v, f, op, "bad operand groups (invariants %d)", ninv);
        if (body->ninputs != op->noperands) vfail(v, f, op, "body has %d inputs", body->ninputs);
        if (op->nstacked < 0 || body->noutputs != op->ncarried + op->nstacked ||
            op->nresults != op->ncarried + op->nstacked)
          vfail(v, f, op, "carried %d but outputs/results differ", op->ncarried);
        if (op->stack_dim && op->count != op->stack_dim->size)
          vfail(v, f, op, "count differs from the stacking dim's size%.0d", 0);
        for (int i = 0; i < op->noperands && i < body->ninputs; i++) {
          const Value *outer = op->operands[i], *in = body->inputs[i];
          if (!outer || !in) continue;
          TensorType want = outer->type;
          if (i < op->nslices) {
            if (outer->type.rank < 1 || outer->type.dims[0] != op->stack_dim)
              vfail(v, f, op, "slice operand %d does not lead with the stacking dim", i);
            want = drop_first(&outer->type);
          }
          if (!tensor_type_equal(&want, &in->type)) vfail(v, f, op, "body input %d has the wrong type", i);
        }
        for (int i = 0; i < op->ncarried && i < body->noutputs && i < op->nresults; i++) {
          const Value *in = body->inputs[op->nslices + i], *out = body->outputs[i];
          if (!out || !op->results[i]) continue;
          if (!tensor_type_equal(&in->type, &out->type) || !tensor_type_equal(&out->type, &op->results[i]->type))
            vfail(v, f, op, "carried value %d changes type", i);
        }
        for (int i = op->ncarried; i < op->ncarried + op->nstacked && i < body->noutputs && i < op->nresults; i++) {
          const Value *out = body->outputs[i], *res = op->results[i];
          if (!out || !res) continue;
          if (res->type.rank < 1 || res->type.dims[0] != op->stack_dim) {
            vfail(v, f, op, "stacked result %d does not lead with the stacking dim", i);
            continue;
          }
          TensorType want = drop_first(&res->type);
          if (!tensor_type_equal(&want, &out->type)) vfail(v, f, op, "stacked result %d has the wrong type", i);
        }
        verify_func(v, body);
      }
    }
    for (int i = 0; i < op->nresults; i++) {
      const Value *x = op->results[i];
      if (!x) vfail(v, f, op, "result %d is NULL", i);
      else if (x->def != op || x->func != f) vfail(v, f, op, "result %d does not point back", i);
      else if (!vmark(v, x)) vfail(v, f, op, "result %d defined twice", i);
    }
  }
  for (int i = 0; i < f->noutputs; i++)
    if (!f->outputs[i] || f->outputs[i]->func != f || !vdefined(v, f->outputs[i]))
      vfail(v, f, NULL, "output %d is not defined in the function", i);
}

bool ir_verify(const IrModule *m, FILE *err) {
  if (!m || !m->main) return false;
  Verify v = {.m = m, .err = err, .nvalues = m->nvalues};
  v.defined = calloc((size_t)(m->nvalues > 0 ? m->nvalues : 1), 1);
  if (!v.defined) return false;
  verify_func(&v, m->main);
  free(v.defined);
  return v.problems == 0;
}

uint16_t ir_batch_axes(const IrModule *m) {
  uint16_t ax = 0;
  for (int i = 0; m && m->main && i < m->main->ninputs; i++) {
    const Value *v = m->main->inputs[i];
    for (int d = 0; d < v->type.rank; d++)
      if (v->type.dims[d]->name && strcmp(v->type.dims[d]->name, "batch") == 0)
        for (int k = 0; k < v->sharding.naxes[d]; k++) ax |= (uint16_t)(1u << v->sharding.axes[d][k]);
  }
  return ax;
}
