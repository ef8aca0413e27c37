/* layout.c: the sharding a layout binds a tensor to, from its `@`s and the chosen layout.
 *
 * In: a TypeSpec (a param, a function argument or result, a typed let) or, for every other value
 * the step holds or computes, its dims (layout_map_dims; language.md: a layout binds); Program.mesh
 * and Program.layout. Out: a Sharding (mesh axes per dim) and, per dim, where its axes came from.
 * The rules are language.md's (fixed):
 *   - an explicit `@` decides its dim; its axes must exist on the mesh, divide the dim evenly, shard
 *     no other dim of the tensor, and not be the pipeline's (each is an error);
 *   - then the layout's rules apply in the order written, each to the one dim it names, except that
 *     in a tensor holding a route's expert dim without its tokens dim the expert dim's rule applies
 *     first (Routing). A rule is skipped for this tensor when its dim already has axes (an `@`, or an
 *     earlier rule); a multi-axis rule keeps, in order, those of its axes the tensor does not use yet,
 *     and is skipped silently when it uses them all (that is how `batch: data` and `embed: data` give
 *     data-parallel activations and FSDP weights from one layout). A rule is skipped with one
 *     warning at the rule when the mesh lacks one of its axes (skipped whole) or when it names the
 *     pipeline's axis for another dim (layout_stage_axes); for a tensor whose dim its axes do not
 *     divide, with a warning naming both sizes (never a silent replication).
 * The same spec is applied many times (each use of a param, the IR builder and the checker), so
 * every diagnostic is reported once: DiagOnce remembers (place, kind) pairs already reported. */
#include <stdio.h>
#include <string.h>

#include "checked.h"
#include "sema_int.h"
#include "suggest.h"

typedef enum {
  ONCE_NO_MESH,
  ONCE_TOO_MANY_AXES,
  ONCE_UNKNOWN_AXIS,
  ONCE_AXIS_TWICE,
  ONCE_NOT_DIVISIBLE,
  ONCE_RULE_NO_AXIS,
  ONCE_RULE_NOT_DIVISIBLE,
  ONCE_RULE_STAGE,
  ONCE_STAGE_AXIS,
} OnceKind;

typedef struct OnceKey {
  const Source *file;
  int line, col;
  OnceKind kind;
} OnceKey;

struct DiagOnce {
  Arena *arena;
  OnceKey *slots;   /* open addressing */
  bool *used;       /* which slots hold a key */
  int len, cap;     /* cap a power of 2, at most half full */
};

struct DiagOnce *layout_diag_once_new(Arena *a) {
  struct DiagOnce *d = ARENA_NEW(a, struct DiagOnce);
  d->arena = a;
  return d;
}

static unsigned once_hash(const OnceKey *k) {
  uintptr_t h = (uintptr_t)k->file * 31u + (uintptr_t)k->line * 2654435761u + (uintptr_t)k->col * 40503u +
                (uintptr_t)k->kind;
  return (unsigned)(h ^ (h >> 15));
}

static bool once_same(const OnceKey *a, const OnceKey *b) {
  return a->file == b->file && a->line == b->line && a->col == b->col && a->kind == b->kind;
}

/* True the first time (loc, kind) is seen: the caller reports then. Without a set, always true.
 * A hash set, so that N diagnostics cost O(N). */
static bool once(const Program *p, SrcLoc loc, OnceKind kind) {
  struct DiagOnce *d = p->diag_once;
  if (!d) return true;
  if (2 * (d->len + 1) > d->cap) {
    int ncap = d->cap ? 2 * d->cap : 64;
    OnceKey *slots = ARENA_ARRAY(d->arena, OnceKey, ncap);
    bool *used = ARENA_ARRAY(d->arena, bool, ncap);
    for (int i = 0; i < d->cap; i++) {
      if (!d->used[i]) continue;
      unsigned j = once_hash(&d->slots[i]) & (unsigned)(ncap - 1);
      while (used[j]) j = (j + 1) & (unsigned)(ncap - 1);
      slots[j] = d->slots[i];
      used[j] = true;
    }
    d->slots = slots, d->used = used, d->cap = ncap;
  }
  OnceKey k = {loc.file, loc.line, loc.col, kind};
  unsigned j = once_hash(&k) & (unsigned)(d->cap - 1);
  for (; d->used[j]; j = (j + 1) & (unsigned)(d->cap - 1))
    if (once_same(&d->slots[j], &k)) return false;
  d->slots[j] = k;
  d->used[j] = true;
  d->len++;
  return true;
}

