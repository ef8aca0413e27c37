/* cmm.c: collective matmuls chosen in the device program (cmm.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmm.h"
#include "devprog.h"

typedef struct Cmm {
  IrModule *m;
  const Program *p;
  DevModule *dm;
  int *uses;            /* per value id: its reads (a function output counts as two) */
  uint16_t batch, stage;
  int chosen;
} Cmm;

static void count_uses(Cmm *c, const IrFunc *f) {
  for (const Op *op = f->first; op; op = op->next) {
    for (int i = 0; i < op->noperands; i++) c->uses[op->operands[i]->id]++;
    if (op->kind == OP_LOOP && op->body) count_uses(c, op->body);
    if (op->kind == OP_PIPELINE && op->pipe)
      for (int r = 0; r < PR__COUNT; r++)
        if (op->pipe->region[r]) count_uses(c, op->pipe->region[r]);
  }
  for (int j = 0; j < f->noutputs; j++) c->uses[f->outputs[j]->id] += 2;
}

/* Whether op comes before `at` in their function. */
static bool op_before(const Op *op, const Op *at) {
  for (const Op *o = at->func->first; o && o != at; o = o->next)
    if (o == op) return true;
  return false;
}

/* Whether v holds its contents before `at`: an input, or made by an op before it (a bucket's
 * member: by its bucket's last member). */
static bool ready_before(const Value *v, const Op *at) {
  const Op *d = v->def;
  if (!d) return true;
  if (d->dev && d->dev->coll && d->dev->coll->lead) d = d->dev->coll->lead;
  return d->func == at->func && op_before(d, at);
}

static DType wider(DType a, DType b) { return dtype_bytes(a) >= dtype_bytes(b) ? a : b; }

static bool natural(const DevValue *v, int d) { return v->order[d].kind == RT_ORDER_NATURAL; }

