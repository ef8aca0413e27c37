/* stages.c: a pipelined program as per-stage regions and a schedule (see stages.h).
 *
 * The body B (a train step's microbatch loop body, or a forward's main) is split by what each
 * op depends on: the forward loop LF and the backward loop LB become the chunk regions; ops that
 * read LF's results but not LB's run on the last stage (PR_LAST); ops that read LB's results on
 * the first (PR_FIRST_BWD); the rest read only the pipeline's operands (inputs, params) and are
 * copied into every region that needs them (the embedding lookup feeding LF goes to PR_FIRST).
 * The values that cross regions are exactly the wires of ir.h's PipeSlots: LF's carried input
 * (PR_FIRST's activation), LF's carried result (PR_LAST's), LF's stacked results (the residuals
 * PR_CHUNK_BWD reads), LB's carried input (PR_LAST's gradient) and result (PR_FIRST_BWD's), and
 * the gradients added into the accumulators; anything else crossing regions is an error. The
 * accumulation `acc + g` of the microbatch body becomes POUT_ACC outputs; a gradient summed from
 * two regions (a tied param) is accumulated in both and all-reduced between the stages after. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devprog.h"
#include "diag.h"
#include "localize.h"
#include "partition.h"
#include "schedule.h"
#include "stages.h"
#include "step.h"

enum { DEP_F = 1, DEP_B = 2 };

typedef VEC(PipeSlot) SlotVec;
typedef VEC(Value *) ValVec;

#define CHAIN_MAX 4
typedef struct Contrib {
  Value *v;             /* a value of B, or LB's stacked result */
  int acc;              /* carried index */
  int region;
  const Op *chain[CHAIN_MAX]; /* LB's stacked result: the row-wise ops (a cast, a collective over
                                 other axes) between it and the gradient added, innermost first */
  int nchain;
} Contrib;

typedef struct St {
  IrModule *m;
  const Program *p;
  const Mesh *mesh;
  PipeInfo *pi;
  bool train;
  IrFunc *B;            /* the body being split */
  Value **opnd;         /* the pipeline's operands; B->inputs[i] stands for opnd[i] */
  int nopnd;
  Op *LF, *LB;
  int n0;               /* value ids below this are B's (maps are sized by it) */
  uint8_t *dep;         /* per value: DEP_F / DEP_B */
  uint8_t *need;        /* per value: the regions (bit r) that read it */
  bool *is_acc_op;      /* per value id of an accumulation add's result: skip the op */
  VEC(Contrib) contrib;
  Value **map[PR__COUNT];
  SlotVec in[PR__COUNT], out[PR__COUNT];
  ValVec outs[PR__COUNT];
  Value *act_in[PR__COUNT]; /* each region's PIN_ACT input */
  bool failed;
} St;

static bool fail(St *S, SrcLoc loc, const char *what) {
  diag_error(loc, "this pipeline cannot be split into stages: %s", what);
  S->failed = true;
  return false;
}

static uint16_t bit(int a) { return (uint16_t)(1u << a); }

static bool is_b_input(const St *S, const Value *v, int *index) {
  for (int i = 0; i < S->B->ninputs; i++)
    if (S->B->inputs[i] == v) {
      if (index) *index = i;
      return true;
    }
  return false;
}

/* ---- values of regions ---- */

static void set_local(const St *S, Value *v) {
  for (int i = 0; i < v->type.rank; i++) v->local[i] = localize_extent(S->mesh, &v->type, &v->sharding, i);
}

/* A region input of type t with sharding s (copying `like`'s identity). */
static Value *region_input(St *S, int r, PipeInKind k, int index, const Value *like, const TensorType *t,
                           const Sharding *s) {
  Value *v = ir_func_add_input(S->m, S->pi->region[r], *t, like ? like->name : NULL);
  if (s) v->sharding = *s;
  if (like) {
    v->partial_max = like->partial_max;
    memcpy(v->dim_src, like->dim_src, sizeof v->dim_src);
    memcpy(v->dim_loc, like->dim_loc, sizeof v->dim_loc);
    v->shard_source = like->shard_source;
  }
  set_local(S, v);
  VEC_PUSH(S->m->arena, S->in[r], ((PipeSlot){(uint8_t)k, index}));
  return v;
}

/* x's type and sharding with its leading (stacked) dim replaced by the chunk dim, held whole. */
static void chunk_type(const St *S, const Value *x, TensorType *t, Sharding *s) {
  *t = x->type;
  t->dims[0] = S->pi->chunk_dim;
  *s = x->sharding;
  s->naxes[0] = 0;
  memset(s->axes[0], 0, sizeof s->axes[0]);
}

static void region_output(St *S, int r, PipeOutKind k, int index, Value *v) {
  VEC_PUSH(S->m->arena, S->outs[r], v);
  VEC_PUSH(S->m->arena, S->out[r], ((PipeSlot){(uint8_t)k, index}));
}

/* A copy of op in region r, reading `ops`: every attribute, results with the originals' types,
 * shardings, local extents and identities. */
