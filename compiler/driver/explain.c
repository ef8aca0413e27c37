/* explain.c: `shardc explain FILE`: every op with its sharding, every collective with its reason
 * and cost.
 *
 * Pipeline: load and lower (check.c) -> memory fit (memory.c; explain does not require a fit: it
 * warns and reports it) -> propagation (propagate.c) -> partitioning (partition.c) -> this report.
 * Per op: its sharding (`bf16[batch@data, hidden@model]{sum: model}`), its local shape per device,
 * FLOPs per device and roofline time. Per collective: kind, axes, the tensor, bytes per device
 * (language.md's definition), time, the link class it rides, the source line, the reason and, in
 * a loop, how many times a step runs it. Then totals per kind and per axis group, communication
 * against compute per layer with the verdict and the book's thresholds, and the pipeline's stages.
 * Every time is ideal (peak FLOP/s, HBM and link bandwidth: the book's arithmetic), so that the
 * figures can be checked by hand; `shardc sim` applies the calibrated efficiencies.
 * docs/explain.md shows how to read the output. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bucket.h"
#include "check.h"
#include "devprog.h"
#include "dpwin.h"
#include "explain_show.h"
#include "explain_textbook.h"
#include "report.h"
#include "route.h"
#include "cost.h"
#include "memory.h"
#include "opcost.h"
#include "schedule.h"
#include "stages.h"
#include "partition.h"
#include "propagate.h"
#include "step.h"

typedef struct OpRow {
  const Op *op;
  int depth;            /* loop nesting */
  double count;         /* runs per step, per device (averaged over the devices, so that flops x count x
                           devices adds up to check's flops_per_step) */
  double flops;         /* per device, one run */
  double time_s;        /* roofline, one run */
  const char *stages;   /* the pipeline stages that run it ("first stage"), NULL: every device */
  const char *heading;  /* a pipeline region starts here: its heading */
} OpRow;

typedef struct CollRow {
  const Op *op;         /* the collective; NULL for a pipeline's transfers (the schedule's sends) */
  int depth;
  double count;         /* runs per step, per device (averaged over the devices: a collective only
                           the first stage runs counts 1/p per run) */
  CollKind kind;
  CollCost cost;        /* one run */
  bool in_layer;        /* inside the stacked loop's body (not a pipeline transfer) */
  const char *stages;   /* "first stage", "last stage": the stages that run it; NULL every device */
  /* what the report prints (the op's, or a transfer's) */
  uint16_t axes;
  int phase;
  SrcLoc loc;
  const char *reason;
  const Value *x, *y;
  int nbucket;          /* a bucket (shard/bucket.h): its members, one run of their summed bytes;
                           0 for a collective of its own */
  const char *members;  /* a bucket's members: what each moves */
  const char *region;   /* the pipeline region it runs in, or the pipeline's transfers; NULL outside */
  const char *overlapped; /* a collective matmul (the device program's DevCmm): why; NULL otherwise */
  /* a data-parallel collective's overlap window (the device program's DevWindow, shard/dpwin.h) */
  const DevWindow *win;
  double win_compute_s; /* the compute between its issue (the last piece's) and `before`, ideal */
  double piece_s;       /* in pieces: one piece's time; each earlier piece has one iteration ... */
  double iter_s;        /* ... of the piece loop's compute, iter_s, to hide behind */
  double hidden_s;      /* what that compute hides of it: min(time, window) (per piece, summed) */
} CollRow;

typedef struct Explain {
  const Options *o;
  const Program *p;
  IrModule *m;
  const Mesh *mesh;
  Arena *a;
  VEC(OpRow) ops;
  VEC(CollRow) colls;
  const Op *layer_loop;            /* the first stacked loop: "a layer" is one of its iterations */
  double compute_s, comm_s;        /* per step, per device */
  double loop_outer_mult;          /* runs per step of the loop being collected */
  double layer_compute_s, layer_comm_s;
  MemoryReport mem;
  const PipeInfo *pipe; /* the step's pipeline (m->pipeline), or NULL */
  bool has_pipe;
  const char *region;   /* the pipeline region being collected (CollRow.region) */
} Explain;

/* ---- formatting ---- */

static const char *fmt_bytes(Arena *a, double b) {
  char buf[32];
  memory_format_bytes(buf, sizeof buf, b);
  return arena_printf(a, "%s", buf);
}

static const char *fmt_time(Arena *a, double s) { return report_seconds(a, s); }

static const char *fmt_count(Arena *a, double n) {
  if (n >= 1e15 || n != floor(n)) return arena_printf(a, "%.3g", n); /* a pipeline's averages: 0.25 */
  return arena_printf(a, "%.0f", n);
}

static const char *sharding_text(const Explain *E, const Value *v) {
  char buf[512];
  sharding_format(buf, sizeof buf, &v->type, &v->sharding, E->mesh);
  if (v->partial_max) {
    char *s = strstr(buf, "{sum:");
    if (s) memcpy(s, "{max:", 5);
  }
  return arena_printf(E->a, "%s", buf);
}

static const char *local_shape(const Explain *E, const TensorType *t, const Sharding *s) {
  char buf[256];
  int n = snprintf(buf, sizeof buf, "%s[", dtype_name(t->dtype));
  for (int d = 0; d < t->rank && n < (int)sizeof buf - 24; d++)
    n += snprintf(buf + n, sizeof buf - (size_t)n, "%s%lld", d ? ", " : "",
                  (long long)sharding_local_extent(t, s, E->mesh, d));
  snprintf(buf + n, sizeof buf - (size_t)n, "]");
  return arena_printf(E->a, "%s", buf);
}

static const char *axes_names(const Explain *E, uint16_t axes, bool parens) {
  char buf[160];
  int n = 0, cnt = 0, k = 0;
  for (int a = 0; a < E->mesh->naxes; a++) cnt += (axes >> a) & 1;
  buf[0] = 0;
  if (cnt > 1 && parens) n += snprintf(buf, sizeof buf, "(");
  for (int a = 0; a < E->mesh->naxes && n < (int)sizeof buf - 20; a++)
    if ((axes >> a) & 1) n += snprintf(buf + n, sizeof buf - (size_t)n, "%s%s", k++ ? ", " : "", E->mesh->axes[a].name);
  if (cnt > 1 && parens) snprintf(buf + n, sizeof buf - (size_t)n, ")");
  return arena_printf(E->a, "%s", buf);
}

static const char *where(const Explain *E, SrcLoc loc) { return partition_where(E->a, E->p, loc); }

/* The file part of a place in an imported file ("models/llama.shard"). */
static const char *file_name(const Explain *E, SrcLoc loc) {
  const char *w = partition_where(E->a, E->p, loc), *colon = strrchr(w, ':');
  return colon ? arena_strndup(E->a, w, (size_t)(colon - w)) : w;
}

static const char *op_label(const Explain *E, const Op *op) {
  const Value *v = op->nresults ? op->results[0] : NULL;
  if (op->kind == OP_PARAM && op->index >= 0 && op->index < E->m->nparams)
    return arena_printf(E->a, "param %s", E->m->params[op->index].path);
  if (v && v->name) return arena_printf(E->a, "%s %s", ir_op_label(op), v->name);
  return ir_op_label(op);
}

/* The part of a train step an op belongs to (Op.phase), as explain names it. */
static const char *phase_name(int phase) {
  switch (phase) {
  case PHASE_FORWARD: return "forward";
  case PHASE_LOSS: return "loss";
  case PHASE_BACKWARD: return "backward";
  case PHASE_RECOMPUTE: return "recompute";
  case PHASE_ACCUMULATE: return "accumulate";
  case PHASE_UPDATE: return "optimizer";
  default: return "?";
  }
}

/* What the step's text report calls each phase where a group of ops or collectives starts. */
static const char *phase_heading(int phase) {
  switch (phase) {
  case PHASE_FORWARD: return "forward";
  case PHASE_LOSS: return "loss";
  case PHASE_BACKWARD: return "backward";
  case PHASE_RECOMPUTE: return "backward (recomputing the forward)";
  case PHASE_ACCUMULATE: return "microbatch accumulation";
  case PHASE_UPDATE: return "optimizer update";
  default: return "?";
  }
}

/* ---- per-op figures (opcost.h: the one cost function of check, explain and sim) ---- */

static double op_flops(const Op *op) {
  OpCost c;
  opcost(op, true, &c);
  return c.flops;
}

static double op_bytes(const Op *op) {
  OpCost c;
  opcost(op, true, &c);
  return c.bytes;
}

static CollKind coll_kind_of(OpKind k) {
  int c = ir_op_info(k)->coll;
  return c == NOCOLL ? COLL_PERMUTE : (CollKind)c;
}

