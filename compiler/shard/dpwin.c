/* dpwin.c: the overlap windows of data-parallel collectives (dpwin.h).
 *
 * A gradient reduction's issue point is found by walking its operand back through what passes a
 * gradient on unchanged in value (views, casts) to the value the backward makes:
 *   - a result of the microbatch loop: the body output is the accumulation's add (accumulator +
 *     this microbatch's gradient); the issue point is that gradient, in the last microbatch
 *     (via = the microbatch loop), walked back the same way inside the body;
 *   - a stacked result of a loop (per-iteration rows: a layer loop's weight gradients), in main or
 *     in the microbatch body: reduced in pieces, one per iteration of that loop;
 *   - anything else: the value itself.
 * A bucket's window is its latest member's (in program order; pieces only for a collective of its
 * own), shared by every member. */
#include <string.h>

#include "devprog.h"
#include "dpwin.h"
#include "step.h"

typedef struct DW {
  IrModule *m;
  Arena *a;
  uint16_t batch;
  bool blocking;
  int set;
  uint8_t *inv;   /* by value id: invariant()'s answer, 0 not yet asked, 1 yes, 2 no */
} DW;

static bool passes_on(const Op *d) {
  return d && d->noperands >= 1 && d->nresults == 1 &&
         (d->kind == OP_CAST || d->kind == OP_RENAME || d->kind == OP_TRANSPOSE || d->kind == OP_SPLIT ||
          d->kind == OP_MERGE);
}

static const Value *strip(const Value *v) {
  for (int guard = 0; v && passes_on(v->def) && guard < 16; guard++) v = v->def->operands[0];
  return v;
}

/* The loop result v is (its loop, its index), or NULL. */
static const Op *loop_of(const Value *v, int *r) {
  const Op *d = v ? v->def : NULL;
  if (!d || d->kind != OP_LOOP || !d->body) return NULL;
  for (int i = 0; i < d->nresults; i++)
    if (d->results[i] == v) {
      *r = i;
      return d;
    }
  return NULL;
}

static bool stacked(const Op *loop, int r) {
  return r >= loop->ncarried && loop->count > 1 && loop->count <= DPWIN_MAX_PIECES;
}

/* Line of an op, for the text. */
static int line_of(const Op *op) { return op ? op->loc.line : 0; }

/* The gradient reduction's window (w->kind already DPW_GRADIENT). */
static void gradient_window(DW *W, const Op *op, DevWindow *w) {
  const StepInfo *si = W->m->step;
  const Value *x = strip(op->operands[0]);
  int r = -1;
  const Op *L = loop_of(x, &r);
  if (L && si && L == si->micro_loop && r < L->body->noutputs) {
    /* the accumulator's add: accumulator (a body input) + this microbatch's gradient */
    const Value *o = L->body->outputs[r];
    const Value *g = NULL;
    if (o->def && o->def->kind == OP_ADD && o->def->noperands == 2)
      for (int i = 0; i < 2 && !g; i++) {
        const Value *u = o->def->operands[i];
        if (u->def) g = strip(u); /* the other is the body's input (no defining op) */
      }
    if (!g) {
      w->after = x;
      return;
    }
    w->via = L;
    w->after = g;
    int rr = -1;
    const Op *P = loop_of(g, &rr);
    if (P && stacked(P, rr)) w->piece_loop = P, w->pieces = P->count;
    return;
  }
  w->after = x;
  if (L && stacked(L, r)) w->piece_loop = L, w->pieces = L->count;
}

/* The first op after `op` in its function reading any of the members' results. */
static const Op *first_reader(const Op *op, const Op *const *members, int n) {
  for (const Op *u = op->next; u; u = u->next)
    for (int i = 0; i < u->noperands; i++)
      for (int k = 0; k < n; k++)
        for (int j = 0; j < members[k]->nresults; j++)
          if (u->operands[i] == members[k]->results[j]) return u;
  return NULL;
}

/* The loop whose body is f, or NULL. */
static const Op *owner_loop(const IrFunc *f) {
  for (const Op *l = f && f->parent ? f->parent->first : NULL; l; l = l->next)
    if (l->kind == OP_LOOP && l->body == f) return l;
  return NULL;
}

/* Whether v needs nothing an iteration of `loop` (body b) computes: a slice or an invariant of
 * the loop, or made in b from such values only (what the simulator's prefetch rule reads). */
