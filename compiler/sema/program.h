/* program.h: the checked program: what the declarations of all files mean, resolved.
 *
 * In: the parsed files (parse.h). Out: dims with sizes (after -D), targets with their figures, meshes
 * formed on their targets (each axis knows the links it rides), layouts, and models with their params
 * and functions. sema.c builds it (declarations), mesh.c forms meshes, layout.c turns layout rules
 * into shardings, size.c checks tensor sizes; the function bodies become IR (ir.h). */
#ifndef SHARDC_PROGRAM_H
#define SHARDC_PROGRAM_H

#include "ast.h"
#include "parse.h"

typedef struct Program Program; /* below; layout_apply needs the name first */

/* ---- dtypes: X(enum, name, bytes) in this order ----
 * f8e4m3 and f8e5m2 are OCP FP8 (E4M3FN, saturating at 448; E5M2 with infinities); `f8` is another
 * spelling of f8e4m3 (dtype_from_name), printed as f8e4m3. */
#define DTYPES(X)              \
  X(DT_F32, "f32", 4)          \
  X(DT_BF16, "bf16", 2)        \
  X(DT_F16, "f16", 2)          \
  X(DT_F8E4M3, "f8e4m3", 1)    \
  X(DT_I32, "i32", 4)          \
  X(DT_I8, "i8", 1)            \
  X(DT_F8E5M2, "f8e5m2", 1)
typedef enum {
#define X(e, s, b) e,
  DTYPES(X)
#undef X
  DT__COUNT,
  DT_NONE = -1
} DType;
const char *dtype_name(DType t);
int dtype_bytes(DType t);
bool dtype_is_int(DType t);
bool dtype_is_f8(DType t);       /* f8e4m3 or f8e5m2 */
DType dtype_from_name(Name n);   /* DT_NONE if n is not a dtype; "f8" is DT_F8E4M3 */
/* The dtype whose Target.flops entry prices a contraction of dt operands: both FP8 formats run at
 * one FP8 rate, flops[DT_F8E4M3] (what `flops = { f8 = ... }` sets); the others their own. */
DType dtype_rate(DType t);
/* A contraction's result dtype: bf16 for FP8 operands (f32 accumulation, Transformer Engine's
 * recipe), else the operands' dtype. */
DType dtype_contract_result(DType operands);

/* ---- limits (language.md, "Limits"; each reported as a limit, with its number) ---- */
/* SIZE_LIMIT (checked.h, 2^62): the largest dim, element count or byte count. */
#define MAX_DIM_CHAIN 256           /* dims defined one from another (`dim a = b`, `dim b = c`, ...) */
#define MAX_MODEL_DEPTH 32          /* models held one inside another, the outermost counted */
#define MESH_MAX_DEVICES (1 << 24)  /* devices of one mesh (16,777,216) */

/* ---- dims ---- */
typedef struct Dim {
  Name name;
  int64_t size;     /* after -D overrides */
  int id;           /* index in Program.dims */
  SrcLoc loc;       /* the declaration */
  bool overridden;  /* the size comes from -D */
} Dim;

/* NULL if a tensor of these dims (NULLs skipped) and dtype holds at most SIZE_LIMIT bytes; else
 * the message for the error, from arena a ("tensor too large: bf16[batch, seq] would hold ...",
 * naming the dims -D set) (size.c). */
const char *tensor_size_error(Arena *a, Dim *const *dims, int rank, DType dt);

