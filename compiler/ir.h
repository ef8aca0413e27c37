/* ir.h: the SSA tensor IR every later stage works on.
 *
 * ir_build.c lowers the checked entry (a function, or the forward of a `train` step) to it: calls
 * to sub-model functions are inlined, a `for b in blocks` over stacked params stays one OP_LOOP
 * whose body is a region run `count` times (never unrolled). Every value has a type (dtype + named
 * dims in order) and a sharding (per dim an ordered tuple of mesh axes, plus the axes over which it
 * is an unreduced partial sum). Propagation fills shardings, partitioning inserts collectives,
 * autodiff appends the backward, and the cost model, memory fit, interpreter and LLVM lowering read
 * it. Ops are allocated from the IR arena and kept in a list in program order. */
#ifndef SHARDC_IR_H
#define SHARDC_IR_H

#include "program.h"

/* X(enum, name, arity) ; arity -1 = variable. The order is the printing/golden order. */
#define IR_OPS(X)                                                                          \
  X(OP_INPUT, "input", 0)         /* function argument #index */                           \
  X(OP_PARAM, "param", 0)         /* model parameter #index (IrParam) */                    \
  X(OP_CONST, "const", 0)         /* scalar literal `scalar`, rank 0 */                     \
  X(OP_CONTRACT, "contract", 2)   /* contract over dims[] (a @ b: every shared dim) */       \
  X(OP_ADD, "add", 2)             /* elementwise, broadcast by dim name */                 \
  X(OP_SUB, "sub", 2)                                                                      \
  X(OP_MUL, "mul", 2)                                                                      \
  X(OP_DIV, "div", 2)                                                                      \
  X(OP_NEG, "neg", 1)                                                                      \
  X(OP_EXP, "exp", 1)                                                                      \
  X(OP_LOG, "log", 1)                                                                      \
  X(OP_SQRT, "sqrt", 1)                                                                    \
  X(OP_RSQRT, "rsqrt", 1)                                                                  \
  X(OP_TANH, "tanh", 1)                                                                    \
  X(OP_SIGMOID, "sigmoid", 1)                                                              \
  X(OP_RELU, "relu", 1)                                                                    \
  X(OP_GELU, "gelu", 1)                                                                    \
  X(OP_SILU, "silu", 1)                                                                    \
  X(OP_SUM, "sum", 1)             /* reduce over dims[] */                                 \
  X(OP_MEAN, "mean", 1)                                                                    \
  X(OP_MAX, "max", 1)                                                                      \
  X(OP_SOFTMAX, "softmax", 1)     /* over dims[0]; computes in f32, returns input dtype */  \
  X(OP_RMSNORM, "rmsnorm", 2)     /* (x, scale) over dims[0] */                            \
  X(OP_LAYERNORM, "layernorm", 3) /* (x, scale, bias) over dims[0] */                      \
  X(OP_RENAME, "rename", 1)       /* dims[2i] -> dims[2i+1] */                             \
  X(OP_SPLIT, "split", 1)         /* dims[0] -> dims[1..] */                               \
  X(OP_MERGE, "merge", 1)         /* dims[0..n-2] -> dims[n-1] */                          \
  X(OP_TAKE, "take", 2)           /* (table, idx) */                                       \
  X(OP_CAUSAL, "causal", 1)       /* mask where global index of dims[1] > dims[0] */        \
  X(OP_CAST, "cast", 1)           /* to result dtype */                                    \
  X(OP_TRANSPOSE, "transpose", 1) /* to the result's dim order */                          \
  X(OP_ATTENTION, "attention", 3) /* fused (q, k, v): dims[0] head (contracted in q.k),    \
                                     dims[1] key dim, dims[2] query dim; scalar = scale;    \
                                     flag = causal */                                      \
  X(OP_LOOP, "loop", -1)          /* operands: stacked params' values, then carried inputs, \
                                     then invariants (nslices, ncarried); body runs `count` \
                                     times; results: carried outputs */                     \
  X(OP_ALL_GATHER, "all_gather", 1)                                                        \
  X(OP_REDUCE_SCATTER, "reduce_scatter", 1)                                                \
  X(OP_ALL_REDUCE, "all_reduce", 1)                                                        \
  X(OP_ALL_TO_ALL, "all_to_all", 1)                                                        \
  X(OP_PERMUTE, "collective_permute", 1)