/* One collective's figures: the bytes cost_collective takes for its kind, and the runs per step. */
static void coll_figures(Explain *E, const Op *op, double mult, CollRow *r) {
  const Value *x = op->operands[0], *y = op->results[0];
  r->kind = coll_kind_of(op->kind);
  double bytes = (double)sharding_local_bytes(&x->type, &x->sharding, E->mesh) * ir_route_density(x);
  if (r->kind == COLL_ALL_GATHER)
    bytes = (double)sharding_local_bytes(&y->type, &y->sharding, E->mesh) * ir_route_density(y);
  r->count = mult;
  r->axes = op->axes;
  r->phase = op->phase;
  r->loc = op->loc;
  r->reason = op->reason;
  r->x = x, r->y = y;
  if (op->dev && op->dev->cmm && op->dev->cmm->coll == op) r->overlapped = op->dev->cmm->reason;
  cost_collective_group(E->mesh, r->kind, op->axes, dev_op_subset(op), bytes, true, &r->cost);
}

/* The compute (ideal roofline) of f's ops after `from` (NULL: from the start) and before `to` (NULL:
 * to the end; an op of f), a loop counting its body's times its trips; collectives are not compute. */
static double ops_time(const Explain *E, const IrFunc *f, const Op *from, const Op *to) {
  double s = 0;
  for (const Op *op = from ? from->next : f->first; op && op != to; op = op->next) {
    if (op->kind == OP_LOOP && op->body) {
      s += (double)(op->count > 0 ? op->count : 1) * ops_time(E, op->body, NULL, NULL);
      continue;
    }
    if (ir_op_is_collective(op->kind) || op->kind == OP_INPUT || op->kind == OP_PARAM || op->kind == OP_CONST ||
        op->kind == OP_PIPELINE || op->nresults == 0)
      continue;
    s += cost_op_time(E->mesh->target, op->results[0]->type.dtype, op_flops(op), op_bytes(op), true);
  }
  return s;
}

/* A data-parallel collective's window (dpwin.h): the compute it can hide behind, by the program. */
static void window_figures(Explain *E, const Op *op, CollRow *r) {
  const DevWindow *w = op->dev ? op->dev->win : NULL;
  if (!w) return;
  r->win = w;
  const Op *before = w->before;
  double T = r->cost.time_s, X = 0;
  if (w->kind == DPW_GRADIENT && w->after && w->after->def) {
    const Op *a = w->pieces > 1 && w->piece_loop ? w->piece_loop : w->after->def;
    X = ops_time(E, a->func, a, w->via || w->out_loop ? NULL : before);
    if (w->via) X += ops_time(E, op->func, w->via, before);
    if (w->out_loop && w->out_loop->func) X += ops_time(E, w->out_loop->func, w->out_loop, before);
  } else if (w->kind == DPW_PREFETCH) {
    X = ops_time(E, op->func, NULL, NULL); /* the previous iteration */
  } else if (w->kind == DPW_OPERAND) {
    const Op *a = w->after && w->after->def && w->after->def->func == op->func ? w->after->def : NULL;
    X = ops_time(E, op->func, a, before);
  }
  r->win_compute_s = X;
  if (w->kind == DPW_GRADIENT && w->pieces > 1 && w->piece_loop) {
    const Value *x = op->operands[0];
    double bytes = (double)sharding_local_bytes(&x->type, &x->sharding, E->mesh) * ir_route_density(x);
    CollCost pc;
    r->piece_s = cost_collective_group(E->mesh, r->kind, op->axes, op->coll ? op->coll->ngroup : 0,
                                       bytes / (double)w->pieces, true, &pc);
    r->iter_s = ops_time(E, w->piece_loop->body, NULL, NULL);
    r->hidden_s = (double)(w->pieces - 1) * fmin(r->piece_s, r->iter_s) + fmin(r->piece_s, X);
  } else if (w->kind == DPW_GRADIENT && w->out_loop && w->out_loop->count > 1) {
    /* one per iteration: each but the last behind the iterations after its own, the last (what
     * this row shows) behind what follows the loop */
    r->iter_s = ops_time(E, op->func, NULL, NULL);
    r->hidden_s = fmin(T, X);
  } else {
    r->hidden_s = w->kind == DPW_BLOCKING ? 0 : fmin(T, X);
  }
}

/* What a bucket member moves: the name of the value it reduces into or gathers from, following
 * single readers that pass it on (casts, views, the accumulation's add), or, for a loop body's
 * output (a layer's gradient row), the name of the loop result that stacks it. */
static const char *member_name(const Op *o) {
  if (o->kind == OP_ALL_GATHER && o->operands[0]->name) return o->operands[0]->name;
  const Value *v = o->results[0];
  for (int step = 0; step < 8 && v; step++) {
    if (v->name) return v->name;
    const IrFunc *f = v->func;
    for (int r = 0; f && r < f->noutputs; r++) {
      if (f->outputs[r] != v) continue;
      for (const Op *l = f->parent ? f->parent->first : NULL; l; l = l->next)
        if (l->kind == OP_LOOP && l->body == f && r < l->nresults && l->results[r]->name) return l->results[r]->name;
    }
    const Value *next = NULL; /* its one reader's result */
    int readers = 0;
    for (const Op *u = f ? f->first : NULL; u; u = u->next)
      for (int i = 0; i < u->noperands; i++)
        if (u->operands[i] == v && u->nresults == 1) readers++, next = u->results[0];
    v = readers == 1 ? next : NULL;
  }
  return o->operands[0]->name ? o->operands[0]->name : "a value";
}

/* A bucket of the device program (its lead's DevColl): one run of its members' summed bytes, and
 * who they are. */
static void bucket_figures(Explain *E, const DevColl *bk, CollRow *r) {
  const Op *first = bk->members[0];
  double bytes = bk->bytes;
  char *names = "";
  int n = 0;
  for (int i = 0; i < bk->nmembers; i++) {
    const Op *o = bk->members[i];
    names = arena_printf(E->a, "%s%s%s %s", names, n ? ", " : "", member_name(o), sharding_text(E, o->results[0]));
    n++;
  }
  r->nbucket = n;
  r->members = names;
  r->reason = arena_printf(E->a, "a bucket of %d %s of at most %lld MiB together, run as one collective (as PyTorch "
                           "DDP and FSDP bucket them; docs/passes.md); the first: %s",
                           n, first->kind == OP_ALL_GATHER ? "weight gathers" : "gradient reductions",
                           (long long)(BUCKET_CAP_BYTES >> 20), first->reason ? first->reason : "?");
  cost_collective(E->mesh, r->kind, first->axes, bytes, true, &r->cost);
}

/* "first stage", "last stage", "first and last stages" for an op of main placed on those. */
static const char *place_text(uint8_t place) {
  switch (place) {
  case PLACE_FIRST: return "first stage";
  case PLACE_LAST: return "last stage";
  case PLACE_FIRST | PLACE_LAST: return "first and last stages";
  default: return NULL;
  }
}

/* The fraction of the pipeline's stages an op placed `place` runs on. */
static double place_fraction(const Explain *E, uint8_t place) {
  if (!E->pipe || !place) return 1;
  int n = 0;
  for (int s = 0; s < E->pipe->stages; s++) n += dev_stage_runs(place, s, E->pipe->stages);
  return (double)n / E->pipe->stages;
}

static void collect(Explain *E, const IrFunc *f, int depth, double mult, bool in_layer, double frac,
                    const char *stages);

/* A pipeline's regions (each as many times as a step runs it on a stage that runs it), and its
 * transfers: one collective_permute entry for the activations sent forward, one for the
 * gradients sent back. */
