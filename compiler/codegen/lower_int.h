/* lower_int.h: the lowering's one internal header (the LLVM-C API stays in codegen/). The state
 * of lowering one function: the builder, the runtime's functions, each IR value's buffer. */
#ifndef SHARDC_LOWER_INT_H
#define SHARDC_LOWER_INT_H

#include <llvm-c/Core.h>

#include "lower.h"

struct Lowered {
  LLVMContextRef C;
  LLVMModuleRef M;
  void *tsc;            /* the ORC thread-safe context owning C (LLVMOrcThreadSafeContextRef) */
  bool finished;
  bool consumed;        /* handed to the JIT */
  void *jit;            /* the LLJIT (LLVMOrcLLJITRef) holding the compiled code, disposed with it */
};

/* One tensor a loop nest reads or writes: its buffer, dtype and per-nest-dim strides (elements). */
typedef struct NestTensor {
  LLVMValueRef base;
  DType dt;
  int64_t stride[MAX_RANK * 2];
  LLVMValueRef off0;    /* an extra element offset (i64) or NULL */
} NestTensor;

typedef struct Lower {
  Lowered *lw;
  LLVMContextRef C;
  LLVMModuleRef M;
  LLVMBuilderRef B;
  LLVMTypeRef i1, i8, i16, i32, i64, f16, f32, f64, ptr, gemm_t;
  LLVMValueRef fn, dev, slots;
  const IrModule *m;
  const Mesh *mesh;     /* NULL: global */
  const char *fname;
  LLVMValueRef *buf;    /* per value id: its buffer (ptr), NULL until made */
  int32_t *root;        /* per value id: the value whose buffer it shares (views) */
  bool *owned;          /* per value id (a root): allocated by the function (freed by it) */
  bool failed;
  bool *fused;          /* per value id: computed inside its one consumer's loop nest, never stored */
  const int32_t *plan;  /* the buffer plan (bufplan.h's `buffer`): per value id, the value whose buffer it uses */
  int32_t *share;       /* per value id: the value whose buffer its op writes into (the plan's in-place
                           or update decision, where the lowering can follow it), or -1: its own */
  const Value **val;    /* per value id: the value (main's and its loop bodies') */
  LLVMValueRef *dest;   /* per value id: where its op writes it (a loop body's stacked output: its row) */
  const int *last;      /* the region being lowered: per root, the position of the last op reading it */
  int pos;              /* ... and the position of the op being lowered */
} Lower;

/* Loop nests (lower.c). */
typedef void (*NestBody)(Lower *L, LLVMValueRef *offs, LLVMValueRef *idx, void *ctx);
void lower_nest(Lower *L, int nd, const int64_t *ext, NestTensor *t, int nt, NestBody body, void *ctx);
LLVMValueRef lower_load(Lower *L, const NestTensor *t, LLVMValueRef off);   /* as f32 (i32 for ints) */
void lower_store(Lower *L, const NestTensor *t, LLVMValueRef off, LLVMValueRef v);
LLVMValueRef lower_call(Lower *L, const char *name, LLVMTypeRef ret, LLVMTypeRef *args, int n, LLVMValueRef *vals);
LLVMValueRef lower_intrinsic(Lower *L, const char *name, LLVMValueRef *args, int n);
void lower_check_rc(Lower *L, LLVMValueRef rc);  /* return rc from the function unless it is 0 */

/* lower_math.c: exp, tanh, erf in f32 as vectorisable straight-line code. */
LLVMValueRef lower_exp(Lower *L, LLVMValueRef x);
LLVMValueRef lower_tanh(Lower *L, LLVMValueRef x);
LLVMValueRef lower_erf(Lower *L, LLVMValueRef x);

/* lower_nn.c: ops lowered to calls into the runtime's nn kernels. */
typedef void (*LowerNewBuffer)(Lower *L, const Value *v);
bool lower_nn_rows(Lower *L, const Op *op, LowerNewBuffer nb);       /* softmax, norms, grads, cross entropy */
bool lower_nn_take(Lower *L, const Op *op, LLVMValueRef row_offset, LowerNewBuffer nb); /* take, take_grad */
bool lower_nn_route(Lower *L, const Op *op, LowerNewBuffer nb);                        /* route */
bool lower_nn_select(Lower *L, const Op *op, LLVMValueRef row_offset, LowerNewBuffer nb); /* onehot, pick */
bool lower_nn_attention(Lower *L, const Op *op, LLVMValueRef q_off, LLVMValueRef k_off, LowerNewBuffer nb);
#endif
