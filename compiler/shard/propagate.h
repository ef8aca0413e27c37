/* propagate.h: sharding propagation: a sharding for every value of the IR.
 *
 * In: an IrModule (the entry, and whatever later stages append: any function, loop bodies
 * included) and the Program's mesh and layout. Out: Value.sharding on every value, with
 * Value.shard_source / dim_src / dim_loc saying where each axis came from, and Op.plan on every op
 * (the factor assignment partition.c realises).
 *
 * The layout binds every value (language.md, Layouts: "A layout binds"). Values with a written type
 * (inputs, params, typed lets, the arguments and results of every function, inlined or not) take
 * what their `@`s and the layout say (layout_apply). Every other value the step holds or computes
 * (activations, gradients, optimizer state, the loss's pieces) is held as the layout maps its type
 * (layout_map_dims: the same rules and skips); its op produces it so, the plan choosing which
 * collectives move the operands, or reduce partial sums, to get there (plan_op with the value's
 * PlanTarget). What the rules leave open is propagation's: the dims no rule maps after the skips
 * (a renamed dim keeps what it had before the rename), partial sums (a reduction deferred to where
 * a reader needs it, never more bytes than the bound sharding), and which collective reconciles
 * operands that disagree, by the plan-choice rule (plan_op's costs). Structure ties some values: a
 * loop body's stacked-param slices (their stacked value minus the leading dim), its carried values
 * (one sharding for every iteration: a carried output is produced as its carried input is held),
 * a loop's stacked results (its body outputs, the stacking dim over the stage axes). Weights keep
 * their tensor-parallel shards where they are read (a plan that gathers one over an axis that does
 * not shard the batch only where no other exists); FSDP's are gathered. One derivation, in program
 * order: linear in the program.
 *
 * Where explain or sim ask (IrModule.weigh.want), the plan propagation would choose without the
 * binding is weighed too: the free search (every value not written at a boundary its op's natural
 * result, then pins kept while the collectives [partition_cost: time on the mesh's target with hop
 * latency, ideal figures] get strictly cheaper, or as cheap with fewer collectives, or as cheap and
 * as many but closer to the layout's mapping; candidates in program order, so ties go to source
 * order; a trial derives again only what depends on its pin and re-costs only the ops that read or
 * define what changed: docs/passes.md, section 1). Its cost against the bound plan's, and the rule
 * that forbids it, go to IrModule.weigh; every sharding and plan is then put back: it is never
 * taken.
 *
 * Train steps (docs/training.md, section 9) are one function like any other, with: rank-0 values
 * (a loss may be a partial mean), and microbatch accumulators (and the stacked gradients they
 * add up) that stay partial sums across the loop where that costs no memory (they start as zeros,
 * a partial sum of zeros): gradients reduced once per step. */
#ifndef SHARDC_PROPAGATE_H
#define SHARDC_PROPAGATE_H

#include "ir.h"

/* Fills every value's sharding for p's mesh and layout (see above), and m->weigh where
 * m->weigh.want. When m has already been partitioned (it holds collectives), only values without a
 * sharding (SHARD_FREE: ops appended since) are inferred; the others stay as they are. */
void propagate_module(IrModule *m, const Program *p);

/* A test's check of the free search's incremental figures (tests/unit/test_propagate.c; the search
 * runs where m->weigh.want): while set,
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