static void collect_pipeline(Explain *E, const Op *op, int depth, double mult) {
  const PipeInfo *pi = op->pipe;
  static const char *const names[PR__COUNT] = {
      "before the layers", "a chunk of layers, forward", "after the layers (the loss and its gradient)",
      "a chunk of layers, backward", "the gradient of what comes before the layers"};
  for (int r = 0; r < PR__COUNT; r++) {
    const IrFunc *R = pi->region[r];
    if (!R) continue;
    bool every = r == PR_CHUNK_FWD || r == PR_CHUNK_BWD;
    double runs = opcost_region_runs(pi, r, false);
    const char *on = every ? "every stage" : r == PR_LAST ? "the last stage" : "the first stage";
    OpRow h = {.op = op, .depth = depth, .count = runs,
               .heading = arena_printf(E->a, "pipeline region: %s, x%s per step on %s", names[r],
                                       fmt_count(E->a, runs), on)};
    if (R->first) VEC_PUSH(E->a, E->ops, h); /* (an empty region: nothing to list) */
    E->region = h.heading;
    collect(E, R, depth + 1, mult * runs, false, every ? 1 : 1.0 / pi->stages,
            every ? NULL : r == PR_LAST ? "last stage" : "first stage");
    E->region = NULL;
  }
  /* the schedule's transfers */
  uint16_t st = 0;
  for (int k = 0; k < pi->nstage_axes; k++) st |= (uint16_t)(1u << pi->stage_axes[k]);
  for (int dir = 0; dir < 2; dir++) {
    int r = dir ? PR_LAST : PR_FIRST;
    const IrFunc *R = pi->region[r];
    if (!R || (dir && !pi->region[PR_CHUNK_BWD])) continue;
    const Value *act = NULL;
    for (int i = 0; i < R->noutputs; i++)
      if (pi->out[r][i].kind == POUT_ACT) act = R->outputs[i];
    if (!act) continue;
    double sends = (double)schedule_count(pi, PA_SEND, dir == 1); /* over every stage, per step */
    CollRow c = {.op = NULL, .depth = depth, .kind = COLL_PERMUTE, .axes = st,
                 .phase = dir ? PHASE_BACKWARD : PHASE_FORWARD, .loc = op->loc, .x = act, .y = act,
                 .region = "pipeline transfers between stages, per microbatch"};
    c.count = mult * sends / pi->stages;
    c.reason = arena_printf(E->a,
                            "pipeline: each microbatch's %s moves to the %s stage at every boundary between chunks "
                            "of layers (%d stages x %d chunk%s of %lld layers, %d microbatch%s, %s): %s sends per "
                            "step over all stages",
                            dir ? "gradient" : "activation", dir ? "previous" : "next", pi->stages, pi->chunks,
                            pi->chunks == 1 ? "" : "s", (long long)pi->chunk_layers, pi->microbatches,
                            pi->microbatches == 1 ? "" : "es", schedule_name(E->a, pi), fmt_count(E->a, sends));
    double act_bytes = (double)sharding_local_bytes(&act->type, &act->sharding, E->mesh);
    double split = pi->send_split ? (double)sharding_axes_product(E->mesh, pi->send_split) : 1;
    if (pi->send_split)
      c.reason = arena_printf(E->a, "%s; the activation is replicated over %s, so each of those devices sends 1/%g of "
                              "it and the receiving stage gathers it (Megatron's scatter-gather)",
                              c.reason, axes_names(E, pi->send_split, true), split);
    cost_collective(E->mesh, COLL_PERMUTE, st, act_bytes / split, true, &c.cost);
    VEC_PUSH(E->a, E->colls, c);
    E->comm_s += c.cost.time_s * c.count;
    if (pi->send_split) { /* the receiving stage's gather of the slices */
      CollRow g = c;
      g.kind = COLL_ALL_GATHER;
      g.axes = pi->send_split;
      g.reason = arena_printf(E->a, "pipeline: the receiving stage gathers the %s's slices over %s (Megatron's "
                              "scatter-gather: the send moved 1/%g of it)",
                              dir ? "gradient" : "activation", axes_names(E, pi->send_split, true), split);
      cost_collective(E->mesh, COLL_ALL_GATHER, pi->send_split, act_bytes, true, &g.cost);
      VEC_PUSH(E->a, E->colls, g);
      E->comm_s += g.cost.time_s * g.count;
    }
  }
}

/* A ring attention's ring (language.md: one collective_permute entry for the forward ring, K and V
 * together, one for the backward's, K, V and their gradients), n - 1 steps per run. */
static void ring_row(Explain *E, const Op *op, int depth, double mult, bool in_layer, const char *stages) {
  const DevRing *ring = op->dev ? op->dev->ring : NULL; /* the device program's ring (its groups, steps, bytes) */
  if (!ring) return;
  int n = ring->groups->size;
  const Value *k = op->operands[1];
  double block = ring->step_bytes;
  CollRow r = {.op = NULL, .depth = depth, .kind = COLL_PERMUTE, .axes = ring->groups->mask, .phase = op->phase, .loc = op->loc,
               .reason = op->reason, .x = k, .y = k, .stages = stages, .in_layer = in_layer, .region = E->region};
  r.count = mult * ring->steps;
  cost_ring(E->mesh, ring->groups->mask, ring->k_bytes, ring->v_bytes, op->kind == OP_ATTENTION_GRAD, true, &r.cost);
  r.members = arena_printf(E->a, "%s (%s a step)", op->kind == OP_ATTENTION ? "K and V" : "K, V and their gradients",
                           fmt_bytes(E->a, block));
  if (op->kind == OP_ATTENTION) { /* the other form, for the program at hand */
    const Value *q = op->operands[0], *o = op->results[0];
    double qb = (double)sharding_local_bytes(&q->type, &q->sharding, E->mesh);
    double ob = (double)sharding_local_bytes(&o->type, &o->sharding, E->mesh);
    CollCost a2a;
    double t = 0, bytes = 0;
    double moved[4] = {qb, ring->k_bytes, ring->v_bytes, ob};
    for (int i = 0; i < 4; i++) {
      cost_collective(E->mesh, COLL_ALL_TO_ALL, ring->axes, moved[i], true, &a2a);
      t += a2a.time_s, bytes += a2a.bytes_per_device;
    }
    r.reason = arena_printf(E->a, "%s. The Ulysses form (q, k, v and the output typed with heads over %s: AllToAlls of "
                            "q, k and v to head sharding and of the output back) would move %s per run in 4 "
                            "AllToAlls, %s, against the ring's %s in %d steps, %s, which overlap the attention",
                            op->reason, axes_names(E, ring->axes, true), fmt_bytes(E->a, bytes), fmt_time(E->a, t),
                            fmt_bytes(E->a, r.cost.bytes_per_device * (n - 1)), n - 1,
                            fmt_time(E->a, r.cost.time_s * (n - 1)));
  }
  VEC_PUSH(E->a, E->colls, r);
  E->comm_s += r.cost.time_s * r.count;
  if (in_layer) E->layer_comm_s += r.cost.time_s * (n - 1);
}

static void collect(Explain *E, const IrFunc *f, int depth, double mult, bool in_layer, double frac,
                    const char *stages) {
  const Target *t = E->mesh->target;
  for (const Op *op = f->first; op; op = op->next) {
    double fr = frac * (f == E->m->main ? place_fraction(E, dev_op_runs(op)) : 1);
    const char *where_runs = f == E->m->main ? place_text(dev_op_runs(op)) : stages;
    if (ir_op_is_collective(op->kind)) {
      /* a bucket of the device program (devprog.h): listed once, at its first member */
      const DevColl *dc = op->dev ? op->dev->coll : NULL;
      const DevColl *bk = dc && dc->lead ? dc->lead->dev->coll : dc && dc->members ? dc : NULL;
      if (bk && bk->members[0] != op) continue;
      CollRow r = {.op = op, .depth = depth, .stages = where_runs, .region = E->region};
      coll_figures(E, op, mult * fr, &r);
      if (bk) bucket_figures(E, bk, &r);
      window_figures(E, op, &r);
      r.in_layer = in_layer;
      VEC_PUSH(E->a, E->colls, r);
      E->comm_s += r.cost.time_s * r.count;
      if (r.in_layer) E->layer_comm_s += r.cost.time_s;
      continue;
    }
    if (dev_op_ring(op) && dev_op_ring(op)->carries) ring_row(E, op, depth, mult * fr, in_layer, where_runs);
    if (op->kind == OP_CONST) continue;
    if (op->kind == OP_PIPELINE && op->pipe) {
      collect_pipeline(E, op, depth, mult);
      continue;
    }
    OpRow row = {.op = op, .depth = depth, .count = mult * fr, .stages = where_runs};
    if (op->kind != OP_LOOP && op->kind != OP_INPUT && op->kind != OP_PARAM) {
      row.flops = op_flops(op);
      row.time_s = cost_op_time(t, ir_op_rate_dtype(op), row.flops, op_bytes(op), true);
      E->compute_s += row.time_s * row.count;
      if (in_layer) E->layer_compute_s += row.time_s;
    }
    VEC_PUSH(E->a, E->ops, row);
    if (op->kind == OP_LOOP && op->body) {
      /* "a layer": an iteration of the first loop over stacked params (not a step's microbatches),
       * with the iteration of the backward's loop over the same stacked dim */
      bool layer = !(E->m->step && E->m->step->micro_loop == op) && op->nslices > 0 &&
                   (!E->layer_loop || (op->stack_dim && op->stack_dim == E->layer_loop->stack_dim && !in_layer));
      if (layer && !E->layer_loop) E->layer_loop = op;
      double trips = (double)(op->count > 0 ? op->count : 1);
      double save = E->loop_outer_mult;
      E->loop_outer_mult = mult;
      collect(E, op->body, depth + 1, mult * trips, layer || in_layer, fr, where_runs);
      E->loop_outer_mult = save;
    }
  }
}

