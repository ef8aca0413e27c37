/* test_interp.c: the reference interpreter (compiler/interp*.c) against values worked out by hand.
 *
 * Four groups:
 *   ops        every kernel on tiny tensors built as IR by hand (ir_emit), each compared with
 *              numbers computed here from the op's definition (not copied from a run); the
 *              gradient ops also against central finite differences of their forward op;
 *              rounding to bf16 / f16 / f8; run-time errors (take out of range, bad labels).
 *   fusion     fused attention (ir_fuse_attention on a hand-built chain) equals the unfused chain.
 *   programs   samples/mlp.shard and a small LLaMA (tests/unit/interp/llama_small.shard) run
 *              globally without NaN; loops with stacked outputs and reverse iteration.
 *   spmd       collectives on hand-made shardings over a 2 x 2 mesh (expected blocks by hand);
 *              then the real pipeline (propagate + partition) on the mlp under every layout and
 *              mesh of its file and on the LLaMA under six layouts and three meshes (a pipeline
 *              among them): per-device results reassembled must equal the global run; and the
 *              check must fail when a collective is broken on purpose.
 * Prints PASS/FAIL per case and `N passed, N failed`; exits 1 on any failure. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "interp.h"
#include "ir.h"
#include "step.h"
#include "unit_pipeline.h"
#include "unit_test.h"

#ifndef INTERP_TEST_DIR
#define INTERP_TEST_DIR "tests/unit/interp"
#endif
#ifndef SHARDC_SAMPLES
#define SHARDC_SAMPLES "samples"
#endif

/* ---- hand-built modules ---- */

typedef struct Mod {
  Arena arena;
  IrModule *m;
  IrFunc *f;
  Tensor *in[16];
  int nin;
} Mod;

static void mod_init(Mod *M) {
  memset(M, 0, sizeof *M);
  arena_init(&M->arena);
  M->m = ir_module_new(&M->arena, NULL);
  M->f = M->m->main = ir_func_new(M->m, "main", NULL);
  M->f->inputs = ARENA_ARRAY(&M->arena, Value *, 16);
  M->f->cap_inputs = 16;
  M->f->outputs = ARENA_ARRAY(&M->arena, Value *, 16);
}

static void mod_free(Mod *M) {
  for (int i = 0; i < M->nin; i++) tensor_free(M->in[i]);
  arena_free(&M->arena);
}

static Dim *dim(Mod *M, const char *name, int64_t size) {
  Dim *d = ARENA_NEW(&M->arena, Dim);
  d->name = name;
  d->size = size;
  return d;
}

static TensorType tt(DType dt, int rank, ...) {
  TensorType t = {.dtype = dt, .rank = rank};
  va_list ap;
  va_start(ap, rank);
  for (int i = 0; i < rank; i++) t.dims[i] = va_arg(ap, Dim *);
  va_end(ap);
  return t;
}

/* An input of type t holding `data` (row-major; NULL: zeros). */
static Value *input(Mod *M, TensorType t, const double *data) {
  Op *op = ir_emit(M->m, M->f, OP_INPUT, (SrcLoc){0}, NULL, 0, t);
  op->index = M->f->ninputs;
  M->f->inputs[M->f->ninputs++] = op->results[0];
  Tensor *x = tensor_new(&t);
  if (data)
    for (int64_t i = 0; i < x->n; i++) x->data[i] = data[i];
  M->in[M->nin++] = x;
  return op->results[0];
}

static Op *emit(Mod *M, IrFunc *f, OpKind k, Value **ops, int n, TensorType t, Dim **dims, int nd) {
  Op *op = ir_emit(M->m, f ? f : M->f, k, (SrcLoc){0}, ops, n, t);
  if (nd > 0) {
    op->dims = ARENA_ARRAY(&M->arena, Dim *, nd);
    memcpy(op->dims, dims, sizeof(Dim *) * (size_t)nd);
    op->ndims = nd;
  }
  return op;
}

static Value *op1(Mod *M, OpKind k, Value *a, TensorType t) { return emit(M, NULL, k, &a, 1, t, NULL, 0)->results[0]; }

static Value *op2(Mod *M, OpKind k, Value *a, Value *b, TensorType t) {
  Value *ops[2] = {a, b};
  return emit(M, NULL, k, ops, 2, t, NULL, 0)->results[0];
}

static Value *cnst(Mod *M, double x, DType dt) {
  Op *op = emit(M, NULL, OP_CONST, NULL, 0, tt(dt, 0), NULL, 0);
  op->scalar = x;
  return op->results[0];
}

static void output(Mod *M, Value *v) { M->f->outputs[M->f->noutputs++] = v; }

/* Runs main (inputs M->in, no params); the first output, or NULL with the error in st. */
static Tensor *run_mod(Mod *M, InterpPrecision p, InterpStats *st) {
  InterpOptions o = {.precision = p};
  Tensor *out[16] = {0};
  if (!interp_run(M->m, &o, M->in, NULL, out, st)) return NULL;
  for (int i = 1; i < M->f->noutputs; i++) tensor_free(out[i]);
  return out[0];
}

/* The output equals want[] within tol (relative to max(1, |want|)). */
static void expect_values(const Tensor *t, const double *want, int64_t n, double tol, const char *what) {
  if (!t) {
    ut_fail("%s: no result", what);
    return;
  }
  if (t->n != n) {
    ut_fail("%s: %lld elements, expected %lld", what, (long long)t->n, (long long)n);
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    double a = t->data[i], b = want[i];
    bool same = (isnan(a) && isnan(b)) || a == b || fabs(a - b) <= tol * fmax(1, fabs(b));
    if (!same) {
      ut_fail("%s: element %lld is %.17g, expected %.17g", what, (long long)i, a, b);
      return;
    }
  }
}

/* Builds f(inputs) -> one output with `build`, runs it in f64 and compares. */
#define RUN_EXPECT(M, want, tol, what)                                      \
  do {                                                                     \
    InterpStats st_;                                                       \
    Tensor *r_ = run_mod(&(M), INTERP_F64, &st_);                          \
    if (!r_) ut_fail("%s: run failed: %s", what, st_.error);               \
    else expect_values(r_, want, (int64_t)ARRAY_LEN(want), tol, what);     \
    tensor_free(r_);                                                       \
  } while (0)

/* ---- ops against hand-computed values ---- */

static void test_contract(void) {
  ut_begin("op.contract");
  Mod M;
  mod_init(&M);
  Dim *i = dim(&M, "i", 2), *k = dim(&M, "k", 3), *j = dim(&M, "j", 2);
  double a[] = {1, 2, 3, 4, 5, 6}, b[] = {1, 0, 0, 1, 1, 1};
  Value *va = input(&M, tt(DT_F32, 2, i, k), a), *vb = input(&M, tt(DT_F32, 2, k, j), b);
  Value *ops[2] = {va, vb};
  output(&M, emit(&M, NULL, OP_CONTRACT, ops, 2, tt(DT_F32, 2, i, j), &k, 1)->results[0]);
  /* [[1,2,3],[4,5,6]] . [[1,0],[0,1],[1,1]] = [[1+3, 2+3], [4+6, 5+6]] */
  double want[] = {4, 5, 10, 11};
  RUN_EXPECT(M, want, 0, "a @ b");
  mod_free(&M);

  /* a batch dim shared and kept, result in another order: r[j, b] = sum_k a[b, k] c[b, k, j] */
  mod_init(&M);
  Dim *bd = dim(&M, "b", 2), *kk = dim(&M, "k", 2), *jj = dim(&M, "j", 1);
  double a2[] = {1, 2, 3, 4}, c2[] = {1, 1, 2, 0};
  Value *x = input(&M, tt(DT_F32, 2, bd, kk), a2), *y = input(&M, tt(DT_F32, 3, bd, kk, jj), c2);
  Value *o2[2] = {x, y};
  output(&M, emit(&M, NULL, OP_CONTRACT, o2, 2, tt(DT_F32, 2, jj, bd), &kk, 1)->results[0]);
  double want2[] = {1 * 1 + 2 * 1, 3 * 2 + 4 * 0};
  RUN_EXPECT(M, want2, 0, "batched contract");
  mod_free(&M);
  ut_end();
}

