/* lower_ring.c: ring attention (Op.ring on OP_ATTENTION / OP_ATTENTION_GRAD; language.md, Context
 * parallelism) lowered to one call into the runtime's ring kernels (runtime/nn_ring.c). In: the
 * attention's RtAttn (lower_nn.c builds it; its key extent is the device's key block) and the
 * query block's offset. Out: a constant RtRing -- the device program's ring (DevRing): its axis
 * tuple, the key dim's, so that the rank a block comes from is also its storage block number, and
 * the query's and key's storage orders for the mask's logical positions -- and the call. The K/V blocks travel inside the kernel (rt_permute_shift), as the interpreter's
 * spmd_ring has them travel. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devprog.h"
#include "diag.h"
#include "lower_int.h"

static bool ring_fail(Lower *L, const Op *op, const char *what) {
  diag_error(op->loc, "run: ring %s: %s is not lowered yet", ir_op_name(op->kind), what);
  L->failed = true;
  return false;
}

/* The constant RtRing: the device program's ring (DevRing): its groups (the key dim's axes in their
 * tuple's order), the query's and the key's storage orders. */
static bool ring_desc(Lower *L, const Op *op, LLVMValueRef *out) {
  const DevRing *ring = op->dev ? op->dev->ring : NULL;
  if (!L->mesh || !ring) return ring_fail(L, op, "a ring outside the device program");
  lower_rt_groups(L, ring->groups);
  RtRing r = {.groups = (const RtGroups *)(const void *)ring->groups, .qorder = ring->qorder, .korder = ring->korder};
  /* SHARDC_RING_MUTATE=zigzag (tests only): the mask compares storage positions, a mistake
   * run.ring.mutation.zigzag must catch */
  const char *mut = getenv("SHARDC_RING_MUTATE");
  if (mut && strcmp(mut, "zigzag") == 0) r.qorder = r.korder = (RtOrder){.kind = RT_ORDER_NATURAL};
  *out = lower_rt_const(L, RTS_RtRing, &r, "ring");
  return true;
}

bool lower_ring_attention(Lower *L, const Op *op, LLVMValueRef desc, LLVMValueRef q_off) {
  LLVMValueRef ring;
  if (!ring_desc(L, op, &ring)) return false;
  bool grad = op->kind == OP_ATTENTION_GRAD;
  LLVMValueRef scale = LLVMConstReal(L->f64, op->scalar);
  LLVMValueRef *b = L->buf;
  if (!grad) {
    LLVMValueRef av[9] = {L->dev, desc, ring, scale, q_off, b[op->operands[0]->id], b[op->operands[1]->id],
                          b[op->operands[2]->id], b[op->results[0]->id]};
    lower_check_rc(L, lower_rt(L, RTFN_rt_nn_ring_attention, av, 9));
  } else {
    LLVMValueRef av[12] = {L->dev, desc, ring, scale, q_off, b[op->operands[0]->id], b[op->operands[1]->id],
                           b[op->operands[2]->id], b[op->operands[3]->id], b[op->operands[4]->id],
                           LLVMConstInt(L->i32, (unsigned long long)op->index, 0), b[op->results[0]->id]};
    lower_check_rc(L, lower_rt(L, RTFN_rt_nn_ring_attention_grad, av, 12));
  }
  return true;
}
