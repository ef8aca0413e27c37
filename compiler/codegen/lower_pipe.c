/* lower_pipe.c: pipelines (docs/passes.md, section 3) in the per-device program.
 *
 * In: a localised main holding one OP_PIPELINE (its regions, slots and per-stage action lists,
 * PipeInfo) and ops placed on some stages (Op.place). Out: each region as its own LLVM function
 * `int NAME.region.R(RtDevice *dev, void **in, void **out)` (its inputs' buffers in, new buffers
 * out that the caller owns), a constant RtPipe describing the slots and the schedule, and at the
 * pipeline op a call to the runtime's rt_pipeline, which runs the device's stage's actions in
 * order (runtime/pipeline.c, following interp_pipe.c). An op of main placed on some stages runs
 * under a branch on the device's stage; the buffers it makes are NULL elsewhere. A tied param's
 * AllReduce among some stages calls rt_all_reduce_group. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "lower_int.h"
#include "sim.h"

static LLVMValueRef c32(Lower *L, int64_t v) { return LLVMConstInt(L->i32, (unsigned long long)v, 1); }
static LLVMValueRef c64(Lower *L, int64_t v) { return LLVMConstInt(L->i64, (unsigned long long)v, 1); }

static LLVMValueRef global_const(Lower *L, LLVMTypeRef t, LLVMValueRef init, const char *name) {
  LLVMValueRef g = LLVMAddGlobal(L->M, t, name);
  LLVMSetInitializer(g, init);
  LLVMSetGlobalConstant(g, 1);
  LLVMSetLinkage(g, LLVMPrivateLinkage);
  return g;
}

static LLVMValueRef i32_array(Lower *L, const int *v, int n, const char *name) {
  LLVMValueRef e[256];
  LLVMValueRef *el = n > 256 ? malloc(sizeof *el * (size_t)n) : e;
  for (int i = 0; i < n; i++) el[i] = c32(L, v[i]);
  if (n == 0) el[0] = c32(L, 0);
  int k = n > 0 ? n : 1;
  LLVMValueRef g = global_const(L, LLVMArrayType2(L->i32, (uint64_t)k), LLVMConstArray2(L->i32, el, (uint64_t)k), name);
  if (el != e) free(el);
  return g;
}

static LLVMValueRef fixed_i32(Lower *L, const int *v, int n, int len) {
  LLVMValueRef e[16];
  for (int i = 0; i < len; i++) e[i] = c32(L, i < n ? v[i] : 0);
  return LLVMConstArray2(L->i32, e, (uint64_t)len);
}

static void stage_axes(const PipeInfo *pi, int *ax) {
  for (int k = 0; k < pi->nstage_axes; k++) ax[k] = pi->stage_axes[k];
}

void lower_pipe_stage(Lower *L) {
  if (!L->mesh || !L->m->pipeline || !L->m->pipeline->pipe) return;
  const PipeInfo *pi = L->m->pipeline->pipe;
  int ax[MAX_AXES_PER_DIM];
  stage_axes(pi, ax);
  LLVMValueRef arr = i32_array(L, ax, pi->nstage_axes, "stage_axes");
  LLVMTypeRef at[3] = {L->ptr, L->ptr, L->i32};
  LLVMValueRef av[3] = {L->dev, arr, c32(L, pi->nstage_axes)};
  L->stage = lower_call(L, "rt_group_rank", L->i32, at, 3, av);
}

/* true on the devices of the stages `place` names (PLACE_*: first, middle, last). */
static LLVMValueRef on_stages(Lower *L, uint8_t place) {
  int p = L->m->pipeline->pipe->stages;
  LLVMValueRef s = L->stage, any = LLVMConstInt(L->i1, 0, 0);
  if (place & PLACE_FIRST) any = LLVMBuildOr(L->B, any, LLVMBuildICmp(L->B, LLVMIntEQ, s, c32(L, 0), ""), "");
  if (place & PLACE_LAST) any = LLVMBuildOr(L->B, any, LLVMBuildICmp(L->B, LLVMIntEQ, s, c32(L, p - 1), ""), "");
  if (place & PLACE_MID) {
    LLVMValueRef mid = LLVMBuildAnd(L->B, LLVMBuildICmp(L->B, LLVMIntSGT, s, c32(L, 0), ""),
                                    LLVMBuildICmp(L->B, LLVMIntSLT, s, c32(L, p - 1), ""), "");
    any = LLVMBuildOr(L->B, any, mid, "");
  }
  return any;
}