static bool invariant(DW *W, const Op *loop, const IrFunc *b, const Value *v, int depth) {
  if (!v || depth > 64 || v->id < 0 || v->id >= W->m->nvalues) return false;
  if (W->inv[v->id]) return W->inv[v->id] == 1;
  bool r = true;
  if (!v->def) {
    r = false;
    for (int j = 0; j < b->ninputs; j++)
      if (b->inputs[j] == v) r = j < loop->nslices || j >= loop->nslices + loop->ncarried;
  } else {
    const Op *d = v->def;
    if (d->func != b || d->kind == OP_INPUT || d->kind == OP_LOOP || d->kind == OP_PIPELINE) r = false;
    for (int i = 0; i < d->noperands && r; i++) r = invariant(W, loop, b, d->operands[i], depth + 1);
  }
  if (depth <= 64) W->inv[v->id] = r ? 1 : 2;
  return r;
}

/* Whether the weight gather's operand needs nothing its loop iteration computes. */
static bool prefetchable(DW *W, const Op *op) {
  const IrFunc *b = op->func;
  const Op *loop = b ? owner_loop(b) : NULL;
  return loop && op->noperands > 0 && invariant(W, loop, b, op->operands[0], 0);
}

/* Position of op in its function (for "latest"): its index. */
static int index_in(const Op *op) {
  int i = 0;
  for (const Op *o = op->func ? op->func->first : NULL; o && o != op; o = o->next) i++;
  return i;
}

static const char *describe(DW *W, const Op *op, const DevWindow *w) {
  const char *issue;
  switch (w->kind) {
  case DPW_BLOCKING:
    issue = "blocking (dp_overlap = off): issued after the compute before it; the compute after it waits for it";
    break;
  case DPW_PREFETCH:
    issue = arena_printf(W->a, "prefetched one iteration ahead: issued when the previous iteration of the loop at "
                               "line %d starts",
                         line_of(owner_loop(op->func)));
    break;
  case DPW_GRADIENT: {
    const Op *d = w->after ? w->after->def : NULL;
    const char *what = d ? arena_printf(W->a, "%s at line %d", d->kind == OP_LOOP ? "the loop" : ir_op_name(d->kind), line_of(d))
                         : "its operand";
    if (w->pieces > 1)
      what = arena_printf(W->a, "in %lld pieces, piece i when iteration i of the loop at line %d has made its gradient",
                          (long long)w->pieces, line_of(w->piece_loop));
    else
      what = arena_printf(W->a, "once %s has made its gradient", what);
    issue = w->via ? arena_printf(W->a, "issued %s in the last microbatch's backward (the loop at line %d)", what, line_of(w->via))
                   : arena_printf(W->a, "issued %s", what);
    break;
  }
  default:
    issue = w->after && w->after->def
                ? arena_printf(W->a, "issued when its operand exists (%s at line %d)", ir_op_name(w->after->def->kind),
                               line_of(w->after->def))
                : "issued at the start (its operand is there)";
  }
  const char *done =
      w->before && w->out_loop
          ? arena_printf(W->a, "done before %s at line %d, after the loop at line %d (iteration i's overlaps the iterations after it)",
                         ir_op_name(w->before->kind), line_of(w->before), line_of(w->out_loop))
      : w->before ? arena_printf(W->a, "done before %s at line %d", ir_op_name(w->before->kind), line_of(w->before))
      : w->out_loop ? arena_printf(W->a, "done by the step's end (it overlaps the iterations after its own of the loop at line %d)", line_of(w->out_loop))
      : op->func && op->func->parent ? "done by the end of the iteration" : "done by the step's end";
  (void)op;
  return arena_printf(W->a, "%s; %s", issue, done);
}

/* A view or cast reading the result passes it on: the op that needs it is its first reader. */
static const Op *through_views(const Op *u) {
  for (int guard = 0; u && guard < 16 && (u->kind == OP_RENAME || u->kind == OP_TRANSPOSE || u->kind == OP_SPLIT ||
                                          u->kind == OP_MERGE || u->kind == OP_CAST) && u->nresults == 1; guard++) {
    const Op *next = first_reader(u, &u, 1);
    if (!next) break;
    u = next;
  }
  return u;
}