static void try_gather(Cmm *c, Op *g) {
  DevOp *o = g->dev;
  const DevColl *dc = o ? o->coll : NULL;
  if (!dc || dc->kind != COLL_ALL_GATHER || dc->lead || dc->members || dc->nparts != 1 || !dc->groups ||
      dc->groups->subset || dc->parts[0].groups != dc->groups || dc->groups->size < 2)
    return;
  if ((g->axes & c->batch) || (g->axes & c->stage) || g->noperands != 1 || g->nresults != 1) return;
  const Value *x = g->operands[0], *X = g->results[0];
  int dx = dc->parts[0].dim, n = dc->groups->size;
  if (dx < 0 || dx >= X->type.rank || x->type.rank != X->type.rank || devprog_rt_dtype(x->type.dtype) < 0) return;
  if (X->local[dx] != x->local[dx] * n || c->uses[X->id] < 1 || c->uses[X->id] > CMM_MAX_READERS) return;
  if (!natural(dev_value(c->dm, x), dx) || !natural(dev_value(c->dm, X), dx)) return;
  const Dim *D = X->type.dims[dx];
  const Mesh *mesh = c->p->mesh;
  const Target *t = mesh ? mesh->target : NULL;
  if (!t) return;
  DevCmm cm = {.coll = g, .groups = dc->groups, .steps = n - 1, .dim_in = dx, .block = x->local[dx]};
  double C = 0, chunk = 0;
  /* every reader: a contraction (of X, or of a rename of X) keeping D with its other operand
   * without it, or contracting D against an operand holding it whole; the other operands hold
   * their contents at the first reader */
  int accounted = 0;
  for (const Op *k = X->func ? X->func->first : NULL; k; k = k->next) {
    const Value *via = NULL;
    for (int i = 0; i < k->noperands; i++)
      if (k->operands[i] == X || (k->operands[i]->def && k->operands[i]->def->kind == OP_RENAME &&
                                  k->operands[i]->def->operands[0] == X))
        via = via ? X /* two: refused below */ : k->operands[i];
    if (!via) continue;
    if (k->kind == OP_RENAME && k->operands[0] == X) { /* a view: its readers are the readers */
      if (k->results[0]->func != X->func) return;
      accounted++;
      continue;
    }
    int reads = 0;
    for (int i = 0; i < k->noperands; i++) reads += k->operands[i] == via;
    if (reads != 1 || k->kind != OP_CONTRACT || k->flag || k->noperands != 2 || k->nresults != 1 || !k->dev || k->dev->cmm ||
        k->place != g->place || cm.nreaders == CMM_MAX_READERS)
      return;
    int operand = k->operands[0] == via ? 0 : 1;
    const Value *Y = k->results[0], *W = k->operands[1 - operand];
    if (W->def && W->def->kind == OP_RENAME && W->def->operands[0] == X) return;
    const Dim *Dv = via->type.dims[dx];
    int dy = tensor_type_find(&Y->type, Dv), dw = tensor_type_find(&W->type, Dv);
    if (dy >= 0 && (dw >= 0 || Y->local[dy] != X->local[dx] || !natural(dev_value(c->dm, Y), dy))) return;
    if (dy < 0 && (dw < 0 || W->local[dw] != X->local[dx] || !natural(dev_value(c->dm, W), dw))) return;
    if (cm.nreaders && !ready_before(W, cm.readers[0])) return;
    cm.readers[cm.nreaders] = k, cm.via[cm.nreaders] = via, cm.operand[cm.nreaders] = operand;
    cm.dim_out[cm.nreaders] = dy, cm.dim_w[cm.nreaders] = dy < 0 ? dw : -1;
    cm.nreaders++;
    if (via == X) accounted++;
    DType dt = wider(k->operands[0]->type.dtype, k->operands[1]->type.dtype);
    MatmulShape s = ir_matmul_shape(k), part = s;
    if (dy < 0) part.k /= n;
    else if (operand == 0) part.m /= n;
    else part.n /= n;
    C += cost_matmul(t, dt, s, cost_matmul_bytes(dt, s), false, NULL);
    chunk += cost_matmul(t, dt, part, cost_matmul_bytes(dt, part), false, NULL);
  }
  if (!cm.nreaders || !ready_before(cm.readers[0]->operands[1 - cm.operand[0]], cm.readers[0])) return;
  /* a rename's every read is a reader's (counted), none is a function output */
  for (int i = 0; i < cm.nreaders; i++)
    if (cm.via[i] != X) {
      int r = 0;
      for (int j = 0; j < cm.nreaders; j++) r += cm.via[j] == cm.via[i];
      if (c->uses[cm.via[i]->id] != r) return;
    }
  if (accounted != c->uses[X->id]) return; /* a function output, or read in another function */
  cm.contract = cm.readers[0];
  /* the cost model: does the ring pay? */
  double A = cost_collective(mesh, COLL_ALL_GATHER, g->axes, dc->bytes, false, NULL);
  double block = dc->bytes / n;
  double step = cost_collective(mesh, COLL_PERMUTE, g->axes, block, false, NULL);
  double pair = chunk + (n - 1) * (chunk > step ? chunk : step);
  /* SHARDC_CMM=always (tests only): chosen whatever the cost model says, so that the tests' small
   * sizes, at which the latency of n - 1 permutes does not pay, run the ring */
  const char *force = getenv("SHARDC_CMM");
  if (!(pair < C + A) && !(force && strcmp(force, "always") == 0)) return;
  cm.step_bytes = block, cm.contract_s = C, cm.coll_s = A, cm.step_s = step, cm.chunk_s = chunk, cm.pair_s = pair;
  DevCmm *out = ARENA_NEW(c->dm->arena, DevCmm);
  *out = cm;
  char buf[320];
  snprintf(buf, sizeof buf,
           "collective matmul (tp_overlap): %d permutes of %.3g MB over %s overlapped with %d x %d partial contractions "
           "into blocks of %s: %.3g ms instead of %.3g ms (calibrated)",
           n - 1, block / 1e6, dc->groups->text, n, cm.nreaders, D->name, pair * 1e3, (C + A) * 1e3);
  size_t len = strlen(buf) + 1;
  char *r = ARENA_ARRAY(c->dm->arena, char, len);
  memcpy(r, buf, len);
  out->reason = r;
  o->cmm = out;
  for (int i = 0; i < out->nreaders; i++) ((DevOp *)out->readers[i]->dev)->cmm = out;
  c->chosen++;
}

