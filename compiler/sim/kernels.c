/* kernels.c: the kernels a device runs for a per-device program, and what each costs (sim.h).
 *
 * In: a localised module (every value's local extents, every collective's CollSpec) and a mesh.
 * Out: one SimKernel per kernel a compiler would launch, priced by the cost model (cost.h) from
 * the FLOPs and bytes opcost.h states:
 *
 *   dispatch, combine a route's data movement (route.h): a memory-bound kernel of their bytes
 *   contraction       cost_matmul: M the first operand's own dims, N the second's, K the
 *                     contracted ones, batch the dims both keep (local extents); the dtype of the
 *                     wider operand
 *   attention         cost_attention as flash attention: its query heads (every dim of q but the
 *                     query and head dims), key/value heads (every dim of k but the key and head
 *                     dims), lengths and head sizes from local extents; the three ops of its
 *                     backward (dq, dk, dv) are one kernel
 *   elementwise       a producer-consumer group (XLA's loop fusion): an elementwise op, a cast
 *                     to another dtype, an activation's gradient, a causal mask or a broadcast
 *                     (ops.def's CC_FUSED) joins the group of each operand it alone consumes; the
 *                     group moves only its external bytes (cost_fused_chain)
 *   views             renames, splits, merges, casts to the same dtype, transposes to the same
 *                     dim order, slices of the leading dim alone: no kernel (bufplan.h's views)
 *   everything else   a memory-bound kernel (reductions, softmax, norms and their gradients,
 *                     gathers, the loss, the optimizer, transposes, slices): cost_memory_op
 *   collectives       cost_collective over Op.axes with language.md's bytes
 */
#include <string.h>

#include "bufplan.h"
#include "devprog.h"
#include "opcost.h"
#include "route.h"
#include "sim.h"

static const char *const kernel_names[] = {
#define X(e, s) [e] = s,
  SIM_KERNEL_KINDS(X)
#undef X
};

const char *sim_kernel_kind_name(SimKernelKind k) {
  if ((int)k < 0 || k >= SIMK_COUNT) return "?";
  return kernel_names[k];
}

double sim_value_bytes(const Value *v) {
  if (!v) return 0;
  double n = dtype_bytes(v->type.dtype) * ir_route_density(v); /* a route pattern: its entries */
  for (int i = 0; i < v->type.rank; i++) n *= (double)(v->local[i] > 0 ? v->local[i] : v->type.dims[i]->size);
  return n;
}

static double local_extent(const Value *v, const Dim *d) {
  int i = tensor_type_find(&v->type, d);
  if (i < 0) return 1;
  return (double)(v->local[i] > 0 ? v->local[i] : d->size);
}

/* ---- which ops are what ---- */

/* views: bufplan.h's (no kernel, no traffic) */
static bool is_view(const Op *op) { return bufplan_is_view(op); }

/* joins a producer-consumer group: the table's CC_FUSED ops (ops.def) */
static bool is_fusible(const Op *op) { return ir_op_info(op->kind)->cost == CC_FUSED; }

static bool no_kernel(const Op *op) { return ir_op_info(op->kind)->cost == CC_NONE || op->nresults == 0; }

static CollKind coll_kind_of(OpKind k) {
  int c = ir_op_info(k)->coll;
  return c == NOCOLL ? COLL_PERMUTE : (CollKind)c;
}

/* ---- pricing one op ---- */

static DType wider(DType a, DType b) { return dtype_bytes(a) >= dtype_bytes(b) ? a : b; }

static double price_matmul(const Target *t, const Op *op, bool ideal, OpTime *out) {
  const Value *a = op->operands[0], *b = op->operands[1];
  MatmulShape s = ir_matmul_shape(op);
  OpCost c;
  opcost(op, true, &c);
  return cost_matmul(t, wider(a->type.dtype, b->type.dtype), s, c.bytes, ideal, out);
}

