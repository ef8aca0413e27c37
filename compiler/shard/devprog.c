/* devprog.c: the device program (devprog.h).
 *
 * Devices are numbered major to minor over the mesh's axes (the last axis fastest): device d's
 * coordinate on axis a is (d / stride(a)) mod size(a), stride(a) the product of the sizes of the
 * axes after a. The groups over a tuple (a1, ..., ak): the devices equal off the tuple form a
 * group; a device's rank is its coordinates on a1..ak read as a mixed-radix number (a1 most
 * significant), its group number its coordinates on the other axes read the same way in mesh
 * order (so an MPI backend's MPI_Comm_split(colour = group, key = rank) makes the same groups). */
#include <stdio.h>
#include <string.h>

#include "devprog.h"
#include "diag.h"
#include "route.h"

/* ---- groups ---- */

static int64_t axis_stride(const Mesh *mesh, int a) {
  int64_t s = 1;
  for (int b = a + 1; b < mesh->naxes; b++) s *= mesh->axes[b].size;
  return s;
}

static int coord(const Mesh *mesh, int64_t dev, int a) { return (int)((dev / axis_stride(mesh, a)) % mesh->axes[a].size); }

static const char *tuple_text(DevModule *dm, const int8_t *axes, int n) {
  char buf[256];
  size_t len = (size_t)snprintf(buf, sizeof buf, "(");
  for (int k = 0; k < n && len < sizeof buf; k++)
    len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s", k ? ", " : "", dm->mesh->axes[axes[k]].name);
  if (len < sizeof buf) snprintf(buf + len, sizeof buf - len, ")");
  return arena_printf(dm->arena, "%s", buf);
}

static DevGroups *groups_new(DevModule *dm, const int8_t *axes, int n) {
  DevGroups *g = ARENA_NEW(dm->arena, DevGroups);
  g->id = dm->groups.len;
  g->naxes = n;
  memcpy(g->axes, axes, (size_t)n);
  for (int k = 0; k < n; k++) g->mask |= (uint16_t)(1u << axes[k]);
  g->size = 1;
  for (int k = 0; k < n; k++) g->size *= dm->mesh ? dm->mesh->axes[axes[k]].size : 1;
  g->ngroups = dm->ndev / g->size;
  int32_t *members = ARENA_ARRAY(dm->arena, int32_t, dm->ndev);
  int32_t *group_of = ARENA_ARRAY(dm->arena, int32_t, dm->ndev), *rank_of = ARENA_ARRAY(dm->arena, int32_t, dm->ndev);
  for (int64_t d = 0; d < dm->ndev; d++) {
    int64_t rank = 0, grp = 0;
    for (int k = 0; k < n; k++) rank = rank * dm->mesh->axes[axes[k]].size + coord(dm->mesh, d, axes[k]);
    for (int a = 0; dm->mesh && a < dm->mesh->naxes; a++)
      if (!(g->mask >> a & 1)) grp = grp * dm->mesh->axes[a].size + coord(dm->mesh, d, a);
    group_of[d] = (int32_t)grp;
    rank_of[d] = (int32_t)rank;
    members[grp * g->size + rank] = (int32_t)d;
  }
  g->members = members, g->group_of = group_of, g->rank_of = rank_of;
  g->text = dm->mesh ? tuple_text(dm, axes, n) : "()";
  VEC_PUSH(dm->arena, dm->groups, g);
  return g;
}

const DevGroups *dev_groups(DevModule *dm, const int8_t *axes, int naxes) {
  int8_t real[MAX_MESH_AXES];
  int n = 0;
  for (int k = 0; k < naxes && dm->mesh; k++) {
    int a = axes[k];
    if (a < 0 || a >= dm->mesh->naxes || dm->mesh->axes[a].size <= 1) continue;
    bool dup = false;
    for (int j = 0; j < n; j++) dup |= real[j] == a;
    if (!dup && n < MAX_MESH_AXES) real[n++] = (int8_t)a;
  }
  for (int i = 0; i < dm->groups.len; i++) {
    const DevGroups *g = dm->groups.data[i];
    if (!g->subset && g->naxes == n && memcmp(g->axes, real, (size_t)n) == 0) return g;
  }
  return groups_new(dm, real, n);
}

