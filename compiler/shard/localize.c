/* localize.c: the partitioned IR as the program each device runs (see localize.h).
 *
 * Conventions (the interpreter's block layout, docs/interpreter.md): a dim sharded over the axis
 * tuple (a1, ..., ak) is cut into prod(size(ai)) equal blocks; a device holds block number
 * = its coordinates on a1..ak read as a mixed-radix number, a1 most significant. Axes of size 1
 * change nothing and are left out of every fact this pass writes.
 *
 * Per op, in program order:
 *   1. operands: each is brought to the block the op computes with: its Op.in_shard, then, on
 *      every dim the result keeps, the result's tuple where it extends the operand's (the op
 *      computes its own block directly). A change is an OP_SLICE before the op.
 *   2. the result: what the op computes from those operands (each result dim's tuple from the
 *      operand dim it comes from; a split or merge: plan_reshape; the dims an op adds -- a
 *      broadcast's, onehot's class dim, take_grad's rows -- are made as the result holds them);
 *      where the result is sharded finer, an OP_SLICE after the op takes over its uses.
 *   3. offsets, divisors and the collectives' CollSpecs; local extents for every value. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "localize.h"
#include "partition.h"

typedef struct SliceMade {
  const Value *from;
  Sharding to;
  Value *slice;
} SliceMade;

typedef struct Loc {
  IrModule *m;
  const Program *p;
  const Mesh *mesh;
  bool failed;
  VEC(SliceMade) made;  /* the slices of the function being walked, each made once: a later op
                           that needs the same block of the same value reads the same slice */
} Loc;

/* ---- tuples ---- */

/* The axes of dim d in s that have more than one device, in tuple order. */
static int real_tuple(const Mesh *mesh, const Sharding *s, int d, int8_t *out) {
  int n = 0;
  for (int k = 0; k < s->naxes[d] && k < MAX_AXES_PER_DIM; k++) {
    int a = s->axes[d][k];
    if (mesh && a >= 0 && a < mesh->naxes && mesh->axes[a].size > 1) out[n++] = (int8_t)a;
  }
  return n;
}

static bool same_tuple(const int8_t *a, int na, const int8_t *b, int nb) {
  return na == nb && memcmp(a, b, (size_t)na) == 0;
}

/* a is a prefix of b */
static bool prefix_of(const int8_t *a, int na, const int8_t *b, int nb) {
  return na <= nb && memcmp(a, b, (size_t)na) == 0;
}

static bool same_blocks(const Mesh *mesh, const Sharding *a, const Sharding *b, int rank) {
  for (int d = 0; d < rank; d++) {
    int8_t x[MAX_AXES_PER_DIM], y[MAX_AXES_PER_DIM];
    int nx = real_tuple(mesh, a, d, x), ny = real_tuple(mesh, b, d, y);
    if (!same_tuple(x, nx, y, ny)) return false;
  }
  return true;
}

int64_t localize_extent(const Mesh *mesh, const TensorType *t, const Sharding *s, int pos) {
  int64_t size = t->dims[pos] ? t->dims[pos]->size : 1, n = 1;
  int8_t ax[MAX_AXES_PER_DIM];
  int k = real_tuple(mesh, s, pos, ax);
  for (int i = 0; i < k; i++) n *= mesh->axes[ax[i]].size;
  return n > 0 ? size / n : size;
}

static void set_local(const Loc *L, Value *v) {
  for (int i = 0; i < v->type.rank; i++) v->local[i] = localize_extent(L->mesh, &v->type, &v->sharding, i);
}

static DimIndex dim_index_of(const Loc *L, const Value *v, int pos) {
  DimIndex x = {.dim = v->type.dims[pos]};
  x.naxes = (uint8_t)real_tuple(L->mesh, &v->sharding, pos, x.axes);
  x.extent = localize_extent(L->mesh, &v->type, &v->sharding, pos);
  return x;
}

