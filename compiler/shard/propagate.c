/* propagate.c: a sharding for every IR value (the rules are in propagate.h).
 *
 * Values fall in four kinds. FIXED: a written type decides (layout_apply), or, when the module was
 * partitioned already, the sharding it has. TIED: follows another value by structure: a loop
 * body's stacked-param slice (its stacked value minus the leading dim), a loop invariant (its
 * outer value), a loop's carried result (its carried body input). FREE: every other value: the
 * layout binds it (its `pref`, the dims a rule maps: `bound`), and derive() produces it so (its
 * op's plan with the value's target, value_target), the open dims and deferred partial sums as the
 * plan has them; a loop's stacked result takes its body output's, the stacking dim over the stage
 * axes. CONST: constants.
 *
 * derive() computes every FREE and TIED value from the FIXED ones, in program order, and leaves
 * each op's plan in Op.plan: under the binding that is all (P->bind). weigh() then, where asked,
 * runs the free search (P->bind false: FREE values are their op's natural result unless pinned):
 * search() tries pins and keeps those that make partition_cost() better. A trial derives again
 * only the units its pin reaches (derive_from), costs them in partition.c's ledger, and is undone
 * from what it saved; it stops where the units it settled already cost more than the best plan
 * (cannot_win), and the same pin is not tried again while nothing before that point changed
 * (known_to_lose). The search's result is weighed against the bound plan and put back (Snapshot).
 * Only pins persist between derivations, so the result depends on nothing but the IR, the program
 * and the (deterministic) order of the search. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "partition.h"
#include "propagate.h"
#include "step.h"

enum { V_FREE, V_FIXED, V_TIED, V_CONST };

#define MAX_ROUNDS 4
#define MAX_CANDS 24

typedef VEC(Value *) ValueVec;
typedef struct Use { Op *op; int operand; } Use;
typedef VEC(Use) UseVec;

/* plan_op memo: plan_op is a pure function of (program, mesh, blocked axes, op, its operands'
 * shardings, the target), so within a run each distinct call is computed once. The key holds the
 * full bytes of every sharding (a stricter key than needed: at worst a miss, never a wrong hit). */
typedef struct PlanKey {
  const Op *op;
  uint16_t blocked;
  uint8_t has_target, n;
  Sharding in[PLAN_MAX_OPERANDS];
  PlanTarget target;
} PlanKey;

typedef struct PlanEntry {
  PlanKey key;
  uint64_t hash;
  bool ok;
  OpPlan plan;
} PlanEntry;

/* The entry an op's own plan (Op.plan) was last copied from: a repeated call skips the copy; and
 * the one before (a trial's, or what the trial replaced): a search alternates between the two,
 * and finds the other here without a look-up in the whole memo. */
typedef struct LastPlan {
  const Op *op;
  const PlanEntry *e;
  const PlanEntry *alt; /* any entry or NULL: used only when its key matches */
} LastPlan;

typedef struct PlanMemo {
  PlanEntry **slot;     /* open addressing, power-of-two size */
  size_t cap, len;
  LastPlan *last;       /* open addressing by op, power-of-two size */
  size_t lcap, llen;
} PlanMemo;

/* What a trial derivation overwrote, to put back when its pin is rejected. */
typedef struct SavedValue {
  Value *v;
  Value old;
} SavedValue;

typedef struct SavedPlan {
  Op *op;
  const struct PlanEntry *last; /* the op's LastPlan entry then */
  OpPlan old;
} SavedPlan;

/* The units derivation is made of, in program order: every op of every function, a loop split
 * into its head (body inputs from its operands) and its tail (results from the body), its body's
 * units between them; and what a trial derivation changed. */
enum { UNIT_OP, UNIT_HEAD, UNIT_TAIL };

typedef struct UnitInfo {
  Op *op;
  uint8_t kind;         /* UNIT_* */
  uint16_t blocked;     /* the stage axes of the loops around it */
  int tail;             /* a head: its tail */
  int parent_head;      /* the head of the loop whose body holds it, or -1 (main) */
} UnitInfo;

typedef struct Units {
  UnitInfo *u;
  int n;
  int *of_value;        /* by value id: the unit deriving it (a body input: its loop's head), or -1 */
  int *tail_reads;      /* by value id: the tail reading it (a body's inputs and outputs), or -1 */
  int *done;            /* by unit: the pass that last derived a tail */
  int pass;
  const Op **key;       /* op -> unit, open addressing, power-of-two size */
  int *val;
  size_t cap;
  int *heap;            /* units to derive again, least first */
  int nheap;
  bool *queued;
  VEC(SavedValue) saved_v;
  VEC(SavedPlan) saved_p;
  VEC(Op *) trial_ops;  /* the units a trial derived again (the ledger walks them again) */
  VEC(Value *) trial_vals; /* scratch: values whose sharding changed, for the ledger */
  int acct_v, acct_ops; /* saved_v and trial_ops up to these are in the ledger already */
  bool flat;            /* main has no loop and no cross entropy: a trial may stop early (cannot_win) */
  int *stamp;           /* by value id: the trial that last listed it */
  int trial;
  bool *in_order;       /* by value id: a FREE value (the layout term counts it) */
  PartLedger *ledger;   /* the collectives' cost, op by op */
  int layout;           /* score's layout term, kept up to date */
  long derived;         /* units derived by trials (statistics) */
  long cut;             /* trials stopped early (statistics) */
  double bound;         /* the greatest lower bound cannot_win found on the trial's time, or 0 (the
                           audit checks it against the trial's time, derived to the end) */
  double cut_bound;     /* the last cut trial's: the bound it was stopped on, */
  int cut_at;           /* and the least unit queued then (every unit before it settled) */
  VEC(int) acc_from;    /* by pin accepted (in order): the least unit its trial derived again */
  long skipped;         /* trials known to lose without deriving (statistics) */
} Units;

/* A trial stopped early as unable to win (cannot_win), remembered for the next rounds: the same
 * pin loses again while nothing before `at` changed (see known_to_lose). */
typedef struct CutTrial {
  Sharding s;           /* the pin tried */
  int at;               /* Units.cut_at */
  long accepted;        /* pins accepted before it */
  double bound;         /* Units.cut_bound */
} CutTrial;
typedef VEC(CutTrial) CutVec;

typedef struct Prop {
  IrModule *m;
  const Program *p;
  const Mesh *mesh;
  Arena *a;             /* scratch for the run */
  Arena *plans;         /* Op.plan outlives the run: the module's arena */
  int nvalues;
  uint8_t *kind;        /* by value id */
  bool *pinned;
  Sharding *pin;
  Sharding *pref;       /* the layout's mapping of each value's dims */
  UseVec *uses;         /* by value id: the ops reading it */
  bool *is_output;      /* by value id: an output of its function */
  ValueVec order;       /* FREE values in program order: the search's order */
  PlanMemo memo;
  uint8_t *bound;       /* by value id: bit d where a layout rule maps dim d (pref holds its axes) */
  int8_t (*rule)[MAX_RANK]; /* by value id and dim: the layout rule that maps it, or -1 (origins) */
  uint16_t *keep;       /* by value id: the tensor-parallel axes a weight keeps (PlanCtx.keep) */
  Value **carry_in;     /* by value id: for a loop body's carried output made in the body, the carried
                           input it becomes (one sharding for every iteration: its target) */
  bool bind;            /* the layout binds every value (language.md); false: the free search's
                           derivation (propagate_weigh's alternative), every value its op's natural */
  Units units;          /* the search's incremental derivation (derive_from) */
} Prop;

typedef struct Score {
  int errors;
  double time_s, count;
  int layout;
} Score;

/* ---- origins ---- */

static void origin_clear(Value *v) {
  for (int d = 0; d < MAX_RANK; d++) {
    v->dim_src[d] = SHARD_FREE;
    v->dim_loc[d] = (SrcLoc){0};
  }
  v->partial_loc = (SrcLoc){0};
}

static void origin_copy_dim(Value *to, int dt, const Value *from, int df) {
  to->dim_src[dt] = from->dim_src[df];
  to->dim_loc[dt] = from->dim_loc[df];
}

/* ---- FIXED values ---- */

/* A written type's sharding, mapped by dim name onto the value's dim order. */
static void set_hard(Prop *P, Value *v) {
  memset(&v->sharding, 0, sizeof v->sharding);
  origin_clear(v);
  Sharding s;
  ShardOrigin o;
  if (!layout_apply(P->p, v->spec, &s, &o)) memset(&s, 0, sizeof s); /* a bad `@`: reported there */
  bool annotated = false;
  v->shard_loc = v->spec->loc;
  for (int i = 0; i < v->type.rank; i++)
    for (int j = 0; j < v->spec->rank; j++) {
      if (v->spec->dims[j] != v->type.dims[i]) continue;
      v->sharding.naxes[i] = s.naxes[j];
      memcpy(v->sharding.axes[i], s.axes[j], sizeof s.axes[j]);
      if (!s.naxes[j]) continue;
      v->dim_src[i] = o.kind[j] == ORIGIN_ANNOTATION ? SHARD_ANNOTATION : SHARD_LAYOUT;
      v->dim_loc[i] = o.loc[j];
      annotated |= o.kind[j] == ORIGIN_ANNOTATION;
    }
  v->shard_source = annotated ? SHARD_ANNOTATION : SHARD_LAYOUT;
}

/* ---- setup ---- */

static void note_value(Prop *P, Value *v, int kind) {
  if (!v || v->id < 0 || v->id >= P->nvalues) return;
  if (P->kind[v->id] == V_FIXED && kind != V_FIXED) return;
  P->kind[v->id] = (uint8_t)kind;
  sharding_layout_bound(P->p, &v->type, &P->pref[v->id], &P->bound[v->id], kind == V_FREE);
  memset(P->rule[v->id], -1, sizeof P->rule[v->id]);
  if (kind != V_FREE || !P->bound[v->id] || !P->p->layout) return;
  Sharding s;
  ShardOrigin o;
  layout_map_dims(P->p, (Dim *const *)v->type.dims, v->type.rank, &s, &o, false);
  for (int d = 0; d < v->type.rank && d < MAX_RANK; d++)
    for (int r = 0; o.kind[d] == ORIGIN_LAYOUT && r < P->p->layout->nrules && r < 127; r++) {
      SrcLoc l = P->p->layout->rules[r].loc;
      if (l.file == o.loc[d].file && l.line == o.loc[d].line && l.col == o.loc[d].col) P->rule[v->id][d] = (int8_t)r;
    }
}