const DevGroups *dev_groups_mask(DevModule *dm, uint16_t mask) {
  int8_t axes[MAX_MESH_AXES];
  int n = 0;
  for (int a = 0; dm->mesh && a < dm->mesh->naxes && n < MAX_MESH_AXES; a++)
    if (mask >> a & 1) axes[n++] = (int8_t)a;
  return dev_groups(dm, axes, n);
}

const DevGroups *dev_groups_subset(DevModule *dm, const DevGroups *g, const int *ranks, int n) {
  for (int i = 0; i < dm->groups.len; i++) { /* interned: the same subset of the same groups */
    const DevGroups *h = dm->groups.data[i];
    if (!h->subset || h->naxes != g->naxes || memcmp(h->axes, g->axes, (size_t)g->naxes) || h->size != n) continue;
    bool same = true;
    for (int r = 0; r < n && same; r++) same = h->members[r] == g->members[ranks[r]];
    if (same) return h;
  }
  DevGroups *s = ARENA_NEW(dm->arena, DevGroups);
  *s = *g;
  s->id = dm->groups.len;
  s->subset = true;
  s->size = n;
  int32_t *members = ARENA_ARRAY(dm->arena, int32_t, (size_t)g->ngroups * (size_t)(n > 0 ? n : 1));
  int32_t *group_of = ARENA_ARRAY(dm->arena, int32_t, dm->ndev), *rank_of = ARENA_ARRAY(dm->arena, int32_t, dm->ndev);
  for (int64_t d = 0; d < dm->ndev; d++) group_of[d] = rank_of[d] = -1;
  for (int grp = 0; grp < g->ngroups; grp++)
    for (int r = 0; r < n; r++) {
      int32_t d = g->members[grp * g->size + ranks[r]];
      members[grp * n + r] = d;
      group_of[d] = grp;
      rank_of[d] = r;
    }
  s->members = members, s->group_of = group_of, s->rank_of = rank_of;
  char ranks_text[64] = "";
  size_t len = 0;
  for (int r = 0; r < n && len < sizeof ranks_text; r++)
    len += (size_t)snprintf(ranks_text + len, sizeof ranks_text - len, "%s%d", r ? ", " : "", ranks[r]);
  s->text = arena_printf(dm->arena, "%s ranks {%s}", g->text, ranks_text);
  VEC_PUSH(dm->arena, dm->groups, s);
  return s;
}

const DevGroups *dev_groups_of_dim(DevModule *dm, const Sharding *s, int dim) {
  int n = s->naxes[dim] < MAX_AXES_PER_DIM ? s->naxes[dim] : MAX_AXES_PER_DIM;
  return dev_groups(dm, s->axes[dim], n);
}

/* ---- blocks and stages ---- */

int64_t dev_block_start(const DevGroups *g, int64_t dev, int64_t extent) {
  return g && g->rank_of[dev] > 0 ? extent * g->rank_of[dev] : 0;
}

static int64_t extent_over(const DevModule *dm, const TensorType *t, const DevGroups *g, int d) {
  int64_t size = t->dims[d] ? t->dims[d]->size : 1;
  return g && g->size > 1 ? size / g->size : size;
}

void dev_sharding_block(DevModule *dm, const TensorType *t, const Sharding *s, int64_t dev, int64_t *start,
                        int64_t *shape) {
  for (int d = 0; d < t->rank; d++) {
    const DevGroups *g = dev_groups_of_dim(dm, s, d);
    shape[d] = extent_over(dm, t, g, d);
    start[d] = dev_block_start(g, dev, shape[d]);
  }
}

void dev_value_block(const DevModule *dm, const Value *v, int64_t dev, int64_t *start, int64_t *shape) {
  const DevValue *x = dev_value(dm, v);
  for (int d = 0; d < v->type.rank; d++) {
    shape[d] = x->local[d];
    start[d] = dev_block_start(x->groups[d], dev, x->local[d]);
  }
}