static bool fail(Loc *L, const Op *op, const char *what) {
  char buf[512];
  diag_error(op->loc, "internal error: localising the %s: %s", ir_op_name(op->kind), what);
  (void)buf;
  if (getenv("SHARDC_LOCALIZE_DEBUG")) ir_print(stderr, L->m);
  L->failed = true;
  return false;
}

/* ---- slices ---- */

/* OP_SLICE of x to sharding `to` (which refines x's sharding dim by dim), not yet in any list. */
static Op *slice_new(Loc *L, IrFunc *f, const Op *at, Value *x, const Sharding *to) {
  Op *s = ir_op_new(L->m, f, OP_SLICE, at->loc, &x, 1, &x->type, 1);
  s->phase = at->phase;
  Value *r = s->results[0];
  r->sharding = *to;
  r->partial_max = x->partial_max;
  r->shard_source = SHARD_PROPAGATED;
  memcpy(r->dim_src, x->dim_src, sizeof r->dim_src);
  memcpy(r->dim_loc, x->dim_loc, sizeof r->dim_loc);
  set_local(L, r);
  s->offs = ARENA_ARRAY(L->m->arena, DimIndex, x->type.rank + 1);
  for (int d = 0; d < x->type.rank; d++) {
    int8_t a[MAX_AXES_PER_DIM], b[MAX_AXES_PER_DIM];
    int na = real_tuple(L->mesh, &x->sharding, d, a), nb = real_tuple(L->mesh, to, d, b);
    if (same_tuple(a, na, b, nb)) continue;
    DimIndex *di = &s->offs[s->noffs++];
    di->dim = x->type.dims[d];
    di->naxes = (uint8_t)(nb - na);
    memcpy(di->axes, b + na, (size_t)(nb - na));
    di->extent = r->local[d];
  }
  return s;
}

/* The operand dim that result dim `rd` of op comes from (by name; a rename maps its pairs). */
static int operand_dim(const Op *op, const Value *x, const Dim *rd) {
  if (op->kind == OP_RENAME)
    for (int j = 0; j + 1 < op->ndims; j += 2)
      if (op->dims[j + 1] == rd) return tensor_type_find(&x->type, op->dims[j]);
  int p = tensor_type_find(&x->type, rd);
  if (p >= 0 && op->kind == OP_RENAME)
    for (int j = 0; j + 1 < op->ndims; j += 2)
      if (op->dims[j] == rd) return -1; /* renamed away: not the result's dim of that name */
  return p;
}

/* Ops whose result dims all come from their operands by name (the rest make dims of their own or
 * reshape them). */
static bool by_name(OpKind k) {
  return k != OP_SPLIT && k != OP_MERGE && k != OP_CONST && k != OP_INPUT && k != OP_PARAM && k != OP_LOOP &&
         k != OP_BROADCAST && k != OP_ONEHOT && k != OP_TAKE_GRAD;
}

/* The dims op computes over whole (a softmax's or a norm's dim, attention's head and key dims):
 * an operand is never sliced on them; a result sharded on one is computed whole, then sliced. */
static bool needs_whole(const Op *op, const Dim *d) {
  switch (op->kind) { /* kept: which of its dims an op reads whole is its own */
  case OP_SOFTMAX: case OP_RMSNORM: case OP_LAYERNORM: case OP_SOFTMAX_GRAD: case OP_RMSNORM_GRAD:
  case OP_LAYERNORM_GRAD: case OP_CROSS_ENTROPY: case OP_CROSS_ENTROPY_GRAD: case OP_MAX_GRAD: case OP_PICK:
    for (int k = 0; k < op->ndims; k++)
      if (op->dims[k] == d) return true;
    return false;
  case OP_ATTENTION: case OP_ATTENTION_GRAD: /* (a ring's key dim is its own block: the ring brings the others) */
    return op->ndims >= 2 && (op->dims[0] == d || (op->dims[1] == d && !op->ring));
  case OP_ROUTE: /* top-k along the experts, slots in order of the tokens */
    return op->ndims >= 3 && (op->dims[0] == d || op->dims[1] == d || op->dims[2] == d);
  default: return false;
  }
}