/* ---- strategies and the book's thresholds ---- */

typedef struct Strategy {
  uint16_t dp;      /* axes sharding the batch of the entry's inputs */
  uint16_t tp;      /* axes over which contractions leave partial sums */
  uint16_t fsdp;    /* axes over which params are gathered */
  double tokens;    /* global tokens per step */
  double ffw;       /* the largest dim summed over a TP axis (the MLP's hidden size) */
} Strategy;

static bool is_param_value(const Value *v) {
  if (v->def) return v->def->kind == OP_PARAM;
  const IrFunc *b = v->func;
  if (!b || !b->parent) return false;
  for (const Op *o = b->parent->first; o; o = o->next) {
    if (o->kind != OP_LOOP || o->body != b) continue;
    for (int i = 0; i < b->ninputs && i < o->noperands; i++)
      if (b->inputs[i] == v) return i < o->nslices || is_param_value(o->operands[i]);
  }
  return false;
}

/* d is the expert dim of a route in f (or in a loop body of it). */
static bool route_expert_dim(const IrFunc *f, const Dim *d) {
  for (const Op *o = f->first; o; o = o->next) {
    if (o->kind == OP_ROUTE && o->ndims >= 3 && o->dims[0] == d) return true;
    if (o->kind == OP_LOOP && o->body && route_expert_dim(o->body, d)) return true;
  }
  return false;
}

/* A gathered weight sharded on a route's expert dim alone (the router's gate, under `expert: ep`)
 * is a small gather beside expert parallelism's AllToAlls, not FSDP's every weight gathered. */
static bool gathers_router(const Explain *E, const Op *op) {
  const Value *w = op->operands[0];
  bool any = false;
  for (int d = 0; d < w->type.rank; d++) {
    uint16_t ax = 0;
    for (int k = 0; k < w->sharding.naxes[d]; k++) ax |= (uint16_t)(1u << w->sharding.axes[d][k]);
    if (!(ax & op->axes)) continue;
    if (!route_expert_dim(E->m->main, w->type.dims[d])) return false;
    any = true;
  }
  return any;
}

static void strategy_func(const Explain *E, const IrFunc *f, Strategy *s) {
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_LOOP && op->body) strategy_func(E, op->body, s);
    for (int r = 0; op->kind == OP_PIPELINE && r < PR__COUNT; r++)
      if (op->pipe->region[r]) strategy_func(E, op->pipe->region[r], s);
    if (op->phase != PHASE_FORWARD) continue; /* a step's backward mirrors its forward */
    if (op->kind == OP_ALL_GATHER && is_param_value(op->operands[0]) && !gathers_router(E, op)) s->fsdp |= op->axes;
    if (op->kind == OP_CONTRACT && op->plan && op->plan->factored && op->plan->made_partial) {
      s->tp |= op->plan->made_partial;
      for (int k = 0; k < op->plan->nf; k++)
        if (op->plan->fkind[k] == FK_SUM && op->plan->nax[k] && (double)op->plan->fdim[k]->size > s->ffw)
          s->ffw = (double)op->plan->fdim[k]->size;
    }
  }
}

static void strategy(const Explain *E, Strategy *s) {
  memset(s, 0, sizeof *s);
  const IrFunc *f = E->m->main;
  if (f->ninputs > 0) {
    const Value *x = f->inputs[0];
    s->tokens = 1; /* token ids: every dim; activations: every dim but the features (the last) */
    int ntok = dtype_is_int(x->type.dtype) ? x->type.rank : x->type.rank - 1;
    for (int d = 0; d < x->type.rank; d++) {
      if (d < ntok) s->tokens *= (double)x->type.dims[d]->size;
      if (x->type.dims[d]->name == intern_cstr("batch"))
        for (int k = 0; k < x->sharding.naxes[d]; k++) s->dp |= (uint16_t)(1u << x->sharding.axes[d][k]);
    }
  }
  strategy_func(E, f, s);
  s->fsdp &= (uint16_t)~s->tp;
}

/* ---- totals ---- */

/* Runs, bytes per device and time per step of the collectives of one kind, phase and axis group
 * (-1: any), weighted by how often a step runs each: the totals of the text and of the JSON. */
typedef struct Tally {
  double runs, bytes, time_s;
} Tally;

static Tally tally(const Explain *E, int kind, int phase, int axes) {
  Tally t = {0};
  for (int i = 0; i < E->colls.len; i++) {
    const CollRow *r = &E->colls.data[i];
    if ((kind >= 0 && r->kind != (CollKind)kind) || (phase >= 0 && r->phase != phase) || (axes >= 0 && r->axes != axes))
      continue;
    t.runs += r->count, t.bytes += r->cost.bytes_per_device * r->count, t.time_s += r->cost.time_s * r->count;
  }
  return t;
}

/* The axis groups the collectives run over, in order of first appearance; returns how many. */
static int axis_groups(const Explain *E, uint16_t *out, int max) {
  int n = 0;
  for (int i = 0; i < E->colls.len && n < max; i++) {
    uint16_t ax = E->colls.data[i].axes;
    bool dup = false;
    for (int j = 0; j < n; j++) dup |= out[j] == ax;
    if (!dup) out[n++] = ax;
  }
  return n;
}

/* ---- text ---- */

static void print_header(FILE *out, const Explain *E) {
  const Program *p = E->p;
  char mesh[256] = "";
  int k = 0;
  for (int i = 0; i < E->mesh->naxes && k < (int)sizeof mesh - 40; i++)
    k += snprintf(mesh + k, sizeof mesh - (size_t)k, "%s%s: %d", i ? ", " : "", E->mesh->axes[i].name, E->mesh->axes[i].size);
  fprintf(out, "explain %s %s.%s on mesh %s = %s[%s] (%lld devices), layout %s\n",
          p->step ? (p->step->kind == STEP_TRAIN ? "train" : "serve") : "entry", p->entry->model->name,
          p->entry->name, E->mesh->name, E->mesh->target->name, mesh, (long long)E->mesh->devices,
          p->layout ? p->layout->name : "(none)");
  fprintf(out, "times are ideal: peak FLOP/s, HBM and link bandwidth (shardc sim applies efficiencies)\n");
  if (E->m->step)
    fprintf(out, "the whole training step, grouped by phase: forward, loss, backward, optimizer update\n");
  else
    fprintf(out, "the forward pass\n");
}

static const char *verdict(double compute_s, double comm_s) {
  return comm_s == 0 ? "no communication"
         : comm_s <= compute_s ? "compute-bound (communication can hide behind compute)" : "communication-bound";
}

/* The collectives in order of the time they take per step (the largest first). */
static int *colls_by_time(const Explain *E) {
  int *idx = ARENA_ARRAY(E->a, int, E->colls.len + 1);
  for (int i = 0; i < E->colls.len; i++) {
    idx[i] = i;
    double t = E->colls.data[i].cost.time_s * E->colls.data[i].count;
    int j = i;
    for (; j > 0 && E->colls.data[idx[j - 1]].cost.time_s * E->colls.data[idx[j - 1]].count < t; j--) idx[j] = idx[j - 1];
    idx[j] = i;
  }
  return idx;
}

/* zero over the flattened, padded params (step.h's StepParam.flat): which params, why, the state's
 * per-device bytes (memory's figures) and what the IR does instead (issue 19) */