/* A bound value's dims held as the layout maps them name the rule (explain's reasons). */
static void bound_origins(const Prop *P, Value *v) {
  if (!P->bind || v->id < 0 || v->id >= P->nvalues || P->kind[v->id] != V_FREE || !P->bound[v->id]) return;
  const Sharding *b = &P->pref[v->id];
  for (int d = 0; d < v->type.rank && d < MAX_RANK; d++) {
    int r = P->rule[v->id][d];
    if (r < 0 || !b->naxes[d] || v->sharding.naxes[d] != b->naxes[d] ||
        memcmp(v->sharding.axes[d], b->axes[d], b->naxes[d]) != 0)
      continue;
    v->dim_src[d] = SHARD_LAYOUT;
    v->dim_loc[d] = P->p->layout->rules[r].loc;
  }
}

static bool module_partitioned(const IrFunc *f) {
  for (const Op *op = f->first; op; op = op->next) {
    if (op->partitioned || ir_op_is_collective(op->kind)) return true;
    if (op->kind == OP_LOOP && op->body && module_partitioned(op->body)) return true;
  }
  return false;
}

/* The kind of every value of f (and of its loop bodies), hard shardings set, uses recorded. */
static void setup_func(Prop *P, IrFunc *f, bool incremental) {
  for (int i = 0; i < f->noutputs; i++)
    if (f->outputs[i] && f->outputs[i]->id < P->nvalues) P->is_output[f->outputs[i]->id] = true;
  for (Op *op = f->first; op; op = op->next) {
    for (int i = 0; i < op->noperands; i++) {
      Value *v = op->operands[i];
      if (v && v->id < P->nvalues) VEC_PUSH(P->a, P->uses[v->id], ((Use){op, i}));
    }
    if (op->kind == OP_LOOP && op->body) {
      IrFunc *b = op->body;
      for (int r = 0; r < op->ncarried && r < b->noutputs && op->nslices + r < b->ninputs; r++) {
        Value *out = b->outputs[r];
        if (out && out->def && out->def->func == b && out->id < P->nvalues && !P->carry_in[out->id])
          P->carry_in[out->id] = b->inputs[op->nslices + r];
      }
      for (int i = 0; i < b->ninputs; i++) {
        Value *in = b->inputs[i];
        bool carried = i >= op->nslices && i < op->nslices + op->ncarried;
        if (incremental && in->shard_source != SHARD_FREE) {
          note_value(P, in, V_FIXED);
        } else if (carried && in->spec) {
          note_value(P, in, V_FIXED);
          set_hard(P, in);
        } else if (carried) {
          note_value(P, in, V_FREE);
          VEC_PUSH(P->a, P->order, in);
        } else {
          note_value(P, in, V_TIED);
        }
      }
      setup_func(P, b, incremental);
    }
    if (op->kind == OP_ROUTE && op->noperands == 1 && op->ndims >= 2) {
      /* route reads its tokens dim whole (language.md, Routing): the logits are held so, whatever
       * the layout maps that dim to (gathered where they are made, not an error) */
      Value *l = op->operands[0];
      int d = tensor_type_find(&l->type, op->dims[1]);
      if (d >= 0 && l->id < P->nvalues && P->kind[l->id] == V_FREE) {
        P->pref[l->id].naxes[d] = 0;
        P->bound[l->id] |= (uint8_t)(1u << d);
      }
    }
    for (int r = 0; r < op->nresults; r++) {
      Value *v = op->results[r];
      if (!v) continue;
      if (incremental && v->shard_source != SHARD_FREE) {
        note_value(P, v, V_FIXED);
      } else if (op->kind == OP_CONST || (v->type.rank == 0 && op->noperands == 0)) {
        note_value(P, v, V_CONST);
      } else if (op->kind == OP_LOOP && r < op->ncarried) {
        note_value(P, v, V_TIED);
      } else if (op->kind == OP_LOOP) { /* a stacked result: free, its natural from the body */
        note_value(P, v, V_FREE);
        VEC_PUSH(P->a, P->order, v);
      } else if (v->spec) {
        note_value(P, v, V_FIXED);
        set_hard(P, v);
      } else if (ir_op_is_collective(op->kind)) {
        note_value(P, v, V_FIXED);
      } else {
        note_value(P, v, V_FREE);
        VEC_PUSH(P->a, P->order, v);
      }
      if (P->kind[v->id] == V_CONST) {
        memset(&v->sharding, 0, sizeof v->sharding);
        origin_clear(v);
        v->shard_source = SHARD_PROPAGATED;
      }
    }
  }
}

/* ---- derivation ---- */

static PlanCtx plan_ctx(const Prop *P, uint16_t blocked) {
  return (PlanCtx){.p = P->p, .mesh = P->mesh, .blocked = blocked, .keep = P->bind ? P->keep : NULL,
                   .nkeep = P->nvalues};
}

static bool is_free(const Prop *P, const Value *v) { return P->kind[v->id] == V_FREE; }

/* The target a value's op produces it in: its written type (FIXED), its pin (the free search), or
 * the layout's binding (its bound dims as the layout maps them, the others open, partial sums over
 * axes no dim takes deferred); NULL: the op's natural result (the free search's derivation). */
static const PlanTarget *value_target(const Prop *P, const Value *r, PlanTarget *t) {
  memset(t, 0, sizeof *t);
  if (P->kind[r->id] == V_FIXED) t->s = r->sharding;
  else if (P->pinned[r->id]) t->s = P->pin[r->id];
  else if (P->bind && P->kind[r->id] == V_FREE && P->carry_in[r->id]) {
    t->s = P->carry_in[r->id]->sharding; /* the carried value as every iteration holds it */
  } else if (P->bind && P->kind[r->id] == V_FREE) {
    t->s = P->pref[r->id];
    t->open = (uint8_t)(((1u << r->type.rank) - 1) & ~P->bound[r->id]);
    t->defer = true;
  } else
    return NULL;
  return t;
}


static uint64_t key_hash(const PlanKey *k) {
  _Static_assert(sizeof(PlanKey) % 8 == 0, "PlanKey hashed by words");
  const unsigned char *b = (const unsigned char *)k;
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < sizeof *k; i += 8) {
    uint64_t w;
    memcpy(&w, b + i, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  return h ^ (h >> 29);
}

static void memo_grow(PlanMemo *M) {
  size_t ncap = M->cap ? M->cap * 2 : 1024;
  PlanEntry **ns = calloc(ncap, sizeof *ns);
  if (!ns) abort();
  for (size_t i = 0; i < M->cap; i++) {
    PlanEntry *e = M->slot[i];
    if (!e) continue;
    size_t j = (size_t)e->hash & (ncap - 1);
    while (ns[j]) j = (j + 1) & (ncap - 1);
    ns[j] = e;
  }
  free(M->slot);
  M->slot = ns;
  M->cap = ncap;
}

static size_t ptr_hash(const void *p) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x = (x ^ (x >> 31)) * 0x9e3779b97f4a7c15ull;
  return (size_t)(x ^ (x >> 29));
}

static LastPlan *last_slot(PlanMemo *M, const Op *op) {
  if (2 * (M->llen + 1) > M->lcap) {
    size_t ncap = M->lcap ? M->lcap * 2 : 1024;
    LastPlan *ns = calloc(ncap, sizeof *ns);
    if (!ns) abort();
    for (size_t i = 0; i < M->lcap; i++) {
      if (!M->last[i].op) continue;
      size_t j = ptr_hash(M->last[i].op) & (ncap - 1);
      while (ns[j].op) j = (j + 1) & (ncap - 1);
      ns[j] = M->last[i];
    }
    free(M->last);
    M->last = ns;
    M->lcap = ncap;
  }
  size_t j = ptr_hash(op) & (M->lcap - 1);
  while (M->last[j].op && M->last[j].op != op) j = (j + 1) & (M->lcap - 1);
  if (!M->last[j].op) M->last[j].op = op, M->llen++;
  return &M->last[j];
}

static bool key_matches(const PlanKey *k, const Op *op, uint16_t blocked, const Sharding *const *operands,
                        const PlanTarget *target) {
  if (k->op != op || k->blocked != blocked || k->n != op->noperands || k->has_target != (target != NULL))
    return false;
  for (int i = 0; i < op->noperands; i++)
    if (memcmp(&k->in[i], operands[i], sizeof(Sharding)) != 0) return false;
  return !target || (memcmp(&k->target.s, &target->s, sizeof(Sharding)) == 0 && k->target.open == target->open &&
                     k->target.defer == target->defer);
}

/* plan_op, memoised for the run (see PlanKey). */
static bool plan_memo(Prop *P, const PlanCtx *c, const Op *op, const Sharding *const *operands,
                      const PlanTarget *target, OpPlan *out) {
  if (op->noperands > PLAN_MAX_OPERANDS) return plan_op(c, op, operands, target, out);
  PlanMemo *M = &P->memo;
  LastPlan *lp = out == op->plan ? last_slot(M, op) : NULL;
  if (lp && lp->e && key_matches(&lp->e->key, op, c->blocked, operands, target)) return lp->e->ok;
  if (lp && lp->alt && key_matches(&lp->alt->key, op, c->blocked, operands, target)) {
    const PlanEntry *t = lp->alt;
    lp->alt = lp->e;
    lp->e = t;
    memcpy(out, &t->plan, sizeof *out);
    return t->ok;
  }
  PlanKey k;
  memset(&k, 0, sizeof k);
  k.op = op;
  k.blocked = c->blocked;
  k.n = (uint8_t)op->noperands;
  for (int i = 0; i < op->noperands; i++) k.in[i] = *operands[i];
  if (target) {
    k.has_target = 1;
    k.target.s = target->s;
    k.target.open = target->open;
    k.target.defer = target->defer;
  }
  uint64_t h = key_hash(&k);
  PlanEntry *e = NULL;
  if (M->cap) {
    for (size_t j = (size_t)h & (M->cap - 1); M->slot[j]; j = (j + 1) & (M->cap - 1)) {
      PlanEntry *x = M->slot[j];
      if (x->hash == h && memcmp(&x->key, &k, sizeof k) == 0) {
        e = x;
        break;
      }
    }
  }
  if (!e) {
    if (2 * (M->len + 1) > M->cap) memo_grow(M);
    e = ARENA_NEW(P->a, PlanEntry);
    e->key = k;
    e->hash = h;
    e->ok = plan_op(c, op, operands, target, &e->plan);
    size_t j = (size_t)h & (M->cap - 1);
    while (M->slot[j]) j = (j + 1) & (M->cap - 1);
    M->slot[j] = e;
    M->len++;
  }
  memcpy(out, &e->plan, sizeof *out);
  if (lp) lp->alt = lp->e, lp->e = e;
  return e->ok;
}

static OpPlan *op_plan(Prop *P, Op *op) {
  if (!op->plan) op->plan = ARENA_NEW(P->plans, OpPlan);
  return op->plan;
}

