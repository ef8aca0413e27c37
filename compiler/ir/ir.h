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

/* Adam's constants (language.md: betas 0.9, 0.999; epsilon 1e-8; ops.def's adam_update). */
#define IR_ADAM_BETA1 0.9
#define IR_ADAM_BETA2 0.999
#define IR_ADAM_EPS 1e-8

/* The ops (ops.def: one entry each, with their traits), in printing/golden order. */
typedef enum {
#define OP(e, ...) e,
#include "ops.def"
  OP__COUNT
} OpKind;

/* ---- the op table's traits (ops.def says what each column means) ---- */
typedef enum {
  OC_LEAF,              /* input, param, const */
  OC_CONTRACT,
  OC_EW_BINARY,         /* + - * / broadcast by dim name */
  OC_EW_UNARY,          /* an elementwise function of one tensor */
  OC_REDUCE,            /* sum, mean, max over dims[] */
  OC_NORM,              /* softmax and the norms: statistics over dims[0] */
  OC_LAYOUT,            /* moves or relabels data, computes nothing: rename, split, merge, transpose,
                           broadcast, slice */
  OC_INDEX,             /* take, pick, onehot */
  OC_MASK,              /* causal */
  OC_CAST,
  OC_ATTENTION,
  OC_REGION,            /* loop, pipeline: ops with bodies */
  OC_COLLECTIVE,
  OC_GRAD,              /* a forward op's gradient (autodiff.c) */
  OC_LOSS,
  OC_OPTIMIZER,
  OC_ROUTE              /* route */
} OpClass;
enum {
  OPF_CALL = 1,         /* a function of the language, called by its name */
  OPF_INT = 2,          /* the lowering computes it on integers too */
  OPF_INPLACE = 4       /* reads each element where it writes it: may write over an operand */
};
/* Which operands may be unreduced partial sums (the result then is one over the same axes). */
typedef enum {
  LIN_NONE = -1,        /* none */
  LIN_0 = 0, LIN_1 = 1, LIN_2 = 2, /* that operand alone (linear in it) */
  LIN_SUM = -2,         /* every operand alike (add, sub) */
  LIN_ONE = -3,         /* exactly one (a product) */
  LIN_FIRST = -4        /* the numerator (div) */
} OpLin;
/* What opcost.c and the simulator price an op as. */
typedef enum {
  CC_NONE,              /* no kernel: leaves, and regions (their ops are priced one by one) */
  CC_VIEW,              /* a view of its operand's buffer: no traffic */
  CC_FUSED,             /* memory-bound, and joins a producer-consumer group (XLA's loop fusion) */
  CC_MEMORY,            /* a memory-bound kernel of its operands' and results' bytes */
  CC_BLOCK,             /* reads the block it keeps, writes it (slice) */
  CC_CONTRACT,          /* a matmul (a routed dispatch or combine moves rows: memory-bound) */
  CC_ROUTED,            /* route_grad: k dot products per token, memory-bound */
  CC_ATTENTION,         /* flash attention */
  CC_COLLECTIVE
} CostClass;
/* How codegen lowers an op (lower.c). */
typedef enum {
  LK_NONE, LK_INPUT, LK_CONST,
  LK_MAP,               /* a loop nest over the result computing ops.def's fn (fused into its
                           consumer's nest where it can), or a conversion (cast, broadcast) */
  LK_VIEW,              /* a view of the operand's buffer */
  LK_COPY,              /* a view where the buffer plan makes one, else a copy (transpose, slice) */
  LK_CAUSAL, LK_REDUCE, LK_CONTRACT,
  LK_ROWS,              /* runtime/nn.c over rows (softmax, norms, losses and their gradients) */
  LK_TAKE, LK_SELECT, LK_ATTENTION, LK_ROUTE, LK_ROUTE_GRAD, LK_LOOP, LK_PIPELINE,
  LK_DROPOUT,           /* a counter-based mask of the elements' global indices (dropout.h) */
  LK_COLLECTIVE         /* a runtime collective */
} LowerKind;
/* The attributes `--emit-ir` prints after an op's operands (ir_print.c). */
typedef enum {
  AT_NONE, AT_INDEX, AT_NUMBER, AT_LOOP, AT_OVER, AT_DIMS, AT_ADDING, AT_ROUTE, AT_ATTENTION, AT_LR,
  AT_BETA, AT_RENAME, AT_SPLIT, AT_MERGE, AT_COLL
} AttrKind;
#define NOCOLL (-1)     /* ops.def's coll column: not a collective */