static Op *copy_op(St *S, int r, const Op *op, Value **ops, const TensorType *types) {
  IrFunc *R = S->pi->region[r];
  TensorType *tt = ARENA_ARRAY(S->m->arena, TensorType, op->nresults + 1);
  for (int i = 0; i < op->nresults; i++) tt[i] = types ? types[i] : op->results[i]->type;
  Op *c = ir_op_new(S->m, R, op->kind, op->loc, ops, op->noperands, tt, op->nresults);
  Value **operands = c->operands, **results = c->results;
  *c = *op;
  c->operands = operands;
  c->results = results;
  c->func = R;
  c->next = NULL;
  c->in_shard = NULL;
  for (int i = 0; i < op->nresults; i++) {
    Value *x = results[i];
    const Value *o = op->results[i];
    int id = x->id;
    TensorType t = x->type;
    *x = *o;
    x->id = id;
    x->type = t;
    x->def = c;
    x->func = R;
    if (types) set_local(S, x);
  }
  ir_append(R, c);
  return c;
}

/* f's ops in program order, as an array (the passes below walk them backwards). */
static Op **op_array(Arena *a, const IrFunc *f, int *n) {
  int k = 0;
  for (const Op *op = f->first; op; op = op->next) k++;
  Op **ops = ARENA_ARRAY(a, Op *, k + 1);
  k = 0;
  for (Op *op = f->first; op; op = op->next) ops[k++] = op;
  *n = k;
  return ops;
}

/* ---- 1. what each value depends on ---- */

static void classify(St *S) {
  for (Op *op = S->B->first; op; op = op->next) {
    uint8_t d = 0;
    if (op == S->LF) d = DEP_F;
    else if (op == S->LB) d = DEP_B;
    else
      for (int i = 0; i < op->noperands; i++) d |= S->dep[op->operands[i]->id];
    for (int i = 0; i < op->nresults; i++) S->dep[op->results[i]->id] = d;
  }
}

/* The home region of a non-operand-only op. */
static int home(const St *S, const Op *op) {
  if (op == S->LF) return PR_CHUNK_FWD;
  if (op == S->LB) return PR_CHUNK_BWD;
  uint8_t d = 0;
  for (int i = 0; i < op->nresults; i++) d |= S->dep[op->results[i]->id];
  if (d & DEP_B) return PR_FIRST_BWD;
  if (d & DEP_F) return PR_LAST;
  return -1; /* reads the pipeline's operands only: every region that needs it computes it */
}

static int value_region(const St *S, const Value *v) {
  if (v->def && v->func == S->B) return home(S, v->def);
  return -1;
}

/* ---- 2. the accumulations: acc_k + g becomes g added into accumulator k ---- */

static bool is_zeros(const Value *v) {
  const Op *z = v->def;
  if (z && z->kind == OP_CAST) z = z->operands[0]->def;
  if (z && z->kind == OP_BROADCAST) z = z->operands[0]->def;
  return z && z->kind == OP_CONST && z->scalar == 0;
}

/* An op that works on each row of a stacked value on its own: a cast, a collective over axes other
 * than the stages that leaves the stacked dim alone. */
static bool row_wise(const St *S, const Op *op) {
  if (op->kind == OP_CAST) return true;
  if (!ir_op_is_collective(op->kind) || op->kind == OP_PERMUTE) return false;
  for (int k = 0; k < S->pi->nstage_axes; k++)
    if (op->axes >> S->pi->stage_axes[k] & 1) return false;
  for (int k = 0; op->coll && k < op->coll->nparts; k++)
    if (op->coll->parts[k].dim == 0) return false;
  return true;
}

/* Leaves of a sum of gradients from different regions (a tied param): each is accumulated where it
 * is made. A cast to f32 above the sum is taken off (each leaf is cast on its own). */
static void add_contrib(St *S, Value *g, int acc) {
  const Op *d = g->def;
  if (d && d->func == S->B && d->kind == OP_CAST && d->operands[0]->def && d->operands[0]->def->kind == OP_ADD) {
    const Op *a = d->operands[0]->def;
    if (value_region(S, a->operands[0]) != value_region(S, a->operands[1])) {
      add_contrib(S, a->operands[0], acc);
      add_contrib(S, a->operands[1], acc);
      return;
    }
  }
  if (d && d->func == S->B && d->kind == OP_ADD &&
      value_region(S, d->operands[0]) != value_region(S, d->operands[1])) {
    add_contrib(S, d->operands[0], acc);
    add_contrib(S, d->operands[1], acc);
    return;
  }
  if (is_zeros(g)) return;
  /* the accumulator widens what it adds: a cast to f32 just before is not made */
  if (g->def && g->def->func == S->B && g->def->kind == OP_CAST && g->type.dtype == DT_F32 &&
      !dtype_is_int(g->def->operands[0]->type.dtype))
    g = g->def->operands[0];
  /* LB's stacked gradient, possibly cast or reduced over other axes row by row: accumulated chunk
   * by chunk, those ops run on each chunk's rows */
  const Value *x = g;
  Contrib c = {.acc = acc, .region = PR_CHUNK_BWD};
  while (x->def && x->def->func == S->B && x->def != S->LB && c.nchain < CHAIN_MAX && row_wise(S, x->def)) {
    c.chain[c.nchain++] = x->def;
    x = x->def->operands[0];
  }
  if (x->def == S->LB) {
    c.v = (Value *)x;
    for (int i = 0; i < c.nchain / 2; i++) { /* innermost first */
      const Op *t = c.chain[i];
      c.chain[i] = c.chain[c.nchain - 1 - i];
      c.chain[c.nchain - 1 - i] = t;
    }
    VEC_PUSH(S->m->arena, S->contrib, c);
    return;
  }
  int r = value_region(S, g);
  if (r != PR_LAST && r != PR_FIRST_BWD) {
    fail(S, g->def ? g->def->loc : S->LF->loc, "a gradient that neither the last stage nor the first makes");
    return;
  }
  VEC_PUSH(S->m->arena, S->contrib, ((Contrib){.v = g, .acc = acc, .region = r}));
}

