/* stages.h: a pipelined program as what each stage runs.
 *
 * In: a localised module whose stacked loop shards its stacked dim over stage axes (`layers@stage`):
 * in a train step, the microbatch loop's body holds the forward loop, the code after it (norm,
 * logits, loss and their gradient), the backward loop and the gradient of the code before it; a
 * forward alone holds the code before, the loop and the code after. Out: one OP_PIPELINE in its
 * place (m->pipeline) whose regions (ir.h's PipeRegion) are those pieces, each wired to the
 * pipeline's operands, to the activations and gradients that cross stages, to the residuals a
 * chunk keeps for its backward and to the accumulators (PipeInfo), and whose schedule
 * (schedule.h) orders them per stage; the carried activations' CollectivePermutes inside the loops
 * are gone (transfers are the schedule's sends and receives). Every op of main after that gets its
 * placement (Op.place): a param held by the first stage only (an embedding) is held, updated and
 * counted there alone; a param both ends hold (a tied embedding) has its gradient all-reduced
 * between them, a collective over the stage axes with a group of two. docs/pipelines.md. */
#ifndef SHARDC_STAGES_H
#define SHARDC_STAGES_H

#include "ir.h"

/* Does nothing when m has no pipelined loop. Returns false after a located error (a program shape
 * the pipeline cannot split: a value crossing stages other than the activations, the layers' own
 * params used outside the layers, a schedule that does not fit the shape). */
bool stages_module(IrModule *m, const Program *p);

/* For `run` and `build`, which execute the schedule action by action: true when m has no pipeline
 * or its schedule is listed in full (schedule.h: at most SCHEDULE_LIST_MAX actions); else a
 * located error naming `cmd`, at the train step's `microbatches`, and false. */
bool stages_require_list(const IrModule *m, const Program *p, const char *cmd);

/* The stage of device `dev` (0 .. p-1) along pi's stage axes, on mesh. */
int stages_of_device(const PipeInfo *pi, const Mesh *mesh, int64_t dev);

/* Does an op placed `place` run on stage s of p? */
bool stages_runs_on(uint8_t place, int s, int p);
#endif
