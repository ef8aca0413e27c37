/* lower.c: the IR of one function (global, or one device's after localisation) to an LLVM
 * function with the runtime's RtEntry signature (lower.h).
 *
 * Buffers come from rt_alloc (row-major in its type's dim order, local extents, stored at its
 * dtype's width) by the buffer plan `check` reports (bufplan.h): views share their operand's
 * buffer, in-place results and updates take the buffer the plan gives them where the lowering can
 * follow it (plan_share), and a buffer is freed after the last op that reads any value in it.
 * Elementwise ops, broadcasts, casts, transposes, slices and causal masks are loop nests over the
 * result's dims, each operand read through its strides (0 along a dim it lacks) and widened to
 * f32; reductions are a nest over the kept dims around a nest over the reduced ones (summing in
 * f64, as the interpreter does); contractions call rt_gemm, the operands copied into [batch, m, k]
 * and [batch, k, n] order first when they are not already in it (or its transpose); collectives
 * call the runtime's, their shapes from Op.coll. What does not lower is a located error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/DebugInfo.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>

#include "bufplan.h"
#include "diag.h"
#include "dropout.h"
#include "step.h"
#include "lower_int.h"
#include "sim.h"

/* ---- types and helpers ---- */

static int64_t extent(const Lower *L, const Value *v, int d) {
  return L->mesh ? v->local[d] : v->type.dims[d]->size;
}

static int64_t elements(const Lower *L, const Value *v) {
  int64_t n = 1;
  for (int d = 0; d < v->type.rank; d++) n *= extent(L, v, d);
  return n;
}

int lower_rt_dtype(DType dt) { return devprog_rt_dtype(dt); }

static LLVMValueRef ci64(Lower *L, int64_t v) { return LLVMConstInt(L->i64, (unsigned long long)v, 1); }
static LLVMValueRef ci32(Lower *L, int v) { return LLVMConstInt(L->i32, (unsigned long long)(int64_t)v, 1); }
static LLVMValueRef cf32(Lower *L, double v) { return LLVMConstReal(L->f32, v); }

static bool fail(Lower *L, const Op *op, const char *fmt, const char *what) {
  char msg[256];
  snprintf(msg, sizeof msg, fmt, what);
  diag_error(op->loc, "run: %s", msg);
  L->failed = true;
  return false;
}

LLVMValueRef lower_intrinsic(Lower *L, const char *name, LLVMValueRef *args, int n) {
  unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
  LLVMTypeRef t = LLVMTypeOf(args[0]);
  LLVMValueRef f = LLVMGetIntrinsicDeclaration(L->M, id, &t, 1);
  LLVMTypeRef ft = LLVMIntrinsicGetType(L->C, id, &t, 1);
  return LLVMBuildCall2(L->B, ft, f, args, (unsigned)n, "");
}

void lower_check_rc(Lower *L, LLVMValueRef rc) {
  LLVMBasicBlockRef bad = LLVMAppendBasicBlockInContext(L->C, L->fn, "rt.fail");
  LLVMBasicBlockRef ok = LLVMAppendBasicBlockInContext(L->C, L->fn, "rt.ok");
  LLVMBuildCondBr(L->B, LLVMBuildICmp(L->B, LLVMIntNE, rc, ci32(L, 0), ""), bad, ok);
  LLVMPositionBuilderAtEnd(L->B, bad);
  LLVMBuildRet(L->B, rc);
  LLVMPositionBuilderAtEnd(L->B, ok);
}

static LLVMValueRef cstr(Lower *L, const char *s) { return LLVMBuildGlobalStringPtr(L->B, s, "str"); }

static LLVMValueRef gep(Lower *L, LLVMTypeRef t, LLVMValueRef base, LLVMValueRef off) {
  return LLVMBuildInBoundsGEP2(L->B, t, base, &off, 1, "");
}

static LLVMTypeRef storage_type(Lower *L, DType dt) {
  switch (dt) {
  case DT_BF16: return L->i16;
  case DT_F16: return L->f16;
  case DT_F8E4M3: case DT_F8E5M2: return L->i8;
  case DT_I32: return L->i32;
  default: return L->f32;
  }
}

LLVMValueRef lower_load(Lower *L, const NestTensor *t, LLVMValueRef off) {
  LLVMTypeRef st = storage_type(L, t->dt);
  LLVMValueRef v = LLVMBuildLoad2(L->B, st, gep(L, st, t->base, off), "");
  switch (t->dt) {
  case DT_BF16: {
    LLVMValueRef w = LLVMBuildShl(L->B, LLVMBuildZExt(L->B, v, L->i32, ""), ci32(L, 16), "");
    return LLVMBuildBitCast(L->B, w, L->f32, "");
  }
  case DT_F16: return LLVMBuildFPExt(L->B, v, L->f32, "");
  case DT_F8E4M3: case DT_F8E5M2: return lower_f8_decode(L, v, t->dt);
  default: return v;
  }
}

/* f32 to bf16 bits, round to nearest even; NaN stays a (quiet) NaN. */
static LLVMValueRef to_bf16(Lower *L, LLVMValueRef x) {
  LLVMValueRef b = LLVMBuildBitCast(L->B, x, L->i32, "");
  LLVMValueRef lsb = LLVMBuildAnd(L->B, LLVMBuildLShr(L->B, b, ci32(L, 16), ""), ci32(L, 1), "");
  LLVMValueRef r = LLVMBuildLShr(L->B, LLVMBuildAdd(L->B, b, LLVMBuildAdd(L->B, lsb, ci32(L, 0x7fff), ""), ""), ci32(L, 16), "");
  LLVMValueRef nan = LLVMBuildOr(L->B, LLVMBuildLShr(L->B, b, ci32(L, 16), ""), ci32(L, 0x40), "");
  LLVMValueRef isnan = LLVMBuildFCmp(L->B, LLVMRealUNO, x, x, "");
  return LLVMBuildTrunc(L->B, LLVMBuildSelect(L->B, isnan, nan, r, ""), L->i16, "");
}

void lower_store(Lower *L, const NestTensor *t, LLVMValueRef off, LLVMValueRef v) {
  LLVMTypeRef st = storage_type(L, t->dt);
  if (t->dt == DT_BF16) v = to_bf16(L, v);
  else if (t->dt == DT_F16) v = LLVMBuildFPTrunc(L->B, v, L->f16, "");
  else if (dtype_is_f8(t->dt)) v = lower_f8_encode(L, v, t->dt);
  LLVMBuildStore(L->B, v, gep(L, st, t->base, off));
}

/* Loop metadata: no unrolling (at the small sizes tests run, O2 would unroll every nest whole and
 * the module grow tenfold; the vectoriser still widens the inner loops and interleaves them). */
static void no_unroll(Lower *L, LLVMValueRef br) {
  LLVMMetadataRef str = LLVMMDStringInContext2(L->C, "llvm.loop.unroll.disable", 24);
  LLVMMetadataRef disable = LLVMMDNodeInContext2(L->C, &str, 1);
  LLVMMetadataRef tmp = LLVMTemporaryMDNode(L->C, NULL, 0);
  LLVMMetadataRef ops[2] = {tmp, disable};
  LLVMMetadataRef loop = LLVMMDNodeInContext2(L->C, ops, 2);
  LLVMMetadataReplaceAllUsesWith(tmp, loop);
  LLVMSetMetadata(br, LLVMGetMDKindIDInContext(L->C, "llvm.loop", 9), LLVMMetadataAsValue(L->C, loop));
}

/* ---- loop nests ----
 * Loops over dims 0..nd-1 (dims of extent 1 get none), innermost last; offs[i] is tensor i's
 * element offset, idx[d] dim d's index (i64). Nothing runs when an extent is 0. */
typedef struct NestState {
  int nd;
  const int64_t *ext;
  NestTensor *t;
  int nt;
  NestBody body;
  void *ctx;
  LLVMValueRef idx[MAX_RANK * 2];
} NestState;

static void nest_level(Lower *L, NestState *S, int d, LLVMValueRef *offs) {
  if (d == S->nd) {
    S->body(L, offs, S->idx, S->ctx);
    return;
  }
  LLVMValueRef inner[16];
  if (S->ext[d] == 1) {
    S->idx[d] = ci64(L, 0);
    nest_level(L, S, d + 1, offs);
    return;
  }
  LLVMBasicBlockRef pre = LLVMGetInsertBlock(L->B);
  LLVMBasicBlockRef loop = LLVMAppendBasicBlockInContext(L->C, L->fn, "loop");
  LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(L->C, L->fn, "loop.end");
  LLVMBuildBr(L->B, loop);
  LLVMPositionBuilderAtEnd(L->B, loop);
  LLVMValueRef i = LLVMBuildPhi(L->B, L->i64, "i");
  S->idx[d] = i;
  for (int k = 0; k < S->nt; k++)
    inner[k] = S->t[k].stride[d] ? LLVMBuildAdd(L->B, offs[k], LLVMBuildMul(L->B, i, ci64(L, S->t[k].stride[d]), ""), "") : offs[k];
  nest_level(L, S, d + 1, inner);
  LLVMValueRef next = LLVMBuildAdd(L->B, i, ci64(L, 1), "");
  LLVMBasicBlockRef latch = LLVMGetInsertBlock(L->B);
  no_unroll(L, LLVMBuildCondBr(L->B, LLVMBuildICmp(L->B, LLVMIntSLT, next, ci64(L, S->ext[d]), ""), loop, done));
  LLVMValueRef zero = ci64(L, 0);
  LLVMAddIncoming(i, &zero, &pre, 1);
  LLVMAddIncoming(i, &next, &latch, 1);
  LLVMPositionBuilderAtEnd(L->B, done);
}

void lower_nest(Lower *L, int nd, const int64_t *ext, NestTensor *t, int nt, NestBody body, void *ctx) {
  double n = (L->repeat > 0 ? L->repeat : 1) * (L->mesh ? (double)L->mesh->devices : 1) * nt;
  for (int d = 0; d < nd; d++) {
    if (ext[d] <= 0) return;
    n *= (double)ext[d];
  }
  L->lw->loop_work += n, L->lw->nests++;
  NestState S = {.nd = nd, .ext = ext, .t = t, .nt = nt, .body = body, .ctx = ctx};
  LLVMValueRef offs[16];
  for (int k = 0; k < nt; k++) offs[k] = t[k].off0 ? t[k].off0 : ci64(L, 0);
  nest_level(L, &S, 0, offs);
}

/* Row-major strides of v's local block. */
static void strides_of(const Lower *L, const Value *v, int64_t *st) {
  int64_t s = 1;
  for (int d = v->type.rank - 1; d >= 0; d--) {
    st[d] = s;
    s *= extent(L, v, d);
  }
}

/* A nest tensor for v with its strides along `dims` (0 where v lacks the dim). */
static NestTensor tensor_along(Lower *L, const Value *v, Dim *const *dims, int nd) {
  NestTensor t = {.base = L->buf[v->id], .dt = v->type.dtype};
  int64_t st[MAX_RANK];
  strides_of(L, v, st);
  for (int d = 0; d < nd; d++) {
    int p = tensor_type_find(&v->type, dims[d]);
    t.stride[d] = p < 0 ? 0 : st[p];
  }
  return t;
}

static bool lower_region(Lower *L, const IrFunc *f);
static void free_region(Lower *L, const IrFunc *f);
static bool lower_loop(Lower *L, const Op *op);

/* ---- buffers ---- */

/* An alloca in the entry block (so that loops do not grow the stack). */
static LLVMValueRef entry_alloca(Lower *L, LLVMTypeRef t, const char *name) {
  LLVMBasicBlockRef here = LLVMGetInsertBlock(L->B);
  LLVMBasicBlockRef entry = LLVMGetEntryBasicBlock(L->fn);
  LLVMValueRef first = LLVMGetFirstInstruction(entry);
  if (first) LLVMPositionBuilderBefore(L->B, first);
  else LLVMPositionBuilderAtEnd(L->B, entry);
  LLVMValueRef a = LLVMBuildAlloca(L->B, t, name);
  LLVMPositionBuilderAtEnd(L->B, here);
  return a;
}