static void find_accumulations(St *S) {
  for (int k = 0; k < S->pi->ncarried && k < S->B->noutputs; k++) {
    Value *out = S->B->outputs[k], *in = S->B->inputs[S->pi->nslices + k];
    Op *a = out->def;
    if (!a || a->func != S->B || a->kind != OP_ADD || (a->operands[0] != in && a->operands[1] != in)) {
      fail(S, S->LF->loc, "a microbatch body whose carried value is not an accumulation");
      return;
    }
    S->is_acc_op[out->id] = true;
    add_contrib(S, a->operands[0] == in ? a->operands[1] : a->operands[0], k);
  }
}

/* ---- 3. who needs what (reverse program order) ---- */

/* Operands of op that arrive by a wire rather than being computed in the reader's region. */
static bool wired(const St *S, const Op *reader, int i) {
  const Value *v = reader->operands[i];
  if (v->def == S->LF && reader != S->LB) return v == S->LF->results[0] && S->LF->ncarried == 1;
  if (v->def == S->LF && reader == S->LB) return true;
  if (S->LB && v->def == S->LB) return v == S->LB->results[0];
  return false;
}

static void needs(St *S) {
  for (int i = 0; i < S->contrib.len; i++) {
    Contrib *c = &S->contrib.data[i];
    if (c->region != PR_CHUNK_BWD) S->need[c->v->id] |= (uint8_t)bit(c->region);
  }
  if (!S->train)
    for (int k = 0; k < S->B->noutputs; k++) S->need[S->B->outputs[k]->id] |= (uint8_t)bit(PR_LAST);
  /* the loops always run */
  S->need[S->LF->results[0]->id] |= (uint8_t)bit(PR_CHUNK_FWD);
  if (S->LB) S->need[S->LB->results[0]->id] |= (uint8_t)bit(PR_CHUNK_BWD);
  int n;
  Op **ops = op_array(S->m->arena, S->B, &n);
  for (int k = n - 1; k >= 0 && !S->failed; k--) {
    Op *op = ops[k];
    if (op->nresults == 1 && S->is_acc_op[op->results[0]->id]) continue;
    uint8_t R = 0;
    for (int i = 0; i < op->nresults; i++) R |= S->need[op->results[i]->id];
    if (!R) continue;
    int h = home(S, op);
    if (h >= 0 && (R & ~bit(h))) {
      fail(S, op->loc, arena_printf(S->m->arena, "the %s here makes a value read on another stage (only the layers' activations and "
                       "gradients travel between stages)", ir_op_name(op->kind)));
      return;
    }
    uint8_t use = h >= 0 ? (uint8_t)bit(h) : R;
    for (int i = 0; i < op->noperands; i++) {
      if (wired(S, op, i)) continue;
      uint8_t u = use;
      if (op == S->LF && i >= S->LF->nslices && i < S->LF->nslices + S->LF->ncarried) u = (uint8_t)bit(PR_FIRST);
      if (op == S->LB && i >= S->LB->nslices && i < S->LB->nslices + S->LB->ncarried) u = (uint8_t)bit(PR_LAST);
      if ((op == S->LF || op == S->LB) && i < op->nslices) {
        int bi;
        if (!is_b_input(S, op->operands[i], &bi) && !(op == S->LB && op->operands[i]->def == S->LF)) {
          fail(S, op->loc, "a stacked loop whose stacked operand is computed in the step (not a param)");
          return;
        }
        if (op->operands[i]->def == S->LF) continue;
      }
      S->need[op->operands[i]->id] |= u;
    }
  }
}

/* ---- 4. the regions ---- */

static Value *mapped(St *S, int r, const Op *reader, const Value *v) {
  if (v->def == S->LF && v == S->LF->results[0] && r == PR_LAST) return S->act_in[PR_LAST];
  if (S->LB && v->def == S->LB && v == S->LB->results[0] && r == PR_FIRST_BWD) return S->act_in[PR_FIRST_BWD];
  Value *x = v->id < S->n0 ? S->map[r][v->id] : NULL;
  if (!x) fail(S, reader->loc, "a value crosses stages where the pipeline carries none");
  return x;
}