static void set_derived(Value *v, const Sharding *s, SrcLoc at) {
  v->sharding = *s;
  v->shard_source = SHARD_PROPAGATED;
  v->shard_loc = at;
}

/* Origins of a factored op's result: each dim's axes trace back to the operand dim that
 * proposed them. */
static void origin_from_plan(Value *r, const Op *op, const OpPlan *pl) {
  for (int d = 0; d < r->type.rank; d++) {
    if (!r->sharding.naxes[d]) {
      r->dim_src[d] = SHARD_FREE;
      continue;
    }
    int f = 0;
    while (f < pl->nf && pl->fdim[f] != r->type.dims[d]) f++;
    bool same = f < pl->nf && pl->nax[f] == r->sharding.naxes[d] &&
                memcmp(pl->ax[f], r->sharding.axes[d], pl->nax[f]) == 0;
    if (same && pl->src[f] >= 0 && pl->src[f] < op->noperands) {
      origin_copy_dim(r, d, op->operands[pl->src[f]], pl->src_dim[f]);
    } else if (r->dim_src[d] == SHARD_FREE || !same) {
      r->dim_src[d] = SHARD_PROPAGATED;
      r->dim_loc[d] = op->loc;
    }
  }
  r->partial_loc = (SrcLoc){0};
  if (pl->made_partial & r->sharding.partial) r->partial_loc = op->loc;
  else
    for (int i = 0; i < op->noperands; i++)
      if (op->operands[i]->sharding.partial && (op->operands[i]->sharding.partial & r->sharding.partial))
        r->partial_loc = op->operands[i]->partial_loc;
}

/* A value without the partial sums and the given axes. */
static Sharding strip(const Sharding *s, int rank, uint16_t axes) {
  Sharding t = *s;
  t.partial = 0;
  for (int d = 0; d < rank; d++) {
    int k = 0;
    while (k < t.naxes[d] && !(axes & (1u << t.axes[d][k]))) k++;
    t.naxes[d] = (uint8_t)k; /* drop from the first stripped axis on (the rest is not contiguous) */
  }
  return t;
}

static void derive_func(Prop *P, IrFunc *f, uint16_t blocked);

/* v is zeros (a constant 0, or one broadcast) that only one loop reads as its carried initial
 * value: a microbatch loop's accumulators and loss. Zeros are a partial sum over any axes, so
 * such a value may start the loop partial (each device's gradients then accumulate unreduced,
 * and are reduced once, after the loop). */
static bool zero_for(const Prop *P, const Value *v) {
  const Op *d = v->def;
  if (d && d->kind == OP_BROADCAST && d->noperands == 1) d = d->operands[0]->def;
  return d && d->kind == OP_CONST && d->scalar == 0 && v->id < P->nvalues && P->uses[v->id].len == 1;
}

/* The pipeline's stage axes: the leading (stacking) dim's axes of the loop's stacked params (its
 * slices with a written type), in their order; *n of them. The other slices (a backward loop's
 * residuals, a microbatch loop's inputs) follow: their leading dim takes exactly these axes. */
static uint16_t loop_stage_list(const Op *op, int8_t *ax, int *n) {
  *n = 0;
  for (int i = 0; i < op->nslices && i < op->noperands; i++) {
    const Value *v = op->operands[i];
    if (!v->spec || v->type.rank < 1 || !v->sharding.naxes[0]) continue;
    uint16_t m = 0;
    for (int k = 0; k < v->sharding.naxes[0]; k++) {
      ax[k] = v->sharding.axes[0][k];
      m |= (uint16_t)(1u << ax[k]);
    }
    *n = v->sharding.naxes[0];
    return m;
  }
  return 0;
}

static uint16_t loop_stage_axes(const Op *op) {
  int8_t ax[MAX_AXES_PER_DIM];
  int n;
  return loop_stage_list(op, ax, &n);
}

/* A stacked value (a slice operand, a stacked result) of the loop: `body` (its sharding in one
 * iteration) with the stacking dim in front, sharded over the loop's stage axes. */
static Sharding stacked_sharding(const Op *loop, const Sharding *body, int body_rank) {
  Sharding s;
  memset(&s, 0, sizeof s);
  int8_t ax[MAX_AXES_PER_DIM];
  int n;
  loop_stage_list(loop, ax, &n);
  memcpy(s.axes[0], ax, (size_t)n);
  s.naxes[0] = (uint8_t)n;
  for (int d = 0; d < body_rank && d + 1 < MAX_RANK; d++) {
    s.naxes[d + 1] = body->naxes[d];
    memcpy(s.axes[d + 1], body->axes[d], sizeof s.axes[d]);
  }
  return s;
}

/* A backward loop's stacked result (a stacked gradient) whose row is a partial sum over some axes
 * is reduced in the body, once per iteration. Where the layout shards one of its dims over those
 * axes (FSDP's `embed: data`), the row is reduce-scattered onto that dim rather than all-reduced
 * whole: so a layer's gradient is reduced and sharded as soon as the backward makes it, and the
 * unreduced gradients of every layer never exist at once (what FSDP does, and the only plan that
 * fits memory; collective time alone does not see the difference). */
static void reduce_scatter_where_preferred(const Prop *P, const Value *res, const Sharding *row, Sharding *s) {
  const Sharding *pref = &P->pref[res->id];
  uint16_t used = sharding_axes_used(s, res->type.rank);
  for (int d = 1; d < res->type.rank; d++) {
    if (s->naxes[d] || !pref->naxes[d]) continue;
    uint16_t want = 0;
    for (int k = 0; k < pref->naxes[d]; k++) want |= (uint16_t)(1u << pref->axes[d][k]);
    if ((want & row->partial) != want || (want & used)) continue;
    s->naxes[d] = pref->naxes[d];
    memcpy(s->axes[d], pref->axes[d], sizeof s->axes[d]);
    used |= want;
  }
}

static bool no_bigger(const Prop *P, const Value *v, const Sharding *s);

static bool no_bigger_than(const Prop *P, const Value *v, const Sharding *s, const Sharding *than) {
  return sharding_local_bytes(&v->type, s, P->mesh) <= sharding_local_bytes(&v->type, than, P->mesh);
}

/* s shards every dim a layout rule maps as the rule does (the other dims are open). */
static bool bound_dims_agree(const Prop *P, const Value *v, const Sharding *s) {
  const Sharding *b = &P->pref[v->id];
  for (int d = 0; d < v->type.rank; d++) {
    if (!(P->bound[v->id] & (1u << d))) continue;
    if (s->naxes[d] != b->naxes[d] || memcmp(s->axes[d], b->axes[d], s->naxes[d]) != 0) return false;
  }
  return true;
}

/* An accumulator (a carried body input starting from zeros, with neither a written type nor a
 * pin) whose body output is `acc + x` takes x's sharding, where that holds no more bytes per
 * device: x's shard (an FSDP gradient reduce-scattered per layer, an embedding gradient built over
 * the local vocabulary) is accumulated as it is, and where x is a partial sum (a microbatch's
 * data-parallel gradient) each device adds its unreduced x and the sum is reduced once, after the
 * loop, instead of once per iteration. True when an input changed: the body is then derived
 * again with it. */
static bool follow_partial_sums(Prop *P, Op *op, uint16_t inner) {
  IrFunc *b = op->body;
  bool changed = false;
  for (int i = op->nslices; i < op->nslices + op->ncarried && i < b->ninputs && i < op->noperands; i++) {
    Value *in = b->inputs[i], *outer = op->operands[i];
    int o = i - op->nslices;
    if (P->kind[in->id] != V_FREE || P->pinned[in->id] || !zero_for(P, outer) || o >= b->noutputs) continue;
    const Op *add = b->outputs[o]->def;
    if (!add || add->kind != OP_ADD || add->noperands != 2) continue;
    int k = add->operands[0] == in ? 1 : add->operands[1] == in ? 0 : -1;
    if (k < 0) continue;
    const Value *x = add->operands[k];
    if (x->type.rank != in->type.rank ||
        memcmp(x->type.dims, in->type.dims, sizeof(x->type.dims[0]) * (size_t)x->type.rank) != 0)
      continue;
    Sharding s = x->sharding;
    s.partial = (uint16_t)(x->sharding.partial & ~inner);
    if (sharding_equal(&s, &in->sharding, in->type.rank) || !no_bigger(P, in, &s)) continue;
    if (P->bind && !bound_dims_agree(P, in, &s)) continue; /* the layout binds the accumulator's dims */
    /* nor more than the layout's mapping of it holds: FSDP's gradients, reduce-scattered per
     * microbatch into a sharded accumulator, are not held whole to save a reduction */
    if (sharding_local_bytes(&in->type, &s, P->mesh) > sharding_local_bytes(&in->type, &P->pref[in->id], P->mesh))
      continue;
    set_derived(in, &s, op->loc);
    outer->sharding = s; /* zeros: any block of them, and a partial sum of zeros */
    changed = true;
  }
  return changed;
}

/* A loop's body inputs from its operands (and pins): the first step of derive_loop. */
static void loop_head(Prop *P, Op *op, uint16_t blocked) {
  IrFunc *b = op->body;
  uint16_t inner = blocked | loop_stage_axes(op);
  for (int i = 0; i < b->ninputs && i < op->noperands; i++) {
    Value *in = b->inputs[i], *outer = op->operands[i];
    if (P->kind[in->id] == V_FIXED) {
      if (i >= op->nslices && zero_for(P, outer)) outer->sharding = in->sharding; /* zeros of its block */
      continue;
    }
    Sharding s;
    memset(&s, 0, sizeof s);
    origin_clear(in);
    if (i < op->nslices) { /* the slice: the stacked value without its leading dim */
      for (int d = 1; d < outer->type.rank; d++) {
        s.naxes[d - 1] = outer->sharding.naxes[d];
        memcpy(s.axes[d - 1], outer->sharding.axes[d], sizeof s.axes[d]);
        origin_copy_dim(in, d - 1, outer, d);
      }
    } else if (P->pinned[in->id]) {
      s = P->pin[in->id];
      if (s.partial & ~outer->sharding.partial) { /* a partial carried value must start partial */
        if (zero_for(P, outer)) outer->sharding = s; /* zeros are a partial sum of zeros */
        else s.partial &= outer->sharding.partial;
      }
    } else {
      s = strip(&outer->sharding, outer->type.rank, inner);
      for (int d = 0; d < outer->type.rank; d++) origin_copy_dim(in, d, outer, d);
      PlanTarget tb;
      if (P->bind && value_target(P, in, &tb)) { /* the layout binds it: its open dims as it enters */
        tb.defer = false;
        Sharding t;
        plan_target_resolve(&tb, &s, in->type.rank, &t);
        s = t;
      }
    }
    if (i >= op->nslices && P->kind[outer->id] == V_CONST && zero_for(P, outer) && !(s.partial & outer->sharding.partial))
      outer->sharding.partial = 0; /* a constant zero a pin made partial and no pin keeps so */
    for (int d = 0; d < in->type.rank; d++)
      if (!s.naxes[d]) in->dim_src[d] = SHARD_FREE;
    set_derived(in, &s, op->loc);
    if (i < op->nslices) in->shard_source = outer->shard_source, in->shard_loc = outer->shard_loc;
    else bound_origins(P, in);
  }
}

