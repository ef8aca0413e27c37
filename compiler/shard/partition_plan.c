/* partition_plan.c: what an op needs of its operands' shardings (no IR changes; see partition.h).
 *
 * In: an op, its operands' shardings and optionally the sharding its result must have. Out: an
 * OpPlan: the mesh axes each factor of the op (each named dim it touches) runs over, hence the
 * sharding each operand must be brought to, the result's natural sharding (possibly a partial
 * sum), and the op's own collectives (the AllReduce after a max or of a softmax's statistics over
 * a sharded dim); plus the collectives that turn one sharding into another (reshard_plan).
 *
 * Named dims make this factor-based (as Shardy's sharding rules are): a factor is a named dim; an
 * elementwise op, a rename or a transpose keeps it; a contraction keeps the dims it does not
 * contract and sums over the others; reductions sum (or max) over theirs. A sharded summed factor
 * leaves the result an unreduced partial sum over its axes; partition.c reduces it where a
 * consumer is not linear. The four sharded-matmul cases of hardware-and-costs.md come out of the
 * rule in plan_op:
 *   1. contracted dim unsharded: the factors follow the operands, no communication;
 *   2. one input sharded on the contracted dim: that factor gets no axes, the input is gathered;
 *   3. both sharded on it alike: the factor keeps the axes, the result is a partial sum;
 *   4. one axis proposed for two factors (both inputs shard a non-contracted dim over it): a
 *      conflict, decided by cost between gathering one input or the other. */
#include <math.h>
#include <string.h>

#include "partition.h"

/* ---- shardings ---- */

static uint16_t bit(int a) { return (uint16_t)(1u << a); }

static uint16_t dim_mask(const Sharding *s, int d) {
  uint16_t m = 0;
  for (int k = 0; k < s->naxes[d] && k < MAX_AXES_PER_DIM; k++) m |= bit(s->axes[d][k]);
  return m;
}

static uint16_t axes_mask(const int8_t *ax, int n) {
  uint16_t m = 0;
  for (int k = 0; k < n; k++) m |= bit(ax[k]);
  return m;
}

uint16_t sharding_axes_used(const Sharding *s, int rank) {
  uint16_t m = 0;
  for (int d = 0; d < rank; d++) m |= dim_mask(s, d);
  return m;
}

int64_t sharding_axes_product(const Mesh *m, uint16_t axes) {
  int64_t n = 1;
  for (int a = 0; m && a < m->naxes; a++)
    if (axes & bit(a)) n *= m->axes[a].size;
  return n;
}

static int64_t tuple_product(const Mesh *m, const int8_t *ax, int n) {
  int64_t p = 1;
  for (int k = 0; k < n; k++) p *= m->axes[ax[k]].size;
  return p;
}

static bool dim_equal(const Sharding *a, int da, const Sharding *b, int db) {
  if (a->naxes[da] != b->naxes[db]) return false;
  for (int k = 0; k < a->naxes[da]; k++)
    if (a->axes[da][k] != b->axes[db][k]) return false;
  return true;
}

bool sharding_equal(const Sharding *a, const Sharding *b, int rank) {
  if (a->partial != b->partial) return false;
  for (int d = 0; d < rank; d++)
    if (!dim_equal(a, d, b, d)) return false;
  return true;
}

/* True when dim da of a is a prefix of dim db of b (a's axes, in order, start b's). */
static bool dim_prefix(const Sharding *a, int da, const Sharding *b, int db) {
  if (a->naxes[da] > b->naxes[db]) return false;
  for (int k = 0; k < a->naxes[da]; k++)
    if (a->axes[da][k] != b->axes[db][k]) return false;
  return true;
}

void sharding_layout_bound(const Program *p, const TensorType *t, Sharding *out, uint8_t *bound, bool warn) {
  layout_map_dims(p, (Dim *const *)t->dims, t->rank, out, NULL, warn);
  if (bound) {
    *bound = 0;
    for (int d = 0; d < t->rank; d++)
      if (out->naxes[d]) *bound |= (uint8_t)(1u << d);
  }
}

void sharding_layout_preferred(const Program *p, const TensorType *t, Sharding *out) {
  sharding_layout_bound(p, t, out, NULL, false);
}

/* ---- reshards ---- */

static void add_step(const Mesh *m, Reshard *r, CollKind kind, uint16_t axes, int dim, int dim2, double bytes,
                     const Sharding *before, const Sharding *after) {
  if (sharding_axes_product(m, axes) <= 1) return; /* axes of size 1: nothing moves */
  if (r->n == RESHARD_MAX_STEPS) return;
  ReshardStep *s = &r->step[r->n++];
  s->kind = kind;
  s->axes = axes;
  s->dim = dim;
  s->dim2 = dim2;
  s->bytes = bytes;
  CollCost cc;
  s->time_s = cost_collective(m, kind, axes, bytes, true, &cc);
  s->bytes_per_device = cc.bytes_per_device;
  s->before = *before;
  s->after = *after;
  r->time_s += s->time_s;
}

/* The one dim where a and b differ, or -1 when several (or none) do. */
static int changed_dim(const Sharding *a, const Sharding *b, int rank) {
  int d = -1;
  for (int i = 0; i < rank; i++) {
    if (dim_equal(a, i, b, i)) continue;
    if (d >= 0) return -1;
    d = i;
  }
  return d;
}