/* A stacked loop (LF or LB) rebuilt in its chunk region over Lc layers. */
static void build_loop(St *S, int r, Op *L) {
  Value **ops = ARENA_ARRAY(S->m->arena, Value *, L->noperands + 1);
  for (int i = 0; i < L->noperands && !S->failed; i++) {
    Value *x = L->operands[i];
    if (i < L->nslices) {
      TensorType t;
      Sharding s;
      chunk_type(S, x, &t, &s);
      int bi;
      if (x->def == S->LF) {
        int j = -1;
        for (int k = 0; k < S->LF->nresults; k++)
          if (S->LF->results[k] == x) j = k;
        ops[i] = region_input(S, r, PIN_SAVED, j, x, &t, &s);
      } else if (is_b_input(S, x, &bi)) {
        ops[i] = region_input(S, r, PIN_CHUNK, bi, x, &t, &s);
      }
    } else if (i < L->nslices + L->ncarried) {
      ops[i] = S->act_in[r] = region_input(S, r, PIN_ACT, 0, x, &x->type, &x->sharding);
    } else {
      ops[i] = mapped(S, r, L, x);
    }
  }
  if (S->failed) return;
  TensorType *types = ARENA_ARRAY(S->m->arena, TensorType, L->nresults + 1);
  for (int i = 0; i < L->nresults; i++) {
    types[i] = L->results[i]->type;
    if (i >= L->ncarried) types[i].dims[0] = S->pi->chunk_dim;
  }
  Op *c = copy_op(S, r, L, ops, types);
  c->count = S->pi->chunk_layers;
  c->stack_dim = S->pi->chunk_dim;
  c->body->parent = S->pi->region[r];
  for (int i = L->ncarried; i < L->nresults; i++) {
    c->results[i]->sharding.naxes[0] = 0;
    memset(c->results[i]->sharding.axes[0], 0, sizeof c->results[i]->sharding.axes[0]);
    set_local(S, c->results[i]);
  }
  /* the carried activation no longer moves inside the loop: the schedule's transfers move it */
  IrFunc *b = c->body;
  for (int k = 0; k < b->noutputs; k++) {
    Op *pm = b->outputs[k]->def;
    if (pm && pm->kind == OP_PERMUTE && pm->coll_period > 0) {
      b->outputs[k] = pm->operands[0];
      ir_remove(b, pm);
    }
  }
  for (int i = 0; i < L->nresults; i++) S->map[r][L->results[i]->id] = c->results[i];
  region_output(S, r, POUT_ACT, 0, c->results[0]);
  if (r == PR_CHUNK_FWD)
    for (int i = L->ncarried; i < L->nresults; i++) region_output(S, r, POUT_SAVE, i, c->results[i]);
}

static void new_region(St *S, int r, const char *name) {
  IrFunc *R = ir_func_new(S->m, intern_cstr(name), S->m->main);
  S->pi->region[r] = R;
  S->map[r] = ARENA_ARRAY(S->m->arena, Value *, S->n0 + 1);
  /* every region sees the pipeline's operands but the accumulators */
  for (int i = 0; i < S->B->ninputs; i++) {
    if (i >= S->pi->nslices && i < S->pi->nslices + S->pi->ncarried) continue;
    const Value *x = S->B->inputs[i];
    S->map[r][x->id] = region_input(S, r, PIN_ENV, i, x, &x->type, &x->sharding);
  }
}