/* The microbatch loop's accumulator that stacked result res (of a loop in that loop's body) is
 * added into, through the widening cast of the accumulation: the carried body input, or NULL. */
static const Value *accumulator_of(const Prop *P, const Op *op, const Value *res) {
  const StepInfo *si = P->m->step;
  if (!si || !si->micro_loop || !si->micro_loop->body || op->func != si->micro_loop->body) return NULL;
  const IrFunc *mb = si->micro_loop->body;
  const Op *ml = si->micro_loop;
  const Value *u = res;
  for (int hop = 0; hop < 4 && u->id < P->nvalues && P->uses[u->id].len == 1; hop++) {
    const Op *o = P->uses[u->id].data[0].op;
    if ((o->kind == OP_CAST || o->kind == OP_TRANSPOSE) && o->nresults == 1) {
      u = o->results[0];
      continue;
    }
    if (o->kind != OP_ADD || o->noperands != 2) return NULL;
    const Value *acc = o->operands[o->operands[0] == u ? 1 : 0];
    for (int i = ml->nslices; i < ml->nslices + ml->ncarried && i < mb->ninputs; i++)
      if (mb->inputs[i] == acc) return acc;
    return NULL;
  }
  return NULL;
}

/* A loop's results from its body (and pins), and its plan: the last step of derive_loop. */
static void loop_tail(Prop *P, Op *op) {
  IrFunc *b = op->body;
  /* carried results: the carried body input's sharding (one for every iteration) */
  for (int r = 0; r < op->ncarried && r < op->nresults && op->nslices + r < b->ninputs; r++) {
    Value *res = op->results[r], *in = b->inputs[op->nslices + r];
    if (P->kind[res->id] == V_FIXED) continue;
    set_derived(res, &in->sharding, op->loc);
    for (int d = 0; d < res->type.rank; d++) origin_copy_dim(res, d, in, d);
  }
  /* stacked results (residuals, stacked gradients): the body output's sharding, reduced (a partial
   * sum is reduced in the body, once per iteration), the stacking dim over the stage axes */
  for (int r = op->ncarried; r < op->nresults && r < b->noutputs; r++) {
    Value *res = op->results[r], *out = b->outputs[r];
    if (P->kind[res->id] == V_FIXED) continue;
    Sharding s = stacked_sharding(op, &out->sharding, out->type.rank);
    if (op->reverse) reduce_scatter_where_preferred(P, res, &out->sharding, &s);
    const Value *acc = P->bind && out->sharding.partial ? accumulator_of(P, op, res) : NULL;
    if (acc) {
      /* gradients reduced once per microbatch (or, where the accumulator follows them, once per
       * step: follow_partial_sums), not once per layer: rows a microbatch loop accumulates stay
       * unreduced, where that holds no more bytes than the rows reduced */
      Sharding t = s;
      t.partial = (uint16_t)(out->sharding.partial & ~sharding_axes_used(&s, res->type.rank) & ~loop_stage_axes(op));
      if (no_bigger_than(P, res, &t, &s)) s = t;
    }
    if (P->pinned[res->id]) s = P->pin[res->id];
    set_derived(res, &s, op->loc);
    origin_clear(res);
    for (int d = 1; d < res->type.rank; d++)
      if (s.naxes[d]) origin_copy_dim(res, d, out, d - 1);
  }
  OpPlan *pl = op_plan(P, op);
  memset(pl, 0, sizeof *pl);
  pl->reshape_bad_dim = -1;
}

static void derive_loop(Prop *P, Op *op, uint16_t blocked) {
  IrFunc *b = op->body;
  uint16_t inner = blocked | loop_stage_axes(op);
  loop_head(P, op, blocked);
  derive_func(P, b, inner);
  if (follow_partial_sums(P, op, inner)) derive_func(P, b, inner);
  loop_tail(P, op);
}

static void derive_reshape(Prop *P, Op *op) {
  OpPlan *pl = op_plan(P, op);
  memset(pl, 0, sizeof *pl);
  pl->reshape_bad_dim = -1;
  Value *x = op->operands[0], *r = op->results[0];
  Sharding s;
  memset(&s, 0, sizeof s);
  int bad = -1;
  plan_reshape(P->mesh, op, &x->sharding, &s, &bad);
  pl->reshape_bad_dim = bad;
  pl->natural = s;
  pl->nopnd = 1;
  pl->req[0] = x->sharding;
  if (bad >= 0) { /* the free search: the error is partition's; go on with what the reshape can keep.
                    * Under the layout's binding the operand is gathered on the dims it cannot keep
                    * (collectives move operands to where the op can run: docs/passes.md, 6) */
    Sharding x2 = x->sharding;
    x2.naxes[bad] = 0;
    for (int k = 0; k < MAX_RANK && !plan_reshape(P->mesh, op, &x2, &s, &bad) && bad >= 0; k++) x2.naxes[bad] = 0;
    pl->natural = s;
    if (P->bind) pl->req[0] = x2, pl->reshape_bad_dim = -1;
  }
  pl->result = pl->natural;
  if (!is_free(P, r)) return;
  bool pin_ok = P->pinned[r->id] && !(P->pin[r->id].partial & ~s.partial);
  PlanTarget tb;
  if (!pin_ok && P->bind && !P->pinned[r->id] && value_target(P, r, &tb)) /* the layout's binding */
    plan_target_resolve(&tb, &pl->natural, r->type.rank, &s);
  pl->result = pin_ok ? P->pin[r->id] : s;
  set_derived(r, pin_ok ? &P->pin[r->id] : &s, op->loc);
  /* origins: untouched dims by name, the parts (or the whole) from the other side's dims */
  origin_clear(r);
  for (int d = 0; d < r->type.rank; d++) {
    if (!r->sharding.naxes[d]) continue;
    int e = tensor_type_find(&x->type, r->type.dims[d]);
    if (e < 0)
      for (int k = 0; k < x->type.rank && e < 0; k++)
        if (x->sharding.naxes[k] && tensor_type_find(&r->type, x->type.dims[k]) < 0) e = k;
    if (e >= 0) origin_copy_dim(r, d, x, e);
    else r->dim_src[d] = SHARD_PROPAGATED, r->dim_loc[d] = op->loc;
  }
  r->partial_loc = x->partial_loc;
  bound_origins(P, r);
}

/* One op of a function (not a loop, not a reshape): its plan, and its result where free. */
static void derive_op(Prop *P, const PlanCtx *c, Op *op) {
  if (op->nresults != 1 || op->noperands > PLAN_MAX_OPERANDS) return;
  Value *r = op->results[0];
  if (P->kind[r->id] == V_CONST || (P->kind[r->id] == V_FIXED && !op->operands)) return;
  if (op->partitioned) return;
  const Sharding *in[PLAN_MAX_OPERANDS];
  for (int i = 0; i < op->noperands; i++) in[i] = &op->operands[i]->sharding;
  PlanTarget tb;
  const PlanTarget *target = value_target(P, r, &tb);
  OpPlan *pl = op_plan(P, op);
  if (target && target->s.partial && P->pinned[r->id] && plan_memo(P, c, op, in, NULL, pl) &&
      (target->s.partial & ~pl->natural.partial))
    target = NULL; /* a pinned partial sum the op no longer produces (other pins moved): drop it */
  if (!plan_memo(P, c, op, in, target, pl)) { /* no rule for it: it runs replicated (partition.c) */
    if (is_free(P, r)) {
      Sharding none, s;
      memset(&none, 0, sizeof none);
      if (target) plan_target_resolve(target, &none, r->type.rank, &s);
      else s = none;
      set_derived(r, &s, op->loc);
      origin_clear(r);
    }
    return;
  }
  if (!is_free(P, r)) return;
  set_derived(r, &pl->result, op->loc);
  origin_from_plan(r, op, pl);
  bound_origins(P, r);
}

/* Any op of a function, as derive_func derives it in program order. */
static void derive_any(Prop *P, const PlanCtx *c, Op *op, uint16_t blocked) {
  if (op->kind == OP_LOOP) {
    if (op->body) derive_loop(P, op, blocked);
  } else if (op->kind == OP_SPLIT || op->kind == OP_MERGE) {
    if (op->noperands == 1 && op->nresults == 1) derive_reshape(P, op);
  } else {
    derive_op(P, c, op);
  }
}

static void derive_func(Prop *P, IrFunc *f, uint16_t blocked) {
  PlanCtx c = plan_ctx(P, blocked);
  for (Op *op = f->first; op; op = op->next) derive_any(P, &c, op, blocked);
}

static void derive(Prop *P) { derive_func(P, P->m->main, 0); }

/* ---- incremental derivation ----
 *
 * A trial pin changes only what depends on the pinned value. derive() derives every op of main in
 * program order, each from its operands' shardings and its own pins (a loop: its whole body, from
 * its operands); so deriving again only the units whose inputs changed, in program order, leaves
 * every sharding and plan as derive() would. derive_from starts at the pinned value's unit and
 * follows the uses of every result that changed; what it overwrites is saved first, so that a
 * rejected pin is undone by putting it back (undo_trial), not by deriving again. */

static size_t unit_slot(const Units *U, const Op *op) {
  size_t j = ptr_hash(op) & (U->cap - 1);
  while (U->key[j] && U->key[j] != op) j = (j + 1) & (U->cap - 1);
  return j;
}

static int unit_index(const Units *U, const Op *op) {
  size_t j = unit_slot(U, op);
  return U->key[j] ? U->val[j] : -1;
}

static int units_add(Units *U, Op *op, int kind, uint16_t blocked, int parent_head) {
  U->u[U->n] = (UnitInfo){.op = op, .kind = (uint8_t)kind, .blocked = blocked, .tail = -1, .parent_head = parent_head};
  return U->n++;
}

static int units_count(const IrFunc *f) {
  int n = 0;
  for (const Op *op = f->first; op; op = op->next) n += op->kind == OP_LOOP && op->body ? 2 + units_count(op->body) : 1;
  return n;
}