bool reshard_plan(const Mesh *m, const TensorType *t, const Sharding *from, const Sharding *to, Reshard *out) {
  memset(out, 0, sizeof *out);
  if (to->partial & ~from->partial) return false;
  int rank = t->rank;
  Sharding cur = *from;

  /* 1. Partial sums: a ReduceScatter onto every dim where `to` places a summed axis right after
   * the axes the dim already has (the fused form, half an AllReduce's bytes), an AllReduce over
   * the summed axes left. */
  uint16_t sum = cur.partial & ~to->partial;
  if (sum) {
    Sharding next = cur;
    uint16_t rs = 0;
    for (int j = 0; j < rank; j++) {
      if (!dim_prefix(&cur, j, to, j)) continue;
      int k = cur.naxes[j];
      while (k < to->naxes[j] && (sum & bit(to->axes[j][k])) && !(rs & bit(to->axes[j][k]))) {
        next.axes[j][k] = to->axes[j][k];
        rs |= bit(to->axes[j][k]);
        k++;
      }
      next.naxes[j] = (uint8_t)k;
    }
    if (rs) {
      next.partial &= (uint16_t)~rs;
      add_step(m, out, COLL_REDUCE_SCATTER, rs, changed_dim(&cur, &next, rank), -1,
               (double)sharding_local_bytes(t, &cur, m), &cur, &next);
      cur = next;
    }
    uint16_t ar = sum & (uint16_t)~rs;
    if (ar) {
      next = cur;
      next.partial &= (uint16_t)~ar;
      add_step(m, out, COLL_ALL_REDUCE, ar, -1, -1, (double)sharding_local_bytes(t, &cur, m), &cur, &next);
      cur = next;
    }
  }

  /* 2. Shards moving between dims: the minor-most extra axis of dim i that `to` wants next on
   * dim j is one AllToAll. */
  for (bool moved = true; moved;) {
    moved = false;
    for (int i = 0; i < rank && !moved; i++) {
      if (cur.naxes[i] == 0 || dim_prefix(&cur, i, to, i)) continue;
      int x = cur.axes[i][cur.naxes[i] - 1];
      for (int j = 0; j < rank && !moved; j++) {
        if (j == i || !dim_prefix(&cur, j, to, j) || cur.naxes[j] >= to->naxes[j]) continue;
        if (to->axes[j][cur.naxes[j]] != x || cur.naxes[j] >= MAX_AXES_PER_DIM) continue;
        Sharding next = cur;
        next.naxes[i]--;
        next.axes[j][next.naxes[j]++] = (int8_t)x;
        add_step(m, out, COLL_ALL_TO_ALL, bit(x), i, j, (double)sharding_local_bytes(t, &cur, m), &cur, &next);
        cur = next;
        moved = true;
      }
    }
  }

  /* 3. Axes dropped: every dim keeps the longest prefix it shares with `to`; one AllGather over
   * all the axes dropped (several axes are one collective). */
  Sharding next = cur;
  uint16_t gathered = 0;
  for (int i = 0; i < rank; i++) {
    int c = 0;
    while (c < cur.naxes[i] && c < to->naxes[i] && cur.axes[i][c] == to->axes[i][c]) c++;
    for (int k = c; k < cur.naxes[i]; k++) gathered |= bit(cur.axes[i][k]);
    next.naxes[i] = (uint8_t)c;
  }
  if (gathered) {
    add_step(m, out, COLL_ALL_GATHER, gathered, changed_dim(&cur, &next, rank), -1,
             (double)sharding_local_bytes(t, &next, m), &cur, &next);
    cur = next;
  }

  /* 4. Axes added: a local slice. */
  out->slices = !sharding_equal(&cur, to, rank);
  return true;
}

/* ---- op rules ---- */

typedef enum { PASS_NONE, PASS_UNARY, PASS_SAME, PASS_ONE, PASS_FIRST, PASS_LIN } PassRule;

typedef struct Rule {
  int nf;
  const Dim *fdim[PLAN_MAX_FACTORS];
  uint8_t fk[PLAN_MAX_FACTORS];
  int nopnd;
  int8_t omap[PLAN_MAX_OPERANDS][MAX_RANK]; /* operand dim -> factor */
  int8_t rmap[MAX_RANK];                    /* result dim -> factor */
  PassRule pass;
  int lin;      /* PASS_LIN: the one operand partial sums may pass through */
  bool sums;    /* FK_SUM factors leave a partial sum */
  int nstats;   /* AllReduces of statistics when the FK_STATS factor is sharded */
} Rule;

static int rule_factor(Rule *r, const Dim *d, FactorKind k) {
  for (int f = 0; f < r->nf; f++)
    if (r->fdim[f] == d) return f;
  if (r->nf == PLAN_MAX_FACTORS) return -1;
  r->fdim[r->nf] = d;
  r->fk[r->nf] = (uint8_t)k;
  return r->nf++;
}

static void rule_set_kind(Rule *r, const Dim *d, FactorKind k) {
  int f = rule_factor(r, d, k);
  if (f >= 0) r->fk[f] = (uint8_t)k;
}

/* Maps every dim of operand i to the factor of the same dim, `from[j] -> to[j]` renamed first. A
 * dim the rule does not know (none should exist) becomes a factor the op needs whole. */
static void rule_map_operand(Rule *r, const Op *op, int i, Dim *const *from, Dim *const *to, int nren) {
  const Value *v = op->operands[i];
  for (int d = 0; d < v->type.rank; d++) {
    const Dim *dim = v->type.dims[d];
    for (int j = 0; j < nren; j++)
      if (from[j] == dim) dim = to[j];
    int f = -1;
    for (int g = 0; g < r->nf; g++)
      if (r->fdim[g] == dim) f = g;
    if (f < 0) f = rule_factor(r, dim, FK_WHOLE);
    r->omap[i][d] = (int8_t)f;
  }
}

/* Operand dims the result lacks get `k` (a contraction's dims, attention_grad's summed dims), unless
 * the rule already gave them a kind. */
static void rule_missing_dims(Rule *r, const Op *op, int i, FactorKind k) {
  const Value *v = op->operands[i];
  const TensorType *rt = &op->results[0]->type;
  for (int d = 0; d < v->type.rank; d++) {
    const Dim *dim = v->type.dims[d];
    bool known = tensor_type_find(rt, dim) >= 0;
    for (int g = 0; g < r->nf && !known; g++) known = r->fdim[g] == dim;
    if (!known) rule_factor(r, dim, k);
  }
}

/* The ops with a factor rule. Forward ops: elementwise (a factor per dim, kept), contractions and
 * reductions (their summed dims), softmax and the norms (statistics over their dim), take (the
 * table's rows summed: a masked local gather), attention (head and key dims whole). Training ops
 * (autodiff.c, step.c) keep the dims of their forward counterparts:
 *   broadcast          x's dims kept; the added dims are the result's alone (a device makes its
 *                      block of them, no communication);
 *   relu/gelu/silu_grad, causal_grad, max_grad, sgd_update, adam_moment, adam_update, dropout
 *                      elementwise (max_grad's reduced dims kept: ties are counted per block);
 *   softmax_grad, rmsnorm_grad, layernorm_grad
 *                      statistics over dims[0], as their forward ops (1, 2 and 4 sums);
 *   take_grad          the index positions summed (a partial sum when sharded); the table's rows
 *                      are the result's alone: with a row-sharded table each device scatters into
 *                      the rows it holds;
 *   attention_grad     dims[0], dims[1] and the value's own dims whole (as the forward); the dims of
 *                      q its result lacks (the query dim, a group dim) summed;
 *   cross_entropy(_grad) statistics over the class dim: Megatron's vocab-parallel loss (3 small
 *                      AllReduces; the gradient reuses the cross entropy's logsumexp).
 * Routing (route.h): route needs its expert and token dims whole and makes its slot dim whole;
 * route_grad is a contraction whose mask operand has the result's dims. A dispatch or a combine
 * is an OP_CONTRACT, planned as one.
 * Partial sums pass through the operands an op is linear in (ops.def's lin, which interp_spmd.c
 * checks too), except where the plan reduces them first (causal, take, the statistics ops'
 * gradients, a widening cast). */