static void print_flat_zero(FILE *out, const Explain *E) {
  const StepInfo *si = E->m->step;
  const IrFunc *f = E->m->main;
  int n = 0;
  double whole = 0, flat = 0;
  const StepParam *first = NULL;
  for (int j = 0; si && j < si->nparams; j++) {
    const StepParam *sp = &si->params[j];
    if (sp->flat <= 1) continue;
    if (!first) first = sp;
    n++;
    const int ins[3] = {sp->in_master, sp->in_m, sp->in_v};
    for (int q = 0; q < 3; q++) {
      if (ins[q] < 0 || ins[q] >= f->ninputs) continue;
      const Value *v = f->inputs[ins[q]];
      int64_t b = sharding_local_bytes(&v->type, &v->sharding, E->mesh);
      whole += (double)b;
      flat += (double)step_flat_bytes(sp, b, dtype_bytes(v->type.dtype));
    }
  }
  if (!n) return;
  const Value *pv = first->value;
  int64_t el = sharding_local_bytes(&pv->type, &pv->sharding, E->mesh) / dtype_bytes(pv->type.dtype);
  int64_t per = step_flat_bytes(first, el, 1);
  fprintf(out,
          "  zero = %d over the flattened, padded params (Megatron's distributed optimizer): the batch axes %s "
          "(%lld devices) divide no dim of %d param%s, so each device keeps ceil(n / %lld) of the n elements of "
          "each one's local block (%s: %lld -> %lld, padded by %lld): state %s per device where whole it is %s%s\n",
          si->step->zero, axes_names(E, first->flat_axes, true), (long long)first->flat, n, n == 1 ? "" : "s",
          (long long)first->flat, E->m->params[first->param].path, (long long)el, (long long)per,
          (long long)(per * first->flat - el), fmt_bytes(E->a, flat), fmt_bytes(E->a, whole),
          si->step->zero >= 2 ? " (their reduced gradients likewise)" : "");
  fprintf(out, "    as implemented, memory counts those shards; the step's IR still all-reduces those gradients (on a ring "
               "the bytes of the flat buffer's ReduceScatter and AllGather) and updates the params whole on every device, "
               "and run holds the whole state\n");
}

/* The summary, first: memory, compute against communication and the verdict, and the collectives
 * that take longest (numbered as the detail lists them). */
static void print_overview(FILE *out, const Explain *E) {
  enum { TOP = 5 };
  const MemoryReport *r = &E->mem;
  fprintf(out, "\nsummary (per step, per device%s):\n", E->has_pipe ? ", averaged over the pipeline's stages" : "");
  fprintf(out, "  memory %s of %s: %s (params %s", fmt_bytes(E->a, (double)r->total), fmt_bytes(E->a, r->capacity),
          r->fits ? "fits" : "DOES NOT FIT", fmt_bytes(E->a, (double)r->params));
  if (E->m->step) /* a forward alone keeps no gradients, optimizer state or activations */
    fprintf(out, ", grads %s, optimizer %s, activations %s", fmt_bytes(E->a, (double)r->grads),
            fmt_bytes(E->a, (double)r->optimizer), fmt_bytes(E->a, (double)r->activations));
  fprintf(out, ", temporaries %s)\n", fmt_bytes(E->a, (double)r->temporaries));
  fprintf(out, "  compute %s, communication %s: %s\n", fmt_time(E->a, E->compute_s), fmt_time(E->a, E->comm_s),
          verdict(E->compute_s, E->comm_s));
  if (E->layer_loop)
    fprintf(out, "  per layer (one iteration of the loop at %s%s): compute %s, communication %s: %s\n",
            where(E, E->layer_loop->loc), E->m->step ? ", forward and backward" : "", fmt_time(E->a, E->layer_compute_s),
            fmt_time(E->a, E->layer_comm_s), E->layer_comm_s <= E->layer_compute_s ? "compute-bound" : "communication-bound");
  const char *forbidden = layout_weigh_text(E->a, E->m, E->p);
  if (forbidden) fprintf(out, "  layout: %s\n", forbidden);
  print_flat_zero(out, E);
  if (E->colls.len == 0 || E->comm_s <= 0) return;
  int *idx = colls_by_time(E), n = E->colls.len < TOP ? E->colls.len : TOP;
  fprintf(out, "  the collectives that take longest (%d of %d; numbered as listed below):\n", n, E->colls.len);
  for (int i = 0; i < n; i++) {
    const CollRow *c = &E->colls.data[idx[i]];
    double t = c->cost.time_s * c->count;
    if (t <= 0) break;
    fprintf(out, "    %2d. %s%s over %s at %s", idx[i] + 1, coll_kind_name(c->kind), c->op && c->op->reduce_max ? " (max)" : "",
            axes_names(E, c->axes, true), where(E, c->loc));
    if (c->count != 1) fprintf(out, ", x%s", fmt_count(E->a, c->count));
    fprintf(out, ": %s, %.0f%% of the communication\n", fmt_time(E->a, t), 100 * t / E->comm_s);
  }
}

static void print_ops(FILE *out, const Explain *E) {
  fprintf(out, "\nops (per device):\n");
  fprintf(out, "  %-22s %-30s %-52s %-28s %9s %9s\n", "where", "op", "sharding", "local shape", "FLOPs", "time");
  int phase = -1;
  for (int i = 0; i < E->ops.len; i++) {
    const OpRow *r = &E->ops.data[i];
    const Op *op = r->op;
    char ind[32];
    snprintf(ind, sizeof ind, "%*s", 2 * r->depth, "");
    if (r->heading) {
      fprintf(out, "  %s== %s ==\n", ind, r->heading);
      phase = -1;
      continue;
    }
    if (E->m->step && op->kind != OP_INPUT && op->kind != OP_PARAM && op->phase != phase) {
      phase = op->phase;
      fprintf(out, "  %s-- %s --\n", ind, phase_heading(phase));
    }
    if (op->kind == OP_LOOP) {
      fprintf(out, "  %-22s %sloop over %s, %lld iterations:\n", where(E, op->loc), ind,
              op->stack_dim ? op->stack_dim->name : "?", (long long)op->count);
      continue;
    }
    const Value *v = op->results[0];
    const char *lab = arena_printf(E->a, "%s%s%s%s", ind, op_label(E, op), r->stages && r->depth == 0 ? " @" : "",
                                   r->stages && r->depth == 0 ? r->stages : "");
    fprintf(out, "  %-22s %-30s %-52s %-28s %9s %9s\n", where(E, op->loc), lab, sharding_text(E, v),
            local_shape(E, &v->type, &v->sharding), r->flops > 0 ? arena_printf(E->a, "%.3g", r->flops) : "-",
            r->time_s > 0 ? fmt_time(E->a, r->time_s) : "-");
  }
}

static void print_colls(FILE *out, const Explain *E) {
  fprintf(out, "\ncollectives (%d):\n", E->colls.len);
  if (E->colls.len == 0) fprintf(out, "  none: every op runs on the shards it has\n");
  int phase = -1, width = report_width();
  const char *region = NULL;
  for (int i = 0; i < E->colls.len; i++) {
    const CollRow *r = &E->colls.data[i];
    if (r->region != region) { /* a pipeline region's collectives under its heading, as the ops */
      region = r->region;
      fprintf(out, "  == %s ==\n", region ? region : "after the pipeline");
      phase = -1;
    }
    if (E->m->step && r->phase != phase) {
      phase = r->phase;
      fprintf(out, "  -- %s --\n", phase_heading(phase));
    }
    fprintf(out, "  %d. %s%s over %s at %s", i + 1, coll_kind_name(r->kind), r->op && r->op->reduce_max ? " (max)" : "",
            axes_names(E, r->axes, true), where(E, r->loc));
    if (r->count != 1) fprintf(out, ", x%s per step", fmt_count(E->a, r->count));
    if (r->stages) fprintf(out, " (on the %s)", r->stages);
    fputc('\n', out);
    if (r->nbucket) fprintf(out, "     a bucket of %d: %s\n", r->nbucket, r->members);
    else if (!r->op && r->members) fprintf(out, "     the ring's blocks: %s\n", r->members);
    else fprintf(out, "     %s -> %s\n", sharding_text(E, r->x), sharding_text(E, r->y));
    fprintf(out, "     %s per device, %s on %s (%s)\n", fmt_bytes(E->a, r->cost.bytes_per_device),
            fmt_time(E->a, r->cost.time_s), r->cost.link_name, r->cost.latency_bound ? "latency-bound" : "bandwidth-bound");
    report_wrapped(out, width, "     why: ", "          ", r->reason ? r->reason : "?");
    if (r->overlapped) report_wrapped(out, width, "     overlapped: ", "          ", r->overlapped);
    if (r->win) {
      report_wrapped(out, width, "     window: ", "          ", r->win->text);
      const char *h =
          r->win->kind == DPW_BLOCKING
              ? "nothing (blocking)"
          : r->piece_s > 0
              ? arena_printf(E->a, "%s of it: each of the first %lld pieces (%s) behind the next iteration (%s), the last behind %s of compute",
                             fmt_time(E->a, r->hidden_s), (long long)r->win->pieces - 1, fmt_time(E->a, r->piece_s),
                             fmt_time(E->a, r->iter_s), fmt_time(E->a, r->win_compute_s))
          : r->iter_s > 0
              ? arena_printf(E->a, "%s of it in the last iteration, behind %s of compute (each earlier iteration's behind the iterations after it, %s each)",
                             fmt_time(E->a, r->hidden_s), fmt_time(E->a, r->win_compute_s), fmt_time(E->a, r->iter_s))
              : arena_printf(E->a, "%s of it, behind %s of compute", fmt_time(E->a, r->hidden_s),
                             fmt_time(E->a, r->win_compute_s));
      report_wrapped(out, width, "     hides: ", "          ", h);
    }
  }
}