/* "axis 'model' (8)" or "axes (data, model) (32)", into buf. */
static const char *axes_text(const Mesh *m, const int *idx, int n, int64_t product, char *buf, size_t size) {
  if (n == 1) {
    snprintf(buf, size, "axis '%s' (%lld)", m->axes[idx[0]].name, (long long)product);
    return buf;
  }
  size_t used = (size_t)snprintf(buf, size, "axes (");
  for (int i = 0; i < n && used < size; i++)
    used += (size_t)snprintf(buf + used, size - used, "%s%s", i ? ", " : "", m->axes[idx[i]].name);
  if (used < size) snprintf(buf + used, size - used, ") (%lld)", (long long)product);
  return buf;
}

/* "rule 'seq: (ctx, model)'" for messages. */
static const char *rule_text(const LayoutRule *r, char *buf, size_t size) {
  size_t used = (size_t)snprintf(buf, size, "'%s: %s", r->dim, r->naxes > 1 ? "(" : "");
  for (int i = 0; i < r->naxes && used < size; i++)
    used += (size_t)snprintf(buf + used, size - used, "%s%s", i ? ", " : "", r->axes[i]);
  if (used < size) snprintf(buf + used, size - used, "%s'", r->naxes > 1 ? ")" : "");
  return buf;
}

/* "; did you mean 'model'?" for an axis m lacks, or "". */
static const char *axis_suggest(const Mesh *m, Name axis, char *buf, size_t size) {
  Suggest sg = suggest_begin(axis);
  for (int i = 0; i < m->naxes; i++) suggest_try(&sg, m->axes[i].name);
  return suggest_text(&sg, buf, size);
}

static const char *mesh_axis_list(const Mesh *m, char *buf, size_t size) {
  size_t used = 0;
  buf[0] = 0;
  for (int i = 0; i < m->naxes && used < size; i++)
    used += (size_t)snprintf(buf + used, size - used, "%s%s", i ? ", " : "", m->axes[i].name);
  if (m->naxes == 0) snprintf(buf, size, "none");
  return buf;
}

/* The first axis of rule r that the mesh lacks, or NULL. */
static Name rule_missing_axis(const Mesh *m, const LayoutRule *r) {
  for (int i = 0; i < r->naxes; i++)
    if (mesh_axis_index(m, r->axes[i]) < 0) return r->axes[i];
  return NULL;
}

static void warn_rule_missing_axis(const Program *p, const LayoutRule *r, Name axis) {
  if (!once(p, r->loc, ONCE_RULE_NO_AXIS)) return;
  char rb[256], ab[256], sb[160];
  diag_warning(r->loc, "layout rule %s is skipped: mesh '%s' has no axis '%s'%s (its axes: %s)",
               rule_text(r, rb, sizeof rb), p->mesh->name, axis, axis_suggest(p->mesh, axis, sb, sizeof sb),
               mesh_axis_list(p->mesh, ab, sizeof ab));
}


/* Explicit `@`s of dim i: mesh axis indices into idx. Reports and returns false when wrong. */
static bool apply_explicit(const Program *p, const TypeSpec *spec, int i, int owner[MAX_MESH_AXES], int *idx,
                           int *n) {
  const Mesh *m = p->mesh;
  SrcLoc loc = spec->dim_loc[i].file ? spec->dim_loc[i] : spec->loc;
  const Dim *dim = spec->dims[i];
  char buf[256];
  if (!m) {
    if (once(p, loc, ONCE_NO_MESH))
      diag_error(loc, "'%s@%s' names a mesh axis, but the program declares no mesh", dim->name, spec->at[i][0]);
    return false;
  }
  if (spec->nat[i] > MAX_AXES_PER_DIM) {
    if (once(p, loc, ONCE_TOO_MANY_AXES))
      diag_error(loc, "a dim is sharded over at most %d axes; '%s' names %d", MAX_AXES_PER_DIM, dim->name,
                 spec->nat[i]);
    return false;
  }
  bool ok = true;
  int64_t product = 1;
  *n = 0;
  for (int j = 0; j < spec->nat[i]; j++) {
    Name an = spec->at[i][j];
    int a = mesh_axis_index(m, an);
    if (a < 0) {
      char sb[160];
      if (once(p, loc, ONCE_UNKNOWN_AXIS))
        diag_error(loc, "mesh '%s' has no axis '%s'%s (its axes: %s)", m->name, an, axis_suggest(m, an, sb, sizeof sb),
                   mesh_axis_list(m, buf, sizeof buf));
      ok = false;
      continue;
    }
    if (owner[a] >= 0) {
      if (once(p, loc, ONCE_AXIS_TWICE)) {
        if (owner[a] == i) diag_error(loc, "axis '%s' is named twice for dim '%s'", an, dim->name);
        else diag_error(loc, "axis '%s' shards two dims of this tensor ('%s' and '%s')", an,
                        spec->dims[owner[a]]->name, dim->name);
      }
      ok = false;
      continue;
    }
    owner[a] = i;
    idx[(*n)++] = a;
    product = sat_mul(product, m->axes[a].size);
  }
  if (!ok) return false;
  if (product > 0 && !layout_dim_deals(p, dim, product)) {
    if (once(p, loc, ONCE_NOT_DIVISIBLE))
      diag_error(loc, "dim '%s' (%lld) is not divisible by %s", dim->name, (long long)dim->size,
                 axes_text(m, idx, *n, product, buf, sizeof buf));
    return false;
  }
  return true;
}