typedef struct OpInfo {
  const char *name;
  int8_t arity;         /* -1: variable */
  uint8_t cls;          /* OpClass */
  uint8_t flags;        /* OPF_* */
  int8_t lin;           /* OpLin */
  uint8_t cost;         /* CostClass */
  uint8_t lower;        /* LowerKind */
  uint8_t attrs;        /* AttrKind */
  int8_t coll;          /* a collective's CollKind (cost.h); NOCOLL */
  bool fn;              /* ops.def gives its scalar function (ir_scalar) */
  bool dgrad;           /* ops.def gives its gradient as an expression (autodiff.c) */
} OpInfo;
/* The table's row for k (an out-of-range k gets an empty row: no name, arity -2). */
const OpInfo *ir_op_info(OpKind k);
const char *ir_op_name(OpKind k);
bool ir_op_is_collective(OpKind k);  /* class OC_COLLECTIVE */
bool ir_op_is_elementwise(OpKind k); /* the unary functions and the four binary arithmetic ops */
/* The collective op of CollKind k (cost.h); OP_PERMUTE for none. */
OpKind ir_coll_op(int k);
/* ops.def's scalar function of an op with one (OpInfo.fn) at operands v[0..arity), in double
 * (ir_scalar.c): the interpreter's numerics and constant folding. `op` gives the scalar and flag
 * attributes (optimizer ops); NULL for the others. NaN for an op without one. */
struct Op;
double ir_scalar(OpKind k, const struct Op *op, const double *v);

/* Where a device's block of a dim starts (localize.c; the lowering and the interpreter compute
 * global indices from it): offset = extent x the device's block number over `axes` (its
 * coordinates on them read as a mixed-radix number, the first axis most significant). For OP_SLICE
 * the offset is within the operand's local block; everywhere else it is the global index of the
 * block's first element along `dim`. Axes of size 1 are left out. */
typedef struct DimIndex {
  const struct Dim *dim;
  int8_t axes[MAX_AXES_PER_DIM];
  uint8_t naxes;
  int64_t extent;       /* the local extent of the block along dim */
} DimIndex;

/* What a collective does, per device, in the terms a runtime call takes (localize.c). The group
 * of a device is the devices that differ from it only on the collective's axes; `parts` say
 * which dims change and the rank order:
 *   AllGather      each part: a dim whose tuple loses `axes` (a suffix of the operand's tuple, in
 *                  tuple order): the group's blocks are concatenated along it in the rank order
 *                  the mixed-radix reading of `axes` gives
 *   ReduceScatter  each part: a dim whose tuple gains `axes` (appended): the sum is split along it,
 *                  rank r keeping block r
 *   AllReduce      no parts: sum (or max, Op.reduce_max) of the whole buffer
 *   AllToAll       parts[0] the dim that gains `axes` (split: block j goes to rank j), parts[1] the
 *                  dim that loses them (concat: the blocks received, in rank order)
 *   Permute        `shift` along the ring of parts[0].axes (+1: rank r sends to rank r+1 mod n),
 *                  or, in a pipeline, the stage-to-stage transfer of Op.coll_period */
