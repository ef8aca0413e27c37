/* opcost.c: FLOPs and bytes of one op, and of a whole step (see opcost.h). */
#include <string.h>

#include "cost.h"
#include "devprog.h"
#include "opcost.h"
#include "route.h"

static double extent(const Value *v, int i, bool local) {
  return local ? (double)v->local[i] : (double)v->type.dims[i]->size;
}

/* The extent of dim d as the first of the values that has it holds it. */
static double dim_extent(const Value *const *vs, int n, const Dim *d, bool local) {
  for (int k = 0; k < n; k++) {
    int p = vs[k] ? tensor_type_find(&vs[k]->type, d) : -1;
    if (p >= 0) return extent(vs[k], p, local);
  }
  return (double)d->size;
}

/* 2 x the product of the distinct dims of a (without `drop`) and b, plus `add` when given; the
 * extents from the values `from` (operands, the result). */
static double prod2(const Value *a, const Value *b, const Dim *drop, const Dim *add, const Value *const *from, int nfrom,
                    bool local) {
  const Dim *seen[2 * MAX_RANK + 1];
  int n = 0;
  double f = 2;
  const Value *vs[2] = {a, b};
  for (int t = 0; t < 2; t++)
    for (int i = 0; i < vs[t]->type.rank; i++) {
      const Dim *d = vs[t]->type.dims[i];
      bool dup = t == 0 && d == drop; /* `drop` leaves the first tensor only (q's head, not v's) */
      for (int j = 0; j < n; j++) dup |= seen[j] == d;
      if (!dup) seen[n++] = d, f *= extent(vs[t], i, local);
    }
  if (add) {
    bool dup = false;
    for (int j = 0; j < n; j++) dup |= seen[j] == add;
    if (!dup) f *= dim_extent(from, nfrom, add, local);
  }
  return f;
}

/* A route-patterned value is held as its entries (route.h). */
static double value_bytes(const Value *v, bool local) {
  double n = dtype_bytes(v->type.dtype) * ir_route_density(v);
  for (int i = 0; i < v->type.rank; i++) n *= extent(v, i, local);
  return n;
}

void opcost(const Op *op, bool local, OpCost *out) {
  memset(out, 0, sizeof *out);
  CostClass cc = (CostClass)ir_op_info(op->kind)->cost;
  /* no kernel (leaves, regions: their ops are counted one by one), collectives (costed apart),
   * views: no traffic */
  if (cc == CC_NONE || cc == CC_COLLECTIVE || cc == CC_VIEW) return;
  if (cc == CC_BLOCK) { /* reads the block it keeps, writes it */
    out->bytes = 2 * value_bytes(op->results[0], local);
    return;
  }
  for (int i = 0; i < op->noperands; i++) out->bytes += value_bytes(op->operands[i], local);
  for (int r = 0; r < op->nresults; r++) out->bytes += value_bytes(op->results[r], local);
  switch (cc) { /* the FLOPs: each class its own count */
  case CC_CONTRACT:
    /* a dispatch or a combine moves rows (language.md): 0 FLOPs */
    if (op->noperands == 2 && ir_route_contract(op, NULL) == CONTRACT_DENSE)
      out->flops = prod2(op->operands[0], op->operands[1], NULL, NULL, NULL, 0, local);
    return;
  case CC_ROUTED: /* a dot product over dims[] per entry */
    if (op->noperands == 3) {
      const Value *r = op->results[0], *from[2] = {op->operands[1], op->operands[2]};
      double f = 2 * ir_route_fill(r);
      for (int i = 0; i < r->type.rank; i++) f *= extent(r, i, local);
      for (int j = 0; j < op->ndims; j++) f *= dim_extent(from, 2, op->dims[j], local);
      out->flops = f;
    }
    return;
  case CC_ATTENTION:
    if (op->noperands >= 3 && op->ndims >= 2) {
      const Value *q = op->operands[0], *k = op->operands[1], *v = op->operands[2];
      const Value *from[3] = {q, k, v};
      double qk = prod2(q, k, NULL, NULL, from, 3, local), pv = prod2(q, v, op->dims[0], op->dims[1], from, 3, local);
      if (op->kind == OP_ATTENTION || op->index == 0) out->flops = qk + pv;
      else if (op->index == 1) out->flops = qk;
      else out->flops = pv + qk, out->recompute_flops = qk;
      /* ring attention: the local query block meets every key block, one per device of the ring
       * (the device program's DevRing) */
      const DevRing *ring = op->dev ? op->dev->ring : NULL;
      if (ring && local) {
        out->flops *= ring->groups->size;
        out->recompute_flops *= ring->groups->size;
      }
    }
    return;
  default: return; /* memory-bound: bytes alone */
  }
}

