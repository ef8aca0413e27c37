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
  void *obj;            /* lower_finish_cached: the compiled object (LLVMMemoryBufferRef) lower_jit loads */
  const SimCosts *clock; /* lower_set_clock */
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
  LLVMValueRef stage;   /* a pipelined main: the device's stage (i32); NULL otherwise */
  int line;             /* the source line the device was last told (rt_at_line), 0: none yet */
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
/* ops.def's scalar function of op (OpInfo.fn) at operand values v, in f32 (in i32 when ints: the
 * OPF_INT ops on integers); NULL for an op without one. */
LLVMValueRef lower_scalar(Lower *L, const Op *op, LLVMValueRef *v, bool ints);

/* lower_nn.c: ops lowered to calls into the runtime's nn kernels. */
typedef void (*LowerNewBuffer)(Lower *L, const Value *v);
bool lower_nn_rows(Lower *L, const Op *op, LowerNewBuffer nb);       /* softmax, norms, grads, cross entropy */
bool lower_nn_take(Lower *L, const Op *op, LLVMValueRef row_offset, LowerNewBuffer nb); /* take, take_grad */
bool lower_nn_route(Lower *L, const Op *op, LowerNewBuffer nb);                        /* route */
bool lower_nn_select(Lower *L, const Op *op, LLVMValueRef row_offset, LowerNewBuffer nb); /* onehot, pick */
bool lower_nn_attention(Lower *L, const Op *op, LLVMValueRef q_off, LLVMValueRef k_off, LowerNewBuffer nb);

/* lower.c, for lower_pipe.c: a region's ops, its buffers freed, a new buffer, byte counts. */
bool lower_body(Lower *L, const IrFunc *f);
void lower_free_body(Lower *L, const IrFunc *f);
LLVMValueRef lower_alloc(Lower *L, const Value *v, int64_t bytes);
int64_t lower_value_bytes(const Lower *L, const Value *v);
int lower_rt_dtype(DType dt);   /* RtDtype, -1 for one the runtime lacks */
void lower_types(Lower *L);

/* lower_pipe.c: pipelines (OP_PIPELINE) and the placement of main's ops on stages (Op.place). */
void lower_pipe_stage(Lower *L);                      /* sets L->stage in a pipelined main */
bool lower_pipe_guarded(Lower *L, const Op *op, bool (*one)(Lower *L, const Op *op)); /* op on its stages only */
LLVMValueRef lower_pipe_copy(Lower *L, const Value *v, LLVMValueRef p, int64_t bytes); /* NULL stays NULL */
bool lower_pipeline(Lower *L, const Op *op);
bool lower_all_reduce_group(Lower *L, const Op *op, const int8_t *axes, int naxes, LLVMValueRef axes_arr);

/* lower_ring.c: a ring attention (Op.ring) as a call into runtime/nn_ring.c, given its RtAttn
 * (attn[0..nattn), the key extent the device's block) and the query block's offset. */
#define RT_RING_WORDS 12 /* RtRing (shardrt.h): naxes, axes[8], zz_n, zq_chunk, zk_chunk */
bool lower_ring_attention(Lower *L, const Op *op, const int64_t *attn, int nattn, LLVMValueRef q_off);
#endif