typedef struct CollDim {
  int8_t dim;           /* position in the operand's type (AllToAll parts[0]: in the result's) */
  int8_t axes[MAX_AXES_PER_DIM];
  uint8_t naxes;
} CollDim;
typedef struct CollSpec {
  CollDim parts[MAX_RANK];
  int nparts;
  int shift;            /* Permute */
  int group[2];         /* a collective among some devices of its axes (a tied param's first and
                           last stage): their indices along the axes, mixed radix; ngroup 0: all */
  int ngroup;
} CollSpec;

typedef struct Op Op;
typedef struct IrFunc IrFunc;

/* What a collective moves (shard/bucket.c decides, by dataflow): an activation (or its gradient),
 * a weight (gathered from a param's shard), or a param's gradient (reduced). */
typedef enum { ROLE_ACTIVATION, ROLE_WEIGHT, ROLE_GRADIENT } CollRole;

/* ---- pipelines (shard/stages.c, shard/schedule.c) ----
 * Under `layers@stage` a train step's microbatch loop (or a forward's body) becomes one
 * OP_PIPELINE whose regions are the pieces each stage runs; its schedule lists, per stage, the
 * actions in the order the stage runs them (gpipe, 1f1b or interleaved(V)). The stacked params are
 * held as p stages x V chunks x Lc layers (stage s holds chunks c = 0..V-1, which are the model's
 * layer chunks c p + s: the storage order of a stacked dim under interleaving, see
 * docs/pipelines.md); a chunk region runs Lc layers. Every value crossing stages is an explicit
 * transfer action; every other value stays on its stage. */
typedef enum {
  PR_FIRST,             /* stage 0, once per microbatch: what feeds the first layer (embedding) */
  PR_CHUNK_FWD,         /* one chunk of layers, forward */
  PR_LAST,              /* the last stage, once per microbatch: what follows the last layer, the
                           loss and its gradient (a forward alone: the function's result) */
  PR_CHUNK_BWD,         /* one chunk of layers, backward */
  PR_FIRST_BWD,         /* stage 0: the gradient of what PR_FIRST computed */
  PR__COUNT
} PipeRegion;

typedef enum {
  PIN_ENV,              /* pipeline operand `index` (a slice: the microbatch's row; an invariant) */
  PIN_ACT,              /* the activation (forward) or its gradient (backward) arriving */
  PIN_CHUNK,            /* the chunk's Lc rows of stacked pipeline operand `index` */
  PIN_SAVED             /* output `index` of the forward chunk region of this microbatch and chunk */
} PipeInKind;
typedef enum {
  POUT_ACT,             /* the activation (or gradient) leaving for the next region */
  POUT_SAVE,            /* kept on the stage for the backward of this microbatch and chunk */
  POUT_ACC,             /* added, in f32, into carried result `index` (a chunk region's: into the
                           chunk's rows) */
  POUT_RESULT           /* a forward alone: pipeline result `index` */
} PipeOutKind;
typedef struct PipeSlot {
  uint8_t kind;         /* PipeInKind / PipeOutKind */
  int index;
} PipeSlot;

typedef enum {
  PA_FIRST, PA_FWD, PA_LAST, PA_BWD, PA_FIRST_BWD, /* run that region */
  PA_SEND, PA_RECV                                 /* a transfer to / from stage `peer` */
} PipeActionKind;
typedef struct PipeAction {
  uint8_t kind;         /* PipeActionKind */
  bool backward;        /* PA_SEND / PA_RECV: a gradient (backward) rather than an activation */
  int mb;               /* microbatch */
  int chunk;            /* the model's chunk (0 .. pV-1): layers [chunk Lc, (chunk+1) Lc) */
  int peer;             /* PA_SEND / PA_RECV: the other stage */
} PipeAction;

/* A span of a stage's schedule in bounded form (shard/schedule.h): listed actions [first, first +
 * len) of the stage's form run `reps` times in a row, each run's microbatches `stride` above the
 * previous run's (the steady state of 1f1b and interleaved, gpipe's forwards and backwards). */
typedef struct PipeSpan {
  int first, len;       /* indices into PipeInfo.form; len 0: no span */
  int reps;             /* >= 1 */
  int stride;
} PipeSpan;