/* ---- targets ---- */
typedef enum { TARGET_TPU, TARGET_GPU } TargetKind;
#define MAX_TORUS_DIMS 3
typedef struct Target {
  Name name;
  SrcLoc loc;
  TargetKind kind;
  double flops[DT__COUNT];   /* dense FLOP/s per dtype (matmul); 0 where unknown */
  double hbm;                /* bytes per device */
  double hbm_bw;             /* bytes/s */
  double matmul_efficiency;  /* fraction of peak large matmuls reach (calibrated sim) */
  /* TPU */
  double ici_bw;             /* one-way bytes/s per link */
  int torus[MAX_TORUS_DIMS]; /* largest slice, per torus dim */
  int ntorus;
  int wrap_multiple;         /* an extent that is a multiple of this closes its ring */
  double hop_latency;        /* s */
  double dcn_bw;             /* bytes/s per chip between slices */
  /* GPU */
  double nvlink_bw;          /* one-way bytes/s per GPU */
  int node_size;             /* GPUs per NVLink domain */
  double network_bw;         /* bytes/s per GPU across nodes */
  double nvlink_latency, network_latency; /* s */
  /* calibrated collective bandwidth: achieved/peak = max(small, max * V^k / (V^k + half_bytes^k));
     small: what the low-latency protocol for small messages reaches (0: none); k: `shape`.
     Adjacent: target.c reads the block into these four in this order. */
  double coll_eff_max, coll_eff_half_bytes, coll_eff_small, coll_eff_shape;
  /* ---- calibrated simulation only (sim without --ideal; docs/cost-model.md) ---- */
  double net_eff_max, net_eff_half_bytes, net_eff_small, net_eff_shape; /* the same curve for GPU
                                                            network / TPU DCN phases; max 0: use coll_eff_* */
  /* all_reduce_efficiency: the NVLink/ICI curve of an AllReduce where it differs (NVLS: the
     NVSwitch reduces, so bus bandwidth passes the link's one-way rate and max may reach 2); max 0:
     coll_eff_*. shape k (all three curves): max x V^k / (V^k + half^k); 0 means 1. */
  double ar_eff_max, ar_eff_half_bytes, ar_eff_small, ar_eff_shape;
  double matmul_tile[3];     /* M, N, K multiples a contraction is padded to (MXU / CTA tile); 1 none */
  double matmul_fill[3];     /* fill/drain length along M, N, K: efficiency x d / (d + fill); 0 none */
  int matmul_units;          /* GPU SMs that take output tiles in waves; 0: no wave quantization */
  double hbm_efficiency;     /* achieved / peak HBM bandwidth of a streaming kernel (1 = peak) */
  double attention_efficiency; /* fraction of peak the fused (flash) attention's matmuls reach;
                                  0: matmul_efficiency */
  double op_overhead;        /* s per kernel / fused op (launch and dependency gap) */
  bool attention_materialized; /* `attention = materialized`: the fused attention op runs as
                                  libraries before flash attention ran it, its scores through HBM */
  int collective_sms;        /* GPU: SMs a running collective holds (NCCL's CTAs), which overlapped
                                compute lacks: it runs matmul_units / (matmul_units - this) slower
                                (calibrated sim; 0: none) */
  int fabric_domain;         /* GPU: GPUs under a full-bisection network (0: the whole network) */
  double fabric_oversubscription; /* GPU: bandwidth ratio above fabric_domain (1: non-blocking) */
} Target;

/* ---- meshes ---- */
typedef enum { LINK_ICI, LINK_DCN, LINK_NVLINK, LINK_NETWORK } LinkKind;
#define MAX_MESH_AXES 8   /* axes of one mesh */
typedef struct MeshAxis {
  Name name;
  int size;
  SrcLoc loc;
  /* where the axis lands physically (mesh.c), which the collective cost formulas read: */
  LinkKind link;        /* the slowest link class a ring over this axis rides */
  bool wraparound;      /* TPU: ring closes (bidirectional); GPU: always true within NVLink */
  int torus_dims;       /* TPU ICI: number of torus dims the axis spans (bandwidth multiplies) */
  double bw;            /* one-way bytes/s per device for a ring step along this axis */
  double latency;       /* s per hop / per message */
  int64_t stride;       /* devices between neighbours along the axis (product of more-minor sizes) */
  int per_node;         /* GPU: how many of the axis's devices share one NVLink domain (1..size) */
  int torus_extent[MAX_TORUS_DIMS]; /* TPU ICI: extent along each torus dim (1 where not spanned) */
} MeshAxis;

typedef struct Mesh {
  Name name;
  SrcLoc loc;
  const Target *target;
  int naxes;
  MeshAxis axes[MAX_MESH_AXES]; /* major to minor */
  int64_t devices;
  int64_t slices;       /* TPU: number of slices (1 within one slice; >1 means DCN axes) */
} Mesh;
int mesh_axis_index(const Mesh *m, Name axis); /* -1 if absent */
/* The axes of a mask by name, in mesh order: "model", "(data, model)" (parenthesised when more
 * than one); "" for none. */
const char *mesh_axes_text(Arena *a, const Mesh *m, uint16_t axes);
/* Places m's axes (name, size, loc set; major to minor) on m->target (mesh.c), filling each axis's
 * link figures, m->devices and m->slices. A mesh the target cannot form is an error saying why
 * (language.md's forming rules); returns false then, quietly when the target itself is broken
 * (that was reported at the target). sema_program forms every declared mesh; callers may form
 * a changed copy (memory.c tries a bigger mesh). */
bool mesh_form(Mesh *m);

/* ---- layouts ---- */
typedef struct LayoutRule {
  Name dim;                       /* logical dim name (may be a dim the program never declares) */
  Name axes[MAX_MESH_AXES];       /* major to minor */
  int naxes;
  SrcLoc loc;
} LayoutRule;
typedef struct Layout {
  Name name;
  SrcLoc loc;
  LayoutRule *rules;
  int nrules;
} Layout;

