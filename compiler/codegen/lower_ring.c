/* lower_ring.c: ring attention (Op.ring on OP_ATTENTION / OP_ATTENTION_GRAD; language.md, Context
 * parallelism) lowered to one call into the runtime's ring kernels (runtime/nn_ring.c). In: the
 * attention's RtAttn (lower_nn.c builds it; its key extent is the device's key block) and the
 * query block's offset. Out: a constant RtRing -- the ring's axis tuple, taken from how the key
 * dim is sharded, so that the rank a block comes from is also its storage block number, and the
 * zigzag order of a causal ring (IrModule.zigzag) for the mask's logical positions -- and the
 * call. The K/V blocks travel inside the kernel (rt_permute_shift), as the interpreter's
 * spmd_ring has them travel. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "lower_int.h"

static bool ring_fail(Lower *L, const Op *op, const char *what) {
  diag_error(op->loc, "run: ring %s: %s is not lowered yet", ir_op_name(op->kind), what);
  L->failed = true;
  return false;
}

static LLVMValueRef ring_const(Lower *L, const int64_t *v, int n) {
  LLVMValueRef e[RT_RING_WORDS];
  for (int i = 0; i < n; i++) e[i] = LLVMConstInt(L->i64, (unsigned long long)v[i], 1);
  LLVMValueRef g = LLVMAddGlobal(L->M, LLVMArrayType2(L->i64, (uint64_t)n), "ring");
  LLVMSetInitializer(g, LLVMConstArray2(L->i64, e, (uint64_t)n));
  LLVMSetGlobalConstant(g, 1);
  LLVMSetLinkage(g, LLVMPrivateLinkage);
  return g;
}

/* The ring's axes: those sharding the key dim of k (major first), which must be exactly Op.ring's
 * axes of more than one device; RtRing's words: naxes, axes[8], zz_n, zq_chunk, zk_chunk. */
static bool ring_desc(Lower *L, const Op *op, int64_t *r) {
  const Value *k = op->operands[1];
  const Dim *K = op->dims[1], *Q = op->dims[2];
  memset(r, 0, sizeof(int64_t) * RT_RING_WORDS);
  int pk = tensor_type_find(&k->type, K);
  if (!L->mesh || pk < 0) return ring_fail(L, op, "a ring without a mesh or a key dim");
  uint16_t want = 0, have = 0;
  for (int a = 0; a < L->mesh->naxes; a++)
    if ((op->ring >> a & 1) && L->mesh->axes[a].size > 1) want |= (uint16_t)(1u << a);
  int n = 0;
  for (int i = 0; i < k->sharding.naxes[pk]; i++) {
    int a = k->sharding.axes[pk][i];
    if (a < 0 || a >= L->mesh->naxes || L->mesh->axes[a].size <= 1) continue;
    have |= (uint16_t)(1u << a);
    r[1 + n++] = a;
  }
  if (have != want) return ring_fail(L, op, "a key dim sharded over other axes than the ring's");
  r[0] = n;
  const struct Zigzag *z = &L->m->zigzag;
  if (op->flag && z->axes && z->n >= 2) {
    bool qz = Q == z->dims[0] || Q == z->dims[1], kz = K == z->dims[0] || K == z->dims[1];
    if (qz != kz || z->axes != op->ring) return ring_fail(L, op, "a causal mask over another zigzag order than the ring's");
    /* SHARDC_RING_MUTATE=zigzag (tests only): the mask compares storage positions, a mistake
     * run.ring.mutation.zigzag must catch */
    const char *mut = getenv("SHARDC_RING_MUTATE");
    if (qz && !(mut && strcmp(mut, "zigzag") == 0)) {
      r[9] = z->n;
      r[10] = Q->size / (2 * z->n);
      r[11] = K->size / (2 * z->n);
    }
  }
  return true;
}

bool lower_ring_attention(Lower *L, const Op *op, const int64_t *attn, int nattn, LLVMValueRef q_off) {
  int64_t r[RT_RING_WORDS];
  if (!ring_desc(L, op, r)) return false;
  bool grad = op->kind == OP_ATTENTION_GRAD;
  LLVMTypeRef P = L->ptr, I64 = L->i64, F64 = L->f64, I32 = L->i32;
  LLVMValueRef e[128];
  for (int i = 0; i < nattn; i++) e[i] = LLVMConstInt(I64, (unsigned long long)attn[i], 1);
  LLVMValueRef desc = LLVMAddGlobal(L->M, LLVMArrayType2(I64, (uint64_t)nattn), "attn");
  LLVMSetInitializer(desc, LLVMConstArray2(I64, e, (uint64_t)nattn));
  LLVMSetGlobalConstant(desc, 1);
  LLVMSetLinkage(desc, LLVMPrivateLinkage);
  LLVMValueRef ring = ring_const(L, r, RT_RING_WORDS);
  LLVMValueRef scale = LLVMConstReal(F64, op->scalar);
  LLVMValueRef *b = L->buf;
  if (!grad) {
    LLVMTypeRef at[9] = {P, P, P, F64, I64, P, P, P, P};
    LLVMValueRef av[9] = {L->dev, desc, ring, scale, q_off, b[op->operands[0]->id], b[op->operands[1]->id],
                          b[op->operands[2]->id], b[op->results[0]->id]};
    lower_check_rc(L, lower_call(L, "rt_nn_ring_attention", I32, at, 9, av));
  } else {
    LLVMTypeRef at[12] = {P, P, P, F64, I64, P, P, P, P, P, I32, P};
    LLVMValueRef av[12] = {L->dev, desc, ring, scale, q_off, b[op->operands[0]->id], b[op->operands[1]->id],
                           b[op->operands[2]->id], b[op->operands[3]->id], b[op->operands[4]->id],
                           LLVMConstInt(I32, (unsigned long long)op->index, 0), b[op->results[0]->id]};
    lower_check_rc(L, lower_call(L, "rt_nn_ring_attention_grad", I32, at, 12, av));
  }
  return true;
}