/* 1. Each operand brought to the block the op computes with (see the file comment). */
static void localize_operands(Loc *L, IrFunc *f, Op *op) {
  const Value *r = op->nresults == 1 ? op->results[0] : NULL;
  for (int i = 0; i < op->noperands; i++) {
    Value *x = op->operands[i];
    Sharding t = op->in_shard ? op->in_shard[i] : x->sharding;
    t.partial = x->sharding.partial;
    if (r && by_name(op->kind)) {
      for (int e = 0; e < r->type.rank; e++) {
        int d = operand_dim(op, x, r->type.dims[e]);
        if (d < 0 || needs_whole(op, x->type.dims[d])) continue;
        int8_t a[MAX_AXES_PER_DIM], b[MAX_AXES_PER_DIM];
        int na = real_tuple(L->mesh, &t, d, a), nb = real_tuple(L->mesh, &r->sharding, e, b);
        if (na >= nb || !prefix_of(a, na, b, nb)) continue;
        /* an axis the operand uses on another dim cannot shard this one too */
        uint16_t used = 0;
        for (int j = 0; j < x->type.rank; j++)
          if (j != d)
            for (int k = 0; k < t.naxes[j]; k++) used |= (uint16_t)(1u << t.axes[j][k]);
        bool clash = false;
        for (int k = na; k < nb; k++) clash |= (used >> b[k]) & 1;
        if (clash) continue;
        t.naxes[d] = (uint8_t)nb;
        memcpy(t.axes[d], b, (size_t)nb);
      }
    }
    if (same_blocks(L->mesh, &t, &x->sharding, x->type.rank)) continue;
    /* the slice must refine x: every dim's tuple extends x's */
    for (int d = 0; d < x->type.rank; d++) {
      int8_t a[MAX_AXES_PER_DIM], b[MAX_AXES_PER_DIM];
      int na = real_tuple(L->mesh, &x->sharding, d, a), nb = real_tuple(L->mesh, &t, d, b);
      if (!prefix_of(a, na, b, nb)) {
        fail(L, op, "an operand would be read in a block it does not hold (a gather is missing)");
        return;
      }
    }
    Value *sv = NULL;
    for (int k = 0; k < L->made.len && !sv; k++)
      if (L->made.data[k].from == x && same_blocks(L->mesh, &L->made.data[k].to, &t, x->type.rank))
        sv = L->made.data[k].slice;
    if (!sv) {
      Op *s = slice_new(L, f, op, x, &t);
      ir_insert_before(f, op, s);
      sv = s->results[0];
      VEC_PUSH(L->m->arena, L->made, ((SliceMade){x, t, sv}));
    }
    op->operands[i] = sv;
  }
  op->in_shard = NULL;
}

/* 2. What op computes from its (localised) operands, as a sharding of its result. */
static bool natural_result(Loc *L, const Op *op, Sharding *out) {
  const Value *r = op->results[0];
  *out = r->sharding;
  if (op->kind == OP_SPLIT || op->kind == OP_MERGE) {
    int bad = -1;
    Sharding in = op->operands[0]->sharding;
    if (!plan_reshape(L->mesh, op, &in, out, &bad)) return fail(L, op, "the reshape cannot keep its operand's sharding");
    out->partial = r->sharding.partial;
    return true;
  }
  if (!by_name(op->kind)) return true; /* makes its own dims as the result holds them */
  for (int e = 0; e < r->type.rank; e++) {
    bool found = false;
    for (int i = 0; i < op->noperands && !found; i++) {
      const Value *x = op->operands[i];
      int d = operand_dim(op, x, r->type.dims[e]);
      if (d < 0) continue;
      found = true;
      out->naxes[e] = x->sharding.naxes[d];
      memcpy(out->axes[e], x->sharding.axes[d], sizeof out->axes[e]);
    }
    if (!found && op->kind == OP_ROUTE && op->ndims >= 3 && r->type.dims[e] == op->dims[2]) {
      out->naxes[e] = 0; /* route's slot dim: made whole */
      continue;
    }
    if (!found) return fail(L, op, "a result dim comes from no operand");
  }
  return true;
}