/* ---- types as written at boundaries (params, fn args and results, typed lets) ---- */
#define MAX_RANK 8        /* dims of one tensor */
typedef struct TypeSpec {
  DType dtype;
  int rank;
  Dim *dims[MAX_RANK];            /* storage order */
  Name at[MAX_RANK][MAX_MESH_AXES]; /* explicit `@` axes per dim (names; checked against the mesh) */
  int nat[MAX_RANK];              /* 0: no explicit @ on that dim */
  SrcLoc dim_loc[MAX_RANK];
  SrcLoc loc;
} TypeSpec;

/* ---- shardings ----
 * Per dim (by position in the tensor's type): mesh axis indices, major to minor; plus the axes over
 * which the value is an unreduced partial sum. */
#define MAX_AXES_PER_DIM 4  /* mesh axes sharding one dim */
typedef struct Sharding {
  int8_t axes[MAX_RANK][MAX_AXES_PER_DIM];
  uint8_t naxes[MAX_RANK];
  uint16_t partial;     /* bit a: unreduced partial sum over mesh axis a */
} Sharding;

/* Why each dim of a boundary tensor got its axes, for --shardings and explain. */
typedef enum { ORIGIN_NONE, ORIGIN_ANNOTATION, ORIGIN_LAYOUT } OriginKind;
typedef struct ShardOrigin {
  OriginKind kind[MAX_RANK];
  SrcLoc loc[MAX_RANK];  /* the `@` or the layout rule */
} ShardOrigin;

/* The sharding of a tensor written as `spec` on p->mesh under p->layout (layout.c): explicit `@`s
 * first (errors: unknown axis, not divisible, an axis on two dims, the pipeline's axis on another
 * dim), then the layout's rules in order (a route's expert dim first in a tensor without its tokens
 * dim; a rule skipped where the tensor already uses every axis of it [silently: that is how FSDP
 * and DP share one layout; a multi-axis rule keeps the axes left, in order], the mesh lacks an axis
 * [one warning at the rule], the rule names the pipeline's axis for another dim [one warning at the
 * rule], or the dim does not divide [warning naming both sizes]). Diagnostics are reported once per
 * spec. Returns false if an explicit `@` was wrong. */
bool layout_apply(const Program *p, const TypeSpec *spec, Sharding *out, ShardOrigin *origin);
/* The same rules on a tensor of these dims with no `@` (any value the step holds or computes: the
 * layout binds it); `warn`: report skipped rules' warnings (once each), as layout_apply does. */
void layout_map_dims(const Program *p, Dim *const *dims, int rank, Sharding *out, ShardOrigin *origin, bool warn);
/* The pipeline's mesh axes: those of the first rule that shards a stacking dim of the entry's
 * stacked params evenly over more than one device (`layers: stage`), or 0; *rule: that rule. */
uint16_t layout_stage_axes(const Program *p, const LayoutRule **rule);

/* A size near `size` that `prod` divides, for a dim a rule cannot shard: the next multiple of
 * lcm(prod, LAYOUT_PAD_QUANTUM), where that adds at most 1%; else 0 (also when prod divides size).
 * The skipped rule's warning and check's suggestions offer it. */
#define LAYOUT_PAD_QUANTUM 64
int64_t layout_pad_size(int64_t size, int64_t prod);

/* A route call's expert (over:) and tokens (tokens:) dims (layout.c applies the expert dim's rule
 * first in a tensor that holds it without the tokens dim). */
typedef struct RouteDims { const Dim *expert, *tokens; } RouteDims;

/* ---- models ---- */
typedef struct Model Model;
typedef enum { PARAM_TENSOR, PARAM_MODEL, PARAM_STACK } ParamKind;
typedef struct ParamDecl {
  Name name;
  SrcLoc loc;
  ParamKind kind;
  TypeSpec type;        /* PARAM_TENSOR */
  Model *model;         /* PARAM_MODEL, PARAM_STACK */
  Dim *stack_dim;       /* PARAM_STACK: the stacking dim (`layers`) */
} ParamDecl;

typedef struct FnArg { Name name; SrcLoc loc; TypeSpec type; } FnArg;
typedef struct FnDecl {
  Name name;
  SrcLoc loc;
  Model *model;
  FnArg *args;
  int nargs;
  TypeSpec ret;
  const Node *ast;       /* N_FN; its body is lowered to IR on demand */
} FnDecl;

struct Model {
  Name name;
  SrcLoc loc;
  ParamDecl *params;
  int nparams;
  FnDecl *fns;
  int nfns;
};

