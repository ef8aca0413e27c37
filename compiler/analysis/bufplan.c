/* bufplan.c: the buffer plan (see bufplan.h).
 *
 * Roots are kept in a union-find over value ids: a view or an in-place result joins its operand's
 * buffer. Each function is planned when it is walked: views first, then each root's last use, then
 * the in-place decisions in program order (a buffer read for the last time by an elementwise op
 * takes its result), then the walk that adds up the live bytes. Sums saturate: a plan whose peak
 * exceeds 2^63 bytes reports INT64_MAX, never a wrapped figure. */
#include <math.h>
#include <string.h>

#include "bufplan.h"
#include "checked.h"
#include "devprog.h"
#include "route.h"
#include "stages.h"
#include "step.h"

bool bufplan_walk_every_run;

typedef struct Use { int64_t c[BUF__COUNT]; } Use;

static int64_t use_total(const Use *u) {
  int64_t t = 0;
  for (int i = 0; i < BUF__COUNT; i++) t = sat_add(t, u->c[i]);
  return t;
}

static void use_add(Use *u, const Use *v) {
  for (int i = 0; i < BUF__COUNT; i++) u->c[i] = sat_add(u->c[i], v->c[i]);
}

typedef VEC(BufLive) LiveVec;

typedef struct Peak {
  Use at;
  const Op *op;
  BufLive largest[BUFPLAN_LARGEST];
  int nlargest;
  int in_flight;
  bool set;
  LiveVec all;          /* every buffer live at the peak (bufplan_build_live only) */
} Peak;

typedef struct PW {
  Arena *a;
  const IrModule *m;
  const Program *p;
  BufPlan *bp;
  int stage;            /* the pipeline stage being walked (0 without one) */
  int32_t *parent;      /* union-find over value ids */
  int32_t *last;        /* per root: the last op index (in its function) that reads it */
  int64_t *bytes;       /* per value */
  uint8_t *external;    /* per root: its buffer is counted outside this function */
  uint8_t *reusable;    /* per root: an op may write its result over it in place */
  uint8_t *alive;       /* per root: allocated in the walk now */
  uint8_t *paired;      /* per value: an updated param or state written over what it replaces */
  int32_t *lvpos;       /* per root: its entry in the live list of the walk that noted it (a
                           root alive has one), so that freeing it does not scan the list */
  bool keep_live;       /* record every buffer live at each peak (Peak.all) */
  bool profile;         /* record the bytes live at each op of main (BufStage.prof) */
} PW;

static int32_t find(PW *W, int32_t v) {
  while (W->parent[v] != v) {
    W->parent[v] = W->parent[W->parent[v]];
    v = W->parent[v];
  }
  return v;
}

/* A route-patterned value is held as k (expert, slot, value) entries per token (route.h). */
static int64_t value_bytes(const Value *v) {
  int64_t n = dtype_bytes(v->type.dtype);
  for (int i = 0; i < v->type.rank; i++) {
    int64_t e = v->local[i] > 0 ? v->local[i] : v->type.dims[i]->size;
    if (e > 0 && n > INT64_MAX / e) return INT64_MAX;
    n *= e;
  }
  double d = ir_route_density(v);
  return d < 1 ? (int64_t)ceil((double)n * d) : n;
}

/* ---- classes ---- */

static void classify(PW *W) {
  const IrModule *m = W->m;
  uint8_t *c = W->bp->cls;
  memset(c, BUF_TEMP, (size_t)W->bp->nvalues);
  const IrFunc *f = m->main;
  const StepInfo *si = m->step;
  for (const Op *op = f->first; op; op = op->next)
    if (op->kind == OP_PARAM) c[op->results[0]->id] = BUF_PARAM;
  for (int j = 0; si && j < si->nparams; j++) {
    const StepParam *sp = &si->params[j];
    int ins[3] = {sp->in_master, sp->in_m, sp->in_v}, outs[3] = {sp->out_master, sp->out_m, sp->out_v};
    for (int q = 0; q < 3; q++) {
      if (ins[q] >= 0 && ins[q] < f->ninputs) c[f->inputs[ins[q]]->id] = BUF_OPT;
      if (outs[q] >= 0 && outs[q] < f->noutputs) c[f->outputs[outs[q]]->id] = BUF_OPT;
    }
    if (sp->out_param >= 0 && sp->out_param < f->noutputs) c[f->outputs[sp->out_param]->id] = BUF_PARAM;
    if (sp->grad) c[sp->grad->id] = BUF_GRAD;
  }
  /* a gradient stays one through its reductions, slices and casts until the optimizer reads it */
  for (const Op *op = f->first; op; op = op->next) {
    bool carries = ir_op_is_collective(op->kind) || op->kind == OP_SLICE || op->kind == OP_CAST ||
                   op->kind == OP_TRANSPOSE;
    if (carries && op->noperands == 1 && c[op->operands[0]->id] == BUF_GRAD && c[op->results[0]->id] == BUF_TEMP)
      c[op->results[0]->id] = BUF_GRAD;
  }
}

