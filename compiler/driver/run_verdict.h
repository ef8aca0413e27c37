/* run_verdict.h: what `run` and `build` tell runtime/verdict.h about each output of the entry: its
 * comparison rule and its noise bound (docs/run.md, "How run decides PASS").
 *
 * The noise bound of a value is RUN_NOISE_C x sqrt(var), var summed along the deepest path of ops
 * that made it in the program on one device (loops counted trip by trip): each op that rounds its
 * result adds u^2 (u the unit roundoff of the dtype it stores: 2^-8 bf16, 2^-11 f16, 2^-24 f32),
 * a reduction over K elements adds u^2 again (a sharded run rounds its partial sums) and K u32^2
 * (f32 accumulation in another order), adam's second moment doubles its gradient's bound (a
 * square), views and data movement add nothing: var = the sum of u^2 over the roundings on the
 * deepest path, and the bound C u sqrt(depth) where one dtype is stored throughout. It is relative to the tensor's scale (its largest
 * magnitude), which is what rounding errors are proportional to once values mix in sums. A
 * gradient's tolerance is at least RUN_NOISE_C x umax x the largest update of its group (the
 * step's first moments, its second moments (twice), sgd's param updates, its master updates):
 * an element whose own terms cancel (a key bias's gradient is zero exactly) is left with the
 * rounding of terms as large as the others'. */
#ifndef SHARDC_RUN_VERDICT_H
#define SHARDC_RUN_VERDICT_H

#include "ir.h"
#include "verdict.h"

#define RUN_NOISE_C 3.0

/* One RtCmpDesc per output of m's main (m global: before partitioning). Names are arena strings.
 * `inputs` is main's input count (params' slots follow the inputs, as run_host.h's slots do). */
RtCmpDesc *run_verdict_descs(Arena *a, const IrModule *m);

/* The noise bound of every output of m's main, in output order (run_verdict_descs' .noise), and
 * (umax not NULL) the largest unit roundoff of any dtype on the paths that made it. */
void run_verdict_noise(const IrModule *m, double *noise, double *umax);

#endif