int64_t dev_op_offset(const DevOp *o, const Dim *d, int64_t dev) {
  for (int i = 0; o && i < o->noffs; i++)
    if (o->offs[i].dim == d) return dev_block_start(o->offs[i].groups, dev, o->offs[i].extent);
  return 0;
}

int dev_stage(const DevModule *dm, int64_t dev) { return dm->pipe ? dm->pipe->stages->rank_of[dev] : 0; }

bool dev_stage_runs(uint8_t place, int s, int p) {
  if (place == PLACE_ALL) return true;
  if (s == 0) return place & PLACE_FIRST;
  if (s == p - 1) return place & PLACE_LAST;
  return place & PLACE_MID;
}

bool dev_runs_on(const DevModule *dm, uint8_t place, int64_t dev) {
  if (!dm->pipe) return true;
  return dev_stage_runs(place, dev_stage(dm, dev), dm->pipe->stages->size);
}

/* ---- storage orders ---- */

RtOrder dev_dim_order(const DevModule *dm, const Dim *d, int pos) {
  RtOrder o = {.kind = RT_ORDER_NATURAL};
  const IrModule *m = dm->m;
  if (!dm->mesh || !d) return o;
  const struct Zigzag *z = &m->zigzag;
  if (z->axes && z->n >= 2 && (d == z->dims[0] || d == z->dims[1]) && d->size / (2 * z->n) > 0)
    return (RtOrder){.kind = RT_ORDER_ZIGZAG, .n = z->n, .chunk = d->size / (2 * z->n)};
  const PipeInfo *pi = m->pipeline ? m->pipeline->pipe : NULL;
  if (pi && pos == 0 && pi->chunks > 1 && d == pi->stack_dim && pi->chunk_layers > 0)
    return (RtOrder){.kind = RT_ORDER_INTERLEAVED, .n = pi->stages, .v = pi->chunks, .chunk = pi->chunk_layers};
  return o;
}

int64_t dev_chunk_row0(const DevModule *dm, int g) {
  const PipeInfo *pi = dm->m->pipeline ? dm->m->pipeline->pipe : NULL;
  if (!pi) return 0;
  int64_t Lc = pi->chunk_layers, V = pi->chunks;
  if (!dm->mesh) return g * Lc;
  RtOrder o = dev_dim_order(dm, pi->stack_dim, 0);
  for (int64_t s = 0; s < pi->stages; s++)
    for (int64_t c = 0; c < V; c++)
      if (rt_order_logical(&o, (s * V + c) * Lc) == g * Lc) return c * Lc;
  return -1;
}

int64_t dev_value_logical(const DevModule *dm, const Value *v, int dim, int64_t p) {
  return rt_order_logical(&dev_value(dm, v)->order[dim], p);
}

/* ---- what the host and the runtime are given ---- */

int devprog_rt_dtype(DType dt) {
  switch (dt) {
  case DT_F32: return RT_F32;
  case DT_BF16: return RT_BF16;
  case DT_F16: return RT_F16;
  case DT_I32: return RT_I32;
  case DT_F8E4M3: return RT_F8E4M3;
  case DT_F8E5M2: return RT_F8E5M2;
  default: return -1;
  }
}