/* Whether dim d of the contraction k's result Y can be cut into n blocks, each the product of
 * the operands' blocks along it: natural storage order, one operand at least holding it at the
 * same extent; its positions in the operands into da (-1: lacks it). */
static bool cuttable(Cmm *c, const Op *k, int d, int n, int *da) {
  const Value *Y = k->results[0];
  if (d < 0 || d >= Y->type.rank || Y->local[d] % n || Y->local[d] < n || !natural(dev_value(c->dm, Y), d)) return false;
  for (int i = 0; i < 2; i++) {
    const Value *a = k->operands[i];
    da[i] = tensor_type_find(&a->type, Y->type.dims[d]);
    if (da[i] >= 0 && (a->local[da[i]] != Y->local[d] || !natural(dev_value(c->dm, a), da[i]))) return false;
  }
  return da[0] >= 0 || da[1] >= 0;
}

/* A contraction feeding a ReduceScatter, or an AllReduce (devprog.h's DevCmm, scatter): the ring
 * runs at the contraction, each step the partial product of one block of the scattered dim (an
 * AllReduce's: the first of the result's dims that can be cut), then an AllReduce's AllGather. */
static void try_scatter(Cmm *c, Op *rs) {
  DevOp *o = rs->dev;
  const DevColl *dc = o ? o->coll : NULL;
  bool ar = dc && dc->kind == COLL_ALL_REDUCE;
  if (!dc || (dc->kind != COLL_REDUCE_SCATTER && !ar) || dc->lead || dc->members || !dc->groups ||
      dc->groups->subset || dc->groups->size < 2 || dc->reduce_max || o->cmm || rs->coll_period)
    return;
  if (!ar && (dc->nparts != 1 || dc->parts[0].groups != dc->groups)) return;
  if ((rs->axes & c->batch) || (rs->axes & c->stage) || rs->noperands != 1 || rs->nresults != 1) return;
  const Value *Y = rs->operands[0], *R = rs->results[0];
  Op *k = Y->def;
  int n = dc->groups->size, d = ar ? -1 : dc->parts[0].dim;
  if (!k || k->kind != OP_CONTRACT || k->flag || k->noperands != 2 || k->nresults != 1 || k->func != rs->func ||
      !k->dev || k->dev->cmm || k->place != rs->place || c->uses[Y->id] != 1 || k->operands[0] == k->operands[1])
    return;
  if (R->type.rank != Y->type.rank || R->type.dtype != Y->type.dtype || devprog_rt_dtype(Y->type.dtype) < 0) return;
  int da[2];
  if (ar) {
    for (int q = 0; q < Y->type.rank && d < 0; q++)
      if (cuttable(c, k, q, n, da)) d = q;
    if (d < 0) return;
    for (int q = 0; q < Y->type.rank; q++)
      if (R->local[q] != Y->local[q]) return;
  } else if (!cuttable(c, k, d, n, da) || Y->local[d] != R->local[d] * n || !natural(dev_value(c->dm, R), d)) {
    return;
  }
  const Dim *D = Y->type.dims[d];
  const Mesh *mesh = c->p->mesh;
  const Target *t = mesh ? mesh->target : NULL;
  if (!t) return;
  int operand = da[0] >= 0 ? 0 : 1;
  DevCmm cm = {.coll = rs, .scatter = true, .contract = k, .nreaders = 1, .groups = dc->groups, .steps = n - 1,
               .dim_in = da[operand], .block = Y->local[d] / n};
  cm.readers[0] = k, cm.via[0] = k->operands[operand], cm.operand[0] = operand;
  cm.dim_out[0] = d, cm.dim_w[0] = da[1 - operand];
  DType dt = wider(k->operands[0]->type.dtype, k->operands[1]->type.dtype);
  MatmulShape s = ir_matmul_shape(k), part = s;
  if (da[0] >= 0 && da[1] >= 0) part.batch = (part.batch > 0 ? part.batch : 1) / n;
  else if (operand == 0) part.m /= n;
  else part.n /= n;
  double C = cost_matmul(t, dt, s, cost_matmul_bytes(dt, s), false, NULL);
  double chunk = cost_matmul(t, dt, part, cost_matmul_bytes(dt, part), false, NULL);
  /* the cost model: does the ring pay? */
  double A = cost_collective(mesh, ar ? COLL_ALL_REDUCE : COLL_REDUCE_SCATTER, rs->axes, dc->bytes, false, NULL);
  double block = dc->bytes / n;
  double step = cost_collective(mesh, COLL_PERMUTE, rs->axes, block, false, NULL);
  double pair = chunk + (n - 1) * (chunk > step ? chunk : step);
  if (ar) pair += cost_collective(mesh, COLL_ALL_GATHER, rs->axes, dc->bytes, false, NULL); /* then whole */
  /* tests only, as in try_gather; SHARDC_CMM=scatter forces this side alone */
  const char *force = getenv("SHARDC_CMM");
  if (!(pair < C + A) && !(force && (strcmp(force, "always") == 0 || strcmp(force, "scatter") == 0))) return;
  cm.step_bytes = block, cm.contract_s = C, cm.coll_s = A, cm.step_s = step, cm.chunk_s = chunk, cm.pair_s = pair;
  DevCmm *out = ARENA_NEW(c->dm->arena, DevCmm);
  *out = cm;
  char buf[320];
  snprintf(buf, sizeof buf,
           "collective matmul (tp_overlap): %d partial contractions into blocks of %s, each added to the "
           "accumulator that %d permutes of %.3g MB over %s carry around%s: %.3g ms instead of %.3g ms (calibrated)",
           n, D->name, n - 1, block / 1e6, dc->groups->text, ar ? ", then an AllGather of the blocks" : "",
           pair * 1e3, (C + A) * 1e3);
  size_t len = strlen(buf) + 1;
  char *r = ARENA_ARRAY(c->dm->arena, char, len);
  memcpy(r, buf, len);
  out->reason = r;
  o->cmm = out;
  ((DevOp *)k->dev)->cmm = out;
  c->chosen++;
}