/* The flash-attention shape of an OP_ATTENTION (or _GRAD) from its operands' local extents: the
 * batch folded into the head counts (heads = B x H, kv_heads = B x Hk), so that cost_attention's
 * FLOPs 2 B H Sq Skv (D + Dv) and its bytes per tensor are those of the op (opcost's count). */
static AttentionShape attention_shape(const Op *op) {
  const Value *q = op->operands[0], *k = op->operands[1], *v = op->operands[2];
  const Dim *hd = op->dims[0], *kd = op->dims[1], *qd = op->dims[2];
  AttentionShape a = {.batch = 1, .heads = 1, .kv_heads = 1, .v_dim = 1, .causal = op->flag != 0};
  a.q_len = local_extent(q, qd);
  a.kv_len = local_extent(k, kd);
  /* ring attention: the local query block meets every device's key block in turn (opcost's count);
   * ring_seconds splits this whole into the ring's steps */
  const DevRing *ring = op->dev ? op->dev->ring : NULL;
  if (ring && ring->groups) a.kv_len *= ring->groups->size;
  a.head_dim = local_extent(q, hd);
  for (int i = 0; i < q->type.rank; i++)
    if (q->type.dims[i] != qd && q->type.dims[i] != hd) a.heads *= local_extent(q, q->type.dims[i]);
  for (int i = 0; i < k->type.rank; i++)
    if (k->type.dims[i] != kd && k->type.dims[i] != hd) a.kv_heads *= local_extent(k, k->type.dims[i]);
  /* v's own dims: neither the key dim nor one q has (q's head dim aside: PV contracts it away) */
  for (int i = 0; i < v->type.rank; i++) {
    const Dim *d = v->type.dims[i];
    if (d == kd || (d != hd && tensor_type_find(&q->type, d) >= 0)) continue;
    a.v_dim *= local_extent(v, d);
  }
  return a;
}

double sim_op_seconds(const Mesh *mesh, const Op *op, bool ideal, OpTime *out) {
  OpTime z = {.efficiency = 1};
  if (out) *out = z;
  if (!mesh || !op || no_kernel(op) || is_view(op) || ir_op_is_collective(op->kind)) return 0;
  const Target *t = mesh->target;
  CostClass cc = (CostClass)ir_op_info(op->kind)->cost;
  if (cc == CC_CONTRACT && op->noperands == 2 && ir_route_contract(op, NULL) == CONTRACT_DENSE)
    return price_matmul(t, op, ideal, out); /* (a dispatch or a combine moves rows: memory-bound) */
  if (cc == CC_ATTENTION && op->noperands >= 3 && op->ndims >= 3) /* (a gradient: the backward) */
    return cost_attention(t, op->operands[0]->type.dtype, attention_shape(op),
                          ir_op_info(op->kind)->cls == OC_GRAD, ideal, out);
  OpCost c;
  opcost(op, true, &c);
  return cost_memory_op(t, c.bytes, ideal, out);
}

/* op's collective moving `bytes` (a bucket's: its members' sum) */
static double collective_seconds_of(const Mesh *mesh, const Op *op, double bytes, bool ideal, CollCost *out) {
  return cost_collective_group(mesh, coll_kind_of(op->kind), op->axes, dev_op_subset(op), bytes, ideal,
                               out);
}

double sim_collective_seconds(const Mesh *mesh, const Op *op, bool ideal, CollCost *out) {
  if (out) memset(out, 0, sizeof *out);
  if (!mesh || !op || !ir_op_is_collective(op->kind)) return 0;
  CollKind k = coll_kind_of(op->kind);
  return collective_seconds_of(mesh, op, sim_value_bytes(k == COLL_ALL_GATHER ? op->results[0] : op->operands[0]),
                               ideal, out);
}

/* Ring attention (the device program's DevRing): n steps, each the attention of one K/V block (1/n
 * of the op's compute) while the next block arrives: the first step's compute, then n - 1 steps of
 * whichever is longer, the block's compute or its CollectivePermute (cost_ring: K and V; the
 * backward also their gradients). */