void devprog_place(DevModule *dm, Arena *a, const Value *v, RtPlace *out) {
  memset(out, 0, sizeof *out);
  out->dtype = devprog_rt_dtype(v->type.dtype);
  out->rank = v->type.rank;
  out->ndev = dm ? dm->ndev : 1;
  for (int d = 0; d < v->type.rank; d++) out->global[d] = out->local[d] = v->type.dims[d]->size;
  if (!dm || !dm->mesh) return;
  const DevValue *x = dev_value(dm, v);
  int64_t *start = ARENA_ARRAY(a, int64_t, (size_t)dm->ndev * (size_t)(v->type.rank > 0 ? v->type.rank : 1));
  uint8_t *holds = ARENA_ARRAY(a, uint8_t, dm->ndev), *take = ARENA_ARRAY(a, uint8_t, dm->ndev);
  uint16_t used = v->sharding.partial, all = 0;
  for (int d = 0; d < v->type.rank; d++) {
    out->local[d] = x->local[d];
    out->order[d] = x->order[d];
    if (x->groups[d]) used |= x->groups[d]->mask;
  }
  for (int ax = 0; ax < dm->mesh->naxes; ax++) all |= (uint16_t)(1u << ax);
  const DevGroups *rep = dev_groups_mask(dm, all & ~used); /* the devices holding copies of one block */
  for (int64_t dev = 0; dev < dm->ndev; dev++) {
    for (int d = 0; d < v->type.rank; d++) start[dev * v->type.rank + d] = dev_block_start(x->groups[d], dev, x->local[d]);
    holds[dev] = dev_runs_on(dm, x->place, dev);
  }
  for (int64_t dev = 0; dev < dm->ndev; dev++) {
    const int32_t *grp = &rep->members[rep->group_of[dev] * rep->size];
    int first = -1;
    for (int r = 0; r < rep->size && first < 0; r++)
      if (holds[grp[r]]) first = grp[r];
    take[dev] = first == dev;
  }
  out->partial = v->sharding.partial != 0 && (dev_groups_mask(dm, v->sharding.partial)->size > 1);
  out->start = start, out->holds = holds, out->take = take;
}

int devprog_record_devices(const DevModule *dm, int32_t *out, int max) {
  if (!dm || !dm->pipe || max < 1) {
    if (max >= 1) out[0] = 0;
    return max >= 1 ? 1 : 0;
  }
  const DevGroups *g = dm->pipe->stages;
  int n = g->size < max ? g->size : max;
  for (int r = 0; r < n; r++) out[r] = g->members[g->group_of[0] * g->size + r];
  return n;
}

/* ---- building ---- */

typedef struct Build {
  DevModule *dm;
  bool failed;
} Build;

static bool fail(Build *B, const Op *op, const char *what) {
  diag_error(op->loc, "internal error: the device program of the %s: %s", ir_op_name(op->kind), what);
  B->failed = true;
  return false;
}

static void add_value(Build *B, const Value *v, uint8_t place) {
  DevModule *dm = B->dm;
  if (!v || v->id < 0 || v->id > dm->nvalues) return;
  DevValue *x = &dm->values[v->id];
  x->v = v;
  x->place = place;
  x->buffer = -1;
  for (int d = 0; d < v->type.rank; d++) {
    x->groups[d] = dm->mesh ? dev_groups_of_dim(dm, &v->sharding, d) : NULL;
    if (x->groups[d] && x->groups[d]->size == 1) x->groups[d] = NULL;
    x->local[d] = dm->mesh && v->local[d] > 0 ? v->local[d] : extent_over(dm, &v->type, x->groups[d], d);
    x->order[d] = dev_dim_order(dm, v->type.dims[d], d);
  }
}

static double value_bytes(const DevModule *dm, const Value *v) {
  const DevValue *x = dev_value(dm, v);
  double n = dtype_bytes(v->type.dtype) * ir_route_density(v);
  for (int d = 0; d < v->type.rank; d++) n *= (double)x->local[d];
  return n;
}

static CollKind coll_kind(OpKind k) {
  switch (k) {
  case OP_ALL_GATHER: return COLL_ALL_GATHER;
  case OP_REDUCE_SCATTER: return COLL_REDUCE_SCATTER;
  case OP_ALL_REDUCE: return COLL_ALL_REDUCE;
  case OP_ALL_TO_ALL: return COLL_ALL_TO_ALL;
  default: return COLL_PERMUTE;
  }
}