static LLVMValueRef alloc_buffer(Lower *L, const Value *v, int64_t bytes) {
  LLVMValueRef slot = entry_alloca(L, L->ptr, "buf");
  char name[128];
  if (v->name) snprintf(name, sizeof name, "%s", v->name);
  else snprintf(name, sizeof name, "%%%d", v->id);
  LLVMValueRef av[4] = {L->dev, ci64(L, bytes > 0 ? bytes : 1), cstr(L, name), slot};
  lower_check_rc(L, lower_rt(L, RTFN_rt_alloc, av, 4));
  return LLVMBuildLoad2(L->B, L->ptr, slot, v->name ? v->name : "");
}

/* v's buffer: the one the plan puts it in (L->share: an operand's read for the last time, or the
 * param or state an update replaces), its row of a loop's stacked result (L->dest), or its own. */
static void new_buffer(Lower *L, const Value *v) {
  int s = L->share ? L->share[v->id] : -1;
  if (s >= 0 && L->buf[s]) {
    L->buf[v->id] = L->buf[s];
    L->root[v->id] = L->root[s];
    return;
  }
  if (L->dest && L->dest[v->id]) {
    L->buf[v->id] = L->dest[v->id];
    L->root[v->id] = v->id;
    L->owned[v->id] = false;
    return;
  }
  int64_t bytes = elements(L, v) * dtype_bytes(v->type.dtype);
  L->buf[v->id] = alloc_buffer(L, v, bytes);
  L->root[v->id] = v->id;
  L->owned[v->id] = true;
}

static void view_of(Lower *L, const Value *v, const Value *of) {
  L->buf[v->id] = L->buf[of->id];
  L->root[v->id] = L->root[of->id];
}

static void free_ptr(Lower *L, LLVMValueRef p) {
  LLVMValueRef av[2] = {L->dev, p};
  lower_rt(L, RTFN_rt_free, av, 2);
}

static void free_root(Lower *L, int id) { free_ptr(L, L->buf[id]); }

/* ---- elementwise ---- */

typedef struct MapCtx {
  const Op *op;
  NestTensor *t;        /* [0] the result, then the operands (the leaves, under fusion) */
  int n;                /* operands */
  const Value **leaf;   /* fusion: the values t[1..] hold (NULL: t[1..] are op's operands) */
  int nleaf;
} MapCtx;

#define FUSE_MAX_LEAVES 12

/* Elementwise ops a chain fuses: those with a scalar function (ops.def), which is all there is to
 * them. */
static bool fusable_kind(OpKind k) { return ir_op_info(k)->fn; }

static bool float_op(const Op *op) {
  if (op->nresults != 1 || dtype_is_int(op->results[0]->type.dtype) || lower_rt_dtype(op->results[0]->type.dtype) < 0) return false;
  for (int i = 0; i < op->noperands; i++)
    if (dtype_is_int(op->operands[i]->type.dtype) || lower_rt_dtype(op->operands[i]->type.dtype) < 0) return false;
  return op->noperands <= 7;
}

/* The values op's nest reads: its operands, through the fused ones to theirs. */
static int op_leaves(const Lower *L, const Op *op, const Value **out, int n) {
  for (int i = 0; i < op->noperands; i++) {
    const Value *x = op->operands[i];
    if (L->fused && L->fused[x->id]) {
      n = op_leaves(L, x->def, out, n);
      continue;
    }
    bool seen = false;
    for (int k = 0; k < n; k++) seen |= out[k] == x;
    if (!seen && n < 16) out[n++] = x;
  }
  return n;
}

/* x as a value of dtype dt holds it (bf16, f16: rounded to nearest even and widened back). */
static LLVMValueRef round_to(Lower *L, LLVMValueRef x, DType dt) {
  if (dt == DT_BF16) {
    LLVMValueRef w = LLVMBuildShl(L->B, LLVMBuildZExt(L->B, to_bf16(L, x), L->i32, ""), ci32(L, 16), "");
    return LLVMBuildBitCast(L->B, w, L->f32, "");
  }
  if (dt == DT_F16) return LLVMBuildFPExt(L->B, LLVMBuildFPTrunc(L->B, x, L->f16, ""), L->f32, "");
  if (dtype_is_f8(dt)) return lower_f8_decode(L, lower_f8_encode(L, x, dt), dt);
  return x;
}

/* v at the nest's position: loaded (a leaf), or computed from its fused op's operands. */
static LLVMValueRef eval_value(Lower *L, MapCtx *c, const Value *v, LLVMValueRef *offs, bool ints) {
  if (c->leaf && L->fused[v->id]) {
    const Op *p = v->def;
    LLVMValueRef a[8];
    for (int i = 0; i < p->noperands; i++) a[i] = eval_value(L, c, p->operands[i], offs, false);
    return round_to(L, lower_scalar(L, p, a, false), v->type.dtype);
  }
  int k = 0;
  if (c->leaf)
    while (k < c->nleaf && c->leaf[k] != v) k++;
  else
    while (k < c->n && c->op->operands[k] != v) k++;
  LLVMValueRef x = lower_load(L, &c->t[k + 1], offs[k + 1]);
  if (!ints && dtype_is_int(c->t[k + 1].dt)) x = LLVMBuildSIToFP(L->B, x, L->f32, "");
  return x;
}

static void map_body(Lower *L, LLVMValueRef *offs, LLVMValueRef *idx, void *vctx) {
  MapCtx *c = vctx;
  LLVMValueRef v[8];
  bool ints = dtype_is_int(c->t[0].dt);
  for (int i = 0; i < c->n; i++) v[i] = eval_value(L, c, c->op->operands[i], offs, ints);
  LLVMValueRef r;
  if (!ir_op_info(c->op->kind)->fn) { /* a cast (a broadcast keeps its operand's dtype): the value converted */
    bool from_int = dtype_is_int(c->t[1].dt);
    if (ints && !from_int) {
      LLVMTypeRef tys[2] = {L->i32, L->f32};
      unsigned id = LLVMLookupIntrinsicID("llvm.fptosi.sat", 15);
      LLVMValueRef f = LLVMGetIntrinsicDeclaration(L->M, id, tys, 2);
      r = LLVMBuildCall2(L->B, LLVMIntrinsicGetType(L->C, id, tys, 2), f, v, 1, "");
    } else r = v[0];
  } else r = lower_scalar(L, c->op, v, ints);
  lower_store(L, &c->t[0], offs[0], r);
}

static bool lower_map(Lower *L, const Op *op) {
  const Value *res = op->results[0];
  if (op->noperands > 7) return fail(L, op, "%s has too many operands to lower", ir_op_name(op->kind));
  for (int i = 0; i < op->noperands; i++)
    if (lower_rt_dtype(op->operands[i]->type.dtype) < 0) return fail(L, op, "dtype %s is not lowered yet", dtype_name(op->operands[i]->type.dtype));
  if (lower_rt_dtype(res->type.dtype) < 0) return fail(L, op, "dtype %s is not lowered yet", dtype_name(res->type.dtype));
  if (dtype_is_int(res->type.dtype) && !(ir_op_info(op->kind)->flags & OPF_INT))
    return fail(L, op, "%s on integers is not lowered yet", ir_op_name(op->kind));
  const Value *leaf[16];
  int nleaf = op_leaves(L, op, leaf, 0);
  bool fusion = false;
  for (int i = 0; i < op->noperands; i++) fusion |= L->fused[op->operands[i]->id];
  new_buffer(L, res); /* in place where the plan says so (plan_share) */
  NestTensor t[17];
  int64_t ext[MAX_RANK];
  for (int d = 0; d < res->type.rank; d++) ext[d] = extent(L, res, d);
  t[0] = tensor_along(L, res, res->type.dims, res->type.rank);
  MapCtx c = {.op = op, .t = t, .n = op->noperands};
  if (fusion) {
    for (int k = 0; k < nleaf; k++) t[k + 1] = tensor_along(L, leaf[k], res->type.dims, res->type.rank);
    c.leaf = leaf, c.nleaf = nleaf;
    lower_nest(L, res->type.rank, ext, t, nleaf + 1, map_body, &c);
  } else {
    for (int i = 0; i < op->noperands; i++) t[i + 1] = tensor_along(L, op->operands[i], res->type.dims, res->type.rank);
    lower_nest(L, res->type.rank, ext, t, op->noperands + 1, map_body, &c);
  }
  return true;
}

/* A copy of x into the result's dim order, from an element offset (transpose, slice). */
static void copy_body(Lower *L, LLVMValueRef *offs, LLVMValueRef *idx, void *vctx) {
  MapCtx *c = vctx;
  LLVMTypeRef st = storage_type(L, c->t[0].dt);
  LLVMValueRef v = LLVMBuildLoad2(L->B, st, gep(L, st, c->t[1].base, offs[1]), "");
  LLVMBuildStore(L->B, v, gep(L, st, c->t[0].base, offs[0]));
}

/* A value per device (an i64, or a flag: an i1) as a constant table read at the device's index. */
static LLVMValueRef per_device(Lower *L, const int64_t *v, const char *name) {
  LLVMValueRef g = lower_rt_array(L, RT_KIND_I64, v, L->m->dev->ndev, name);
  return LLVMBuildLoad2(L->B, L->i64, gep(L, L->i64, g, L->devidx), name);
}

LLVMValueRef lower_per_device_flag(Lower *L, const uint8_t *v, const char *name) {
  LLVMValueRef g = lower_rt_array(L, RT_KIND_I8, v, L->m->dev->ndev, name);
  LLVMValueRef at = LLVMBuildLoad2(L->B, L->i8, gep(L, L->i8, g, L->devidx), name);
  return LLVMBuildICmp(L->B, LLVMIntNE, at, LLVMConstInt(L->i8, 0, 0), "");
}

/* The device's start of op's block along dim d (the device program's offsets: dev_op_offset, a
 * table over the devices); 0 when the op reads none there, and in a global run. */
static LLVMValueRef dim_offset(Lower *L, const Op *op, const Dim *d) {
  const DevOp *o = op->dev;
  bool any = false;
  for (int i = 0; L->mesh && o && i < o->noffs; i++) any |= o->offs[i].dim == d && o->offs[i].groups && o->offs[i].groups->size > 1;
  if (!any) return ci64(L, 0);
  int64_t *t = ARENA_ARRAY(&L->lw->arena, int64_t, L->m->dev->ndev);
  for (int64_t dev = 0; dev < L->m->dev->ndev; dev++) t[dev] = dev_op_offset(o, d, dev);
  return per_device(L, t, "offset");
}

/* The loop nest over res's dims for an op that writes res from one tensor x read along them:
 * their extents into ext, res as t[0] and x as t[1]. */
static void nest_pair(Lower *L, const Value *res, const Value *x, NestTensor *t, int64_t *ext) {
  for (int d = 0; d < res->type.rank; d++) ext[d] = extent(L, res, d);
  t[0] = tensor_along(L, res, res->type.dims, res->type.rank);
  t[1] = tensor_along(L, x, res->type.dims, res->type.rank);
}

static bool lower_copy(Lower *L, const Op *op) {
  const Value *res = op->results[0], *x = op->operands[0];
  new_buffer(L, res);
  NestTensor t[2];
  int64_t ext[MAX_RANK];
  nest_pair(L, res, x, t, ext);
  if (op->kind == OP_SLICE && L->mesh && op->dev) { /* the block's start within the operand's */
    int64_t st[MAX_RANK];
    strides_of(L, x, st);
    int64_t *tab = ARENA_ARRAY(&L->lw->arena, int64_t, L->m->dev->ndev);
    bool any = false;
    for (int64_t dev = 0; dev < L->m->dev->ndev; dev++)
      for (int i = 0; i < op->dev->noffs; i++) {
        const DevOffset *o = &op->dev->offs[i];
        int p = tensor_type_find(&x->type, o->dim);
        if (p < 0 || !o->groups || o->groups->size <= 1) continue;
        tab[dev] += dev_block_start(o->groups, dev, o->extent) * st[p];
        any = true;
      }
    t[1].off0 = any ? per_device(L, tab, "slice_offset") : ci64(L, 0);
  }
  MapCtx c = {.op = op, .t = t, .n = 1};
  lower_nest(L, res->type.rank, ext, t, 2, copy_body, &c);
  return true;
}

/* causal (-inf) and causal_grad (0) where the key's global index exceeds the query's. */
typedef struct CausalCtx {
  NestTensor *t;
  int pq, pk;
  LLVMValueRef oq, ok;
  double fill;
} CausalCtx;