static double ring_seconds(const Mesh *mesh, const Op *op, double compute, bool ideal) {
  const DevRing *ring = op->dev ? op->dev->ring : NULL;
  if (!ring || ring->steps < 1) return compute;
  CollCost step;
  int steps = cost_ring(mesh, ring->groups->mask, ring->k_bytes, ring->v_bytes, op->kind == OP_ATTENTION_GRAD, ideal, &step);
  double c = compute / (steps + 1);
  return c + steps * (c > step.time_s ? c : step.time_s);
}

/* ---- the kernels of a module ---- */

typedef struct KBuild {
  Arena *a;
  SimCosts *c;
  int cap;
  int32_t *uses;     /* by value id, within the function being read */
  const Value **src; /* by value id: the value a view chain starts from (itself if none) */
  int32_t *group;    /* by value id of a fusible op's result: union-find parent */
} KBuild;

static const Value *view_src(const KBuild *K, const Value *v) {
  const Value *s = K->src[v->id];
  return s ? s : v;
}

static int find(int32_t *p, int x) {
  while (p[x] != x) x = p[x] = p[p[x]];
  return x;
}

static SimKernel *new_kernel(KBuild *K, const Op *anchor, SimKernelKind kind) {
  if (K->c->nkernels == K->cap) {
    int nc = K->cap ? 2 * K->cap : 256;
    SimKernel *nk = ARENA_ARRAY(K->a, SimKernel, nc);
    if (K->c->nkernels) memcpy(nk, K->c->kernels, sizeof *nk * (size_t)K->c->nkernels);
    K->c->kernels = nk;
    K->cap = nc;
  }
  SimKernel *k = &K->c->kernels[K->c->nkernels++];
  memset(k, 0, sizeof *k);
  k->kind = (uint8_t)kind;
  k->anchor = anchor;
  k->nops = 1;
  k->op.efficiency = 1;
  return k;
}

static void set_kernel(KBuild *K, const Op *op, int idx) {
  for (int r = 0; r < op->nresults; r++) K->c->kernel_of[op->results[r]->id] = idx;
}

static bool same_operands(const Op *a, const Op *b) {
  if (a->noperands != b->noperands) return false;
  for (int i = 0; i < a->noperands; i++)
    if (a->operands[i] != b->operands[i]) return false;
  return true;
}

static void kernels_func(KBuild *K, const IrFunc *f);

static void count_uses(KBuild *K, const IrFunc *f) {
  for (const Op *op = f->first; op; op = op->next)
    for (int i = 0; i < op->noperands; i++) K->uses[op->operands[i]->id]++;
  for (int i = 0; i < f->noutputs; i++) K->uses[f->outputs[i]->id]++;
}

/* Whether the chain of views from v back to its source has one use at every link, so that the
 * source's only consumer is v's consumer. */
static bool single_use_chain(const KBuild *K, const Value *v) {
  for (;;) {
    if (K->uses[v->id] != 1) return false;
    if (!v->def || !is_view(v->def)) return true;
    v = v->def->operands[0];
  }
}