static void build_coll(Build *B, DevOp *o) {
  DevModule *dm = B->dm;
  const Op *op = o->op;
  DevColl *c = ARENA_NEW(dm->arena, DevColl);
  o->coll = c;
  c->kind = coll_kind(op->kind);
  c->reduce_max = op->reduce_max;
  const CollSpec *cs = op->coll;
  int8_t all[MAX_MESH_AXES];
  int nall = 0;
  if (cs && op->kind != OP_ALL_REDUCE) {
    for (int p = 0; p < cs->nparts; p++) {
      const CollDim *cd = &cs->parts[p];
      c->parts[c->nparts].dim = cd->dim;
      c->parts[c->nparts].groups = dev_groups(dm, cd->axes, cd->naxes);
      c->nparts++;
      for (int k = 0; k < cd->naxes && nall < MAX_MESH_AXES; k++) all[nall++] = cd->axes[k];
    }
    if (op->kind == OP_ALL_TO_ALL) nall = cs->nparts ? cs->parts[0].naxes : 0; /* both parts move the same axes */
    c->shift = cs->shift;
    c->groups = dev_groups(dm, all, nall);
  } else {
    c->groups = dev_groups_mask(dm, op->axes);
    if (op->kind == OP_PERMUTE) c->shift = 1;
  }
  c->period = op->coll_period;
  if (cs && cs->ngroup) c->groups = dev_groups_subset(dm, dev_groups_mask(dm, op->axes), cs->group, cs->ngroup);
  const Value *v = c->kind == COLL_ALL_GATHER ? op->results[0] : op->operands[0];
  c->bytes = value_bytes(dm, v);
}

/* A bucket's members (Op.bucket, adjacent but for the casts and views that feed them) run as one
 * collective at the last of them, over the last member's groups: nothing between the first and the
 * last may read a member's result, and the members agree on kind, dtype and the set of axes (each
 * member's parts place its blocks by their own groups' ranks). Members placed on other stages than
 * the others (bucketing ran before the pipeline split: a final norm's gradient on the last stage
 * beside the layers' on every stage) are a bucket of their own: what runs on a stage is one
 * collective of the members placed there. */
static void build_buckets(Build *B, const IrFunc *f) {
  for (const Op *op = f->first; op && !B->failed; op = op->next) {
    if (!op->dev || !op->dev->coll || !op->bucket || op->dev->coll->lead || op->dev->coll->members) continue;
    VEC(const Op *) mem = {0};
    const Op *last = op;
    for (const Op *o = op; o; o = o->next)
      if (o->bucket == op->bucket && o->dev && o->dev->coll && o->dev->runs == op->dev->runs) {
        VEC_PUSH(B->dm->arena, mem, o);
        last = o;
      }
    for (const Op *o = op; o != last; o = o->next)
      for (int i = 0; i < o->next->noperands; i++)
        for (int k = 0; k < mem.len; k++)
          if (o->next->operands[i] == mem.data[k]->results[0]) {
            fail(B, o->next, "it reads a bucket member's result before the bucket's last member (the bucket runs there)");
            return;
          }
    DevColl *lc = last->dev->coll;
    double bytes = 0;
    for (int k = 0; k < mem.len; k++) {
      const Op *o = mem.data[k];
      const DevColl *c = o->dev->coll;
      if (c->kind != lc->kind || c->groups->mask != lc->groups->mask || c->groups->subset || lc->groups->subset ||
          o->operands[0]->type.dtype != last->operands[0]->type.dtype || c->reduce_max != lc->reduce_max) {
        fail(B, o, "a bucket's members differ in kind, axes or dtype");
        return;
      }
      bytes += c->bytes;
      if (o != last) ((DevColl *)c)->lead = last;
    }
    lc->members = mem.data;
    lc->nmembers = mem.len;
    lc->bytes = bytes;
  }
}