static bool rule_build(const Op *op, Rule *r) {
  memset(r, 0, sizeof *r);
  memset(r->omap, -1, sizeof r->omap);
  memset(r->rmap, -1, sizeof r->rmap);
  r->lin = -1;
  if (op->nresults != 1 || op->noperands > PLAN_MAX_OPERANDS) return false;
  const TensorType *rt = &op->results[0]->type;
  if (!ir_op_is_elementwise(op->kind)) switch (op->kind) { /* elementwise ops: a factor per dim, generic */
  case OP_CAUSAL: case OP_CAST: case OP_TRANSPOSE: case OP_RENAME: case OP_SUM: case OP_MEAN: case OP_MAX:
  case OP_SOFTMAX: case OP_RMSNORM: case OP_LAYERNORM: case OP_TAKE: case OP_CONTRACT: case OP_ATTENTION:
  case OP_BROADCAST: case OP_RELU_GRAD: case OP_GELU_GRAD: case OP_SILU_GRAD: case OP_MAX_GRAD:
  case OP_SOFTMAX_GRAD: case OP_RMSNORM_GRAD: case OP_LAYERNORM_GRAD: case OP_TAKE_GRAD: case OP_CAUSAL_GRAD:
  case OP_ATTENTION_GRAD: case OP_CROSS_ENTROPY: case OP_CROSS_ENTROPY_GRAD: case OP_SGD_UPDATE:
  case OP_ADAM_MOMENT: case OP_ADAM_UPDATE: case OP_ROUTE: case OP_ROUTE_GRAD: case OP_DROPOUT:
    break; /* the other ops with a rule (below where their dims say more) */
  default: return false; /* none: leaves, regions, collectives, split, merge, pick, onehot, slice */
  }
  for (int d = 0; d < rt->rank; d++) r->rmap[d] = (int8_t)rule_factor(r, rt->dims[d], FK_KEEP);
  r->nopnd = op->noperands;
  Dim *ren_from[MAX_RANK], *ren_to[MAX_RANK];
  int nren = 0;
  /* partial sums pass through the operands the op is linear in (ops.def's lin) */
  int lin = ir_op_info(op->kind)->lin;
  switch ((OpLin)lin) {
  case LIN_SUM: r->pass = PASS_SAME; break;
  case LIN_ONE: r->pass = PASS_ONE; break;
  case LIN_FIRST: r->pass = PASS_FIRST; break;
  case LIN_0: r->pass = PASS_UNARY; break;
  case LIN_1: case LIN_2: r->pass = PASS_LIN, r->lin = lin; break;
  case LIN_NONE: break; /* the unary functions, the optimizer, ... */
  }
  /* what each op's dims say (its factors' kinds): the rules differ op by op */
  switch (op->kind) {
  case OP_CAST: /* summing a widened value costs more bytes: reduce before widening; but a step's
                  * microbatch accumulation widens each microbatch's gradient to f32 and reduces
                  * the sum once, after its loop */
    r->pass = dtype_bytes(rt->dtype) > dtype_bytes(op->operands[0]->type.dtype) && op->phase != PHASE_ACCUMULATE
                  ? PASS_NONE : PASS_UNARY;
    break;
  case OP_CAUSAL: /* linear, but the plan reduces a partial operand first */
    r->pass = PASS_NONE;
    break;
  case OP_RENAME:
    for (int j = 0; j + 1 < op->ndims && nren < MAX_RANK; j += 2) {
      ren_from[nren] = op->dims[j];
      ren_to[nren++] = op->dims[j + 1];
    }
    break;
  case OP_SUM: case OP_MEAN:
    for (int j = 0; j < op->ndims; j++) rule_set_kind(r, op->dims[j], FK_SUM);
    r->sums = true;
    break;
  case OP_MAX:
    for (int j = 0; j < op->ndims; j++) rule_set_kind(r, op->dims[j], FK_MAX);
    break;
  case OP_SOFTMAX: case OP_RMSNORM: case OP_LAYERNORM:
    if (op->ndims > 0) rule_set_kind(r, op->dims[0], FK_STATS);
    r->nstats = op->kind == OP_RMSNORM ? 1 : 2; /* softmax: max and sum; layernorm: mean, variance */
    break;
  case OP_SOFTMAX_GRAD: case OP_RMSNORM_GRAD: case OP_LAYERNORM_GRAD:
    if (op->ndims > 0) rule_set_kind(r, op->dims[0], FK_STATS);
    /* softmax_grad: sum(dy y); rmsnorm_grad: mean(x^2), mean(e xh); layernorm_grad: mean(x),
     * var(x), mean(e), mean(e xh) */
    r->nstats = op->kind == OP_SOFTMAX_GRAD ? 1 : op->kind == OP_RMSNORM_GRAD ? 2 : 4;
    r->pass = PASS_NONE; /* linear in dy, but the plan reduces a partial dy first */
    break;
  case OP_TAKE:
    if (op->noperands == 2 && op->operands[0]->type.rank > 0) {
      rule_set_kind(r, op->operands[0]->type.dims[0], FK_SUM); /* masked local gather of the rows held */
      r->sums = true;
    }
    r->pass = PASS_NONE; /* linear in the table, but the plan reduces a partial table first */
    break;
  case OP_TAKE_GRAD: /* (idx, dy): the positions summed; the table's rows are the result's own */
    for (int d = 0; d < op->operands[0]->type.rank; d++) rule_set_kind(r, op->operands[0]->type.dims[d], FK_SUM);
    r->sums = true;
    break;
  case OP_CONTRACT:
    for (int j = 0; j < op->ndims; j++) rule_set_kind(r, op->dims[j], FK_SUM);
    r->sums = true;
    break;
  case OP_ATTENTION:
    if (op->ndims > 0) rule_set_kind(r, op->dims[0], FK_WHOLE);
    if (op->ndims > 1) rule_set_kind(r, op->dims[1], FK_RING);
    break;
  case OP_ATTENTION_GRAD:
    if (op->ndims > 0) rule_set_kind(r, op->dims[0], FK_WHOLE);
    if (op->ndims > 1) rule_set_kind(r, op->dims[1], FK_RING);
    if (op->noperands == 5) {
      const TensorType *q = &op->operands[0]->type, *v = &op->operands[2]->type;
      for (int d = 0; d < v->rank; d++) /* the value's own dims: the forward's PV output dims */
        if (tensor_type_find(q, v->dims[d]) < 0 && v->dims[d] != op->dims[1]) rule_set_kind(r, v->dims[d], FK_WHOLE);
      rule_missing_dims(r, op, 0, FK_SUM); /* dk, dv: summed over the query dim (and groups) */
      rule_missing_dims(r, op, 1, FK_WHOLE);
      r->sums = true;
    }
    break;
  case OP_CROSS_ENTROPY: case OP_CROSS_ENTROPY_GRAD:
    /* the class dim sharded: local max, sum of exponentials and picked logits, all-reduced (3);
     * the gradient reuses the logsumexp its cross entropy kept (0) */
    if (op->ndims > 0) rule_set_kind(r, op->dims[0], FK_STATS);
    r->nstats = op->kind == OP_CROSS_ENTROPY ? 3 : 0;
    r->pass = PASS_NONE; /* (the gradient: linear in dl, but the plan reduces a partial dl first) */
    break;
  case OP_ROUTE: /* top-k along the expert dim, slots filled in order of the token dim (partition.c
                  * reports a token dim sharded where route reads it); the slot dim made whole */
    for (int j = 0; j < 3 && j < op->ndims; j++) rule_set_kind(r, op->dims[j], FK_WHOLE);
    break;
  case OP_ROUTE_GRAD: /* a contraction at the pattern's entries: its mask keeps the result's dims */
    for (int j = 0; j < op->ndims; j++) rule_set_kind(r, op->dims[j], FK_SUM);
    r->sums = true;
    break;
  default: break; /* elementwise: a factor per dim, kept */
  }
  for (int i = 0; i < op->noperands; i++) rule_map_operand(r, op, i, ren_from, ren_to, nren);
  for (int d = 0; d < rt->rank; d++)
    if (r->rmap[d] < 0) return false; /* more distinct dims than the table holds: no plan */
  for (int i = 0; i < op->noperands; i++)
    for (int d = 0; d < op->operands[i]->type.rank; d++)
      if (r->omap[i][d] < 0) return false;
  return true;
}