static void print_summary(FILE *out, const Explain *E) {
  fprintf(out, "\ntotals (per step, per device%s):\n", E->has_pipe ? ", averaged over the pipeline's stages" : "");
  fprintf(out, "  by kind:\n");
  if (E->colls.len == 0) fprintf(out, "    (none)\n");
  for (int k = 0; k < COLL__COUNT; k++) {
    Tally t = tally(E, k, -1, -1);
    if (t.runs > 0)
      fprintf(out, "    %-20s %8s runs %12s per device %12s\n", coll_kind_name((CollKind)k), fmt_count(E->a, t.runs),
              fmt_bytes(E->a, t.bytes), fmt_time(E->a, t.time_s));
  }
  if (E->m->step) {
    fprintf(out, "  by phase:\n");
    for (int ph = PHASE_FORWARD; ph <= PHASE_UPDATE; ph++) {
      Tally t = tally(E, -1, ph, -1);
      if (t.runs > 0)
        fprintf(out, "    %-20s %8s runs %12s per device %12s\n", phase_name(ph), fmt_count(E->a, t.runs),
                fmt_bytes(E->a, t.bytes), fmt_time(E->a, t.time_s));
    }
    if (E->colls.len == 0) fprintf(out, "    (none)\n");
  }
  fprintf(out, "  by axes:\n");
  uint16_t groups[64];
  int ng = axis_groups(E, groups, 64);
  for (int i = 0; i < ng; i++) {
    Tally t = tally(E, -1, -1, groups[i]);
    fprintf(out, "    %-20s %8s runs %12s per device %12s\n", axes_names(E, groups[i], true), fmt_count(E->a, t.runs),
            fmt_bytes(E->a, t.bytes), fmt_time(E->a, t.time_s));
  }
  if (E->colls.len == 0) fprintf(out, "    (none)\n");
  Strategy s;
  strategy(E, &s);
  const Mesh *m = E->mesh;
  double tp_deg = (double)sharding_axes_product(m, s.tp);
  if (s.fsdp && s.tp && s.ffw > 0) {
    double th = cost_fsdp_tp_threshold(m, s.fsdp, s.tp, s.ffw, true);
    double per = s.tokens / (double)m->devices;
    fprintf(out, "  FSDP over %s + tensor parallelism over %s: tokens per device %.4g %s 4 a_x a_y / F = %.4g: %s\n",
            axes_names(E, s.fsdp, true), axes_names(E, s.tp, true), per, per >= th ? ">=" : "<", th,
            per >= th ? "compute-bound" : "communication-bound");
  } else if (s.fsdp) {
    double th = cost_dp_threshold(m, s.fsdp, true);
    double per = s.tokens / (double)sharding_axes_product(m, (uint16_t)(s.dp | s.fsdp));
    fprintf(out, "  FSDP over %s: tokens per device %.4g %s C / W = %.4g: %s\n", axes_names(E, s.fsdp, true), per,
            per >= th ? ">=" : "<", th, per >= th ? "compute-bound" : "communication-bound");
  }
  if (s.tp && !(s.fsdp && s.ffw > 0) && s.ffw > 0) {
    double th = cost_tp_threshold(m, s.tp, true);
    double per = s.ffw / tp_deg;
    fprintf(out, "  tensor parallelism over %s: F / Y = %.4g %s C / W = %.4g: %s\n", axes_names(E, s.tp, true), per,
            per >= th ? ">=" : "<", th, per >= th ? "compute-bound" : "communication-bound");
  }
  if (s.dp && E->p->step && E->p->step->kind == STEP_TRAIN) {
    double th = cost_dp_threshold(m, s.dp, true);
    double per = s.tokens / (double)sharding_axes_product(m, s.dp);
    fprintf(out, "  data parallelism over %s (its gradient sync): tokens per device %.4g %s C / W = %.4g: %s\n",
            axes_names(E, s.dp, true), per, per >= th ? ">=" : "<", th, per >= th ? "compute-bound" : "communication-bound");
  }
}

/* The stacked param a pipeline's layers come from ("blocks"): the first path with the stacking dim
 * leading, up to its first dot. */
static const char *pipeline_stack_name(const Explain *E, const PipeInfo *pi) {
  for (int i = 0; i < E->m->nparams; i++) {
    const IrParam *ip = &E->m->params[i];
    if (ip->stack_depth < 1 || ip->spec.rank < 1 || ip->spec.dims[0] != pi->stack_dim) continue;
    const char *dot = strchr(ip->path, '.');
    return dot ? arena_strndup(E->a, ip->path, (size_t)(dot - ip->path)) : ip->path;
  }
  return "?";
}

/* Stage s's layers: "9-17", or under interleaving each chunk's ("2-3, 10-11"): the logical rows
 * its storage rows hold (the device program's storage order of the stacked dim). */
static const char *stage_layers(const Explain *E, const PipeInfo *pi, int s) {
  const char *t = "";
  RtOrder o = E->m->dev ? dev_dim_order(E->m->dev, pi->stack_dim, 0) : (RtOrder){.kind = RT_ORDER_NATURAL};
  for (int c = 0; c < pi->chunks; c++) {
    int64_t a = rt_order_logical(&o, ((int64_t)s * pi->chunks + c) * pi->chunk_layers);
    t = arena_printf(E->a, "%s%s%lld-%lld", t, c ? ", " : "", (long long)a, (long long)(a + pi->chunk_layers - 1));
  }
  return t;
}

/* The pipeline, labelled by the stacked loop it cuts into stages; the stages' layers follow one
 * rule, said once, with the first two stages and the last as examples (no line per stage). */
static void print_pipeline(FILE *out, const Explain *E) {
  const PipeInfo *pi = E->pipe;
  if (!pi) return;
  uint16_t st = 0;
  for (int k = 0; k < pi->nstage_axes; k++) st |= (uint16_t)(1u << pi->stage_axes[k]);
  /* the loop the stages cut: the layers' loop (E->layer_loop, in the chunk region), else the pipeline */
  SrcLoc loop = E->layer_loop ? E->layer_loop->loc : E->m->pipeline->loc;
  int width = report_width();
  const char *head = arena_printf(
      E->a, "pipeline of the stacked loop at %s (%s, %lld layers of `%s`): %d stages over %s, %d chunk%s of %lld layers per "
      "stage, %d microbatch%s, schedule %s", where(E, loop), pipeline_stack_name(E, pi), (long long)pi->layers,
      pi->stack_dim ? pi->stack_dim->name : "?", pi->stages, axes_names(E, st, true), pi->chunks, pi->chunks == 1 ? "" : "s",
      (long long)pi->chunk_layers, pi->microbatches, pi->microbatches == 1 ? "" : "es", schedule_name(E->a, pi));
  fputc('\n', out);
  report_wrapped(out, width, "", "  ", head);
  const char *rule = pi->chunks == 1
                         ? arena_printf(E->a, "stage s holds layers %llds to %llds + %lld", (long long)pi->chunk_layers,
                                        (long long)pi->chunk_layers, (long long)pi->chunk_layers - 1)
                         : arena_printf(E->a, "stage s holds chunks c = 0..%d of %lld layers, chunk c from layer (%d c + s) x %lld",
                                        pi->chunks - 1, (long long)pi->chunk_layers, pi->stages, (long long)pi->chunk_layers);
  const char *ex = arena_printf(E->a, "%s: stage 0 %s (with the ops before the layers)", rule, stage_layers(E, pi, 0));
  if (pi->stages > 2) ex = arena_printf(E->a, "%s, stage 1 %s%s", ex, stage_layers(E, pi, 1), pi->stages > 3 ? ", ..." : "");
  if (pi->stages > 1)
    ex = arena_printf(E->a, "%s, stage %d %s (with the ops after them)", ex, pi->stages - 1, stage_layers(E, pi, pi->stages - 1));
  report_wrapped(out, width, "  ", "    ", ex);
  /* Narayanan et al. 2021: the bubble is (p - 1) / N of the ideal time (interleaved: / V as well) */
  double bubble = (double)(pi->stages - 1) / ((double)pi->microbatches * pi->chunks);
  fprintf(out, "  bubble: (p - 1) / %s = %.3g of the ideal step time\n", pi->chunks > 1 ? "(N V)" : "N", bubble);
  fprintf(out, "  activations in flight at the peak: %d microbatch chunk%s on the first stage, %d on the last\n",
          pi->in_flight_max[0], pi->in_flight_max[0] == 1 ? "" : "s", pi->in_flight_max[1]);
}