static bool build_ring(Build *B, DevOp *o) {
  DevModule *dm = B->dm;
  const Op *op = o->op;
  if (op->ndims < 3 || op->noperands < 3) return fail(B, op, "a ring attention without its dims");
  const Value *k = op->operands[1], *v = op->operands[2];
  int pk = tensor_type_find(&k->type, op->dims[1]);
  if (pk < 0) return fail(B, op, "a ring attention whose key has no key dim");
  DevRing *r = ARENA_NEW(dm->arena, DevRing);
  o->ring = r;
  /* the ring's order is the key dim's tuple's: the rank a block comes from is its storage block */
  r->axes = op->ring;
  r->groups = dev_groups_of_dim(dm, &k->sharding, pk);
  uint16_t want = 0;
  for (int a = 0; a < dm->mesh->naxes; a++)
    if ((op->ring >> a & 1) && dm->mesh->axes[a].size > 1) want |= (uint16_t)(1u << a);
  if (r->groups->mask != want) return fail(B, op, "a ring whose key dim is sharded over other axes than the ring's");
  r->k_bytes = value_bytes(dm, k), r->v_bytes = value_bytes(dm, v);
  CollCost step;
  r->steps = cost_ring(dm->mesh, r->groups->mask, r->k_bytes, r->v_bytes, op->kind == OP_ATTENTION_GRAD, true, &step);
  r->step_bytes = step.bytes_per_device;
  r->carries = op->kind == OP_ATTENTION || op->index == 0;
  r->qorder = dev_dim_order(dm, op->dims[2], -1);
  r->korder = dev_dim_order(dm, op->dims[1], -1);
  return true;
}

static void build_func(Build *B, const IrFunc *f, uint8_t place_all);

static void build_op(Build *B, Op *op, uint8_t place) {
  DevModule *dm = B->dm;
  DevOp *o = ARENA_NEW(dm->arena, DevOp);
  o->op = op;
  o->runs = place;
  op->dev = o;
  for (int r = 0; r < op->nresults; r++) add_value(B, op->results[r], place);
  if (!dm->mesh) return;
  if (op->noffs) {
    o->offs = ARENA_ARRAY(dm->arena, DevOffset, op->noffs);
    for (int i = 0; i < op->noffs; i++) {
      const DimIndex *di = &op->offs[i];
      o->offs[o->noffs++] = (DevOffset){.dim = di->dim, .extent = di->extent, .groups = dev_groups(dm, di->axes, di->naxes)};
    }
  }
  if (ir_op_is_collective(op->kind)) build_coll(B, o);
  if (op->ring && (op->kind == OP_ATTENTION || op->kind == OP_ATTENTION_GRAD)) build_ring(B, o);
}

static void build_func(Build *B, const IrFunc *f, uint8_t place_all) {
  for (int i = 0; i < f->ninputs; i++) add_value(B, f->inputs[i], place_all);
  for (Op *op = f->first; op && !B->failed; op = op->next) {
    uint8_t place = f == B->dm->m->main ? op->place : place_all;
    build_op(B, op, place);
    if (op->kind == OP_LOOP && op->body) build_func(B, op->body, place);
    if (op->kind == OP_PIPELINE && op->pipe) {
      static const uint8_t region_place[PR__COUNT] = {PLACE_FIRST, PLACE_ALL, PLACE_LAST, PLACE_ALL, PLACE_FIRST};
      for (int r = 0; r < PR__COUNT; r++)
        if (op->pipe->region[r]) build_func(B, op->pipe->region[r], region_place[r]);
      /* a pipeline's results: on the stages PipeInfo.result_place names */
      for (int k = 0; op->pipe->result_place && k < op->nresults; k++)
        B->dm->values[op->results[k]->id].place = op->pipe->result_place[k];
    }
  }
  build_buckets(B, f);
}