/* Operand partial axes the op passes through to its result: every operand alike for add/sub (a
 * constant or an unreduced operand breaks it), exactly one operand for mul and contract (the
 * numerator for div), the operand of a linear unary op. 0: reduce every partial operand first. */
static uint16_t rule_passed(const Rule *r, const Sharding *const *opnd, int n) {
  switch (r->pass) {
  case PASS_NONE: return 0;
  case PASS_UNARY: return opnd[0]->partial;
  case PASS_SAME: {
    for (int i = 1; i < n; i++)
      if (opnd[i]->partial != opnd[0]->partial) return 0;
    return opnd[0]->partial;
  }
  case PASS_LIN:
    for (int i = 0; i < n; i++)
      if (i != r->lin && opnd[i]->partial) return 0;
    return r->lin >= 0 && r->lin < n ? opnd[r->lin]->partial : 0;
  case PASS_ONE: case PASS_FIRST: {
    int who = -1;
    for (int i = 0; i < n; i++) {
      if (!opnd[i]->partial) continue;
      if (who >= 0) return 0;
      who = i;
    }
    if (who < 0 || (r->pass == PASS_FIRST && who != 0)) return 0;
    return opnd[who]->partial;
  }
  }
  return 0;
}

static bool operand_keeps_partial(const Rule *r, const Sharding *s, uint16_t passed) {
  return passed && s->partial == passed && r->pass != PASS_NONE;
}

/* ---- the planner ---- */

#define MAX_PROPS 6
typedef struct Proposal {
  int8_t ax[MAX_AXES_PER_DIM];
  uint8_t n;
  uint16_t mask;
  int8_t src, src_dim;    /* operand (-1: the result's target) and its dim */
} Proposal;

typedef struct Cand {
  bool valid;
  int8_t ax[PLAN_MAX_FACTORS][MAX_AXES_PER_DIM];
  uint8_t nax[PLAN_MAX_FACTORS];
  int8_t src[PLAN_MAX_FACTORS], src_dim[PLAN_MAX_FACTORS];
  Sharding req[PLAN_MAX_OPERANDS];
  Sharding natural;
  Sharding result;   /* natural, or the target resolved against it */
  uint16_t made, maxax, statsax;
  int stats_factor;
  double time_s;     /* the op's collectives (exact part) */
  double choose_s;   /* time_s plus the estimated later reduction of a new partial sum */
  int ncoll;
  double bytes;      /* bytes per device its collectives send (the plan-choice rule's third key) */
  int layout_score;
  uint16_t ring;     /* ring attention over these axes (FK_RING sharded), or 0 */
  int kept_broken;   /* operands (or the result) losing an axis PlanCtx.keep says they keep */
} Cand;

/* The stats tensor of an op over factor f: the result without that dim, in f32. */
static double stats_bytes(const Mesh *m, const TensorType *rt, const Sharding *nat, const Dim *d) {
  TensorType t = {.dtype = DT_F32, .rank = 0};
  Sharding s;
  memset(&s, 0, sizeof s);
  for (int i = 0; i < rt->rank; i++) {
    if (rt->dims[i] == d) continue;
    t.dims[t.rank] = rt->dims[i];
    s.naxes[t.rank] = nat->naxes[i];
    memcpy(s.axes[t.rank], nat->axes[i], sizeof s.axes[i]);
    t.rank++;
  }
  return (double)sharding_local_bytes(&t, &s, m);
}

/* Axes a value sharded `from` loses on some dim when resharded `to` (gathered, or moved to
 * another dim). */
static uint16_t axes_lost(const Sharding *from, const Sharding *to, int rank) {
  uint16_t lost = 0;
  for (int d = 0; d < rank; d++) lost |= (uint16_t)(dim_mask(from, d) & ~dim_mask(to, d));
  return lost;
}

/* Whether operand i (a weight keeping the axes `keep`) resharded from `from` to `to` gives up tensor
 * parallelism: it loses a kept axis on a dim the op contracts (the row-parallel matmul's partial
 * sums), or on a dim the result keeps where the target shards that dim over the same axis (the
 * column-parallel matmul's output, produced by gathering the weight and moving the result). A weight
 * gathered on a dim whose result the target holds otherwise is matmul case 4's cheaper gather. */