typedef struct PipeInfo {
  int stages;           /* p: the product of the stage axes' sizes */
  int8_t stage_axes[MAX_AXES_PER_DIM]; /* the stacked dim's axes, major first (a stage's index is
                           its coordinates on them, mixed radix) */
  int nstage_axes;
  int chunks;           /* V: chunks per stage (interleaved(V); 1 otherwise) */
  int microbatches;     /* N */
  int64_t layers;       /* L */
  int64_t chunk_layers; /* Lc = L / (p V) */
  int schedule;         /* ScheduleKind */
  struct Dim *chunk_dim;/* the stacking dim of a chunk region's loop (size Lc) */
  struct Dim *stack_dim;/* the stacked params' leading dim (layers) */
  int nslices;          /* operands [0, nslices): microbatched inputs; then `ncarried` carried
                           accumulators (results one to one); the rest invariants */
  int ncarried;
  IrFunc *region[PR__COUNT];   /* NULL where a forward alone has none (the backward ones) */
  PipeSlot *in[PR__COUNT];     /* per region input */
  PipeSlot *out[PR__COUNT];    /* per region output */
  uint8_t *result_place;       /* per result: the stages holding it (PLACE_*) */
  PipeAction *actions;         /* every stage's actions, stage 0's first; NULL when the schedule has more
                                  than SCHEDULE_LIST_MAX actions (shard/schedule.h): then only `form` */
  int *first_action;           /* [stages + 1]: stage s runs actions [first_action[s], first_action[s+1]);
                                  NULL with `actions` */
  int64_t nactions;            /* the schedule's actions over every stage, listed or not */
  PipeAction *form;            /* the same schedule in bounded form (O(p V) per stage whatever N): each
                                  stage's actions with each of its spans listed once */
  int *first_form;             /* [stages + 1]: stage s's form is form[first_form[s] .. first_form[s+1]) */
  PipeSpan *spans;             /* [2 stages]: stage s's spans (at most two, in order; len 0: none) */
  int in_flight_max[2];        /* the schedule's peak of microbatch-chunks whose forward ran and backward
                                  did not, on the first and the last stage (activation memory) */
  uint16_t send_split;         /* the axes (none of the stage's) over which the activation crossing a
                                  stage boundary is replicated: each of those devices sends 1/n of it
                                  and the receiving devices all-gather it over them (Megatron's
                                  scatter-gather); 0: each device sends its whole block. What arrives is
                                  the same either way. */
} PipeInfo;

/* Where an op of main runs once a pipeline exists (Op.place): 0 every device; otherwise the
 * devices of the stages whose bits are set. */
enum { PLACE_ALL = 0, PLACE_FIRST = 1, PLACE_MID = 2, PLACE_LAST = 4 };

typedef struct TensorType {
  DType dtype;
  int rank;
  Dim *dims[MAX_RANK]; /* in order (language.md: result-dims rule) */
} TensorType;