DevModule *devprog_bare(Arena *a, const IrModule *m, const Mesh *mesh) {
  DevModule *dm = ARENA_NEW(a, DevModule);
  dm->arena = a;
  dm->m = m;
  dm->mesh = mesh;
  dm->ndev = 1;
  for (int x = 0; mesh && x < mesh->naxes; x++) dm->ndev *= mesh->axes[x].size;
  dm->nvalues = m->nvalues;
  dm->values = ARENA_ARRAY(a, DevValue, (size_t)m->nvalues + 1);
  for (int i = 0; i <= m->nvalues; i++) dm->values[i].buffer = -1;
  const PipeInfo *pi = m->pipeline ? m->pipeline->pipe : NULL;
  if (pi && mesh) {
    dm->pipe = ARENA_NEW(a, DevPipe);
    dm->pipe->stages = dev_groups(dm, pi->stage_axes, pi->nstage_axes);
    dm->pipe->split = pi->send_split ? dev_groups_mask(dm, pi->send_split) : NULL;
  }
  return dm;
}

static DevModule *build(Arena *a, IrModule *m, const Mesh *mesh) {
  DevModule *dm = devprog_bare(a, m, mesh);
  Build B = {.dm = dm};
  if (m->main) build_func(&B, m->main, PLACE_ALL);
  return B.failed ? NULL : dm;
}

bool devprog_build(IrModule *m, const Mesh *mesh) {
  if (!m || !m->main) return true;
  m->dev = build(m->arena, m, mesh);
  return m->dev != NULL;
}

/* ---- printing ---- */

void devprog_print_groups(FILE *out, const DevModule *dm) {
  for (int i = 0; i < dm->groups.len; i++) {
    const DevGroups *g = dm->groups.data[i];
    fprintf(out, "groups #%d %s:", g->id, g->text);
    for (int grp = 0; grp < g->ngroups; grp++) {
      fputs(" {", out);
      for (int r = 0; r < g->size; r++) fprintf(out, "%s%d", r ? ", " : "", g->members[grp * g->size + r]);
      fputc('}', out);
    }
    fputc('\n', out);
  }
}

void devprog_print_op(FILE *out, const DevOp *o) {
  if (!o) return;
  int n = 0;
  for (int i = 0; i < o->noffs; i++) {
    const DevOffset *x = &o->offs[i];
    if (!x->groups || x->groups->size <= 1) continue;
    fprintf(out, "%s%s: #%d x%lld", n++ ? ", " : " blocks(", x->dim ? x->dim->name : "?", x->groups->id, (long long)x->extent);
  }
  if (n) fputc(')', out);
  if (o->coll) {
    const DevColl *c = o->coll;
    fprintf(out, " groups #%d %s", c->groups->id, c->groups->text);
    if (c->lead) fprintf(out, " (runs in its bucket's last member)");
    if (c->members) fprintf(out, " (bucket of %d, run here)", c->nmembers);
  }
  if (o->ring)
    fprintf(out, " ring #%d %s, %d steps of %.0f bytes%s", o->ring->groups->id, o->ring->groups->text, o->ring->steps,
            o->ring->step_bytes, o->ring->qorder.kind == RT_ORDER_ZIGZAG ? ", zigzag" : "");
  if (o->cmm)
    fprintf(out, " collective matmul #%d %s, %d steps of %.0f bytes (%s)", o->cmm->groups->id, o->cmm->groups->text,
            o->cmm->steps, o->cmm->step_bytes,
            o->cmm->scatter ? (o->cmm->coll == o->op ? "made by its contraction's reduce-scatter ring" : "runs the reduce-scatter ring")
            : o->cmm->coll == o->op ? "runs in its contraction" : "runs the ring");
}

static void print_hook(FILE *out, const Op *op) { devprog_print_op(out, op->dev); }

void devprog_print(FILE *out, const IrModule *m) {
  const DevModule *dm = m ? m->dev : NULL;
  if (!dm) {
    ir_print(out, m);
    return;
  }
  ir_print_with(out, m, print_hook);
  fprintf(out, "device program: %d device%s", dm->ndev, dm->ndev == 1 ? "" : "s");
  if (dm->pipe) fprintf(out, ", stages #%d %s", dm->pipe->stages->id, dm->pipe->stages->text);
  if (dm->pipe && dm->pipe->split) fprintf(out, ", send split #%d %s", dm->pipe->split->id, dm->pipe->split->text);
  fputc('\n', out);
  devprog_print_groups(out, dm);
}