double opcost_region_runs(const PipeInfo *pi, int region, bool global) {
  double n = pi->microbatches;
  if (region == PR_CHUNK_FWD || region == PR_CHUNK_BWD) return n * pi->chunks * (global ? pi->stages : 1);
  return n;
}

/* ---- a whole step ---- */

static void flops_in(const IrFunc *f, double mult, bool recompute, StepFlops *o) {
  for (const Op *op = f->first; op; op = op->next) {
    bool rc = recompute || op->phase == PHASE_RECOMPUTE;
    if (op->kind == OP_LOOP && op->body) {
      flops_in(op->body, mult * (double)op->count, rc, o);
      continue;
    }
    if (op->kind == OP_PIPELINE && op->pipe) {
      for (int r = 0; r < PR__COUNT; r++)
        if (op->pipe->region[r]) flops_in(op->pipe->region[r], mult * opcost_region_runs(op->pipe, r, true), rc, o);
      continue;
    }
    OpCost c;
    opcost(op, false, &c);
    double fl = (c.flops - c.recompute_flops) * mult, re = c.recompute_flops * mult;
    o->total += fl + re;
    if (rc) o->recompute += fl + re;
    else if (op->phase == PHASE_FORWARD || op->phase == PHASE_LOSS) o->forward += fl, o->recompute += re;
    else o->backward += fl, o->recompute += re;
  }
}

void step_flops(const IrModule *m, StepFlops *out) {
  memset(out, 0, sizeof *out);
  if (m && m->main) flops_in(m->main, 1, false, out);
}

double opcost_ring_pairs(const IrModule *m, const Op *op, int rank) {
  (void)m;
  const DevRing *ring = op->dev ? op->dev->ring : NULL; /* the device program's */
  if (!ring || !op->flag || op->ndims < 3 || op->noperands < 1) return 0;
  const Value *q = op->operands[0];
  int qd = tensor_type_find(&q->type, op->dims[2]);
  if (qd < 0 || q->local[qd] <= 0) return 0;
  int64_t block = q->local[qd];
  double pairs = 0;
  const RtOrder *o = &ring->qorder;
  for (int64_t p = rank * block; p < (rank + 1) * block; p++) pairs += 1 + (double)rt_order_logical(o, p);
  return pairs;
}

/* ---- a whole step's communication ---- */

static CollKind coll_kind(OpKind k) {
  int c = ir_op_info(k)->coll;
  return c == NOCOLL ? COLL_PERMUTE : (CollKind)c;
}

static double comm_in(const IrFunc *f, const Mesh *mesh, double mult) {
  double t = 0;
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_LOOP && op->body) {
      t += comm_in(op->body, mesh, mult * (double)op->count);
      continue;
    }
    if (op->kind == OP_PIPELINE && op->pipe) {
      for (int r = 0; r < PR__COUNT; r++)
        if (op->pipe->region[r]) t += comm_in(op->pipe->region[r], mesh, mult * opcost_region_runs(op->pipe, r, false));
      continue;
    }
    if (!ir_op_is_collective(op->kind) || op->noperands < 1 || op->nresults < 1) continue;
    CollKind k = coll_kind(op->kind);
    /* cost_collective's bytes: an AllGather's result, every other kind's operand */
    const Value *v = k == COLL_ALL_GATHER ? op->results[0] : op->operands[0];
    t += mult * cost_collective(mesh, k, op->axes, (double)sharding_local_bytes(&v->type, &v->sharding, mesh), true, NULL);
  }
  return t;
}

double step_comm_seconds(const IrModule *m, const Mesh *mesh) {
  return m && m->main && mesh ? comm_in(m->main, mesh, 1) : 0;
}

/* ---- a whole step's compute on one device ---- */

static double compute_in(const IrFunc *f, const Target *t, double mult) {
  double s = 0;
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_LOOP && op->body) {
      s += compute_in(op->body, t, mult * (double)op->count);
      continue;
    }
    if (op->kind == OP_PIPELINE && op->pipe) {
      for (int r = 0; r < PR__COUNT; r++)
        if (op->pipe->region[r]) s += compute_in(op->pipe->region[r], t, mult * opcost_region_runs(op->pipe, r, false));
      continue;
    }
    if (op->nresults < 1) continue;
    OpCost c;
    opcost(op, true, &c);
    if (c.flops > 0 || c.bytes > 0) s += mult * cost_op_time(t, ir_op_rate_dtype(op), c.flops, c.bytes, true);
  }
  return s;
}

double step_compute_seconds(const IrModule *m, const Mesh *mesh) {
  return m && m->main && mesh && mesh->target ? compute_in(m->main, mesh->target, 1) : 0;
}