/* A multiple of lcm(prod, 64) (GPT-2's vocabulary, 50257, is trained as 50304 = 786 x 64), if it
 * adds at most 1% to size. */
int64_t layout_pad_size(int64_t size, int64_t prod) {
  if (prod <= 0 || size <= 0) return 0;
  int64_t a = prod, b = LAYOUT_PAD_QUANTUM;
  while (b) {
    int64_t t = a % b;
    a = b;
    b = t;
  }
  int64_t q = prod / a * LAYOUT_PAD_QUANTUM;
  if (size <= q || size % prod == 0) return 0;
  int64_t to = (size + q - 1) / q * q;
  return (double)(to - size) <= 0.01 * (double)size ? to : 0;
}


/* ---- the pipeline's axes ---- */

static bool is_stack_dim(const Program *p, Name dim) {
  for (int i = 0; i < p->nstack_dims; i++)
    if (p->stack_dims[i]->name == dim) return true;
  return false;
}

/* A stacked dim the train step's `stage_layers` deals over `parts` stages: a list of that many
 * counts summing to its size (sema's check_stage_layers says so at the list otherwise). Then the
 * pipeline's rule applies though the size does not divide (each stage holds its own count:
 * shard/devprog.h, dev_stage_layers). */
static bool stage_layers_deal(const Program *p, const Dim *d, int64_t parts) {
  const Step *st = p ? p->step : NULL;
  if (!st || st->kind != STEP_TRAIN || !st->stage_layers || st->nstage_layers != parts) return false;
  int64_t sum = 0;
  for (int i = 0; i < st->nstage_layers; i++) sum += st->stage_layers[i];
  return sum == d->size;
}

bool layout_dim_deals(const Program *p, const Dim *d, int64_t parts) {
  if (!d || parts <= 1 || d->size % parts == 0) return true;
  return p && is_stack_dim(p, d->name) && stage_layers_deal(p, d, parts);
}

/* The mesh axes of rule r, as indices, when the mesh has every one; else false. */
static bool rule_axes(const Mesh *m, const LayoutRule *r, int *idx) {
  if (r->naxes < 1 || r->naxes > MAX_AXES_PER_DIM) return false;
  for (int j = 0; j < r->naxes; j++)
    if ((idx[j] = mesh_axis_index(m, r->axes[j])) < 0) return false;
  return true;
}

uint16_t layout_stage_axes(const Program *p, const LayoutRule **rule) {
  if (rule) *rule = NULL;
  if (!p || !p->mesh || !p->layout) return 0;
  const Mesh *m = p->mesh;
  for (int r = 0; r < p->layout->nrules; r++) {
    const LayoutRule *lr = &p->layout->rules[r];
    int idx[MAX_AXES_PER_DIM];
    if (!is_stack_dim(p, lr->dim) || !rule_axes(m, lr, idx)) continue;
    const Dim *d = NULL;
    for (int i = 0; i < p->nstack_dims && !d; i++)
      if (p->stack_dims[i]->name == lr->dim) d = p->stack_dims[i];
    int64_t prod = 1;
    uint16_t mask = 0;
    for (int j = 0; j < lr->naxes; j++) prod = sat_mul(prod, m->axes[idx[j]].size), mask |= (uint16_t)(1u << idx[j]);
    if (prod <= 1 || d->size % prod != 0) continue;
    if (rule) *rule = lr;
    return mask;
  }
  return 0;
}