static void build_regions(St *S) {
  static const char *const names[PR__COUNT] = {"first", "chunk_fwd", "last", "chunk_bwd", "first_bwd"};
  for (int r = 0; r < PR__COUNT; r++)
    if (S->train || r == PR_FIRST || r == PR_CHUNK_FWD || r == PR_LAST) new_region(S, r, names[r]);
  /* PR_LAST's activation (LF's carried result), PR_FIRST_BWD's gradient (LB's) */
  S->act_in[PR_LAST] = region_input(S, PR_LAST, PIN_ACT, 0, S->LF->results[0], &S->LF->results[0]->type,
                                    &S->LF->results[0]->sharding);
  if (S->LB)
    S->act_in[PR_FIRST_BWD] = region_input(S, PR_FIRST_BWD, PIN_ACT, 0, S->LB->results[0],
                                           &S->LB->results[0]->type, &S->LB->results[0]->sharding);
  for (Op *op = S->B->first; op && !S->failed; op = op->next) {
    if (op == S->LF || op == S->LB) {
      build_loop(S, op == S->LF ? PR_CHUNK_FWD : PR_CHUNK_BWD, op);
      continue;
    }
    if (op->nresults == 1 && S->is_acc_op[op->results[0]->id]) continue;
    uint8_t R = 0;
    for (int i = 0; i < op->nresults; i++) R |= S->need[op->results[i]->id];
    int h = home(S, op);
    if (h >= 0) R &= (uint8_t)bit(h);
    if (op->kind == OP_LOOP && (R & (R - 1))) {
      fail(S, op->loc, "a loop other than the layers' read by several stages");
      return;
    }
    for (int r = 0; r < PR__COUNT && !S->failed; r++) {
      if (!(R >> r & 1) || !S->pi->region[r]) continue;
      Value **ops = ARENA_ARRAY(S->m->arena, Value *, op->noperands + 1);
      for (int i = 0; i < op->noperands && !S->failed; i++) ops[i] = mapped(S, r, op, op->operands[i]);
      if (S->failed) return;
      Op *c = copy_op(S, r, op, ops, NULL);
      if (c->kind == OP_LOOP && c->body) c->body->parent = S->pi->region[r];
      for (int i = 0; i < op->nresults; i++) S->map[r][op->results[i]->id] = c->results[i];
    }
  }
  if (S->failed) return;
  /* what leaves each region */
  region_output(S, PR_FIRST, POUT_ACT, 0, mapped(S, PR_FIRST, S->LF, S->LF->operands[S->LF->nslices]));
  if (S->train) {
    region_output(S, PR_LAST, POUT_ACT, 0, mapped(S, PR_LAST, S->LB, S->LB->operands[S->LB->nslices]));
    for (int i = 0; i < S->contrib.len && !S->failed; i++) {
      Contrib *c = &S->contrib.data[i];
      Value *v = S->map[c->region][c->v->id];
      for (int k = 0; v && k < c->nchain; k++) { /* the row-wise ops, on the chunk's rows */
        const Op *o = c->chain[k];
        TensorType t = o->results[0]->type;
        t.dims[0] = S->pi->chunk_dim;
        Op *cp = copy_op(S, c->region, o, &v, &t);
        Value *cv = cp->results[0];
        cv->sharding.naxes[0] = 0;
        memset(cv->sharding.axes[0], 0, sizeof cv->sharding.axes[0]);
        set_local(S, cv);
        v = cv;
      }
      if (!v) {
        fail(S, S->LF->loc, "a gradient is lost between the stages");
        return;
      }
      region_output(S, c->region, POUT_ACC, c->acc, v); /* widened as it is added: no f32 copy */
    }
  } else {
    for (int k = 0; k < S->B->noutputs && !S->failed; k++)
      region_output(S, PR_LAST, POUT_RESULT, k, mapped(S, PR_LAST, S->LF, S->B->outputs[k]));
  }
  for (int r = 0; r < PR__COUNT; r++) {
    IrFunc *R = S->pi->region[r];
    if (!R) continue;
    R->outputs = S->outs[r].data;
    R->noutputs = S->outs[r].len;
    /* a region keeps the operands it reads (each region saw them all while it was built) */
    int k = 0;
    for (int i = 0; i < R->ninputs; i++) {
      if (S->in[r].data[i].kind == PIN_ENV && ir_count_uses(R, R->inputs[i]) == 0) continue;
      R->inputs[k] = R->inputs[i];
      S->in[r].data[k++] = S->in[r].data[i];
    }
    R->ninputs = k;
    S->pi->in[r] = S->in[r].data;
    S->pi->out[r] = S->out[r].data;
  }
}

/* ---- 5. placement in main ---- */

static uint8_t region_place(int r) {
  if (r == PR_FIRST || r == PR_FIRST_BWD) return PLACE_FIRST;
  if (r == PR_LAST) return PLACE_LAST;
  return PLACE_FIRST | PLACE_MID | PLACE_LAST;
}

#define PLACE_EVERY (PLACE_FIRST | PLACE_MID | PLACE_LAST)

static void place_main(St *S, Op *pipe) {
  IrModule *m = S->m;
  IrFunc *f = m->main;
  int nv = m->nvalues + 1;
  uint8_t *avail = ARENA_ARRAY(m->arena, uint8_t, nv), *need = ARENA_ARRAY(m->arena, uint8_t, nv);
  /* where each operand of the pipeline is read */
  uint8_t *home_of = ARENA_ARRAY(m->arena, uint8_t, S->nopnd + 1);
  for (int r = 0; r < PR__COUNT; r++)
    for (int i = 0; S->pi->region[r] && i < S->pi->region[r]->ninputs; i++) {
      PipeSlot sl = S->pi->in[r][i];
      if (sl.kind != PIN_ENV && sl.kind != PIN_CHUNK) continue;
      const Value *x = S->pi->region[r]->inputs[i];
      bool used = sl.kind == PIN_CHUNK || ir_count_uses(S->pi->region[r], x) > 0;
      if (used) home_of[sl.index] |= sl.kind == PIN_CHUNK ? PLACE_EVERY : region_place(r);
    }
  S->pi->result_place = ARENA_ARRAY(m->arena, uint8_t, pipe->nresults + 1);
  for (int r = 0; r < PR__COUNT; r++)
    for (int i = 0; S->pi->region[r] && i < S->pi->region[r]->noutputs; i++) {
      PipeSlot sl = S->pi->out[r][i];
      if (sl.kind == POUT_ACC || sl.kind == POUT_RESULT) S->pi->result_place[sl.index] |= region_place(r);
    }
  for (int k = 0; k < pipe->nresults; k++)
    if (!S->pi->result_place[k]) S->pi->result_place[k] = PLACE_EVERY; /* zeros: no contribution */
  /* forward: where each value exists */
  for (Op *op = f->first; op; op = op->next) {
    uint8_t a = PLACE_EVERY;
    if (op == pipe) {
      for (int k = 0; k < op->nresults; k++) avail[op->results[k]->id] = S->pi->result_place[k];
      continue;
    }
    for (int i = 0; i < op->noperands; i++) a &= avail[op->operands[i]->id];
    for (int k = 0; k < op->nresults; k++) avail[op->results[k]->id] = a;
  }
  /* backward: where each value is needed. The loss (or a forward's result) on the last stage; a
   * param's update and state where the pipeline reads the param. */
  for (int k = 0; k < f->noutputs; k++) need[f->outputs[k]->id] |= PLACE_LAST;
  const StepInfo *si = m->step;
  for (int j = 0; si && j < si->nparams; j++) {
    const StepParam *sp = &si->params[j];
    uint8_t h = PLACE_EVERY;
    for (int k = 0; k < S->nopnd; k++)
      if (S->opnd[k] == sp->value && home_of[k]) h = home_of[k];
    int outs[4] = {sp->out_param, sp->out_master, sp->out_m, sp->out_v};
    for (int q = 0; q < 4; q++)
      if (outs[q] >= 0 && outs[q] < f->noutputs) need[f->outputs[outs[q]]->id] = h;
  }
  int n;
  Op **ops = op_array(m->arena, f, &n);
  for (int j = n - 1; j >= 0; j--) {
    Op *op = ops[j];
    if (op == pipe) {
      for (int i = 0; i < op->noperands; i++) {
        bool carried = i >= S->pi->nslices && i < S->pi->nslices + S->pi->ncarried;
        uint8_t h = carried ? S->pi->result_place[i - S->pi->nslices] : home_of[i];
        need[op->operands[i]->id] |= h ? h : PLACE_EVERY;
      }
      continue;
    }
    uint8_t nd = 0;
    for (int k = 0; k < op->nresults; k++) nd |= need[op->results[k]->id];
    uint8_t a = op->nresults ? avail[op->results[0]->id] : PLACE_EVERY;
    uint8_t pl = nd ? (uint8_t)(nd & a) : a;
    if (!pl) pl = a;
    op->place = pl == PLACE_EVERY ? PLACE_ALL : pl;
    for (int i = 0; i < op->noperands; i++) need[op->operands[i]->id] |= pl;
  }
}