/* op under `if (stage in op->place)`; each buffer it made is a phi with NULL from the other side. */
bool lower_pipe_guarded(Lower *L, const Op *op, bool (*one)(Lower *L, const Op *op)) {
  LLVMBasicBlockRef pre = LLVMGetInsertBlock(L->B);
  LLVMBasicBlockRef then = LLVMAppendBasicBlockInContext(L->C, L->fn, "placed");
  LLVMBasicBlockRef join = LLVMAppendBasicBlockInContext(L->C, L->fn, "placed.end");
  LLVMBuildCondBr(L->B, on_stages(L, op->place), then, join);
  LLVMPositionBuilderAtEnd(L->B, then);
  bool ok = one(L, op);
  LLVMBasicBlockRef end = LLVMGetInsertBlock(L->B);
  LLVMBuildBr(L->B, join);
  LLVMPositionBuilderAtEnd(L->B, join);
  for (int k = 0; ok && k < op->nresults; k++) {
    int id = op->results[k]->id;
    if (!L->buf[id]) continue;
    LLVMValueRef phi = LLVMBuildPhi(L->B, L->ptr, "");
    LLVMValueRef in[2] = {L->buf[id], LLVMConstNull(L->ptr)};
    LLVMBasicBlockRef from[2] = {end, pre};
    LLVMAddIncoming(phi, in, from, 2);
    L->buf[id] = phi;
  }
  return ok;
}

LLVMValueRef lower_pipe_copy(Lower *L, const Value *v, LLVMValueRef p, int64_t bytes) {
  LLVMBasicBlockRef pre = LLVMGetInsertBlock(L->B);
  LLVMBasicBlockRef then = LLVMAppendBasicBlockInContext(L->C, L->fn, "held");
  LLVMBasicBlockRef join = LLVMAppendBasicBlockInContext(L->C, L->fn, "held.end");
  LLVMBuildCondBr(L->B, LLVMBuildIsNotNull(L->B, p, ""), then, join);
  LLVMPositionBuilderAtEnd(L->B, then);
  LLVMValueRef nb = lower_alloc(L, v, bytes);
  LLVMBuildMemCpy(L->B, nb, 64, p, 64, c64(L, bytes));
  LLVMBasicBlockRef end = LLVMGetInsertBlock(L->B);
  LLVMBuildBr(L->B, join);
  LLVMPositionBuilderAtEnd(L->B, join);
  LLVMValueRef phi = LLVMBuildPhi(L->B, L->ptr, "");
  LLVMValueRef in[2] = {nb, LLVMConstNull(L->ptr)};
  LLVMBasicBlockRef from[2] = {end, pre};
  LLVMAddIncoming(phi, in, from, 2);
  return phi;
}

/* An AllReduce among the devices of CollSpec.group along its axes (a tied param's first and last
 * stage); the result's buffer is made. */
bool lower_all_reduce_group(Lower *L, const Op *op, const int8_t *axes, int naxes, LLVMValueRef axes_arr) {
  (void)axes, (void)naxes;
  const Value *x = op->operands[0], *res = op->results[0];
  const CollSpec *cs = op->coll;
  LLVMValueRef grp = i32_array(L, cs->group, cs->ngroup, "group");
  int64_t n = lower_value_bytes(L, x) / dtype_bytes(x->type.dtype);
  LLVMTypeRef P = L->ptr, I32 = L->i32;
  LLVMTypeRef at[10] = {P, P, I32, I32, I32, P, I32, P, P, L->i64};
  LLVMValueRef av[10] = {L->dev, axes_arr, c32(L, naxes), c32(L, lower_rt_dtype(x->type.dtype)), c32(L, op->reduce_max ? 1 : 0),
                         grp, c32(L, cs->ngroup), L->buf[x->id], L->buf[res->id], c64(L, n)};
  lower_check_rc(L, lower_call(L, "rt_all_reduce_group", I32, at, 10, av));
  return true;
}