static void mark_saved(PW *W, const IrFunc *f) {
  for (const Op *op = f->first; op; op = op->next) {
    for (int r = 0; r < op->nresults; r++)
      if (op->results[r]->saved && W->bp->cls[op->results[r]->id] == BUF_TEMP) W->bp->cls[op->results[r]->id] = BUF_ACT;
    if (op->kind == OP_LOOP && op->body) mark_saved(W, op->body);
    for (int r = 0; op->kind == OP_PIPELINE && r < PR__COUNT; r++)
      if (op->pipe->region[r]) mark_saved(W, op->pipe->region[r]);
  }
}

/* ---- roots ---- */

bool bufplan_is_view(const Op *op) {
  switch (op->kind) { /* each view's condition its own */
  case OP_RENAME: case OP_SPLIT: case OP_MERGE: return true;
  case OP_SLICE: /* a block of the leading dim alone is a contiguous part of its operand */
    return dev_op_noffs(op) == 1 && op->operands[0]->type.rank > 0 &&
           op->dev->offs[0].dim == op->operands[0]->type.dims[0];
  case OP_CAST: return op->results[0]->type.dtype == op->operands[0]->type.dtype;
  case OP_TRANSPOSE: { /* the same dim order: a copy ir_build or the step made for a boundary */
    const TensorType *a = &op->operands[0]->type, *b = &op->results[0]->type;
    if (a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
      if (a->dims[i] != b->dims[i]) return false;
    return true;
  }
  default: return false;
  }
}

/* the table's OPF_INPLACE ops (ops.def): each element read where it is written (elementwise ops,
 * casts, masks, the optimizer's updates; NCCL and the runtime reduce or shift in place) */
static bool in_place_op(const Op *op) { return op->nresults == 1 && (ir_op_info(op->kind)->flags & OPF_INPLACE); }

static void join(PW *W, int32_t into, int32_t from) {
  into = find(W, into), from = find(W, from);
  if (into == from) return;
  W->parent[from] = into;
  if (W->last[from] > W->last[into]) W->last[into] = W->last[from];
}

/* zero over the flattened params (step.h's StepParam.flat): the state, and under zero = 2 the
 * reduced gradient, of such a param take its flat shard's bytes (the IR holds them whole) */
static void flat_state_bytes(PW *W, const IrFunc *f) {
  const StepInfo *si = W->m->step;
  for (int j = 0; si && j < si->nparams; j++) {
    const StepParam *sp = &si->params[j];
    if (sp->flat <= 1) continue;
    const int ins[3] = {sp->in_master, sp->in_m, sp->in_v}, outs[3] = {sp->out_master, sp->out_m, sp->out_v};
    for (int q = 0; q < 3; q++) {
      const Value *v[2] = {ins[q] >= 0 && ins[q] < f->ninputs ? f->inputs[ins[q]] : NULL,
                           outs[q] >= 0 && outs[q] < f->noutputs ? f->outputs[outs[q]] : NULL};
      for (int k = 0; k < 2; k++)
        if (v[k]) W->bytes[v[k]->id] = step_flat_bytes(sp, W->bytes[v[k]->id], dtype_bytes(v[k]->type.dtype));
    }
    if (!si->step || si->step->zero < 2 || !sp->grad) continue;
    const Value *g = sp->grad; /* followed through its reduction and casts, as memory.c's resident state */
    for (const Op *op = f->first; op; op = op->next) {
      bool carries = ir_op_is_collective(op->kind) || op->kind == OP_CAST || op->kind == OP_TRANSPOSE;
      if (carries && op->noperands == 1 && op->nresults == 1 && op->operands[0] == g) g = op->results[0];
    }
    if (g != sp->grad) W->bytes[g->id] = step_flat_bytes(sp, W->bytes[g->id], dtype_bytes(g->type.dtype));
  }
}

/* Plans f's roots; `k_of` gets each op's index. Inputs of f are external: `reuse_inputs[i]`
 * says which may be written over in place (a loop's carried values, a region's activation). */
static void plan_roots(PW *W, const IrFunc *f, const bool *reuse_inputs, const Op *loop) {
  for (int i = 0; i < f->ninputs; i++) {
    const Value *x = f->inputs[i];
    W->parent[x->id] = x->id;
    W->last[x->id] = -1;
    W->external[x->id] = !x->def; /* main's inputs are OP_INPUT results: buffers of main */
    W->reusable[x->id] = reuse_inputs && reuse_inputs[i];
  }
  int k = 0;
  for (const Op *op = f->first; op; op = op->next, k++)
    for (int r = 0; r < op->nresults; r++) {
      const Value *v = op->results[r];
      W->parent[v->id] = v->id;
      W->last[v->id] = k;
      W->external[v->id] = 0;
      W->reusable[v->id] = op->kind != OP_PARAM && op->kind != OP_INPUT;
      W->bytes[v->id] = value_bytes(v);
      if (bufplan_is_view(op)) W->parent[v->id] = find(W, op->operands[0]->id);
    }
  for (int i = 0; i < f->ninputs; i++) W->bytes[f->inputs[i]->id] = value_bytes(f->inputs[i]);
  if (f == W->m->main) flat_state_bytes(W, f);
  /* last uses (a view's reads keep its buffer) */
  k = 0;
  for (const Op *op = f->first; op; op = op->next, k++)
    for (int i = 0; i < op->noperands; i++) {
      int32_t r = find(W, op->operands[i]->id);
      if (W->last[r] < k) W->last[r] = k;
    }
  for (int i = 0; i < f->noutputs; i++) W->last[find(W, f->outputs[i]->id)] = k;
  /* params are resident: they outlive the step (a forward alone reads each once, early) */
  for (const Op *op = f->first; op; op = op->next)
    if (op->kind == OP_PARAM) W->last[find(W, op->results[0]->id)] = k;
  /* a loop body's stacked outputs are written into their row of the loop's result */
  for (int i = loop ? loop->ncarried : 0; loop && i < loop->ncarried + loop->nstacked && i < f->noutputs; i++)
    W->external[find(W, f->outputs[i]->id)] = 1;
  int n = k;
  /* an updated param or state takes the buffer of what it replaces (main only) */
  const StepInfo *si = W->m->step;
  if (f == W->m->main && si) {
    int32_t *def_k = ARENA_ARRAY(W->a, int32_t, W->bp->nvalues); /* by value id: its op's index in f, or 0 */
    k = 0;
    for (const Op *op = f->first; op; op = op->next, k++)
      for (int r = 0; r < op->nresults; r++)
        if (op->results[r] && op->results[r]->id < W->bp->nvalues) def_k[op->results[r]->id] = k;
    for (int j = 0; j < si->nparams; j++) {
      const StepParam *sp = &si->params[j];
      const Value *in[4] = {sp->value, sp->in_master >= 0 ? f->inputs[sp->in_master] : NULL,
                            sp->in_m >= 0 ? f->inputs[sp->in_m] : NULL, sp->in_v >= 0 ? f->inputs[sp->in_v] : NULL};
      int outs[4] = {sp->out_param, sp->out_master, sp->out_m, sp->out_v};
      for (int q = 0; q < 4; q++) {
        if (!in[q] || outs[q] < 0 || outs[q] >= f->noutputs) continue;
        const Value *o = f->outputs[outs[q]];
        int32_t ri = find(W, in[q]->id), ro = find(W, o->id);
        if (ri == ro || W->external[ro]) continue;
        /* the input's buffer is free once its last reader ran: the output is written after */
        int def = o->id < W->bp->nvalues ? def_k[o->id] : 0;
        if (W->last[ri] <= def || W->last[ri] == n) {
          W->last[ri] = W->last[ri] > W->last[ro] ? W->last[ri] : W->last[ro];
          W->parent[ro] = ri;
          W->paired[o->id] = 1;
        }
      }
    }
  }
  /* in place, in program order */
  k = 0;
  for (const Op *op = f->first; op; op = op->next, k++) {
    if (op->kind == OP_LOOP || op->kind == OP_PIPELINE) { /* carried results update their operands */
      int first = op->kind == OP_LOOP ? op->nslices : op->pipe->nslices;
      int nc = op->kind == OP_LOOP ? op->ncarried : op->pipe->ncarried;
      for (int i = 0; i < nc && i < op->nresults && first + i < op->noperands; i++) {
        int32_t x = find(W, op->operands[first + i]->id);
        if (W->last[x] == k && W->reusable[x] && !W->external[x]) join(W, x, op->results[i]->id);
      }
      continue;
    }
    if (!in_place_op(op)) continue;
    int32_t res = op->results[0]->id;
    if (find(W, res) != res || W->paired[res]) continue;
    for (int i = 0; i < op->noperands; i++) {
      int32_t x = find(W, op->operands[i]->id);
      if (x == res || W->last[x] != k || !W->reusable[x] || W->bytes[x] < W->bytes[res]) continue;
      if (W->bp->cls[x] != W->bp->cls[res]) continue; /* a buffer holds one class of value */
      join(W, x, res);
      break;
    }
  }
}

/* A buffer's class: the strongest of the values living in it (a gradient's view of its f32 cast
 * is a gradient; a rename of a saved value is an activation). */
static void root_classes(PW *W, const IrFunc *f) {
  uint8_t *c = W->bp->cls;
  for (int i = 0; i < f->ninputs; i++) {
    int32_t r = find(W, f->inputs[i]->id);
    if (c[f->inputs[i]->id] < c[r]) c[r] = c[f->inputs[i]->id];
  }
  for (const Op *op = f->first; op; op = op->next)
    for (int k = 0; k < op->nresults; k++) {
      int32_t v = op->results[k]->id, r = find(W, v);
      if (c[v] < c[r]) c[r] = c[v];
    }
}

/* ---- the walk ---- */

static void note_live(LiveVec *lv, const Value *v, int64_t bytes, uint8_t cls, Arena *a) {
  VEC_PUSH(a, *lv, ((BufLive){v, bytes, cls, 1}));
}

static void insert_largest(BufLive *top, int *n, BufLive x) {
  if (x.bytes <= 0) return;
  if (*n == BUFPLAN_LARGEST && top[BUFPLAN_LARGEST - 1].bytes >= x.bytes) return;
  int i = *n < BUFPLAN_LARGEST ? (*n)++ : BUFPLAN_LARGEST - 1;
  top[i] = x;
  for (; i > 0 && top[i].bytes > top[i - 1].bytes; i--) {
    BufLive t = top[i];
    top[i] = top[i - 1];
    top[i - 1] = t;
  }
}

/* A new peak candidate: live + inner (a body's or a pipeline's peak at this op). */
/* The live list's largest entries without a scan of it: a tournament tree over its positions, each
 * node holding the position of the largest entry below it (ties: the lower position, as a scan in
 * order keeps the first of equal entries). A walk notes and frees one entry per op, and sets a new
 * peak at nearly every op of a forward: scanning the list at each peak made the walk quadratic in a
 * long function (a written-out chain of layers). */
typedef struct LiveTree {
  const LiveVec *lv;
  int32_t *node;        /* 1..2*size-1; leaves at size + position; -1 none */
  int size;
} LiveTree;

static bool live_before(const LiveVec *lv, int32_t a, int32_t b) { /* a ahead of b in the stable order */
  if (b < 0) return a >= 0;
  if (a < 0) return false;
  if (lv->data[a].bytes != lv->data[b].bytes) return lv->data[a].bytes > lv->data[b].bytes;
  return a < b;
}

static void live_tree_init(Arena *a, LiveTree *t, const LiveVec *lv, int cap) {
  t->lv = lv;
  t->size = 1;
  while (t->size < cap) t->size *= 2;
  t->node = ARENA_ARRAY(a, int32_t, 2 * t->size);
  for (int i = 0; i < 2 * t->size; i++) t->node[i] = -1;
}

/* Position pos holds a new entry (or none, past the list's end). */
static void live_tree_set(LiveTree *t, int pos) {
  if (pos < 0 || pos >= t->size) return;
  int i = t->size + pos;
  t->node[i] = pos < t->lv->len ? pos : -1;
  for (i /= 2; i >= 1; i /= 2) {
    int32_t l = t->node[2 * i], r = t->node[2 * i + 1];
    t->node[i] = live_before(t->lv, r, l) ? r : l;
  }
}

/* The list's entries in the stable order (largest first), at most k of them, into pos[]. */
static int live_tree_top(const LiveTree *t, int32_t *pos, int k) {
  int32_t heap[2 * BUFPLAN_LARGEST * 24]; /* nodes to open, best first (at most k pops, 2 pushes each) */
  int nh = 0, n = 0;
  if (t->node[1] < 0) return 0;
  heap[nh++] = 1;
  while (nh > 0 && n < k) {
    int b = 0; /* the best node (few: a scan is enough) */
    for (int i = 1; i < nh; i++)
      if (live_before(t->lv, t->node[heap[i]], t->node[heap[b]])) b = i;
    int v = heap[b];
    heap[b] = heap[--nh];
    if (v >= t->size) { /* a leaf: the next entry */
      pos[n++] = t->node[v];
      continue;
    }
    /* the child holding the node's best is opened through (its best is the node's); the other
     * child waits in the heap */
    int bc = t->node[2 * v] == t->node[v] ? 2 * v : 2 * v + 1, oc = bc ^ 1;
    if (t->node[oc] >= 0 && nh < (int)(sizeof heap / sizeof heap[0])) heap[nh++] = oc;
    if (nh < (int)(sizeof heap / sizeof heap[0])) heap[nh++] = bc;
  }
  return n;
}

static void consider(PW *W, Peak *best, const Use *live, const LiveVec *lv, const LiveTree *tree, const Peak *inner,
                     const Op *op, int in_flight) {
  Use u = *live;
  if (inner) use_add(&u, &inner->at);
  if (best->set && use_total(&u) <= use_total(&best->at)) return;
  best->set = true;
  best->at = u;
  best->op = inner && inner->op ? inner->op : op;
  best->nlargest = 0;
  best->in_flight = in_flight;
  if (tree) { /* the list's largest, in the order a scan would keep them: the same largest */
    int32_t top[BUFPLAN_LARGEST];
    int n = live_tree_top(tree, top, BUFPLAN_LARGEST);
    for (int i = 0; i < n; i++) insert_largest(best->largest, &best->nlargest, lv->data[top[i]]);
  } else {
    for (int i = 0; i < lv->len; i++) insert_largest(best->largest, &best->nlargest, lv->data[i]);
  }
  for (int i = 0; inner && i < inner->nlargest; i++) insert_largest(best->largest, &best->nlargest, inner->largest[i]);
  if (!W->keep_live) return;
  best->all.len = 0;
  for (int i = 0; i < lv->len; i++) VEC_PUSH(W->a, best->all, lv->data[i]);
  for (int i = 0; inner && i < inner->all.len; i++) VEC_PUSH(W->a, best->all, inner->all.data[i]);
}

static void walk_func(PW *W, const IrFunc *f, const bool *reuse_inputs, const Op *loop, Peak *out);

/* Stage s's share of a pipeline: its schedule's residuals kept, activations in flight, regions. */
static void walk_pipeline(PW *W, const Op *pipe, Peak *out) {
  const PipeInfo *pi = pipe->pipe;
  Peak rp[PR__COUNT];
  memset(rp, 0, sizeof rp);
  for (int r = 0; r < PR__COUNT; r++) {
    const IrFunc *R = pi->region[r];
    if (!R) continue;
    bool *reuse = ARENA_ARRAY(W->a, bool, R->ninputs + 1);
    for (int i = 0; i < R->ninputs; i++) reuse[i] = pi->in[r][i].kind == PIN_ACT;
    walk_func(W, R, reuse, NULL, &rp[r]);
  }
  /* what one (microbatch, chunk) keeps, and each region's activation out and in */
  int64_t keep = 0, act_out[PR__COUNT] = {0}, act_in[PR__COUNT] = {0};
  const Value *kept = NULL;
  for (int r = 0; r < PR__COUNT; r++) {
    const IrFunc *R = pi->region[r];
    for (int i = 0; R && i < R->noutputs; i++) {
      if (pi->out[r][i].kind == POUT_SAVE) keep = sat_add(keep, value_bytes(R->outputs[i])), kept = R->outputs[i];
      if (pi->out[r][i].kind == POUT_ACT) act_out[r] = value_bytes(R->outputs[i]);
    }
    for (int i = 0; R && i < R->ninputs; i++)
      if (pi->in[r][i].kind == PIN_ACT) act_in[r] = value_bytes(R->inputs[i]);
  }
  Use live = {0};
  LiveVec lv = {0};
  int64_t stores = 0;
  int64_t act_bytes_fwd = act_out[PR_FIRST], act_bytes_bwd = act_out[PR_LAST];
  /* The stage's schedule in bounded form (shard/schedule.h). Within a span run R times, what is
   * live at any of its actions is what is live there in the first run plus (r - 1) times what one
   * run adds in the r-th: each total considered is linear in r, so the largest is in the first run
   * or the last (and ties go to the first, as in a walk of every run). The span is walked for its
   * first run, then again from where its last run starts: the same peak as the whole list, in
   * O(p V) steps whatever the number of microbatches. */
  int s = W->stage;
  for (int i = pi->first_form[s]; i < pi->first_form[s + 1];) {
    const PipeSpan *sp = NULL;
    for (int k = 0; k < 2; k++)
      if (pi->spans[2 * s + k].len > 0 && pi->spans[2 * s + k].first == i) sp = &pi->spans[2 * s + k];
    int len = sp ? sp->len : 1, runs = sp ? (bufplan_walk_every_run ? sp->reps : sp->reps > 1 ? 2 : 1) : 1;
    Use live0 = live;
    int64_t stores0 = stores;
    for (int run = 0; run < runs; run++) {
      if (run == 1 && !bufplan_walk_every_run) { /* to the start of the last run */
        int64_t more = sp->reps - 1;
        for (int c = 0; c < BUF__COUNT; c++) {
          int64_t d;
          if (ckd_sub(&d, live.c[c], live0.c[c])) d = live.c[c] > live0.c[c] ? INT64_MAX : INT64_MIN;
          live.c[c] = sat_add(live0.c[c], sat_mul(more, d));
        }
        stores = stores0 + more * (stores - stores0);
      }
      for (int t = i; t < i + len; t++) {
        const PipeAction *a = &pi->form[t];
        static const int8_t region_of[] = {PR_FIRST, PR_CHUNK_FWD, PR_LAST, PR_CHUNK_BWD, PR_FIRST_BWD, -1, -1};
        int r = region_of[a->kind];
        if (a->kind == PA_SEND || a->kind == PA_RECV) {
          int64_t b = a->backward ? act_bytes_bwd : act_bytes_fwd;
          live.c[BUF_TEMP] = sat_add(live.c[BUF_TEMP], a->kind == PA_RECV ? b : -b);
          continue;
        }
        lv.len = 0;
        int in_flight = stores > INT32_MAX ? INT32_MAX : (int)stores;
        if (stores > 0 && kept) VEC_PUSH(W->a, lv, ((BufLive){kept, sat_mul(keep, stores), BUF_ACT, in_flight}));
        consider(W, out, &live, &lv, NULL, &rp[r], pipe, in_flight);
        /* after the region: its activation leaves, what it read arrives no more, residuals kept */
        live.c[BUF_TEMP] = sat_add(live.c[BUF_TEMP], act_out[r] - act_in[r]);
        if (r == PR_CHUNK_FWD && pi->region[PR_CHUNK_BWD]) stores++, live.c[BUF_ACT] = sat_add(live.c[BUF_ACT], keep);
        if (r == PR_CHUNK_BWD) stores--, live.c[BUF_ACT] = sat_add(live.c[BUF_ACT], -keep);
      }
    }
    i += len;
  }
}

static void walk_func(PW *W, const IrFunc *f, const bool *reuse_inputs, const Op *loop, Peak *out) {
  memset(out, 0, sizeof *out);
  plan_roots(W, f, reuse_inputs, loop);
  root_classes(W, f);
  const PipeInfo *pi = W->m->pipeline ? W->m->pipeline->pipe : NULL;
  bool main_fn = f == W->m->main;
  Use live = {0};
  LiveVec lv = {0};
  int nres = 0;
  for (const Op *op = f->first; op; op = op->next) nres += op->nresults;
  LiveTree tree;
  live_tree_init(W->a, &tree, &lv, nres > 0 ? nres : 1);
  int k = 0;
  for (const Op *op = f->first; op; op = op->next, k++) {
    if (main_fn && pi && !dev_stage_runs(dev_op_runs(op), W->stage, pi->stages)) continue;
    for (int r = 0; r < op->nresults; r++) {
      int32_t x = find(W, op->results[r]->id);
      if (W->external[x] || W->alive[x]) continue;
      W->alive[x] = 1;
      uint8_t c = W->bp->cls[x];
      live.c[c] = sat_add(live.c[c], W->bytes[x]);
      W->lvpos[x] = lv.len;
      note_live(&lv, op->results[r], W->bytes[x], c, W->a);
      live_tree_set(&tree, lv.len - 1);
    }
    Peak inner;
    bool has_inner = false;
    if (op->kind == OP_LOOP && op->body) {
      bool *reuse = ARENA_ARRAY(W->a, bool, op->body->ninputs + 1);
      for (int i = op->nslices; i < op->nslices + op->ncarried && i < op->body->ninputs; i++) reuse[i] = true;
      walk_func(W, op->body, reuse, op, &inner);
      has_inner = true;
    } else if (op->kind == OP_PIPELINE && op->pipe) {
      memset(&inner, 0, sizeof inner);
      walk_pipeline(W, op, &inner);
      has_inner = true;
    }
    const DevRing *dring = op->dev ? op->dev->ring : NULL;
    if (dring && dring->carries) {
      /* ring attention: while it runs, the block arriving beside the one at hand (the device
       * program's step: K and V; the backward also their gradients' travelling sums): never more
       * than two K/V blocks */
      Peak ring = {0};
      ring.at.c[BUF_TEMP] = dring->steps ? (int64_t)dring->step_bytes : 0;
      ring.op = op; /* (no value of the program holds it: it is in no list of the largest buffers) */
      consider(W, out, &live, &lv, &tree, &ring, op, 0);
    }
    consider(W, out, &live, &lv, &tree, has_inner ? &inner : NULL, op, has_inner ? inner.in_flight : 0);
    if (main_fn && W->profile) { /* what consider weighed: live now, a loop's or pipeline's peak added */
      BufStage *bs = &W->bp->stages[W->stage];
      Use u = live;
      if (has_inner) use_add(&u, &inner.at);
      bs->prof_ops[bs->nprof] = op;
      memcpy(bs->prof + (size_t)bs->nprof++ * BUF__COUNT, u.c, sizeof u.c);
    }
    /* free what this op read (or made) for the last time */
    for (int pass = 0; pass < 2; pass++) {
      int n = pass ? op->nresults : op->noperands;
      for (int i = 0; i < n; i++) {
        const Value *v = pass ? op->results[i] : op->operands[i];
        int32_t x = find(W, v->id);
        if (!W->alive[x] || W->last[x] != k) continue;
        W->alive[x] = 0;
        uint8_t c = W->bp->cls[x];
        live.c[c] = sat_add(live.c[c], -W->bytes[x]);
        int32_t j = W->lvpos[x];
        if (j >= 0 && j < lv.len && find(W, lv.data[j].v->id) == x) { /* its one entry, swapped out */
          lv.data[j] = lv.data[--lv.len];
          if (j < lv.len) W->lvpos[find(W, lv.data[j].v->id)] = j;
          live_tree_set(&tree, j);
          live_tree_set(&tree, lv.len);
          continue;
        }
        for (int jj = 0; jj < lv.len; jj++) /* (noted elsewhere: as before, by a scan) */
          if (find(W, lv.data[jj].v->id) == x) {
            lv.data[jj] = lv.data[--lv.len];
            if (jj < lv.len) W->lvpos[find(W, lv.data[jj].v->id)] = jj;
            live_tree_set(&tree, jj);
            live_tree_set(&tree, lv.len);
            jj--;
          }
      }
    }
  }
}

void bufplan_build(Arena *a, const IrModule *m, const Program *p, BufPlan *out) {
  bufplan_build_live(a, m, p, false, out);
}

void bufplan_annotate(DevModule *dm) {
  if (!dm || dm->buffers) return;
  BufPlan bp;
  bufplan_build(dm->arena, dm->m, NULL, &bp);
  for (int i = 0; i <= dm->nvalues && i < bp.nvalues; i++) dm->values[i].buffer = bp.buffer[i];
  dm->buffers = true;
}

static void build(Arena *a, const IrModule *m, const Program *p, bool keep_live, bool profile, BufPlan *out);

void bufplan_build_live(Arena *a, const IrModule *m, const Program *p, bool keep_live, BufPlan *out) {
  build(a, m, p, keep_live, false, out);
}

void bufplan_build_profile(Arena *a, const IrModule *m, const Program *p, BufPlan *out) { build(a, m, p, false, true, out); }

static void build(Arena *a, const IrModule *m, const Program *p, bool keep_live, bool profile, BufPlan *out) {
  memset(out, 0, sizeof *out);
  if (!m || !m->main) return;
  int nv = m->nvalues + 1;
  out->nvalues = nv;
  out->root = ARENA_ARRAY(a, int32_t, nv);
  out->buffer = ARENA_ARRAY(a, int32_t, nv);
  out->cls = ARENA_ARRAY(a, uint8_t, nv);
  PW W = {.a = a, .m = m, .p = p, .bp = out, .keep_live = keep_live, .profile = profile};
  W.parent = ARENA_ARRAY(a, int32_t, nv);
  W.lvpos = ARENA_ARRAY(a, int32_t, nv);
  W.last = ARENA_ARRAY(a, int32_t, nv);
  W.bytes = ARENA_ARRAY(a, int64_t, nv);
  W.external = ARENA_ARRAY(a, uint8_t, nv);
  W.reusable = ARENA_ARRAY(a, uint8_t, nv);
  W.alive = ARENA_ARRAY(a, uint8_t, nv);
  W.paired = ARENA_ARRAY(a, uint8_t, nv);
  for (int i = 0; i < nv; i++) W.parent[i] = i;
  classify(&W);
  mark_saved(&W, m->main);
  /* a root's class: the strongest of the values living in it (set after the walk's unions) */
  const PipeInfo *pi = m->pipeline ? m->pipeline->pipe : NULL;
  out->nstages = pi ? pi->stages : 1;
  out->stages = ARENA_ARRAY(a, BufStage, out->nstages);
  int nops = 0;
  for (const Op *op = m->main->first; op; op = op->next) nops++;
  for (int s = 0; s < out->nstages; s++) {
    W.stage = s;
    if (profile) {
      out->stages[s].prof_ops = ARENA_ARRAY(a, const Op *, nops + 1);
      out->stages[s].prof = ARENA_ARRAY(a, int64_t, (size_t)(nops + 1) * BUF__COUNT);
    }
    memset(W.alive, 0, (size_t)nv);
    Peak pk;
    walk_func(&W, m->main, NULL, NULL, &pk);
    BufStage *bs = &out->stages[s];
    bs->stage = s;
    bs->peak = use_total(&pk.at);
    memcpy(bs->by_class, pk.at.c, sizeof bs->by_class);
    bs->peak_op = pk.op;
    bs->nlargest = pk.nlargest;
    memcpy(bs->largest, pk.largest, sizeof bs->largest);
    bs->in_flight = pk.in_flight;
    bs->live = pk.all.data;
    bs->nlive = pk.all.len;
    if (bs->peak > out->stages[out->worst].peak) out->worst = s;
  }
  for (int i = 0; i < nv; i++) {
    out->buffer[i] = find(&W, i);
    out->root[i] = W.external[out->buffer[i]] ? -1 : out->buffer[i];
  }
}

const char *bufplan_class_name(BufClass c) {
  static const char *const names[BUF__COUNT] = {"params", "grads", "optimizer", "activations", "temporaries"};
  return c >= 0 && c < BUF__COUNT ? names[c] : "?";
}