static void kernels_func(KBuild *K, const IrFunc *f) {
  SimCosts *c = K->c;
  const Target *t = c->mesh->target;
  count_uses(K, f);
  /* views and the fusion groups */
  for (const Op *op = f->first; op; op = op->next) {
    if (op->nresults > 0 && is_view(op)) K->src[op->results[0]->id] = view_src(K, op->operands[0]);
    if (no_kernel(op) || is_view(op) || !is_fusible(op)) continue;
    int x = op->results[0]->id;
    K->group[x] = x;
    for (int i = 0; i < op->noperands; i++) {
      const Value *u = view_src(K, op->operands[i]);
      const Op *d = u->def;
      if (!d || d->func != f || !is_fusible(d) || no_kernel(d) || is_view(d) || K->group[u->id] < 0) continue;
      if (!single_use_chain(K, op->operands[i])) continue;
      int ra = find(K->group, x), rb = find(K->group, u->id);
      if (ra != rb) K->group[rb] = ra;
    }
  }
  /* the group's root (the op no other member reads) anchors it: it is the last in program order,
   * since every other member is consumed, through single uses, by a later member */
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_LOOP && op->body) kernels_func(K, op->body);
    if (op->kind == OP_PIPELINE && op->pipe)
      for (int r = 0; r < PR__COUNT; r++)
        if (op->pipe->region[r]) kernels_func(K, op->pipe->region[r]);
    if (no_kernel(op)) continue;
    if (is_view(op)) {
      SimKernel *k = new_kernel(K, op, SIMK_VIEW);
      k->ins = ARENA_ARRAY(K->a, const Value *, 1);
      k->ins[0] = op->operands[0];
      k->nins = 1;
      set_kernel(K, op, c->nkernels - 1);
      continue;
    }
    if (op->kind == OP_ATTENTION_GRAD) { /* dq, dk, dv: one flash-attention backward */
      const Op *prev = NULL;
      for (const Op *o = f->first; o != op; o = o->next)
        if (o->kind == OP_ATTENTION_GRAD && same_operands(o, op)) prev = o;
      if (prev) {
        int idx = c->kernel_of[prev->results[0]->id];
        c->kernels[idx].nops++;
        set_kernel(K, op, idx);
        continue;
      }
    }
    const DevColl *dc = ir_op_is_collective(op->kind) && op->dev ? op->dev->coll : NULL;
    const DevColl *bk = dc && dc->lead ? dc->lead->dev->coll : dc && dc->members ? dc : NULL;
    if (bk) { /* a bucket of the device program (devprog.h): one collective of the sum */
      const Op *first = bk->members[0] != op ? bk->members[0] : NULL;
      if (first) {
        int idx = c->kernel_of[first->results[0]->id];
        SimKernel *k = &c->kernels[idx];
        k->nops++;
        k->bytes += sim_value_bytes(k->coll_kind == COLL_ALL_GATHER ? op->results[0] : op->operands[0]);
        k->time_s = collective_seconds_of(c->mesh, first, k->bytes, c->ideal, &k->coll);
        const Value **ins = ARENA_ARRAY(K->a, const Value *, k->nins + op->noperands);
        memcpy(ins, k->ins, sizeof *ins * (size_t)k->nins);
        memcpy(ins + k->nins, op->operands, sizeof *ins * (size_t)op->noperands);
        k->ins = ins;
        k->nins += op->noperands;
        set_kernel(K, op, idx);
        continue;
      }
    }
    if (ir_op_is_collective(op->kind)) {
      SimKernel *k = new_kernel(K, op, SIMK_COLLECTIVE);
      k->coll_kind = coll_kind_of(op->kind);
      k->time_s = sim_collective_seconds(c->mesh, op, c->ideal, &k->coll);
      k->bytes = sim_value_bytes(k->coll_kind == COLL_ALL_GATHER ? op->results[0] : op->operands[0]);
      k->ins = (const Value **)op->operands;
      k->nins = op->noperands;
      set_kernel(K, op, c->nkernels - 1);
      continue;
    }
    if (!is_fusible(op)) {
      CostClass cc = (CostClass)ir_op_info(op->kind)->cost;
      bool grad = ir_op_info(op->kind)->cls == OC_GRAD;
      SimKernelKind kind = cc == CC_CONTRACT && ir_route_contract(op, NULL) == CONTRACT_DENSE ? SIMK_MATMUL
                           : cc == CC_ATTENTION ? (grad ? SIMK_ATTENTION_BWD : SIMK_ATTENTION) : SIMK_MEMORY;
      SimKernel *k = new_kernel(K, op, kind);
      k->time_s = sim_op_seconds(c->mesh, op, c->ideal, &k->op);
      if (dev_op_ring(op)) k->time_s = ring_seconds(c->mesh, op, k->time_s, c->ideal);
      OpCost oc;
      opcost(op, true, &oc);
      k->flops = kind == SIMK_ATTENTION_BWD ? k->op.flops : oc.flops;
      k->bytes = k->op.bytes > 0 ? k->op.bytes : oc.bytes;
      k->ins = (const Value **)op->operands;
      k->nins = op->noperands;
      set_kernel(K, op, c->nkernels - 1);
      continue;
    }
    /* a fusible op: only the group's root makes the kernel (below) */
  }
  /* fused groups: one kernel per root, in program order */
  for (const Op *op = f->first; op; op = op->next) {
    if (no_kernel(op) || !is_fusible(op) || is_view(op)) continue;
    int x = op->results[0]->id;
    if (find(K->group, x) != x) continue;
    /* members: every fusible op of f whose root is x */
    int nops = 0, nins = 0, capins = 8;
    const Value **ins = ARENA_ARRAY(K->a, const Value *, capins);
    double ext = 0;
    for (const Op *o = f->first; o; o = o->next) {
      if (no_kernel(o) || !is_fusible(o) || is_view(o) || find(K->group, o->results[0]->id) != x) continue;
      nops++;
      for (int i = 0; i < o->noperands; i++) {
        const Value *v = o->operands[i], *s = view_src(K, v);
        if (s->def && s->def->func == f && is_fusible(s->def) && !no_kernel(s->def) && !is_view(s->def) &&
            K->group[s->id] >= 0 && find(K->group, s->id) == x)
          continue; /* made inside the group */
        bool seen = false;
        for (int j = 0; j < nins; j++) seen |= ins[j] == v;
        if (seen) continue;
        if (s->def && s->def->kind == OP_CONST) continue; /* a scalar: an immediate of the kernel */
        if (nins == capins) {
          const Value **n2 = ARENA_ARRAY(K->a, const Value *, 2 * capins);
          memcpy(n2, ins, sizeof *ins * (size_t)nins);
          ins = n2, capins *= 2;
        }
        ins[nins++] = v;
        ext += sim_value_bytes(v);
      }
    }
    ext += sim_value_bytes(op->results[0]);
    SimKernel *k = new_kernel(K, op, SIMK_FUSED);
    k->nops = nops;
    k->ins = ins;
    k->nins = nins;
    k->bytes = ext;
    k->time_s = cost_fused_chain(t, ext, nops, c->ideal, &k->op);
    int idx = c->nkernels - 1;
    for (const Op *o = f->first; o; o = o->next)
      if (!no_kernel(o) && is_fusible(o) && !is_view(o) && find(K->group, o->results[0]->id) == x) set_kernel(K, o, idx);
  }
}

