/* textbook.c: a layer's collectives against the literature's (textbook.h). */
#include <string.h>

#include "bucket.h"
#include "devprog.h"
#include "route.h"
#include "schedule.h"
#include "step.h"
#include "textbook.h"

static int kind_index(OpKind k) { return ir_op_info(k)->coll; } /* CollKind; NOCOLL (-1) */

/* A collective of expert parallelism: an AllToAll of a dispatch's slots (through casts, transposes,
 * slices and earlier collectives) or of what a combine reads, or any collective of a routed value
 * (the routing weights' gradient summed over the tensor-parallel axes). */
static bool expert_coll(const Op *op) {
  const Value *x = op->operands[0];
  if (x->route) return true;
  if (op->kind != OP_ALL_TO_ALL) return false;
  for (int k = 0; x && x->def && k < 16; k++) {
    const Op *d = x->def;
    if (ir_route_contract(d, NULL) == CONTRACT_DISPATCH) return true;
    if (d->noperands != 1 || !(d->kind == OP_CAST || d->kind == OP_TRANSPOSE || d->kind == OP_SLICE ||
                               ir_op_is_collective(d->kind)))
      break;
    x = d->operands[0];
  }
  const Value *y = op->results[0];
  for (const Op *o = op->func ? op->func->first : NULL; o; o = o->next)
    for (int i = 0; i < o->noperands; i++)
      if (o->operands[i] == y && ir_route_contract(o, NULL) == CONTRACT_COMBINE) return true;
  return false;
}

static void count_body(const IrFunc *f, const Mesh *mesh, LayerCensus *c, double share) {
  int bucket = 0;
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_LOOP && op->body) count_body(op->body, mesh, c, share);
    if (op->phase == PHASE_FORWARD && ir_route_contract(op, NULL) == CONTRACT_DISPATCH && !c->ep_slot_bytes)
      c->ep_slot_bytes = (double)sharding_local_bytes(&op->results[0]->type, &op->results[0]->sharding, mesh);
    const DevRing *ring = op->dev ? op->dev->ring : NULL; /* the device program's */
    if (ring && ring->carries) {
      c->ring |= ring->axes;
      c->ring_steps += ring->steps;
      if (op->kind == OP_ATTENTION) c->ring_bytes = ring->k_bytes + ring->v_bytes;
    }
    int k = kind_index(op->kind);
    if (k < 0 || k >= CENSUS_KINDS) continue;
    if (expert_coll(op)) {
      const Value *v = op->kind == OP_ALL_GATHER ? op->results[0] : op->operands[0];
      CollCost cc;
      cost_collective(mesh, (CollKind)k, op->axes,
                      (double)sharding_local_bytes(&v->type, &v->sharding, mesh) * ir_route_density(v), true, &cc);
      c->ep_n[k]++;
      c->ep_bytes[k] += cc.bytes_per_device * share;
      if (k == COLL_ALL_TO_ALL) c->ep_axes |= op->axes;
      continue;
    }
    int role = op->role < 3 ? op->role : ROLE_ACTIVATION;
    c->n[role][k] += 1;
    /* runs: bucketing's decision (Op.bucket, one run per bucket as bucket.c formed it), which the
     * book bounds; the device program splits a bucket whose members sit on different stages in
     * two (DevColl), which explain's collective list shows */
    if (!op->bucket || op->bucket != bucket) c->runs[role][k] += 1;
    bucket = op->bucket;
    CollCost cc;
    const Value *x = op->kind == OP_ALL_GATHER ? op->results[0] : op->operands[0];
    cost_collective(mesh, (CollKind)k, op->axes, (double)sharding_local_bytes(&x->type, &x->sharding, mesh), true, &cc);
    c->bytes[role][k] += cc.bytes_per_device * share;
    c->time_s[role][k] += cc.time_s * share;
    c->axes[role] |= op->axes;
    if (role == ROLE_GRADIENT && op->kind == OP_REDUCE_SCATTER && (op->axes & c->dp)) c->grad_scatters_dp++;
  }
}