/* "layers: stage" as written, for messages about the pipeline's rule. */
static const char *stage_rule_where(const LayoutRule *r, char *buf, size_t size) {
  char rb[256];
  const char *path = r->loc.file && r->loc.file->path ? r->loc.file->path : "?";
  const char *base = strrchr(path, '/');
  snprintf(buf, size, "%s at %s:%d", rule_text(r, rb, sizeof rb), base ? base + 1 : path, r->loc.line);
  return buf;
}

/* A rule for another dim naming an axis of the pipeline's: skipped, with one warning at the rule. */
static bool rule_on_stage(const Program *p, const LayoutRule *r, uint16_t stage, const LayoutRule *srule, bool warn) {
  if (!stage || is_stack_dim(p, r->dim)) return false;
  int idx[MAX_AXES_PER_DIM];
  if (!rule_axes(p->mesh, r, idx)) return false;
  int hit = -1;
  for (int j = 0; j < r->naxes && hit < 0; j++)
    if (stage & (1u << idx[j])) hit = j;
  if (hit < 0) return false;
  if (warn && once(p, r->loc, ONCE_RULE_STAGE)) {
    char rb[256], sb[320];
    diag_warning(r->loc,
                 "layout rule %s is skipped: axis '%s' belongs to the pipeline (layout rule %s shards the stacked "
                 "layers over it), so no other dim may be sharded over it",
                 rule_text(r, rb, sizeof rb), r->axes[hit], stage_rule_where(srule, sb, sizeof sb));
  }
  return true;
}

void layout_check_rules(const Program *p) {
  if (!p->layout || !p->mesh) return;
  const LayoutRule *srule;
  uint16_t stage = layout_stage_axes(p, &srule);
  for (int i = 0; i < p->layout->nrules; i++) {
    const LayoutRule *r = &p->layout->rules[i];
    Name missing = rule_missing_axis(p->mesh, r);
    if (missing) warn_rule_missing_axis(p, r, missing);
    else rule_on_stage(p, r, stage, srule, true);
  }
}

/* ---- the rules applied to one tensor ---- */

/* Whether a tensor of these dims holds a route's expert dim without its tokens dim (the dispatched
 * tokens, the experts' weights and outputs): that dim's rule then applies first (language.md,
 * Routing). */
static Name expert_first(const Program *p, Dim *const *dims, int rank) {
  for (int k = 0; k < p->nroute_dims; k++) {
    bool e = false, t = false;
    for (int i = 0; i < rank; i++) {
      if (!dims[i]) continue;
      e |= dims[i] == p->route_dims[k].expert;
      t |= dims[i] == p->route_dims[k].tokens;
    }
    if (e && !t) return p->route_dims[k].expert->name;
  }
  return NULL;
}

/* The layout's rules on a tensor of these dims, after the dims already set in out (owner: which dim
 * each mesh axis shards). `warn`: report a skipped rule's warnings (once each). */
static void apply_rules(const Program *p, Dim *const *dims, int rank, Sharding *out, ShardOrigin *origin,
                        int owner[MAX_MESH_AXES], unsigned fixed, bool warn) {
  const Mesh *m = p->mesh;
  if (!m || !p->layout) return;
  const LayoutRule *srule;
  uint16_t stage = layout_stage_axes(p, &srule);
  Name first = expert_first(p, dims, rank);
  for (int pass = first ? 0 : 1; pass < 2; pass++)
    for (int r = 0; r < p->layout->nrules; r++) {
      const LayoutRule *rule = &p->layout->rules[r];
      if (rule->naxes < 1 || rule->naxes > MAX_AXES_PER_DIM) continue;
      if ((pass == 0) != (rule->dim == first)) continue;
      int i = 0;
      while (i < rank && !(dims[i] && dims[i]->name == rule->dim)) i++;
      if (i == rank || (fixed & (1u << i)) || out->naxes[i] > 0) continue;
      Name missing = rule_missing_axis(m, rule);
      if (missing) {
        if (warn) warn_rule_missing_axis(p, rule, missing);
        continue;
      }
      if (rule_on_stage(p, rule, stage, srule, warn)) continue;
      /* the rule's axes this tensor does not use yet, in order (none: skipped, silently) */
      int idx[MAX_AXES_PER_DIM], n = 0;
      int64_t product = 1;
      for (int j = 0; j < rule->naxes; j++) {
        int a = mesh_axis_index(m, rule->axes[j]);
        if (owner[a] >= 0) continue;
        idx[n++] = a;
        product = sat_mul(product, m->axes[a].size);
      }
      if (n == 0) continue;
      /* a stacked dim's rule is the pipeline's: whole or not at all, so that every stacked tensor
       * holds the same stages (a rule kept in part on some tensors made stages of those alone:
       * issue 18, seed 5 case 39, `layers: (ctx, data)` beside `heads: ctx`, "no stage for this
       * device" at run time) */
      if (n < rule->naxes && is_stack_dim(p, rule->dim)) continue;
      if (product > 0 && !layout_dim_deals(p, dims[i], product)) {
        if (warn && once(p, rule->loc, ONCE_RULE_NOT_DIVISIBLE)) {
          char rb[256], ab[256];
          int64_t pad = layout_pad_size(dims[i]->size, product);
          char pb[160] = "";
          if (pad > 0)
            snprintf(pb, sizeof pb, "; padded to %lld (+%.2f%%, `-D %s=%lld`) it would divide", (long long)pad,
                     100.0 * (double)(pad - dims[i]->size) / (double)dims[i]->size, rule->dim, (long long)pad);
          diag_warning(rule->loc, "layout rule %s is skipped: dim '%s' (%lld) is not divisible by %s%s",
                       rule_text(rule, rb, sizeof rb), rule->dim, (long long)dims[i]->size,
                       axes_text(m, idx, n, product, ab, sizeof ab), pb);
        }
        continue;
      }
      for (int j = 0; j < n; j++) {
        owner[idx[j]] = i;
        out->axes[i][j] = (int8_t)idx[j];
      }
      out->naxes[i] = (uint8_t)n;
      if (origin) {
        origin->kind[i] = ORIGIN_LAYOUT;
        origin->loc[i] = rule->loc;
      }
    }
}

