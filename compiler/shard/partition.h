/* partition.h: what each op needs of its operands' shardings, and the collectives that get them
 * there (SPMD partitioning).
 *
 * Two halves:
 *   partition_plan.c  pure functions over shardings, no IR changes: an op's sharding rule (its
 *                     factors: the named dims it keeps, sums over, or needs whole), the factor
 *                     assignment that runs it (the four sharded-matmul cases, conflicts decided by
 *                     cost), and the collectives that turn one sharding of a tensor into another.
 *                     Propagation (propagate.c) calls the planner to choose shardings.
 *   partition.c       the IR rewrite: after propagation, every op whose operands are not sharded
 *                     as its plan needs gets collective ops in front of it (AllGather, AllReduce,
 *                     ReduceScatter, AllToAll, CollectivePermute), each with its reason; partial
 *                     sums stay unreduced through linear ops; pipeline stage transfers; errors for
 *                     reshapes that cannot keep a sharding. The same walk, run dry, is the cost
 *                     propagation minimises.
 * Every time here is ideal (peak figures): plans are compared with the book's arithmetic. */
#ifndef SHARDC_PARTITION_H
#define SHARDC_PARTITION_H

#include "cost.h"
#include "ir.h"

/* ---- reshards: one sharding of a tensor into another ---- */

/* One collective of a reshard. `bytes` is what cost_collective takes for its kind. */
typedef struct ReshardStep {
  CollKind kind;
  uint16_t axes;        /* mesh axes it runs over */
  int dim, dim2;        /* AllGather / ReduceScatter: the dim (-1: several); AllToAll: from, to */
  double bytes;
  double bytes_per_device; /* what each device sends (CollCost's; the plan choice's bytes) */
  double time_s;        /* ideal */
  Sharding before, after;
} ReshardStep;

#define RESHARD_MAX_STEPS 8
typedef struct Reshard {
  ReshardStep step[RESHARD_MAX_STEPS];
  int n;
  double time_s;        /* sum of the steps */
  bool slices;          /* the target has axes the source lacks: a local slice ends it (free) */
} Reshard;

/* The collectives that turn `from` into `to` for a tensor of type t on mesh m, in this order:
 * partial sums reduced (a ReduceScatter onto the dims where `to` shards the summed axes, one
 * AllReduce over the rest), shards moved between dims (AllToAll), axes dropped (one AllGather over
 * all of them), then axes added by a local slice. Returns false when impossible (`to` is partial
 * over an axis `from` is not). */
bool reshard_plan(const Mesh *m, const TensorType *t, const Sharding *from, const Sharding *to,
                  Reshard *out);

/* ---- shardings ---- */
bool sharding_equal(const Sharding *a, const Sharding *b, int rank);
uint16_t sharding_axes_used(const Sharding *s, int rank);   /* dims' axes, not partial */
int64_t sharding_axes_product(const Mesh *m, uint16_t axes);
/* The sharding the layout binds a tensor of type t to (layout_map_dims: rules in order, a route's
 * expert dim first where the tokens dim is absent, each skipped where its axes are taken [a
 * multi-axis rule keeps those left], missing from the mesh, the pipeline's, or do not divide),
 * without diagnostics; *bound (optional): bit d set where a rule maps dim d (the other dims are
 * open: propagation decides them). */
void sharding_layout_preferred(const Program *p, const TensorType *t, Sharding *out);
void sharding_layout_bound(const Program *p, const TensorType *t, Sharding *out, uint8_t *bound, bool warn);

/* ---- op plans ---- */

#define PLAN_MAX_FACTORS 24   /* three operands of rank MAX_RANK, all dims distinct */
#define PLAN_MAX_OPERANDS 5   /* attention_grad: q, k, v, o, do */
#define PLAN_MAX_ALTS 6