static void units_func(Prop *P, IrFunc *f, uint16_t blocked, int parent_head) {
  Units *U = &P->units;
  for (Op *op = f->first; op; op = op->next) {
    bool loop = op->kind == OP_LOOP && op->body;
    int u = units_add(U, op, loop ? UNIT_HEAD : UNIT_OP, blocked, parent_head);
    size_t j = unit_slot(U, op);
    U->key[j] = op;
    U->val[j] = u;
    if (!loop) {
      for (int r = 0; r < op->nresults; r++)
        if (op->results[r] && op->results[r]->id < P->nvalues) U->of_value[op->results[r]->id] = u;
      continue;
    }
    IrFunc *b = op->body;
    for (int i = 0; i < b->ninputs; i++)
      if (b->inputs[i] && b->inputs[i]->id < P->nvalues) U->of_value[b->inputs[i]->id] = u;
    units_func(P, b, (uint16_t)(blocked | loop_stage_axes(op)), u);
    int t = units_add(U, op, UNIT_TAIL, blocked, parent_head);
    U->u[u].tail = t;
    for (int r = 0; r < op->nresults; r++)
      if (op->results[r] && op->results[r]->id < P->nvalues) U->of_value[op->results[r]->id] = t;
    for (int i = 0; i < b->ninputs; i++)
      if (b->inputs[i] && b->inputs[i]->id < P->nvalues) U->tail_reads[b->inputs[i]->id] = t;
    for (int i = 0; i < b->noutputs; i++)
      if (b->outputs[i] && b->outputs[i]->id < P->nvalues) U->tail_reads[b->outputs[i]->id] = t;
  }
}

static void units_build(Prop *P) {
  Units *U = &P->units;
  int n = units_count(P->m->main), nv = P->nvalues > 0 ? P->nvalues : 1;
  U->n = 0;
  U->u = ARENA_ARRAY(P->a, UnitInfo, n > 0 ? n : 1);
  U->heap = ARENA_ARRAY(P->a, int, n > 0 ? n : 1);
  U->queued = ARENA_ARRAY(P->a, bool, n > 0 ? n : 1);
  U->done = ARENA_ARRAY(P->a, int, n > 0 ? n : 1);
  U->of_value = ARENA_ARRAY(P->a, int, nv);
  U->tail_reads = ARENA_ARRAY(P->a, int, nv);
  for (int i = 0; i < P->nvalues; i++) U->of_value[i] = U->tail_reads[i] = -1;
  U->stamp = ARENA_ARRAY(P->a, int, nv);
  U->in_order = ARENA_ARRAY(P->a, bool, nv);
  for (int i = 0; i < P->order.len; i++) U->in_order[P->order.data[i]->id] = true;
  U->cap = 16;
  while (U->cap < 2 * (size_t)n + 2) U->cap *= 2;
  U->key = ARENA_ARRAY(P->a, const Op *, U->cap);
  U->val = ARENA_ARRAY(P->a, int, U->cap);
  units_func(P, P->m->main, 0, -1);
  U->flat = true;
  for (int u = 0; u < U->n; u++) {
    const Op *op = U->u[u].op;
    if (U->u[u].kind != UNIT_OP || op->kind == OP_CROSS_ENTROPY || op->kind == OP_CROSS_ENTROPY_GRAD) U->flat = false;
  }
}