static void causal_body(Lower *L, LLVMValueRef *offs, LLVMValueRef *idx, void *vctx) {
  CausalCtx *c = vctx;
  LLVMValueRef v = lower_load(L, &c->t[1], offs[1]);
  LLVMValueRef q = LLVMBuildAdd(L->B, idx[c->pq], c->oq, ""), k = LLVMBuildAdd(L->B, idx[c->pk], c->ok, "");
  LLVMValueRef masked = LLVMBuildICmp(L->B, LLVMIntSGT, k, q, "");
  lower_store(L, &c->t[0], offs[0], LLVMBuildSelect(L->B, masked, cf32(L, c->fill), v, ""));
}

static bool lower_causal(Lower *L, const Op *op) {
  const Value *res = op->results[0], *x = op->operands[0];
  if (L->mesh && (dev_dim_order(L->m->dev, op->dims[0], -1).kind != RT_ORDER_NATURAL ||
                  dev_dim_order(L->m->dev, op->dims[1], -1).kind != RT_ORDER_NATURAL))
    return fail(L, op, "%s over a zigzag-ordered sequence is not lowered yet", "causal");
  new_buffer(L, res);
  NestTensor t[2];
  int64_t ext[MAX_RANK];
  nest_pair(L, res, x, t, ext);
  CausalCtx c = {.t = t, .pq = tensor_type_find(&res->type, op->dims[0]), .pk = tensor_type_find(&res->type, op->dims[1]),
                 .fill = op->kind == OP_CAUSAL ? -INFINITY : 0.0};
  if (c.pq < 0 || c.pk < 0) return fail(L, op, "%s: a masked dim is missing", ir_op_name(op->kind));
  c.oq = dim_offset(L, op, op->dims[0]);
  c.ok = dim_offset(L, op, op->dims[1]);
  lower_nest(L, res->type.rank, ext, t, 2, causal_body, &c);
  return true;
}

/* dropout (dropout.h): the element's global index over dims[] (row-major, global sizes), its
 * splitmix64 hash against the threshold, x * scale where kept, else 0. */
typedef struct DropoutCtx {
  NestTensor *t;
  int n;                        /* dims[] */
  int pos[MAX_RANK];            /* dims[k]'s position in the result */
  int64_t size[MAX_RANK];       /* dims[k]'s global size */
  LLVMValueRef off[MAX_RANK];   /* the device's start along dims[k] */
  uint64_t key, thr;
  float scale;
} DropoutCtx;

static LLVMValueRef cu64(Lower *L, uint64_t v) { return LLVMConstInt(L->i64, v, 0); }

static void dropout_body(Lower *L, LLVMValueRef *offs, LLVMValueRef *idx, void *vctx) {
  DropoutCtx *c = vctx;
  LLVMValueRef g = ci64(L, 0);
  for (int k = 0; k < c->n; k++)
    g = LLVMBuildAdd(L->B, LLVMBuildMul(L->B, g, ci64(L, c->size[k]), ""),
                     LLVMBuildAdd(L->B, idx[c->pos[k]], c->off[k], ""), "");
  LLVMValueRef z = LLVMBuildAdd(L->B, cu64(L, c->key),
                                LLVMBuildMul(L->B, LLVMBuildAdd(L->B, g, cu64(L, 1), ""), cu64(L, DROPOUT_GOLDEN), ""), "");
  z = LLVMBuildMul(L->B, LLVMBuildXor(L->B, z, LLVMBuildLShr(L->B, z, cu64(L, 30), ""), ""), cu64(L, DROPOUT_MIX1), "");
  z = LLVMBuildMul(L->B, LLVMBuildXor(L->B, z, LLVMBuildLShr(L->B, z, cu64(L, 27), ""), ""), cu64(L, DROPOUT_MIX2), "");
  z = LLVMBuildXor(L->B, z, LLVMBuildLShr(L->B, z, cu64(L, 31), ""), "");
  LLVMValueRef top = LLVMBuildLShr(L->B, z, cu64(L, 64 - DROPOUT_BITS), "");
  LLVMValueRef keep = LLVMBuildICmp(L->B, LLVMIntUGE, top, cu64(L, c->thr), "");
  LLVMValueRef v = LLVMBuildFMul(L->B, lower_load(L, &c->t[1], offs[1]), cf32(L, c->scale), "");
  lower_store(L, &c->t[0], offs[0], LLVMBuildSelect(L->B, keep, v, cf32(L, 0.0), ""));
}

static bool lower_dropout(Lower *L, const Op *op) {
  const Value *res = op->results[0], *x = op->operands[0];
  DropoutCtx c = {.n = op->ndims, .key = dropout_key((uint64_t)op->index, 0), .thr = dropout_threshold(op->scalar),
                  .scale = dropout_scale(op->scalar)};
  for (int k = 0; k < op->ndims; k++) {
    if (L->mesh && dev_dim_order(L->m->dev, op->dims[k], -1).kind != RT_ORDER_NATURAL)
      return fail(L, op, "%s over a zigzag-ordered sequence is not lowered yet", "dropout");
    if ((c.pos[k] = tensor_type_find(&res->type, op->dims[k])) < 0) return fail(L, op, "%s: a dim is missing", "dropout");
    c.size[k] = op->dims[k]->size;
    c.off[k] = dim_offset(L, op, op->dims[k]);
  }
  new_buffer(L, res);
  NestTensor t[2];
  int64_t ext[MAX_RANK];
  nest_pair(L, res, x, t, ext);
  c.t = t;
  lower_nest(L, res->type.rank, ext, t, 2, dropout_body, &c);
  return true;
}

/* ---- reductions ---- */

typedef struct ReduceCtx {
  const Op *op;
  NestTensor *t;        /* [0] result (strides along the kept dims), [1] operand */
  NestTensor inner;     /* the operand along the reduced dims */
  int nred;
  int64_t red_ext[MAX_RANK];
  LLVMValueRef acc;
  double divisor;
} ReduceCtx;

static void reduce_inner(Lower *L, LLVMValueRef *offs, LLVMValueRef *idx, void *vctx) {
  ReduceCtx *c = vctx;
  LLVMValueRef v = LLVMBuildFPExt(L->B, lower_load(L, &c->inner, offs[0]), L->f64, "");
  LLVMValueRef s = LLVMBuildLoad2(L->B, L->f64, c->acc, "");
  LLVMValueRef r;
  if (c->op->kind == OP_MAX) {
    /* v > s or v is NaN: take v, unless s is already NaN */
    LLVMValueRef take = LLVMBuildOr(L->B, LLVMBuildFCmp(L->B, LLVMRealOGT, v, s, ""), LLVMBuildFCmp(L->B, LLVMRealUNO, v, v, ""), "");
    take = LLVMBuildAnd(L->B, take, LLVMBuildFCmp(L->B, LLVMRealORD, s, s, ""), "");
    r = LLVMBuildSelect(L->B, take, v, s, "");
  } else r = LLVMBuildFAdd(L->B, s, v, "");
  LLVMBuildStore(L->B, r, c->acc);
}

static void reduce_outer(Lower *L, LLVMValueRef *offs, LLVMValueRef *idx, void *vctx) {
  ReduceCtx *c = vctx;
  LLVMBuildStore(L->B, LLVMConstReal(L->f64, c->op->kind == OP_MAX ? -INFINITY : 0.0), c->acc);
  c->inner.off0 = offs[1];
  lower_nest(L, c->nred, c->red_ext, &c->inner, 1, reduce_inner, c);
  LLVMValueRef s = LLVMBuildLoad2(L->B, L->f64, c->acc, "");
  if (c->op->kind == OP_MEAN) s = LLVMBuildFDiv(L->B, s, LLVMConstReal(L->f64, c->divisor), "");
  lower_store(L, &c->t[0], offs[0], LLVMBuildFPTrunc(L->B, s, L->f32, ""));
}

static bool lower_reduce(Lower *L, const Op *op) {
  const Value *res = op->results[0], *x = op->operands[0];
  if (dtype_is_int(x->type.dtype) || lower_rt_dtype(x->type.dtype) < 0 || lower_rt_dtype(res->type.dtype) < 0)
    return fail(L, op, "%s over this dtype is not lowered yet", ir_op_name(op->kind));
  new_buffer(L, res);
  NestTensor t[2];
  int64_t ext[MAX_RANK];
  nest_pair(L, res, x, t, ext);
  ReduceCtx c = {.op = op, .t = t, .nred = op->ndims};
  c.inner = tensor_along(L, x, op->dims, op->ndims);
  double count = 1;
  for (int k = 0; k < op->ndims; k++) {
    int p = tensor_type_find(&x->type, op->dims[k]);
    if (p < 0) return fail(L, op, "reduced dim %s is not in the operand", op->dims[k]->name);
    c.red_ext[k] = extent(L, x, p);
    count *= (double)op->dims[k]->size;
  }
  c.divisor = op->divisor > 0 ? op->divisor : count;
  c.acc = entry_alloca(L, L->f64, "acc");
  lower_nest(L, res->type.rank, ext, t, 2, reduce_outer, &c);
  return true;
}

/* ---- contractions: rt_gemm ---- */

/* Canonical operands: a as [B, M, K], b as [B, K, N], c as [B, M, N], B and M and N in the
 * result's order, K in a's order. An operand already in that order (or with its two matrix groups
 * swapped: a transposed) is used as it is; otherwise it is copied into it. */
typedef struct Group {
  Dim *dims[MAX_RANK];
  int n;
  int64_t size;
} Group;

static void group_add(Group *g, Dim *d, int64_t ext) {
  g->dims[g->n++] = d;
  g->size *= ext;
}

/* Whether v's dims are exactly x then y then z (groups), in order. */
static bool laid_out(const Value *v, const Group *x, const Group *y, const Group *z) {
  const Group *gs[3] = {x, y, z};
  int p = 0;
  for (int g = 0; g < 3; g++)
    for (int i = 0; i < gs[g]->n; i++, p++)
      if (p >= v->type.rank || v->type.dims[p] != gs[g]->dims[i]) return false;
  return p == v->type.rank;
}

/* A scratch copy of v in the dim order of groups x, y, z (f32 kept at v's dtype). */
static LLVMValueRef copy_ordered(Lower *L, const Value *v, const Group *x, const Group *y, const Group *z, LLVMValueRef *to_free) {
  Dim *dims[MAX_RANK];
  int64_t ext[MAX_RANK];
  int nd = 0;
  const Group *gs[3] = {x, y, z};
  for (int g = 0; g < 3; g++)
    for (int i = 0; i < gs[g]->n; i++) {
      dims[nd] = gs[g]->dims[i];
      ext[nd] = extent(L, v, tensor_type_find(&v->type, dims[nd]));
      nd++;
    }
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= ext[d];
  LLVMValueRef buf = alloc_buffer(L, v, n * dtype_bytes(v->type.dtype));
  NestTensor t[2];
  t[0] = (NestTensor){.base = buf, .dt = v->type.dtype};
  int64_t s = 1;
  for (int d = nd - 1; d >= 0; d--) t[0].stride[d] = s, s *= ext[d];
  t[1] = tensor_along(L, v, dims, nd);
  MapCtx c = {.t = t, .n = 1};
  lower_nest(L, nd, ext, t, 2, copy_body, &c);
  *to_free = buf;
  return buf;
}