/* --shardings: every value with where each axis came from. */
static void print_value_shardings(FILE *out, const Explain *E, const IrFunc *f, int depth) {
  static const char *src_name[] = {"", "@", "layout", "propagated"};
  for (int i = 0; i < f->ninputs && depth > 0; i++) {
    const Value *v = f->inputs[i];
    fprintf(out, "  %*s%-24s %s\n", 2 * depth, "", v->name ? v->name : arena_printf(E->a, "%%%d", v->id), sharding_text(E, v));
  }
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_CONST) continue;
    if (op->kind == OP_LOOP) {
      fprintf(out, "  %*sloop at %s:\n", 2 * depth, "", where(E, op->loc));
      if (op->body) print_value_shardings(out, E, op->body, depth + 1);
      continue;
    }
    const Value *v = op->results[0];
    fprintf(out, "  %*s%-24s %-48s", 2 * depth, "", v->name ? v->name : arena_printf(E->a, "%%%d", v->id), sharding_text(E, v));
    const char *sep = " # ";
    for (int d = 0; d < v->type.rank; d++) {
      if (!v->sharding.naxes[d] || v->dim_src[d] == SHARD_FREE) continue;
      fprintf(out, "%s%s: %s", sep, v->type.dims[d]->name, src_name[v->dim_src[d]]);
      if (v->dim_loc[d].file) fprintf(out, " %s", where(E, v->dim_loc[d]));
      sep = "; ";
    }
    fputc('\n', out);
  }
}

/* ---- JSON ---- */

static cJSON *axes_json(const Explain *E, uint16_t axes) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < E->mesh->naxes; i++)
    if ((axes >> i) & 1) cJSON_AddItemToArray(a, cJSON_CreateString(E->mesh->axes[i].name));
  return a;
}

/* A place as the JSON gives it: its line and its file (the path as given for the main file, as
 * explain's text names an imported one); null where the compiler made the thing. */
static void json_place(const Explain *E, cJSON *o, SrcLoc loc) {
  cJSON_AddNumberToObject(o, "line", loc.line);
  if (!loc.file) cJSON_AddNullToObject(o, "file");
  else cJSON_AddStringToObject(o, "file", loc.file == E->p->main_file ? report_file(loc) : file_name(E, loc));
}

/* A sharding as structure, beside its string: per dim the axes, major to minor, and the axes it
 * is an unreduced partial sum over (with "reduction": "max" for a max). */
static cJSON *sharding_json(const Explain *E, const Value *v) {
  cJSON *o = cJSON_CreateObject(), *dims = cJSON_AddArrayToObject(o, "dims");
  for (int d = 0; d < v->type.rank; d++) {
    cJSON *e = cJSON_CreateObject(), *ax = cJSON_AddArrayToObject(e, "axes");
    cJSON_AddStringToObject(e, "dim", v->type.dims[d]->name);
    for (int k = 0; k < v->sharding.naxes[d]; k++)
      cJSON_AddItemToArray(ax, cJSON_CreateString(E->mesh->axes[v->sharding.axes[d][k]].name));
    cJSON_AddItemToArray(dims, e);
  }
  cJSON_AddItemToObject(o, "partial", axes_json(E, v->sharding.partial));
  if (v->sharding.partial) cJSON_AddStringToObject(o, "reduction", v->partial_max ? "max" : "sum");
  return o;
}

static cJSON *tally_json(Tally t) {
  cJSON *e = cJSON_CreateObject();
  cJSON_AddNumberToObject(e, "count", t.runs);
  cJSON_AddNumberToObject(e, "bytes_per_device", t.bytes);
  cJSON_AddNumberToObject(e, "time_s", t.time_s);
  return e;
}