static void test_elementwise(void) {
  ut_begin("op.elementwise");
  Mod M;
  mod_init(&M);
  Dim *i = dim(&M, "i", 2), *j = dim(&M, "j", 3);
  double x[] = {1, 2}, y[] = {10, 20, 30};
  Value *vx = input(&M, tt(DT_F32, 1, i), x), *vy = input(&M, tt(DT_F32, 1, j), y);
  output(&M, op2(&M, OP_ADD, vx, vy, tt(DT_F32, 2, i, j)));
  double want[] = {11, 21, 31, 12, 22, 32}; /* x's dims, then y's new ones */
  RUN_EXPECT(M, want, 0, "x[i] + y[j]");
  mod_free(&M);

  struct {
    OpKind k;
    double want[4];
  } bins[] = {{OP_SUB, {-9, -18, 1, 0}}, {OP_MUL, {10, 40, 6, 4}}, {OP_DIV, {0.1, 0.1, 1.5, 1}}};
  for (size_t t = 0; t < ARRAY_LEN(bins); t++) {
    mod_init(&M);
    Dim *n = dim(&M, "n", 4);
    double a[] = {1, 2, 3, 2}, b[] = {10, 20, 2, 2};
    Value *va = input(&M, tt(DT_F32, 1, n), a), *vb = input(&M, tt(DT_F32, 1, n), b);
    output(&M, op2(&M, bins[t].k, va, vb, tt(DT_F32, 1, n)));
    RUN_EXPECT(M, bins[t].want, 1e-15, ir_op_name(bins[t].k));
    mod_free(&M);
  }

  /* a rank-0 constant broadcasts; neg */
  mod_init(&M);
  Dim *n = dim(&M, "n", 3);
  double a[] = {1, -2, 0.5};
  Value *va = input(&M, tt(DT_F32, 1, n), a);
  Value *s = op2(&M, OP_MUL, va, cnst(&M, 2, DT_F32), tt(DT_F32, 1, n));
  output(&M, op1(&M, OP_NEG, s, tt(DT_F32, 1, n)));
  double want3[] = {-2, 4, -1};
  RUN_EXPECT(M, want3, 0, "-(x * 2)");
  mod_free(&M);

  /* integer division truncates toward zero */
  mod_init(&M);
  n = dim(&M, "n", 3);
  double p[] = {7, -7, 6}, q[] = {2, 2, 3};
  Value *vp = input(&M, tt(DT_I32, 1, n), p), *vq = input(&M, tt(DT_I32, 1, n), q);
  output(&M, op2(&M, OP_DIV, vp, vq, tt(DT_I32, 1, n)));
  double want4[] = {3, -3, 2};
  RUN_EXPECT(M, want4, 0, "i32 division");
  mod_free(&M);
  ut_end();
}

static void test_unary(void) {
  ut_begin("op.unary");
  struct {
    OpKind k;
    double x, want;
  } cases[] = {
    {OP_EXP, 0, 1},         {OP_EXP, 1, 2.718281828459045},
    {OP_LOG, 1, 0},         {OP_LOG, 2.718281828459045, 1},
    {OP_SQRT, 4, 2},        {OP_RSQRT, 4, 0.5},
    {OP_TANH, 0, 0},        {OP_SIGMOID, 0, 0.5},
    {OP_RELU, -1, 0},       {OP_RELU, 2, 2},
    /* gelu (erf form) = x Phi(x); Phi(1) = 0.8413447460685429 (standard normal table) */
    {OP_GELU, 0, 0},        {OP_GELU, 1, 0.8413447460685429},
    {OP_GELU, -1, -(1 - 0.8413447460685429)},
    /* silu(x) = x sigmoid(x); sigmoid(1) = 1 / (1 + 1/e) = 0.7310585786300049 */
    {OP_SILU, 1, 0.7310585786300049}, {OP_SILU, 0, 0},
  };
  for (size_t c = 0; c < ARRAY_LEN(cases); c++) {
    Mod M;
    mod_init(&M);
    Dim *n = dim(&M, "n", 1);
    double x[] = {cases[c].x};
    Value *v = input(&M, tt(DT_F32, 1, n), x);
    output(&M, op1(&M, cases[c].k, v, tt(DT_F32, 1, n)));
    double want[] = {cases[c].want};
    char what[64];
    snprintf(what, sizeof what, "%s(%g)", ir_op_name(cases[c].k), cases[c].x);
    RUN_EXPECT(M, want, 1e-14, what);
    mod_free(&M);
  }
  ut_end();
}

static void test_reductions(void) {
  ut_begin("op.reductions");
  /* x = [[1, 2, 3], [4, 5, 6]] */
  struct {
    OpKind k;
    int over; /* 1: j, 2: i, 3: both */
    double want[3];
    int n;
  } cases[] = {{OP_SUM, 1, {6, 15}, 2}, {OP_MEAN, 2, {2.5, 3.5, 4.5}, 3}, {OP_MAX, 3, {6}, 1}, {OP_MAX, 1, {3, 6}, 2}};
  for (size_t c = 0; c < ARRAY_LEN(cases); c++) {
    Mod M;
    mod_init(&M);
    Dim *i = dim(&M, "i", 2), *j = dim(&M, "j", 3);
    double x[] = {1, 2, 3, 4, 5, 6};
    Value *v = input(&M, tt(DT_F32, 2, i, j), x);
    Dim *over[2];
    int nover = 0;
    if (cases[c].over & 2) over[nover++] = i;
    if (cases[c].over & 1) over[nover++] = j;
    TensorType rt = cases[c].over == 3 ? tt(DT_F32, 0) : cases[c].over == 1 ? tt(DT_F32, 1, i) : tt(DT_F32, 1, j);
    output(&M, emit(&M, NULL, cases[c].k, &v, 1, rt, over, nover)->results[0]);
    InterpStats st;
    Tensor *r = run_mod(&M, INTERP_F64, &st);
    expect_values(r, cases[c].want, cases[c].n, 1e-15, ir_op_name(cases[c].k));
    tensor_free(r);
    mod_free(&M);
  }
  ut_end();
}

static void test_softmax_norms(void) {
  ut_begin("op.softmax_and_norms");
  Mod M;
  mod_init(&M);
  Dim *r = dim(&M, "r", 2), *j = dim(&M, "j", 2);
  /* row 0: exp(0) : exp(log 3) = 1 : 3; row 1 fully masked: zeros by definition */
  double x[] = {0, log(3.0), -INFINITY, -INFINITY};
  Value *v = input(&M, tt(DT_F32, 2, r, j), x);
  output(&M, emit(&M, NULL, OP_SOFTMAX, &v, 1, tt(DT_F32, 2, r, j), &j, 1)->results[0]);
  double want[] = {0.25, 0.75, 0, 0};
  RUN_EXPECT(M, want, 1e-15, "softmax");
  mod_free(&M);

  /* rmsnorm([3, 4]): mean square 12.5; with scale [1, 2] */
  mod_init(&M);
  Dim *d = dim(&M, "d", 2);
  double xs[] = {3, 4}, sc[] = {1, 2};
  Value *vx = input(&M, tt(DT_BF16, 1, d), xs), *vs = input(&M, tt(DT_F32, 1, d), sc);
  Value *ops[3] = {vx, vs};
  output(&M, emit(&M, NULL, OP_RMSNORM, ops, 2, tt(DT_BF16, 1, d), &d, 1)->results[0]);
  double rn = 1 / sqrt(12.5 + 1e-5);
  double want2[] = {3 * rn, 8 * rn};
  RUN_EXPECT(M, want2, 1e-15, "rmsnorm (eps 1e-5)");
  mod_free(&M);

  /* layernorm([1, 3]): mean 2, variance 1; scale [2, 2], bias [1, 0] */
  mod_init(&M);
  d = dim(&M, "d", 2);
  double xl[] = {1, 3}, sl[] = {2, 2}, bl[] = {1, 0};
  Value *a = input(&M, tt(DT_F32, 1, d), xl), *s = input(&M, tt(DT_F32, 1, d), sl), *b = input(&M, tt(DT_F32, 1, d), bl);
  Value *o3[3] = {a, s, b};
  output(&M, emit(&M, NULL, OP_LAYERNORM, o3, 3, tt(DT_F32, 1, d), &d, 1)->results[0]);
  double ln = 1 / sqrt(1 + 1e-5);
  double want3[] = {1 - 2 * ln, 2 * ln};
  RUN_EXPECT(M, want3, 1e-15, "layernorm (eps 1e-5)");
  mod_free(&M);
  ut_end();
}