/* The layer loops of f (and of the loops and pipeline regions in it) over `dim`. */
static void find_layers(const IrModule *m, const IrFunc *f, const Mesh *mesh, LayerCensus *c) {
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_PIPELINE && op->pipe) {
      for (int r = 0; r < PR__COUNT; r++)
        if (op->pipe->region[r]) find_layers(m, op->pipe->region[r], mesh, c);
      continue;
    }
    if (op->kind != OP_LOOP || !op->body) continue;
    bool micro = m->step && m->step->micro_loop == op;
    if (micro || op->nslices == 0) { /* a microbatch loop: the layers are inside */
      find_layers(m, op->body, mesh, c);
      continue;
    }
    if (!c->loop && !op->reverse) c->loop = op;
    if (c->loop && op->stack_dim == c->loop->stack_dim) count_body(op->body, mesh, c, 1);
  }
}

/* d is the expert dim of a route in f. */
static bool expert_dim(const IrFunc *f, const Dim *d) {
  for (const Op *o = f->first; o; o = o->next)
    if (o->kind == OP_ROUTE && o->ndims >= 3 && o->dims[0] == d) return true;
  return false;
}

/* An AllGather in f reads v (through casts and transposes). */
static bool gathered(const IrFunc *f, const Value *v) {
  for (const Op *o = f->first; o; o = o->next) {
    if (o->noperands != 1) continue;
    const Value *x = o->operands[0];
    while (x->def && x->def->noperands == 1 && (x->def->kind == OP_CAST || x->def->kind == OP_TRANSPOSE)) x = x->def->operands[0];
    if (o->kind == OP_ALL_GATHER && x == v) return true;
  }
  return false;
}

void layer_census(const IrModule *m, const Mesh *mesh, LayerCensus *c) {
  memset(c, 0, sizeof *c);
  if (!m || !m->main || !mesh) return;
  c->dp = ir_batch_axes(m);
  find_layers(m, m->main, mesh, c);
  if (!c->loop) return;
  /* the stacked params the layer reads, and those sharded over a batch axis (gathered: FSDP; held
   * sharded on a route's expert dim while the tokens come to them: expert parallelism) */
  uint16_t dp = c->dp;
  for (int i = 0; i < c->loop->nslices && i < c->loop->noperands; i++) {
    const Value *w = c->loop->operands[i]; /* (a forward loop's slices are its stacked params) */
    c->nweights++;
    uint16_t ax = 0, on_experts = 0;
    for (int d = 1; d < w->type.rank; d++) /* the stacking dim aside */
      for (int k = 0; k < w->sharding.naxes[d]; k++) {
        ax |= (uint16_t)(1u << w->sharding.axes[d][k]);
        if (expert_dim(c->loop->body, w->type.dims[d])) on_experts |= (uint16_t)(1u << w->sharding.axes[d][k]);
      }
    if (!(ax & dp)) continue;
    if (i < c->loop->body->ninputs && (ax & dp & ~on_experts) == 0 && !gathered(c->loop->body, c->loop->body->inputs[i]))
      c->nweights_ep++;
    else
      c->nweights_gathered++;
  }
}

/* ---- the comparison ---- */

static double axes_size(const Mesh *mesh, uint16_t axes) {
  double n = 1;
  for (int a = 0; a < mesh->naxes; a++)
    if (axes & (1u << a)) n *= mesh->axes[a].size;
  return n;
}

/* The layer's activation as one microbatch holds it on a device, with `tp` gathered: the bytes of
 * the forward loop's carried input (the residual stream) with those axes taken off its dims. */
static double activation_bytes(const LayerCensus *c, const Mesh *mesh, uint16_t tp) {
  const Op *l = c->loop;
  if (!l || l->ncarried < 1 || l->nslices >= l->body->ninputs) return 0;
  const Value *x = l->body->inputs[l->nslices];
  Sharding s = x->sharding;
  s.partial = 0;
  for (int d = 0; d < x->type.rank; d++) {
    int k = 0;
    for (int j = 0; j < s.naxes[d]; j++)
      if (!(tp & (1u << s.axes[d][j]))) s.axes[d][k++] = s.axes[d][j];
    s.naxes[d] = (uint8_t)k;
  }
  return (double)sharding_local_bytes(&x->type, &s, mesh);
}