/* The contraction into the buffers L->buf holds for its operands and result (made already). */
static bool contract_core(Lower *L, const Op *op) {
  const Value *res = op->results[0], *a = op->operands[0], *b = op->operands[1];
  /* a routed dispatch or combine (Op.flag) moves data through a 0/1 pattern: as a dense product it
   * gives the same values (it adds zeros), at the dense cost */
  for (int i = 0; i < 3; i++) {
    const Value *v = i == 0 ? res : op->operands[i - 1];
    DType dt = v->type.dtype;
    if (dt != DT_F32 && dt != DT_BF16 && dt != DT_F16 && !dtype_is_f8(dt))
      return fail(L, op, "contract over dtype %s is not lowered yet", dtype_name(dt));
  }
  Group B = {.size = 1}, M = {.size = 1}, N = {.size = 1}, K = {.size = 1};
  for (int i = 0; i < res->type.rank; i++) {
    Dim *d = res->type.dims[i];
    bool ina = tensor_type_find(&a->type, d) >= 0, inb = tensor_type_find(&b->type, d) >= 0;
    if (ina && inb) group_add(&B, d, extent(L, res, i));
    else if (ina) group_add(&M, d, extent(L, res, i));
    else if (inb) group_add(&N, d, extent(L, res, i));
    else return fail(L, op, "result dim %s is in neither operand", d->name);
  }
  for (int i = 0; i < a->type.rank; i++) {
    Dim *d = a->type.dims[i];
    if (tensor_type_find(&res->type, d) >= 0) continue;
    if (tensor_type_find(&b->type, d) < 0) return fail(L, op, "dim %s of the left operand is summed alone (not lowered yet)", d->name);
    group_add(&K, d, extent(L, a, i));
  }
  for (int i = 0; i < b->type.rank; i++)
    if (tensor_type_find(&res->type, b->type.dims[i]) < 0 && tensor_type_find(&a->type, b->type.dims[i]) < 0)
      return fail(L, op, "dim %s of the right operand is summed alone (not lowered yet)", b->type.dims[i]->name);
  LLVMValueRef free_a = NULL, free_b = NULL, free_c = NULL;
  int ta = 0, tb = 0;
  LLVMValueRef pa = L->buf[a->id], pb = L->buf[b->id], pc = L->buf[res->id];
  if (laid_out(a, &B, &M, &K)) ta = 0;
  else if (laid_out(a, &B, &K, &M)) ta = 1;
  else pa = copy_ordered(L, a, &B, &M, &K, &free_a);
  if (laid_out(b, &B, &K, &N)) tb = 0;
  else if (laid_out(b, &B, &N, &K)) tb = 1;
  else pb = copy_ordered(L, b, &B, &K, &N, &free_b);
  bool c_direct = laid_out(res, &B, &M, &N);
  if (!c_direct) pc = alloc_buffer(L, res, B.size * M.size * N.size * dtype_bytes(res->type.dtype)), free_c = pc;

  LLVMValueRef g = entry_alloca(L, lower_rt_type(L, RTS_RtGemm), "gemm");
  struct {
    int field;
    LLVMValueRef v;
  } f[] = {{RTF_RtGemm_a_type, ci32(L, lower_rt_dtype(a->type.dtype))}, {RTF_RtGemm_b_type, ci32(L, lower_rt_dtype(b->type.dtype))},
           {RTF_RtGemm_c_type, ci32(L, lower_rt_dtype(res->type.dtype))}, {RTF_RtGemm_trans_a, ci32(L, ta)},
           {RTF_RtGemm_trans_b, ci32(L, tb)}, {RTF_RtGemm_m, ci64(L, M.size)}, {RTF_RtGemm_n, ci64(L, N.size)},
           {RTF_RtGemm_k, ci64(L, K.size)}, {RTF_RtGemm_batch, ci64(L, B.size)}, {RTF_RtGemm_a, pa},
           {RTF_RtGemm_lda, ci64(L, ta ? M.size : K.size)}, {RTF_RtGemm_stride_a, ci64(L, M.size * K.size)}, {RTF_RtGemm_b, pb},
           {RTF_RtGemm_ldb, ci64(L, tb ? K.size : N.size)}, {RTF_RtGemm_stride_b, ci64(L, K.size * N.size)}, {RTF_RtGemm_c, pc},
           {RTF_RtGemm_ldc, ci64(L, N.size)}, {RTF_RtGemm_stride_c, ci64(L, M.size * N.size)}, {RTF_RtGemm_alpha, cf32(L, 1)},
           {RTF_RtGemm_beta, cf32(L, 0)}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) LLVMBuildStore(L->B, f[i].v, lower_rt_field(L, RTS_RtGemm, f[i].field, g));
  LLVMValueRef av[2] = {L->dev, g};
  lower_check_rc(L, lower_rt(L, RTFN_rt_gemm, av, 2));
  if (!c_direct) {
    /* from [B, M, N] into the result's order */
    Dim *dims[MAX_RANK];
    int64_t ext[MAX_RANK];
    int nd = 0;
    const Group *gs[3] = {&B, &M, &N};
    NestTensor t[2];
    t[0] = tensor_along(L, res, res->type.dims, 0);
    for (int gi = 0; gi < 3; gi++)
      for (int i = 0; i < gs[gi]->n; i++) dims[nd] = gs[gi]->dims[i], ext[nd] = extent(L, res, tensor_type_find(&res->type, dims[nd])), nd++;
    t[0] = tensor_along(L, res, dims, nd);
    t[1] = (NestTensor){.base = pc, .dt = res->type.dtype};
    int64_t s = 1;
    for (int d = nd - 1; d >= 0; d--) t[1].stride[d] = s, s *= ext[d];
    MapCtx c = {.t = t, .n = 1};
    lower_nest(L, nd, ext, t, 2, copy_body, &c);
  }
  LLVMValueRef frees[3] = {free_a, free_b, free_c};
  for (int i = 0; i < 3; i++)
    if (frees[i]) free_ptr(L, frees[i]);
  return true;
}

/* A collective matmul (devprog.h's DevCmm) at its first contraction: the AllGather it implements
 * made nothing (lower_collective), the later readers run here (their other operands exist: cmm.c
 * checks it). The device's own block of the gathered operand first, then the block of rank r - j
 * (mod n) that step j's permute (+1 around the groups, posted before the partial contractions and
 * waited after them) brought into the other of two block buffers; each reader's partial
 * contraction (the block against its other operand whole) goes into a block of its result's
 * shape with the gathered dim at the block's extent, then into the result at the block's
 * rank x extent along that dim (a table over the devices, one per step and reader). */
typedef struct CmmAdd {
  NestTensor *t;
  bool first;
} CmmAdd;

static void cmm_add_body(Lower *L, LLVMValueRef *offs, LLVMValueRef *idx, void *vctx) { /* t0 (+)= t1 */
  CmmAdd *c = vctx;
  LLVMValueRef v = lower_load(L, &c->t[1], offs[1]);
  if (!c->first) v = LLVMBuildFAdd(L->B, lower_load(L, &c->t[0], offs[0]), v, "");
  lower_store(L, &c->t[0], offs[0], v);
}

/* A nest copying (or, add: adding) from t[1] into t[0] over ext. */
static void cmm_nest(Lower *L, const Value *v, const int64_t *ext, NestTensor *t, int mode) {
  if (mode == 0) {
    MapCtx c = {.t = t, .n = 1};
    lower_nest(L, v->type.rank, ext, t, 2, copy_body, &c);
  } else {
    CmmAdd c = {.t = t, .first = mode == 1};
    lower_nest(L, v->type.rank, ext, t, 2, cmm_add_body, &c);
  }
}

static void contiguous(const Value *v, const int64_t *ext, int64_t *st) {
  int64_t s = 1;
  for (int d = v->type.rank - 1; d >= 0; d--) st[d] = s, s *= ext[d];
}

/* The byte offset, per device, of the block at hand at step j along a dim of stride `stride`
 * (elements): the gathered block of rank r - j (mod n) x E; the ReduceScatter side's block
 * r - 1 - j (mod n), the one whose accumulator the device sends on at step j. */
static LLVMValueRef cmm_block_offset(Lower *L, const DevCmm *cm, int j, int64_t stride, DType dt, bool mutate) {
  int n = cm->groups->size;
  int64_t *tab = ARENA_ARRAY(&L->lw->arena, int64_t, L->m->dev->ndev);
  for (int64_t dev = 0; dev < L->m->dev->ndev; dev++) {
    int32_t r = cm->groups->rank_of[dev];
    /* SHARDC_CMM_MUTATE=order (tests only): the wrong block (gather: r + j; scatter: one step off) */
    int32_t from = cm->scatter ? (mutate ? r - j : r - 1 - j) : mutate ? r + j : r - j;
    tab[dev] = r < 0 ? 0 : (int64_t)((from % n + n) % n) * cm->block * stride * dtype_bytes(dt);
  }
  return per_device(L, tab, "cmm_block");
}

/* A collective matmul (devprog.h's DevCmm) at its first contraction: the AllGather it implements
 * made nothing (lower_collective), the later readers run here (their other operands hold their
 * contents: cmm.c checks it). The device's own block of the gathered operand first, then the
 * block of rank r - j (mod n) that step j's permute (+1 around the groups, posted before the
 * partial contractions and waited after them) brought into the other of two block buffers. A
 * reader keeping the gathered dim: its partial contraction (the block against its other operand)
 * goes into a block of its result's shape, then into the result at the block's rank x extent
 * along that dim. A reader contracting it: the other operand's block r - j along it is copied out,
 * the partial product made in f32 and summed in an f32 buffer, rounded to the result once. */
static bool lower_cmm(Lower *L, const Op *op) {
  const DevCmm *cm = op->dev->cmm;
  const Value *x = cm->coll->operands[0];
  int n = cm->groups->size, dt = lower_rt_dtype(x->type.dtype), nr = cm->nreaders;
  if (dt < 0 || cm->steps != n - 1 || nr < 1 || cm->readers[0] != op)
    return fail(L, op, "a collective matmul over dtype %s", dtype_name(x->type.dtype));
  LLVMValueRef groups = lower_rt_groups(L, cm->groups);
  int64_t count = elements(L, x), E = cm->block;
  /* per reader, shadow values: what it reads, its result (and a contracted reader's other
   * operand) at one block (the same ids: L->buf says where), its op reading them, the buffers */
  Value xs[CMM_MAX_READERS], ys[CMM_MAX_READERS], ws[CMM_MAX_READERS];
  const Value *ops2[CMM_MAX_READERS][2];
  Value *res1[CMM_MAX_READERS][1];
  Op k[CMM_MAX_READERS];
  LLVMValueRef ybuf[CMM_MAX_READERS], part[CMM_MAX_READERS], wblk[CMM_MAX_READERS], acc[CMM_MAX_READERS];
  int64_t pext[CMM_MAX_READERS][MAX_RANK], wext[CMM_MAX_READERS][MAX_RANK];
  for (int i = 0; i < nr; i++) {
    const Op *c = cm->readers[i];
    const Value *Y = c->results[0], *W = c->operands[1 - cm->operand[i]];
    L->share[Y->id] = -1; /* its own buffer (plan_share gives a reader none) */
    new_buffer(L, Y);
    ybuf[i] = L->buf[Y->id];
    xs[i] = *cm->via[i];
    xs[i].local[cm->dim_in] = E;
    ys[i] = *Y;
    ws[i] = *W;
    ops2[i][0] = c->operands[0], ops2[i][1] = c->operands[1];
    ops2[i][cm->operand[i]] = &xs[i];
    wblk[i] = acc[i] = NULL;
    if (cm->dim_out[i] >= 0) {
      ys[i].local[cm->dim_out[i]] = E;
    } else {
      ys[i].type.dtype = DT_F32;
      ws[i].local[cm->dim_w[i]] = E;
      ops2[i][1 - cm->operand[i]] = &ws[i];
      for (int d = 0; d < W->type.rank; d++) wext[i][d] = extent(L, &ws[i], d);
      wblk[i] = alloc_buffer(L, W, elements(L, &ws[i]) * dtype_bytes(W->type.dtype));
      acc[i] = alloc_buffer(L, Y, elements(L, Y) * 4);
    }
    res1[i][0] = &ys[i];
    k[i] = *c;
    k[i].operands = (Value **)ops2[i];
    k[i].results = res1[i];
    for (int d = 0; d < Y->type.rank; d++) pext[i][d] = extent(L, &ys[i], d);
    part[i] = alloc_buffer(L, Y, elements(L, &ys[i]) * dtype_bytes(ys[i].type.dtype));
  }
  LLVMValueRef blk[2] = {alloc_buffer(L, x, count * dtype_bytes(x->type.dtype)), alloc_buffer(L, x, count * dtype_bytes(x->type.dtype))};
  LLVMValueRef slot = entry_alloca(L, L->ptr, "cmm_req");
  LLVMValueRef cur = L->buf[x->id];
  const char *mut = getenv("SHARDC_CMM_MUTATE");
  bool ok = true, mutate = mut && strcmp(mut, "order") == 0;
  for (int j = 0; j < n && ok; j++) {
    LLVMValueRef next = blk[j % 2];
    if (j < n - 1) {
      LLVMValueRef av[8] = {L->dev, groups, ci32(L, dt), cur, next, ci64(L, count), ci32(L, 1), slot};
      lower_check_rc(L, lower_rt(L, RTFN_rt_permute_shift_start, av, 8));
    }
    for (int i = 0; i < nr && ok; i++) {
      const Op *c = cm->readers[i];
      const Value *Y = c->results[0], *W = c->operands[1 - cm->operand[i]];
      int64_t st[MAX_RANK], pst[MAX_RANK];
      NestTensor t[2];
      LLVMValueRef wfull = L->buf[W->id];
      if (wblk[i]) { /* the other operand's block r - j along the contracted dim */
        strides_of(L, W, st);
        contiguous(W, wext[i], pst);
        t[0] = (NestTensor){.base = wblk[i], .dt = W->type.dtype};
        t[1] = (NestTensor){.base = gep(L, L->i8, wfull, cmm_block_offset(L, cm, j, st[cm->dim_w[i]], W->type.dtype, mutate)),
                            .dt = W->type.dtype};
        for (int d = 0; d < W->type.rank; d++) t[0].stride[d] = pst[d], t[1].stride[d] = st[d];
        cmm_nest(L, W, wext[i], t, 0);
        L->buf[W->id] = wblk[i];
      }
      L->buf[cm->via[i]->id] = cur;
      L->buf[Y->id] = part[i];
      ok = contract_core(L, &k[i]);
      L->buf[Y->id] = ybuf[i];
      L->buf[cm->via[i]->id] = NULL;
      L->buf[W->id] = wfull;
      strides_of(L, Y, st);
      contiguous(Y, pext[i], pst);
      if (acc[i]) { /* summed in f32 */
        t[0] = (NestTensor){.base = acc[i], .dt = DT_F32};
        t[1] = (NestTensor){.base = part[i], .dt = DT_F32};
        for (int d = 0; d < Y->type.rank; d++) t[0].stride[d] = t[1].stride[d] = pst[d];
        cmm_nest(L, Y, pext[i], t, j == 0 ? 1 : 2);
        continue;
      }
      /* the block at hand is rank r - j's: into the result at (r - j mod n) x E along the dim */
      t[0] = (NestTensor){.base = gep(L, L->i8, ybuf[i], cmm_block_offset(L, cm, j, st[cm->dim_out[i]], Y->type.dtype, mutate)),
                          .dt = Y->type.dtype};
      t[1] = (NestTensor){.base = part[i], .dt = Y->type.dtype};
      for (int d = 0; d < Y->type.rank; d++) t[0].stride[d] = st[d], t[1].stride[d] = pst[d];
      cmm_nest(L, Y, pext[i], t, 0);
    }
    if (j < n - 1) {
      LLVMValueRef wv[2] = {L->dev, LLVMBuildLoad2(L->B, L->ptr, slot, "cmm_req")};
      lower_check_rc(L, lower_rt(L, RTFN_rt_wait, wv, 2));
      cur = next;
    }
  }
  for (int i = 0; i < nr && ok; i++)
    if (acc[i]) { /* the f32 sum, rounded once */
      const Value *Y = cm->readers[i]->results[0];
      int64_t st[MAX_RANK];
      strides_of(L, Y, st);
      NestTensor t[2] = {{.base = ybuf[i], .dt = Y->type.dtype}, {.base = acc[i], .dt = DT_F32}};
      for (int d = 0; d < Y->type.rank; d++) t[0].stride[d] = t[1].stride[d] = st[d];
      cmm_nest(L, Y, pext[i], t, 1);
    }
  free_ptr(L, blk[0]);
  free_ptr(L, blk[1]);
  for (int i = 0; i < nr; i++) {
    free_ptr(L, part[i]);
    if (wblk[i]) free_ptr(L, wblk[i]), free_ptr(L, acc[i]);
  }
  return ok;
}