/* Where a value's sharding came from, so explain can say why (propagation fills it). */
typedef enum { SHARD_FREE, SHARD_ANNOTATION, SHARD_LAYOUT, SHARD_PROPAGATED } ShardSource;


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
  /* autodiff.c: the value is kept from the forward for the backward (an activation: step.h's
   * step_saved_bytes counts these). A stacked loop's saved residuals are its stacked results
   * (they carry the stacking dim); values inside stacked bodies are never marked. */
  bool saved;
  /* localize.c: the per-device (local) extent of each dim under the sharding; 0 before */
  int64_t local[MAX_RANK];
  const Op *saved_attention; /* saved and the output of this OP_ATTENTION (or its stacked rows):
                                the attention's f32 softmax statistics are kept beside it */
  const Op *route;      /* route.h: the OP_ROUTE whose pattern this value keeps (the route's result,
                           its casts, its products with tensors that lack the slot dim, ...: zero
                           wherever the route's result is), stored as k (expert, slot, value)
                           entries per token (ir_route_density); NULL: dense. ir_route_mark sets it */
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
  int index;            /* OP_INPUT / OP_PARAM index; loop: index of the stacked dim's Dim; OP_ROUTE: k */
  int flag;             /* OP_ATTENTION: causal; OP_CONTRACT: RouteContract (route.h: a dispatch or
                           a combine, which move data and compute nothing) */
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
  uint8_t role;         /* a collective's CollRole (shard/bucket.c) */
  uint16_t ring;        /* OP_ATTENTION(_GRAD) run as ring attention over these axes (partition.c;
                           language.md, Context parallelism): q, o, do keep their query block, the
                           K/V blocks (and in the backward their gradients) travel the ring, n - 1
                           CollectivePermute steps merged by online softmax; 0: an ordinary op */
  int bucket;           /* a collective in a bucket (shard/bucket.c): the bucket's number, shared
                           by its members, which run as one collective of their summed bytes; 0:
                           none */
  /* training (autodiff.c, step.c) */
  int nstacked;         /* OP_LOOP: body outputs [ncarried, ncarried + nstacked) are per-iteration
                           values, stacked: result ncarried + j is body output ncarried + j of
                           every iteration with stack_dim prepended, the iteration that reads
                           slice i writing row i (the forward's saved residuals, the backward's
                           stacked param gradients). 0 for every other loop */
  bool reverse;         /* OP_LOOP: iterates the slices from last to first (iteration k reads, and
                           writes stacked outputs at, row count-1-k): the backward of a loop */
  uint8_t phase;        /* OpPhase: which part of a train step the op belongs to */
  /* localisation (localize.c): the facts a device needs beyond its operands' local blocks */
  DimIndex *offs;       /* global offsets of the dims whose global index the op reads (causal's
                           and attention's query and key, take's table rows, take_grad's and
                           onehot's result rows, pick's dim), or OP_SLICE's block; NULL: all 0 */
  int noffs;
  double divisor;       /* OP_MEAN: the global element count it divides by; 0 before localize */
  CollSpec *coll;       /* collectives: what the runtime call does; NULL before localize */
  PipeInfo *pipe;       /* OP_PIPELINE */
  uint8_t place;        /* PLACE_*: the stages that run it (an op of main once a pipeline exists) */
  /* the device program (shard/devprog.h): what the op is on the devices; NULL before it is built */
  struct DevOp *dev;
};

/* Which part of a train step an op belongs to (Op.phase; step.c sets it). A stacked loop's ops
 * share their loop's phase, except recomputed forward ops inside a backward loop. */
typedef enum {
  PHASE_FORWARD,        /* the forward as ir_build made it (and the microbatch slicing) */
  PHASE_LOSS,           /* the loss against the labels */
  PHASE_BACKWARD,       /* gradients (and a backward loop) */
  PHASE_RECOMPUTE,      /* forward ops re-run inside a backward loop (remat) */
  PHASE_ACCUMULATE,     /* the microbatch loop and its f32 gradient accumulation */
  PHASE_UPDATE          /* the optimizer */
} OpPhase;

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
  struct StepInfo *step; /* step.h: main is a whole train step (its inputs, outputs, gradients);
                            NULL for a forward only */
  Op *pipeline;         /* the step's OP_PIPELINE (stages.c), or NULL */
  struct Zigzag {       /* a causal ring's load balance (partition.c): dims `dims` (the query and
                           key sequence) sharded over `axes` are stored in zigzag order: split into
                           2n chunks, device i holds chunks i and 2n-1-i; every tensor with them
                           keeps that order (the device program's RT_ORDER_ZIGZAG: inputs and
                           outputs are placed in it, causal masks read the logical index) */
    const struct Dim *dims[2];
    uint16_t axes;      /* 0: none */
    int n;
  } zigzag;
  struct LayoutWeigh {  /* propagate.c: the plan the layout binds against the one propagation
                           would choose without the binding (never taken; explain and sim say so) */
    bool want;          /* set before pipeline_run: weigh the unbound plan (costs a search) */
    bool done;          /* it was weighed */
    bool cheaper;       /* the unbound plan's collectives take less time (beyond 0.1%) */
    double bound_s, free_s;         /* the step's collective time under each (partition_cost, ideal) */
    double bound_count, free_count; /* collectives per step */
    const LayoutRule *rule;         /* the rule binding most values the unbound plan shards otherwise */
    int nvalues;                    /* how many values that rule binds otherwise */
    const struct Value *example;    /* the first of them, */
    Sharding example_free;          /* and its sharding in the unbound plan */
  } weigh;
  bool localized;       /* localize.c ran: every value has its local extents, every slice is an
                           OP_SLICE, every collective its CollSpec */
  struct DevModule *dev; /* the device program (shard/devprog.h), built last; NULL before */
} IrModule;