/* ---- regions ---- */

/* Region f as `int name(RtDevice *dev, void **in, void **out)`: out[j] a new buffer the caller owns. */
static LLVMValueRef region_function(Lower *outer, const IrFunc *f, const char *name, bool *ok) {
  Lower R = {.lw = outer->lw, .C = outer->C, .M = outer->M, .m = outer->m, .mesh = outer->mesh, .fname = name};
  lower_types(&R);
  R.B = LLVMCreateBuilderInContext(R.C);
  LLVMTypeRef at[3] = {R.ptr, R.ptr, R.ptr};
  R.fn = LLVMAddFunction(R.M, name, LLVMFunctionType(R.i32, at, 3, 0));
  LLVMSetLinkage(R.fn, LLVMInternalLinkage);
  LLVMAddAttributeAtIndex(R.fn, LLVMAttributeFunctionIndex, LLVMCreateStringAttribute(R.C, "prefer-vector-width", 19, "512", 3));
  LLVMPositionBuilderAtEnd(R.B, LLVMAppendBasicBlockInContext(R.C, R.fn, "entry"));
  R.dev = LLVMGetParam(R.fn, 0);
  LLVMValueRef in = LLVMGetParam(R.fn, 1), out = LLVMGetParam(R.fn, 2);
  int nv = R.m->nvalues + 1;
  R.buf = calloc((size_t)nv, sizeof *R.buf);
  R.root = calloc((size_t)nv, sizeof *R.root);
  R.owned = calloc((size_t)nv, sizeof *R.owned);
  R.fused = calloc((size_t)nv, sizeof *R.fused);
  /* A region's buffers are its own (R.plan NULL): rt_pipeline owns what crosses between regions,
   * which the buffer plan does not model op by op. */
  R.share = malloc(sizeof *R.share * (size_t)nv);
  R.dest = calloc((size_t)nv, sizeof *R.dest);
  R.val = calloc((size_t)nv, sizeof *R.val);
  for (int i = 0; i < nv; i++) R.share[i] = -1;
  for (int i = 0; i < f->ninputs; i++) {
    const Value *v = f->inputs[i];
    LLVMValueRef idx = c64(&R, i);
    R.buf[v->id] = LLVMBuildLoad2(R.B, R.ptr, LLVMBuildInBoundsGEP2(R.B, R.ptr, in, &idx, 1, ""), v->name ? v->name : "in");
    R.root[v->id] = v->id;
  }
  *ok = lower_body(&R, f) && !R.failed;
  if (*ok) {
    for (int j = 0; j < f->noutputs; j++) {
      const Value *v = f->outputs[j];
      int r = R.root[v->id];
      bool shared = !R.owned[r];
      for (int k = 0; k < j; k++) shared |= R.root[f->outputs[k]->id] == r;
      LLVMValueRef p = R.buf[v->id];
      if (shared) {
        int64_t bytes = lower_value_bytes(&R, v);
        LLVMValueRef nb = lower_alloc(&R, v, bytes);
        LLVMBuildMemCpy(R.B, nb, 64, p, 64, c64(&R, bytes));
        p = nb;
      } else R.owned[r] = false; /* handed to the caller */
      LLVMValueRef idx = c64(&R, j);
      LLVMBuildStore(R.B, p, LLVMBuildInBoundsGEP2(R.B, R.ptr, out, &idx, 1, ""));
    }
    lower_free_body(&R, f);
    LLVMBuildRet(R.B, c32(&R, 0));
  }
  free(R.buf), free(R.root), free(R.owned), free(R.fused), free(R.share), free(R.dest), free(R.val);
  LLVMDisposeBuilder(R.B);
  if (!*ok) outer->failed = true;
  return R.fn;
}