/* A param both ends of the pipeline read (a tied embedding): its gradient accumulates on both;
 * the stages' parts are summed between them. */
static void tie(St *S, Op *pipe) {
  PipeInfo *pi = S->pi;
  uint16_t st = 0;
  for (int k = 0; k < pi->nstage_axes; k++) st |= bit(pi->stage_axes[k]);
  for (int k = 0; k < pipe->nresults; k++) {
    if (pi->result_place[k] != (PLACE_FIRST | PLACE_LAST)) continue;
    Value *r = pipe->results[k];
    Sharding want = r->sharding;
    r->sharding.partial |= st;
    Op *c = ir_op_new(S->m, S->m->main, OP_ALL_REDUCE, pipe->loc, &r, 1, &r->type, 1);
    c->axes = st;
    c->phase = PHASE_ACCUMULATE;
    c->place = PLACE_FIRST | PLACE_LAST;
    Value *cr = c->results[0];
    cr->sharding = want;
    cr->name = r->name;
    set_local(S, cr);
    c->coll = ARENA_NEW(S->m->arena, CollSpec);
    c->coll->nparts = 0;
    c->coll->ngroup = 2;
    c->coll->group[0] = 0;
    c->coll->group[1] = pi->stages - 1;
    c->reason = arena_printf(S->m->arena,
                             "%s is read on the first stage and on the last (a tied param): each accumulates "
                             "its part of the gradient, and the two stages sum them",
                             r->name ? r->name : "a param");
    ir_replace_uses(S->m->main, r, cr);
    ir_insert_before(S->m->main, pipe->next, c);
  }
}

/* ---- the pass ---- */

static uint16_t stage_mask(const Mesh *mesh, const Op *loop) {
  uint16_t m = partition_stage_axes(loop), r = 0;
  for (int a = 0; a < mesh->naxes; a++)
    if ((m >> a & 1) && mesh->axes[a].size > 1) r |= bit(a);
  return r;
}

static Op *find_pipelined(const Mesh *mesh, IrFunc *f, bool reverse, IrFunc **in) {
  for (Op *op = f->first; op; op = op->next) {
    if (op->kind != OP_LOOP || !op->body) continue;
    if (op->reverse == reverse && stage_mask(mesh, op)) {
      *in = f;
      return op;
    }
    Op *x = find_pipelined(mesh, op->body, reverse, in);
    if (x) return x;
  }
  return NULL;
}

/* A forward alone: main's ops (inputs and params apart) move into a body whose inputs stand for
 * main's inputs and params, so that the split below treats it as a step's microbatch body. */
static IrFunc *wrap_forward(St *S) {
  IrModule *m = S->m;
  IrFunc *f = m->main, *B = ir_func_new(m, intern_cstr("forward"), f);
  ValVec opnd = {0};
  for (Op *op = f->first, *next; op; op = next) {
    next = op->next;
    if (op->kind == OP_INPUT || op->kind == OP_PARAM) {
      Value *x = op->results[0];
      Value *in = ir_func_add_input(m, B, x->type, x->name);
      in->sharding = x->sharding;
      memcpy(in->local, x->local, sizeof in->local);
      in->spec = x->spec;
      VEC_PUSH(m->arena, opnd, x);
      for (Op *o = next; o; o = o->next)
        for (int i = 0; i < o->noperands; i++)
          if (o->operands[i] == x) o->operands[i] = in;
      for (int i = 0; i < f->noutputs; i++)
        if (f->outputs[i] == x) f->outputs[i] = in;
      continue;
    }
    ir_remove(f, op);
    ir_append(B, op);
    for (int k = 0; k < op->nresults; k++) op->results[k]->func = B;
    if (op->kind == OP_LOOP && op->body) op->body->parent = B;
  }
  B->outputs = f->outputs;
  B->noutputs = f->noutputs;
  S->opnd = opnd.data;
  S->nopnd = opnd.len;
  return B;
}

