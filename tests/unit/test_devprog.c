/* test_devprog.c: the device program (shard/devprog.h) against the test's own brute force, over
 * every sample, explain test program and sharded-step program under each of their meshes and
 * layouts (the whole pass pipeline: pipeline_run):
 *   - every replica group: each device in exactly one group (a subset: at most one), listed at its
 *     rank, its rank the mixed-radix reading of its coordinates on the tuple (the test computes
 *     coordinates by dividing the device index, last axis fastest), the members of a group equal
 *     off the tuple;
 *   - every value's blocks: per dim the groups are the sharding's tuple (axes of one device left
 *     out), the local extent times the groups' size is the dim, and each device's block start
 *     (dev_block_start) is the local extent times that mixed-radix number;
 *   - every collective's groups: an all-gather's or reduce-scatter's the parts' axes in part order;
 *     a bucket's members name their lead, which lists them, on the same stages;
 *   - every ring's groups: the key dim's tuple, in its order (issue 18: not the mesh's);
 *   - the stage predicate and the block placement's descriptions (devprog_place): who holds each
 *     input and param, and that the copies read back are one per block (every summand of a partial
 *     sum).
 * Up to 256 devices are checked exhaustively; beyond, every 61st device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devprog.h"
#include "diag.h"
#include "parse.h"
#include "pipeline.h"
#include "step.h"
#include "unit_pipeline.h"
#include "unit_test.h"

static int npass, nfail, nskip;
static char notes[4096];
static size_t nnotes;

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...) {
  if (nnotes + 200 >= sizeof notes) return;
  va_list ap;
  va_start(ap, fmt);
  nnotes += (size_t)vsnprintf(notes + nnotes, sizeof notes - nnotes, fmt, ap);
  va_end(ap);
  nnotes += (size_t)snprintf(notes + nnotes, sizeof notes - nnotes, "\n");
}

/* ---- the test's own arithmetic ---- */

static int coord(const Mesh *m, int64_t dev, int axis) {
  int64_t d = dev;
  for (int a = m->naxes - 1; a > axis; a--) d /= m->axes[a].size;
  return (int)(d % m->axes[axis].size);
}

static int64_t radix(const Mesh *m, int64_t dev, const int8_t *axes, int n) {
  int64_t r = 0;
  for (int k = 0; k < n; k++) r = r * m->axes[axes[k]].size + coord(m, dev, axes[k]);
  return r;
}

static int real_tuple(const Mesh *m, const int8_t *axes, int n, int8_t *out) {
  int k = 0;
  for (int i = 0; i < n; i++)
    if (m->axes[axes[i]].size > 1) out[k++] = axes[i];
  return k;
}

static bool sampled(const DevModule *dm, int64_t d) { return dm->ndev <= 256 || d % 61 == 0 || d == dm->ndev - 1; }

/* ---- checks ---- */

static bool check_groups(const DevModule *dm) {
  const Mesh *m = dm->mesh;
  bool ok = true;
  for (int i = 0; i < dm->groups.len && ok; i++) {
    const DevGroups *g = dm->groups.data[i];
    int64_t size = 1;
    for (int k = 0; k < g->naxes; k++) size *= m->axes[g->axes[k]].size;
    if (!g->subset && (g->size != size || (int64_t)g->ngroups * g->size != dm->ndev))
      ok = false, note("groups %s: %d groups of %d on %d devices", g->text, g->ngroups, g->size, dm->ndev);
    char *seen = calloc((size_t)dm->ndev, 1);
    for (int64_t x = 0; ok && x < (int64_t)g->ngroups * g->size; x++) {
      int d = g->members[x];
      if (d < 0 || d >= dm->ndev || seen[d]++) ok = false, note("groups %s: device %d listed twice or out of range", g->text, d);
    }
    for (int64_t d = 0; ok && d < dm->ndev; d++) {
      if (!g->subset && !seen[d]) ok = false, note("groups %s: device %lld in no group", g->text, (long long)d);
      if (!sampled(dm, d) || g->group_of[d] < 0) continue;
      int grp = g->group_of[d], r = g->rank_of[d];
      if (g->members[(int64_t)grp * g->size + r] != d) ok = false, note("groups %s: device %lld not at its rank", g->text, (long long)d);
      if (!g->subset && r != radix(m, d, g->axes, g->naxes))
        ok = false, note("groups %s: device %lld has rank %d, its coordinates read %lld", g->text, (long long)d, r,
                         (long long)radix(m, d, g->axes, g->naxes));
      int first = g->members[(int64_t)grp * g->size];
      for (int a = 0; a < m->naxes && ok; a++) {
        bool on = false;
        for (int k = 0; k < g->naxes; k++) on |= g->axes[k] == a;
        if (!on && coord(m, d, a) != coord(m, first, a))
          ok = false, note("groups %s: device %lld and %d differ on %s", g->text, (long long)d, first, m->axes[a].name);
      }
    }
    free(seen);
  }
  return ok;
}