static void unit_push(Units *U, int u) {
  if (u < 0 || U->queued[u]) return;
  U->queued[u] = true;
  int i = U->nheap++;
  while (i > 0 && U->heap[(i - 1) / 2] > u) {
    U->heap[i] = U->heap[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  U->heap[i] = u;
}

static int unit_pop(Units *U) {
  int top = U->heap[0], last = U->heap[--U->nheap], i = 0;
  for (;;) {
    int c = 2 * i + 1;
    if (c >= U->nheap) break;
    if (c + 1 < U->nheap && U->heap[c + 1] < U->heap[c]) c++;
    if (U->heap[c] >= last) break;
    U->heap[i] = U->heap[c];
    i = c;
  }
  if (U->nheap > 0) U->heap[i] = last;
  U->queued[top] = false;
  return top;
}

static void save_value(Prop *P, Value *v) { VEC_PUSH(P->a, P->units.saved_v, ((SavedValue){.v = v, .old = *v})); }

static void save_plan(Prop *P, Op *op) {
  if (!op->plan) return;
  SavedPlan sp = {.op = op, .last = last_slot(&P->memo, op)->e, .old = *op->plan};
  VEC_PUSH(P->a, P->units.saved_p, sp);
}

/* v's sharding changed: queue the units that read it. */
static void unit_changed(Prop *P, const Value *v) {
  Units *U = &P->units;
  if (v->id < 0 || v->id >= P->nvalues) return;
  for (int k = 0; k < P->uses[v->id].len; k++) unit_push(U, unit_index(U, P->uses[v->id].data[k].op));
  unit_push(U, U->tail_reads[v->id]);
}

/* Queues the units reading the values saved from `first` on (n of them) whose sharding changed. */
static void changed_since(Prop *P, int first, int n) {
  for (int i = first; i < first + n; i++) {
    const SavedValue *sv = &P->units.saved_v.data[i];
    if (!sharding_equal(&sv->old.sharding, &sv->v->sharding, sv->v->type.rank)) unit_changed(P, sv->v);
  }
}

static void drain(Prop *P, int limit);

/* Derives unit u again, as derive() would at its place, and queues what reads what changed. A
 * head first derives again its loop's zeros that are a broadcast (read by the loop alone), as
 * derive() does before the loop overwrites them. A tail runs follow_partial_sums and, where it
 * changed an accumulator, derives again the body units reading it before finishing (derive()'s
 * second pass over the body). */
static void derive_unit(Prop *P, int u) {
  Units *U = &P->units;
  UnitInfo *ui = &U->u[u];
  Op *op = ui->op;
  PlanCtx c = plan_ctx(P, ui->blocked);
  VEC_PUSH(P->a, U->trial_ops, op);
  U->derived++;
  if (ui->kind == UNIT_OP) {
    int first = U->saved_v.len;
    for (int r = 0; r < op->nresults; r++)
      if (op->results[r]) save_value(P, op->results[r]);
    save_plan(P, op);
    derive_any(P, &c, op, ui->blocked);
    changed_since(P, first, U->saved_v.len - first);
    return;
  }
  IrFunc *b = op->body;
  if (ui->kind == UNIT_HEAD) {
    for (int i = op->nslices; i < op->noperands; i++) {
      Op *d = op->operands[i]->def;
      if (d && d->kind != OP_CONST && d->func == op->func && zero_for(P, op->operands[i])) {
        save_value(P, op->operands[i]);
        save_plan(P, d);
        derive_any(P, &c, d, ui->blocked);
        VEC_PUSH(P->a, U->trial_ops, d);
      }
    }
    int first = U->saved_v.len;
    for (int i = 0; i < b->ninputs; i++) save_value(P, b->inputs[i]);
    for (int i = 0; i < op->noperands; i++) save_value(P, op->operands[i]);
    loop_head(P, op, ui->blocked);
    changed_since(P, first, b->ninputs);
    unit_push(U, ui->tail);
    return;
  }
  if (U->done[u] == U->pass) return; /* nothing in the body changed since */
  U->done[u] = U->pass;
  int first = U->saved_v.len;
  for (int i = 0; i < b->ninputs; i++) save_value(P, b->inputs[i]);
  for (int i = 0; i < op->noperands; i++) save_value(P, op->operands[i]);
  if (follow_partial_sums(P, op, (uint16_t)(ui->blocked | loop_stage_axes(op)))) {
    changed_since(P, first, b->ninputs);
    drain(P, u);
  }
  first = U->saved_v.len;
  for (int r = 0; r < op->nresults; r++)
    if (op->results[r]) save_value(P, op->results[r]);
  save_plan(P, op);
  loop_tail(P, op);
  changed_since(P, first, U->saved_v.len - first);
}

/* Derives the queued units before `limit`, least first. */
static void drain(Prop *P, int limit) {
  Units *U = &P->units;
  while (U->nheap > 0 && U->heap[0] < limit) derive_unit(P, unit_pop(U));
}

static void ledger_catch_up(Prop *P);

/* A score whose time is at least `lb` (rounding margins taken off already) is not better than best
 * (score_better): more time beyond its tolerance, and no fewer errors than best's none. */
static bool bound_loses(double lb, const Score *best) {
  return best->errors == 0 && lb > best->time_s && lb * (1 - 1e-9) > best->time_s + 1e-12;
}

/* Whether the trial under way can no longer beat `best`, whatever the units still queued come to.
 * In a flat main (no loop, no cross entropy), derivation in program order leaves every unit before
 * the least queued one as it will stay, and its figures in the ledger final once caught up; the
 * ledger's bound before that unit (partition_ledger_bound_before: what those units are charged,
 * each reshard once, the later units counted as free) is then a lower bound on the trial's
 * collective time. With no
 * error in `best` (a trial has at least none), a time above best's beyond score_better's tolerance
 * loses, whatever its count and layout term: the margins here cover rounding many times over. */
static bool cannot_win(Prop *P, const Score *best) {
  Units *U = &P->units;
  if (!U->flat || best->errors != 0 || U->nheap == 0) return false;
  ledger_catch_up(P);
  double lb = partition_ledger_bound_before(U->ledger, U->u[U->heap[0]].op);
  lb = lb * (1 - 1e-6) - 1e-15;
  if (lb > U->bound) U->bound = lb;
  if (!bound_loses(lb, best)) return false;
  if (!U->cut_bound) U->cut_bound = lb, U->cut_at = U->heap[0]; /* (the first, where it stops) */
  return true;
}

#define CUT_EVERY 32 /* units derived between two cannot_win checks */

/* derive() after v's pin changed, deriving only what depends on v (see above): v's unit, and the
 * heads of the loops around it (so that their tails run follow_partial_sums as derive() does).
 * With `best`, checks every CUT_EVERY units whether the trial can still win: true when it cannot,
 * and then, unless `finish`, stops with units left unqueued (the trial is to be undone); with
 * `finish` (the audit) it derives to the end all the same. */
static bool derive_from(Prop *P, const Value *v, const Score *best, bool finish) {
  Units *U = &P->units;
  U->pass++;
  int u = v->id < P->nvalues ? U->of_value[v->id] : -1;
  unit_push(U, u);
  for (int h = u >= 0 ? U->u[u].parent_head : -1; h >= 0; h = U->u[h].parent_head) unit_push(U, h);
  if (!best || !U->flat) {
    drain(P, INT32_MAX);
    return false;
  }
  bool cut = false;
  long next = U->derived + CUT_EVERY;
  U->bound = U->cut_bound = 0;
  while (U->nheap > 0) {
    derive_unit(P, unit_pop(U));
    if (U->derived < next) continue;
    next = U->derived + CUT_EVERY;
    if (!cannot_win(P, best) || cut) continue;
    cut = true;
    U->cut++;
    if (!finish)
      while (U->nheap > 0) unit_pop(U);
  }
  return cut;
}

static int layout_match(const Prop *P, const Value *v, const Sharding *a);

/* Brings the ledger up to the derivation: walks again the units derived since it last did, and
 * those reading or defining a value whose sharding changed since (each saved value against what
 * it was when saved). */
static void ledger_catch_up(Prop *P) {
  Units *U = &P->units;
  U->trial_vals.len = 0;
  for (int i = U->acct_v; i < U->saved_v.len; i++) {
    Value *v = U->saved_v.data[i].v;
    if (v->id < 0 || v->id >= P->nvalues) continue;
    if (!sharding_equal(&U->saved_v.data[i].old.sharding, &v->sharding, v->type.rank))
      VEC_PUSH(P->a, U->trial_vals, v);
  }
  partition_ledger_update(U->ledger, U->trial_ops.data + U->acct_ops, U->trial_ops.len - U->acct_ops,
                          U->trial_vals.data, U->trial_vals.len);
  U->acct_v = U->saved_v.len;
  U->acct_ops = U->trial_ops.len;
}

/* After a trial's derivation: the values it changed (each once, from its state before the
 * trial), the layout term moved by them, and the ledger walked again where they are. */
static void trial_account(Prop *P) {
  Units *U = &P->units;
  U->trial++;
  for (int i = 0; i < U->saved_v.len; i++) {
    Value *v = U->saved_v.data[i].v;
    const Sharding *old = &U->saved_v.data[i].old.sharding;
    if (v->id < 0 || v->id >= P->nvalues || U->stamp[v->id] == U->trial) continue;
    U->stamp[v->id] = U->trial;
    if (sharding_equal(old, &v->sharding, v->type.rank)) continue; /* (bytes past a dim's axes are free) */
    if (U->in_order[v->id]) U->layout += layout_match(P, v, &v->sharding) - layout_match(P, v, old);
  }
  ledger_catch_up(P);
}

/* Puts back what the trial derivations since the last commit_trial overwrote. */
static void undo_trial(Prop *P) {
  Units *U = &P->units;
  for (int i = U->saved_p.len - 1; i >= 0; i--) {
    SavedPlan *sp = &U->saved_p.data[i];
    *sp->op->plan = sp->old;
    LastPlan *lp = last_slot(&P->memo, sp->op);
    if (lp->e != sp->last) lp->alt = lp->e, lp->e = sp->last;
  }
  for (int i = U->saved_v.len - 1; i >= 0; i--) *U->saved_v.data[i].v = U->saved_v.data[i].old;
  U->saved_v.len = U->saved_p.len = 0;
}

static void commit_trial(Prop *P) {
  P->units.saved_v.len = P->units.saved_p.len = 0;
  P->units.trial_ops.len = P->units.trial_vals.len = 0;
  P->units.acct_v = P->units.acct_ops = 0;
}

/* ---- the objective ---- */

/* How many of v's dims are sharded as the layout maps them (score's layout term). */
static int layout_match(const Prop *P, const Value *v, const Sharding *a) {
  int n = 0;
  const Sharding *b = &P->pref[v->id];
  for (int d = 0; d < v->type.rank; d++)
    n += a->naxes[d] == b->naxes[d] && memcmp(a->axes[d], b->axes[d], a->naxes[d]) == 0;
  return n;
}

static Score score(Prop *P) {
  PartCost c = partition_cost(P->m, P->p);
  Score s = {.errors = c.errors, .time_s = c.time_s, .count = c.count};
  for (int i = 0; i < P->order.len; i++) s.layout += layout_match(P, P->order.data[i], &P->order.data[i]->sharding);
  return s;
}

/* score() from the ledger and the layout term the trials keep up to date. */
static Score score_kept(const Prop *P) {
  PartCost c = partition_ledger_cost(P->units.ledger);
  return (Score){.errors = c.errors, .time_s = c.time_s, .count = c.count, .layout = P->units.layout};
}

static bool score_better(const Score *a, const Score *b) {
  if (a->errors != b->errors) return a->errors < b->errors;
  double eps = 1e-12 + 1e-9 * fmax(a->time_s, b->time_s);
  if (a->time_s < b->time_s - eps) return true;
  if (a->time_s > b->time_s + eps) return false;
  if (fabs(a->count - b->count) > 1e-9) return a->count < b->count;
  return a->layout > b->layout;
}

/* ---- candidates ---- */

typedef struct Cands {
  Sharding s[MAX_CANDS];
  int n;
} Cands;

static void cand_add(Cands *c, const Value *v, const Sharding *s) {
  if (c->n == MAX_CANDS) return;
  if (sharding_equal(s, &v->sharding, v->type.rank)) return;
  for (int i = 0; i < c->n; i++)
    if (sharding_equal(&c->s[i], s, v->type.rank)) return;
  c->s[c->n++] = *s;
}

/* A candidate must fit the value: every dim's axes divide it and no axis is used twice. */
static bool cand_fits(const Prop *P, const Value *v, const Sharding *s) {
  uint16_t used = s->partial;
  for (int d = 0; d < v->type.rank; d++) {
    int64_t prod = 1;
    for (int k = 0; k < s->naxes[d]; k++) {
      uint16_t b = (uint16_t)(1u << s->axes[d][k]);
      if (used & b) return false;
      used |= b;
      prod *= P->mesh->axes[s->axes[d][k]].size;
    }
    if (v->type.dims[d]->size % prod != 0) return false;
  }
  return true;
}

/* How many ways a sharding splits the work on the value: its dims' axes and its partial axes. */
static int64_t work_split(const Prop *P, const Value *v, const Sharding *s) {
  return sharding_axes_product(P->mesh, (uint16_t)(sharding_axes_used(s, v->type.rank) | s->partial));
}

/* The stacking dim of a stacked value (a loop's slice operand, a loop's stacked result) is sharded
 * over exactly the loop's stage axes: a pipeline's, or none (a microbatch loop is no pipeline). */
static bool dim0_is(const Sharding *s, const Op *loop) {
  int8_t ax[MAX_AXES_PER_DIM];
  int n;
  loop_stage_list(loop, ax, &n);
  return s->naxes[0] == n && memcmp(s->axes[0], ax, (size_t)n) == 0;
}

static bool stacking_ok(const Prop *P, const Value *v, const Sharding *s) {
  if (v->def && v->def->kind == OP_LOOP) {
    for (int r = v->def->ncarried; r < v->def->nresults; r++)
      if (v->def->results[r] == v && !dim0_is(s, v->def)) return false;
  }
  for (int u = 0; u < P->uses[v->id].len; u++) {
    Use use = P->uses[v->id].data[u];
    if (use.op->kind == OP_LOOP && use.operand < use.op->nslices && !dim0_is(s, use.op)) return false;
  }
  return true;
}

/* A partial-sum candidate is offered only where it holds no more bytes per device than v does
 * now: leaving data-parallel gradients unreduced across microbatches costs no memory, leaving
 * FSDP's (sharded once reduced) would hold them whole. */
static bool no_bigger(const Prop *P, const Value *v, const Sharding *s) {
  return sharding_local_bytes(&v->type, s, P->mesh) <= sharding_local_bytes(&v->type, &v->sharding, P->mesh);
}

/* Pins never make a value less sharded than it is: that would trade communication for replicated
 * compute, which the collectives' time cannot see (and replicate silently). */
static void cand_add_checked(const Prop *P, Cands *c, const Value *v, const Sharding *s) {
  if (cand_fits(P, v, s) && work_split(P, v, s) >= work_split(P, v, &v->sharding) && stacking_ok(P, v, s))
    cand_add(c, v, s);
}

/* The shardings v's neighbours suggest: its op's other candidates, what each user takes (as it
 * plans now, and as it would plan on its own with v replicated), the shape a reshape or a loop
 * wants, the function's output type, the layout's mapping. */
static void candidates(Prop *P, Value *v, uint16_t blocked, Cands *out) {
  out->n = 0;
  int rank = v->type.rank;
  cand_add_checked(P, out, v, &P->pref[v->id]);
  if (v->sharding.partial && !(sharding_axes_used(&P->pref[v->id], rank) & v->sharding.partial)) {
    Sharding s = P->pref[v->id]; /* the layout's mapping, still unreduced (a gradient built over the */
    s.partial = v->sharding.partial; /* rows a device holds, as take_grad into a vocab shard) */
    cand_add_checked(P, out, v, &s);
  }
  if (v->def && v->def->plan && v->def->plan->factored)
    for (int i = 0; i < v->def->plan->nalts; i++) cand_add_checked(P, out, v, &v->def->plan->alts[i]);
  if (!v->def) { /* a carried body input: its initial value's sharding, and the body output's */
    IrFunc *b = v->func;
    int idx = -1;
    for (int i = 0; i < b->ninputs; i++)
      if (b->inputs[i] == v) idx = i;
    Op *loop = NULL;
    if (b->parent)
      for (Op *o = b->parent->first; o && !loop; o = o->next)
        if (o->kind == OP_LOOP && o->body == b) loop = o;
    if (loop && idx >= loop->nslices && idx - loop->nslices < b->noutputs) {
      Sharding s = strip(&loop->operands[idx]->sharding, rank, blocked);
      cand_add_checked(P, out, v, &s);
      const Value *bo = b->outputs[idx - loop->nslices];
      s = strip(&bo->sharding, rank, blocked);
      cand_add_checked(P, out, v, &s);
      s.partial = (uint16_t)(bo->sharding.partial & ~blocked); /* accumulate unreduced, from zeros */
      if (s.partial && zero_for(P, loop->operands[idx]) && no_bigger(P, v, &s)) cand_add_checked(P, out, v, &s);
      for (int u = 0; u < P->uses[v->id].len && zero_for(P, loop->operands[idx]); u++) {
        const Op *add = P->uses[v->id].data[u].op; /* as partial as what is added to it */
        if (add->kind != OP_ADD || add->noperands != 2) continue;
        const Value *other = add->operands[add->operands[0] == v ? 1 : 0];
        s = v->sharding;
        s.partial = (uint16_t)(other->sharding.partial & ~blocked);
        if (s.partial && no_bigger(P, v, &s)) cand_add_checked(P, out, v, &s);
      }
    }
  }
  const StepInfo *si = P->m->step;
  if (v->def && v->def->kind == OP_LOOP && v->def->body && si && si->micro_loop && v->func == si->micro_loop->body) {
    /* a stacked result a microbatch loop accumulates: its rows left unreduced (reduced once, after
     * the microbatches); elsewhere each layer's gradient is reduced as the backward makes it */
    const Op *loop = v->def;
    for (int r = loop->ncarried; r < loop->nresults && r < loop->body->noutputs; r++) {
      const Value *bo = loop->body->outputs[r];
      if (loop->results[r] != v || !bo->sharding.partial) continue;
      Sharding s = stacked_sharding(loop, &bo->sharding, bo->type.rank);
      s.partial = (uint16_t)(bo->sharding.partial & ~blocked);
      if (no_bigger(P, v, &s)) cand_add_checked(P, out, v, &s);
    }
  }
  PlanCtx c = plan_ctx(P, blocked);
  for (int u = 0; u < P->uses[v->id].len; u++) {
    Use use = P->uses[v->id].data[u];
    Op *op = use.op;
    if (op->kind == OP_LOOP && op->body && use.operand < op->nslices && use.operand < op->body->ninputs) {
      const Value *in = op->body->inputs[use.operand];
      Sharding s = stacked_sharding(op, &in->sharding, in->type.rank);
      cand_add_checked(P, out, v, &s);
    } else if (op->kind == OP_LOOP && op->body && use.operand < op->body->ninputs) {
      Sharding s = strip(&op->body->inputs[use.operand]->sharding, rank, 0);
      cand_add_checked(P, out, v, &s);
    } else if ((op->kind == OP_SPLIT || op->kind == OP_MERGE) && op->nresults == 1) {
      Sharding s;
      if (plan_reshape_back(P->mesh, op, &op->results[0]->sharding, &s)) cand_add_checked(P, out, v, &s);
    } else if (op->plan && op->plan->factored && use.operand < op->plan->nopnd) {
      Sharding s = strip(&op->plan->req[use.operand], rank, 0);
      if (op->kind == OP_ROUTE && cand_fits(P, v, &s) && stacking_ok(P, v, &s))
        cand_add(out, v, &s); /* route reads its tokens whole (a sharded tokens dim is an error there):
                                 the logits may be less sharded for it */
      else
        cand_add_checked(P, out, v, &s);
      const Sharding *in[PLAN_MAX_OPERANDS];
      static const Sharding none;
      for (int i = 0; i < op->noperands; i++) in[i] = i == use.operand ? &none : &op->operands[i]->sharding;
      OpPlan alone;
      const Value *r = op->results[0];
      PlanTarget tb;
      memset(&tb, 0, sizeof tb);
      tb.s = r->sharding;
      const PlanTarget *target = P->kind[r->id] == V_FIXED || P->pinned[r->id] ? &tb : NULL;
      if (plan_memo(P, &c, op, in, target, &alone)) {
        s = strip(&alone.req[use.operand], rank, 0);
        cand_add_checked(P, out, v, &s);
      }
    }
  }
  if (P->is_output[v->id]) {
    IrFunc *f = v->func;
    if (f == P->m->main && P->p->entry) {
      Sharding s;
      ShardOrigin o;
      TypeSpec spec = P->p->entry->ret;
      if (spec.rank == rank && layout_apply(P->p, &spec, &s, &o)) {
        Sharding t;
        memset(&t, 0, sizeof t);
        for (int i = 0; i < rank; i++)
          for (int j = 0; j < spec.rank; j++)
            if (spec.dims[j] == v->type.dims[i]) t.naxes[i] = s.naxes[j], memcpy(t.axes[i], s.axes[j], sizeof s.axes[j]);
        cand_add_checked(P, out, v, &t);
      }
    }
  }
}

/* The blocked axes for values of f: the stage axes of every loop enclosing it. */
static uint16_t func_blocked(const Prop *P, const IrFunc *f) {
  uint16_t m = 0;
  for (const IrFunc *g = f; g && g->parent; g = g->parent)
    for (const Op *o = g->parent->first; o; o = o->next)
      if (o->kind == OP_LOOP && o->body == g) m |= loop_stage_axes(o);
  (void)P;
  return m;
}

/* ---- the audit (tests): the incremental figures against a full recomputation ---- */

static PropagateAudit *audit;

void propagate_audit(PropagateAudit *a) { audit = a; }

/* Checks, after a trial (s: its score; NULL after it was undone), that the ledger's cost and the
 * layout term equal score()'s, and that derive() would leave every sharding as it is. */
static void audit_trial(Prop *P, const Score *s) {
  Score kept = s ? *s : score_kept(P);
  Score full = score(P);
  audit->checked++;
  double tol = 1e-12 + 1e-9 * fmax(fabs(full.time_s), fabs(kept.time_s));
  double err = fabs(full.time_s - kept.time_s);
  if (full.time_s > 0 && err / full.time_s > audit->max_rel_err) audit->max_rel_err = err / full.time_s;
  bool ok = full.errors == kept.errors && err <= tol && fabs(full.count - kept.count) <= 1e-6 &&
            full.layout == kept.layout;
  /* the ledger's bound before each op of main (cannot_win's), against a sum unit by unit */
  bool bound_ok = partition_ledger_bound_audit(P->units.ledger);
  ok = ok && bound_ok;
  /* the shardings derive() gives (origins aside: the search never reads them) */
  int n = P->nvalues;
  Sharding *now = malloc(sizeof *now * (size_t)(n > 0 ? n : 1));
  bool *seen = calloc((size_t)(n > 0 ? n : 1), 1);
  if (!now || !seen) abort();
  Value **vals = malloc(sizeof *vals * (size_t)(n > 0 ? n : 1));
  if (!vals) abort();
  int nv = 0;
  for (int i = 0; i < P->order.len; i++) {
    Value *v = P->order.data[i];
    if (v->id < n && !seen[v->id]) seen[v->id] = true, now[v->id] = v->sharding, vals[nv++] = v;
  }
  derive(P);
  for (int i = 0; i < nv; i++) /* as the search compares them: bytes past a dim's axes are free */
    if (!sharding_equal(&now[vals[i]->id], &vals[i]->sharding, vals[i]->type.rank)) {
      ok = false;
      vals[i]->sharding = now[vals[i]->id];
    }
  if (!ok && !audit->first[0])
    snprintf(audit->first, sizeof audit->first,
             "errors %d/%d, time %.17g/%.17g s, count %.17g/%.17g, layout %d/%d (kept/full)%s%s", kept.errors,
             full.errors, kept.time_s, full.time_s, kept.count, full.count, kept.layout, full.layout,
             s ? "" : ", after an undo", bound_ok ? "" : "; the ledger's bound before an op differs");
  free(now);
  free(seen);
  free(vals);
  if (!ok) audit->mismatches++;
}

/* Under the audit every trial is derived to the end: its time must be at least every bound
 * cannot_win found on the way, and a trial it found unable to win (cut) must lose. */
static void audit_bound(double time_s, double bound, bool cut, bool better) {
  if (time_s >= bound && !(cut && better)) return;
  audit->mismatches++;
  if (!audit->first[0])
    snprintf(audit->first, sizeof audit->first, "a trial %s (time %.17g s, bound %.17g s)",
             cut && better ? "stopped early as unable to win wins" : "costs less than a bound found on the way", time_s,
             bound);
}

/* Whether pin s of the i-th free value was stopped early before (cut) and would lose again: its
 * trial derives the units before the cut's `at` as it did (they depend on nothing at or after it),
 * so long as no pin accepted since derived a unit before `at` again; their charges alone, the
 * cut's bound, then still exceed the best score. *bound: that bound. */
static bool known_to_lose(const Prop *P, const CutVec *cuts, const Sharding *s, int rank, long accepted,
                          const Score *best, double *bound) {
  const Units *U = &P->units;
  for (int r = cuts->len - 1; r >= 0; r--) {
    const CutTrial *c = &cuts->data[r];
    if (!sharding_equal(&c->s, s, rank)) continue;
    bool same = true;
    for (long a = c->accepted; a < accepted && same; a++) same = U->acc_from.data[a] >= c->at;
    if (same && bound_loses(c->bound, best)) {
      *bound = c->bound;
      return true;
    }
  }
  return false;
}

/* The least unit the trial just made derived again (the pin's own, or a loop head around it). */
static int trial_first_unit(const Prop *P) {
  const Units *U = &P->units;
  int least = U->n;
  for (int i = 0; i < U->trial_ops.len; i++) {
    int u = unit_index(U, U->trial_ops.data[i]);
    if (u >= 0 && u < least) least = u;
  }
  return least;
}

/* ---- the search ---- */

/* ---- weights keep their tensor-parallel shards ----
 *
 * A weight sharded over the axes that shard `batch` (ir_batch_axes) is FSDP's, gathered where
 * used; over the others it is tensor parallelism's, and under the layout's binding it keeps them
 * where it is read too (a plan that gathers it over them only where no other plan exists). */

/* keep[v] for every value that is a weight (a param, and through casts, views and loop slices
 * what reads it whole), the tensor-parallel axes of its sharding. */
static void mark_keep(Prop *P, IrFunc *f, uint16_t dp, uint16_t blocked) {
  for (Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_PARAM) {
      const Value *v = op->results[0];
      P->keep[v->id] = (uint16_t)(sharding_axes_used(&v->sharding, v->type.rank) & ~dp & ~blocked);
    }
    bool view = op->kind == OP_CAST || op->kind == OP_RENAME || op->kind == OP_TRANSPOSE || op->kind == OP_SPLIT ||
                op->kind == OP_MERGE;
    if (view && op->noperands == 1 && op->nresults == 1) P->keep[op->results[0]->id] = P->keep[op->operands[0]->id];
    if (op->kind == OP_LOOP && op->body) {
      uint16_t inner = blocked | loop_stage_axes(op);
      for (int i = 0; i < op->noperands && i < op->body->ninputs; i++) {
        bool carried = i >= op->nslices && i < op->nslices + op->ncarried;
        if (!carried) P->keep[op->body->inputs[i]->id] = (uint16_t)(P->keep[op->operands[i]->id] & ~inner);
      }
      mark_keep(P, op->body, dp, inner);
    }
  }
}

/* The stage axes of every loop of f (a pipeline's): a weight sharded over them is a stage's. */
static uint16_t all_stage_axes(const IrFunc *f) {
  uint16_t ax = 0;
  for (const Op *op = f->first; op; op = op->next)
    if (op->kind == OP_LOOP && op->body) ax |= (uint16_t)(loop_stage_axes(op) | all_stage_axes(op->body));
  return ax;
}

static void memo_reset(Prop *P) {
  free(P->memo.slot);
  free(P->memo.last);
  memset(&P->memo, 0, sizeof P->memo);
}

static void search(Prop *P) {
  derive(P);
  units_build(P);
  P->units.ledger = partition_ledger_new(P->m, P->p);
  Score best = score(P);
  P->units.layout = best.layout;
  P->units.derived = P->units.cut = P->units.skipped = 0;
  P->units.acc_from.len = 0;
  CutVec *cuts = ARENA_ARRAY(P->a, CutVec, P->order.len > 0 ? P->order.len : 1);
  /* A value whose trials were all rejected, with no pin accepted anywhere since, would see the
   * same plan, make the same candidates and have them rejected again: it is skipped. (A rejected
   * trial is undone exactly, so the plan is the same.) */
  long accepted = 0;
  long *rejected_at = ARENA_ARRAY(P->a, long, P->order.len > 0 ? P->order.len : 1);
  for (int i = 0; i < P->order.len; i++) rejected_at[i] = -1;
  for (int round = 0; round < MAX_ROUNDS; round++) {
    bool improved = false;
    for (int i = 0; i < P->order.len; i++) {
      Value *v = P->order.data[i];
      if (rejected_at[i] == accepted) continue;
      long before = accepted;
      Cands c;
      candidates(P, v, func_blocked(P, v->func), &c);
      for (int k = 0; k < c.n; k++) {
        double known_bound = 0;
        bool known = known_to_lose(P, &cuts[i], &c.s[k], v->type.rank, accepted, &best, &known_bound);
        if (known) P->units.skipped++;
        if (known && !audit) continue; /* (under the audit: derived all the same, and must lose) */
        bool was = P->pinned[v->id];
        Sharding old = P->pin[v->id];
        P->pinned[v->id] = true;
        P->pin[v->id] = c.s[k];
        int layout = P->units.layout;
        partition_ledger_begin(P->units.ledger);
        bool cut = derive_from(P, v, &best, audit != NULL);
        if (cut && !known) { /* (the audit's run of a known one: remembered already) */
          CutTrial ct = {.s = c.s[k], .at = P->units.cut_at, .accepted = accepted, .bound = P->units.cut_bound};
          VEC_PUSH(P->a, cuts[i], ct);
        }
        if (known && known_bound > P->units.bound) P->units.bound = known_bound;
        cut |= known;
        bool better = false;
        if (!cut || audit) {
          trial_account(P);
          Score s = score_kept(P);
          if (audit) audit_trial(P, &s);
          better = score_better(&s, &best);
          if (audit) audit_bound(s.time_s, P->units.bound, cut, better);
          if (better) best = s;
        }
        if (better) {
          improved = true;
          accepted++;
          VEC_PUSH(P->a, P->units.acc_from, trial_first_unit(P));
          partition_ledger_commit(P->units.ledger);
          commit_trial(P);
        } else {
          P->pinned[v->id] = was;
          P->pin[v->id] = old;
          undo_trial(P);
          P->units.layout = layout;
          partition_ledger_rollback(P->units.ledger);
          commit_trial(P);
          if (audit) audit_trial(P, NULL);
        }
      }
      if (accepted == before) rejected_at[i] = accepted;
    }
    if (!improved) break;
  }
  if (audit) {
    audit->cut += P->units.cut;
    audit->skipped += P->units.skipped;
    audit->derived += P->units.derived;
    audit->walked += partition_ledger_walked(P->units.ledger);
  }
  partition_ledger_free(P->units.ledger);
  P->units.ledger = NULL;
  derive(P);
}

/* ---- the plan the layout forbids (propagate_weigh) ----
 *
 * The bound plan is what runs. Where explain or sim ask (IrModule.weigh.want), the free search
 * (every value not written at a boundary its op's natural result, then pins kept while the
 * collectives get cheaper) runs on the same module, its cost is compared with the bound plan's,
 * and every sharding and plan is put back: it is never taken. */

typedef struct Snapshot {
  Value **v;
  Value *old;
  int nv;
  Op **op;
  OpPlan *plan;     /* a copy of each op's plan (NULL plans: has[i] false) */
  bool *has;
  int nop;
} Snapshot;

static void snap_count(const IrFunc *f, int *nv, int *nop) {
  *nv += f->ninputs;
  for (const Op *op = f->first; op; op = op->next) {
    (*nop)++;
    *nv += op->nresults;
    if (op->kind == OP_LOOP && op->body) snap_count(op->body, nv, nop);
  }
}

static void snap_fill(Snapshot *S, IrFunc *f) {
  for (int i = 0; i < f->ninputs; i++) S->v[S->nv++] = f->inputs[i];
  for (Op *op = f->first; op; op = op->next) {
    S->op[S->nop++] = op;
    for (int r = 0; r < op->nresults; r++) S->v[S->nv++] = op->results[r];
    if (op->kind == OP_LOOP && op->body) snap_fill(S, op->body);
  }
}

static void snap_take(Prop *P, Snapshot *S) {
  int nv = 0, nop = 0;
  snap_count(P->m->main, &nv, &nop);
  S->v = ARENA_ARRAY(P->a, Value *, nv > 0 ? nv : 1);
  S->old = ARENA_ARRAY(P->a, Value, nv > 0 ? nv : 1);
  S->op = ARENA_ARRAY(P->a, Op *, nop > 0 ? nop : 1);
  S->plan = ARENA_ARRAY(P->a, OpPlan, nop > 0 ? nop : 1);
  S->has = ARENA_ARRAY(P->a, bool, nop > 0 ? nop : 1);
  S->nv = S->nop = 0;
  snap_fill(S, P->m->main);
  for (int i = 0; i < S->nv; i++)
    if (S->v[i]) S->old[i] = *S->v[i];
  for (int i = 0; i < S->nop; i++)
    if ((S->has[i] = S->op[i]->plan != NULL)) S->plan[i] = *S->op[i]->plan;
}

static void snap_put_back(const Snapshot *S) {
  for (int i = 0; i < S->nv; i++)
    if (S->v[i]) *S->v[i] = S->old[i];
  for (int i = 0; i < S->nop; i++) {
    if (S->has[i]) *S->op[i]->plan = S->plan[i];
    else if (S->op[i]->plan) memset(S->op[i]->plan, 0, sizeof *S->op[i]->plan), S->op[i]->plan->reshape_bad_dim = -1;
  }
}

/* Which rule the free plan breaks most: for every value the layout binds, each bound dim the free
 * plan shards otherwise counts for the rule that maps it (the first such value kept as the example). */
static void weigh_rule(Prop *P, const Snapshot *S, struct LayoutWeigh *w) {
  const Layout *L = P->p->layout;
  if (!L || L->nrules <= 0) return;
  int *count = ARENA_ARRAY(P->a, int, L->nrules);
  const Value **first = ARENA_ARRAY(P->a, const Value *, L->nrules);
  Sharding *first_free = ARENA_ARRAY(P->a, Sharding, L->nrules);
  for (int i = 0; i < S->nv; i++) {
    const Value *v = S->v[i];
    if (!v || v->id < 0 || v->id >= P->nvalues || P->kind[v->id] != V_FREE || !P->bound[v->id]) continue;
    const Sharding *b = &S->old[i].sharding; /* as the layout binds it */
    Sharding pref;
    ShardOrigin o;
    layout_map_dims(P->p, (Dim *const *)v->type.dims, v->type.rank, &pref, &o, false);
    for (int d = 0; d < v->type.rank; d++) {
      if (!(P->bound[v->id] & (1u << d)) || o.kind[d] != ORIGIN_LAYOUT) continue;
      bool same = v->sharding.naxes[d] == b->naxes[d] && memcmp(v->sharding.axes[d], b->axes[d], b->naxes[d]) == 0;
      if (same) continue;
      for (int r = 0; r < L->nrules; r++) {
        if (L->rules[r].loc.line != o.loc[d].line || L->rules[r].loc.file != o.loc[d].file ||
            L->rules[r].loc.col != o.loc[d].col)
          continue;
        if (!count[r]++) first[r] = v, first_free[r] = v->sharding;
        break;
      }
      break; /* a value counts once, for its first dim the free plan moves */
    }
  }
  int best = -1;
  for (int r = 0; r < L->nrules; r++)
    if (count[r] && (best < 0 || count[r] > count[best])) best = r;
  if (best < 0) return;
  w->rule = &L->rules[best];
  w->nvalues = count[best];
  w->example = first[best];
  w->example_free = first_free[best];
}

static void weigh(Prop *P) {
  struct LayoutWeigh *w = &P->m->weigh;
  Score bound = score(P);
  Snapshot S;
  snap_take(P, &S);
  P->bind = false;
  memo_reset(P);
  memset(P->pinned, 0, sizeof *P->pinned * (size_t)(P->nvalues > 0 ? P->nvalues : 1));
  search(P);
  Score free_ = score(P);
  w->done = true;
  w->bound_s = bound.time_s;
  w->free_s = free_.time_s;
  w->bound_count = bound.count;
  w->free_count = free_.count;
  /* cheaper beyond 0.1%, and a plan the compiler could run (no reshape it cannot keep) */
  w->cheaper = free_.errors == 0 && free_.time_s < bound.time_s * (1 - 1e-3);
  if (w->cheaper) weigh_rule(P, &S, w);
  snap_put_back(&S);
  P->bind = true;
  memo_reset(P);
}

void propagate_module(IrModule *m, const Program *p) {
  if (!m || !m->main || !p || !p->mesh) return;
  Arena a;
  arena_init(&a);
  Prop P = {.m = m, .p = p, .mesh = p->mesh, .a = &a, .nvalues = m->nvalues, .bind = true};
  int n = m->nvalues > 0 ? m->nvalues : 1;
  P.kind = ARENA_ARRAY(&a, uint8_t, n);
  P.pinned = ARENA_ARRAY(&a, bool, n);
  P.pin = ARENA_ARRAY(&a, Sharding, n);
  P.pref = ARENA_ARRAY(&a, Sharding, n);
  P.bound = ARENA_ARRAY(&a, uint8_t, n);
  P.rule = arena_alloc(&a, sizeof *P.rule * (size_t)n);
  P.carry_in = ARENA_ARRAY(&a, Value *, n);
  P.uses = ARENA_ARRAY(&a, UseVec, n);
  P.is_output = ARENA_ARRAY(&a, bool, n);
  bool incremental = module_partitioned(m->main);
  P.plans = m->arena;
  setup_func(&P, m->main, incremental);
  P.keep = ARENA_ARRAY(&a, uint16_t, n);
  if (!incremental) {
    P.bind = false;
    derive(&P); /* the tied values' shardings (a loop's stacked params), for the stage axes */
    P.bind = true;
    mark_keep(&P, m->main, ir_batch_axes(m), all_stage_axes(m->main));
    memo_reset(&P);
  }
  /* the layout binds every value: one derivation, in program order (language.md, Layouts) */
  derive(&P);
  if (m->weigh.want && !incremental && !m->weigh.done) weigh(&P);
  free(P.memo.slot);
  free(P.memo.last);
  arena_free(&a);
}