/* The axes over which the activation a chunk sends is replicated (no dim of it uses them, it is
 * no partial sum over them): split over them for the send when its block divides (PipeInfo). */
static uint16_t send_split(const St *S, uint16_t stage) {
  const PipeInfo *pi = S->pi;
  const IrFunc *R = pi->region[PR_CHUNK_FWD];
  const Value *act = NULL;
  for (int i = 0; R && i < R->noutputs; i++)
    if (pi->out[PR_CHUNK_FWD][i].kind == POUT_ACT) act = R->outputs[i];
  if (!act) return 0;
  uint16_t used = (uint16_t)(sharding_axes_used(&act->sharding, act->type.rank) | act->sharding.partial | stage);
  uint16_t split = 0;
  int64_t n = 1, elems = 1;
  for (int a = 0; a < S->mesh->naxes; a++)
    if (!(used & bit(a)) && S->mesh->axes[a].size > 1) split |= bit(a), n *= S->mesh->axes[a].size;
  for (int d = 0; d < act->type.rank; d++) elems *= act->local[d] > 0 ? act->local[d] : act->type.dims[d]->size;
  return split && elems % n == 0 ? split : 0;
}

bool stages_module(IrModule *m, const Program *p) {
  if (!m || !m->main || !p || !p->mesh || m->pipeline) return true;
  if (getenv("SHARDC_NO_STAGES")) return true;
  const Mesh *mesh = p->mesh;
  IrFunc *B = NULL, *BB = NULL;
  Op *LF = find_pipelined(mesh, m->main, false, &B);
  if (!LF) return true;
  St S = {.m = m, .p = p, .mesh = mesh, .LF = LF, .train = m->step != NULL};
  S.LB = S.train ? find_pipelined(mesh, m->main, true, &BB) : NULL;
  const Step *st = p->step;
  if (S.train && (!S.LB || BB != B)) return fail(&S, LF->loc, "the backward of the layers is not beside their forward");
  Op *M = NULL; /* the microbatch loop holding B */
  if (S.train) {
    M = m->step->micro_loop;
    if (!M || M->body != B) return fail(&S, LF->loc, "a pipelined step needs its microbatch loop");
  }
  if (LF->ncarried != 1 || (S.LB && S.LB->ncarried != 1))
    return fail(&S, LF->loc, "the layers carry more than the activation from one to the next (a param shared by "
                             "every layer is not supported under a pipeline)");

  PipeInfo *pi = ARENA_NEW(m->arena, PipeInfo);
  S.pi = pi;
  uint16_t sm = stage_mask(mesh, LF);
  const Value *st0 = LF->operands[0];
  for (int k = 0; k < st0->sharding.naxes[0]; k++) {
    int a = st0->sharding.axes[0][k];
    if (mesh->axes[a].size > 1) pi->stage_axes[pi->nstage_axes++] = (int8_t)a;
  }
  pi->stages = (int)sharding_axes_product(mesh, sm);
  pi->chunks = st && st->schedule == SCHED_INTERLEAVED ? (st->interleave > 0 ? st->interleave : 1) : 1;
  pi->schedule = st ? st->schedule : SCHED_GPIPE;
  pi->layers = LF->count;
  pi->stack_dim = LF->stack_dim;
  if (S.train && st && st->stage_layers) { /* uneven stages: each stage its own count (devprog.h) */
    SrcLoc at = st->key_loc[SK_STAGE_LAYERS];
    int64_t sum = 0, *L = ARENA_ARRAY(m->arena, int64_t, pi->stages);
    for (int i = 0; i < st->nstage_layers && i < pi->stages; i++) sum += L[i] = st->stage_layers[i];
    if (st->nstage_layers != pi->stages || sum != pi->layers) /* sema says so first; a module it did not see */
      return fail(&S, at, arena_printf(m->arena, "'stage_layers' deals %lld layers over %d stages, and the pipeline has %lld "
                                       "layers over %d", (long long)sum, st->nstage_layers, (long long)pi->layers,
                                       pi->stages));
    pi->stage_layers = L;
    pi->chunk_layers = 0;
    for (int s = 0; s < pi->stages; s++)
      for (int c = 0; c < pi->chunks; c++)
        if (dev_chunk_layers(pi, s, c) > pi->chunk_layers) pi->chunk_layers = dev_chunk_layers(pi, s, c);
    if (pi->chunk_layers < 1) return fail(&S, at, "'stage_layers' gives no stage a layer");
    if (!dev_pipe_uneven(pi)) pi->stage_layers = NULL; /* every chunk Lc: the even split, as if unstated */
  } else {
    if (pi->layers % ((int64_t)pi->stages * pi->chunks) != 0)
      return fail(&S, st && st->key_loc[SK_SCHEDULE].file ? st->key_loc[SK_SCHEDULE] : LF->loc,
                  arena_printf(m->arena, "%lld layers do not divide into %d stages x %d chunks", (long long)pi->layers,
                               pi->stages, pi->chunks));
    pi->chunk_layers = pi->layers / ((int64_t)pi->stages * pi->chunks);
  }
  Dim *cd = ARENA_NEW(m->arena, Dim);
  *cd = (Dim){.name = intern_cstr(arena_printf(m->arena, "%s_chunk", LF->stack_dim ? LF->stack_dim->name : "layers")),
              .size = pi->chunk_layers, .id = -1, .loc = LF->loc};
  pi->chunk_dim = cd;

  if (S.train) {
    S.opnd = M->operands;
    S.nopnd = M->noperands;
    pi->nslices = M->nslices;
    pi->ncarried = M->ncarried;
    pi->microbatches = (int)M->count;
  } else {
    B = wrap_forward(&S);
    pi->microbatches = 1;
  }
  S.B = B;
  S.n0 = m->nvalues;
  S.dep = ARENA_ARRAY(m->arena, uint8_t, S.n0 + 1);
  S.need = ARENA_ARRAY(m->arena, uint8_t, S.n0 + 1);
  S.is_acc_op = ARENA_ARRAY(m->arena, bool, S.n0 + 1);

  classify(&S);
  if (S.train) find_accumulations(&S);
  if (!S.failed) needs(&S);
  if (!S.failed) build_regions(&S);
  if (S.failed) return false;
  pi->send_split = send_split(&S, sm);

  /* the pipeline op takes the place of the microbatch loop (or of main's body) */
  TensorType *types = ARENA_ARRAY(m->arena, TensorType, (M ? M->nresults : B->noutputs) + 1);
  int nres = M ? M->nresults : B->noutputs;
  for (int k = 0; k < nres; k++) types[k] = M ? M->results[k]->type : B->outputs[k]->type;
  Op *pipe = ir_op_new(m, m->main, OP_PIPELINE, M ? M->loc : LF->loc, S.opnd, S.nopnd, types, nres);
  pipe->pipe = pi;
  pipe->phase = PHASE_ACCUMULATE;
  if (M) {
    pipe->results = M->results;
    for (int k = 0; k < nres; k++) M->results[k]->def = pipe;
    ir_insert_before(m->main, M, pipe);
    ir_remove(m->main, M);
    m->step->micro_loop = NULL;
  } else {
    for (int k = 0; k < nres; k++) {
      Value *r = pipe->results[k], *o = B->outputs[k];
      r->sharding = o->sharding;
      r->name = o->name;
      r->spec = o->spec;
      set_local(&S, r);
    }
    ir_append(m->main, pipe);
    IrFunc *f = m->main;
    f->outputs = pipe->results;
    f->noutputs = nres;
  }
  m->pipeline = pipe;

  const char *why = NULL;
  if (!schedule_build(m->arena, pi, S.train, &why))
    return fail(&S, st && st->key_loc[SK_SCHEDULE].file ? st->key_loc[SK_SCHEDULE] : LF->loc, why);
  place_main(&S, pipe);
  tie(&S, pipe);
  return true;
}