typedef enum {
#define X(e, s, n) e,
  IR_OPS(X)
#undef X
  OP__COUNT
} OpKind;
const char *ir_op_name(OpKind k);
bool ir_op_is_collective(OpKind k);
bool ir_op_is_elementwise(OpKind k); /* unary functions and the four binary arithmetic ops */

typedef struct TensorType {
  DType dtype;
  int rank;
  Dim *dims[MAX_RANK]; /* in order (language.md: result-dims rule) */
} TensorType;

/* Where a value's sharding came from, so explain can say why (propagation fills it). */
typedef enum { SHARD_FREE, SHARD_ANNOTATION, SHARD_LAYOUT, SHARD_PROPAGATED } ShardSource;

typedef struct Op Op;
typedef struct IrFunc IrFunc;

typedef struct Value {
  int id;
  TensorType type;
  Sharding sharding;
  ShardSource shard_source;
  SrcLoc shard_loc;     /* annotation or layout rule or the op that propagated it */
  Op *def;              /* the defining op (NULL for region inputs) */
  Name name;            /* source name where it has one (let x = ...), else NULL */
  const TypeSpec *spec; /* the written type where one binds it (input, param, typed let, fn
                           return): its `@`s and layout are hard constraints; NULL when free */
  IrFunc *func;         /* the function (or loop body) that defines it: regions are isolated, so
                           every operand of an op of F is defined in F (or is an input of F) */
  /* propagate.c: per dim, where its axes trace back to (SHARD_ANNOTATION / SHARD_LAYOUT with the
   * `@` or the layout rule; SHARD_FREE where the dim is unsharded), and the op that left the
   * value an unreduced partial sum; explain's reasons quote them. */
  ShardSource dim_src[MAX_RANK];
  SrcLoc dim_loc[MAX_RANK];
  SrcLoc partial_loc;
  bool partial_max;     /* partition.c: the partial axes hold unreduced maxima (a local max over a
                           sharded dim, just before its max-AllReduce), not sums */
} Value;

/* A model parameter, flattened to a path: `blocks.attn.wq`. Stacked params carry the stacking dim
 * as their leading dim; inside the loop the body sees the slice without it. */
typedef struct IrParam {
  Name path;
  TypeSpec spec;        /* as declared (with the stacking dim prepended for stacked params) */
  TensorType type;
  SrcLoc loc;
  int stack_depth;      /* 0: not stacked; 1: inside one stacked model; ... */
} IrParam;

struct Op {
  OpKind kind;
  SrcLoc loc;           /* the source expression */
  Op *next;             /* program order */
  Value **operands;
  int noperands;
  Value **results;      /* one for every op but OP_LOOP (one per carried value) */
  int nresults;
  Dim **dims;           /* op-specific, see IR_OPS */
  int ndims;
  double scalar;        /* OP_CONST value, attention scale */
  int index;            /* OP_INPUT / OP_PARAM index; loop: index of the stacked dim's Dim */
  int flag;             /* OP_ATTENTION: causal */
  /* OP_LOOP */
  IrFunc *body;
  int64_t count;        /* trips */
  Dim *stack_dim;
  int nslices;          /* operands [0, nslices): stacked params' values (body sees them without
                           the stacking dim) */
  int ncarried;         /* operands [nslices, nslices + ncarried): carried values (results and body
                           outputs correspond one to one); the rest are loop invariants read by
                           the body (outer values passed in unchanged every iteration) */
  SrcLoc loc2;          /* OP_ATTENTION: the scores contraction (the pattern's first op) */
  IrFunc *func;         /* the function (or loop body) holding this op */
  /* collectives */
  uint16_t axes;        /* mesh axes it runs over (bitmask) */
  int dim_index;        /* gather/scatter dim position in the result (AllToAll: source dim) */
  int dim_index2;       /* AllToAll: destination dim position */
  const char *reason;   /* why it is there (partition.c), arena string */
  /* propagation and partitioning (propagate.c, partition.c) */
  struct OpPlan *plan;  /* the factor assignment propagation chose for the op (partition.h) */
  Sharding *in_shard;   /* per operand, the sharding the op computes with when it differs from the
                           operand's own: the same plus axes it slices locally (no communication:
                           each device reads its part of a value replicated over those axes);
                           NULL when every operand is used as it is */
  bool reduce_max;      /* OP_ALL_REDUCE: combines with max instead of sum */
  int64_t coll_period;  /* OP_PERMUTE of a pipeline inside a loop body: moves its operand to the
                           next stage once every coll_period iterations (the layers per stage), and
                           is the identity otherwise; 0 for every other op */
  bool partitioned;     /* partition.c has handled the op (it skips such ops when run again) */
};

