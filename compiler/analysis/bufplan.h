/* bufplan.h: the buffer plan: which buffer holds each value of the per-device program, when it is
 * allocated and freed, and the peak bytes per device it adds up to, split by class. `check` prints
 * these figures; the lowering allocates and frees by the same plan (lower.c, `buffer`).
 *
 * In: a module after the pass pipeline (localised; pipelined where the layout says). Out, per value:
 *   root   the value whose buffer it lives in: itself (a buffer of its own, allocated by its op and
 *          freed after the last read of any value living in it), or
 *          - a view: a rename, a transpose that keeps the dim order, a split or a merge (row-major
 *            reshapes), a cast to the same dtype, a slice of the leading dim alone: the operand's
 *            buffer;
 *          - in place: an elementwise op (or a narrowing cast, an AllReduce, a permute) whose
 *            operand's buffer is read for the last time by it, is at least as large and holds the
 *            same class of value: that buffer;
 *          - an updated param or optimizer state: the buffer of the param or state it replaces;
 *          - a loop body's inputs and stacked outputs: the loop's operands and results (counted
 *            outside the body); a pipeline region's inputs: the stage's store, mailbox or operands.
 *   class  BUF_PARAM (params and their updates), BUF_OPT (optimizer state), BUF_GRAD (a param's
 *          gradient from its last reduction to the update), BUF_ACT (what the forward saves for
 *          the backward: Value.saved, a pipeline chunk's residuals), BUF_TEMP (everything else:
 *          gathered weights, recomputation, microbatch accumulators, the logits, inputs).
 * Peak: walking each function in program order, a buffer is live from the op that makes it to the
 * last op that reads it; a loop's body adds its own peak (one iteration) at the loop's op; a
 * pipeline adds, at its op, the peak over the stage's schedule of the residuals kept, the
 * activations in flight and the region being run. Under a pipeline each stage is walked with its
 * own ops (Op.place) and schedule. */
#ifndef SHARDC_BUFPLAN_H
#define SHARDC_BUFPLAN_H

#include "ir.h"

typedef enum { BUF_PARAM, BUF_GRAD, BUF_OPT, BUF_ACT, BUF_TEMP, BUF__COUNT } BufClass;

#define BUFPLAN_LARGEST 6
typedef struct BufLive {
  const Value *v;       /* the buffer's root value */
  int64_t bytes;        /* per device */
  uint8_t cls;          /* BufClass */
  int count;            /* a pipeline's stores: how many (microbatch, chunk) copies of it are live */
} BufLive;

typedef struct BufStage {
  int stage;                        /* 0 without a pipeline */
  int64_t peak;                     /* bytes per device at the plan's peak */
  int64_t by_class[BUF__COUNT];     /* the peak split by class (adding up to peak) */
  const Op *peak_op;                /* the op (of main, a body or a region) at the peak */
  BufLive largest[BUFPLAN_LARGEST]; /* the largest buffers live at the peak, largest first */
  int nlargest;
  int in_flight;                    /* a pipeline stage: (microbatch, chunk) residual sets live at the peak */
  const BufLive *live;              /* bufplan_build_live: every buffer live at the peak */
  int nlive;
  /* bufplan_build_profile: the bytes live by class at each op of main the stage runs, in program
   * order, as the walk weighs them for the peak (a loop's or pipeline's op with its own peak
   * added): the largest total among them is `peak` (a ring attention's arriving block aside) */
  const Op **prof_ops;
  int64_t *prof;                    /* nprof x BUF__COUNT, by class */
  int nprof;
} BufStage;

typedef struct BufPlan {
  int nstages;          /* 1 without a pipeline */
  BufStage *stages;
  int worst;            /* the stage with the largest peak (language.md's per_device) */
  int32_t *root;        /* per value id: the value whose buffer it uses; -1 external (counted elsewhere) */
  int32_t *buffer;      /* per value id: the value whose buffer it uses, external ones too (a loop body's
                           carried input, its stacked output's row): what the lowering follows */
  uint8_t *cls;         /* per value id: BufClass */
  int nvalues;
} BufPlan;

/* Builds the plan for m on p's mesh (arena-allocated). */
void bufplan_build(Arena *a, const IrModule *m, const Program *p, BufPlan *out);
/* Tests only: walk a pipeline schedule's every run of its steady unit rather than the first and
 * the last (the same peak, in time that grows with the microbatches). */
extern bool bufplan_walk_every_run;
/* The same, and with keep_live each stage's BufStage.live lists every buffer live at its peak (the
 * suggestions' search rescales them for a changed layout, fitsearch.h). */
void bufplan_build_live(Arena *a, const IrModule *m, const Program *p, bool keep_live, BufPlan *out);

/* The same with each stage's profile (BufStage.prof): what the simulator's trace draws as memory
 * counter tracks. */
void bufplan_build_profile(Arena *a, const IrModule *m, const Program *p, BufPlan *out);

/* Annotates the device program with the plan: each DevValue.buffer (once; the plan is built in
 * dm's arena). What the lowering allocates by. */
struct DevModule;
void bufplan_annotate(struct DevModule *dm);

/* op's result is a view of its operand's buffer (renames, splits, merges, a cast to the same dtype,
 * a transpose keeping the dim order, a slice of the leading dim alone): no copy, no traffic. */
bool bufplan_is_view(const Op *op);
const char *bufplan_class_name(BufClass c); /* "params", "grads", "optimizer", "activations", "temporaries" */
#endif