static void test_reshapes(void) {
  ut_begin("op.rename_split_merge_transpose");
  Mod M;
  mod_init(&M);
  Dim *p = dim(&M, "p", 2), *d = dim(&M, "d", 4), *a = dim(&M, "a", 2), *b = dim(&M, "b", 2);
  double x[] = {0, 1, 2, 3, 4, 5, 6, 7};
  Value *v = input(&M, tt(DT_F32, 2, p, d), x);
  Dim *sd[3] = {d, a, b};
  output(&M, emit(&M, NULL, OP_SPLIT, &v, 1, tt(DT_F32, 3, p, a, b), sd, 3)->results[0]);
  /* split d -> (a, b): d = 2 a + b, in place: row-major order unchanged */
  double want[] = {0, 1, 2, 3, 4, 5, 6, 7};
  RUN_EXPECT(M, want, 0, "split");
  mod_free(&M);

  /* merge (a, b) -> d of x[a=2, p=2, b=3] with x[a, p, b] = 6a + 3p + b: d takes a's place,
   * d = 3a + b, so r[d, p] = 6a + 3p + b */
  mod_init(&M);
  a = dim(&M, "a", 2), p = dim(&M, "p", 2), b = dim(&M, "b", 3), d = dim(&M, "d", 6);
  double xm[12];
  for (int i = 0; i < 12; i++) xm[i] = i;
  v = input(&M, tt(DT_F32, 3, a, p, b), xm);
  Dim *md[3] = {a, b, d};
  output(&M, emit(&M, NULL, OP_MERGE, &v, 1, tt(DT_F32, 2, d, p), md, 3)->results[0]);
  double wantm[] = {0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11};
  RUN_EXPECT(M, wantm, 0, "merge (a, b) -> d");
  mod_free(&M);

  /* merge listed minor-first: (b, a) -> d means d = 2b + a */
  mod_init(&M);
  a = dim(&M, "a", 2), p = dim(&M, "p", 2), b = dim(&M, "b", 3), d = dim(&M, "d", 6);
  v = input(&M, tt(DT_F32, 3, a, p, b), xm);
  Dim *md2[3] = {b, a, d};
  output(&M, emit(&M, NULL, OP_MERGE, &v, 1, tt(DT_F32, 2, d, p), md2, 3)->results[0]);
  /* d = 0..5 -> (b, a) = (0,0) (0,1) (1,0) (1,1) (2,0) (2,1); value 6a + 3p + b */
  double wantm2[] = {0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11};
  RUN_EXPECT(M, wantm2, 0, "merge (b, a) -> d");
  mod_free(&M);

  /* transpose and rename */
  mod_init(&M);
  Dim *i = dim(&M, "i", 2), *j = dim(&M, "j", 3), *k = dim(&M, "k", 3);
  double xt[] = {1, 2, 3, 4, 5, 6};
  v = input(&M, tt(DT_F32, 2, i, j), xt);
  Value *t = op1(&M, OP_TRANSPOSE, v, tt(DT_F32, 2, j, i));
  Dim *rn[2] = {j, k};
  Value *rr = emit(&M, NULL, OP_RENAME, &t, 1, tt(DT_F32, 2, k, i), rn, 2)->results[0];
  output(&M, rr);
  double wantt[] = {1, 4, 2, 5, 3, 6};
  RUN_EXPECT(M, wantt, 0, "transpose + rename");
  mod_free(&M);
  ut_end();
}

static void test_take_causal_cast(void) {
  ut_begin("op.take_causal_cast");
  Mod M;
  mod_init(&M);
  Dim *vv = dim(&M, "v", 3), *e = dim(&M, "e", 2), *s = dim(&M, "s", 4);
  double table[] = {10, 11, 20, 21, 30, 31}, idx[] = {2, 0, 1, 2};
  Value *t = input(&M, tt(DT_BF16, 2, vv, e), table), *ix = input(&M, tt(DT_I32, 1, s), idx);
  output(&M, op2(&M, OP_TAKE, t, ix, tt(DT_BF16, 2, s, e)));
  double want[] = {30, 31, 10, 11, 20, 21, 30, 31};
  RUN_EXPECT(M, want, 0, "take");
  /* an index out of range is a run-time error, not a wrong read */
  M.in[1]->data[2] = 3;
  InterpStats st;
  Tensor *r = run_mod(&M, INTERP_F64, &st);
  UT_CHECK(!r && strstr(st.error, "out of range"), "take with index 3 of 3 rows: %s", r ? "ran" : st.error);
  tensor_free(r);
  M.in[1]->data[2] = -1;
  r = run_mod(&M, INTERP_F64, &st);
  UT_CHECK(!r && strstr(st.error, "out of range"), "take with index -1: %s", r ? "ran" : st.error);
  tensor_free(r);
  mod_free(&M);

  /* causal(s, q, k): -inf where k > q */
  mod_init(&M);
  Dim *q = dim(&M, "q", 3), *k = dim(&M, "k", 3);
  Value *sc = input(&M, tt(DT_F32, 2, q, k), NULL);
  Dim *qk[2] = {q, k};
  output(&M, emit(&M, NULL, OP_CAUSAL, &sc, 1, tt(DT_F32, 2, q, k), qk, 2)->results[0]);
  double ni = -INFINITY;
  double wantc[] = {0, ni, ni, 0, 0, ni, 0, 0, 0};
  RUN_EXPECT(M, wantc, 0, "causal");
  mod_free(&M);

  /* casts: float -> i32 truncates and saturates (NaN -> 0) */
  mod_init(&M);
  Dim *n = dim(&M, "n", 5);
  double xc[] = {1.7, -1.7, 3e9, -3e9, NAN};
  Value *xv = input(&M, tt(DT_F32, 1, n), xc);
  output(&M, op1(&M, OP_CAST, xv, tt(DT_I32, 1, n)));
  double wanti[] = {1, -1, 2147483647, -2147483648.0, 0};
  RUN_EXPECT(M, wanti, 0, "cast to i32");
  mod_free(&M);
  ut_end();
}

/* Rounding after each op under each precision. */
static void test_rounding(void) {
  ut_begin("rounding");
  struct {
    DType dt;
    InterpPrecision p;
    double x, want;
  } cases[] = {
    /* bf16: 8 significant bits. 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even -> 1 */
    {DT_BF16, INTERP_DTYPE, 1 + 0x1p-8, 1},
    /* 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: to the even one, 1 + 2^-6 */
    {DT_BF16, INTERP_DTYPE, 1 + 3 * 0x1p-8, 1 + 0x1p-6},
    /* 3e38 = 1.76324 * 2^127 = (1 + 97.69/128) 2^127 -> (1 + 98/128) 2^127 */
    {DT_BF16, INTERP_DTYPE, 3.0e38, (1 + 98.0 / 128) * 0x1p127},
    {DT_BF16, INTERP_DTYPE, 3.4e38, INFINITY},
    /* f16: 11 significant bits, max 65504, subnormals from 2^-24 */
    {DT_F16, INTERP_DTYPE, 1 + 0x1p-11, 1},
    {DT_F16, INTERP_DTYPE, 70000, INFINITY},
    {DT_F16, INTERP_DTYPE, 0x1p-25 * 3, 0x1p-24 * 2}, /* 1.5 quanta -> 2 (even) */
    /* f8 = E4M3: 4 significant bits, max 448, saturating */
    {DT_F8E4M3, INTERP_DTYPE, 1.0625, 1},       /* 1 + 2^-4: halfway to 1 + 2^-3, ties to even */
    {DT_F8E4M3, INTERP_DTYPE, 500, 448},
    {DT_F8E4M3, INTERP_DTYPE, INFINITY, 448},
    {DT_F8E4M3, INTERP_DTYPE, 0x1p-10, 0},            /* half the smallest subnormal 2^-9: to 0 (even) */
    {DT_F8E4M3, INTERP_DTYPE, 3 * 0x1p-10, 0x1p-8},   /* 1.5 subnormal steps -> 2 (even) */
    /* f8e5m2: 3 significant bits, max 57344, overflow to infinity from 61440 (the tie), subnormals
       from 2^-16 */
    {DT_F8E5M2, INTERP_DTYPE, 1.125, 1},              /* halfway between 1 and 1.25: to even */
    {DT_F8E5M2, INTERP_DTYPE, 1.375, 1.5},            /* halfway between 1.25 and 1.5: to even */
    {DT_F8E5M2, INTERP_DTYPE, 61439, 57344},
    {DT_F8E5M2, INTERP_DTYPE, 61440, INFINITY},
    {DT_F8E5M2, INTERP_DTYPE, 0x1p-17, 0},
    {DT_F8E5M2, INTERP_DTYPE, 3 * 0x1p-17, 0x1p-15},
    /* the default: f32 for every float dtype */
    {DT_BF16, INTERP_F32, 1 + 0x1p-8, 1 + 0x1p-8},
    {DT_F32, INTERP_F32, 1 + 0x1p-30, 1},
    {DT_F32, INTERP_F64, 1 + 0x1p-30, 1 + 0x1p-30},
  };
  for (size_t c = 0; c < ARRAY_LEN(cases); c++) {
    double got = interp_round_value(cases[c].p, cases[c].dt, cases[c].x);
    UT_CHECK(got == cases[c].want, "%s %s: round(%.17g) = %.17g, expected %.17g", dtype_name(cases[c].dt),
             cases[c].p == INTERP_DTYPE ? "dtype" : cases[c].p == INTERP_F32 ? "f32" : "f64", cases[c].x, got,
             cases[c].want);
  }
  ut_end();
}

/* ---- training ops: by hand, and against finite differences of their forward ---- */

static uint64_t rng_state;
static double rnd(void) { /* deterministic, in [-1, 1) */
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (double)(rng_state >> 11) * 0x1.0p-52 - 1;
}

static double *rnd_data(Mod *M, int64_t n) {
  double *d = ARENA_ARRAY(&M->arena, double, n);
  for (int64_t i = 0; i < n; i++) d[i] = rnd();
  return d;
}

static Value *rnd_input(Mod *M, TensorType t) { return input(M, t, rnd_data(M, tensor_type_elements(&t))); }

static const double *g_dy; /* the incoming gradient a case's gradient module reads */

/* A gradient case builds, into M, either its forward (grad = false; returns y) or the gradient of
 * sum(y * dy) with respect to forward input `wrt` (returns dx). Both build the same inputs first. */
typedef Value *(*GradCase)(Mod *M, bool grad, int wrt);

