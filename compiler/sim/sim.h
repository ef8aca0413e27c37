/* sim.h: `shardc sim`: a program's step simulated on its mesh's target.
 *
 * In: a module after the pass pipeline (pipeline_run: localised, every collective with its
 * CollSpec, a pipelined step's OP_PIPELINE with its per-stage schedule) and its Program (the mesh
 * and its target). Out: a timeline (timeline.h) of one representative device per distinct role --
 * one for the whole mesh, or one per pipeline stage -- and what it comes to: the step time, its
 * split into compute, communication, exposed communication, pipeline bubble and idle time, MFU,
 * HFU, tokens per second, the slowest source lines and collectives, and a Chrome trace.
 * docs/sim.md describes the model, docs/cost-model.md the prices it uses.
 *
 * Two layers:
 *   kernels.c    what each op of the per-device program costs (SimCosts): the kernels a compiler
 *                would launch -- a contraction (cost_matmul on its local M, N, K and batch), the
 *                fused attention and its backward (cost_attention), a maximal producer-consumer
 *                group of elementwise ops fused into one kernel (cost_fused_chain on its external
 *                bytes), any other op as a memory-bound kernel (cost_memory_op), views for free,
 *                a collective (cost_collective over its CollSpec's axes). FLOPs and bytes come
 *                from opcost.h, the one cost function per op. This is the API the native runtime
 *                reads to keep its simulated clock (issue 10): the duration `sim` gives each op.
 *   simulate.c   the translation to the timeline: tasks for every kernel on the device's compute
 *                stream (in program order) and every collective on a communication stream of its
 *                link class (in the order collectives become ready), dependencies from the
 *                dataflow, loops unrolled, a pipeline's regions per its schedule with the transfers
 *                on a point-to-point stream; what repeats past the task budget (a long loop, many
 *                microbatches) simulated a few times and extrapolated from its steady state, so
 *                that time and memory do not grow with layers or microbatches. */
#ifndef SHARDC_SIM_H
#define SHARDC_SIM_H

#include "cost.h"
#include "ir.h"
#include "timeline.h"

/* ---- what each op costs (kernels.c) ---- */

/* The kinds of kernel the simulator runs. X(enum, name), in this order. */
#define SIM_KERNEL_KINDS(X)                 \
  X(SIMK_VIEW, "view")                        \
  X(SIMK_MATMUL, "matmul")                    \
  X(SIMK_ATTENTION, "attention")              \
  X(SIMK_ATTENTION_BWD, "attention backward") \
  X(SIMK_FUSED, "fused elementwise")          \
  X(SIMK_MEMORY, "memory-bound")              \
  X(SIMK_COLLECTIVE, "collective")
typedef enum {
#define X(e, s) e,
  SIM_KERNEL_KINDS(X)
#undef X
  SIMK_COUNT
} SimKernelKind;
const char *sim_kernel_kind_name(SimKernelKind k);

/* One kernel: one op, or several fused into one launch (an elementwise group; the three ops of an
 * attention backward). */
typedef struct SimKernel {
  uint8_t kind;            /* SimKernelKind */
  const Op *anchor;        /* the op at whose place in program order the kernel runs: the last
                              op of an elementwise group, the first of an attention backward */
  int nops;                /* ops it runs */
  const Value **ins;       /* the values it reads from outside itself (its dependencies) */
  int nins;
  double time_s;           /* its duration on the target */
  double flops;            /* language.md's count, one device, one run */
  double bytes;            /* HBM bytes (a fused group: its external bytes); a collective: the
                              `bytes` cost_collective took */
  OpTime op;               /* compute kernels: what time_s is made of */
  CollCost coll;           /* SIMK_COLLECTIVE */
  CollKind coll_kind;
  /* set by sim_costs_overlap (overlap.c): */
  bool overlapped;         /* run as a collective matmul (tp_overlap): time_s is its exposed part */
  double hidden_s;         /* the part of the collective its contraction hides */
  bool blocking;           /* dp_overlap = off: the compute stream waits for it, and it for the
                              compute before it */
} SimKernel;

/* The kernels of a whole module (main, loop bodies, pipeline regions) on a mesh. */
typedef struct SimCosts {
  const Mesh *mesh;
  bool ideal;
  SimKernel *kernels;
  int nkernels;
  int32_t *kernel_of;      /* by the id of an op's first result: its kernel, -1 none (loops,
                              pipelines, inputs, params and constants) */
  int nvalues;
} SimCosts;