static void localize_result(Loc *L, IrFunc *f, Op *op) {
  if (op->nresults != 1 || op->kind == OP_INPUT || op->kind == OP_PARAM || op->kind == OP_CONST) return;
  Value *r = op->results[0];
  Sharding nat;
  if (!natural_result(L, op, &nat)) return;
  if (same_blocks(L->mesh, &nat, &r->sharding, r->type.rank)) return;
  for (int d = 0; d < r->type.rank; d++) {
    int8_t a[MAX_AXES_PER_DIM], b[MAX_AXES_PER_DIM];
    int na = real_tuple(L->mesh, &nat, d, a), nb = real_tuple(L->mesh, &r->sharding, d, b);
    if (!prefix_of(a, na, b, nb)) {
      fail(L, op, "the result is held in a block the op does not compute (a gather is missing)");
      return;
    }
  }
  /* the op computes `nat`; a slice after it gives the result its sharding and identity */
  Sharding want = r->sharding;
  r->sharding = nat;
  Op *s = slice_new(L, f, op, r, &want);
  Value *sv = s->results[0];
  ir_replace_uses(f, r, sv);
  ir_insert_before(f, op->next, s);
  sv->name = r->name;
  sv->spec = r->spec;
  sv->saved = r->saved;
  sv->saved_attention = r->saved_attention;
  sv->shard_source = r->shard_source;
  sv->shard_loc = r->shard_loc;
  r->saved = false;
  r->saved_attention = NULL;
  r->spec = NULL;
}

/* ---- 3. offsets, divisors, collectives ---- */

static void add_off(Loc *L, Op *op, DimIndex x, int cap) {
  if (x.naxes == 0) return; /* a dim held whole starts at 0 */
  if (!op->offs) op->offs = ARENA_ARRAY(L->m->arena, DimIndex, cap);
  if (op->noffs < cap) op->offs[op->noffs++] = x;
}

static void add_off_of(Loc *L, Op *op, const Value *v, const Dim *d, int cap) {
  int p = tensor_type_find(&v->type, d);
  if (p >= 0) add_off(L, op, dim_index_of(L, v, p), cap);
}

static void coll_part(Loc *L, CollSpec *c, int dim, const int8_t *axes, int n);

static void localize_facts(Loc *L, Op *op) {
  switch (op->kind) { /* kept: which global indices an op reads differs op by op */
  case OP_CAUSAL: case OP_CAUSAL_GRAD: /* dims[0] the query dim, dims[1] the key dim */
    if (op->ndims >= 2) {
      add_off_of(L, op, op->operands[0], op->dims[0], 2);
      add_off_of(L, op, op->operands[0], op->dims[1], 2);
    }
    break;
  case OP_ATTENTION: case OP_ATTENTION_GRAD: /* dims[2] query (in q), dims[1] key (in k) */
    if (op->flag && op->ndims >= 3 && op->noperands >= 2) {
      add_off_of(L, op, op->operands[0], op->dims[2], 2);
      add_off_of(L, op, op->operands[1], op->dims[1], 2);
    }
    /* a ring's group and order are the device program's (devprog.h: DevRing, the key dim's tuple) */
    break;
  case OP_TAKE:
    if (op->operands[0]->type.rank > 0) add_off(L, op, dim_index_of(L, op->operands[0], 0), 1);
    break;
  case OP_TAKE_GRAD:
    if (op->results[0]->type.rank > 0) add_off(L, op, dim_index_of(L, op->results[0], 0), 1);
    break;
  case OP_PICK:
    if (op->ndims > 0) add_off_of(L, op, op->operands[0], op->dims[0], 1);
    break;
  case OP_ONEHOT:
    if (op->ndims > 0) add_off_of(L, op, op->results[0], op->dims[0], 1);
    break;
  case OP_DROPOUT: /* every dim: the mask is a function of the global index */
    for (int k = 0; k < op->ndims; k++) add_off_of(L, op, op->operands[0], op->dims[k], op->ndims);
    break;
  case OP_BROADCAST: /* the added dims, made as the result holds them */
    for (int k = 0; k < op->ndims; k++) add_off_of(L, op, op->results[0], op->dims[k], op->ndims);
    break;
  case OP_MEAN: {
    double n = 1;
    for (int k = 0; k < op->ndims; k++) n *= (double)op->dims[k]->size;
    op->divisor = n;
    break;
  }
  default: break;
  }
}