struct IrFunc {
  Name name;
  Value **inputs;       /* OP_INPUT results (for a loop body: stacked-param slices, then carried,
                           then invariants; body inputs have def == NULL) */
  int ninputs;
  int cap_inputs;
  Op *first, *last;
  Value **outputs;
  int noutputs;
  IrFunc *parent;       /* enclosing function for loop bodies */
};

typedef struct IrModule {
  Arena *arena;
  const Program *prog;
  IrParam *params;      /* flattened params of the entry's model */
  int nparams;
  IrFunc *main;         /* the entry function (forward) */
  int nvalues;          /* ids handed out */
  const FnDecl *entry;  /* what main was built from */
} IrModule;

/* ---- building ---- */
IrModule *ir_module_new(Arena *a, const Program *p);
IrFunc *ir_func_new(IrModule *m, Name name, IrFunc *parent);
Value *ir_func_add_input(IrModule *m, IrFunc *f, TensorType t, Name name);
Op *ir_emit(IrModule *m, IrFunc *f, OpKind kind, SrcLoc loc, Value **operands, int n, TensorType result);
Value *ir_result(const Op *op); /* results[0] */
/* Lower-level pieces for passes: an op with `nresults` fresh results, not yet in any list (the
 * operands array is copied); then put it at the end, before `pos` (NULL: at the end), or take it
 * out. ir_emit = ir_op_new + ir_append. */
Op *ir_op_new(IrModule *m, IrFunc *f, OpKind kind, SrcLoc loc, Value **operands, int n,
              const TensorType *results, int nresults);
void ir_append(IrFunc *f, Op *op);
void ir_insert_before(IrFunc *f, Op *pos, Op *op);
void ir_remove(IrFunc *f, Op *op);
/* Every use of `from` in f's ops and outputs becomes `to` (not inside loop bodies: they are
 * isolated and see outer values only through loop operands). Returns the number replaced. */
int ir_replace_uses(IrFunc *f, const Value *from, Value *to);
int ir_count_uses(const IrFunc *f, const Value *v);   /* operands of f's ops + f's outputs */
/* Structural invariants (SSA order inside each region, regions isolated, loop arities and
 * carried types, result counts, op arities). Prints each violation to `err` (if not NULL) and
 * returns false on any; for tests and after each pass. */
bool ir_verify(const IrModule *m, FILE *err);

/* ---- types ---- */
int tensor_type_find(const TensorType *t, const Dim *d); /* position or -1 */
int64_t tensor_type_elements(const TensorType *t);
int64_t tensor_type_bytes(const TensorType *t);
bool tensor_type_same_dims(const TensorType *a, const TensorType *b); /* same set, any order */
bool tensor_type_equal(const TensorType *a, const TensorType *b);     /* same dtype, dims, order */
TensorType tensor_type_from_spec(const TypeSpec *s);
/* "bf16[batch, seq, embed]" into buf; returns buf. */
char *tensor_type_format(char *buf, size_t n, const TensorType *t);
/* "bf16[batch@data, hidden@model]{sum: model}" into buf; returns buf. */
char *sharding_format(char *buf, size_t n, const TensorType *t, const Sharding *s, const Mesh *m);
int64_t sharding_local_extent(const TensorType *t, const Sharding *s, const Mesh *m, int dim);
int64_t sharding_local_bytes(const TensorType *t, const Sharding *s, const Mesh *m);

/* Lowers p->entry (with p->step deciding nothing yet: the forward only) to IR. Type errors are
 * diagnostics; returns NULL when there were any. */
IrModule *ir_build(Arena *a, const Program *p);
/* The pass ir_build ends with (ir_fuse.c): every `contract(q, k, over: d)` [scalar * or /]
 * [causal] `softmax(over: key)` `contract(p, v, over: key)` chain whose intermediates have no other
 * use becomes one OP_ATTENTION with the unfused result value. Returns how many were fused. */
int ir_fuse_attention(IrModule *m);

/* Stable text dump, for tests and `--emit-ir`. */
void ir_print(FILE *out, const IrModule *m);
#endif