/* Prices every op of m (localised) on mesh. Arena-allocated; never fails on a localised module. */
void sim_costs_build(Arena *a, const IrModule *m, const Mesh *mesh, bool ideal, SimCosts *out);
/* The train step's overlap keys (language.md, Steps) as sim_costs_overlap reads them. */
typedef struct SimOverlap {
  bool tp_overlap;         /* tensor-parallel collectives as collective matmuls */
  bool dp_overlap;         /* data-parallel collectives asynchronous (off: blocking) */
  DType grad_reduce;       /* dtype of data-parallel reductions; DT_NONE: their own */
} SimOverlap;
/* Applies them to c's kernels (overlap.c gives the model): an overlapped tensor-parallel
 * collective keeps only its exposed time, a data-parallel one is marked blocking under
 * dp_overlap = off, a gradient reduction is priced in grad_reduce's bytes. */
void sim_costs_overlap(SimCosts *c, const IrModule *m, const SimOverlap *o);
/* The same with a train step's keys (nothing for a serve step or NULL). `sim` and run's simulated
 * clock both call it after sim_costs_build, so that they price the same kernels. */
void sim_costs_apply_step(SimCosts *c, const IrModule *m, const Step *st);
/* The kernel op belongs to, or NULL (loops, pipelines, inputs, params, constants). */
const SimKernel *sim_costs_kernel(const SimCosts *c, const Op *op);
/* The duration `sim` gives op in one run: its kernel's time_s when op anchors the kernel, 0 when
 * it is a view or one of the other ops of a fused kernel (the kernel's time is charged once, to
 * its anchor). Summing this over the ops a device executes, with the same overlap rules, is what
 * `sim` does. */
double sim_costs_op_seconds(const SimCosts *c, const Op *op);

/* One op alone, unfused, on mesh's target (what it would cost as a kernel of its own): a
 * contraction, an attention (its backward: one of its three ops is the whole kernel, see
 * sim_costs), a memory-bound op; 0 for views, loops, inputs, params, constants. Fills *out. */
double sim_op_seconds(const Mesh *mesh, const Op *op, bool ideal, OpTime *out);
/* One collective op (localised: its operand's and result's local sizes) on mesh: cost_collective
 * over Op.axes with the bytes language.md defines (an AllGather its result, the others their
 * operand); a collective among a CollSpec group is priced on a group of that size. */
double sim_collective_seconds(const Mesh *mesh, const Op *op, bool ideal, CollCost *out);
/* A pipeline's own costs, as the step's simulation charges them (simulate.c): after each run of
 * region r (PipeRegion), the f32 accumulation of the gradients it yields (compute), and a send of
 * r's activation or gradient to the next stage, with the receivers' AllGather under Megatron's
 * send split (communication); 0 where r has none. */
double sim_pipe_accumulate_seconds(const Mesh *mesh, const PipeInfo *pi, int r, bool ideal);
double sim_pipe_transfer_seconds(const Mesh *mesh, const PipeInfo *pi, int r, bool ideal);
/* The bytes a value takes on one device (its local extents): dtype bytes x prod Value.local. */
double sim_value_bytes(const Value *v);

/* ---- the step (simulate.c) ---- */

typedef struct SimOptions {
  bool ideal;              /* peak figures, no efficiency factors (the book's arithmetic) */
  bool keep_graph;         /* keep the timelines for sim_trace_write */
  int64_t max_tasks;       /* loops are unrolled while the timelines hold fewer tasks, else run as
                              blocks from their steady state. 0: the default, 1,000,000. The
                              budget of a steady state's search, and of a block or a pipeline
                              simulated whole, is the larger of this and the default: past it, a
                              located error */
  bool full;               /* never from a steady state: every microbatch of a pipeline, every
                              iteration of a loop run as a block, whatever the budget (tests
                              compare the two) */
} SimOptions;

/* One source op (or the pipeline's transfers, or its gradient accumulation) over a whole step. */
typedef struct SimItem {
  const Op *op;            /* the op (a fused group's anchor); for transfers and accumulation
                              the OP_PIPELINE */
  const char *what;        /* "contract q", "fused gelu (3 ops)", "all_reduce over (data)",
                              "pipeline send (activations)" */
  SrcLoc loc;
  uint8_t kind;            /* SimKernelKind; transfers are SIMK_COLLECTIVE */
  double runs;             /* per step, per device (averaged over the stages) */
  double time_s;           /* summed over the runs, per device (averaged over the stages) */
  double exposed_s;        /* collectives: the part no compute of the device overlaps */
  double flops;            /* summed, per device */
} SimItem;

/* One simulated device: the whole mesh, or one pipeline stage. Times over one step. */
typedef struct SimStageStats {
  int stage;               /* -1 without a pipeline */
  int64_t represents;      /* real devices it stands for */
  double compute_s;        /* compute kernels running */
  double comm_s;           /* collectives and transfers running */
  double exposed_comm_s;   /* communication while no compute runs */
  double bubble_s;         /* idle while the pipeline runs, from the first stage's first region to
                              the last region of any stage: the schedule's fill and drain (0
                              without a pipeline) */
  double idle_s;           /* other idle time (before and after the pipeline: waiting for the
                              step's slowest stage) */
  double end_s;            /* when its last task ends */
} SimStageStats;