void sim_costs_build(Arena *a, const IrModule *m, const Mesh *mesh, bool ideal, SimCosts *out) {
  memset(out, 0, sizeof *out);
  out->mesh = mesh;
  out->ideal = ideal;
  out->nvalues = m ? m->nvalues : 0;
  out->kernel_of = ARENA_ARRAY(a, int32_t, out->nvalues + 1);
  for (int i = 0; i <= out->nvalues; i++) out->kernel_of[i] = -1;
  if (!m || !m->main || !mesh) return;
  KBuild K = {.a = a, .c = out};
  K.uses = ARENA_ARRAY(a, int32_t, out->nvalues + 1);
  K.src = ARENA_ARRAY(a, const Value *, out->nvalues + 1);
  K.group = ARENA_ARRAY(a, int32_t, out->nvalues + 1);
  for (int i = 0; i <= out->nvalues; i++) K.group[i] = -1;
  kernels_func(&K, m->main);
}

const SimKernel *sim_costs_kernel(const SimCosts *c, const Op *op) {
  if (!c || !op || op->nresults == 0) return NULL;
  int id = op->results[0]->id;
  if (id < 0 || id >= c->nvalues || c->kernel_of[id] < 0) return NULL;
  return &c->kernels[c->kernel_of[id]];
}

double sim_costs_op_seconds(const SimCosts *c, const Op *op) {
  const SimKernel *k = sim_costs_kernel(c, op);
  return k && k->anchor == op ? k->time_s : 0;
}
