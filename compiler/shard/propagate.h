/* propagate.h: sharding propagation: a sharding for every value of the IR.
 *
 * In: an IrModule (the entry, and whatever later stages append: any function, loop bodies
 * included) and the Program's mesh and layout. Out: Value.sharding on every value, with
 * Value.shard_source / dim_src / dim_loc saying where each axis came from, and Op.plan on every op
 * (the factor assignment partition.c realises).
 *
 * Hard constraints first: values with a written type (inputs, params, typed lets, the arguments and
 * results of every function, inlined or not) take what their `@`s and the layout say
 * (layout_apply). A loop body's stacked-param slices are their stacked value minus the leading dim;
 * its carried values have one sharding for every iteration. Every other value is inferred: it
 * takes the natural result of its op's plan (partition.h: factors follow the operands, through
 * renames, reshapes and contractions; conflicts decided by cost), forward in program order. Then a
 * search improves the whole plan: each free value in turn is pinned to the shardings its neighbours
 * suggest (its op's other candidates, what each user would take, the layout's mapping of its dims),
 * everything after it is re-derived, and the pin is kept when the plan's collectives
 * (partition_cost: time on the mesh's target with hop latency, ideal figures) get strictly
 * cheaper, or as cheap with fewer collectives, or as cheap and as many but closer to the layout's
 * mapping; candidates are tried in program order, so ties go to source order. It stops at a fixed
 * point (no pin improves) or after a few rounds. A trial derives again only what depends on its
 * pin and re-costs only the ops that read or define what changed (partition.h's PartLedger); a
 * rejected pin is undone from what the trial saved (docs/passes.md, section 1).
 *
 * Train steps (docs/training.md, section 9) are one function like any other, with: rank-0 values
 * free (a loss may be a partial mean), a loop's stacked results (residuals, stacked gradients)
 * inferred from their body outputs with the stacking dim over the loop's stage axes (only stacked
 * params, slices with a written type, make a pipeline: a microbatch loop never is), and microbatch
 * accumulators that may stay partial sums across the loop where that costs no memory (they start
 * as zeros, a partial sum of zeros). */
#ifndef SHARDC_PROPAGATE_H
#define SHARDC_PROPAGATE_H

#include "ir.h"

/* Fills every value's sharding for p's mesh and layout (see above). When m has already been
 * partitioned (it holds collectives), only values without a sharding (SHARD_FREE: ops appended
 * since) are inferred; the others stay as they are. */
void propagate_module(IrModule *m, const Program *p);

/* A test's check of the search's incremental figures (tests/unit/test_propagate.c): while set,
 * after every trial pin (accepted, and again once undone) the search compares the ledger's
 * collective cost and its layout term with a full partition_cost and count, and the shardings
 * with a full derivation, counting the trials checked and those that differ. Slow: tests only. */
typedef struct PropagateAudit {
  long checked, mismatches;
  double max_rel_err;   /* the largest relative difference of the collectives' time seen */
  char first[256];      /* the first mismatch, described, or "" */
  long derived, walked; /* units the trials derived again, and the ledger walked again */
  long cut;             /* trials stopped early as unable to win (derived to the end when audited) */
  long skipped;         /* trials known to lose from such a trial before (derived when audited) */
} PropagateAudit;
void propagate_audit(PropagateAudit *a); /* NULL: off */

#endif