/* The ReduceScatter side of a collective matmul (devprog.h's DevCmm, scatter) at its contraction:
 * the ReduceScatter it implements makes nothing (lower_collective), the partial sum is never made.
 * Step j = 0 .. n-1: the operands' blocks (r - 1 - j mod n) along the scattered dim are copied out,
 * the partial product made in f32 (a block of the result's shape), then (j > 0) the permute of the
 * step before waited and the product added to the accumulator it brought (step 0: the product is
 * the accumulator), rounded to the ReduceScatter's dtype; before the last step the accumulator is
 * sent on (+1 around the groups, rt_permute_shift_start) while the next block's product is made.
 * Two accumulators alternate, the last step's being the result's own buffer. */
static bool lower_cmm_scatter(Lower *L, const Op *op) {
  const DevCmm *cm = op->dev->cmm;
  const Value *Y = op->results[0], *R = cm->coll->results[0];
  int n = cm->groups->size, dt = lower_rt_dtype(R->type.dtype), d = cm->dim_out[0];
  bool ar = cm->coll->kind == OP_ALL_REDUCE; /* then the blocks' AllGather */
  if (dt < 0 || cm->steps != n - 1 || cm->readers[0] != op || R->type.dtype != Y->type.dtype)
    return fail(L, op, "a collective matmul over dtype %s", dtype_name(R->type.dtype));
  LLVMValueRef groups = lower_rt_groups(L, cm->groups);
  int64_t E = cm->block, count = elements(L, R) / (ar ? n : 1);
  /* shadow values at one block: the operands holding the dim, the f32 partial product */
  int pos[2];
  pos[cm->operand[0]] = cm->dim_in, pos[1 - cm->operand[0]] = cm->dim_w[0];
  Value sv[2], ys = *Y;
  const Value *ops2[2] = {op->operands[0], op->operands[1]};
  LLVMValueRef blk[2] = {NULL, NULL};
  int64_t bext[2][MAX_RANK], pext[MAX_RANK], pst[MAX_RANK];
  for (int i = 0; i < 2; i++) {
    if (pos[i] < 0) continue;
    const Value *a = op->operands[i];
    sv[i] = *a;
    sv[i].local[pos[i]] = E;
    ops2[i] = &sv[i];
    for (int q = 0; q < a->type.rank; q++) bext[i][q] = extent(L, &sv[i], q);
    blk[i] = alloc_buffer(L, a, elements(L, &sv[i]) * dtype_bytes(a->type.dtype));
  }
  ys.local[d] = E;
  ys.type.dtype = DT_F32;
  Value *res1[1] = {&ys};
  Op k = *op;
  k.operands = (Value **)ops2;
  k.results = res1;
  for (int q = 0; q < Y->type.rank; q++) pext[q] = extent(L, &ys, q);
  contiguous(Y, pext, pst);
  LLVMValueRef part = alloc_buffer(L, Y, count * 4);
  L->share[R->id] = -1; /* its own buffer (plan_share gives it none) */
  new_buffer(L, R);
  LLVMValueRef spare = alloc_buffer(L, R, count * dtype_bytes(R->type.dtype)), own = NULL;
  LLVMValueRef acc[2];
  acc[(n - 1) % 2] = ar ? (own = alloc_buffer(L, R, count * dtype_bytes(R->type.dtype))) : L->buf[R->id];
  acc[n % 2] = spare;
  LLVMValueRef slot = entry_alloca(L, L->ptr, "cmm_req");
  const char *mut = getenv("SHARDC_CMM_MUTATE");
  bool ok = true, mutate = mut && strcmp(mut, "order") == 0;
  for (int j = 0; j < n && ok; j++) {
    LLVMValueRef full[2] = {L->buf[op->operands[0]->id], L->buf[op->operands[1]->id]};
    for (int i = 0; i < 2; i++) { /* the operand's block (r - 1 - j mod n) along the dim */
      if (!blk[i]) continue;
      const Value *a = op->operands[i];
      int64_t st[MAX_RANK], bst[MAX_RANK];
      strides_of(L, a, st);
      contiguous(a, bext[i], bst);
      NestTensor t[2] = {{.base = blk[i], .dt = a->type.dtype},
                         {.base = gep(L, L->i8, full[i], cmm_block_offset(L, cm, j, st[pos[i]], a->type.dtype, mutate)),
                          .dt = a->type.dtype}};
      for (int q = 0; q < a->type.rank; q++) t[0].stride[q] = bst[q], t[1].stride[q] = st[q];
      cmm_nest(L, a, bext[i], t, 0);
    }
    for (int i = 0; i < 2; i++)
      if (blk[i]) L->buf[op->operands[i]->id] = blk[i];
    L->buf[Y->id] = part;
    ok = contract_core(L, &k);
    for (int i = 0; i < 2; i++) L->buf[op->operands[i]->id] = full[i];
    if (j > 0) { /* the accumulator the neighbour sent */
      LLVMValueRef wv[2] = {L->dev, LLVMBuildLoad2(L->B, L->ptr, slot, "cmm_req")};
      lower_check_rc(L, lower_rt(L, RTFN_rt_wait, wv, 2));
    }
    NestTensor t[2] = {{.base = acc[j % 2], .dt = R->type.dtype}, {.base = part, .dt = DT_F32}};
    for (int q = 0; q < Y->type.rank; q++) t[0].stride[q] = t[1].stride[q] = pst[q];
    cmm_nest(L, Y, pext, t, j == 0 ? 1 : 2);
    if (j < n - 1) {
      LLVMValueRef av[8] = {L->dev, groups, ci32(L, dt), acc[j % 2], acc[(j + 1) % 2], ci64(L, count), ci32(L, 1), slot};
      lower_check_rc(L, lower_rt(L, RTFN_rt_permute_shift_start, av, 8));
    }
  }
  if (ar && ok) { /* the AllReduce's AllGather half: rank r's block r into the result */
    RtCollMember *m = ARENA_NEW(&L->lw->arena, RtCollMember);
    m->rank = Y->type.rank;
    for (int q = 0; q < Y->type.rank; q++) m->shape[q] = pext[q];
    m->nparts = 1;
    m->parts[0] = (RtCollPart){.dim = d, .groups = (const RtGroups *)(const void *)cm->groups};
    RtColl rc = {.kind = RT_ALL_GATHER, .dtype = dt, .op = RT_SUM, .nmembers = 1, .members = m,
                 .groups = (const RtGroups *)(const void *)cm->groups};
    lower_rt_bind(L, m, lower_rt_consts(L, RTS_RtCollMember, m, 1, "coll_members"));
    LLVMValueRef desc = lower_rt_const(L, RTS_RtColl, &rc, "coll");
    LLVMValueRef io[2] = {entry_alloca(L, L->ptr, "coll_in"), entry_alloca(L, L->ptr, "coll_out")};
    LLVMBuildStore(L->B, own, io[0]);
    LLVMBuildStore(L->B, L->buf[R->id], io[1]);
    LLVMValueRef av[4] = {L->dev, desc, io[0], io[1]};
    lower_check_rc(L, lower_rt(L, RTFN_rt_collective, av, 4));
    free_ptr(L, own);
  }
  L->buf[Y->id] = NULL;
  L->root[Y->id] = Y->id;
  L->owned[Y->id] = false;
  free_ptr(L, part);
  free_ptr(L, spare);
  for (int i = 0; i < 2; i++)
    if (blk[i]) free_ptr(L, blk[i]);
  return ok;
}

static bool lower_contract(Lower *L, const Op *op) {
  if (L->mesh && op->dev && op->dev->cmm) { /* a collective matmul's reader: in the ring at the first */
    if (op->dev->cmm->contract != op) return true;
    return op->dev->cmm->scatter ? lower_cmm_scatter(L, op) : lower_cmm(L, op);
  }
  new_buffer(L, op->results[0]);
  return contract_core(L, op);
}

/* route_grad (p, a, b): contract(a, b) where the pattern p is nonzero, else 0: the dense product,
 * then masked. */
typedef struct MaskCtx {
  NestTensor *t;
} MaskCtx;

static void mask_body(Lower *L, LLVMValueRef *offs, LLVMValueRef *idx, void *vctx) {
  MaskCtx *c = vctx;
  LLVMValueRef p = lower_load(L, &c->t[1], offs[1]), v = lower_load(L, &c->t[0], offs[0]);
  LLVMValueRef keep = LLVMBuildFCmp(L->B, LLVMRealUNE, p, cf32(L, 0), "");
  lower_store(L, &c->t[0], offs[0], LLVMBuildSelect(L->B, keep, v, cf32(L, 0), ""));
}

static bool lower_route_grad(Lower *L, const Op *op) {
  const Value *res = op->results[0], *p = op->operands[0];
  Op c = *op;
  c.kind = OP_CONTRACT;
  c.operands = op->operands + 1;
  c.noperands = 2;
  c.flag = 0;
  if (!lower_contract(L, &c)) return false;
  if (dtype_is_int(p->type.dtype) || lower_rt_dtype(p->type.dtype) < 0) return fail(L, op, "a route pattern of dtype %s", dtype_name(p->type.dtype));
  NestTensor t[2];
  int64_t ext[MAX_RANK];
  nest_pair(L, res, p, t, ext);
  MaskCtx mc = {.t = t};
  lower_nest(L, res->type.rank, ext, t, 2, mask_body, &mc);
  return true;
}