static Value *dy_input(Mod *M, const TensorType *yt) {
  TensorType t = *yt;
  t.dtype = DT_F32;
  return input(M, t, g_dy);
}

static Value *gc_unary(Mod *M, bool grad, int wrt, OpKind f, OpKind g) {
  Dim *n = dim(M, "n", 7);
  Value *x = rnd_input(M, tt(DT_F32, 1, n));
  for (int i = 0; i < 7; i++) M->in[0]->data[i] *= 3; /* [-3, 3) */
  Value *y = op1(M, f, x, x->type);
  if (!grad) return y;
  return op2(M, g, x, dy_input(M, &y->type), x->type);
}
static Value *gc_gelu(Mod *M, bool grad, int wrt) { return gc_unary(M, grad, wrt, OP_GELU, OP_GELU_GRAD); }
static Value *gc_silu(Mod *M, bool grad, int wrt) { return gc_unary(M, grad, wrt, OP_SILU, OP_SILU_GRAD); }

static Value *gc_softmax(Mod *M, bool grad, int wrt) {
  Dim *r = dim(M, "r", 2), *j = dim(M, "j", 4);
  Value *x = rnd_input(M, tt(DT_F32, 2, r, j));
  Value *y = emit(M, NULL, OP_SOFTMAX, &x, 1, x->type, &j, 1)->results[0];
  if (!grad) return y;
  Value *ops[2] = {y, dy_input(M, &y->type)};
  return emit(M, NULL, OP_SOFTMAX_GRAD, ops, 2, x->type, &j, 1)->results[0];
}

static Value *gc_norm(Mod *M, bool grad, int wrt, bool ln) {
  Dim *r = dim(M, "r", 2), *d = dim(M, "d", 5);
  Value *x = rnd_input(M, tt(DT_F32, 2, r, d)), *s = rnd_input(M, tt(DT_F32, 1, d)), *b = rnd_input(M, tt(DT_F32, 1, d));
  Value *ops[3] = {x, s, b};
  Value *y = emit(M, NULL, ln ? OP_LAYERNORM : OP_RMSNORM, ops, ln ? 3 : 2, x->type, &d, 1)->results[0];
  if (!grad) return y;
  Value *g[3] = {x, s, dy_input(M, &y->type)};
  return emit(M, NULL, ln ? OP_LAYERNORM_GRAD : OP_RMSNORM_GRAD, g, 3, x->type, &d, 1)->results[0];
}
static Value *gc_rmsnorm(Mod *M, bool grad, int wrt) { return gc_norm(M, grad, wrt, false); }
static Value *gc_layernorm(Mod *M, bool grad, int wrt) { return gc_norm(M, grad, wrt, true); }

static Value *gc_cross_entropy(Mod *M, bool grad, int wrt) {
  Dim *b = dim(M, "b", 3), *c = dim(M, "c", 4);
  Value *logits = rnd_input(M, tt(DT_F32, 2, b, c));
  double lab[] = {3, 0, 2};
  Value *labels = input(M, tt(DT_I32, 1, b), lab);
  Value *ops[3] = {logits, labels};
  Value *y = emit(M, NULL, OP_CROSS_ENTROPY, ops, 2, tt(DT_F32, 1, b), &c, 1)->results[0];
  if (!grad) return y;
  ops[2] = dy_input(M, &y->type);
  return emit(M, NULL, OP_CROSS_ENTROPY_GRAD, ops, 3, logits->type, &c, 1)->results[0];
}

/* attention(q, k, v) with a batch dim, heads, a causal mask and a scale; the value dim is named
 * like the head dim (as in the stdlib's models). */
static Value *gc_attention(Mod *M, bool grad, int wrt) {
  Dim *b = dim(M, "b", 2), *s = dim(M, "s", 3), *t = dim(M, "t", 3), *n = dim(M, "n", 2), *h = dim(M, "h", 2);
  Value *q = rnd_input(M, tt(DT_F32, 4, b, s, n, h)), *k = rnd_input(M, tt(DT_F32, 4, b, t, n, h));
  Value *v = rnd_input(M, tt(DT_F32, 4, b, t, n, h));
  Value *ops[5] = {q, k, v};
  Dim *dims[3] = {h, t, s};
  Op *a = emit(M, NULL, OP_ATTENTION, ops, 3, tt(DT_F32, 4, b, s, n, h), dims, 3);
  a->scalar = 0.7;
  a->flag = 1;
  if (!grad) return a->results[0];
  ops[3] = a->results[0];
  ops[4] = dy_input(M, &a->results[0]->type);
  Op *g = emit(M, NULL, OP_ATTENTION_GRAD, ops, 5, ops[wrt]->type, dims, 3);
  g->scalar = 0.7;
  g->flag = 1;
  g->index = wrt;
  return g->results[0];
}

/* d/dx of sum(y * dy) by central differences, per element of forward input `wrt`. */
static void finite_differences(GradCase gc, int wrt, const char *what) {
  Mod F;
  mod_init(&F);
  rng_state = 7;
  output(&F, gc(&F, false, 0));
  InterpStats st;
  Tensor *y = run_mod(&F, INTERP_F64, &st);
  if (!y) {
    ut_fail("%s: forward failed: %s", what, st.error);
    mod_free(&F);
    return;
  }
  double *dy = malloc(sizeof(double) * (size_t)y->n);
  rng_state = 99;
  for (int64_t i = 0; i < y->n; i++) dy[i] = rnd();
  g_dy = dy;
  Mod G;
  mod_init(&G);
  rng_state = 7;
  output(&G, gc(&G, true, wrt));
  Tensor *dx = run_mod(&G, INTERP_F64, &st);
  if (!dx) {
    ut_fail("%s: gradient failed: %s", what, st.error);
  } else {
    Tensor *x = F.in[wrt];
    double worst = 0;
    for (int64_t i = 0; i < x->n; i++) {
      double keep = x->data[i], h = 1e-5, l[2];
      for (int s = 0; s < 2; s++) {
        x->data[i] = keep + (s ? -h : h);
        Tensor *yy = run_mod(&F, INTERP_F64, &st);
        l[s] = 0;
        for (int64_t j = 0; yy && j < yy->n; j++) l[s] += yy->data[j] * dy[j];
        tensor_free(yy);
      }
      x->data[i] = keep;
      double fd = (l[0] - l[1]) / (2 * h);
      if (fabs(fd - dx->data[i]) > worst) worst = fabs(fd - dx->data[i]);
    }
    UT_CHECK(dx->n == x->n && worst < 1e-7, "%s: gradient differs from finite differences by %g", what, worst);
  }
  tensor_free(y);
  tensor_free(dx);
  free(dy);
  mod_free(&F);
  mod_free(&G);
}

static void test_grad_ops(void) {
  ut_begin("op.gradients_vs_finite_differences");
  finite_differences(gc_gelu, 0, "gelu_grad");
  finite_differences(gc_silu, 0, "silu_grad");
  finite_differences(gc_softmax, 0, "softmax_grad");
  finite_differences(gc_rmsnorm, 0, "rmsnorm_grad");
  finite_differences(gc_layernorm, 0, "layernorm_grad");
  finite_differences(gc_cross_entropy, 0, "cross_entropy_grad");
  finite_differences(gc_attention, 0, "attention_grad dq");
  finite_differences(gc_attention, 1, "attention_grad dk");
  finite_differences(gc_attention, 2, "attention_grad dv");
  ut_end();
}

