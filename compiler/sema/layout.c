/* layout.c: the sharding of a tensor written at a boundary, from its `@`s and the chosen layout.
 *
 * In: a TypeSpec (a param, a function argument or result, a typed let), Program.mesh and
 * Program.layout. Out: a Sharding (mesh axes per dim) and, per dim, where its axes came from.
 * The rules are language.md's (fixed):
 *   - an explicit `@` decides its dim; its axes must exist on the mesh, divide the dim evenly and
 *     shard no other dim of the tensor (each is an error);
 *   - then the layout's rules apply in the order written, each to the one dim it names. A rule is
 *     skipped for this tensor when its dim already has axes (an `@`, or an earlier rule), when the
 *     tensor already uses one of its axes (silently: that is how `batch: data` and `embed: data`
 *     give data-parallel activations and FSDP weights from one layout), when the mesh lacks one of
 *     its axes (one warning at the rule), or when the axes do not divide the dim (a warning naming
 *     both sizes; never a silent replication). A multi-axis rule applies whole or not at all.
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

void layout_check_rules(const Program *p) {
  if (!p->layout || !p->mesh) return;
  for (int i = 0; i < p->layout->nrules; i++) {
    const LayoutRule *r = &p->layout->rules[i];
    Name missing = rule_missing_axis(p->mesh, r);
    if (missing) warn_rule_missing_axis(p, r, missing);
  }
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
  if (product > 0 && dim->size % product != 0) {
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

bool layout_apply(const Program *p, const TypeSpec *spec, Sharding *out, ShardOrigin *origin) {
  memset(out, 0, sizeof *out);
  if (origin) memset(origin, 0, sizeof *origin);
  if (!spec) return true;
  const Mesh *m = p->mesh;
  int rank = spec->rank < 0 ? 0 : spec->rank > MAX_RANK ? MAX_RANK : spec->rank;
  int owner[MAX_MESH_AXES]; /* which dim each mesh axis shards, -1 if none */
  for (int a = 0; a < MAX_MESH_AXES; a++) owner[a] = -1;
  bool ok = true;

  for (int i = 0; i < rank; i++) {
    if (spec->nat[i] <= 0 || !spec->dims[i]) continue;
    int idx[MAX_MESH_AXES], n = 0;
    if (!apply_explicit(p, spec, i, owner, idx, &n)) {
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

  if (!m || !p->layout) return ok;
  for (int r = 0; r < p->layout->nrules; r++) {
    const LayoutRule *rule = &p->layout->rules[r];
    if (rule->naxes < 1 || rule->naxes > MAX_AXES_PER_DIM) continue;
    int i = 0;
    while (i < rank && !(spec->dims[i] && spec->dims[i]->name == rule->dim)) i++;
    if (i == rank || spec->nat[i] > 0 || out->naxes[i] > 0) continue;
    Name missing = rule_missing_axis(m, rule);
    if (missing) {
      warn_rule_missing_axis(p, rule, missing);
      continue;
    }
    int idx[MAX_AXES_PER_DIM];
    int64_t product = 1;
    bool taken = false;
    for (int j = 0; j < rule->naxes; j++) {
      idx[j] = mesh_axis_index(m, rule->axes[j]);
      if (owner[idx[j]] >= 0) taken = true;
      product = sat_mul(product, m->axes[idx[j]].size);
    }
    if (taken) continue;
    if (product > 0 && spec->dims[i]->size % product != 0) {
      if (once(p, rule->loc, ONCE_RULE_NOT_DIVISIBLE)) {
        char rb[256], ab[256];
        int64_t pad = layout_pad_size(spec->dims[i]->size, product);
        char pb[160] = "";
        if (pad > 0)
          snprintf(pb, sizeof pb, "; padded to %lld (+%.2f%%, `-D %s=%lld`) it would divide", (long long)pad,
                   100.0 * (double)(pad - spec->dims[i]->size) / (double)spec->dims[i]->size, rule->dim, (long long)pad);
        diag_warning(rule->loc, "layout rule %s is skipped: dim '%s' (%lld) is not divisible by %s%s",
                     rule_text(rule, rb, sizeof rb), rule->dim, (long long)spec->dims[i]->size,
                     axes_text(m, idx, rule->naxes, product, ab, sizeof ab), pb);
      }
      continue;
    }
    for (int j = 0; j < rule->naxes; j++) {
      owner[idx[j]] = i;
      out->axes[i][j] = (int8_t)idx[j];
    }
    out->naxes[i] = (uint8_t)rule->naxes;
    if (origin) {
      origin->kind[i] = ORIGIN_LAYOUT;
      origin->loc[i] = rule->loc;
    }
  }
  return ok;
}