static bool check_value(const DevModule *dm, const Value *v) {
  const Mesh *m = dm->mesh;
  const DevValue *x = dev_value(dm, v);
  if (x->v != v) {
    note("value %%%d has no DevValue", v->id);
    return false;
  }
  for (int d = 0; d < v->type.rank; d++) {
    int8_t t[MAX_MESH_AXES];
    int n = real_tuple(m, v->sharding.axes[d], v->sharding.naxes[d], t);
    const DevGroups *g = x->groups[d];
    int gn = g ? g->naxes : 0;
    if (gn != n || (n && memcmp(g->axes, t, (size_t)n))) {
      note("value %%%d dim %d: groups %s, sharding's tuple has %d axes", v->id, d, g ? g->text : "none", n);
      return false;
    }
    int64_t size = 1;
    for (int k = 0; k < n; k++) size *= m->axes[t[k]].size;
    if (x->local[d] * size != v->type.dims[d]->size) {
      note("value %%%d dim %d: %lld x %lld != %lld", v->id, d, (long long)x->local[d], (long long)size, (long long)v->type.dims[d]->size);
      return false;
    }
    for (int64_t dev = 0; dev < dm->ndev; dev++)
      if (sampled(dm, dev) && dev_block_start(g, dev, x->local[d]) != x->local[d] * radix(m, dev, t, n)) {
        note("value %%%d dim %d device %lld: block start %lld, want %lld", v->id, d, (long long)dev,
             (long long)dev_block_start(g, dev, x->local[d]), (long long)(x->local[d] * radix(m, dev, t, n)));
        return false;
      }
  }
  return true;
}

static bool same_axes(const DevGroups *g, const int8_t *a, int n) { return g->naxes == n && memcmp(g->axes, a, (size_t)n) == 0; }