static void test_train_ops(void) {
  ut_begin("op.training_by_hand");
  Mod M;
  /* relu_grad, causal_grad */
  mod_init(&M);
  Dim *n = dim(&M, "n", 3);
  double x[] = {-1, 2, 0}, dy[] = {5, 6, 7};
  Value *vx = input(&M, tt(DT_F32, 1, n), x), *vd = input(&M, tt(DT_F32, 1, n), dy);
  output(&M, op2(&M, OP_RELU_GRAD, vx, vd, vx->type));
  double w1[] = {0, 6, 0};
  RUN_EXPECT(M, w1, 0, "relu_grad");
  mod_free(&M);

  mod_init(&M);
  Dim *q = dim(&M, "q", 2), *k = dim(&M, "k", 2);
  double ones[] = {1, 1, 1, 1};
  Value *g = input(&M, tt(DT_F32, 2, q, k), ones);
  Dim *qk[2] = {q, k};
  output(&M, emit(&M, NULL, OP_CAUSAL_GRAD, &g, 1, g->type, qk, 2)->results[0]);
  double w2[] = {1, 0, 1, 1};
  RUN_EXPECT(M, w2, 0, "causal_grad");
  mod_free(&M);

  /* max_grad: ties share the gradient */
  mod_init(&M);
  Dim *r = dim(&M, "r", 2), *j = dim(&M, "j", 3);
  double xm[] = {1, 3, 3, 5, 0, 2}, ym[] = {3, 5}, dym[] = {1, 4};
  Value *a = input(&M, tt(DT_F32, 2, r, j), xm), *b = input(&M, tt(DT_F32, 1, r), ym), *c = input(&M, tt(DT_F32, 1, r), dym);
  Value *o3[3] = {a, b, c};
  output(&M, emit(&M, NULL, OP_MAX_GRAD, o3, 3, a->type, &j, 1)->results[0]);
  double w3[] = {0, 0.5, 0.5, 4, 0, 0};
  RUN_EXPECT(M, w3, 0, "max_grad");
  mod_free(&M);

  /* take_grad: rows summed per index; rows never named stay 0 */
  mod_init(&M);
  Dim *v = dim(&M, "v", 3), *e = dim(&M, "e", 2), *s = dim(&M, "s", 3);
  double idx[] = {2, 0, 2}, dyt[] = {1, 2, 3, 4, 5, 6};
  Value *vi = input(&M, tt(DT_I32, 1, s), idx), *vt = input(&M, tt(DT_F32, 2, s, e), dyt);
  output(&M, op2(&M, OP_TAKE_GRAD, vi, vt, tt(DT_BF16, 2, v, e)));
  double w4[] = {3, 4, 0, 0, 6, 8};
  RUN_EXPECT(M, w4, 0, "take_grad");
  mod_free(&M);

  /* broadcast: x[i] repeated along j */
  mod_init(&M);
  Dim *i = dim(&M, "i", 2);
  j = dim(&M, "j", 3);
  double xb[] = {1, 2};
  Value *xv = input(&M, tt(DT_F32, 1, i), xb);
  output(&M, emit(&M, NULL, OP_BROADCAST, &xv, 1, tt(DT_F32, 2, j, i), &j, 1)->results[0]);
  double w5[] = {1, 2, 1, 2, 1, 2};
  RUN_EXPECT(M, w5, 0, "broadcast");
  mod_free(&M);

  /* cross_entropy of logits [0, log 3] with label 1: log 4 - log 3 */
  mod_init(&M);
  Dim *bb = dim(&M, "b", 1), *cc = dim(&M, "c", 2);
  double lg[] = {0, log(3.0)}, lb[] = {1};
  Value *vl = input(&M, tt(DT_F32, 2, bb, cc), lg), *vb = input(&M, tt(DT_I32, 1, bb), lb);
  Value *oc[2] = {vl, vb};
  output(&M, emit(&M, NULL, OP_CROSS_ENTROPY, oc, 2, tt(DT_F32, 1, bb), &cc, 1)->results[0]);
  double w6[] = {log(4.0 / 3.0)};
  RUN_EXPECT(M, w6, 1e-15, "cross_entropy");
  M.in[1]->data[0] = 2;
  InterpStats st;
  Tensor *t = run_mod(&M, INTERP_F64, &st);
  UT_CHECK(!t && strstr(st.error, "out of range"), "label 2 of 2 classes: %s", t ? "ran" : st.error);
  tensor_free(t);
  mod_free(&M);

  /* optimizers: sgd p - lr g; adam moments; adam update at t = 1 */
  mod_init(&M);
  Dim *one = dim(&M, "one", 1);
  double p[] = {1}, gr[] = {2}, mm[] = {0.1}, vv[] = {0.01}, tt1[] = {1};
  Value *vp = input(&M, tt(DT_BF16, 1, one), p), *vg = input(&M, tt(DT_BF16, 1, one), gr);
  Value *vm = input(&M, tt(DT_F32, 1, one), mm), *vv2 = input(&M, tt(DT_F32, 1, one), vv);
  Value *vt1 = input(&M, tt(DT_F32, 0), tt1);
  Op *sgd = emit(&M, NULL, OP_SGD_UPDATE, (Value *[]){vp, vg}, 2, vp->type, NULL, 0);
  sgd->scalar = 0.1;
  Op *m1 = emit(&M, NULL, OP_ADAM_MOMENT, (Value *[]){vm, vg}, 2, vm->type, NULL, 0);
  m1->scalar = 0.9;
  Op *m2 = emit(&M, NULL, OP_ADAM_MOMENT, (Value *[]){vv2, vg}, 2, vm->type, NULL, 0);
  m2->scalar = 0.999;
  m2->flag = 1;
  Op *up = emit(&M, NULL, OP_ADAM_UPDATE, (Value *[]){vp, vm, vv2, vt1}, 4, vp->type, NULL, 0);
  up->scalar = 0.1;
  Value *outs[4] = {sgd->results[0], m1->results[0], m2->results[0], up->results[0]};
  for (int o = 0; o < 4; o++) output(&M, outs[o]);
  InterpOptions opt = {.precision = INTERP_F64};
  Tensor *res[4] = {0};
  if (!interp_run(M.m, &opt, M.in, NULL, res, &st)) {
    ut_fail("optimizers: %s", st.error);
  } else {
    /* adam at t = 1: mh = m / 0.1 = 1, vh = v / 0.001 = 10 */
    double want[4] = {1 - 0.1 * 2, 0.9 * 0.1 + 0.1 * 2, 0.999 * 0.01 + 0.001 * 4, 1 - 0.1 * 1 / (sqrt(10.0) + 1e-8)};
    const char *names[4] = {"sgd_update", "adam_moment m", "adam_moment v", "adam_update"};
    for (int o = 0; o < 4; o++) expect_values(res[o], &want[o], 1, 1e-15, names[o]);
  }
  for (int o = 0; o < 4; o++) tensor_free(res[o]);
  mod_free(&M);
  ut_end();
}

/* ---- attention: by hand, and fused == unfused ---- */

static void test_attention_by_hand(void) {
  ut_begin("op.attention_by_hand");
  for (int causal = 0; causal < 2; causal++) {
    Mod M;
    mod_init(&M);
    Dim *s = dim(&M, "s", 2), *t = dim(&M, "t", 2), *h = dim(&M, "h", 1), *e = dim(&M, "e", 1);
    /* scores q.k = [0, log 3] on both rows: probabilities 1/4, 3/4; v = [4, 8] -> 1 + 6 = 7; with the
     * causal mask, query 0 sees only key 0 -> 4 */
    double q[] = {1, 1}, k[] = {0, log(3.0)}, v[] = {4, 8};
    Value *ops[3] = {input(&M, tt(DT_F32, 2, s, h), q), input(&M, tt(DT_F32, 2, t, h), k), input(&M, tt(DT_F32, 2, t, e), v)};
    Dim *dims[3] = {h, t, s};
    Op *a = emit(&M, NULL, OP_ATTENTION, ops, 3, tt(DT_F32, 2, s, e), dims, 3);
    a->scalar = 1;
    a->flag = causal;
    output(&M, a->results[0]);
    double want0[] = {7, 7}, want1[] = {4, 7};
    if (causal) RUN_EXPECT(M, want1, 1e-14, "causal attention");
    else RUN_EXPECT(M, want0, 1e-14, "attention");
    mod_free(&M);
  }
  ut_end();
}

/* The chain ir_fuse_attention recognises, built op by op: run, fuse (the real pass), run again. */
static void test_fusion(void) {
  ut_begin("fusion.fused_equals_unfused");
  Mod M;
  mod_init(&M);
  rng_state = 3;
  Dim *b = dim(&M, "b", 2), *s = dim(&M, "s", 5), *t = dim(&M, "t", 5), *n = dim(&M, "n", 2), *h = dim(&M, "h", 3);
  Value *q = rnd_input(&M, tt(DT_BF16, 4, b, s, n, h)), *k = rnd_input(&M, tt(DT_BF16, 4, b, t, n, h));
  Value *v = rnd_input(&M, tt(DT_BF16, 4, b, t, n, h));
  Value *qk[2] = {q, k};
  Value *sc = emit(&M, NULL, OP_CONTRACT, qk, 2, tt(DT_BF16, 4, b, s, n, t), &h, 1)->results[0];
  Value *sc2 = op2(&M, OP_MUL, sc, cnst(&M, 0.57735, DT_BF16), sc->type);
  Dim *st[2] = {s, t};
  Value *sc3 = emit(&M, NULL, OP_CAUSAL, &sc2, 1, sc->type, st, 2)->results[0];
  Value *p = emit(&M, NULL, OP_SOFTMAX, &sc3, 1, sc->type, &t, 1)->results[0];
  Value *pv[2] = {p, v};
  output(&M, emit(&M, NULL, OP_CONTRACT, pv, 2, tt(DT_BF16, 4, b, s, n, h), &t, 1)->results[0]);
  InterpStats st1, st2;
  Tensor *u64 = run_mod(&M, INTERP_F64, &st1), *u32 = run_mod(&M, INTERP_F32, &st2);
  int nf = ir_fuse_attention(M.m);
  UT_CHECK(nf == 1 && M.f->outputs[0]->def->kind == OP_ATTENTION, "the chain was not fused (%d)", nf);
  Tensor *f64 = run_mod(&M, INTERP_F64, &st1), *f32 = run_mod(&M, INTERP_F32, &st2);
  double a, r;
  UT_CHECK(u64 && f64 && tensor_diff(f64, u64, &a, &r) && a < 1e-13, "f64: fused differs from unfused by %g",
           u64 && f64 ? a : -1);
  UT_CHECK(u32 && f32 && tensor_diff(f32, u32, &a, &r) && r < 1e-6, "f32: fused differs from unfused by %g (rel)",
           u32 && f32 ? r : -1);
  tensor_free(u64);
  tensor_free(u32);
  tensor_free(f64);
  tensor_free(f32);
  mod_free(&M);
  ut_end();
}