typedef enum {
  FK_KEEP,    /* a dim of the result: its axes stay */
  FK_SUM,     /* summed over (contracted, sum/mean, take's table rows): sharded -> partial sum */
  FK_MAX,     /* max over it: sharded -> local max + AllReduce(max) of the result */
  FK_STATS,   /* softmax / norm over it: sharded -> local statistics + AllReduce of them */
  FK_WHOLE,   /* the op needs it whole (attention's head dims) */
  FK_RING     /* attention's key dim: whole, or sharded over exactly the axes of the query dim, and
                 then the op runs as ring attention over them (Op.ring; language.md, Context
                 parallelism): the K/V blocks travel the ring, no gather */
} FactorKind;

/* Why a factor got the axes it got (explain's reasons). */
typedef enum {
  WHY_NONE,       /* no operand shards it */
  WHY_AGREED,     /* the operands that have it agree (or only one has it) */
  WHY_CASE2,      /* contracted, but not sharded alike in both operands: gather (matmul case 2) */
  WHY_CONFLICT,   /* proposals conflicted; chosen by cost */
  WHY_WHOLE,      /* the op needs the dim whole */
  WHY_BLOCKED,    /* its axes are taken by a pipeline or by a partial sum passing through */
  WHY_INDIVISIBLE /* the axes do not divide the dim */
} FactorWhy;

typedef struct OpPlan {
  bool factored;        /* the op has a factor rule (false: inputs, params, loops, reshapes, ...) */
  int nf;
  const Dim *fdim[PLAN_MAX_FACTORS];
  uint8_t fkind[PLAN_MAX_FACTORS];    /* FactorKind */
  int8_t ax[PLAN_MAX_FACTORS][MAX_AXES_PER_DIM];
  uint8_t nax[PLAN_MAX_FACTORS];
  uint8_t why[PLAN_MAX_FACTORS];      /* FactorWhy */
  int8_t src[PLAN_MAX_FACTORS];       /* operand whose dim proposed the chosen axes; -1 the result */
  int8_t src_dim[PLAN_MAX_FACTORS];
  uint16_t lost[PLAN_MAX_FACTORS];    /* axes proposed for the factor that it did not get */
  int nopnd;
  Sharding req[PLAN_MAX_OPERANDS];    /* each operand as the op computes with it */
  Sharding natural;                   /* the result as the op computes it (before any reshard) */
  uint16_t passed;                    /* operands' partial axes passed through (linear ops) */
  uint16_t made_partial;              /* partial axes the op itself creates (summed factors) */
  uint16_t max_axes;                  /* FK_MAX factors' axes: an AllReduce(max) follows */
  uint16_t stats_axes;                /* FK_STATS factors' axes: statistics are all-reduced */
  int nstats;                         /* how many f32 statistics AllReduces (softmax 2, rmsnorm 1,
                                         layernorm 2) */
  uint16_t ring_axes;                 /* attention(_grad) as ring attention over these axes, or 0 */
  int stats_factor;                   /* the FK_STATS factor sharded, or -1 */
  bool conflict;                      /* the assignment was chosen by cost among candidates */
  double time_s;                      /* this op's collectives (operand reshards, in-op, result) */
  double alt_time_s;                  /* the cheapest rejected candidate's, or -1 */
  bool kept;                          /* chosen over cheaper candidates that gather a weight over an
                                         axis it keeps (PlanCtx.keep: the layout binds it) */
  Sharding result;                    /* the result as the op leaves it: its target resolved (open
                                         dims from `natural`, deferred partial sums), or `natural` */
  /* distinct natural results of the candidates (propagation tries them as pins) */
  Sharding alts[PLAN_MAX_ALTS];
  int nalts;
  /* reshapes (split / merge): the operand dim whose axes could not be kept, or -1 */
  int reshape_bad_dim;
} OpPlan;

typedef struct PlanCtx {
  const Program *p;
  const Mesh *mesh;
  uint16_t blocked;     /* axes no factor may take (a pipeline's stage axes inside its loop) */
  const uint16_t *keep; /* by value id (< nkeep): axes a weight keeps where it is read, as tensor
                           parallelism does (the layout binds it: propagate.c's mark_keep): a
                           plan that gathers the value over one of them is chosen only when no
                           other is possible; NULL: none (the free search) */
  int nkeep;
} PlanCtx;