bool layout_apply(const Program *p, const TypeSpec *spec, Sharding *out, ShardOrigin *origin) {
  memset(out, 0, sizeof *out);
  if (origin) memset(origin, 0, sizeof *origin);
  if (!spec) return true;
  int rank = spec->rank < 0 ? 0 : spec->rank > MAX_RANK ? MAX_RANK : spec->rank;
  int owner[MAX_MESH_AXES]; /* which dim each mesh axis shards, -1 if none */
  for (int a = 0; a < MAX_MESH_AXES; a++) owner[a] = -1;
  bool ok = true;
  unsigned fixed = 0; /* dims with an explicit `@` (right or wrong): no rule applies to them */
  const LayoutRule *srule = NULL;
  uint16_t stage = layout_stage_axes(p, &srule);

  for (int i = 0; i < rank; i++) {
    if (spec->nat[i] <= 0 || !spec->dims[i]) continue;
    fixed |= 1u << i;
    int idx[MAX_MESH_AXES], n = 0;
    if (!apply_explicit(p, spec, i, owner, idx, &n)) {
      ok = false;
      continue;
    }
    int hit = -1;
    for (int j = 0; j < n && hit < 0; j++)
      if (stage & (1u << idx[j])) hit = idx[j];
    if (hit >= 0 && !is_stack_dim(p, spec->dims[i]->name)) {
      SrcLoc loc = spec->dim_loc[i].file ? spec->dim_loc[i] : spec->loc;
      char sb[320];
      if (once(p, loc, ONCE_STAGE_AXIS))
        diag_error(loc, "'%s@%s': axis '%s' belongs to the pipeline (layout rule %s shards the stacked layers over "
                        "it), so no other dim may be sharded over it",
                   spec->dims[i]->name, p->mesh->axes[hit].name, p->mesh->axes[hit].name,
                   stage_rule_where(srule, sb, sizeof sb));
      for (int j = 0; j < n; j++) owner[idx[j]] = -1;
      ok = false;
      continue;
    }
    for (int j = 0; j < n; j++) out->axes[i][j] = (int8_t)idx[j];
    out->naxes[i] = (uint8_t)n;
    if (origin) {
      origin->kind[i] = ORIGIN_ANNOTATION;
      origin->loc[i] = spec->dim_loc[i];
    }
  }
  apply_rules(p, spec->dims, rank, out, origin, owner, fixed, true);
  return ok;
}

void layout_map_dims(const Program *p, Dim *const *dims, int rank, Sharding *out, ShardOrigin *origin, bool warn) {
  memset(out, 0, sizeof *out);
  if (origin) memset(origin, 0, sizeof *origin);
  if (!p) return;
  if (rank > MAX_RANK) rank = MAX_RANK;
  int owner[MAX_MESH_AXES];
  for (int a = 0; a < MAX_MESH_AXES; a++) owner[a] = -1;
  apply_rules(p, dims, rank, out, origin, owner, 0, warn);
}