static void coll_part(Loc *L, CollSpec *c, int dim, const int8_t *axes, int n) {
  if (n <= 0 || c->nparts >= MAX_RANK) return;
  CollDim *p = &c->parts[c->nparts++];
  p->dim = (int8_t)dim;
  p->naxes = (uint8_t)n;
  memcpy(p->axes, axes, (size_t)n);
}

static uint16_t real_mask(const Mesh *mesh, uint16_t m) {
  uint16_t r = 0;
  for (int a = 0; a < mesh->naxes; a++)
    if ((m >> a & 1) && mesh->axes[a].size > 1) r |= (uint16_t)(1u << a);
  return r;
}

static void localize_collective(Loc *L, Op *op) {
  const Value *x = op->operands[0], *r = op->results[0];
  CollSpec *c = ARENA_NEW(L->m->arena, CollSpec);
  op->coll = c;
  int rank = x->type.rank;
  uint16_t moved = 0;
  int8_t a[MAX_AXES_PER_DIM], b[MAX_AXES_PER_DIM];
  switch (op->kind) { /* kept: each collective's parts its own */
  case OP_ALL_GATHER:
    for (int d = 0; d < rank; d++) {
      int na = real_tuple(L->mesh, &x->sharding, d, a), nb = real_tuple(L->mesh, &r->sharding, d, b);
      if (!prefix_of(b, nb, a, na)) {
        fail(L, op, "an all_gather whose result does not keep a prefix of a dim's axes");
        return;
      }
      coll_part(L, c, d, a + nb, na - nb);
      for (int k = nb; k < na; k++) moved |= (uint16_t)(1u << a[k]);
    }
    break;
  case OP_REDUCE_SCATTER:
    for (int d = 0; d < rank; d++) {
      int na = real_tuple(L->mesh, &x->sharding, d, a), nb = real_tuple(L->mesh, &r->sharding, d, b);
      if (!prefix_of(a, na, b, nb)) {
        fail(L, op, "a reduce_scatter whose result does not extend a dim's axes");
        return;
      }
      coll_part(L, c, d, b + na, nb - na);
      for (int k = na; k < nb; k++) moved |= (uint16_t)(1u << b[k]);
    }
    break;
  case OP_ALL_REDUCE:
    if (!same_blocks(L->mesh, &x->sharding, &r->sharding, rank)) {
      fail(L, op, "an all_reduce that changes blocks");
      return;
    }
    moved = real_mask(L->mesh, op->axes);
    break;
  case OP_ALL_TO_ALL: {
    int gain = -1, lose = -1;
    for (int d = 0; d < rank; d++) {
      int na = real_tuple(L->mesh, &x->sharding, d, a), nb = real_tuple(L->mesh, &r->sharding, d, b);
      if (same_tuple(a, na, b, nb)) continue;
      if (na < nb && prefix_of(a, na, b, nb) && gain < 0) gain = d;
      else if (nb < na && prefix_of(b, nb, a, na) && lose < 0) lose = d;
      else {
        fail(L, op, "an all_to_all that is not one dim's minor axes moving to another");
        return;
      }
    }
    if (gain < 0 || lose < 0) {
      if (gain < 0 && lose < 0) break; /* size-1 axes only: nothing moves */
      fail(L, op, "an all_to_all without a source and a destination dim");
      return;
    }
    int na = real_tuple(L->mesh, &x->sharding, gain, a), nb = real_tuple(L->mesh, &r->sharding, gain, b);
    coll_part(L, c, gain, b + na, nb - na);
    int nl = real_tuple(L->mesh, &x->sharding, lose, a), nr = real_tuple(L->mesh, &r->sharding, lose, b);
    coll_part(L, c, lose, a + nr, nl - nr);
    if (c->nparts == 2 && !same_tuple(c->parts[0].axes, c->parts[0].naxes, c->parts[1].axes, c->parts[1].naxes)) {
      fail(L, op, "an all_to_all whose axes leave one dim in another order than they join the other");
      return;
    }
    for (int k = 0; c->nparts && k < c->parts[0].naxes; k++) moved |= (uint16_t)(1u << c->parts[0].axes[k]);
    break;
  }
  case OP_PERMUTE: {
    int n = 0;
    for (int ax = 0; ax < L->mesh->naxes; ax++)
      if ((op->axes >> ax & 1) && L->mesh->axes[ax].size > 1) a[n++] = (int8_t)ax;
    coll_part(L, c, -1, a, n);
    c->shift = 1;
    if (!same_blocks(L->mesh, &x->sharding, &r->sharding, rank)) fail(L, op, "a permute that changes blocks");
    return;
  }
  default: return;
  }
  if (moved != real_mask(L->mesh, op->axes)) fail(L, op, "its axes are not the axes its shardings move");
}