/* The fewest layers a chunk of pi holds (its largest holds pi->chunk_layers). */
static int64_t min_chunk_layers(const PipeInfo *pi) {
  int64_t r = pi->chunk_layers;
  for (int s = 0; s < pi->stages; s++)
    for (int c = 0; c < pi->chunks; c++) r = dev_chunk_layers(pi, s, c) < r ? dev_chunk_layers(pi, s, c) : r;
  return r;
}

bool stages_require_list(const IrModule *m, const Program *p, const char *cmd) {
  const PipeInfo *pi = m->pipeline ? m->pipeline->pipe : NULL;
  const Step *st = p->step;
  if (pi && dev_pipe_uneven(pi)) { /* docs/passes.md, "Uneven stages": check, explain and sim only */
    diag_error(st && st->key_loc[SK_STAGE_LAYERS].file ? st->key_loc[SK_STAGE_LAYERS] : m->pipeline->loc,
               "%s: uneven stages ('stage_layers' deals %lld layers in chunks of %lld to %lld over %d stages x %d "
               "chunk%s) are not implemented in `run` and `build` yet (issue 19): `check`, `explain` and `sim` read "
               "them; run an even split, or predict the step with `shardc sim`",
               cmd, (long long)pi->layers, (long long)min_chunk_layers(pi), (long long)pi->chunk_layers, pi->stages,
               pi->chunks, pi->chunks == 1 ? "" : "s");
    return false;
  }
  if (!pi || schedule_listed(pi)) return true;
  SrcLoc loc = st ? (st->key_loc[SK_MICROBATCHES].file ? st->key_loc[SK_MICROBATCHES] : st->loc) : m->pipeline->loc;
  diag_error(loc,
             "%s: the pipeline's schedule has %lld actions (%d stages, %d microbatches, %d chunk%s), more than the %lld "
             "`run` and `build` execute one by one; use fewer microbatches, or predict the step with `shardc sim`",
             cmd, (long long)pi->nactions, pi->stages, pi->microbatches, pi->chunks, pi->chunks == 1 ? "" : "s",
             (long long)SCHEDULE_LIST_MAX);
  return false;
}