/* ---- loops ---- */

/* x = x * w[l] + c over l = 0..2, with x's value after each trip as a stacked output. */
static void test_loops(void) {
  ut_begin("loop.carried_stacked_reverse");
  for (int reverse = 0; reverse < 2; reverse++) {
    Mod M;
    mod_init(&M);
    Dim *l = dim(&M, "l", 3), *d = dim(&M, "d", 2);
    double w[] = {2, 3, 1, 1, 0.5, 2}, x0[] = {1, 1}, c[] = {1, 0};
    Value *vw = input(&M, tt(DT_F32, 2, l, d), w), *vx = input(&M, tt(DT_F32, 1, d), x0);
    Value *vc = input(&M, tt(DT_F32, 1, d), c);
    IrFunc *body = ir_func_new(M.m, "body", M.f);
    Value *bw = ir_func_add_input(M.m, body, tt(DT_F32, 1, d), NULL);
    Value *bx = ir_func_add_input(M.m, body, tt(DT_F32, 1, d), NULL);
    Value *bc = ir_func_add_input(M.m, body, tt(DT_F32, 1, d), NULL);
    Value *m1 = emit(&M, body, OP_MUL, (Value *[]){bx, bw}, 2, bx->type, NULL, 0)->results[0];
    Value *m2 = emit(&M, body, OP_ADD, (Value *[]){m1, bc}, 2, bx->type, NULL, 0)->results[0];
    body->outputs = ARENA_ARRAY(&M.arena, Value *, 2);
    body->outputs[0] = body->outputs[1] = m2;
    body->noutputs = 2;
    TensorType rts[2] = {tt(DT_F32, 1, d), tt(DT_F32, 2, l, d)};
    Op *loop = ir_op_new(M.m, M.f, OP_LOOP, (SrcLoc){0}, (Value *[]){vw, vx, vc}, 3, rts, 2);
    loop->body = body;
    loop->count = 3;
    loop->stack_dim = l;
    loop->nslices = 1;
    loop->ncarried = 1;
    loop->nstacked = 1;
    loop->reverse = reverse;
    ir_append(M.f, loop);
    output(&M, loop->results[0]);
    output(&M, loop->results[1]);
    UT_CHECK(ir_verify(M.m, stdout), "the hand-built loop does not verify");
    InterpOptions o = {.precision = INTERP_F64};
    Tensor *out[2] = {0};
    InterpStats st;
    if (!interp_run(M.m, &o, M.in, NULL, out, &st)) {
      ut_fail("run: %s", st.error);
    } else if (!reverse) {
      /* rows 0, 1, 2: [3, 3], [4, 3], [3, 6] */
      double fin[] = {3, 6}, rows[] = {3, 3, 4, 3, 3, 6};
      expect_values(out[0], fin, 2, 0, "carried result");
      expect_values(out[1], rows, 6, 0, "stacked result");
    } else {
      /* rows 2, 1, 0 in that order: [1.5, 2], [2.5, 2], [6, 6]; each written at its own row */
      double fin[] = {6, 6}, rows[] = {6, 6, 2.5, 2, 1.5, 2};
      expect_values(out[0], fin, 2, 0, "reverse carried result");
      expect_values(out[1], rows, 6, 0, "reverse stacked result");
    }
    tensor_free(out[0]);
    tensor_free(out[1]);
    mod_free(&M);
  }
  ut_end();
}

/* ---- SPMD on hand-made shardings ---- */

static void shard_dim(Value *v, int d, int axis) {
  v->sharding.axes[d][v->sharding.naxes[d]++] = (int8_t)axis;
}

static Op *coll(Mod *M, OpKind k, Value *x, uint16_t axes, const Sharding *after) {
  Op *c = emit(M, NULL, k, &x, 1, x->type, NULL, 0);
  c->axes = axes;
  c->results[0]->sharding = *after;
  return c;
}

/* a[i, k] @ b[k, j] on a 2 x 2 mesh (x major, y minor): a is sharded i@x, k@y; b k@y; the
 * contraction is a partial sum over y; then each collective in turn. Expected values are a @ b
 * computed here with plain loops (and, for the ring permute, that with its i blocks rotated). */
static void test_spmd_hand(void) {
  ut_begin("spmd.collectives_by_hand");
  Mesh mesh = {.name = "m", .naxes = 2, .devices = 4};
  mesh.axes[0] = (MeshAxis){.name = "x", .size = 2};
  mesh.axes[1] = (MeshAxis){.name = "y", .size = 2};
  Mod M;
  mod_init(&M);
  rng_state = 11;
  Dim *i = dim(&M, "i", 4), *k = dim(&M, "k", 4), *j = dim(&M, "j", 2);
  Value *a = rnd_input(&M, tt(DT_F32, 2, i, k)), *b = rnd_input(&M, tt(DT_F32, 2, k, j));
  shard_dim(a, 0, 0), shard_dim(a, 1, 1), shard_dim(b, 0, 1);
  Value *ab[2] = {a, b};
  Value *c = emit(&M, NULL, OP_CONTRACT, ab, 2, tt(DT_F32, 2, i, j), &k, 1)->results[0];
  shard_dim(c, 0, 0);
  c->sharding.partial = 2;
  Sharding s_ix = {0}, s_rep = {0}, s_ixy = {0}, s_jx = {0};
  s_ix.naxes[0] = 1, s_ix.axes[0][0] = 0;
  s_ixy.naxes[0] = 2, s_ixy.axes[0][0] = 0, s_ixy.axes[0][1] = 1;
  s_jx.naxes[1] = 1, s_jx.axes[1][0] = 0;
  Value *r1 = coll(&M, OP_ALL_REDUCE, c, 2, &s_ix)->results[0];       /* i@x */
  Value *r2 = coll(&M, OP_ALL_GATHER, r1, 1, &s_rep)->results[0];     /* whole */
  Value *r3 = coll(&M, OP_REDUCE_SCATTER, c, 2, &s_ixy)->results[0];  /* i@(x, y) */
  Value *r4 = coll(&M, OP_ALL_TO_ALL, r1, 1, &s_jx)->results[0];      /* j@x */
  Value *r5 = coll(&M, OP_PERMUTE, r1, 1, &s_ix)->results[0];         /* ring over x */
  Value *outs[5] = {r1, r2, r3, r4, r5};
  for (int o = 0; o < 5; o++) output(&M, outs[o]);
  double want[8], rot[8];
  for (int r = 0; r < 4; r++)
    for (int col = 0; col < 2; col++) {
      double s = 0;
      for (int kk = 0; kk < 4; kk++) s += M.in[0]->data[r * 4 + kk] * M.in[1]->data[kk * 2 + col];
      want[r * 2 + col] = s;
    }
  /* the ring: device x = 0 receives x = 1's block (rows 2, 3) and vice versa */
  for (int r = 0; r < 4; r++)
    for (int col = 0; col < 2; col++) rot[r * 2 + col] = want[((r + 2) % 4) * 2 + col];
  InterpOptions o = {.precision = INTERP_F64};
  Tensor *got[5] = {0};
  InterpStats st;
  if (!interp_run_spmd(M.m, &mesh, &o, M.in, NULL, got, &st)) {
    ut_fail("spmd run: %s", st.error);
  } else {
    const char *names[5] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute"};
    for (int q = 0; q < 5; q++) expect_values(got[q], q == 4 ? rot : want, 8, 1e-15, names[q]);
    UT_CHECK(st.replica_diff == 0, "replicas differ by %g", st.replica_diff);
  }
  for (int q = 0; q < 5; q++) tensor_free(got[q]);

  /* mistakes are errors naming the op: an all_reduce over x of a sum that is partial over y */
  r1->def->axes = 1;
  memset(got, 0, sizeof got);
  bool ran = interp_run_spmd(M.m, &mesh, &o, M.in, NULL, got, &st);
  UT_CHECK(!ran && strstr(st.error, "all_reduce") && strstr(st.error, "partial"), "all_reduce over the wrong axis: %s",
           ran ? "ran" : st.error);
  for (int q = 0; q < 5; q++) tensor_free(got[q]);
  r1->def->axes = 2;
  /* a contraction whose result is not declared partial */
  c->sharding.partial = 0;
  memset(got, 0, sizeof got);
  ran = interp_run_spmd(M.m, &mesh, &o, M.in, NULL, got, &st);
  UT_CHECK(!ran && strstr(st.error, "contract") && strstr(st.error, "partial sum over y"), "undeclared partial: %s",
           ran ? "ran" : st.error);
  for (int q = 0; q < 5; q++) tensor_free(got[q]);
  c->sharding.partial = 2;
  /* an operand sharded where the other is not, with no in_shard: contracted blocks differ */
  b->sharding.naxes[0] = 0;
  memset(got, 0, sizeof got);
  ran = interp_run_spmd(M.m, &mesh, &o, M.in, NULL, got, &st);
  UT_CHECK(!ran && strstr(st.error, "different blocks"), "mismatched operands: %s", ran ? "ran" : st.error);
  for (int q = 0; q < 5; q++) tensor_free(got[q]);
  mod_free(&M);
  ut_end();
}