static void window_of(DW *W, Op *op) {
  if (!op->dev || !ir_op_is_collective(op->kind) || !(op->axes & W->batch)) return;
  if (op->role != ROLE_GRADIENT && op->role != ROLE_WEIGHT) return;
  if (op->dev->win) return; /* a bucket's, set at its first member */
  const DevColl *dc = op->dev->coll;
  const DevColl *bk = dc && dc->lead ? dc->lead->dev->coll : dc && dc->members ? dc : NULL;
  const Op *self[1] = {op};
  const Op *const *members = bk ? bk->members : self;
  int n = bk ? bk->nmembers : 1;
  DevWindow *w = ARENA_NEW(W->a, DevWindow);
  memset(w, 0, sizeof *w);
  const Op *first = members[0];
  for (int k = 1; k < n; k++)
    if (members[k]->func == first->func && index_in(members[k]) < index_in(first)) first = members[k];
  w->before = first_reader(first, members, n);
  const Op *L = owner_loop(first->func);
  if (!w->before && L && L->func) { /* read after the loop, through its result */
    const Value *res[8];
    int nres = 0;
    const IrFunc *b = first->func;
    for (int o = 0; o < b->noutputs && o < L->nresults && nres < 8; o++)
      for (int k = 0; k < n; k++)
        if (strip(b->outputs[o]) == members[k]->results[0] || b->outputs[o] == members[k]->results[0]) res[nres++] = L->results[o];
    for (const Op *u = L->next; u && nres && !w->before; u = u->next)
      for (int i = 0; i < u->noperands && !w->before; i++)
        for (int k = 0; k < nres; k++)
          if (u->operands[i] == res[k]) w->before = u;
    if (nres) w->out_loop = L;
  }
  w->before = through_views(w->before);
  if (W->blocking) {
    w->kind = DPW_BLOCKING;
  } else if (op->role == ROLE_GRADIENT) {
    w->kind = DPW_GRADIENT;
    if (W->m->pipeline) {
      w->kind = DPW_OPERAND; /* what the schedule makes: after its last region */
      w->after = op->operands[0];
    } else {
      gradient_window(W, first, w);
      for (int k = 0; k < n; k++) { /* a bucket: its latest member's, whole */
        DevWindow mw = {.kind = DPW_GRADIENT};
        if (members[k] == first) continue;
        gradient_window(W, members[k], &mw);
        const Op *a = w->after ? w->after->def : NULL, *b = mw.after ? mw.after->def : NULL;
        if (mw.via != w->via || !a || !b || a->func != b->func) { /* not comparable: its operands */
          w->kind = DPW_OPERAND, w->after = NULL, w->via = NULL;
          break;
        }
        if (index_in(b) > index_in(a)) w->after = mw.after;
      }
      if (n > 1) w->piece_loop = NULL, w->pieces = 0;
    }
  } else if (first->phase != PHASE_UPDATE && prefetchable(W, first)) {
    bool all = true;
    for (int k = 0; k < n && all; k++) all = prefetchable(W, members[k]) && members[k]->func == first->func;
    w->kind = all ? DPW_PREFETCH : DPW_OPERAND;
  } else {
    w->kind = DPW_OPERAND;
  }
  if (w->kind == DPW_OPERAND && !w->after && n == 1) {
    const Op *d = strip(op->operands[0])->def; /* a param or an input is there at the start */
    w->after = d && d->kind != OP_PARAM && d->kind != OP_INPUT ? op->operands[0] : NULL;
  }
  w->text = describe(W, first, w);
  for (int k = 0; k < n; k++)
    if (members[k]->dev) ((DevOp *)members[k]->dev)->win = w;
  W->set++;
}

static void walk(DW *W, IrFunc *f) {
  for (Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_LOOP && op->body) walk(W, op->body);
    window_of(W, op);
  }
}

int dpwin_module(IrModule *m, const Program *p) {
  if (!m || !m->main || !m->step || !p || !p->mesh || !p->step || p->step->kind != STEP_TRAIN) return 0;
  DW W = {.m = m, .a = m->arena, .batch = ir_batch_axes(m), .blocking = !p->step->dp_overlap};
  if (!W.batch) return 0;
  W.inv = ARENA_ARRAY(m->arena, uint8_t, m->nvalues + 1);
  walk(&W, m->main);
  if (m->pipeline)
    for (int r = 0; r < PR__COUNT; r++)
      if (m->pipeline->pipe->region[r]) walk(&W, m->pipeline->pipe->region[r]);
  return W.set;
}
