/* dpwin.h: when each data-parallel collective is issued and by when it must be done: its overlap
 * window, stated in the device program (DevOp.win) so that the simulator prices it and explain
 * shows it (language.md, Steps: dp_overlap; docs/passes.md, "Overlap windows").
 *
 * In: a train step's module whose device program is built (devprog_build, after bucket.c has
 * marked each collective's role). Out: DevOp.win on every collective of a weight or of a gradient
 * (Op.role) whose axes shard `batch` (a bucket's members share one window), as Megatron-Core runs
 * them with --overlap-grad-reduce and --overlap-param-gather, and PyTorch FSDP with its prefetch:
 *
 *   gradient    issued as soon as the last contribution to it is made: the value `after` (after the
 *               microbatch loop, the gradient the LAST microbatch's backward makes, before it is
 *               added to the accumulator: the accumulation into a layer's bucket runs in that
 *               layer's backward, as Megatron's main_grad hooks do). A gradient stacked over a
 *               loop's iterations (a layer loop's weight gradients) is reduced in `pieces`, one
 *               per iteration, piece i issued when iteration i of `piece_loop` ends (a layer's
 *               bucket as soon as that layer's backward is done).
 *   prefetch    a weight gathered inside a loop from what the loop does not compute (an FSDP
 *               layer's shard): issued when the previous iteration starts, one layer ahead, never
 *               further (two layers' gathered weights at most).
 *   operand     any other: issued when its operand exists (a weight gathered from a param: at the
 *               step's start; what a pipeline's schedule makes: after its last region).
 *   blocking    dp_overlap = off: issued after the compute before it, and the compute after it
 *               waits for it (software before bucketed overlap).
 * Every window also names the op before which the collective must be done: the first reader of
 * its result (of any member's), `before`; a result only a loop body's outputs take (a layer's
 * gradient row, stacked): the first reader of the loop's result after the loop (out_loop); NULL:
 * nothing reads it (the step's outputs: the step's end). Returns how many windows it set. */
#ifndef SHARDC_DPWIN_H
#define SHARDC_DPWIN_H

#include "ir.h"
#include "program.h"

/* The most pieces a gradient is reduced in (a loop of more iterations is reduced whole after it:
 * the simulator would hold one task per piece). */
#define DPWIN_MAX_PIECES 4096

typedef enum { DPW_OPERAND, DPW_GRADIENT, DPW_PREFETCH, DPW_BLOCKING } DevWindowKind;

typedef struct DevWindow {
  uint8_t kind;             /* DevWindowKind */
  const Value *after;       /* issued once this value is made (in its last run: the last microbatch's
                               backward); NULL: at the start (prefetch: see piece_loop) */
  const Op *via;            /* the loop of the collective's own function whose body makes `after` (the
                               microbatch loop), NULL: `after` is the collective's function's own */
  const Op *piece_loop;     /* pieces: the loop whose iteration i makes piece i (in via's last run) */
  int64_t pieces;           /* 0 or 1: issued whole */
  const Op *before;         /* the first reader of its result; NULL: none in its function */
  const Op *out_loop;       /* the result is a loop body's output (a layer's gradient row): `before` is
                               the first reader of that loop's result, after the loop (the collective of
                               iteration i overlaps the iterations after it) */
  const char *text;         /* what explain prints: "issued after ..., done before ..." */
} DevWindow;

int dpwin_module(IrModule *m, const Program *p);

#endif
