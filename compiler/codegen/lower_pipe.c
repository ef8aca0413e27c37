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

/* op under `if (this device runs it)`: the device program's stage predicate (dev_runs_on) as a table
 * over the devices; each buffer it made is a phi with NULL from the other side. */
bool lower_pipe_guarded(Lower *L, const Op *op, bool (*one)(Lower *L, const Op *op)) {
  const DevModule *dm = L->m->dev;
  uint8_t *runs = ARENA_ARRAY(&L->lw->arena, uint8_t, dm->ndev);
  for (int64_t d = 0; d < dm->ndev; d++) runs[d] = dev_runs_on(dm, dev_op_runs(op), d);
  LLVMBasicBlockRef pre = LLVMGetInsertBlock(L->B);
  LLVMBasicBlockRef then = LLVMAppendBasicBlockInContext(L->C, L->fn, "placed");
  LLVMBasicBlockRef join = LLVMAppendBasicBlockInContext(L->C, L->fn, "placed.end");
  LLVMBuildCondBr(L->B, lower_per_device_flag(L, runs, "runs"), then, join);
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

/* ---- regions ---- */

/* Region f as `int name(RtDevice *dev, void **in, void **out)`: out[j] a new buffer the caller owns;
 * `runs`: how often it runs in a step (lower_nest counts its loops' work so many times). */
static LLVMValueRef region_function(Lower *outer, const IrFunc *f, const char *name, double runs, bool *ok) {
  Lower R = {.lw = outer->lw, .C = outer->C, .M = outer->M, .m = outer->m, .mesh = outer->mesh, .fname = name, .repeat = runs};
  lower_types(&R);
  R.B = LLVMCreateBuilderInContext(R.C);
  LLVMTypeRef at[3] = {R.ptr, R.ptr, R.ptr};
  R.fn = LLVMAddFunction(R.M, name, LLVMFunctionType(R.i32, at, 3, 0));
  LLVMSetLinkage(R.fn, LLVMInternalLinkage);
  LLVMAddAttributeAtIndex(R.fn, LLVMAttributeFunctionIndex, LLVMCreateStringAttribute(R.C, "prefer-vector-width", 19, "512", 3));
  LLVMPositionBuilderAtEnd(R.B, LLVMAppendBasicBlockInContext(R.C, R.fn, "entry"));
  R.dev = LLVMGetParam(R.fn, 0);
  R.devidx = LLVMBuildSExt(R.B, lower_rt(&R, RTFN_rt_device_index, &R.dev, 1), R.i64, "");
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

/* A region's input or output slots (RtPipeSlot), host-made and bound as a constant array. */
static const RtPipeSlot *slots_of(Lower *L, const PipeSlot *sl, Value *const *vals, int n, const char *name) {
  if (n == 0) return NULL;
  RtPipeSlot *v = ARENA_ARRAY(&L->lw->arena, RtPipeSlot, n);
  for (int i = 0; i < n; i++)
    v[i] = (RtPipeSlot){.kind = sl[i].kind, .index = sl[i].index, .dtype = lower_rt_dtype(vals[i]->type.dtype),
                        .count = lower_value_bytes(L, vals[i]) / dtype_bytes(vals[i]->type.dtype)};
  lower_rt_bind(L, v, lower_rt_consts(L, RTS_RtPipeSlot, v, n, name));
  return v;
}

/* An array of n scalars of an RT_KIND, host-made (arena) and bound. */
static const void *bound_array(Lower *L, int kind, const void *v, int n, const char *name) {
  if (n == 0) return NULL;
  lower_rt_bind(L, v, lower_rt_array(L, kind, v, n, name));
  return v;
}

bool lower_pipeline(Lower *L, const Op *op) {
  const PipeInfo *pi = op->pipe;
  if (!pi) {
    diag_error(op->loc, "run: a pipeline without its info");
    L->failed = true;
    return false;
  }
  if (!L->mesh || !L->m->dev || !L->m->dev->pipe) {
    diag_error(op->loc, "run: a pipeline (layers@stage) lowers only in the per-device program of a mesh");
    L->failed = true;
    return false;
  }
  /* the regions, each its own function; lowering them moves the builder, so save its place */
  LLVMBasicBlockRef here = LLVMGetInsertBlock(L->B);
  LLVMValueRef rfn[PR__COUNT];
  bool ok = true;
  for (int r = 0; r < PR__COUNT; r++) {
    rfn[r] = LLVMConstNull(L->ptr);
    if (!pi->region[r]) continue;
    char name[160];
    snprintf(name, sizeof name, "%s.region.%d", L->fname, r);
    bool rok;
    /* runs in a step: once per microbatch and layer chunk, at most (the estimate lower_compile uses) */
    rfn[r] = region_function(L, pi->region[r], name, (L->repeat > 0 ? L->repeat : 1) * pi->microbatches * pi->chunk_layers, &rok);
    ok &= rok;
  }
  LLVMPositionBuilderAtEnd(L->B, here);
  if (!ok) return false;
  /* the descriptor: an RtPipe (shardrt.h) filled here, made a constant by rt_api.def's layout */
  const DevModule *dm = L->m->dev;
  Arena *A = &L->lw->arena;
  RtPipe P = {.stages = pi->stages, .chunks = pi->chunks, .microbatches = pi->microbatches, .chunk_layers = pi->chunk_layers,
              .nslices = pi->nslices, .ncarried = pi->ncarried, .noperands = op->noperands, .nresults = op->nresults,
              .nsave = pi->region[PR_CHUNK_FWD] ? pi->region[PR_CHUNK_FWD]->noutputs : 0};
  lower_rt_groups(L, dm->pipe->stages);
  P.stage_groups = (const RtGroups *)(const void *)dm->pipe->stages;
  if (dm->pipe->split) {
    lower_rt_groups(L, dm->pipe->split);
    P.split = (const RtGroups *)(const void *)dm->pipe->split;
  }
  for (int r = 0; r < PR__COUNT; r++) {
    const IrFunc *R = pi->region[r];
    if (!R) continue;
    lower_rt_bind(L, R, rfn[r]);
    P.region[r] = (RtRegionFn)(void (*)(void))(uintptr_t)(const void *)R; /* a key: the region's IrFunc */
    P.nin[r] = R->ninputs, P.nout[r] = R->noutputs;
    P.in[r] = slots_of(L, pi->in[r], R->inputs, R->ninputs, "pipe_in");
    P.out[r] = slots_of(L, pi->out[r], R->outputs, R->noutputs, "pipe_out");
  }
  int nops = op->noperands, nc = pi->ncarried;
  int64_t *rows = ARENA_ARRAY(A, int64_t, nops + 1), *acnt = ARENA_ARRAY(A, int64_t, nc + 1);
  int32_t *adt = ARENA_ARRAY(A, int32_t, nc + 1);
  for (int i = 0; i < nops; i++) {
    const Value *x = op->operands[i];
    int64_t b = lower_value_bytes(L, x), e0 = x->type.rank > 0 ? dev_value(dm, x)->local[0] : 0;
    rows[i] = e0 > 0 ? b / e0 : 0;
  }
  for (int k = 0; k < nc; k++) {
    const Value *x = op->operands[pi->nslices + k];
    adt[k] = lower_rt_dtype(x->type.dtype);
    acnt[k] = lower_value_bytes(L, x) / dtype_bytes(x->type.dtype);
  }
  P.row_bytes = bound_array(L, RT_KIND_I64, rows, nops, "pipe_rows");
  P.acc_dtype = bound_array(L, RT_KIND_I32, adt, nc, "pipe_acc_dtype");
  P.acc_count = bound_array(L, RT_KIND_I64, acnt, nc, "pipe_acc_count");
  if (pi->result_place) { /* per result and stage: the device program's stage predicate */
    uint8_t *on = ARENA_ARRAY(A, uint8_t, (size_t)op->nresults * (size_t)pi->stages + 1);
    for (int k = 0; k < op->nresults; k++)
      for (int st = 0; st < pi->stages; st++) on[k * pi->stages + st] = dev_stage_runs(pi->result_place[k], st, pi->stages);
    P.result_on = bound_array(L, RT_KIND_I8, on, op->nresults * pi->stages, "pipe_result_on");
  }
  /* SHARDC_PIPE_MUTATE=1 (tests only): stage 0 skips its last first_bwd action (a microbatch's
   * embedding gradient lost), which `run` must catch */
  int nact = pi->first_action[pi->stages], drop = -1;
  const char *mutate = getenv("SHARDC_PIPE_MUTATE");
  for (int i = pi->first_action[0]; mutate && *mutate == '1' && i < pi->first_action[1]; i++)
    if (pi->actions[i].kind == PA_FIRST_BWD) drop = i;
  RtPipeAction *acts = ARENA_ARRAY(A, RtPipeAction, nact + 1);
  int32_t *first_action = ARENA_ARRAY(A, int32_t, pi->stages + 1);
  int n = 0;
  for (int st = 0; st < pi->stages; st++) {
    first_action[st] = n;
    for (int i = pi->first_action[st]; i < pi->first_action[st + 1]; i++) {
      if (i == drop) continue;
      const PipeAction *a = &pi->actions[i];
      bool chunk = a->kind == PA_FWD || a->kind == PA_BWD;
      acts[n++] = (RtPipeAction){.kind = a->kind, .backward = a->backward, .mb = a->mb, .chunk = a->chunk, .peer = a->peer,
                                 .row0 = chunk ? dev_chunk_row0(dm, a->chunk) : 0};
    }
  }
  first_action[pi->stages] = n;
  lower_rt_bind(L, acts, lower_rt_consts(L, RTS_RtPipeAction, acts, n, "pipe_actions"));
  P.actions = acts;
  P.first_action = bound_array(L, RT_KIND_I32, first_action, pi->stages + 1, "pipe_first_action");
  char *where = arena_printf(A, "%s:%d: pipeline", op->loc.file ? op->loc.file->path : "?", op->loc.line);
  lower_rt_bind(L, where, LLVMBuildGlobalStringPtr(L->B, where, "pipe_where"));
  P.where = where;
  /* the simulated clock's share of the pipeline itself (lower_set_clock): accumulations, sends */
  const SimCosts *ck = L->lw->clock;
  for (int r = 0; r < PR__COUNT; r++) {
    P.clock_acc[r] = ck ? sim_pipe_accumulate_seconds(L->mesh, pi, r, ck->ideal) : 0;
    P.clock_send[r] = ck ? sim_pipe_transfer_seconds(L->mesh, pi, r, ck->ideal) : 0;
  }
  LLVMValueRef desc = lower_rt_const(L, RTS_RtPipe, &P, "pipe");
  /* the operands' buffers (NULL where this device holds none), the results' */
  LLVMTypeRef Pt = L->ptr;
  LLVMValueRef ops = LLVMBuildArrayAlloca(L->B, Pt, c32(L, nops > 0 ? nops : 1), "pipe_ops");
  for (int i = 0; i < nops; i++) {
    LLVMValueRef idx = c64(L, i);
    LLVMValueRef b = L->buf[op->operands[i]->id] ? L->buf[op->operands[i]->id] : LLVMConstNull(Pt);
    LLVMBuildStore(L->B, b, LLVMBuildInBoundsGEP2(L->B, Pt, ops, &idx, 1, ""));
  }
  LLVMValueRef res = LLVMBuildArrayAlloca(L->B, Pt, c32(L, op->nresults > 0 ? op->nresults : 1), "pipe_res");
  LLVMValueRef av[4] = {L->dev, desc, ops, res};
  lower_check_rc(L, lower_rt(L, RTFN_rt_pipeline, av, 4));
  for (int k = 0; k < op->nresults; k++) {
    const Value *v = op->results[k];
    LLVMValueRef idx = c64(L, k);
    L->buf[v->id] = LLVMBuildLoad2(L->B, Pt, LLVMBuildInBoundsGEP2(L->B, Pt, res, &idx, 1, ""), v->name ? v->name : "pipe_result");
    L->root[v->id] = v->id;
    L->owned[v->id] = true;
  }
  return true;
}