/* ---- building ---- */
IrModule *ir_module_new(Arena *a, const Program *p);
IrFunc *ir_func_new(IrModule *m, Name name, IrFunc *parent);
Value *ir_func_add_input(IrModule *m, IrFunc *f, TensorType t, Name name);
void ir_func_push_input(IrModule *m, IrFunc *f, Value *v); /* append v (an OP_INPUT's result) */
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
/* One more result for op (autodiff grows a forward loop's stacked outputs): a fresh value of type
 * t defined by op, in op's function. Returns it. */
Value *ir_op_add_result(IrModule *m, Op *op, TensorType t);
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

/* A contraction (OP_CONTRACT) as the hardware sees it (cost.h's MatmulShape), over its operands'
 * local blocks once localised (Value.local; the global sizes before): m the first operand's dims
 * the second lacks, n the second's the first lacks, k the contracted dims, batch the shared rest.
 * The one rule the simulator's price and the collective-matmul pass's choice both read. */
struct MatmulShape ir_matmul_shape(const Op *op);
/* The dtype whose FLOP rate an op runs at: a contraction's operands' (FP8 operands make a bf16
 * result but run at the FP8 rate), any other op's result's. */
DType ir_op_rate_dtype(const Op *op);
TensorType tensor_type_from_spec(const TypeSpec *s);
/* "bf16[batch, seq, embed]" into buf; returns buf. */
char *tensor_type_format(char *buf, size_t n, const TensorType *t);
/* "bf16[batch@data, hidden@model]{sum: model}" into buf; returns buf. */
char *sharding_format(char *buf, size_t n, const TensorType *t, const Sharding *s, const Mesh *m);
int64_t sharding_local_extent(const TensorType *t, const Sharding *s, const Mesh *m, int dim);
int64_t sharding_local_bytes(const TensorType *t, const Sharding *s, const Mesh *m);
/* The axes sharding a dim named `batch` in any of main's inputs (the entry's arguments, a step's
 * labels): the data-parallel axes. */
uint16_t ir_batch_axes(const IrModule *m);

/* Lowers p->entry (with p->step deciding nothing yet: the forward only) to IR. Type errors are
 * diagnostics; returns NULL when there were any. */
IrModule *ir_build(Arena *a, const Program *p);
/* The pass ir_build ends with (ir_fuse.c): every `contract(q, k, over: d)` [scalar * or /]
 * [causal] `softmax(over: key)` `contract(p, v, over: key)` chain whose intermediates have no other
 * use becomes one OP_ATTENTION with the unfused result value. Returns how many were fused. */
int ir_fuse_attention(IrModule *m);

/* Stable text dump, for tests and `--emit-ir`. */
void ir_print(FILE *out, const IrModule *m);
/* The same, with hook(out, op) printing what a later stage states about each op after its own facts
 * (shard/devprog.c: the device program's groups, blocks and rings). */
typedef void (*IrPrintHook)(FILE *out, const Op *op);
void ir_print_with(FILE *out, const IrModule *m, IrPrintHook hook);
#endif