static bool check_op(const DevModule *dm, const Op *op) {
  const Mesh *m = dm->mesh;
  const DevOp *o = op->dev;
  if (!o || o->op != op) {
    note("op %s at line %d has no DevOp", ir_op_name(op->kind), op->loc.line);
    return false;
  }
  const DevColl *c = o->coll;
  if (ir_op_is_collective(op->kind) && !c) return note("a collective at line %d has no DevColl", op->loc.line), false;
  if (c && op->coll && (op->kind == OP_ALL_GATHER || op->kind == OP_REDUCE_SCATTER) && !c->groups->subset) {
    int8_t all[MAX_MESH_AXES];
    int n = 0;
    for (int p = 0; p < op->coll->nparts; p++)
      n += real_tuple(m, op->coll->parts[p].axes, op->coll->parts[p].naxes, all + n);
    if (!same_axes(c->groups, all, n)) return note("%s at line %d: groups %s, parts in another order", ir_op_name(op->kind), op->loc.line, c->groups->text), false;
  }
  if (c && c->lead) {
    const DevColl *l = c->lead->dev->coll;
    bool listed = false;
    for (int i = 0; l->members && i < l->nmembers; i++) listed |= l->members[i] == op;
    if (!listed || c->lead->dev->runs != o->runs) return note("a bucket member at line %d is not its lead's", op->loc.line), false;
  }
  if (o->ring) {
    const Value *k = op->operands[1];
    int pk = tensor_type_find(&k->type, op->dims[1]);
    int8_t t[MAX_MESH_AXES];
    int n = real_tuple(m, k->sharding.axes[pk], k->sharding.naxes[pk], t);
    if (!same_axes(o->ring->groups, t, n)) return note("a ring at line %d runs over %s, not its key dim's tuple", op->loc.line, o->ring->groups->text), false;
    if (o->ring->steps != o->ring->groups->size - 1) return note("a ring at line %d: %d steps", op->loc.line, o->ring->steps), false;
  }
  /* the accessors consumers read (devprog.h) state what localisation and the pipeline split decided:
   * the stages (Op.place, main's ops), the ring (Op.ring), a subset collective's devices
   * (CollSpec.ngroup), a pipeline permute's period (Op.coll_period), the offsets (Op.offs) */
  if (op->func == dm->m->main && dev_op_runs(op) != op->place)
    return note("%s at line %d: runs %d, placed %d", ir_op_name(op->kind), op->loc.line, dev_op_runs(op), op->place), false;
  bool ring = op->ring && (op->kind == OP_ATTENTION || op->kind == OP_ATTENTION_GRAD);
  if (!dev_op_ring(op) != !ring || (ring && dev_op_ring(op)->axes != op->ring))
    return note("%s at line %d: the device program's ring disagrees with Op.ring %#x", ir_op_name(op->kind), op->loc.line, op->ring), false;
  if (ir_op_is_collective(op->kind) && (dev_op_subset(op) != (op->coll ? op->coll->ngroup : 0) || dev_op_period(op) != op->coll_period))
    return note("%s at line %d: subset %d / period %lld, the pass said %d / %lld", ir_op_name(op->kind), op->loc.line, dev_op_subset(op),
                (long long)dev_op_period(op), op->coll ? op->coll->ngroup : 0, (long long)op->coll_period), false;
  if (dev_op_noffs(op) != op->noffs) return note("%s at line %d: %d offsets, the pass said %d", ir_op_name(op->kind), op->loc.line, dev_op_noffs(op), op->noffs), false;
  for (int i = 0; i < op->noffs; i++)
    if (o->offs[i].dim != op->offs[i].dim || o->offs[i].extent != op->offs[i].extent)
      return note("%s at line %d: offset %d disagrees with Op.offs", ir_op_name(op->kind), op->loc.line, i), false;
  return true;
}

static bool check_func(const DevModule *dm, const IrFunc *f) {
  bool ok = true;
  for (int i = 0; i < f->ninputs && ok; i++) ok = check_value(dm, f->inputs[i]);
  for (const Op *op = f->first; op && ok; op = op->next) {
    ok = check_op(dm, op);
    for (int r = 0; r < op->nresults && ok; r++) ok = check_value(dm, op->results[r]);
    if (ok && op->kind == OP_LOOP && op->body) ok = check_func(dm, op->body);
    for (int r = 0; ok && op->kind == OP_PIPELINE && op->pipe && r < PR__COUNT; r++)
      if (op->pipe->region[r]) ok = check_func(dm, op->pipe->region[r]);
  }
  return ok;
}

/* Who holds main's inputs and params, and the copies read back: one per block position, and
 * per summand of a partial sum. */