static FILE *diag_sink;

static bool load(InterpProgram *ip, const char *path, const char *const *defs, int ndefs, const char *layout,
                 const char *mesh, const char *entry) {
  diag_reset();
  if (diag_sink) fclose(diag_sink);
  diag_sink = tmpfile();
  diag_configure(diag_sink ? diag_sink : stderr, DIAG_TEXT, false);
  int rc = interp_load(ip, path, defs, ndefs, layout, mesh, entry);
  if (rc != 0 || !ip->cp.ir) {
    ut_fail("%s (layout %s, mesh %s) did not load: exit %d", path, layout ? layout : "-", mesh ? mesh : "-", rc);
    if (diag_sink) {
      rewind(diag_sink);
      char line[512];
      while (fgets(line, sizeof line, diag_sink)) printf("      %s", line);
    }
    return false;
  }
  return true;
}

static void unload(InterpProgram *ip) {
  interp_unload(ip);
  source_free_all();
  intern_reset();
}

static bool all_finite(const Tensor *t) {
  for (int64_t i = 0; i < t->n; i++)
    if (!isfinite(t->data[i])) return false;
  return true;
}

/* The entry runs globally with random inputs; every output finite and not all zero. */
static void global_run(const char *what, const char *path, const char *const *defs, int ndefs, const char *entry) {
  ut_begin(what);
  InterpProgram ip;
  if (load(&ip, path, defs, ndefs, NULL, NULL, entry)) {
    IrModule *m = ip.cp.ir;
    Tensor **in = interp_random_inputs(m, 1), **pa = interp_random_params(m, 1);
    int n = interp_noutputs(m);
    Tensor **out = calloc((size_t)n, sizeof *out);
    InterpStats st;
    InterpOptions o = {.precision = INTERP_F32};
    if (!interp_run(m, &o, in, pa, out, &st)) {
      ut_fail("run: %s", st.error);
    } else {
      for (int i = 0; i < n; i++) {
        double mx = 0;
        for (int64_t e = 0; e < out[i]->n; e++) mx = fmax(mx, fabs(out[i]->data[e]));
        UT_CHECK(all_finite(out[i]) && mx > 0, "output %d: finite %d, largest |value| %g", i, all_finite(out[i]), mx);
      }
    }
    interp_free_tensors(in, interp_ninputs(m));
    interp_free_tensors(pa, m->nparams);
    interp_free_tensors(out, n);
  }
  unload(&ip);
  ut_end();
}

/* A take whose table's rows are sharded (the masked local gather). */
static bool has_sharded_take(const IrFunc *f) {
  for (const Op *o = f->first; o; o = o->next) {
    if (o->kind == OP_TAKE && o->operands[0]->sharding.naxes[0] > 0) return true;
    if (o->kind == OP_LOOP && o->body && has_sharded_take(o->body)) return true;
  }
  return false;
}

static bool outputs_finite(Tensor *const *t, int n) {
  for (int i = 0; i < n; i++)
    if (!t[i] || !all_finite(t[i])) return false;
  return true;
}

typedef struct SpmdRun {
  int collectives;
  bool pipelined;       /* the module became an OP_PIPELINE (shard/stages.c) */
  bool sharded_take;
} SpmdRun;

/* SPMD cases that fail because of a gap in another stage, with the reason; each prints XFAIL
 * while it fails and XPASS once it passes (then delete its line). Matched as substrings of the
 * case name. */
static const struct {
  const char *name, *reason;
} known_gaps[] = {
  /* Cases that fail for a known reason elsewhere in the compiler, with the reason. Empty now: the
   * step propagation fixed the microbatch-loop, nested-carry and stacked-result gaps. A case that
   * starts failing again must be fixed, not listed here without a reason. */
  {NULL, NULL},
};

static const char *known_gap(const char *name) {
  for (size_t i = 0; i < ARRAY_LEN(known_gaps); i++)
    if (known_gaps[i].name && strstr(name, known_gaps[i].name)) return known_gaps[i].reason;
  return NULL;
}

/* Global run, then propagate + partition, then the SPMD run: every output must match. */
static bool spmd_case(const char *path, const char *const *defs, int ndefs, const char *layout, const char *mesh,
                      const char *entry, InterpPrecision p, double tol, SpmdRun *info) {
  char what[256];
  snprintf(what, sizeof what, "spmd.%s.%s.%s%s%s", strrchr(path, '/') ? strrchr(path, '/') + 1 : path, mesh, layout,
           entry ? "" : ".step", p == INTERP_F64 ? ".f64" : "");
  ut_begin(what);
  ut_expect_fail(known_gap(what));
  InterpProgram ip;
  bool ok = false;
  if (load(&ip, path, defs, ndefs, layout, mesh, entry)) {
    IrModule *m = ip.cp.ir;
    Tensor **in = interp_random_inputs(m, 5), **pa = interp_random_params(m, 5);
    int n = interp_noutputs(m);
    Tensor **ref = calloc((size_t)n, sizeof *ref);
    InterpStats st;
    InterpOptions o = {.precision = p};
    if (!interp_run(m, &o, in, pa, ref, &st)) {
      ut_fail("global run: %s", st.error);
    } else if (!outputs_finite(ref, n)) {
      ut_fail("the global run's outputs are not all finite");
    } else if (!interp_partition(&ip)) {
      ut_fail("partitioning failed");
    } else {
      InterpCheck c;
      bool r = interp_check_spmd(m, ip.cp.prog->mesh, &o, in, pa, ref, &c);
      UT_CHECK(r, "SPMD run: %s", c.stats.error);
      UT_CHECK(!r || c.worst_rel <= tol, "SPMD differs from global: %g (relative), %g (absolute)", c.worst_rel, c.worst_abs);
      UT_CHECK(!r || c.stats.replica_diff == 0, "replicated outputs differ between devices by %g", c.stats.replica_diff);
      ok = r && c.worst_rel <= tol;
      if (info) {
        const IrFunc *f = m->main;
        info->collectives = unit_count_ops(f, OP_ALL_GATHER, true) + unit_count_ops(f, OP_ALL_REDUCE, true) +
                            unit_count_ops(f, OP_REDUCE_SCATTER, true) + unit_count_ops(f, OP_ALL_TO_ALL, true) +
                            unit_count_ops(f, OP_PERMUTE, true);
        info->pipelined = ip.cp.ir->pipeline != NULL;
        info->sharded_take = has_sharded_take(m->main);
      }
      interp_check_free(&c);
    }
    interp_free_tensors(in, interp_ninputs(m));
    interp_free_tensors(pa, m->nparams);
    interp_free_tensors(ref, n);
  }
  unload(&ip);
  ut_end();
  return ok;
}

static const char *mlp_small[] = {"batch=8", "seq=4", "embed=16", "hidden=32"};
static const char *mlp_256[] = {"batch=256", "seq=2", "embed=256", "hidden=32"};

static void test_spmd_mlp(void) {
  const char *path = SHARDC_SAMPLES "/mlp.shard";
  const char *layouts[] = {"fsdp_tp", "dp", "fsdp", "tp"};
  int total = 0;
  for (size_t l = 0; l < ARRAY_LEN(layouts); l++) {
    SpmdRun info = {0};
    spmd_case(path, mlp_small, 4, layouts[l], "pod", "mlp.forward", INTERP_F32, 1e-5, &info);
    total += info.collectives;
    spmd_case(path, mlp_small, 4, layouts[l], "node", "mlp.forward", INTERP_F32, 1e-5, NULL);
    spmd_case(path, mlp_256, 4, layouts[l], "v5e_256", "mlp.forward", INTERP_F32, 1e-5, NULL);
  }
  spmd_case(path, mlp_small, 4, "fsdp_tp", "pod", "mlp.forward", INTERP_F64, 1e-13, NULL);
  ut_begin("spmd.mlp.collectives_exercised");
  UT_CHECK(total >= 4, "the mlp layouts inserted only %d collectives on pod", total);
  ut_end();
}

static const char *llama_small[] = {"batch=4", "seq=8", "embed=16", "hidden=32", "heads=4", "kv_heads=2",
                                    "head=4", "vocab=64", "layers=2"};
static const char *llama_wide[] = {"batch=4", "seq=8", "embed=16", "hidden=32", "heads=8", "kv_heads=4",
                                   "head=2", "vocab=64", "layers=2"};