/* What an op's result must be (plan_op's target): a sharding decided before the op is planned (a
 * written type, the layout's binding, a search's pin), some of whose dims may be left open. */
typedef struct PlanTarget {
  Sharding s;           /* the result's dims (open ones aside) and, unless `defer`, its partial axes */
  uint8_t open;         /* bit d: dim d is open: it keeps the axes the op computes it over, less
                           those the other dims take (a dim no layout rule maps) */
  bool defer;           /* partial sums over axes no dim of the result takes stay unreduced (a
                           reduction deferred to where the value is read: docs/passes.md, 6) */
} PlanTarget;

/* Plans op (a factored op) given its operands' shardings and, when the result's sharding is
 * decided (a written type, the layout's binding, a pin), `target`; NULL lets the op produce its
 * natural result. Rule (the result follows the operands): each factor takes the axes its operands
 * (and the target) agree on; a contracted dim keeps them only when both operands shard it alike
 * (else that operand is gathered: matmul case 2); where proposals conflict (two different axes for
 * one dim, one axis for two dims: case 4; a dim the op needs whole), every candidate is costed
 * (its operands' reshards, the op's own collectives, the result's reshard to the target [its open
 * dims and deferred partial sums resolved against the candidate] and the eventual AllReduce of a
 * partial sum left unreduced) and the cheapest wins; ties go to fewer collectives, then the
 * layout's mapping of the result, then the earlier operand's proposal. Returns false for ops
 * without a factor rule. */
bool plan_op(const PlanCtx *c, const Op *op, const Sharding *const *operands, const PlanTarget *target,
             OpPlan *out);
/* The target resolved against what the op computes (`nat`): open dims from nat, less the axes
 * the other dims take; with defer, nat's partial axes no dim takes. */
void plan_target_resolve(const PlanTarget *t, const Sharding *nat, int rank, Sharding *out);

/* split / merge: the result's sharding from the operand's (forward), or the operand's from the
 * result's (backward, for propagation's candidates). A split keeps the source dim's axes on its
 * parts, major part first, while each part divides evenly; a merge keeps its parts' axes when every
 * part before the last sharded one is fully sharded (its blocks stay contiguous). Returns false
 * (and *bad_dim = the operand dim) when the sharding cannot be kept. Partial sums pass through. */
bool plan_reshape(const Mesh *m, const Op *op, const Sharding *in, Sharding *out, int *bad_dim);
bool plan_reshape_back(const Mesh *m, const Op *op, const Sharding *out, Sharding *in);

/* ---- the IR rewrite (partition.c) ---- */

/* A place for messages and reports: "line 12" in the file compiled, "models/llama.shard:38" in an
 * imported one (stdlib files relative to the stdlib, others by base name). */
const char *partition_where(Arena *a, const Program *p, SrcLoc loc);

/* What partition_walk adds up (dry run) or inserted. */
typedef struct PartCost {
  double time_s;        /* collectives' time per step (loop bodies times their trips), ideal */
  double count;         /* collectives run per step */
  int errors;           /* reshapes that cannot keep a sharding */
} PartCost;

/* The cost of partitioning m with the shardings and plans propagation left on it, without changing
 * it: the objective propagation minimises. */
PartCost partition_cost(const IrModule *m, const Program *p);

/* partition_cost kept up to date as shardings change (propagation's search): a ledger of each op
 * of main's collectives (a loop with its body is one op; main's outputs one more) and of the
 * reshards they ask for, each distinct one charged once as the walk's cache does. After shardings
 * or plans change, partition_ledger_update walks again only the ops listed (those derived again:
 * their plans may have changed), and those that read or define a value listed (main's values
 * whose sharding changed; through renames too); partition_ledger_cost then equals partition_cost
 * of the module as it is (within rounding). */