typedef struct SimReport {
  bool ideal;
  double step_s;           /* the step's makespan */
  /* per device: the simulated devices' figures averaged (each stands for the same number of
     devices); compute_s + exposed_comm_s + bubble_s + idle_s = step_s on each */
  double compute_s, comm_s, exposed_comm_s, bubble_s, idle_s;
  double flops_per_step;        /* global, recomputation included (check's flops_per_step) */
  double model_flops_per_step;  /* global, without recomputation (MFU's numerator) */
  double peak_flops;            /* the target's dense bf16 FLOP/s per device */
  double mfu, hfu;              /* model / hardware FLOPs / (step x devices x peak) */
  double tokens_per_step;       /* global: the labels' elements, else the first input's rows */
  double tokens_per_s;
  int64_t devices;
  SimStageStats *stages;        /* one per simulated device */
  int nstages;
  SimItem *items;               /* every op with time, slowest first */
  int nitems;
  int64_t tasks;                /* tasks simulated (all timelines) */
  int steady_loops;             /* loops simulated as blocks from their steady state (the budget) */
  int microbatches;             /* a pipeline's microbatches (0 without one) */
  int microbatches_simulated;   /* when the step was extrapolated from its steady state: k, the
                                   smaller of the two numbers of microbatches it was simulated at
                                   (k and k + microbatches_period); 0: all simulated */
  int microbatches_period;
  void *detail;                 /* the timelines, with keep_graph (for sim_trace_write) */
} SimReport;

/* Simulates m's step (or forward) on p->mesh. m must have passed pipeline_run. Returns false
 * with a located diagnostic when the step is past the task budget (a pipeline too large to
 * simulate even from its steady state, a loop with no steady state within it) or cannot be
 * scheduled (a bug); the report's figures are then zero. */
bool sim_program(const Program *p, const IrModule *m, const SimOptions *o, SimReport *out);
/* Frees what sim_program allocated (the report's arrays and the timelines). */
void sim_report_free(SimReport *r);

/* The Chrome trace of the simulated step (needs keep_graph; sim_report_trace_write): one process per simulated device,
 * one thread per stream, a slice per kernel, collective, transfer or pipeline region, named after
 * the op and its source line; a pipeline region's ops nest under it for the first microbatch's
 * regions (all of them when the trace stays under ~200,000 slices); flow events from each collective
 * to the compute task waiting for it; per simulated device a memory counter track (bytes live by
 * class as the buffer plan walks the top level, bufplan_build_profile: its largest total is
 * check's peak for that device). */
/* Written as every output (base/outfile.h: beside path, then renamed); false with the reason in err. */
bool sim_report_trace_write(const SimReport *r, const char *path, char *err, size_t n);
char *sim_report_trace_text(const SimReport *r); /* malloc'd JSON; NULL without keep_graph */

/* The step by phase, as Megatron's timers print it: each simulated op (SimItem) in one phase by its
 * Op.phase: forward (and the loss), backward (recomputation and gradient accumulation included),
 * optimizer; the gradients' collectives (CollRole ROLE_GRADIENT) are gradient reduction, a
 * pipeline's sends pipeline transfers. Per device: compute_s of its kernels, comm_s of its
 * collectives, exposed_comm_s the part of those no compute overlaps, time_s = compute_s +
 * exposed_comm_s, flops, and flops_per_s = flops / time_s (achieved, per device). The phases add up
 * to the report's compute_s + exposed_comm_s when collectives ride one link class; collectives on
 * different links running at once are each counted (the report counts that time once). */
#define SIM_PHASES(X)                          \
  X(SIMPH_FORWARD, "forward")                  \
  X(SIMPH_BACKWARD, "backward")                \
  X(SIMPH_OPTIMIZER, "optimizer")              \
  X(SIMPH_GRAD_REDUCE, "gradient reduction")   \
  X(SIMPH_PIPELINE, "pipeline transfers")
typedef enum {
#define X(id, name) id,
  SIM_PHASES(X)
#undef X
  SIMPH__COUNT
} SimPhaseKind;

typedef struct SimPhase {
  SimPhaseKind kind;
  double time_s, compute_s, comm_s, exposed_comm_s, flops, flops_per_s;
} SimPhase;

void sim_phases(const SimReport *r, SimPhase out[SIMPH__COUNT]);
const char *sim_phase_name(SimPhaseKind k);

/* Days to train on `tokens` tokens at tokens_per_s: tokens / tokens_per_s / 86400. With the
 * MFU convention this is total model FLOPs / (devices x peak x mfu), the book's arithmetic. */
double sim_days_for_tokens(double tokens, double tokens_per_s);

#endif