static bool keep_broken(const Rule *r, int i, const Value *v, const Sharding *from, const Sharding *to,
                        const PlanTarget *target, uint16_t keep) {
  for (int d = 0; d < v->type.rank; d++) {
    uint16_t lost = (uint16_t)(dim_mask(from, d) & ~dim_mask(to, d) & keep);
    int f = r->omap[i][d];
    if (!lost || f < 0) continue;
    if (r->fk[f] == FK_SUM) return true;
    for (int e = 0; target && e < MAX_RANK && r->rmap[e] >= 0; e++)
      if (r->rmap[e] == f && !(target->open & (1u << e)) && (dim_mask(&target->s, e) & lost)) return true;
  }
  return false;
}

/* language.md: the ring is the layout's: it maps the query dim to `ring` and none of q's other
 * dims (heads, head, a group) to any of those axes (where it maps heads there, attention runs in
 * the Ulysses form instead: AllToAlls from sequence to heads and back). */
static bool ring_by_layout(const Program *p, const Op *op, uint16_t ring) {
  if (op->ndims < 3 || op->noperands < 1) return false;
  const TensorType *qt = &op->operands[0]->type;
  Sharding pref;
  sharding_layout_preferred(p, qt, &pref);
  for (int d = 0; d < qt->rank; d++) {
    uint16_t ax = dim_mask(&pref, d);
    if (qt->dims[d] == op->dims[2] ? ax != ring : (ax & ring) != 0) return false;
  }
  return true;
}

/* The ring of one ring-attention op: n - 1 CollectivePermute steps of the blocks that travel.
 * The forward sends K and V; the backward's first op (dq, Op.index 0) carries the backward ring,
 * K, V and their gradients (the three gradient ops are one kernel: dk and dv add nothing). */
static double ring_seconds(const Mesh *m, const Op *op, const Sharding *const *opnd, uint16_t ring) {
  if (op->kind == OP_ATTENTION_GRAD && op->index != 0) return 0;
  const Value *k = op->operands[1], *v = op->operands[2];
  CollCost step; /* cost.h's ring: the one formula (partition.c, explain and the simulator call it too) */
  int steps = cost_ring(m, ring, (double)sharding_local_bytes(&k->type, opnd[1], m), (double)sharding_local_bytes(&v->type, opnd[2], m),
                        op->kind == OP_ATTENTION_GRAD, true, &step);
  return steps * step.time_s;
}

static double reshard_bytes(const Reshard *rs) {
  double b = 0;
  for (int i = 0; i < rs->n; i++) b += rs->step[i].bytes_per_device;
  return b;
}

static void cand_eval(const PlanCtx *c, const Op *op, const Rule *r, const Sharding *const *opnd, uint16_t passed,
                      const PlanTarget *target, const Sharding *pref, Cand *k) {
  const Mesh *m = c->mesh;
  const TensorType *rt = &op->results[0]->type;
  k->time_s = k->choose_s = 0;
  k->ncoll = 0;
  k->bytes = 0;
  k->kept_broken = 0;
  for (int i = 0; i < r->nopnd; i++) {
    const Value *v = op->operands[i];
    Sharding *q = &k->req[i];
    memset(q, 0, sizeof *q);
    for (int d = 0; d < v->type.rank; d++) {
      int f = r->omap[i][d];
      if (f < 0) continue;
      q->naxes[d] = k->nax[f];
      memcpy(q->axes[d], k->ax[f], sizeof q->axes[d]);
    }
    if (operand_keeps_partial(r, opnd[i], passed)) q->partial = passed;
    Reshard rs;
    if (!reshard_plan(m, &v->type, opnd[i], q, &rs)) {
      k->valid = false;
      return;
    }
    k->time_s += rs.time_s;
    k->ncoll += rs.n;
    k->bytes += reshard_bytes(&rs);
    if (c->keep && v->id < c->nkeep && (axes_lost(opnd[i], q, v->type.rank) & c->keep[v->id]) &&
        keep_broken(r, i, v, opnd[i], q, target, c->keep[v->id]))
      k->kept_broken++;
  }
  Sharding *nat = &k->natural;
  memset(nat, 0, sizeof *nat);
  for (int d = 0; d < rt->rank; d++) {
    int f = r->rmap[d];
    nat->naxes[d] = k->nax[f];
    memcpy(nat->axes[d], k->ax[f], sizeof nat->axes[d]);
  }
  k->made = k->maxax = k->statsax = 0;
  k->stats_factor = -1;
  for (int f = 0; f < r->nf; f++) {
    uint16_t mk = axes_mask(k->ax[f], k->nax[f]);
    if (!mk) continue;
    if (r->fk[f] == FK_SUM && r->sums) k->made |= mk;
    if (r->fk[f] == FK_MAX) k->maxax |= mk;
    if (r->fk[f] == FK_STATS) k->statsax |= mk, k->stats_factor = f;
  }
  if (k->ring) { /* the ring sums over every query block itself: no partial sum over its axes */
    k->made &= (uint16_t)~k->ring;
    k->time_s += ring_seconds(m, op, opnd, k->ring);
    k->ncoll++;
  }
  nat->partial = (uint16_t)(passed | k->made);
  if (k->maxax && sharding_axes_product(m, k->maxax) > 1) {
    CollCost cc;
    k->time_s += cost_collective(m, COLL_ALL_REDUCE, k->maxax, (double)sharding_local_bytes(rt, nat, m), true, &cc);
    k->ncoll++;
    k->bytes += cc.bytes_per_device;
  }
  if (k->statsax && sharding_axes_product(m, k->statsax) > 1) {
    double b = stats_bytes(m, rt, nat, r->fdim[k->stats_factor]);
    CollCost cc;
    k->time_s += r->nstats * cost_collective(m, COLL_ALL_REDUCE, k->statsax, b, true, &cc);
    k->ncoll += r->nstats;
    k->bytes += r->nstats * cc.bytes_per_device;
  }
  k->choose_s = k->time_s;
  if (op->kind == OP_CROSS_ENTROPY && op->phase == PHASE_LOSS && !k->statsax && op->ndims > 0) {
    /* a train step's loss: gathering the logits leaves the gradient, which reads them sharded, to
     * make the statistics the vocab-parallel form would have kept (2 more AllReduces) */
    int cd = tensor_type_find(&op->operands[0]->type, op->dims[0]);
    uint16_t ax = cd >= 0 ? dim_mask(opnd[0], cd) : 0;
    if (ax && sharding_axes_product(m, ax) > 1)
      k->choose_s += 2 * cost_collective(m, COLL_ALL_REDUCE, ax, stats_bytes(m, rt, nat, op->dims[0]), true, NULL);
  }
  const Value *res = op->results[0];
  if (target && c->keep && res->id < c->nkeep && (axes_lost(nat, &target->s, rt->rank) & c->keep[res->id]))
    k->kept_broken++;
  if (target) {
    plan_target_resolve(target, nat, rt->rank, &k->result);
    Reshard rs;
    if (!reshard_plan(m, rt, nat, &k->result, &rs)) {
      k->valid = false;
      return;
    }
    k->time_s += rs.time_s;
    k->choose_s += rs.time_s;
    k->ncoll += rs.n;
    k->bytes += reshard_bytes(&rs);
  } else {
    k->result = *nat;
  }
  uint16_t left = (uint16_t)(k->made & k->result.partial);
  if (left && (!target || target->defer) && sharding_axes_product(m, left) > 1) {
    /* a new partial sum is reduced somewhere later: count its AllReduce when choosing */
    CollCost cc;
    k->choose_s += cost_collective(m, COLL_ALL_REDUCE, left, (double)sharding_local_bytes(rt, &k->result, m), true, &cc);
    k->ncoll++;
    k->bytes += cc.bytes_per_device;
  }
  k->layout_score = 0;
  for (int d = 0; d < rt->rank; d++) k->layout_score += dim_equal(nat, d, pref, d);
  k->valid = true;
}