static void add_row(TextbookRow *rows, int *n, TextbookRow r) {
  if (*n >= TEXTBOOK_MAX_ROWS) return;
  r.differs = r.want >= 0 && (r.got > r.want || (r.want_bytes > 0 && r.got_bytes > r.want_bytes * 1.001));
  rows[(*n)++] = r;
}

/* Gradient collectives of main outside the layers (after the microbatches, the update), counted
 * once each; `runs` counts a bucket once. */
static void step_colls(const IrFunc *f, const IrModule *m, int role, OpKind kind, int *n, int *runs) {
  int bucket = 0;
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_LOOP && op->body && m->step && op == m->step->micro_loop) step_colls(op->body, m, role, kind, n, runs);
    if (op->kind != kind || op->role != role) continue;
    (*n)++;
    if (!op->bucket || op->bucket != bucket) (*runs)++;
    bucket = op->bucket;
  }
}

/* DDP's buckets of the step's gradients: per dtype, one for each gradient of the cap or more, and
 * the smaller ones filling buckets of up to the cap. */
static int expected_buckets(const IrModule *m, const Mesh *mesh) {
  int runs = 0;
  for (int dt = 0; dt < DT__COUNT; dt++) {
    int64_t small = 0;
    for (int i = 0; m->step && i < m->step->nparams; i++) {
      const Value *v = m->step->params[i].value;
      if ((int)v->type.dtype != dt) continue;
      int64_t b = sharding_local_bytes(&v->type, &v->sharding, mesh);
      if (b >= BUCKET_CAP_BYTES) runs++;
      else small += b;
    }
    runs += (int)((small + BUCKET_CAP_BYTES - 1) / BUCKET_CAP_BYTES);
  }
  return runs;
}