static void test_spmd_llama(void) {
  const char *path = INTERP_TEST_DIR "/llama_small.shard";
  const char *layouts[] = {"fsdp_tp", "fsdp_tp_sp", "dp", "fsdp", "vocab_tp", "pp"};
  bool take = false, pipe = false;
  for (size_t l = 0; l < ARRAY_LEN(layouts); l++) {
    SpmdRun info = {0};
    spmd_case(path, llama_small, 9, layouts[l], "pod", "llama.forward", INTERP_F32, 1e-5, &info);
    take |= info.sharded_take;
    if (strcmp(layouts[l], "pp") != 0)
      spmd_case(path, llama_wide, 9, layouts[l], "wide", "llama.forward", INTERP_F32, 1e-5, NULL);
    memset(&info, 0, sizeof info);
    spmd_case(path, llama_small, 9, layouts[l], "pipe", "llama.forward", INTERP_F32, 1e-5, &info);
    if (strcmp(layouts[l], "pp") == 0) pipe = info.pipelined;
  }
  spmd_case(path, llama_small, 9, "fsdp_tp", "pod", "llama.forward", INTERP_F64, 1e-12, NULL);
  ut_begin("spmd.llama.coverage");
  UT_CHECK(take, "no layout left the embedding's rows sharded (the masked local gather went untested)");
  UT_CHECK(pipe, "the pp layout on the pipe mesh made no pipeline");
  ut_end();
}

/* ---- train steps ---- */

/* The step's gradients (StepInfo: made outputs of main here) against central differences of its
 * loss (output 0), in f64: a few elements of every param. This checks autodiff end to end. */
static void gradient_check(const char *what, const char *path, const char *const *defs, int ndefs) {
  ut_begin(what);
  InterpProgram ip;
  if (load(&ip, path, defs, ndefs, NULL, NULL, NULL)) {
    IrModule *m = ip.cp.ir;
    const StepInfo *si = m->step;
    if (!si) {
      ut_fail("no train step");
    } else {
      int no = m->main->noutputs, n = no + si->nparams;
      Value **outs = ARENA_ARRAY(m->arena, Value *, n);
      memcpy(outs, m->main->outputs, sizeof(Value *) * (size_t)no);
      for (int i = 0; i < si->nparams; i++) outs[no + i] = si->params[i].grad;
      m->main->outputs = outs;
      m->main->noutputs = n;
      Tensor **in = interp_random_inputs(m, 3), **pa = interp_random_params(m, 3);
      Tensor **out = calloc((size_t)n, sizeof *out), **o2 = calloc((size_t)n, sizeof *o2);
      InterpOptions o = {.precision = INTERP_F64};
      InterpStats st;
      if (!interp_run(m, &o, in, pa, out, &st)) {
        ut_fail("run: %s", st.error);
      } else {
        for (int p = 0; p < si->nparams && ut_ok(); p++) {
          const Tensor *g = out[no + p];
          Tensor *w = pa[si->params[p].param];
          for (int t = 0; t < 3 && ut_ok(); t++) {
            int64_t e = (int64_t)((t * 7919 + 13 * (p + 1)) % w->n);
            double keep = w->data[e], h = 1e-5, l[2] = {0, 0};
            for (int sgn = 0; sgn < 2; sgn++) {
              w->data[e] = keep + (sgn ? -h : h);
              if (interp_run(m, &o, in, pa, o2, &st)) l[sgn] = o2[0]->data[0];
              for (int i = 0; i < n; i++) tensor_free(o2[i]), o2[i] = NULL;
            }
            w->data[e] = keep;
            double fd = (l[0] - l[1]) / (2 * h), an = g->data[e];
            UT_CHECK(fabs(fd - an) <= 1e-8 + 1e-5 * fabs(an), "d loss / d %s[%lld]: autodiff %.10g, finite differences %.10g",
                     m->params[si->params[p].param].path, (long long)e, an, fd);
          }
        }
      }
      interp_free_tensors(in, interp_ninputs(m));
      interp_free_tensors(pa, m->nparams);
      interp_free_tensors(out, n);
      free(o2);
    }
  }
  unload(&ip);
  ut_end();
}

static void test_train_steps(void) {
  static const char *none[] = {"seq=2"};
  gradient_check("train.mlp_adam_gradients", SHARDC_SAMPLES "/mlp.shard", mlp_small, 4);
  gradient_check("train.mlp_sgd_microbatches_gradients", INTERP_TEST_DIR "/mlp_sgd_mb.shard", none, 1);
  gradient_check("train.llama_microbatches_remat_gradients", INTERP_TEST_DIR "/llama_small.shard", llama_small, 9);
  const char *mlp_layouts[] = {"fsdp_tp", "dp", "fsdp", "tp"};
  for (size_t l = 0; l < ARRAY_LEN(mlp_layouts); l++)
    spmd_case(SHARDC_SAMPLES "/mlp.shard", mlp_small, 4, mlp_layouts[l], "pod", NULL, INTERP_F32, 1e-5, NULL);
  spmd_case(SHARDC_SAMPLES "/mlp.shard", mlp_small, 4, "fsdp_tp", "pod", NULL, INTERP_F64, 1e-13, NULL);
  const char *mb_layouts[] = {"fsdp_tp", "dp", "tp"};
  for (size_t l = 0; l < ARRAY_LEN(mb_layouts); l++)
    spmd_case(INTERP_TEST_DIR "/mlp_sgd_mb.shard", none, 1, mb_layouts[l], "pod", NULL, INTERP_F32, 1e-5, NULL);
  spmd_case(INTERP_TEST_DIR "/llama_small.shard", llama_small, 9, "fsdp_tp", "pod", NULL, INTERP_F32, 1e-5, NULL);
  spmd_case(INTERP_TEST_DIR "/llama_small.shard", llama_small, 9, "vocab_tp", "pod", NULL, INTERP_F32, 1e-5, NULL);
  spmd_case(INTERP_TEST_DIR "/llama_small.shard", llama_small, 9, "pp", "pipe", NULL, INTERP_F32, 1e-5, NULL);
}

/* The check must be able to fail: broken collectives in a partitioned mlp. */
static void test_spmd_must_fail(void) {
  ut_begin("spmd.broken_collectives_are_caught");
  const char *path = SHARDC_SAMPLES "/mlp.shard";
  for (int variant = 0; variant < 3; variant++) {
    InterpProgram ip;
    if (!load(&ip, path, mlp_small, 4, "fsdp_tp", "pod", "mlp.forward")) {
      unload(&ip);
      continue;
    }
    IrModule *m = ip.cp.ir;
    Tensor **in = interp_random_inputs(m, 2), **pa = interp_random_params(m, 2);
    Tensor *ref[1] = {0};
    InterpOptions o = {.precision = INTERP_F32};
    InterpStats st;
    if (!interp_run(m, &o, in, pa, ref, &st) || !interp_partition(&ip)) {
      ut_fail("setup failed: %s", st.error);
    } else {
      Op *ar = NULL, *ag = NULL;
      for (Op *op = m->main->first; op; op = op->next) {
        if (op->kind == OP_ALL_REDUCE && !ar) ar = op;
        if (op->kind == OP_ALL_GATHER && !ag) ag = op;
      }
      const char *what = "";
      if (variant == 0 && ar) {
        what = "an all_reduce over no axes";
        ar->axes = 0;
      } else if (variant == 1 && ag) {
        what = "an all_gather taken out";
        ir_replace_uses(m->main, ag->results[0], ag->operands[0]);
      } else if (variant == 2) {
        /* a ring shift over `data` of the output (a legal collective in the wrong place): every
         * check passes, only the numbers are wrong */
        what = "a collective_permute before the output";
        Value *out = m->main->outputs[0];
        Op *c = ir_op_new(m, m->main, OP_PERMUTE, out->def->loc, &out, 1, &out->type, 1);
        c->axes = 1; /* data */
        c->results[0]->sharding = out->sharding;
        ir_append(m->main, c);
        m->main->outputs[0] = c->results[0];
      }
      InterpCheck c;
      bool r = interp_check_spmd(m, ip.cp.prog->mesh, &o, in, pa, ref, &c);
      UT_CHECK(!r || c.worst_rel > 0.01, "%s went unnoticed (worst relative error %g)", what, c.worst_rel);
      if (variant == 2) UT_CHECK(r, "the permuted program should run (and differ): %s", c.stats.error);
      interp_check_free(&c);
    }
    tensor_free(ref[0]);
    interp_free_tensors(in, interp_ninputs(m));
    interp_free_tensors(pa, m->nparams);
    unload(&ip);
  }
  ut_end();
}

int main(void) {
  test_contract();
  test_elementwise();
  test_unary();
  test_reductions();
  test_softmax_norms();
  test_reshapes();
  test_take_causal_cast();
  test_rounding();
  test_grad_ops();
  test_train_ops();
  test_attention_by_hand();
  test_fusion();
  test_loops();
  test_spmd_hand();
  global_run("program.mlp_global", SHARDC_SAMPLES "/mlp.shard", mlp_small, 4, "mlp.forward");
  static const char *llama_brief[] = {"batch=2", "seq=8", "embed=16", "hidden=32", "heads=4", "kv_heads=2",
                                      "group=2", "head=4", "vocab=64", "layers=2"};
  global_run("program.llama3_8b_small_global", SHARDC_SAMPLES "/llama3_8b.shard", llama_brief, 10, "llama.forward");
  test_spmd_mlp();
  test_spmd_llama();
  test_spmd_must_fail();
  test_train_steps();
  if (diag_sink) fclose(diag_sink);
  return ut_summary();
}