/* Strictly better: fewer kept weight shardings broken (PlanCtx.keep), then ring attention where
 * it is possible, then less time (beyond rounding), then fewer collectives, then fewer bytes per
 * device (beyond rounding), then closer to the layout (language.md, Choosing a plan). */
static bool cand_better(const Cand *a, const Cand *b) {
  if (a->kept_broken != b->kept_broken) return a->kept_broken < b->kept_broken;
  /* language.md: where the query and key dims share axes, attention runs as a ring */
  if ((a->ring != 0) != (b->ring != 0)) return a->ring != 0;
  double eps = 1e-12 + 1e-9 * fmax(a->choose_s, b->choose_s);
  if (a->choose_s < b->choose_s - eps) return true;
  if (a->choose_s > b->choose_s + eps) return false;
  if (a->ncoll != b->ncoll) return a->ncoll < b->ncoll;
  double beps = 1e-9 * fmax(a->bytes, b->bytes);
  if (a->bytes < b->bytes - beps) return true;
  if (a->bytes > b->bytes + beps) return false;
  return a->layout_score > b->layout_score;
}

static void add_proposal(Proposal *props, int *n, const int8_t *ax, int nax, int src, int src_dim) {
  if (nax <= 0) return;
  for (int i = 0; i < *n; i++) {
    if (props[i].n != nax) continue;
    if (memcmp(props[i].ax, ax, (size_t)nax) == 0) return;
  }
  if (*n == MAX_PROPS) return;
  Proposal *p = &props[(*n)++];
  memset(p, 0, sizeof *p);
  memcpy(p->ax, ax, (size_t)nax);
  p->n = (uint8_t)nax;
  p->mask = axes_mask(ax, nax);
  p->src = (int8_t)src;
  p->src_dim = (int8_t)src_dim;
}

static void remove_proposal(Proposal *props, int *n, int i) {
  memmove(&props[i], &props[i + 1], sizeof *props * (size_t)(*n - i - 1));
  (*n)--;
}

#define MAX_CANDIDATES 4096

void plan_target_resolve(const PlanTarget *t, const Sharding *nat, int rank, Sharding *out) {
  *out = t->s;
  uint16_t used = 0;
  for (int d = 0; d < rank; d++)
    if (!(t->open & (1u << d))) used |= dim_mask(&t->s, d);
  for (int d = 0; d < rank; d++) {
    if (!(t->open & (1u << d))) continue;
    int k = 0;
    while (k < nat->naxes[d] && !(used & bit(nat->axes[d][k]))) k++; /* up to the first axis taken */
    memcpy(out->axes[d], nat->axes[d], sizeof out->axes[d]);
    memset(out->axes[d] + k, 0, sizeof out->axes[d] - (size_t)k);
    out->naxes[d] = (uint8_t)k;
    used |= dim_mask(out, d);
  }
  if (t->defer) out->partial = (uint16_t)(nat->partial & ~used);
}