/* ---- collectives ---- */

/* A collective of the device program (its DevColl): one call of rt_collective with a constant
 * RtColl, each member's operand's local shape and its parts (the dim, the groups whose rank places
 * the block). A bucket runs at its last member with every member's buffers (devprog.h: nothing
 * between reads a member's result); a member before the last only makes its result's buffer. */
static bool lower_collective(Lower *L, const Op *op) {
  const Value *res = op->results[0], *x = op->operands[0];
  int dt = lower_rt_dtype(x->type.dtype);
  if (dt < 0) return fail(L, op, "a collective over dtype %s is not lowered yet", dtype_name(x->type.dtype));
  if (!L->mesh) { /* a global run: every collective is the identity */
    view_of(L, res, x);
    return true;
  }
  const DevColl *c = op->dev ? op->dev->coll : NULL;
  if (!c) return fail(L, op, "%s outside the device program", ir_op_name(op->kind));
  if (op->dev->cmm && op->dev->cmm->coll == op && op->dev->cmm->scatter) /* made by its contraction's ring */
    return true;
  if (op->dev->cmm && op->dev->cmm->coll == op) { /* runs in its contraction's ring (lower_cmm): nothing made */
    L->buf[res->id] = NULL;
    L->root[res->id] = res->id;
    L->owned[res->id] = false;
    return true;
  }
  if (dev_op_period(op)) return fail(L, op, "%s of a pipeline is not lowered yet", ir_op_name(op->kind));
  new_buffer(L, res);
  if (c->lead) return true; /* runs in its bucket's last member */
  const Op *self[1] = {op};
  const Op *const *mem = c->members ? c->members : self;
  int n = c->members ? c->nmembers : 1;
  RtCollMember *m = ARENA_ARRAY(&L->lw->arena, RtCollMember, n);
  RtColl rc = {.kind = c->kind == COLL_ALL_GATHER ? RT_ALL_GATHER : c->kind == COLL_REDUCE_SCATTER ? RT_REDUCE_SCATTER
                       : c->kind == COLL_ALL_REDUCE ? RT_ALL_REDUCE : c->kind == COLL_ALL_TO_ALL ? RT_ALL_TO_ALL : RT_PERMUTE,
               .dtype = dt, .op = c->reduce_max ? RT_MAX : RT_SUM, .shift = c->shift, .nmembers = n, .members = m};
  lower_rt_groups(L, c->groups);
  rc.groups = (const RtGroups *)(const void *)c->groups; /* a key: lower_rt_groups bound it */
  for (int i = 0; i < n; i++) {
    const Value *xi = mem[i]->operands[0];
    const DevColl *ci = mem[i]->dev->coll;
    m[i].rank = xi->type.rank;
    for (int d = 0; d < xi->type.rank; d++) m[i].shape[d] = extent(L, xi, d);
    if (c->kind != COLL_ALL_GATHER && c->kind != COLL_REDUCE_SCATTER) continue;
    if (ci->nparts == 0) return fail(L, op, "%s without dims", ir_op_name(op->kind));
    m[i].nparts = ci->nparts;
    for (int p = 0; p < ci->nparts; p++) {
      lower_rt_groups(L, ci->parts[p].groups);
      m[i].parts[p] = (RtCollPart){.dim = ci->parts[p].dim, .groups = (const RtGroups *)(const void *)ci->parts[p].groups};
    }
  }
  if (c->kind == COLL_ALL_TO_ALL) {
    if (c->nparts != 2) return fail(L, op, "%s without its two dims", "all_to_all");
    int split = tensor_type_find(&x->type, res->type.dims[c->parts[0].dim]);
    if (split < 0 || res->type.rank != x->type.rank) return fail(L, op, "%s whose result reorders dims is not lowered yet", "all_to_all");
    for (int i = 0; i < x->type.rank; i++)
      if (x->type.dims[i] != res->type.dims[i]) return fail(L, op, "%s whose result reorders dims is not lowered yet", "all_to_all");
    rc.split_dim = split, rc.concat_dim = c->parts[1].dim;
  }
  lower_rt_bind(L, m, lower_rt_consts(L, RTS_RtCollMember, m, n, "coll_members"));
  LLVMValueRef desc = lower_rt_const(L, RTS_RtColl, &rc, "coll");
  LLVMValueRef ins = entry_alloca(L, LLVMArrayType2(L->ptr, (uint64_t)n), "coll_in");
  LLVMValueRef outs = entry_alloca(L, LLVMArrayType2(L->ptr, (uint64_t)n), "coll_out");
  for (int i = 0; i < n; i++) {
    LLVMValueRef k = ci64(L, i);
    LLVMBuildStore(L->B, L->buf[mem[i]->operands[0]->id], LLVMBuildInBoundsGEP2(L->B, L->ptr, ins, &k, 1, ""));
    LLVMBuildStore(L->B, L->buf[mem[i]->results[0]->id], LLVMBuildInBoundsGEP2(L->B, L->ptr, outs, &k, 1, ""));
  }
  LLVMValueRef av[4] = {L->dev, desc, ins, outs};
  lower_check_rc(L, lower_rt(L, RTFN_rt_collective, av, 4));
  return true;
}

/* ---- ops ---- */

static bool lower_const(Lower *L, const Op *op) {
  const Value *res = op->results[0];
  if (res->type.rank != 0 || lower_rt_dtype(res->type.dtype) < 0) return fail(L, op, "a %s of this type is not lowered yet", "constant");
  new_buffer(L, res);
  NestTensor t = {.base = L->buf[res->id], .dt = res->type.dtype};
  LLVMValueRef v = dtype_is_int(res->type.dtype) ? ci32(L, (int)op->scalar) : cf32(L, op->scalar);
  lower_store(L, &t, ci64(L, 0), v);
  return true;
}

static bool same_bytes(const Lower *L, const Value *a, const Value *b) {
  return a->type.dtype == b->type.dtype && elements(L, a) == elements(L, b);
}

/* A slice of the leading dim alone, or a transpose that keeps the dim order, that the buffer plan
 * makes a view of its operand (bufplan.c's is_view). */
static bool plan_view(const Lower *L, const Op *op) {
  const Value *res = op->results[0], *x = op->operands[0];
  if (!L->plan || L->plan[res->id] != L->plan[x->id] || res->type.rank != x->type.rank || res->type.dtype != x->type.dtype)
    return false;
  for (int d = 0; d < res->type.rank; d++)
    if (res->type.dims[d] != x->type.dims[d] || (d > 0 && extent(L, res, d) != extent(L, x, d))) return false;
  if (op->kind == OP_TRANSPOSE) return same_bytes(L, res, x);
  return dev_op_noffs(op) == 1 && op->dev->offs[0].dim == x->type.dims[0];
}

/* The operand whose buffer op's result shares (a view), or NULL. */
static const Value *view_operand(const Lower *L, const Op *op) {
  switch ((LowerKind)ir_op_info(op->kind)->lower) {
  case LK_VIEW: return same_bytes(L, op->results[0], op->operands[0]) ? op->operands[0] : NULL;
  case LK_MAP: /* a cast that keeps the bytes */
    return op->kind == OP_CAST && same_bytes(L, op->results[0], op->operands[0]) ? op->operands[0] : NULL;
  case LK_COPY: /* the plan's views: a block of the leading dim, the same dim order */
    return plan_view(L, op) ? op->operands[0] : NULL;
  case LK_COLLECTIVE: return L->mesh ? NULL : op->operands[0];
  default: return NULL;
  }
}

static bool lower_op(Lower *L, const Op *op) {
  const Value *res = op->nresults ? op->results[0] : NULL;
  if (res && L->fused[res->id]) { /* computed in its consumer's nest */
    L->root[res->id] = res->id;
    L->owned[res->id] = false;
    return true;
  }
  switch ((LowerKind)ir_op_info(op->kind)->lower) { /* each lowering kind its own (ops.def's lower) */
  case LK_INPUT: {
    int slot = op->kind == OP_INPUT ? op->index : L->m->main->ninputs + op->index;
    LLVMValueRef p = gep(L, L->ptr, L->slots, ci64(L, slot));
    L->buf[res->id] = LLVMBuildLoad2(L->B, L->ptr, p, res->name ? res->name : "in");
    L->root[res->id] = res->id;
    return true;
  }
  case LK_CONST: return lower_const(L, op);
  case LK_MAP:
    if (op->kind == OP_CAST && same_bytes(L, res, op->operands[0])) {
      view_of(L, res, op->operands[0]);
      return true;
    }
    return lower_map(L, op);
  case LK_VIEW:
    if (!same_bytes(L, res, op->operands[0])) return fail(L, op, "%s that changes the local element count is not lowered yet", ir_op_name(op->kind));
    view_of(L, res, op->operands[0]);
    return true;
  case LK_COPY:
    if (plan_view(L, op)) { /* a view; a slice starts at the device's first row */
      const Value *x = op->operands[0];
      int64_t st[MAX_RANK];
      strides_of(L, x, st);
      view_of(L, res, x);
      if (op->kind == OP_SLICE && L->mesh) {
        LLVMValueRef rows = dim_offset(L, op, x->type.dims[0]);
        LLVMValueRef off = LLVMBuildMul(L->B, rows, ci64(L, st[0] * dtype_bytes(x->type.dtype)), "");
        L->buf[res->id] = gep(L, L->i8, L->buf[x->id], off);
      }
      return true;
    }
    return lower_copy(L, op);
  case LK_CAUSAL: return lower_causal(L, op);
  case LK_DROPOUT: return lower_dropout(L, op);
  case LK_REDUCE: return lower_reduce(L, op);
  case LK_CONTRACT: return lower_contract(L, op);
  case LK_LOOP: return lower_loop(L, op);
  case LK_ROWS: return lower_nn_rows(L, op, new_buffer);
  case LK_ROUTE: return lower_nn_route(L, op, new_buffer);
  case LK_ROUTE_GRAD: return lower_route_grad(L, op);
  case LK_SELECT: return lower_nn_select(L, op, dim_offset(L, op, op->dims[0]), new_buffer);
  case LK_TAKE: /* the table's rows: take's operand's, take_grad's result's */
    return lower_nn_take(L, op, dim_offset(L, op, (op->kind == OP_TAKE ? op->operands[0] : res)->type.dims[0]), new_buffer);
  case LK_ATTENTION:
    return lower_nn_attention(L, op, dim_offset(L, op, op->dims[2]), dim_offset(L, op, op->dims[1]), new_buffer);
  case LK_COLLECTIVE: return lower_collective(L, op);
  case LK_PIPELINE: return lower_pipeline(L, op);
  case LK_NONE: break;
  }
  return fail(L, op, "'%s' is not lowered to native code yet (docs/run.md)", ir_op_name(op->kind));
}

/* ---- regions and loops ---- */

/* Frees the buffers f's ops made that are still held (outputs copied out already). */
static void free_region(Lower *L, const IrFunc *f) {
  for (const Op *op = f->first; op; op = op->next)
    for (int k = 0; k < op->nresults; k++) {
      int r = L->root[op->results[k]->id];
      if (r == op->results[k]->id && L->owned[r]) {
        free_root(L, r);
        L->owned[r] = false;
      }
    }
}

/* The simulated clock (lower_set_clock): the device adds the time sim gives op, where it is not 0. */
static void clock_op(Lower *L, const Op *op) {
  if (!L->mesh || !L->lw->clock) return;
  double s = sim_costs_op_seconds(L->lw->clock, op);
  if (s <= 0) return;
  LLVMValueRef vals[3] = {L->dev, ci32(L, ir_op_is_collective(op->kind) ? 1 : 0), LLVMConstReal(L->f64, s)};
  lower_rt(L, RTFN_rt_clock_add, vals, 3);
}

/* The device program tells the runtime each op's source line (rt_at_line) before running it, when
 * it differs from the last one told: failures and timeouts name it, and under MPI the launcher
 * names the op a rank that died was in. */
static void line_op(Lower *L, const Op *op) {
  if (!L->mesh || op->loc.line <= 0 || op->loc.line == L->line) return;
  L->line = op->loc.line;
  LLVMValueRef vals[2] = {L->dev, ci32(L, op->loc.line)};
  lower_rt(L, RTFN_rt_at_line, vals, 2);
}