static bool check_places(DevModule *dm, const IrModule *mod) {
  const Mesh *m = dm->mesh;
  const PipeInfo *pi = mod->pipeline ? mod->pipeline->pipe : NULL;
  bool ok = true;
  for (const Op *op = mod->main->first; op && ok && dm->ndev <= 256; op = op->next) {
    if (op->kind != OP_INPUT && op->kind != OP_PARAM) continue;
    const Value *v = op->results[0];
    RtPlace pl;
    devprog_place(dm, dm->arena, v, &pl);
    int64_t partial = 1;
    for (int a = 0; a < m->naxes; a++)
      if (v->sharding.partial >> a & 1) partial *= m->axes[a].size;
    for (int64_t d = 0; d < dm->ndev && ok; d++) {
      int stage = pi ? (int)radix(m, d, pi->stage_axes, pi->nstage_axes) : 0;
      bool want = !pi || op->place == PLACE_ALL || (stage == 0 && (op->place & PLACE_FIRST)) ||
                  (stage == pi->stages - 1 && (op->place & PLACE_LAST)) || (stage > 0 && stage < pi->stages - 1 && (op->place & PLACE_MID));
      if (pl.holds[d] != want || dev_runs_on(dm, op->place, d) != want)
        ok = false, note("%s at line %d: device %lld holds it %d, the stage predicate says %d", ir_op_name(op->kind), op->loc.line,
                         (long long)d, pl.holds[d], want);
      int64_t takers = 0;
      for (int64_t e = 0; e < dm->ndev; e++)
        if (pl.take[e] && !memcmp(&pl.start[e * pl.rank], &pl.start[d * pl.rank], sizeof(int64_t) * (size_t)pl.rank)) takers++;
      if (want && takers != partial)
        ok = false, note("%s at line %d: device %lld's block is read back %lld times, want %lld", ir_op_name(op->kind), op->loc.line,
                         (long long)d, (long long)takers, (long long)partial);
    }
  }
  return ok;
}

/* ---- driving ---- */

static int run_config(const char *path, const char *mesh, const char *layout, char *label, size_t nlabel) {
  Arena a;
  arena_init(&a);
  diag_reset();
  ParsedProgram *pp = parse_program(&a, path, unit_stdlib_dir());
  int res = -1;
  snprintf(label, nlabel, "%s mesh=%s layout=%s", path, mesh ? mesh : "-", layout ? layout : "-");
  if (pp && pp->nfiles > 0 && diag_error_count() == 0) {
    SemaOptions so = {.mesh = mesh, .layout = layout};
    Program *p = sema_program(&a, pp, &so);
    if (!p->usage_error && diag_error_count() == 0 && p->entry && p->mesh) {
      IrModule *m = step_build(&a, p);
      if (m && diag_error_count() == 0 && pipeline_run(m, p) && m->dev) {
        nnotes = 0;
        notes[0] = 0;
        bool ok = m->dev->mesh == p->mesh && check_groups(m->dev) && check_func(m->dev, m->main) && check_places(m->dev, m);
        if (ok) ok = check_groups(m->dev); /* and the groups interned by the checks */
        size_t len = strlen(label);
        snprintf(label + len, nlabel - len, " (%d devices, %d groups)", m->dev->ndev, m->dev->groups.len);
        res = ok ? 1 : 0;
      }
    }
  }
  arena_free(&a);
  return res;
}

static void run_file(const char *path) {
  char *meshes[32], *layouts[32];
  int nm, nl;
  unit_declared(path, meshes, &nm, layouts, &nl, 32);
  for (int i = 0; i < nm; i++)
    for (int j = 0; j < nl; j++) {
      char label[1024];
      int r = run_config(path, meshes[i], layouts[j], label, sizeof label);
      if (r < 0) nskip++, printf("SKIP %s (does not compile)\n", label);
      else if (r == 0) nfail++, printf("FAIL %s\n%s", label, notes);
      else npass++, printf("PASS %s\n", label);
    }
  for (int i = 0; i < nm; i++) free(meshes[i]);
  for (int j = 0; j < nl; j++) free(layouts[j]);
}

int main(int argc, char **argv) {
  FILE *devnull = fopen("/dev/null", "w");
  diag_configure(devnull ? devnull : stderr, DIAG_MACHINE, false);
  for (int i = 1; i < argc; i++)
    if (!ut_each_shard(argv[i], run_file)) {
      fprintf(stderr, "test_devprog: cannot read %s\n", argv[i]);
      nfail++;
    }
  printf("%d passed, %d failed (%d skipped)\n", npass, nfail, nskip);
  if (devnull) fclose(devnull);
  return nfail > 0 || npass == 0 ? 1 : 0;
}