bool plan_op(const PlanCtx *c, const Op *op, const Sharding *const *operands, const PlanTarget *target,
             OpPlan *out) {
  memset(out, 0, sizeof *out);
  out->reshape_bad_dim = -1;
  out->stats_factor = -1;
  out->alt_time_s = -1;
  Rule r;
  if (!rule_build(op, &r)) return false;
  const Mesh *m = c->mesh;
  const TensorType *rt = &op->results[0]->type;
  Sharding pref;
  sharding_layout_preferred(c->p, rt, &pref);
  uint16_t passed = rule_passed(&r, operands, r.nopnd);

  /* proposals: what the operands (then the result's target) say about each factor */
  Proposal props[PLAN_MAX_FACTORS][MAX_PROPS];
  int nprop[PLAN_MAX_FACTORS] = {0};
  uint16_t proposed[PLAN_MAX_FACTORS] = {0};
  if (r.nf > PLAN_MAX_FACTORS) return false;
  uint8_t why[PLAN_MAX_FACTORS] = {0};
  for (int i = 0; i < r.nopnd; i++) {
    const Value *v = op->operands[i];
    for (int d = 0; d < v->type.rank; d++) {
      int f = r.omap[i][d];
      if (f >= 0) add_proposal(props[f], &nprop[f], operands[i]->axes[d], operands[i]->naxes[d], i, d);
    }
  }
  if (target)
    for (int d = 0; d < rt->rank; d++)
      if (!(target->open & (1u << d)))
        add_proposal(props[r.rmap[d]], &nprop[r.rmap[d]], target->s.axes[d], target->s.naxes[d], -1, d);
  for (int f = 0; f < r.nf; f++) {
    for (int i = 0; i < nprop[f]; i++) proposed[f] |= props[f][i].mask;
    if (nprop[f]) why[f] = WHY_AGREED;
    for (int i = 0; i < nprop[f];) {
      Proposal *p = &props[f][i];
      uint8_t w = 0;
      if (r.fk[f] == FK_WHOLE) w = WHY_WHOLE;
      else if (p->mask & (c->blocked | passed)) w = WHY_BLOCKED;
      else if (!layout_dim_deals(c->p, r.fdim[f], tuple_product(m, p->ax, p->n))) w = WHY_INDIVISIBLE;
      if (w) {
        why[f] = w;
        remove_proposal(props[f], &nprop[f], i);
      } else {
        i++;
      }
    }
    /* matmul case 2: a contracted dim keeps axes only where both operands shard it alike; where
     * both shard it, over tuples that start alike (batch@data in one, batch@(data, ep) in the
     * other), it keeps their common prefix (the rest is gathered, or moved to another dim) */
    if (op->kind == OP_CONTRACT && r.fk[f] == FK_SUM && nprop[f] > 0) {
      bool both = true;
      for (int i = 0; both && i < r.nopnd; i++) {
        const Value *v = op->operands[i];
        for (int d = 0; d < v->type.rank; d++)
          if (r.omap[i][d] == f && operands[i]->naxes[d] == 0) both = false;
      }
      int common = both ? props[f][0].n : 0;
      for (int i = 1; i < nprop[f]; i++) {
        int c = 0;
        while (c < common && c < props[f][i].n && props[f][i].ax[c] == props[f][0].ax[c]) c++;
        common = c;
      }
      if (common > 0 && nprop[f] > 1 && r.fdim[f]->size % tuple_product(m, props[f][0].ax, common) == 0) {
        props[f][0].n = (uint8_t)common;
        props[f][0].mask = axes_mask(props[f][0].ax, common);
        nprop[f] = 1;
      } else if (!both || nprop[f] > 1) {
        nprop[f] = 0;
        why[f] = WHY_CASE2;
      }
    }
  }

  /* a proposal of several axes whose minor ones another factor is proposed also offers its prefix
   * without them: batch@(data, ep) can keep data while ep moves to the experts (one AllToAll,
   * expert parallelism's), rather than lose both */
  for (int f = 0; f < r.nf; f++) {
    int n0 = nprop[f];
    for (int i = 0; i < n0; i++) {
      Proposal p = props[f][i];
      uint16_t other = 0;
      for (int g = 0; g < r.nf; g++)
        for (int j = 0; g != f && j < nprop[g]; j++) other |= props[g][j].mask;
      int n = p.n;
      while (n > 1 && (other & bit(p.ax[n - 1]))) n--;
      if (n < p.n && r.fdim[f]->size % tuple_product(m, p.ax, n) == 0)
        add_proposal(props[f], &nprop[f], p.ax, n, p.src, p.src_dim);
    }
  }

  /* contested factors: several proposals, one axis proposed for two factors, or a max / norm
   * over a sharded dim (a local reduction plus an AllReduce, or a gather: cost decides) */
  bool contested[PLAN_MAX_FACTORS] = {0};
  for (int f = 0; f < r.nf; f++) {
    if (nprop[f] >= 2) contested[f] = true;
    if (nprop[f] >= 1 && (r.fk[f] == FK_MAX || r.fk[f] == FK_STATS)) contested[f] = true;
    for (int g = 0; g < r.nf; g++)
      if (g != f && nprop[f] && nprop[g] && (props[f][0].mask & props[g][0].mask)) contested[f] = true;
  }
  int ncand[PLAN_MAX_FACTORS];
  long total = 1;
  for (int f = 0; f < r.nf; f++) {
    ncand[f] = contested[f] ? nprop[f] + 1 : 1;
    if (total * ncand[f] > MAX_CANDIDATES) { /* too many: keep this factor's first choice */
      contested[f] = false;
      ncand[f] = 1;
    }
    total *= ncand[f];
  }

  Cand best = {0}, alt = {0}, k;
  bool have = false, have_alt = false;
  int nconflict = 0;
  for (int f = 0; f < r.nf; f++) nconflict += contested[f];
  for (long idx = 0; idx < total; idx++) {
    memset(&k, 0, sizeof k);
    long rest = idx;
    uint16_t used = passed;
    bool ok = true;
    for (int f = 0; f < r.nf && ok; f++) {
      int ch = (int)(rest % ncand[f]);
      rest /= ncand[f];
      k.src[f] = -2;
      if (ch < nprop[f]) { /* the last choice of a contested factor is "no axes" */
        const Proposal *p = &props[f][ch];
        if (r.fk[f] != FK_RING) { /* (a ring's key dim shares the query dim's axes: checked below) */
          if (used & p->mask) ok = false;
          used |= p->mask;
        }
        memcpy(k.ax[f], p->ax, sizeof k.ax[f]);
        k.nax[f] = p->n;
        k.src[f] = p->src;
        k.src_dim[f] = p->src_dim;
      }
    }
    if (!ok) continue;
    /* attention's key dim: whole, or on exactly the query dim's axes (a ring) */
    for (int f = 0; f < r.nf && ok; f++) {
      if (r.fk[f] != FK_RING || !k.nax[f]) continue;
      int q = -1;
      for (int g = 0; g < r.nf; g++)
        if (op->ndims > 2 && r.fdim[g] == op->dims[2]) q = g;
      ok = q >= 0 && k.nax[q] == k.nax[f] && memcmp(k.ax[q], k.ax[f], (size_t)k.nax[f]) == 0 &&
           ring_by_layout(c->p, op, axes_mask(k.ax[f], k.nax[f]));
      if (ok) k.ring = axes_mask(k.ax[f], k.nax[f]);
    }
    if (!ok) continue;
    cand_eval(c, op, &r, operands, passed, target, &pref, &k);
    if (!k.valid) continue;
    if (!have || cand_better(&k, &best)) {
      if (have && (!have_alt || cand_better(&best, &alt))) alt = best, have_alt = true;
      best = k;
      have = true;
    } else if (!have_alt || cand_better(&k, &alt)) {
      alt = k;
      have_alt = true;
    }
    if (out->nalts < PLAN_MAX_ALTS) {
      bool dup = false;
      for (int a = 0; a < out->nalts && !dup; a++) dup = sharding_equal(&out->alts[a], &k.natural, rt->rank);
      if (!dup) out->alts[out->nalts++] = k.natural;
    }
  }
  if (!have) { /* cannot happen: "no axes anywhere" is always valid; be safe */
    memset(&best, 0, sizeof best);
    cand_eval(c, op, &r, operands, 0, NULL, &pref, &best);
  }

  out->factored = true;
  out->nf = r.nf;
  out->nopnd = r.nopnd;
  for (int f = 0; f < r.nf; f++) {
    out->fdim[f] = r.fdim[f];
    out->fkind[f] = r.fk[f];
    memcpy(out->ax[f], best.ax[f], sizeof out->ax[f]);
    out->nax[f] = best.nax[f];
    out->src[f] = best.src[f];
    out->src_dim[f] = best.src_dim[f];
    out->why[f] = contested[f] ? WHY_CONFLICT : why[f];
    out->lost[f] = proposed[f] & (uint16_t)~axes_mask(best.ax[f], best.nax[f]);
  }
  memcpy(out->req, best.req, sizeof out->req);
  out->natural = best.natural;
  out->result = best.result;
  out->passed = passed;
  out->made_partial = best.made;
  out->max_axes = best.maxax;
  out->stats_axes = best.statsax;
  out->stats_factor = best.stats_factor;
  out->nstats = best.statsax ? r.nstats : 0;
  out->ring_axes = best.ring;
  out->conflict = nconflict > 0;
  out->time_s = best.time_s;
  if (have_alt && nconflict) out->alt_time_s = alt.choose_s;
  out->kept = have_alt && nconflict && alt.kept_broken > best.kept_broken && alt.choose_s < best.choose_s;
  return true;
}