/* ---- steps ---- */
/* The keys a `train` body may hold (language.md, fixed). X(enum, key) in this order. */
#define STEP_KEYS(X)                \
  X(SK_LOSS, "loss")                \
  X(SK_OPTIMIZER, "optimizer")      \
  X(SK_MASTER, "master")            \
  X(SK_REMAT, "remat")              \
  X(SK_MICROBATCHES, "microbatches") \
  X(SK_SCHEDULE, "schedule")        \
  X(SK_LR, "lr")                    \
  X(SK_ZERO, "zero")                \
  X(SK_STAGE_LAYERS, "stage_layers") \
  X(SK_TP_OVERLAP, "tp_overlap")    \
  X(SK_DP_OVERLAP, "dp_overlap")    \
  X(SK_GRAD_REDUCE, "grad_reduce")
typedef enum {
#define X(e, s) e,
  STEP_KEYS(X)
#undef X
  SK__COUNT
} StepKey;
typedef enum { LOSS_NONE, LOSS_CROSS_ENTROPY, LOSS_MSE } LossKind;
typedef enum { OPT_NONE, OPT_SGD, OPT_ADAM } OptimKind;
/* REMAT_SELECTIVE: keep what REMAT_NONE keeps but the attention core (Korthikanti et al.'s selective
 * recomputation): the fused attention op is recomputed in the backward. */
typedef enum { REMAT_NONE, REMAT_FULL, REMAT_DOTS, REMAT_SELECTIVE } RematKind;
typedef enum { SCHED_GPIPE, SCHED_1F1B, SCHED_INTERLEAVED } ScheduleKind;
typedef struct Step {
  StepKind kind;        /* STEP_TRAIN / STEP_SERVE */
  SrcLoc loc;
  FnDecl *fn;
  LossKind loss;
  OptimKind optimizer;
  DType master;         /* DT_NONE: no master copy */
  RematKind remat;
  int microbatches;     /* >= 1 */
  ScheduleKind schedule;
  int interleave;       /* V for interleaved(V) */
  double lr;
  int zero;             /* 0, 1 or 2 */
  int *stage_layers;    /* stage_layers = [...]: layers per pipeline stage, or NULL */
  int nstage_layers;
  bool tp_overlap;      /* tensor-parallel collectives as collective matmuls (default on) */
  bool dp_overlap;      /* gradient reductions behind the backward, gathers ahead (default on) */
  DType grad_reduce;    /* dtype of gradient reductions; DT_NONE: the gradients' own */
  SrcLoc key_loc[16];   /* where each key was written, for diagnostics (indexed by StepKey);
                           file == NULL where the key was not written */
  const Node *ast;      /* N_STEP (a serve step's keys are recorded here unchecked) */
} Step;

/* ---- the whole program ---- */
typedef struct DimOverride { Name name; int64_t size; } DimOverride;

struct Program {
  Arena *arena;
  Dim **dims; int ndims;
  Target **targets; int ntargets;
  Mesh **meshes; int nmeshes;
  Layout **layouts; int nlayouts;
  Model **models; int nmodels;
  Step **steps; int nsteps;
  /* what the command line chose (defaults applied by sema_program) */
  const Mesh *mesh;
  const Layout *layout;  /* NULL when the program declares none */
  Step *step;            /* the entry's step, or NULL with --entry */
  FnDecl *entry;
  /* A command-line problem (-D naming no dim, unknown --mesh/--layout/--entry, several functions
   * and no --entry): the driver prints it and exits 2. Arena string; NULL when none. */
  const char *usage_error;
  const Source *main_file;       /* the file named on the command line (last of the program) */
  struct DiagOnce *diag_once;    /* layout.c: diagnostics already reported (applying a spec twice
                                    reports nothing new) */
  /* what the layout's rules need of the models (sema_program, after the choices) */
  Dim **stack_dims; int nstack_dims;     /* the stacking dims of the entry's stacked params */
  RouteDims *route_dims; int nroute_dims; /* (over:, tokens:) of every route call in a function */
};

typedef struct SemaOptions {
  DimOverride *overrides; int noverrides; /* -D */
  const char *mesh;      /* --mesh, or NULL */
  const char *layout;    /* --layout, or NULL */
  const char *entry;     /* --entry model.fn, or NULL */
} SemaOptions;

/* Resolves and checks every declaration of every file (errors via diag.h), then applies the
 * command-line choices. Returns the program even with errors (check diag_error_count()). */
Program *sema_program(Arena *a, const ParsedProgram *pp, const SemaOptions *opt);

/* Lookups by name; NULL if absent. */
Dim *program_find_dim(const Program *p, Name n);
Model *program_find_model(const Program *p, Name n);
Target *program_find_target(const Program *p, Name n);
Mesh *program_find_mesh(const Program *p, Name n);
Layout *program_find_layout(const Program *p, Name n);
FnDecl *model_find_fn(const Model *m, Name n);
#endif