static bool lower_op_clocked(Lower *L, const Op *op) {
  line_op(L, op);
  if (!lower_op(L, op)) return false;
  clock_op(L, op);
  return true;
}

static bool same_layout(const Lower *L, const Value *a, const Value *b) {
  if (a->type.rank != b->type.rank) return false;
  for (int d = 0; d < a->type.rank; d++)
    if (a->type.dims[d] != b->type.dims[d] || extent(L, a, d) != extent(L, b, d)) return false;
  return true;
}

/* Whether result k of op (at position pos of its region) can live where the buffer plan puts it
 * (bufplan.h: in place over an operand read for the last time, an updated param or state over
 * what it replaces, a loop's carried result over its carried operand), and the value whose
 * pointer it then takes; -1: its own buffer. The lowering checks what the plan assumes: nothing
 * reads the buffer's old contents after this op, and an op that reads them while it writes (a
 * loop nest, an AllReduce) reads each element where it writes it, no narrower. `last` holds, per
 * buffer, the last read of the values living in it so far. */
static int plan_share(const Lower *L, const Op *op, int k, int pos, const int32_t *vroot, const int *last) {
  const Value *v = op->results[k];
  if (!L->plan || L->fused[v->id] || op->kind == OP_INPUT || op->kind == OP_PARAM) return -1;
  if (L->mesh && op->dev && op->dev->cmm) return -1; /* a collective matmul's reader, made early (lower_cmm) */
  int P = L->plan[v->id];
  if (P < 0 || P == v->id || !L->val[P] || L->fused[P]) return -1;
  int T = vroot[P];
  if (T == v->id || L->fused[T] || last[T] > pos) return -1;
  const Op *td = L->val[T]->def; /* a partial sum a reduce-scatter ring never makes (lower_cmm_scatter) */
  if (L->mesh && td && td->dev && td->dev->cmm && td->dev->cmm->scatter && td->dev->cmm->contract == td) return -1;
  const Value *rd[16];
  int n;
  if (op->kind == OP_LOOP) { /* a carried result over its own carried operand, nothing else of the loop's there */
    if (k >= op->ncarried) return -1;
    int found = -1;
    for (int i = 0; i < op->noperands; i++)
      if (vroot[op->operands[i]->id] == T) {
        if (i != op->nslices + k || found >= 0) return -1;
        found = op->operands[i]->id;
      }
    return found >= 0 && same_bytes(L, v, op->operands[op->nslices + k]) ? found : -1;
  }
  if (op->nresults != 1) return -1;
  n = op_leaves(L, op, rd, 0);
  int in_t = -1;
  for (int i = 0; i < n; i++)
    if (vroot[rd[i]->id] == T) {
      if (in_t >= 0) return -1;
      in_t = i;
    }
  if (in_t < 0) /* nothing this op reads is there: the buffer is free (an update over the param it replaces) */
    return last[T] < pos && elements(L, L->val[T]) * dtype_bytes(L->val[T]->type.dtype) >= elements(L, v) * dtype_bytes(v->type.dtype) ? T : -1;
  const Value *u = rd[in_t];
  if (op->kind == OP_ALL_REDUCE) /* the runtime reduces in place */
    return u == op->operands[0] && same_bytes(L, u, v) && L->mesh ? u->id : -1;
  const OpInfo *in = ir_op_info(op->kind);
  if (!(in->flags & OPF_INPLACE) || in->cls == OC_COLLECTIVE) return -1; /* (a permute: its own buffer) */
  return same_layout(L, u, v) && dtype_bytes(u->type.dtype) >= dtype_bytes(v->type.dtype) ? u->id : -1;
}

/* f's ops in order (its inputs' buffers set by the caller), each buffer freed after the last op
 * reading any value living in it; f's outputs stay. */
static bool lower_region(Lower *L, const IrFunc *f) {
  int nops = 0;
  for (const Op *op = f->first; op; op = op->next) nops++;
  int nv = L->m->nvalues + 1;
  int *last = malloc(sizeof(int) * (size_t)nv);
  int32_t *vroot = malloc(sizeof(int32_t) * (size_t)nv);
  for (int i = 0; i < nv; i++) last[i] = -1, vroot[i] = i;
  for (int i = 0; i < f->ninputs; i++) vroot[f->inputs[i]->id] = L->root[f->inputs[i]->id];
  /* Fusion: an elementwise op whose one use is an elementwise op over (a superset of) its dims is
   * computed inside that op's loop nest; its operands are then read there. */
  int *uses = calloc((size_t)nv, sizeof(int));
  const Op **user = calloc((size_t)nv, sizeof(Op *));
  const Op **order = malloc(sizeof(Op *) * (size_t)(nops + 1));
  int *evalpos = malloc(sizeof(int) * (size_t)(nops + 1));
  int pos = 0;
  for (const Op *op = f->first; op; op = op->next, pos++) {
    order[pos] = op;
    for (int i = 0; i < op->noperands; i++) uses[op->operands[i]->id]++, user[op->operands[i]->id] = op;
  }
  for (int j = 0; j < f->noutputs; j++) uses[f->outputs[j]->id] += 2;
  if (!getenv("SHARDC_NO_FUSION"))
    for (int p = 0; p < nops; p++) {
      const Op *c = order[p];
      if (!fusable_kind(c->kind) || !float_op(c)) continue;
      for (int i = 0; i < c->noperands; i++) {
        const Value *x = c->operands[i];
        const Op *d = x->def;
        if (!d || d->func != f || uses[x->id] != 1 || user[x->id] != c || !fusable_kind(d->kind) || !float_op(d) || dev_op_runs(d) != dev_op_runs(c)) continue;
        bool inside = true;
        for (int k = 0; k < x->type.rank; k++) {
          int q = tensor_type_find(&c->results[0]->type, x->type.dims[k]);
          inside &= q >= 0 && extent(L, c->results[0], q) == extent(L, x, k);
        }
        if (!inside) continue;
        L->fused[x->id] = true;
        const Value *lv[16];
        if (op_leaves(L, c, lv, 0) > FUSE_MAX_LEAVES) L->fused[x->id] = false;
        if (getenv("SHARDC_FUSION_DEBUG") && L->fused[x->id]) fprintf(stderr, "fuse %%%d (%s) into %%%d (%s)\n", x->id, ir_op_name(d->kind), c->results[0]->id, ir_op_name(c->kind));
      }
    }
  for (int p = nops - 1; p >= 0; p--) {
    const Op *op = order[p];
    evalpos[p] = p;
    if (op->nresults == 1 && L->fused[op->results[0]->id]) {
      const Op *c = user[op->results[0]->id];
      for (int q = p + 1; q < nops; q++)
        if (order[q] == c) evalpos[p] = evalpos[q];
    }
    /* a bucket's member reads its operand where the bucket runs (its last member) */
    const Op *lead = L->mesh && op->dev && op->dev->coll ? op->dev->coll->lead : NULL;
    for (int q = p + 1; lead && q < nops; q++)
      if (order[q] == lead) evalpos[p] = evalpos[q];
    /* a collective matmul's AllGather reads its operand in the contraction's ring (lower_cmm) */
    const DevCmm *cm = L->mesh && op->dev ? op->dev->cmm : NULL;
    for (int q = p + 1; cm && !cm->scatter && cm->coll == op && q < nops; q++)
      if (order[q] == cm->contract) evalpos[p] = evalpos[q];
  }
  /* each value's last read (a fused op's operands are read in its consumer's nest); outputs stay */
  int *lastread = malloc(sizeof(int) * (size_t)nv);
  for (int i = 0; i < nv; i++) lastread[i] = -1;
  for (pos = 0; pos < nops; pos++)
    for (int i = 0; i < order[pos]->noperands; i++) {
      int x = order[pos]->operands[i]->id;
      if (lastread[x] < evalpos[pos]) lastread[x] = evalpos[pos];
    }
  for (int j = 0; j < f->noutputs; j++) lastread[f->outputs[j]->id] = nops;
  /* buffers, in program order: views, then the plan's in-place and update decisions where the
   * lowering can follow them; last[r] is the last read of any value living in r */
  for (int i = 0; i < f->ninputs; i++) {
    int x = f->inputs[i]->id;
    vroot[x] = x;
    if (last[x] < lastread[x]) last[x] = lastread[x];
  }
  for (pos = 0; pos < nops; pos++) {
    const Op *op = order[pos];
    const Value *of = view_operand(L, op);
    for (int k = 0; k < op->nresults; k++) {
      const Value *v = op->results[k];
      L->share[v->id] = -1;
      if (of) vroot[v->id] = vroot[of->id];
      else {
        int sh = plan_share(L, op, k, pos, vroot, last);
        if (sh >= 0) L->share[v->id] = sh, vroot[v->id] = vroot[sh];
      }
      int r = vroot[v->id];
      if (last[r] < lastread[v->id]) last[r] = lastread[v->id];
    }
  }
  free(lastread);
  free(uses), free(user), free(order), free(evalpos);
  bool ok = true;
  const int *outer_last = L->last;
  int outer_pos = L->pos;
  L->last = last;
  pos = 0;
  for (const Op *op = f->first; op; op = op->next, pos++) {
    L->pos = pos;
    bool placed = L->mesh && L->m->pipeline && f == L->m->main && dev_op_runs(op); /* an op of a pipelined main on some stages */
    if (!(placed ? lower_pipe_guarded(L, op, lower_op_clocked) : lower_op_clocked(L, op)) || L->failed) {
      ok = false;
      break;
    }
    if (placed) L->line = 0; /* told under a branch some devices skip */
    const Value *leaf[17];
    int nleaf = op_leaves(L, op, leaf, 0);
    if (L->mesh && op->dev && op->dev->cmm && !op->dev->cmm->scatter && op->dev->cmm->contract == op) /* its AllGather's operand, read here */
      leaf[nleaf++] = op->dev->cmm->coll->operands[0];
    for (int i = 0; i < nleaf; i++) {
      int r = L->root[leaf[i]->id];
      if (last[r] == pos && L->owned[r]) {
        free_root(L, r);
        L->owned[r] = false;
      }
    }
    for (int k = 0; k < op->nresults; k++) { /* a result nothing reads */
      int r = L->root[op->results[k]->id];
      if (last[r] <= pos && L->owned[r]) {
        free_root(L, r);
        L->owned[r] = false;
      }
    }
  }
  L->last = outer_last;
  L->pos = outer_pos;
  free(vroot);
  free(last);
  return ok;
}

static int64_t value_bytes(const Lower *L, const Value *v) { return elements(L, v) * dtype_bytes(v->type.dtype); }

typedef struct LoopCtx {
  const Op *op;
  LLVMValueRef *carried;  /* the loop's buffers of its carried values */
  bool ok;
} LoopCtx;

/* One trip: the body's inputs bound (a stacked operand's row, the carried buffers, invariants),
 * the body lowered, its carried outputs copied back, its stacked outputs into their rows. */