typedef struct PartLedger PartLedger;
PartLedger *partition_ledger_new(IrModule *m, const Program *p);
void partition_ledger_update(PartLedger *L, Op *const *ops, int nops, Value *const *vals, int nvals);
PartCost partition_ledger_cost(const PartLedger *L);
long partition_ledger_walked(const PartLedger *L); /* ops walked since created (statistics) */
/* What the units before `op` (in the walk's order) are charged: their own collectives, and each
 * reshard one of them asks for, once; a lower bound on the total that depends on nothing after
 * op. NULL for op: the total. */
double partition_ledger_bound_before(const PartLedger *L, const Op *op);
bool partition_ledger_bound_audit(const PartLedger *L); /* the above against a sum unit by unit (tests) */
/* A trial: updates after begin are undone by rollback (the figures and keys put back as they were
 * at begin, exactly), or kept by commit. */
void partition_ledger_begin(PartLedger *L);
void partition_ledger_rollback(PartLedger *L);
void partition_ledger_commit(PartLedger *L);
void partition_ledger_free(PartLedger *L);

/* Inserts the collectives into m (every function and loop body), records each one's reason, and
 * reports located errors (a reshape that cannot keep its operand's sharding) and warnings (a
 * written type that forces a sharded value replicated). Ops already partitioned are skipped, so it
 * can run again after more ops are appended (propagate them first: propagate_module then keeps
 * every sharding already decided). Run it after anything that re-propagates the module under a
 * changed program (memory_suggest): a partitioned module's shardings no longer change. Returns
 * false if it reported an error. */
bool partition_module(IrModule *m, const Program *p);

/* What the partitioned IR means (for the lowering, the interpreter and the cost model):
 *   - every value is held per device as its local shard (Value.sharding); a value partial over X
 *     holds, on each device, one term of a sum over the devices of X (partial_max: of a max);
 *   - an op computes on its operands' local shards, sliced locally where Op.in_shard says so (a
 *     device takes its block of a dim along the extra axes); a summed dim that is sharded (a
 *     contraction, sum, mean, take's rows) leaves the result partial over its axes: OP_MEAN divides
 *     by the dim's global size, so that the partial results add up to the mean; OP_TAKE gathers
 *     only the rows its device holds (zeros elsewhere);
 *   - softmax / rmsnorm / layernorm over a sharded dim never occur: partition rewrites them into
 *     their statistics form (primitive ops and AllReduces; rmsnorm and layernorm with epsilon
 *     1e-5); so are their gradients and cross_entropy(_grad) (OP_PICK: each device picks the
 *     labels' logits from its block, a partial sum; OP_ONEHOT: each device makes its block);
 *   - the training ops pass partial sums through the operand they are linear in (the incoming
 *     gradient); take_grad and attention_grad's dk, dv sum over their positions (partial where
 *     sharded); take_grad with a row-sharded result scatters into the rows its device holds;
 *   - zeros (a constant 0, or its broadcast) may be declared partial over any axes: a step's
 *     microbatch accumulators start so;
 *   - a loop's stacked result is its body outputs stacked, the stacking dim sharded over the loop's
 *     stage axes (a pipeline's, or none); a train step's backward loop over a pipeline runs the
 *     stages in reverse, its CollectivePermute handing the carried gradient to the previous one. */

/* The pipeline of m's stacked loop, if its stacked params shard the stacking dim (layers@stage):
 * the first such loop in main or in a loop body (a step's microbatch loop holds it). */
typedef struct Pipeline {
  const Op *loop;
  uint16_t axes;        /* the stage axes */
  int64_t stages;       /* product of their sizes */
  int64_t layers;       /* the loop's trips */
} Pipeline;
bool partition_pipeline(const IrModule *m, Pipeline *out);
/* A loop's stage axes: its stacked slices' leading-dim axes (none: not a pipeline). A step's
 * backward loop over the same layers is pipelined over the same stages, in reverse. */
uint16_t partition_stage_axes(const Op *loop);

#endif