/* ---- loops: a body's inputs and outputs hold one sharding for every iteration ----
 *
 * Partitioning reshards a loop's operands to its body's inputs, and the body's outputs to what the
 * next iteration (or the stacked result) holds, with collectives; where only a local slice is left
 * (a replicated initial accumulator the body holds sharded), no op consumes an Op.in_shard for it,
 * so the slice is made here: otherwise the lowering copies a whole operand into a block-sized
 * loop buffer (issue 18's heap overflows under `microbatches`). */

/* v brought to the blocks `want` describes (which refines v's sharding): an OP_SLICE before `pos`,
 * or at the end of f when pos is NULL; v itself where the blocks are the same. */
static Value *refined(Loc *L, IrFunc *f, Op *pos, const Op *at, Value *v, const Sharding *want, const char *role, int index) {
  Sharding t = *want;
  t.partial = v->sharding.partial;
  if (same_blocks(L->mesh, &t, &v->sharding, v->type.rank)) return v;
  for (int d = 0; d < v->type.rank; d++) {
    int8_t a[MAX_AXES_PER_DIM], b[MAX_AXES_PER_DIM];
    int na = real_tuple(L->mesh, &v->sharding, d, a), nb = real_tuple(L->mesh, &t, d, b);
    if (!prefix_of(a, na, b, nb)) {
      char what[256];
      snprintf(what, sizeof what, "the loop's %s %d (%%%d%s%s) would be read in a block it does not hold along %s (a gather is missing)",
               role, index, v->id, v->name ? ", " : "", v->name ? v->name : "", v->type.dims[d]->name);
      fail(L, at, what);
      return v;
    }
  }
  Op *s = slice_new(L, f, at, v, &t);
  if (pos) ir_insert_before(f, pos, s);
  else ir_append(f, s);
  return s->results[0];
}