/* ---- reshapes ---- */

/* The axes of one dim, major to minor, laid onto parts of sizes psize[] (a split): each axis goes
 * to the first part not yet fully split, which it must divide. */
static bool lay_onto_parts(const Mesh *m, const int8_t *ax, int nax, const int64_t *psize, int np,
                           int8_t (*out)[MAX_AXES_PER_DIM], uint8_t *nout) {
  int j = 0;
  int64_t rem = np > 0 ? psize[0] : 1;
  for (int i = 0; i < np; i++) nout[i] = 0;
  for (int k = 0; k < nax; k++) {
    int64_t sz = m->axes[ax[k]].size;
    while (rem == 1 && j + 1 < np) rem = psize[++j];
    if (np == 0 || rem % sz != 0 || nout[j] >= MAX_AXES_PER_DIM) return false;
    rem /= sz;
    out[j][nout[j]++] = ax[k];
  }
  return true;
}

/* Parts' axes joined into one dim (a merge): valid while no sharded part follows a part whose
 * local extent is above 1 (the device's block stays contiguous). A part sharded only over axes of
 * size 1 is not split at all: it keeps every block contiguous wherever it stands. *bad = the
 * offending part. */
static bool join_parts(const Mesh *m, int8_t (*ax)[MAX_AXES_PER_DIM], const uint8_t *nax, const int64_t *psize, int np,
                       int8_t *out, uint8_t *nout, int *bad) {
  bool spread = false;
  *nout = 0;
  for (int j = 0; j < np; j++) {
    if (tuple_product(m, ax[j], nax[j]) > 1 && spread) {
      *bad = j;
      return false;
    }
    for (int k = 0; k < nax[j]; k++) {
      if (*nout >= MAX_AXES_PER_DIM) {
        *bad = j;
        return false;
      }
      out[(*nout)++] = ax[j][k];
    }
    if (psize[j] / tuple_product(m, ax[j], nax[j]) > 1) spread = true;
  }
  return true;
}

/* Split: dims[0] -> dims[1..]; merge: dims[0..n-2] -> dims[n-1]. */
static void reshape_parts(const Op *op, const Dim **whole, const Dim **parts, int *np) {
  *np = 0;
  if (op->kind == OP_SPLIT) {
    *whole = op->ndims > 0 ? op->dims[0] : NULL;
    for (int j = 1; j < op->ndims && *np < MAX_RANK; j++) parts[(*np)++] = op->dims[j];
  } else {
    *whole = op->ndims > 0 ? op->dims[op->ndims - 1] : NULL;
    for (int j = 0; j + 1 < op->ndims && *np < MAX_RANK; j++) parts[(*np)++] = op->dims[j];
  }
}

/* Maps shardings between the reshape's two sides: `big` is the type holding `whole`, `small` the
 * type holding the parts; split = true lays whole's axes onto the parts, false joins them. */
static bool reshape_map(const Mesh *m, const Op *op, const TensorType *ti, const Sharding *in, const TensorType *to,
                        Sharding *out, bool split, int *bad_dim) {
  const Dim *whole, *parts[MAX_RANK];
  int np;
  reshape_parts(op, &whole, parts, &np);
  memset(out, 0, sizeof *out);
  out->partial = in->partial;
  *bad_dim = -1;
  int64_t psize[MAX_RANK];
  for (int j = 0; j < np; j++) psize[j] = parts[j]->size;
  for (int d = 0; d < ti->rank; d++) { /* dims the reshape does not touch */
    int e = tensor_type_find(to, ti->dims[d]);
    if (e < 0) continue;
    out->naxes[e] = in->naxes[d];
    memcpy(out->axes[e], in->axes[d], sizeof out->axes[e]);
  }
  if (split) {
    int w = tensor_type_find(ti, whole);
    if (w < 0) return true;
    int8_t pax[MAX_RANK][MAX_AXES_PER_DIM];
    uint8_t pn[MAX_RANK];
    if (!lay_onto_parts(m, in->axes[w], in->naxes[w], psize, np, pax, pn)) {
      *bad_dim = w;
      return false;
    }
    for (int j = 0; j < np; j++) {
      int e = tensor_type_find(to, parts[j]);
      if (e < 0) continue;
      out->naxes[e] = pn[j];
      memcpy(out->axes[e], pax[j], sizeof out->axes[e]);
    }
  } else {
    int8_t pax[MAX_RANK][MAX_AXES_PER_DIM];
    uint8_t pn[MAX_RANK];
    for (int j = 0; j < np; j++) {
      int e = tensor_type_find(ti, parts[j]);
      pn[j] = e < 0 ? 0 : in->naxes[e];
      if (e >= 0) memcpy(pax[j], in->axes[e], sizeof pax[j]);
    }
    int w = tensor_type_find(to, whole), bad = -1;
    int8_t wax[MAX_AXES_PER_DIM];
    uint8_t wn = 0;
    if (!join_parts(m, pax, pn, psize, np, wax, &wn, &bad)) {
      *bad_dim = tensor_type_find(ti, parts[bad]);
      return false;
    }
    if (w >= 0) {
      out->naxes[w] = wn;
      memcpy(out->axes[w], wax, wn);
    }
  }
  return true;
}

bool plan_reshape(const Mesh *m, const Op *op, const Sharding *in, Sharding *out, int *bad_dim) {
  int bad = -1;
  bool ok = reshape_map(m, op, &op->operands[0]->type, in, &op->results[0]->type, out, op->kind == OP_SPLIT, &bad);
  if (bad_dim) *bad_dim = bad;
  return ok;
}

bool plan_reshape_back(const Mesh *m, const Op *op, const Sharding *out, Sharding *in) {
  int bad;
  return reshape_map(m, op, &op->results[0]->type, out, &op->operands[0]->type, in, op->kind != OP_SPLIT, &bad);
}