static void loop_trip(Lower *L, LLVMValueRef *offs, LLVMValueRef *idx, void *vctx) {
  LoopCtx *c = vctx;
  const Op *op = c->op;
  const IrFunc *b = op->body;
  if (!c->ok) return;
  LLVMValueRef row = op->reverse ? LLVMBuildSub(L->B, ci64(L, op->count - 1), idx[0], "") : idx[0];
  for (int i = 0; i < b->ninputs; i++) {
    const Value *in = b->inputs[i];
    LLVMValueRef p;
    if (i < op->nslices) {
      LLVMValueRef off = LLVMBuildMul(L->B, row, ci64(L, value_bytes(L, in)), "");
      p = gep(L, L->i8, L->buf[op->operands[i]->id], off);
    } else if (i < op->nslices + op->ncarried) p = c->carried[i - op->nslices];
    else p = L->buf[op->operands[i]->id];
    L->buf[in->id] = p;
    L->root[in->id] = in->id;
    L->owned[in->id] = false;
  }
  /* a stacked output the plan gives no buffer of its own in the body (bufplan.h) is made in its row */
  for (int j = op->ncarried; j < op->ncarried + op->nstacked; j++) {
    const Value *y = b->outputs[j];
    bool once = y->def && y->def->func == b && L->plan && L->plan[y->id] == y->id;
    for (int k = 0; k < b->noutputs && once; k++) once = k == j || b->outputs[k] != y;
    if (once) L->dest[y->id] = gep(L, L->i8, L->buf[op->results[j]->id], LLVMBuildMul(L->B, row, ci64(L, value_bytes(L, y)), ""));
  }
  if (!lower_region(L, b)) {
    c->ok = false;
    return;
  }
  /* stacked rows first: a stacked output may live in a carried buffer (the layer's input, saved),
   * which the carried outputs then overwrite */
  for (int j = op->ncarried; j < op->ncarried + op->nstacked; j++) {
    const Value *y = b->outputs[j];
    if (L->dest[y->id] && L->buf[y->id] == L->dest[y->id]) continue; /* made there */
    LLVMValueRef dst = gep(L, L->i8, L->buf[op->results[j]->id], LLVMBuildMul(L->B, row, ci64(L, value_bytes(L, y)), ""));
    LLVMBuildMemMove(L->B, dst, 1, L->buf[y->id], 1, ci64(L, value_bytes(L, y)));
  }
  /* carried outputs that are another carried input's buffer go through a copy (a swap) */
  LLVMValueRef tmp[64] = {0};
  for (int j = 0; j < op->ncarried && j < 64; j++) {
    const Value *y = b->outputs[j];
    int r = L->root[y->id];
    for (int k = 0; k < op->ncarried; k++)
      if (k != j && r == b->inputs[op->nslices + k]->id) {
        tmp[j] = alloc_buffer(L, y, value_bytes(L, y));
        LLVMBuildMemCpy(L->B, tmp[j], 64, L->buf[y->id], 1, ci64(L, value_bytes(L, y)));
      }
  }
  for (int j = 0; j < op->ncarried; j++) {
    const Value *y = b->outputs[j];
    if (L->root[y->id] == b->inputs[op->nslices + j]->id) continue; /* unchanged */
    LLVMValueRef src = j < 64 && tmp[j] ? tmp[j] : L->buf[y->id];
    LLVMBuildMemMove(L->B, c->carried[j], 1, src, 1, ci64(L, value_bytes(L, y)));
    if (j < 64 && tmp[j]) free_ptr(L, tmp[j]);
  }
  free_region(L, b);
}

static bool lower_loop(Lower *L, const Op *op) {
  const IrFunc *b = op->body;
  if (!b || b->ninputs != op->noperands || b->noutputs != op->ncarried + op->nstacked || op->nresults != op->ncarried + op->nstacked)
    return fail(L, op, "%s is malformed", "loop");
  for (int j = 0; j < op->nstacked; j++) {
    const Value *r = op->results[op->ncarried + j];
    if (r->type.rank < 1 || extent(L, r, 0) != op->count) return fail(L, op, "a loop whose stacked rows are split over devices is not lowered yet%s", "");
  }
  for (int i = 0; i < op->nslices; i++)
    if (op->operands[i]->type.rank < 1 || extent(L, op->operands[i], 0) != op->count)
      return fail(L, op, "a loop whose stacked rows are split over devices is not lowered yet%s", "");
  LLVMValueRef *carried = calloc((size_t)op->ncarried + 1, sizeof *carried);
  for (int j = 0; j < op->ncarried; j++) {
    const Value *x = op->operands[op->nslices + j], *r = op->results[j];
    new_buffer(L, r); /* the carried operand's buffer, where the plan updates it in place */
    carried[j] = L->buf[r->id];
    if (carried[j] != L->buf[x->id]) LLVMBuildMemCpy(L->B, carried[j], 64, L->buf[x->id], 1, ci64(L, value_bytes(L, x)));
  }
  for (int j = 0; j < op->nstacked; j++) new_buffer(L, op->results[op->ncarried + j]);
  LoopCtx c = {.op = op, .carried = carried, .ok = true};
  int64_t count = op->count;
  double outer = L->repeat;
  L->repeat = (outer > 0 ? outer : 1) * (double)count;
  if (count == 1) { /* lower_nest makes no loop for one trip */
    LLVMValueRef zero = ci64(L, 0);
    loop_trip(L, NULL, &zero, &c);
  } else lower_nest(L, 1, &count, NULL, 0, loop_trip, &c);
  L->repeat = outer;
  free(carried);
  return c.ok;
}

/* ---- the function ---- */

static void init_types(Lower *L) {
  LLVMContextRef C = L->C;
  L->i1 = LLVMInt1TypeInContext(C);
  L->i8 = LLVMInt8TypeInContext(C);
  L->i16 = LLVMInt16TypeInContext(C);
  L->i32 = LLVMInt32TypeInContext(C);
  L->i64 = LLVMInt64TypeInContext(C);
  L->f16 = LLVMHalfTypeInContext(C);
  L->f32 = LLVMFloatTypeInContext(C);
  L->f64 = LLVMDoubleTypeInContext(C);
  L->ptr = LLVMPointerTypeInContext(C, 0);
}

void lower_set_clock(Lowered *lw, const SimCosts *costs) {
  if (lw) lw->clock = costs;
}

Lowered *lower_new(void) {
  Lowered *lw = calloc(1, sizeof *lw);
  if (!lw) return NULL;
  LLVMOrcThreadSafeContextRef tsc = LLVMOrcCreateNewThreadSafeContext();
  lw->tsc = tsc;
  lw->C = LLVMOrcThreadSafeContextGetContext(tsc);
  lw->M = LLVMModuleCreateWithNameInContext("shardc", lw->C);
  arena_init(&lw->arena);
  return lw;
}

void lower_free(Lowered *lw) {
  if (!lw) return;
  if (lw->jit) LLVMOrcDisposeLLJIT(lw->jit); /* the functions it made are gone after this */
  for (int i = 0; i < lw->nobjs; i++)
    if (lw->objs[i]) LLVMDisposeMemoryBuffer(lw->objs[i]);
  if (!lw->consumed) LLVMDisposeModule(lw->M);
  LLVMOrcDisposeThreadSafeContext(lw->tsc);
  arena_free(&lw->arena);
  free(lw);
}

static void index_values(Lower *L, const IrFunc *f) {
  for (int i = 0; i < f->ninputs; i++) L->val[f->inputs[i]->id] = f->inputs[i];
  for (const Op *op = f->first; op; op = op->next) {
    for (int k = 0; k < op->nresults; k++) L->val[op->results[k]->id] = op->results[k];
    if (op->kind == OP_LOOP && op->body) index_values(L, op->body);
  }
}

/* Whether main's output j is an updated param or optimizer state the plan writes over the input
 * it replaces (handed to the host in that input's buffer: run_host.c's carry keeps it). */
static bool output_updates_input(const Lower *L, int j) {
  const IrFunc *f = L->m->main;
  const StepInfo *si = L->m->step;
  for (int k = 0; si && k < si->nparams; k++) {
    const StepParam *sp = &si->params[k];
    const Value *in[4] = {sp->value, sp->in_master >= 0 ? f->inputs[sp->in_master] : NULL,
                          sp->in_m >= 0 ? f->inputs[sp->in_m] : NULL, sp->in_v >= 0 ? f->inputs[sp->in_v] : NULL};
    int outs[4] = {sp->out_param, sp->out_master, sp->out_m, sp->out_v};
    for (int q = 0; q < 4; q++)
      if (outs[q] == j && in[q] && L->root[f->outputs[j]->id] == L->root[in[q]->id] && L->buf[in[q]->id] == L->buf[f->outputs[j]->id])
        return true;
  }
  return false;
}

bool lower_function(Lowered *lw, const IrModule *m, const Mesh *mesh, const char *name) {
  Lower L = {.lw = lw, .C = lw->C, .M = lw->M, .m = m, .mesh = mesh, .fname = name};
  if (mesh && (!m->localized || !m->dev || m->dev->mesh != mesh)) {
    diag_error(m->entry ? m->entry->loc : (SrcLoc){0}, "run: the program has no device program for this mesh");
    return false;
  }
  if (m->pipeline && !mesh) {
    diag_error(m->pipeline->loc, "run: a pipeline (layers@stage) in the one-device program (lower the module before the pass pipeline)");
    return false;
  }
  init_types(&L);
  L.B = LLVMCreateBuilderInContext(L.C);
  LLVMTypeRef at[2] = {L.ptr, L.ptr};
  L.fn = LLVMAddFunction(L.M, name, LLVMFunctionType(L.i32, at, 2, 0));
  LLVMAddAttributeAtIndex(L.fn, LLVMAttributeFunctionIndex,
                          LLVMCreateStringAttribute(L.C, "prefer-vector-width", 19, "512", 3));
  LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(L.C, L.fn, "entry");
  LLVMPositionBuilderAtEnd(L.B, entry);
  L.dev = LLVMGetParam(L.fn, 0);
  L.devidx = LLVMBuildSExt(L.B, lower_rt(&L, RTFN_rt_device_index, &L.dev, 1), L.i64, "");
  L.slots = LLVMBuildLoad2(L.B, L.ptr, gep(&L, L.ptr, LLVMGetParam(L.fn, 1), L.devidx), "slots");
  L.buf = calloc((size_t)m->nvalues + 1, sizeof *L.buf);
  L.root = calloc((size_t)m->nvalues + 1, sizeof *L.root);
  L.owned = calloc((size_t)m->nvalues + 1, sizeof *L.owned);
  L.fused = calloc((size_t)m->nvalues + 1, sizeof *L.fused);
  L.share = malloc(sizeof *L.share * ((size_t)m->nvalues + 1));
  L.dest = calloc((size_t)m->nvalues + 1, sizeof *L.dest);
  L.val = calloc((size_t)m->nvalues + 1, sizeof *L.val);
  for (int i = 0; i <= m->nvalues; i++) L.share[i] = -1;
  index_values(&L, m->main);
  /* buffers by the plan `check` reports (bufplan.h), as it annotates the device program (the mesh's,
   * or the one-device program's made here): its views, in-place results and updates */
  Arena pa;
  arena_init(&pa);
  DevModule *dm = mesh ? m->dev : devprog_bare(&pa, m, NULL);
  bufplan_annotate(dm);
  int32_t *plan = malloc(sizeof *plan * ((size_t)m->nvalues + 1));
  for (int i = 0; i <= m->nvalues; i++) plan[i] = dm->values[i].buffer;
  L.plan = getenv("SHARDC_NO_BUFPLAN") ? NULL : plan;
  const IrFunc *f = m->main;
  bool ok = lower_region(&L, f);
  if (ok) {
    for (int j = 0; j < f->noutputs; j++) {
      const Value *v = f->outputs[j];
      int r = L.root[v->id];
      bool shared = !L.owned[r];
      for (int k = 0; k < j; k++) shared |= L.root[f->outputs[k]->id] == r;
      LLVMValueRef p = L.buf[v->id];
      if (shared && !L.owned[r] && output_updates_input(&L, j)) {
        bool once = true; /* no other output in that buffer */
        for (int k = 0; k < f->noutputs; k++) once &= k == j || L.root[f->outputs[k]->id] != r;
        shared = !once;
      }
      if (shared) {
        int64_t bytes = elements(&L, v) * dtype_bytes(v->type.dtype);
        if (mesh && m->pipeline) p = lower_pipe_copy(&L, v, p, bytes); /* a value some stages lack */
        else {
          LLVMValueRef nb = alloc_buffer(&L, v, bytes);
          LLVMBuildMemCpy(L.B, nb, 64, p, 64, ci64(&L, bytes));
          p = nb;
        }
      } else L.owned[r] = false; /* handed to the host */
      LLVMBuildStore(L.B, p, gep(&L, L.ptr, L.slots, ci64(&L, m->main->ninputs + m->nparams + j)));
    }
    free_region(&L, f);
    LLVMBuildRet(L.B, ci32(&L, 0));
  }
  free(L.buf);
  free(L.root);
  free(L.owned);
  free(L.fused);
  free(L.share);
  free(L.dest);
  free(L.val);
  free(plan);
  arena_free(&pa);
  LLVMDisposeBuilder(L.B);
  if (!ok) LLVMDeleteFunction(L.fn);
  return ok;
}

/* ---- hooks for lower_pipe.c ---- */

bool lower_body(Lower *L, const IrFunc *f) { return lower_region(L, f); }
void lower_free_body(Lower *L, const IrFunc *f) { free_region(L, f); }
LLVMValueRef lower_alloc(Lower *L, const Value *v, int64_t bytes) { return alloc_buffer(L, v, bytes); }
int64_t lower_value_bytes(const Lower *L, const Value *v) { return value_bytes(L, v); }
void lower_types(Lower *L) { init_types(L); }