/* A stacked value's sharding with its rows' (`row`, without the stacking dim) on dims 1.. */
static Sharding stacked_as(const Value *stacked, const Value *row) {
  Sharding s = stacked->sharding;
  for (int d = 1; d < stacked->type.rank && d - 1 < row->type.rank; d++) {
    s.naxes[d] = row->sharding.naxes[d - 1];
    memcpy(s.axes[d], row->sharding.axes[d - 1], sizeof s.axes[d]);
  }
  return s;
}

static void localize_loop_operands(Loc *L, IrFunc *f, Op *op) {
  IrFunc *b = op->body;
  for (int i = 0; i < op->noperands && i < b->ninputs; i++) {
    Value *x = op->operands[i], *in = b->inputs[i];
    bool sliced = i < op->nslices; /* a stacked operand: the body reads one row */
    if (sliced && in->type.rank != x->type.rank - 1) continue;
    Sharding want = sliced ? stacked_as(x, in) : in->sharding;
    op->operands[i] = refined(L, f, op, op, x, &want, "operand", i);
  }
}

static void localize_loop_outputs(Loc *L, Op *op) {
  IrFunc *b = op->body;
  for (int r = 0; r < op->ncarried && r < b->noutputs && op->nslices + r < b->ninputs; r++)
    b->outputs[r] = refined(L, b, NULL, op, b->outputs[r], &b->inputs[op->nslices + r]->sharding, "carried output", r);
  for (int r = op->ncarried; r < op->nresults && r < b->noutputs; r++) { /* a stacked result's rows */
    Value *res = op->results[r], *out = b->outputs[r];
    if (out->type.rank != res->type.rank - 1) continue;
    Sharding want = out->sharding;
    for (int d = 0; d < out->type.rank; d++) {
      want.naxes[d] = res->sharding.naxes[d + 1];
      memcpy(want.axes[d], res->sharding.axes[d + 1], sizeof want.axes[d]);
    }
    b->outputs[r] = refined(L, b, NULL, op, out, &want, "stacked output", r);
  }
}

/* ---- the walk ---- */

static void localize_func(Loc *L, IrFunc *f) {
  for (int i = 0; i < f->ninputs; i++) set_local(L, f->inputs[i]);
  Op *next;
  for (Op *op = f->first; op && !L->failed; op = next) {
    next = op->next;
    if (op->kind == OP_LOOP) {
      int outer = L->made.len; /* a body's slices are its own: regions are isolated */
      if (op->body) {
        localize_loop_operands(L, f, op);
        localize_func(L, op->body);
        if (!L->failed) localize_loop_outputs(L, op);
      }
      L->made.len = outer;
    } else if (ir_op_is_collective(op->kind)) {
      localize_collective(L, op);
    } else if (op->kind != OP_INPUT && op->kind != OP_PARAM && op->kind != OP_SLICE) {
      localize_operands(L, f, op);
      localize_result(L, f, op);
      localize_facts(L, op);
    }
    for (int r = 0; r < op->nresults; r++) set_local(L, op->results[r]);
  }
}

bool localize_module(IrModule *m, const Program *p) {
  if (!m || !m->main || m->localized) return true;
  Loc L = {.m = m, .p = p, .mesh = p ? p->mesh : NULL};
  if (!L.mesh) return true;
  localize_func(&L, m->main);
  m->localized = !L.failed;
  return !L.failed;
}

/* ---- the test's count ---- */

static int implicit_in(const IrFunc *f) {
  int n = 0;
  for (const Op *op = f->first; op; op = op->next) {
    n += op->in_shard != NULL;
    n += ir_op_is_collective(op->kind) && !op->coll;
    n += op->kind == OP_MEAN && op->divisor <= 0;
    for (int r = 0; r < op->nresults; r++)
      for (int d = 0; d < op->results[r]->type.rank; d++) n += op->results[r]->local[d] <= 0;
    if (op->kind == OP_LOOP && op->body) n += implicit_in(op->body);
  }
  return n;
}

int localize_count_implicit(const IrModule *m) { return m && m->main ? implicit_in(m->main) : 0; }