/* RtPipeSlot {i32 kind, i32 index, i32 dtype, i64 count} (shardrt.h), per region input or output. */
static LLVMValueRef slots_const(Lower *L, LLVMTypeRef st, const PipeSlot *sl, Value *const *vals, int n, const char *name) {
  if (n == 0) return LLVMConstNull(L->ptr);
  LLVMValueRef *e = malloc(sizeof *e * (size_t)n);
  for (int i = 0; i < n; i++) {
    const Value *v = vals[i];
    LLVMValueRef f[4] = {c32(L, sl[i].kind), c32(L, sl[i].index), c32(L, lower_rt_dtype(v->type.dtype)),
                         c64(L, lower_value_bytes(L, v) / dtype_bytes(v->type.dtype))};
    e[i] = LLVMConstNamedStruct(st, f, 4);
  }
  LLVMValueRef g = global_const(L, LLVMArrayType2(st, (uint64_t)n), LLVMConstArray2(st, e, (uint64_t)n), name);
  free(e);
  return g;
}

bool lower_pipeline(Lower *L, const Op *op) {
  const PipeInfo *pi = op->pipe;
  if (!pi) {
    diag_error(op->loc, "run: a pipeline without its info");
    L->failed = true;
    return false;
  }
  if (!L->mesh || !L->stage) {
    diag_error(op->loc, "run: a pipeline (layers@stage) lowers only in the per-device program of a mesh");
    L->failed = true;
    return false;
  }
  LLVMTypeRef P = L->ptr, I32 = L->i32, I64 = L->i64;
  /* the regions, each its own function; lowering them moves the builder, so save its place */
  LLVMBasicBlockRef here = LLVMGetInsertBlock(L->B);
  LLVMValueRef rfn[PR__COUNT];
  bool ok = true;
  for (int r = 0; r < PR__COUNT; r++) {
    rfn[r] = LLVMConstNull(P);
    if (!pi->region[r]) continue;
    char name[160];
    snprintf(name, sizeof name, "%s.region.%d", L->fname, r);
    bool rok;
    rfn[r] = region_function(L, pi->region[r], name, &rok);
    ok &= rok;
  }
  LLVMPositionBuilderAtEnd(L->B, here);
  if (!ok) return false;
  /* the descriptor (RtPipe, shardrt.h; C's natural layout) */
  LLVMTypeRef slot_fields[4] = {I32, I32, I32, I64};
  LLVMTypeRef slot_t = LLVMStructCreateNamed(L->C, "RtPipeSlot");
  LLVMStructSetBody(slot_t, slot_fields, 4, 0);
  LLVMValueRef in_s[PR__COUNT], out_s[PR__COUNT], nin[PR__COUNT], nout[PR__COUNT];
  for (int r = 0; r < PR__COUNT; r++) {
    const IrFunc *R = pi->region[r];
    in_s[r] = R ? slots_const(L, slot_t, pi->in[r], R->inputs, R->ninputs, "pipe_in") : LLVMConstNull(P);
    out_s[r] = R ? slots_const(L, slot_t, pi->out[r], R->outputs, R->noutputs, "pipe_out") : LLVMConstNull(P);
    nin[r] = c32(L, R ? R->ninputs : 0);
    nout[r] = c32(L, R ? R->noutputs : 0);
  }
  int nops = op->noperands;
  LLVMValueRef *rows = malloc(sizeof *rows * (size_t)(nops + 1));
  for (int i = 0; i < nops; i++) {
    const Value *x = op->operands[i];
    int64_t b = lower_value_bytes(L, x), e0 = x->type.rank > 0 ? x->local[0] : 0;
    rows[i] = c64(L, e0 > 0 ? b / e0 : 0);
  }
  LLVMValueRef row_bytes = global_const(L, LLVMArrayType2(I64, (uint64_t)nops), LLVMConstArray2(I64, rows, (uint64_t)nops), "pipe_rows");
  free(rows);
  int nc = pi->ncarried;
  int *adt = calloc((size_t)nc + 1, sizeof(int));
  LLVMValueRef *acnt = malloc(sizeof *acnt * (size_t)(nc + 1));
  for (int k = 0; k < nc; k++) {
    const Value *x = op->operands[pi->nslices + k];
    adt[k] = lower_rt_dtype(x->type.dtype);
    acnt[k] = c64(L, lower_value_bytes(L, x) / dtype_bytes(x->type.dtype));
  }
  LLVMValueRef acc_dtype = i32_array(L, adt, nc, "pipe_acc_dtype");
  LLVMValueRef acc_count = nc ? global_const(L, LLVMArrayType2(I64, (uint64_t)nc), LLVMConstArray2(I64, acnt, (uint64_t)nc), "pipe_acc_count")
                              : LLVMConstNull(P);
  free(adt), free(acnt);
  LLVMValueRef place = LLVMConstNull(P);
  if (pi->result_place) {
    LLVMValueRef *pl = malloc(sizeof *pl * (size_t)(op->nresults + 1));
    for (int k = 0; k < op->nresults; k++) pl[k] = LLVMConstInt(L->i8, pi->result_place[k], 0);
    place = global_const(L, LLVMArrayType2(L->i8, (uint64_t)op->nresults), LLVMConstArray2(L->i8, pl, (uint64_t)op->nresults), "pipe_place");
    free(pl);
  }
  /* SHARDC_PIPE_MUTATE=1 (tests only): stage 0 skips its last first_bwd action (a microbatch's
   * embedding gradient lost), which `run` must catch */
  int nact = pi->first_action[pi->stages], drop = -1;
  const char *mutate = getenv("SHARDC_PIPE_MUTATE");
  for (int i = pi->first_action[0]; mutate && *mutate == '1' && i < pi->first_action[1]; i++)
    if (pi->actions[i].kind == PA_FIRST_BWD) drop = i;
  int *acts = malloc(sizeof(int) * (size_t)(5 * nact + 1)), *first_action = malloc(sizeof(int) * (size_t)(pi->stages + 1)), n = 0;
  for (int s = 0; s < pi->stages; s++) {
    first_action[s] = n;
    for (int i = pi->first_action[s]; i < pi->first_action[s + 1]; i++) {
      if (i == drop) continue;
      const PipeAction *a = &pi->actions[i];
      int *e = &acts[5 * n++];
      e[0] = a->kind, e[1] = a->backward, e[2] = a->mb, e[3] = a->chunk, e[4] = a->peer;
    }
  }
  first_action[pi->stages] = n;
  LLVMValueRef actions = i32_array(L, acts, 5 * n, "pipe_actions"); /* RtPipeAction: five i32 */
  LLVMValueRef first = i32_array(L, first_action, pi->stages + 1, "pipe_first_action");
  free(acts), free(first_action);
  int sax[MAX_AXES_PER_DIM], split[16], nsplit = 0;
  stage_axes(pi, sax);
  for (int a = 0; a < L->mesh->naxes; a++)
    if (pi->send_split >> a & 1) split[nsplit++] = a;
  char where[256];
  snprintf(where, sizeof where, "%s:%d: pipeline", op->loc.file ? op->loc.file->path : "?", op->loc.line);
  LLVMValueRef wstr = LLVMBuildGlobalStringPtr(L->B, where, "pipe_where");
  /* the simulated clock's share of the pipeline itself (lower_set_clock): accumulations, sends */
  LLVMValueRef clock_acc[PR__COUNT], clock_send[PR__COUNT];
  const SimCosts *ck = L->lw->clock;
  for (int r = 0; r < PR__COUNT; r++) {
    clock_acc[r] = LLVMConstReal(LLVMDoubleTypeInContext(L->C), ck ? sim_pipe_accumulate_seconds(L->mesh, pi, r, ck->ideal) : 0);
    clock_send[r] = LLVMConstReal(LLVMDoubleTypeInContext(L->C), ck ? sim_pipe_transfer_seconds(L->mesh, pi, r, ck->ideal) : 0);
  }
  int nsave = pi->region[PR_CHUNK_FWD] ? pi->region[PR_CHUNK_FWD]->noutputs : 0;
  LLVMTypeRef A8 = LLVMArrayType2(I32, 8), A5p = LLVMArrayType2(P, 5), A5i = LLVMArrayType2(I32, 5);
  LLVMTypeRef F64 = LLVMDoubleTypeInContext(L->C), A5d = LLVMArrayType2(F64, 5);
  LLVMTypeRef ft[] = {I32, I32, I32, I64, I32, A8, I32, A8, I32, I32, I32, I32, I32, P, P, P, P, A5p, A5i, A5i, A5p, A5p, P, P, P, A5d, A5d};
  int nf = (int)(sizeof ft / sizeof ft[0]);
  LLVMTypeRef pipe_t = LLVMStructCreateNamed(L->C, "RtPipe");
  LLVMStructSetBody(pipe_t, ft, (unsigned)nf, 0);
  LLVMValueRef fv[] = {c32(L, pi->stages), c32(L, pi->chunks), c32(L, pi->microbatches), c64(L, pi->chunk_layers),
                       c32(L, pi->nstage_axes), fixed_i32(L, sax, pi->nstage_axes, 8), c32(L, nsplit), fixed_i32(L, split, nsplit, 8),
                       c32(L, pi->nslices), c32(L, pi->ncarried), c32(L, nops), c32(L, op->nresults), c32(L, nsave),
                       row_bytes, acc_dtype, acc_count, place,
                       LLVMConstArray2(P, rfn, 5), LLVMConstArray2(I32, nin, 5), LLVMConstArray2(I32, nout, 5),
                       LLVMConstArray2(P, in_s, 5), LLVMConstArray2(P, out_s, 5), actions, first, wstr,
                       LLVMConstArray2(F64, clock_acc, 5), LLVMConstArray2(F64, clock_send, 5)};
  LLVMValueRef desc = global_const(L, pipe_t, LLVMConstNamedStruct(pipe_t, fv, (unsigned)nf), "pipe");
  /* the operands' buffers (NULL where this device holds none), the results' */
  LLVMValueRef ops = LLVMBuildArrayAlloca(L->B, P, c32(L, nops > 0 ? nops : 1), "pipe_ops");
  for (int i = 0; i < nops; i++) {
    LLVMValueRef idx = c64(L, i);
    LLVMValueRef b = L->buf[op->operands[i]->id] ? L->buf[op->operands[i]->id] : LLVMConstNull(P);
    LLVMBuildStore(L->B, b, LLVMBuildInBoundsGEP2(L->B, P, ops, &idx, 1, ""));
  }
  LLVMValueRef res = LLVMBuildArrayAlloca(L->B, P, c32(L, op->nresults > 0 ? op->nresults : 1), "pipe_res");
  LLVMTypeRef at[4] = {P, P, P, P};
  LLVMValueRef av[4] = {L->dev, desc, ops, res};
  lower_check_rc(L, lower_call(L, "rt_pipeline", I32, at, 4, av));
  for (int k = 0; k < op->nresults; k++) {
    const Value *v = op->results[k];
    LLVMValueRef idx = c64(L, k);
    L->buf[v->id] = LLVMBuildLoad2(L->B, P, LLVMBuildInBoundsGEP2(L->B, P, res, &idx, 1, ""), v->name ? v->name : "pipe_result");
    L->root[v->id] = v->id;
    L->owned[v->id] = true;
  }
  return true;
}
