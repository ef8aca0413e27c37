/* lower_int.h: the lowering's one internal header (the LLVM-C API stays in codegen/). The state
 * of lowering one function: the builder, the runtime's functions, each IR value's buffer. */
#ifndef SHARDC_LOWER_INT_H
#define SHARDC_LOWER_INT_H

#include <llvm-c/Core.h>

#include "devprog.h"
#include "lower.h"
#include "rt_api.h"

/* runtime/rt_api.def as enums: the entry points (RTFN_rt_alloc, ...), the structs (RTS_RtPipe, ...)
 * and each struct's fields by position (RTF_RtPipe_stages, ...), which are also their LLVM element
 * numbers. */
enum {
#define RT_FN(name, ...) RTFN_##name,
#include "rt_api.def"
  RTFN__COUNT
};
enum {
#define RT_STRUCT(S) RTS_##S,
#include "rt_api.def"
  RTS__COUNT
};
#define RT_STRUCT(S) enum {
#define RT_END(S) RTF_##S##__COUNT };
#define RT_FIELD(S, f, t) RTF_##S##_##f,
#define RT_ARRAY(S, f, t, n) RTF_##S##_##f,
#define RT_ARRAY2(S, f, t, n, m) RTF_##S##_##f,
#define RT_NEST(S, f, T) RTF_##S##_##f,
#define RT_NESTS(S, f, T, n) RTF_##S##_##f,
#include "rt_api.def"

/* A host object standing for an LLVM value in a constant struct (lower_rt_bind). */
typedef struct LowerBinding {
  const void *key;
  LLVMValueRef value;
} LowerBinding;

/* lower_compile compiles the module in parts, one per entry point, each on its own thread. */
#define LOWER_MAX_PARTS 4

struct Lowered {
  LLVMContextRef C;
  LLVMModuleRef M;
  void *tsc;            /* the ORC thread-safe context owning C (LLVMOrcThreadSafeContextRef) */
  bool finished;
  bool consumed;        /* handed to the JIT */
  void *jit;            /* the LLJIT (LLVMOrcLLJITRef) holding the compiled code, disposed with it */
  void *objs[LOWER_MAX_PARTS]; /* lower_compile: the compiled objects (LLVMMemoryBufferRef), one per
                                  part, that lower_jit links */
  int nobjs;
  double loop_work;     /* element accesses the loop nests make in a step, over all devices (lower_nest):
                           what lower_compile weighs the optimising tier's time against */
  int nests;            /* loop nests made */
  const SimCosts *clock; /* lower_set_clock */
  Arena arena;          /* host arrays that constants are made from (their addresses are keys) */
  LowerBinding *bound;  /* lower_rt_bind's, for the module */
  int nbound, cap_bound;
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
  LLVMTypeRef i1, i8, i16, i32, i64, f16, f32, f64, ptr;
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
  LLVMValueRef devidx;  /* the device's index (i64): per-device tables (offsets, stages) are read at it */
  int line;             /* the source line the device was last told (rt_at_line), 0: none yet */
  double repeat;        /* how often code made here runs in a step: the enclosing loops' trips (0: once) */
} Lower;

/* lower_rt.c: the runtime's interface from runtime/rt_api.def. A call of entry point fn (RTFN_*),
 * its arguments checked against the table; struct s's LLVM type (RTS_*) and a pointer to its field
 * (RTF_*) in a struct at p; a private constant global made from the C struct *c of that type (or
 * n of them, or an array of n scalars of an RT_KIND), its pointers resolved through lower_rt_bind
 * (key: the host object the C struct points to; NULL stays NULL); the constant RtGroups of a
 * device program's groups (bound to g). */
LLVMValueRef lower_rt(Lower *L, int fn, LLVMValueRef *args, int n);
LLVMTypeRef lower_rt_type(Lower *L, int s);
LLVMValueRef lower_rt_field(Lower *L, int s, int field, LLVMValueRef p);
void lower_rt_bind(Lower *L, const void *key, LLVMValueRef v);
LLVMValueRef lower_rt_bound(Lower *L, const void *key);
LLVMValueRef lower_rt_const(Lower *L, int s, const void *c, const char *name);
LLVMValueRef lower_rt_consts(Lower *L, int s, const void *c, int n, const char *name);
LLVMValueRef lower_rt_array(Lower *L, int kind, const void *v, int n, const char *name);
LLVMValueRef lower_rt_groups(Lower *L, const DevGroups *g);

/* Loop nests (lower.c). */
typedef void (*NestBody)(Lower *L, LLVMValueRef *offs, LLVMValueRef *idx, void *ctx);
void lower_nest(Lower *L, int nd, const int64_t *ext, NestTensor *t, int nt, NestBody body, void *ctx);
LLVMValueRef lower_load(Lower *L, const NestTensor *t, LLVMValueRef off);   /* as f32 (i32 for ints) */
void lower_store(Lower *L, const NestTensor *t, LLVMValueRef off, LLVMValueRef v);
LLVMValueRef lower_intrinsic(Lower *L, const char *name, LLVMValueRef *args, int n);
void lower_check_rc(Lower *L, LLVMValueRef rc);  /* return rc from the function unless it is 0 */

/* lower_f8.c: FP8 storage: an f32 to its f8e4m3 / f8e5m2 byte (i8) and a byte back to f32. */
LLVMValueRef lower_f8_encode(Lower *L, LLVMValueRef x, DType dt);
LLVMValueRef lower_f8_decode(Lower *L, LLVMValueRef c8, DType dt);

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

/* lower.c: whether this device's entry of a per-device flag table (the device program's) is set. */
LLVMValueRef lower_per_device_flag(Lower *L, const uint8_t *v, const char *name);

/* lower_pipe.c: pipelines (OP_PIPELINE) and the placement of main's ops on stages (Op.place). */
bool lower_pipe_guarded(Lower *L, const Op *op, bool (*one)(Lower *L, const Op *op)); /* op on its stages only */
LLVMValueRef lower_pipe_copy(Lower *L, const Value *v, LLVMValueRef p, int64_t bytes); /* NULL stays NULL */
bool lower_pipeline(Lower *L, const Op *op);

/* lower_ring.c: a ring attention (its DevRing) as a call into runtime/nn_ring.c, given its RtAttn
 * constant (the key extent the device's block) and the query block's offset. */
bool lower_ring_attention(Lower *L, const Op *op, LLVMValueRef attn, LLVMValueRef q_off);
#endif