static cJSON *json_report(const Explain *E) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "mesh", E->mesh->name);
  cJSON_AddStringToObject(o, "target", E->mesh->target->name);
  if (E->p->layout) cJSON_AddStringToObject(o, "layout", E->p->layout->name);
  cJSON_AddNumberToObject(o, "devices", (double)E->mesh->devices);
  cJSON_AddBoolToObject(o, "ideal", true);
  cJSON *cs = cJSON_AddArrayToObject(o, "collectives");
  for (int i = 0; i < E->colls.len; i++) {
    const CollRow *r = &E->colls.data[i];
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "kind", coll_kind_name(r->kind));
    cJSON_AddStringToObject(c, "phase", phase_name(r->phase));
    cJSON_AddItemToObject(c, "axes", axes_json(E, r->axes));
    cJSON_AddNumberToObject(c, "bytes_per_device", r->cost.bytes_per_device);
    cJSON_AddNumberToObject(c, "time_s", r->cost.time_s);
    json_place(E, c, r->loc);
    cJSON_AddStringToObject(c, "reason", r->reason ? r->reason : "");
    if (r->count != 1) cJSON_AddNumberToObject(c, "count", r->count);
    cJSON_AddStringToObject(c, "link", r->cost.link_name);
    cJSON_AddStringToObject(c, "tensor", sharding_text(E, r->x));
    cJSON_AddStringToObject(c, "result", sharding_text(E, r->y));
    cJSON_AddItemToObject(c, "tensor_axes", sharding_json(E, r->x));
    cJSON_AddItemToObject(c, "result_axes", sharding_json(E, r->y));
    if (r->region) cJSON_AddStringToObject(c, "region", r->region);
    if (r->op && r->op->reduce_max) cJSON_AddStringToObject(c, "reduction", "max");
    if (r->stages) cJSON_AddStringToObject(c, "stages", r->stages);
    cJSON_AddBoolToObject(c, "in_layer", r->in_layer);
    if (r->overlapped) { /* a collective matmul: still the collective it implements */
      cJSON_AddBoolToObject(c, "overlapped", true);
      cJSON_AddStringToObject(c, "overlap", r->overlapped);
    }
    if (r->win) { /* a data-parallel collective's overlap window (dpwin.h) */
      static const char *const kinds[] = {"operand", "gradient", "prefetch", "blocking"};
      const DevWindow *w = r->win;
      cJSON *wj = cJSON_AddObjectToObject(c, "window");
      cJSON_AddStringToObject(wj, "kind", kinds[w->kind]);
      cJSON_AddStringToObject(wj, "text", w->text);
      if (w->after && w->after->def) {
        cJSON_AddStringToObject(wj, "issued_after", ir_op_name(w->after->def->kind));
        cJSON_AddNumberToObject(wj, "issued_after_line", w->after->def->loc.line);
      }
      cJSON_AddBoolToObject(wj, "last_microbatch", w->via != NULL);
      cJSON_AddNumberToObject(wj, "pieces", w->pieces > 1 ? (double)w->pieces : 1);
      if (w->piece_loop) cJSON_AddNumberToObject(wj, "piece_loop_line", w->piece_loop->loc.line);
      if (w->before) {
        cJSON_AddStringToObject(wj, "done_before", ir_op_name(w->before->kind));
        cJSON_AddNumberToObject(wj, "done_before_line", w->before->loc.line);
      }
      cJSON_AddNumberToObject(wj, "compute_s", r->win_compute_s);
      if (r->piece_s > 0) cJSON_AddNumberToObject(wj, "piece_s", r->piece_s);
      if (r->iter_s > 0) cJSON_AddNumberToObject(wj, "iteration_s", r->iter_s);
      if (w->out_loop) cJSON_AddNumberToObject(wj, "after_loop_line", w->out_loop->loc.line);
      cJSON_AddNumberToObject(wj, "hidden_s", r->hidden_s);
      cJSON_AddNumberToObject(wj, "exposed_s", fmax(0, r->cost.time_s - r->hidden_s));
    }
    cJSON_AddItemToArray(cs, c);
  }
  cJSON *os = cJSON_AddArrayToObject(o, "ops");
  for (int i = 0; i < E->ops.len; i++) {
    const OpRow *r = &E->ops.data[i];
    const Op *op = r->op;
    if (r->heading) continue;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "op", ir_op_label(op));
    cJSON_AddStringToObject(j, "phase", phase_name(op->phase));
    json_place(E, j, op->loc);
    if (op->kind == OP_LOOP) {
      cJSON_AddNumberToObject(j, "iterations", (double)op->count);
    } else {
      const Value *v = op->results[0];
      if (op->kind == OP_PARAM && op->index >= 0 && op->index < E->m->nparams)
        cJSON_AddStringToObject(j, "name", E->m->params[op->index].path);
      else if (v->name)
        cJSON_AddStringToObject(j, "name", v->name);
      cJSON_AddStringToObject(j, "sharding", sharding_text(E, v));
      cJSON_AddItemToObject(j, "sharding_axes", sharding_json(E, v));
      cJSON *ls = cJSON_AddArrayToObject(j, "local_shape");
      for (int d = 0; d < v->type.rank; d++)
        cJSON_AddItemToArray(ls, cJSON_CreateNumber((double)sharding_local_extent(&v->type, &v->sharding, E->mesh, d)));
      cJSON_AddNumberToObject(j, "flops", r->flops);
      cJSON_AddNumberToObject(j, "time_s", r->time_s);
    }
    if (r->count != 1) cJSON_AddNumberToObject(j, "count", r->count);
    if (r->stages) cJSON_AddStringToObject(j, "stages", r->stages);
    cJSON_AddItemToArray(os, j);
  }
  cJSON *s = cJSON_AddObjectToObject(o, "summary");
  cJSON_AddNumberToObject(s, "compute_s", E->compute_s);
  cJSON_AddNumberToObject(s, "comm_s", E->comm_s);
  cJSON_AddStringToObject(s, "verdict", E->comm_s <= E->compute_s ? "compute-bound" : "communication-bound");
  if (E->layer_loop) {
    cJSON *l = cJSON_AddObjectToObject(s, "per_layer");
    cJSON_AddNumberToObject(l, "compute_s", E->layer_compute_s);
    cJSON_AddNumberToObject(l, "comm_s", E->layer_comm_s);
    cJSON_AddStringToObject(l, "verdict", E->layer_comm_s <= E->layer_compute_s ? "compute-bound" : "communication-bound");
  }
  cJSON *bk = cJSON_AddObjectToObject(s, "by_kind");
  for (int k = 0; k < COLL__COUNT; k++) {
    Tally t = tally(E, k, -1, -1);
    if (t.runs > 0) cJSON_AddItemToObject(bk, coll_kind_name((CollKind)k), tally_json(t));
  }
  cJSON *bp = cJSON_AddObjectToObject(s, "by_phase");
  for (int ph = PHASE_FORWARD; ph <= PHASE_UPDATE; ph++) {
    Tally t = tally(E, -1, ph, -1);
    if (t.runs > 0) cJSON_AddItemToObject(bp, phase_name(ph), tally_json(t));
  }
  cJSON *ba = cJSON_AddArrayToObject(s, "by_axes");
  uint16_t groups[64];
  int ng = axis_groups(E, groups, 64);
  for (int i = 0; i < ng; i++) {
    cJSON *e = tally_json(tally(E, -1, -1, groups[i]));
    cJSON_AddItemToObject(e, "axes", axes_json(E, groups[i]));
    cJSON_AddItemToArray(ba, e);
  }
  cJSON *top = cJSON_AddArrayToObject(s, "top"); /* the collectives that take longest: indices into "collectives" */
  int *idx = colls_by_time(E);
  for (int i = 0; i < E->colls.len && i < 5; i++) {
    double t = E->colls.data[idx[i]].cost.time_s * E->colls.data[idx[i]].count;
    if (t <= 0) break;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "collective", idx[i]);
    cJSON_AddNumberToObject(e, "time_s", t);
    cJSON_AddNumberToObject(e, "share", E->comm_s > 0 ? t / E->comm_s : 0);
    cJSON_AddItemToArray(top, e);
  }
  cJSON *mem = cJSON_AddObjectToObject(o, "memory");
  cJSON_AddNumberToObject(mem, "total", (double)E->mem.total);
  cJSON_AddNumberToObject(mem, "params", (double)E->mem.params);
  cJSON_AddNumberToObject(mem, "grads", (double)E->mem.grads);
  cJSON_AddNumberToObject(mem, "optimizer", (double)E->mem.optimizer);
  cJSON_AddNumberToObject(mem, "activations", (double)E->mem.activations);
  cJSON_AddNumberToObject(mem, "temporaries", (double)E->mem.temporaries);
  cJSON_AddNumberToObject(mem, "capacity", E->mem.capacity);
  cJSON_AddBoolToObject(mem, "fits", E->mem.fits);
  cJSON_AddBoolToObject(o, "fits", E->mem.fits);
  cJSON_AddItemToObject(o, "textbook", explain_textbook_json(E->a, E->m, E->p));
  cJSON_AddItemToObject(o, "forbidden_cheaper", layout_weigh_json(E->a, E->m, E->p));
  if (E->pipe) {
    const PipeInfo *pi = E->pipe;
    uint16_t st = 0;
    for (int k = 0; k < pi->nstage_axes; k++) st |= (uint16_t)(1u << pi->stage_axes[k]);
    cJSON *pp = cJSON_AddObjectToObject(o, "pipeline");
    cJSON_AddNumberToObject(pp, "stages", pi->stages);
    cJSON_AddItemToObject(pp, "axes", axes_json(E, st));
    cJSON_AddNumberToObject(pp, "layers", (double)pi->layers);
    cJSON_AddNumberToObject(pp, "chunks_per_stage", pi->chunks);
    cJSON_AddNumberToObject(pp, "microbatches", pi->microbatches);
    cJSON_AddStringToObject(pp, "schedule", schedule_name(E->a, pi));
    cJSON_AddNumberToObject(pp, "bubble_fraction", (double)(pi->stages - 1) / ((double)pi->microbatches * pi->chunks));
    cJSON_AddNumberToObject(pp, "in_flight_first_stage", pi->in_flight_max[0]);
  }
  return o;
}

/* ---- the command ---- */

int cmd_explain(const Options *o) {
  Arena arena;
  arena_init(&arena);
  CheckedProgram cp;
  int rc = check_load(o, &arena, &cp);
  if (rc != EXIT_OK || !cp.ir) {
    if (rc == EXIT_OK && o->format == FORMAT_JSON) { /* nothing to explain: an empty report */
      cJSON *j = cJSON_CreateObject();
      cJSON_AddNullToObject(j, "entry");
      cJSON_AddArrayToObject(j, "collectives");
      cJSON_AddArrayToObject(j, "ops");
      report_json(j);
    } else if (rc == EXIT_OK) {
      fprintf(stderr, "shardc: %s declares no function to explain\n", o->input);
    }
    arena_free(&arena);
    return rc;
  }
  Program *p = cp.prog;
  IrModule *m = cp.ir;
  Explain E = {.o = o, .p = p, .m = m, .mesh = p->mesh, .a = &arena};
  m->weigh.want = !o->show; /* a plan the layout forbids, weighed (never taken) */
  if (!pipeline_run(m, p) || diag_error_count() > 0) {
    arena_free(&arena);
    return EXIT_PROGRAM_ERROR;
  }
  memory_estimate(p, m, &E.mem);
  if (!E.mem.fits) {
    diag_warning(p->step ? p->step->loc : p->entry->loc,
                 "does not fit: %s per device on %s, which has %s of HBM (explain goes on)",
                 fmt_bytes(&arena, (double)E.mem.total), p->mesh->target->name, fmt_bytes(&arena, E.mem.capacity));
  }
  if (o->show) { /* one value's blocks, and nothing else */
    const char *why = NULL, *note = NULL;
    const Value *v = explain_show_find(&arena, m, o->show, &why, &note);
    if (!v) {
      diag_usage("%s", why);
    } else if (o->format == FORMAT_JSON) {
      cJSON *j = explain_show_json(&arena, m, p, o->show, v);
      if (v->name && v->def && v->def->kind != OP_PARAM && v->def->loc.file) { /* a let: which binding */
        cJSON_AddNumberToObject(j, "line", v->def->loc.line);
        cJSON_AddStringToObject(j, "file", report_file(v->def->loc));
      }
      if (note) cJSON_AddStringToObject(j, "note", note);
      report_json(j);
    } else {
      if (note) printf("%s\n", note);
      explain_show_text(stdout, &arena, m, p, o->show, v);
    }
    arena_free(&arena);
    return v ? EXIT_OK : EXIT_USAGE;
  }
  E.pipe = m->pipeline ? m->pipeline->pipe : NULL;
  E.has_pipe = E.pipe != NULL;
  E.loop_outer_mult = 1;
  collect(&E, m->main, 0, 1, false, 1, NULL);
  if (o->format == FORMAT_JSON) {
    report_json(json_report(&E));
  } else {
    print_header(stdout, &E);
    print_overview(stdout, &E);
    print_ops(stdout, &E);
    print_colls(stdout, &E);
    print_summary(stdout, &E);
    explain_textbook_text(stdout, &arena, m, p);
    print_pipeline(stdout, &E);
    if (o->shardings) {
      fprintf(stdout, "\nshardings (every value; where each axis comes from):\n");
      print_value_shardings(stdout, &E, m->main, 0);
    }
  }
  arena_free(&arena);
  return EXIT_OK;
}