static void walk(Cmm *c, IrFunc *f) {
  for (Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_ALL_GATHER) try_gather(c, op);
    if (op->kind == OP_REDUCE_SCATTER || op->kind == OP_ALL_REDUCE) try_scatter(c, op);
    if (op->kind == OP_LOOP && op->body) walk(c, op->body);
    if (op->kind == OP_PIPELINE && op->pipe)
      for (int r = 0; r < PR__COUNT; r++)
        if (op->pipe->region[r]) walk(c, op->pipe->region[r]);
  }
}

int cmm_module(IrModule *m, const Program *p) {
  if (!m || !m->main || !m->dev || !p || !p->mesh || !m->dev->mesh) return 0;
  if (p->step && !p->step->tp_overlap) return 0;
  Cmm c = {.m = m, .p = p, .dm = m->dev, .batch = ir_batch_axes(m)};
  if (m->pipeline && m->pipeline->pipe)
    for (int k = 0; k < m->pipeline->pipe->nstage_axes; k++) c.stage |= (uint16_t)(1u << m->pipeline->pipe->stage_axes[k]);
  c.uses = calloc((size_t)m->nvalues + 1, sizeof *c.uses);
  if (!c.uses) return 0;
  count_uses(&c, m->main);
  walk(&c, m->main);
  free(c.uses);
  return c.chosen;
}