int textbook_compare(Arena *a, const IrModule *m, const Program *p, const LayerCensus *c, TextbookRow *rows) {
  int n = 0;
  if (!m || !p || !p->mesh || !c) return 0;
  const Mesh *mesh = p->mesh;
  bool full = p->step && p->step->remat == REMAT_FULL;
  const PipeInfo *pi = m->pipeline ? m->pipeline->pipe : NULL;
  uint16_t stage = 0;
  for (int k = 0; pi && k < pi->nstage_axes; k++) stage |= (uint16_t)(1u << pi->stage_axes[k]);
  /* tensor (and sequence) parallelism: the layer's activation collectives */
  uint16_t tp = (uint16_t)(c->axes[ROLE_ACTIVATION] & ~stage);
  if (c->loop && tp) {
    double act = activation_bytes(c, mesh, tp), nt = axes_size(mesh, tp);
    const char *ax = mesh_axes_text(a, mesh, tp);
    const char *per = "per layer and microbatch";
    int most = full ? 6 : 4;
    if (c->n[ROLE_ACTIVATION][COLL_ALL_GATHER] || c->n[ROLE_ACTIVATION][COLL_REDUCE_SCATTER]) {
      const char *st = arena_printf(a, "Megatron sequence parallelism over %s", ax);
      for (int k = COLL_ALL_GATHER; k <= COLL_REDUCE_SCATTER; k++) {
        int got = c->n[ROLE_ACTIVATION][k];
        add_row(rows, &n, (TextbookRow){.strategy = st, .source = "Korthikanti et al. 2022", .kind = (CollKind)k,
                                         .got = got, .want = most, .runs = c->runs[ROLE_ACTIVATION][k],
                                         .got_bytes = got ? c->bytes[ROLE_ACTIVATION][k] / got : 0,
                                         .want_bytes = act * (nt - 1) / nt, .per = per});
      }
      if (c->n[ROLE_ACTIVATION][COLL_ALL_REDUCE])
        add_row(rows, &n, (TextbookRow){.strategy = st, .source = "Korthikanti et al. 2022", .kind = COLL_ALL_REDUCE,
                                         .got = c->n[ROLE_ACTIVATION][COLL_ALL_REDUCE], .want = 0,
                                         .runs = c->runs[ROLE_ACTIVATION][COLL_ALL_REDUCE], .per = per});
    } else if (c->n[ROLE_ACTIVATION][COLL_ALL_REDUCE]) {
      int got = c->n[ROLE_ACTIVATION][COLL_ALL_REDUCE];
      add_row(rows, &n, (TextbookRow){.strategy = arena_printf(a, "Megatron tensor parallelism over %s", ax),
                                       .source = "Shoeybi et al. 2019", .kind = COLL_ALL_REDUCE, .got = got,
                                       .want = most, .runs = c->runs[ROLE_ACTIVATION][COLL_ALL_REDUCE],
                                       .got_bytes = c->bytes[ROLE_ACTIVATION][COLL_ALL_REDUCE] / got,
                                       .want_bytes = act * 2 * (nt - 1) / nt, .per = per});
    }
    if (c->n[ROLE_ACTIVATION][COLL_ALL_TO_ALL])
      add_row(rows, &n, (TextbookRow){.strategy = arena_printf(a, "tensor parallelism over %s", ax),
                                       .source = "Shoeybi et al. 2019", .kind = COLL_ALL_TO_ALL,
                                       .got = c->n[ROLE_ACTIVATION][COLL_ALL_TO_ALL], .want = 0,
                                       .runs = c->runs[ROLE_ACTIVATION][COLL_ALL_TO_ALL], .per = per});
  }
  /* context parallelism: the layer's rings */
  if (c->loop && c->ring) {
    int nr = (int)axes_size(mesh, c->ring);
    add_row(rows, &n, (TextbookRow){.strategy = arena_printf(a, "context parallelism over %s (ring attention)",
                                                             mesh_axes_text(a, mesh, c->ring)),
                                     .source = "Liu et al. 2023", .kind = COLL_PERMUTE, .got = c->ring_steps,
                                     .want = (nr - 1) * (full ? 3 : 2), .runs = c->ring_steps,
                                     .per = "per layer and microbatch (steps of the rings)"});
  }
  /* FSDP: the layer's gathered weights */
  if (c->loop && c->nweights_gathered) {
    const char *st = arena_printf(a, "FSDP over %s (%d of the layer's %d weights sharded)",
                                  mesh_axes_text(a, mesh, c->axes[ROLE_WEIGHT] ? c->axes[ROLE_WEIGHT] : ir_batch_axes(m)),
                                  c->nweights_gathered, c->nweights);
    add_row(rows, &n, (TextbookRow){.strategy = st, .source = "Zhao et al. 2023", .kind = COLL_ALL_GATHER,
                                     .got = c->n[ROLE_WEIGHT][COLL_ALL_GATHER], .want = 2 * c->nweights_gathered,
                                     .runs = c->runs[ROLE_WEIGHT][COLL_ALL_GATHER], .per = "per layer and microbatch"});
    add_row(rows, &n, (TextbookRow){.strategy = st, .source = "Zhao et al. 2023", .kind = COLL_REDUCE_SCATTER,
                                     .got = c->grad_scatters_dp, .want = c->nweights_gathered,
                                     .runs = c->runs[ROLE_GRADIENT][COLL_REDUCE_SCATTER],
                                     .per = "per layer and microbatch"});
  }
  /* expert parallelism: the slots to their experts and back, forward and backward (and again in
   * a recomputation), (n-1)/n of the dispatch buffer each */
  if (c->loop && c->ep_n[COLL_ALL_TO_ALL]) {
    double ne = axes_size(mesh, c->ep_axes);
    const char *st = arena_printf(a, "expert parallelism over %s (%d of the layer's %d weights the experts')",
                                  mesh_axes_text(a, mesh, c->ep_axes), c->nweights_ep, c->nweights);
    for (int k = 0; k < CENSUS_KINDS; k++) {
      if (!c->ep_n[k]) continue;
      bool a2a = k == COLL_ALL_TO_ALL;
      add_row(rows, &n, (TextbookRow){.strategy = st, .source = "Lepikhin et al. 2021", .kind = (CollKind)k,
                                       .got = c->ep_n[k], .want = a2a ? (full ? 6 : 4) : -1, .runs = c->ep_n[k],
                                       .got_bytes = c->ep_bytes[k] / c->ep_n[k],
                                       .want_bytes = a2a ? c->ep_slot_bytes * (ne - 1) / ne : 0,
                                       .per = "per layer and microbatch"});
    }
  }
  /* data parallelism and ZeRO: the step's gradient collectives outside the layers */
  if (m->step) {
    int zero = p->step ? p->step->zero : 0;
    int nar = 0, rar = 0, nrs = 0, rrs = 0, nag = 0, rag = 0;
    step_colls(m->main, m, ROLE_GRADIENT, OP_ALL_REDUCE, &nar, &rar);
    step_colls(m->main, m, ROLE_GRADIENT, OP_REDUCE_SCATTER, &nrs, &rrs);
    step_colls(m->main, m, ROLE_WEIGHT, OP_ALL_GATHER, &nag, &rag);
    int inlayer_ar = c->n[ROLE_GRADIENT][COLL_ALL_REDUCE];
    if (zero >= 1) {
      const char *st = arena_printf(a, "ZeRO-%d", zero);
      add_row(rows, &n, (TextbookRow){.strategy = st, .source = "Rajbhandari et al. 2020", .kind = COLL_ALL_REDUCE,
                                       .got = nar + inlayer_ar, .want = 0, .runs = rar, .per = "per step (gradients)"});
      add_row(rows, &n, (TextbookRow){.strategy = st, .source = "Rajbhandari et al. 2020", .kind = COLL_ALL_GATHER,
                                       .got = nag, .want = m->nparams, .runs = rag, .per = "per step (updated params)"});
    } else if (nar && !inlayer_ar) {
      add_row(rows, &n, (TextbookRow){.strategy = "data parallelism", .source = "PyTorch DDP (Li et al. 2020)",
                                       .kind = COLL_ALL_REDUCE, .got = rar, .want = expected_buckets(m, mesh),
                                       .runs = rar, .per = "per step (runs: one per gradient bucket)"});
    }
  }
  /* pipelines: a send each way per microbatch and boundary */
  if (pi && pi->microbatches > 0) {
    int64_t sends = schedule_count(pi, PA_SEND, false) + schedule_count(pi, PA_SEND, true);
    int bounds = pi->stages * pi->chunks - 1;
    /* the bytes of one send: the activation as the sender holds it, over the axes it is replicated
     * on when Megatron's scatter-gather splits it; the book: the activation over the
     * tensor-parallel group */
    double got = 0, want = 0;
    const IrFunc *R = pi->region[PR_CHUNK_FWD];
    for (int i = 0; R && i < R->noutputs; i++) {
      if (pi->out[PR_CHUNK_FWD][i].kind != POUT_ACT) continue;
      const Value *x = R->outputs[i];
      double b = (double)sharding_local_bytes(&x->type, &x->sharding, mesh);
      got = b / (pi->send_split ? axes_size(mesh, pi->send_split) : 1);
      want = activation_bytes(c, mesh, tp) / (tp ? axes_size(mesh, tp) : 1);
    }
    add_row(rows, &n, (TextbookRow){.strategy = arena_printf(a, "pipeline over %s (%d stages x %d chunks)",
                                                             mesh_axes_text(a, mesh, stage), pi->stages, pi->chunks),
                                     .source = "Narayanan et al. 2021", .kind = COLL_PERMUTE,
                                     .got = (int)(sends / pi->microbatches), .want = 2 * bounds,
                                     .runs = (int)(sends / pi->microbatches),
                                     .got_bytes = got, .want_bytes = c->loop ? want : 0,
                                     .per = "per microbatch, over all stages"});
  }
  return n;
}
