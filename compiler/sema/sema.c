/* sema.c: the declaration checker: parsed files in, a resolved Program out.
 *
 * In: every parsed file of a program (imports first, the main file last) and the command-line
 * choices (-D, --mesh, --layout, --entry). Out: a Program (program.h): dims with their sizes after
 * -D, targets (target.c), meshes formed on their targets (mesh.c), layouts, models with typed
 * params and function signatures, train/serve steps; then the chosen mesh, layout, entry function
 * and step. Function bodies are not lowered here (ir_build.c lowers them from the signatures);
 * they are only scanned for the names they mention, to warn about params no function reads.
 *
 * Names are global to a program whatever file declares them, so the checker first collects every
 * declaration by kind (a second declaration of a name is an error with a note at the first), then
 * resolves the kinds in dependency order: dims (which may be defined by each other), targets,
 * meshes, layouts, models, steps, choices. Then the models as a whole: no cycles, nesting within
 * MAX_MODEL_DEPTH, no stack over a dim its model already has, no unread params. Last it checks the
 * boundary types of the models in play against the chosen mesh and layout (layout.c), so a wrong
 * `@` is reported even in a function that is not compiled, and the step against them (microbatches,
 * the schedule's pipeline). Sizes stay within program.h's limits (checked.h's SIZE_LIMIT for dims
 * and tensors). Every problem in the source is a located diagnostic, an unknown name suggesting
 * the closest declared one (suggest.h); a problem with the command line is returned as
 * Program.usage_error for the driver (exit 2), with the same suggestions. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "sema_int.h"
#include "suggest.h"

/* Deepest recursion the checker allows itself in integer expressions (nested expressions, dims
 * through dims): deeper input is a diagnostic, not a stack overflow. Dim chains are limited first,
 * at MAX_DIM_CHAIN (program.h), which a plain chain reaches at depth 2 x MAX_DIM_CHAIN. */
enum { SEMA_MAX_DEPTH = 2000 };
/* How deep building models one inside another may recurse before giving up; beyond MAX_MODEL_DEPTH
 * (program.h) and below this, models_check_depth reports the chain whole. */
enum { SEMA_BUILD_DEPTH = 4 * MAX_MODEL_DEPTH };

/* ---- small shared helpers (sema_int.h) ---- */

void sema_duplicate(const char *what, Name name, SrcLoc loc, SrcLoc first) {
  diag_error(loc, "%s '%s' is declared twice", what, name);
  diag_note(first, "first declared here");
}

SrcLoc sema_name_loc(const Node *n) {
  if (!n) return (SrcLoc){0};
  return n->name_loc.file ? n->name_loc : n->loc;
}

bool sema_kv_number(const Node *v, double *out, bool *is_int, int64_t *ival) {
  if (!v) return false;
  if (v->kind == N_NUM) {
    *out = v->num.f;
    *is_int = !v->num.is_float;
    *ival = v->num.i;
    return true;
  }
  if (v->kind == N_UNARY && v->op == '-' && v->lhs && v->lhs->kind == N_NUM) {
    *out = -v->lhs->num.f;
    *is_int = !v->lhs->num.is_float && v->lhs->num.i != INT64_MIN;
    *ival = *is_int ? -v->lhs->num.i : 0;
    return true;
  }
  return false;
}

Name sema_kv_word(const Node *v) {
  if (!v) return NULL;
  if (v->kind == N_NAME) return v->name;
  if (v->kind == N_STRING) return v->str;
  if (v->kind == N_NUM && v->num.text && v->num.text_len > 0) return intern(v->num.text, (size_t)v->num.text_len);
  return NULL;
}

const char *sema_join_names(Arena *a, const Name *names, int n, int max) {
  if (n <= 0) return "none";
  size_t len = 1;
  int shown = n < max ? n : max;
  for (int i = 0; i < shown; i++) len += strlen(names[i]) + 2;
  len += 8;
  char *buf = arena_alloc(a, len), *q = buf;
  for (int i = 0; i < shown; i++) q += sprintf(q, "%s%s", i ? ", " : "", names[i]);
  if (shown < n) sprintf(q, ", ...");
  return buf;
}

/* ---- name maps: Name -> index, open addressing on the interned pointer ---- */

typedef struct NameMap {
  Name *keys;
  int *vals;
  int cap, len;
} NameMap;

static unsigned namemap_hash(Name k) { return (unsigned)(((uintptr_t)k >> 3) * 2654435761u); }

static int namemap_get(const NameMap *m, Name k) {
  if (!m->cap || !k) return -1;
  for (unsigned h = namemap_hash(k) & (unsigned)(m->cap - 1);; h = (h + 1) & (unsigned)(m->cap - 1)) {
    if (!m->keys[h]) return -1;
    if (m->keys[h] == k) return m->vals[h];
  }
}

static void namemap_put(Arena *a, NameMap *m, Name k, int v) {
  if (2 * (m->len + 1) > m->cap) {
    NameMap big = {ARENA_ARRAY(a, Name, m->cap ? m->cap * 2 : 16), ARENA_ARRAY(a, int, m->cap ? m->cap * 2 : 16),
                   m->cap ? m->cap * 2 : 16, 0};
    for (int i = 0; i < m->cap; i++)
      if (m->keys[i]) namemap_put(a, &big, m->keys[i], m->vals[i]);
    *m = big;
  }
  unsigned h = namemap_hash(k) & (unsigned)(m->cap - 1);
  while (m->keys[h] && m->keys[h] != k) h = (h + 1) & (unsigned)(m->cap - 1);
  if (!m->keys[h]) m->len++;
  m->keys[h] = k;
  m->vals[h] = v;
}

/* ---- the checker's state ---- */

enum { DIM_NEW, DIM_BUSY, DIM_DONE, DIM_BAD };
enum { MODEL_UNBUILT, MODEL_USED, MODEL_QUIET };
typedef VEC(int) IntVec;

typedef struct Sema {
  Program *p;
  Arena *a;
  const SemaOptions *opt;
  VEC(const Node *) dim_nodes;
  VEC(const Node *) target_nodes;
  VEC(const Node *) mesh_nodes;
  VEC(const Node *) layout_nodes;
  VEC(const Node *) model_nodes;
  VEC(const Node *) step_nodes;
  VEC(Dim *) dims;
  VEC(Model *) models;
  VEC(bool) model_in_main;
  VEC(uint8_t) model_built;  /* MODEL_*: see model_use */
  int model_depth;           /* models being built, one inside another */
  bool quiet;                /* building models nothing uses (diagnostics dropped) */
  bool reported_depth;       /* "hold one another too deep" said once */
  uint8_t *dim_state;     /* DIM_*, per dim */
  int *dim_chain;         /* per resolved dim: the longest chain of dims its size is defined through,
                             itself counted (1 for `dim a = 4`) */
  int chain_seen;         /* eval_int: the longest dim_chain of the dims it met */
  IntVec dim_path;        /* dims being evaluated, for "a -> b -> a" */
  NameMap dim_map, mesh_map, layout_map, model_map;
  NameMap size_errors;    /* "tensor too large" messages already reported */
  bool in_choices;        /* choose(): suggestions go into usage errors, not diagnostics */
  const char *usage;      /* first command-line problem */
} Sema;

static void sema_usage(Sema *s, const char *msg) {
  if (!s->usage) s->usage = msg;
}

/* A suggestion searches every name of a kind; for a diagnostic the error limit will drop it is
 * not searched, so a flood of unknown names stays linear. Usage errors (no diagnostic) always are. */
static bool sema_worth_suggesting(const Sema *s) { return s->in_choices || diag_would_show(DIAG_ERROR); }

/* "; did you mean 'bf16'?" for an unknown dtype (into buf), or "". */
static const char *sema_suggest_dtype(Name want, char *buf, size_t size) {
  Suggest sg = suggest_begin(want);
  for (int t = 0; t < DT__COUNT; t++) suggest_try(&sg, dtype_name((DType)t));
  return suggest_text(&sg, buf, size);
}

/* "; did you mean 'hidden'?" for an unknown dim (into buf), or "". */
static const char *sema_suggest_dim(Sema *s, Name want, char *buf, size_t size) {
  Suggest sg = suggest_begin(sema_worth_suggesting(s) ? want : NULL);
  for (int i = 0; i < s->dims.len; i++) suggest_try(&sg, s->dims.data[i]->name);
  return suggest_text(&sg, buf, size);
}

/* The same among the model names. */
static const char *sema_suggest_model(Sema *s, Name want, char *buf, size_t size) {
  Suggest sg = suggest_begin(sema_worth_suggesting(s) ? want : NULL);
  for (int i = 0; i < s->models.len; i++) suggest_try(&sg, s->models.data[i]->name);
  return suggest_text(&sg, buf, size);
}

/* ---- integer expressions (dim sizes, mesh axis sizes, microbatches) ---- */

static bool dim_resolve(Sema *s, int i, int depth);

/* The -D overrides an integer expression depends on, directly or through the dims it names:
 * " (heads is 42 from -D heads=42; the program declares 32)", or "" when none. An error in such an
 * expression is then seen to come from the command line, not from the program as written. */
static void override_walk(Sema *s, const Node *e, int depth, int *found, int *nfound) {
  if (!e || depth > 64 || *nfound >= 4) return;
  if (e->kind == N_NAME) {
    int i = namemap_get(&s->dim_map, e->name);
    if (i < 0) return;
    if (s->dims.data[i]->overridden) {
      for (int k = 0; k < *nfound; k++)
        if (found[k] == i) return;
      found[(*nfound)++] = i;
    } else {
      override_walk(s, s->dim_nodes.data[i]->value, depth + 1, found, nfound);
    }
    return;
  }
  override_walk(s, e->lhs, depth + 1, found, nfound);
  override_walk(s, e->rhs, depth + 1, found, nfound);
  if (e->kind == N_TUPLE)
    for (const Node *c = e->items; c; c = c->next) override_walk(s, c, depth + 1, found, nfound);
}

static const char *override_cause(Sema *s, const Node *e) {
  int found[4], n = 0;
  override_walk(s, e, 0, found, &n);
  if (n == 0) return "";
  const char *r = " (";
  for (int k = 0; k < n; k++) {
    const Dim *d = s->dims.data[found[k]];
    const Node *decl = s->dim_nodes.data[found[k]]->value;
    const char *declared = decl && decl->kind == N_NUM && !decl->num.is_float
                               ? arena_printf(s->a, "; the program declares %lld", (long long)decl->num.i) : "";
    r = arena_printf(s->a, "%s%s%s is %lld from -D %s=%lld%s", r, k ? "; " : "", d->name, (long long)d->size, d->name,
                     (long long)d->size, declared);
  }
  return arena_printf(s->a, "%s)", r);
}

/* e := number | dim | e (+ - * /) e | -e | (e). Sizes are int64: overflow, division by zero and
 * division with a remainder are errors. A dim that is itself wrong makes e wrong quietly (it was
 * reported at its declaration). */
static bool eval_int(Sema *s, const Node *e, int64_t *out, int depth) {
  if (!e) return false;
  if (depth > SEMA_MAX_DEPTH) {
    diag_error(e->loc, "expression nests too deeply (more than %d levels)", SEMA_MAX_DEPTH);
    return false;
  }
  switch (e->kind) {
  case N_NUM:
    if (e->num.is_float) {
      diag_error(e->loc, "expected a whole number, found '%.*s'", e->num.text ? e->num.text_len : 1,
                 e->num.text ? e->num.text : "?");
      return false;
    }
    *out = e->num.i;
    return true;
  case N_NAME: {
    int i = namemap_get(&s->dim_map, e->name);
    if (i < 0) {
      char sb[160];
      diag_error(e->loc, "unknown dim '%s'%s", e->name ? e->name : "?", sema_suggest_dim(s, e->name, sb, sizeof sb));
      return false;
    }
    if (!dim_resolve(s, i, depth + 1)) return false;
    if (s->dim_chain[i] > s->chain_seen) s->chain_seen = s->dim_chain[i];
    *out = s->dims.data[i]->size;
    return true;
  }
  case N_UNARY: {
    int64_t v;
    if (!eval_int(s, e->lhs, &v, depth + 1)) return false;
    if (v == INT64_MIN) {
      diag_error(e->loc, "integer overflow");
      return false;
    }
    *out = -v;
    return true;
  }
  case N_TUPLE:
    if (e->items && !e->items->next) return eval_int(s, e->items, out, depth + 1);
    diag_error(e->loc, "expected an integer expression, found a tuple");
    return false;
  case N_BINARY: {
    if (e->op == BIN_MATMUL) {
      diag_error(e->loc, "'@' has no meaning in an integer expression");
      return false;
    }
    int64_t a, b;
    bool ok_a = eval_int(s, e->lhs, &a, depth + 1);
    bool ok_b = eval_int(s, e->rhs, &b, depth + 1);
    if (!ok_a || !ok_b) return false;
    bool overflow = false;
    switch (e->op) {
    case BIN_ADD: overflow = ckd_add(out, a, b); break;
    case BIN_SUB: overflow = ckd_sub(out, a, b); break;
    case BIN_MUL: overflow = ckd_mul(out, a, b); break;
    case BIN_DIV:
      if (b == 0) {
        diag_error(e->loc, "division by zero");
        return false;
      }
      if (a == INT64_MIN && b == -1) {
        overflow = true;
        break;
      }
      if (a % b != 0) {
        diag_error(e->loc, "%lld / %lld leaves a remainder of %lld; sizes must divide evenly%s", (long long)a,
                   (long long)b, (long long)(a % b), override_cause(s, e));
        return false;
      }
      *out = a / b;
      break;
    default:
      diag_error(e->loc, "expected an integer expression");
      return false;
    }
    if (overflow) {
      diag_error(e->loc, "integer overflow (the result does not fit in 64 bits)%s", override_cause(s, e));
      return false;
    }
    return true;
  }
  default:
    diag_error(e->loc, "expected an integer expression (numbers, dims, + - * / and parentheses)");
    return false;
  }
}

/* ---- dims ---- */

/* A dim's size: its -D override, else its expression, evaluated once. A dim met again while it is
 * being evaluated closes a cycle: one error at the dim that starts it, naming the path. */
static bool dim_resolve(Sema *s, int i, int depth) {
  Dim *d = s->dims.data[i];
  switch (s->dim_state[i]) {
  case DIM_DONE: return true;
  case DIM_BAD: return false;
  case DIM_BUSY: {
    int start = s->dim_path.len - 1;
    while (start > 0 && s->dim_path.data[start] != i) start--;
    size_t len = 16;
    for (int k = start; k < s->dim_path.len; k++) len += strlen(s->dims.data[s->dim_path.data[k]]->name) + 4;
    len += strlen(d->name);
    char *path = arena_alloc(s->a, len), *q = path;
    for (int k = start; k < s->dim_path.len; k++) q += sprintf(q, "%s -> ", s->dims.data[s->dim_path.data[k]]->name);
    sprintf(q, "%s", d->name);
    diag_error(d->loc, "dim '%s' is defined in terms of itself (%s)", d->name, path);
    return false;
  }
  }
  if (s->dim_path.len >= MAX_DIM_CHAIN || depth > SEMA_MAX_DEPTH) {
    /* Reported at the dim whose evaluation started the chain, the one defined through it. */
    const Dim *top = s->dim_path.len > 0 ? s->dims.data[s->dim_path.data[0]] : d;
    diag_error(top->loc, "dim '%s' is defined through a chain of more than %d dims (%s -> ... -> %s); dims chain at "
                         "most %d deep", top->name, MAX_DIM_CHAIN, top->name, d->name, MAX_DIM_CHAIN);
    s->dim_state[i] = DIM_BAD;
    return false;
  }
  s->dim_state[i] = DIM_BUSY;
  VEC_PUSH(s->a, s->dim_path, i);
  int64_t v = 0;
  const Node *decl = s->dim_nodes.data[i];
  int outer_seen = s->chain_seen;
  s->chain_seen = 0;
  bool ok = eval_int(s, decl->value, &v, depth + 1);
  s->dim_chain[i] = s->chain_seen + 1;
  s->chain_seen = outer_seen;
  s->dim_path.len--;
  if (ok && s->dim_chain[i] > MAX_DIM_CHAIN) {
    /* Declared in order, a long chain never recurses deeply; the limit holds all the same. */
    diag_error(d->loc, "dim '%s' is defined through a chain of %d dims; dims chain at most %d deep", d->name,
               s->dim_chain[i], MAX_DIM_CHAIN);
    s->dim_state[i] = DIM_BAD;
    return false;
  }
  if (ok && v < 1) {
    diag_error(decl->value ? decl->value->loc : d->loc, "dim '%s' has size %lld; a dim's size must be at least 1%s",
               d->name, (long long)v, override_cause(s, decl->value));
    ok = false;
  } else if (ok && v > SIZE_LIMIT) {
    diag_error(decl->value ? decl->value->loc : d->loc,
               "dim '%s' has size %lld; a dim's size is at most 2^62 (%lld)%s", d->name, (long long)v,
               (long long)SIZE_LIMIT, override_cause(s, decl->value));
    ok = false;
  }
  d->size = ok ? v : 1;
  s->dim_state[i] = ok ? DIM_DONE : DIM_BAD;
  return ok;
}

/* -D name=N, applied by name before any dim is evaluated, so `dim kseq = seq` follows `-D seq=N`. */
static void dims_apply_overrides(Sema *s) {
  if (!s->opt) return;
  s->in_choices = true;
  for (int k = 0; k < s->opt->noverrides; k++) {
    const DimOverride *o = &s->opt->overrides[k];
    Name n = o->name ? intern_cstr(o->name) : NULL;
    int i = namemap_get(&s->dim_map, n);
    if (i < 0) {
      Name names[64];
      int cnt = 0;
      for (int j = 0; j < s->dims.len && cnt < 64; j++) names[cnt++] = s->dims.data[j]->name;
      char sb[160];
      sema_usage(s, arena_printf(s->a, "-D %s: the program declares no dim '%s'%s (dims: %s)", n ? n : "",
                                 n ? n : "", n ? sema_suggest_dim(s, n, sb, sizeof sb) : "",
                                 sema_join_names(s->a, names, cnt, 20)));
      continue;
    }
    if (o->size < 1) {
      sema_usage(s, arena_printf(s->a, "-D %s=%lld: a dim's size must be at least 1", n, (long long)o->size));
      continue;
    }
    if (o->size > SIZE_LIMIT) {
      sema_usage(s, arena_printf(s->a, "-D %s=%lld: a dim's size is at most 2^62 (%lld)", n, (long long)o->size,
                                 (long long)SIZE_LIMIT));
      continue;
    }
    s->dims.data[i]->size = o->size;
    s->dims.data[i]->overridden = true;
    s->dim_state[i] = DIM_DONE;
    s->dim_chain[i] = 1;
  }
  s->in_choices = false;
}

static void dims_resolve_all(Sema *s) {
  s->dim_state = ARENA_ARRAY(s->a, uint8_t, s->dims.len > 0 ? s->dims.len : 1);
  s->dim_chain = ARENA_ARRAY(s->a, int, s->dims.len > 0 ? s->dims.len : 1);
  dims_apply_overrides(s);
  for (int i = 0; i < s->dims.len; i++) dim_resolve(s, i, 0);
}

/* ---- meshes ---- */

/* mesh NAME = TARGET[axis: size, ...]: axes distinct, sizes >= 1, at most MAX_MESH_AXES. */
static Mesh *mesh_build(Sema *s, const Node *n) {
  Program *p = s->p;
  Mesh *m = ARENA_NEW(s->a, Mesh);
  m->name = n->name;
  m->loc = sema_name_loc(n);
  m->slices = 1;
  bool ok = true;
  if (!n->target || !n->target->name) {
    ok = false;
  } else if (!(m->target = program_find_target(p, n->target->name))) {
    if (p->ntargets == 0) {
      diag_error(n->target->loc, "unknown target '%s': the program declares no targets", n->target->name);
      diag_note(n->target->loc, "the stdlib declares the targets: add `import \"targets\"`");
    } else {
      Suggest sg = suggest_begin(n->target->name);
      Name names[64];
      int cnt = 0;
      for (int i = 0; i < p->ntargets; i++) {
        suggest_try(&sg, p->targets[i]->name);
        if (cnt < 64) names[cnt++] = p->targets[i]->name;
      }
      char sb[160];
      diag_error(n->target->loc, "unknown target '%s'%s (targets: %s)", n->target->name,
                 suggest_text(&sg, sb, sizeof sb), sema_join_names(s->a, names, cnt, 64));
    }
    ok = false;
  }
  for (const Node *ax = n->items; ax; ax = ax->next) {
    if (ax->kind != N_MESH_AXIS || !ax->name) {
      ok = false;
      continue;
    }
    SrcLoc loc = sema_name_loc(ax);
    int prev = mesh_axis_index(m, ax->name);
    if (prev >= 0) {
      diag_error(loc, "mesh '%s' has two axes named '%s'", m->name, ax->name);
      diag_note(m->axes[prev].loc, "the first is here");
      ok = false;
      continue;
    }
    if (m->naxes == MAX_MESH_AXES) {
      diag_error(loc, "a mesh has at most %d axes; '%s' is the %dth of mesh '%s'", MAX_MESH_AXES, ax->name,
                 MAX_MESH_AXES + 1, m->name);
      ok = false;
      break;
    }
    int64_t size = 0;
    if (!eval_int(s, ax->value, &size, 0)) {
      ok = false;
      size = 1;
    } else if (size < 1) {
      diag_error(ax->value->loc, "axis '%s' has size %lld; an axis's size must be at least 1", ax->name,
                 (long long)size);
      ok = false;
      size = 1;
    } else if (size > MESH_MAX_DEVICES) {
      diag_error(ax->value->loc, "axis '%s' has size %lld; a mesh has at most %d devices", ax->name, (long long)size,
                 MESH_MAX_DEVICES);
      ok = false;
      size = 1;
    }
    MeshAxis *a = &m->axes[m->naxes++];
    a->name = ax->name;
    a->size = (int)size;
    a->loc = loc;
    a->stride = 1;
    a->per_node = 1;
  }
  if (ok) {
    mesh_form(m);
  } else {
    m->devices = 1; /* not formed: the error is reported, later stages do not run */
    for (int i = 0; i < m->naxes; i++) m->devices = sat_mul(m->devices, m->axes[i].size);
  }
  return m;
}

/* ---- layouts ---- */

/* layout NAME { dim: axis  dim: (a, b) }: a rule naming an undeclared dim is a warning (it can
 * never apply); its axes are checked against the chosen mesh (layout_check_rules). */
static Layout *layout_build(Sema *s, const Node *n) {
  Layout *l = ARENA_NEW(s->a, Layout);
  l->name = n->name;
  l->loc = sema_name_loc(n);
  int count = 0;
  for (const Node *r = n->items; r; r = r->next) count++;
  l->rules = ARENA_ARRAY(s->a, LayoutRule, count > 0 ? count : 1);
  for (const Node *r = n->items; r; r = r->next) {
    if (r->kind != N_RULE || !r->name) continue;
    LayoutRule *rule = &l->rules[l->nrules];
    *rule = (LayoutRule){0}; /* a rule skipped before may have left its axes here */
    rule->dim = r->name;
    rule->loc = r->loc.file ? r->loc : sema_name_loc(r);
    bool ok = true;
    for (const Node *a = r->items; a; a = a->next) {
      if (a->kind != N_NAME || !a->name) {
        ok = false;
        continue;
      }
      for (int j = 0; j < rule->naxes; j++)
        if (rule->axes[j] == a->name) {
          diag_error(a->loc, "axis '%s' is named twice in the rule for '%s'", a->name, r->name);
          ok = false;
        }
      if (rule->naxes == MAX_AXES_PER_DIM) {
        diag_error(a->loc, "a rule maps a dim to at most %d axes", MAX_AXES_PER_DIM);
        ok = false;
        break;
      }
      rule->axes[rule->naxes++] = a->name;
    }
    if (!ok || rule->naxes == 0) continue;
    if (namemap_get(&s->dim_map, r->name) < 0) {
      /* A near miss of a declared dim is a typo: as a warning it would silently replicate that
       * dim (memory doubles). Other names are dims of other programs sharing the layout. */
      Suggest typo = suggest_begin(r->name);
      for (int i = 0; i < s->dims.len; i++)
        if (suggest_is_typo(r->name, s->dims.data[i]->name)) suggest_try(&typo, s->dims.data[i]->name);
      if (typo.best) {
        diag_error(sema_name_loc(r), "layout '%s' has a rule for '%s', which is not a declared dim; did you mean "
                                     "'%s'?", l->name, r->name, typo.best);
        continue;
      }
      diag_warning(sema_name_loc(r), "layout '%s' has a rule for '%s', which is not a declared dim (the rule "
                                     "does nothing here)", l->name, r->name);
    }
    l->nrules++;
  }
  return l;
}

/* ---- models ---- */

/* DTYPE[dim, dim@axis, dim@(a, b)]: every dim declared, none twice, at most MAX_RANK dims and
 * MAX_AXES_PER_DIM axes on a dim, at most SIZE_LIMIT bytes. The `@` axes are kept as names:
 * layout_apply checks them against the chosen mesh. */
static bool typespec_build(Sema *s, const Node *t, DType dt, TypeSpec *out) {
  memset(out, 0, sizeof *out);
  out->dtype = dt;
  out->loc = t->loc;
  bool ok = true;
  for (const Node *td = t->items; td; td = td->next) {
    if (td->kind != N_TYPE_DIM || !td->name) {
      ok = false;
      continue;
    }
    SrcLoc loc = sema_name_loc(td);
    if (out->rank == MAX_RANK) {
      diag_error(loc, "a tensor has at most %d dims; '%s' is the %dth", MAX_RANK, td->name, MAX_RANK + 1);
      return false;
    }
    int di = namemap_get(&s->dim_map, td->name);
    if (di < 0) {
      char sb[160];
      diag_error(loc, "unknown dim '%s'%s", td->name, sema_suggest_dim(s, td->name, sb, sizeof sb));
      ok = false;
      continue;
    }
    Dim *d = s->dims.data[di];
    bool twice = false;
    for (int k = 0; k < out->rank; k++)
      if (out->dims[k] == d) twice = true;
    if (twice) {
      diag_error(loc, "dim '%s' appears twice in this type (rename one: declare `dim k%s = %s`)", d->name, d->name,
                 d->name);
      ok = false;
      continue;
    }
    int r = out->rank++;
    out->dims[r] = d;
    out->dim_loc[r] = td->loc.file ? td->loc : loc;
    for (const Node *a = td->items; a; a = a->next) {
      if (a->kind != N_NAME || !a->name) continue;
      if (out->nat[r] == MAX_AXES_PER_DIM) {
        diag_error(a->loc, "a dim is sharded over at most %d axes; '%s' is the %dth for '%s'", MAX_AXES_PER_DIM,
                   a->name, MAX_AXES_PER_DIM + 1, d->name);
        ok = false;
        break;
      }
      out->at[r][out->nat[r]++] = a->name;
    }
  }
  if (ok) {
    const char *big = tensor_size_error(s->a, out->dims, out->rank, dt);
    if (big) {
      /* One -D can make every type of a program too large: each message is said once, at its
       * first type. */
      Name key = intern_cstr(big);
      if (namemap_get(&s->size_errors, key) < 0) diag_error(t->loc, "%s", big);
      namemap_put(s->a, &s->size_errors, key, 1);
      ok = false;
    }
  }
  return ok;
}

static Model *sema_find_model(Sema *s, Name n) {
  int i = namemap_get(&s->model_map, n);
  return i < 0 ? NULL : s->models.data[i];
}

static Model *model_use(Sema *s, Model *m);

/* param NAME: TYPE, where TYPE is a tensor (a dtype), one instance of a model (`attention`), or a
 * stack of instances (`block[layers]`, one dim, no `@`: a layout shards it). */
static bool param_build(Sema *s, const Node *n, ParamDecl *pd) {
  pd->name = n->name;
  pd->loc = sema_name_loc(n);
  const Node *t = n->type;
  if (!t || t->kind != N_TYPE || !t->name) return false;
  DType dt = dtype_from_name(t->name);
  if (dt != DT_NONE) {
    pd->kind = PARAM_TENSOR;
    return typespec_build(s, t, dt, &pd->type);
  }
  Model *m = sema_find_model(s, t->name);
  if (!m) {
    char sb[160];
    const char *sug = sema_suggest_model(s, t->name, sb, sizeof sb);
    if (!*sug) sug = sema_suggest_dtype(t->name, sb, sizeof sb);
    diag_error(sema_name_loc(t), "unknown type '%s'%s (a dtype: f32 bf16 f16 f8e4m3 f8e5m2 i32 i8, or a model)", t->name, sug);
    return false;
  }
  if (s->model_depth >= SEMA_BUILD_DEPTH) {
    /* Building goes no deeper (its recursion is bounded); models_check_depth reports chains
     * deeper than MAX_MODEL_DEPTH that stop short of this. */
    if (!s->reported_depth)
      diag_error(sema_name_loc(t), "models nest at most %d deep; this param holds model '%s' %d levels down",
                 MAX_MODEL_DEPTH, m->name, s->model_depth + 1);
    s->reported_depth = true;
    return false;
  }
  pd->model = model_use(s, m);
  if (!t->flag && !t->items) {
    pd->kind = PARAM_MODEL;
    return true;
  }
  pd->kind = PARAM_STACK;
  const Node *td = t->items;
  if (!td || td->next || td->kind != N_TYPE_DIM || !td->name) {
    diag_error(t->loc, "a stack of '%s' takes exactly one dim, the number of copies: %s[layers]", m->name, m->name);
    return false;
  }
  if (td->items || td->flag) {
    diag_error(sema_name_loc(td), "a stacking dim takes no '@'; shard it with a layout rule (%s: stage)", td->name);
    return false;
  }
  int di = namemap_get(&s->dim_map, td->name);
  if (di < 0) {
    char sb[160];
    diag_error(sema_name_loc(td), "unknown dim '%s'%s", td->name, sema_suggest_dim(s, td->name, sb, sizeof sb));
    return false;
  }
  pd->stack_dim = s->dims.data[di];
  return true;
}

/* A function boundary type: a tensor, never a model. */
static bool boundary_type(Sema *s, const Node *t, const char *what, Name name, TypeSpec *out) {
  if (!t || t->kind != N_TYPE || !t->name) return false;
  DType dt = dtype_from_name(t->name);
  if (dt == DT_NONE) {
    char sb[160];
    if (sema_find_model(s, t->name))
      diag_error(sema_name_loc(t), "%s '%s' must be a tensor; '%s' is a model", what, name, t->name);
    else
      diag_error(sema_name_loc(t), "unknown type '%s'%s (a dtype: f32 bf16 f16 f8e4m3 f8e5m2 i32 i8)", t->name,
                 sema_suggest_dtype(t->name, sb, sizeof sb));
    memset(out, 0, sizeof *out);
    out->dtype = DT_NONE;
    return false;
  }
  return typespec_build(s, t, dt, out);
}

/* fn NAME(arg: TYPE, ...) -> TYPE { ... }: distinct argument names, tensor types. */
static void fn_build(Sema *s, Model *owner, const Node *n, FnDecl *f) {
  f->name = n->name;
  f->loc = sema_name_loc(n);
  f->model = owner;
  f->ast = n;
  int count = 0;
  for (const Node *a = n->items; a; a = a->next) count++;
  f->args = ARENA_ARRAY(s->a, FnArg, count > 0 ? count : 1);
  for (const Node *a = n->items; a; a = a->next) {
    if (a->kind != N_FN_ARG || !a->name) continue;
    SrcLoc loc = sema_name_loc(a);
    int prev = -1;
    for (int k = 0; k < f->nargs; k++)
      if (f->args[k].name == a->name) prev = k;
    if (prev >= 0) {
      sema_duplicate("argument", a->name, loc, f->args[prev].loc);
      continue;
    }
    FnArg *arg = &f->args[f->nargs++];
    arg->name = a->name;
    arg->loc = loc;
    if (!a->type) {
      diag_error(loc, "argument '%s' needs a type, as in %s: bf16[batch, embed]", a->name, a->name);
      arg->type.dtype = DT_NONE;
      continue;
    }
    boundary_type(s, a->type, "argument", a->name, &arg->type);
  }
  if (!n->type) {
    diag_error(f->loc, "function '%s' needs a result type: fn %s(...) -> bf16[...]", f->name, f->name);
    f->ret.dtype = DT_NONE;
  } else {
    boundary_type(s, n->type, "the result of", f->name, &f->ret);
  }
}

/* A model's params and functions share one namespace (`attn.wq`, `b.forward`). */
static void model_build(Sema *s, Model *m, const Node *n) {
  int np = 0, nf = 0;
  for (const Node *it = n->items; it; it = it->next) {
    if (it->kind == N_PARAM) np++;
    else if (it->kind == N_FN) nf++;
  }
  m->params = ARENA_ARRAY(s->a, ParamDecl, np > 0 ? np : 1);
  m->fns = ARENA_ARRAY(s->a, FnDecl, nf > 0 ? nf : 1);
  NameMap seen = {0};     /* name -> index into `locs` */
  VEC(SrcLoc) locs = {0};
  for (const Node *it = n->items; it; it = it->next) {
    if ((it->kind != N_PARAM && it->kind != N_FN) || !it->name) continue;
    SrcLoc loc = sema_name_loc(it);
    int prev = namemap_get(&seen, it->name);
    if (prev >= 0) {
      sema_duplicate(it->kind == N_PARAM ? "param" : "function", it->name, loc, locs.data[prev]);
      continue;
    }
    namemap_put(s->a, &seen, it->name, locs.len);
    VEC_PUSH(s->a, locs, loc);
    DType dt = it->kind == N_FN ? dtype_from_name(it->name) : DT_NONE;
    if (dt != DT_NONE) { /* a call `f8(x)` is a cast: the function could never be called */
      diag_error(loc, "'%s' is a dtype and cannot name a function (a call %s(x) converts x to %s)", it->name, it->name,
                 dtype_name(dt));
      continue;
    }
    if (it->kind == N_PARAM) {
      param_build(s, it, &m->params[m->nparams++]);
    } else {
      fn_build(s, m, it, &m->fns[m->nfns++]);
    }
  }
}

/* Models are checked when the program uses them: every model of the main file, the models they
 * hold, the models of steps and the entry. A model of an imported file that nothing uses is built
 * quietly at the end (stdlib/layers.shard's models use dims only the programs that use them
 * declare). MODEL_USED: built with diagnostics; a model being built counts as built, so a model
 * holding itself ends here and is reported by the cycle check. */
static Model *model_use(Sema *s, Model *m) {
  int i = namemap_get(&s->model_map, m->name);
  if (i < 0 || s->model_built.data[i] != MODEL_UNBUILT) return m;
  s->model_built.data[i] = s->quiet ? MODEL_QUIET : MODEL_USED;
  s->model_depth++;
  model_build(s, m, s->model_nodes.data[i]);
  s->model_depth--;
  return m;
}

static void models_build_unused(Sema *s) {
  s->quiet = true;
  diag_push_quiet();
  for (int i = 0; i < s->models.len; i++) model_use(s, s->models.data[i]);
  diag_pop_quiet();
  s->quiet = false;
}

/* A model may not contain itself, directly or through the models it holds: its instances would
 * never end. Depth-first over the PARAM_MODEL / PARAM_STACK edges; one error per cycle, at the
 * param that closes it. */
static void model_check_cycles_from(Sema *s, int i, uint8_t *color, IntVec *path) {
  color[i] = 1;
  VEC_PUSH(s->a, *path, i);
  Model *m = s->models.data[i];
  for (int k = 0; k < m->nparams; k++) {
    ParamDecl *pd = &m->params[k];
    if (pd->kind == PARAM_TENSOR || !pd->model) continue;
    int j = namemap_get(&s->model_map, pd->model->name);
    if (j < 0) continue;
    if (color[j] == 1) {
      int start = path->len - 1;
      while (start > 0 && path->data[start] != j) start--;
      size_t len = 16;
      for (int q = start; q < path->len; q++) len += strlen(s->models.data[path->data[q]]->name) + 4;
      len += strlen(pd->model->name);
      char *text = arena_alloc(s->a, len), *q = text;
      for (int r = start; r < path->len; r++) q += sprintf(q, "%s -> ", s->models.data[path->data[r]]->name);
      sprintf(q, "%s", pd->model->name);
      diag_error(pd->loc, "model '%s' contains itself (%s)", pd->model->name, text);
      pd->model = NULL; /* later stages never follow the cycle */
    } else if (color[j] == 0) {
      model_check_cycles_from(s, j, color, path);
    }
  }
  path->len--;
  color[i] = 2;
}

static void models_check_cycles(Sema *s) {
  uint8_t *color = ARENA_ARRAY(s->a, uint8_t, s->models.len > 0 ? s->models.len : 1);
  IntVec path = {0};
  for (int i = 0; i < s->models.len; i++)
    if (!color[i] && s->model_built.data[i] == MODEL_USED) model_check_cycles_from(s, i, color, &path);
}

/* The longest chain of models held one inside another starting at model i (i itself counted), by
 * memo (0: not yet). After models_check_cycles there are no cycles among used models. */
static int model_height(Sema *s, int i, int *height) {
  if (height[i] > 0) return height[i];
  height[i] = 1; /* guards against a cycle the check left (models built quietly) */
  int h = 1;
  const Model *m = s->models.data[i];
  for (int k = 0; k < m->nparams; k++) {
    const ParamDecl *pd = &m->params[k];
    if (pd->kind == PARAM_TENSOR || !pd->model) continue;
    int j = namemap_get(&s->model_map, pd->model->name);
    if (j >= 0 && 1 + model_height(s, j, height) > h) h = 1 + model_height(s, j, height);
  }
  return height[i] = h;
}

/* Models nest at most MAX_MODEL_DEPTH deep (the IR flattens their params into paths): one error,
 * at the outermost param of the deepest chain, naming the chain. */
static void models_check_depth(Sema *s) {
  if (s->reported_depth || s->models.len == 0) return;
  int *height = ARENA_ARRAY(s->a, int, s->models.len);
  int worst = -1;
  for (int i = 0; i < s->models.len; i++)
    if (s->model_built.data[i] == MODEL_USED && model_height(s, i, height) > MAX_MODEL_DEPTH &&
        (worst < 0 || height[i] > height[worst]))
      worst = i;
  if (worst < 0) return;
  /* Follow the tallest child down, writing the chain (its first 4 and last 2 models). */
  char chain[512];
  size_t n = 0;
  SrcLoc at = {0};
  int depth = height[worst];
  for (int i = worst, level = 0; i >= 0; level++) {
    const Model *m = s->models.data[i];
    if (level < 4 || level >= depth - 2)
      n += (size_t)snprintf(chain + n, n < sizeof chain ? sizeof chain - n : 0, "%s%s", level ? " -> " : "", m->name);
    else if (level == 4)
      n += (size_t)snprintf(chain + n, n < sizeof chain ? sizeof chain - n : 0, " -> ...");
    if (n >= sizeof chain) n = sizeof chain - 1;
    int next = -1;
    for (int k = 0; k < m->nparams; k++) {
      const ParamDecl *pd = &m->params[k];
      int j = pd->kind != PARAM_TENSOR && pd->model ? namemap_get(&s->model_map, pd->model->name) : -1;
      if (j >= 0 && height[j] == height[i] - 1) {
        if (level == 0) at = pd->loc;
        next = j;
        break;
      }
    }
    i = next;
  }
  diag_error(at, "model '%s' holds models nested %d deep (%s); models nest at most %d deep",
             s->models.data[worst]->name, depth, chain, MAX_MODEL_DEPTH);
}

/* The dims a model's params carry, its held models' included (stacking dims too), as bits over
 * the program's dims, by memo. */
static const uint8_t *model_dims_below(Sema *s, int i, uint8_t **memo) {
  if (memo[i]) return memo[i];
  int bytes = (s->dims.len + 7) / 8 + 1;
  uint8_t *set = memo[i] = ARENA_ARRAY(s->a, uint8_t, bytes);
  const Model *m = s->models.data[i];
  for (int k = 0; k < m->nparams; k++) {
    const ParamDecl *pd = &m->params[k];
    if (pd->kind == PARAM_TENSOR) {
      for (int r = 0; r < pd->type.rank; r++)
        if (pd->type.dims[r]) set[pd->type.dims[r]->id / 8] |= (uint8_t)(1u << (pd->type.dims[r]->id % 8));
      continue;
    }
    if (pd->kind == PARAM_STACK && pd->stack_dim)
      set[pd->stack_dim->id / 8] |= (uint8_t)(1u << (pd->stack_dim->id % 8));
    int j = pd->model ? namemap_get(&s->model_map, pd->model->name) : -1;
    if (j < 0 || j == i) continue;
    const uint8_t *below = model_dims_below(s, j, memo);
    for (int b = 0; b < bytes; b++) set[b] |= below[b];
  }
  return set;
}

/* The path to a param of model m (or of a model it holds) that carries dim d ("blk.w"), into buf. */
static bool find_dim_path(const Model *m, const Dim *d, char *buf, size_t size, int depth) {
  if (!m || depth > MAX_MODEL_DEPTH) return false;
  for (int k = 0; k < m->nparams; k++) {
    const ParamDecl *pd = &m->params[k];
    bool here = pd->kind == PARAM_STACK && pd->stack_dim == d;
    for (int r = 0; pd->kind == PARAM_TENSOR && r < pd->type.rank; r++) here |= pd->type.dims[r] == d;
    size_t n = strlen(buf);
    snprintf(buf + n, size - n, "%s%s", n ? "." : "", pd->name);
    if (here || (pd->kind != PARAM_TENSOR && find_dim_path(pd->model, d, buf, size, depth + 1))) return true;
    buf[n] = '\0';
  }
  return false;
}

/* A stack's instances carry its stacking dim first, so `param bs: inner[layers]` where `inner`
 * already has a `layers` (its own stack over layers, or a param of that dim) would give a tensor
 * the same dim twice, which language.md forbids: an error at the stack. */
static void models_check_stacks(Sema *s) {
  if (s->models.len == 0) return;
  uint8_t **memo = ARENA_ARRAY(s->a, uint8_t *, s->models.len);
  for (int i = 0; i < s->models.len; i++) {
    if (s->model_built.data[i] != MODEL_USED) continue;
    const Model *m = s->models.data[i];
    for (int k = 0; k < m->nparams; k++) {
      const ParamDecl *pd = &m->params[k];
      if (pd->kind != PARAM_STACK || !pd->model || !pd->stack_dim) continue;
      int j = namemap_get(&s->model_map, pd->model->name);
      if (j < 0) continue;
      int id = pd->stack_dim->id;
      if (!(model_dims_below(s, j, memo)[id / 8] & (1u << (id % 8)))) continue;
      char path[256] = "";
      find_dim_path(pd->model, pd->stack_dim, path, sizeof path, 0);
      diag_error(pd->loc, "param '%s' stacks '%s' over '%s', but '%s' already has a dim '%s' (%s.%s): a tensor "
                          "would have it twice; stack over a dim of its own (declare `dim k%s = %s`)",
                 pd->name, pd->model->name, pd->stack_dim->name, pd->model->name, pd->stack_dim->name, pd->name, path,
                 pd->stack_dim->name, pd->stack_dim->name);
    }
  }
}

/* Every name an expression or statement list mentions, into set. */
static void collect_names(Sema *s, const Node *n, NameMap *set) {
  for (; n; n = n->next) {
    if (n->kind == N_NAME && n->name) namemap_put(s->a, set, n->name, 1);
    collect_names(s, n->lhs, set);
    collect_names(s, n->rhs, set);
    collect_names(s, n->value, set);
    collect_names(s, n->items, set);
    collect_names(s, n->body, set);
  }
}

/* A param that no function of its model mentions can never be read (a model's params are reached
 * only through its own functions): a warning at the param, since it still costs memory. */
static void models_check_unused_params(Sema *s) {
  for (int i = 0; i < s->models.len; i++) {
    if (s->model_built.data[i] != MODEL_USED) continue;
    const Model *m = s->models.data[i];
    NameMap used = {0};
    for (int f = 0; f < m->nfns; f++)
      if (m->fns[f].ast) collect_names(s, m->fns[f].ast->body, &used);
    for (int k = 0; k < m->nparams; k++)
      if (m->params[k].name && namemap_get(&used, m->params[k].name) < 0)
        diag_warning(m->params[k].loc, "param '%s' is never read: no function of model '%s' uses it (it still "
                                       "takes memory)", m->params[k].name, m->name);
  }
}

/* ---- steps ---- */

_Static_assert(SK__COUNT <= 16, "Step.key_loc has room for 16 keys");

static const char *const step_key_names[] = {
#define X(e, k) [e] = k,
  STEP_KEYS(X)
#undef X
};

/* The index of word w among the NULL-terminated words, or -1. */
static int word_index(Name w, const char *const *words) {
  if (!w) return -1;
  for (int i = 0; words[i]; i++)
    if (strcmp(w, words[i]) == 0) return i;
  return -1;
}

/* `model.fn` (or a model with one function) as written after `train` / `serve`. */
static FnDecl *step_fn(Sema *s, const Node *v) {
  if (!v) return NULL;
  char sb[160];
  if (v->kind == N_MEMBER && v->lhs && v->lhs->kind == N_NAME && v->name) {
    Model *m = sema_find_model(s, v->lhs->name);
    if (!m) {
      diag_error(v->lhs->loc, "unknown model '%s'%s", v->lhs->name, sema_suggest_model(s, v->lhs->name, sb, sizeof sb));
      return NULL;
    }
    model_use(s, m);
    FnDecl *f = model_find_fn(m, v->name);
    if (!f) {
      Name names[32];
      int n = 0;
      Suggest sg = suggest_begin(v->name);
      for (int i = 0; i < m->nfns; i++) {
        suggest_try(&sg, m->fns[i].name);
        if (n < 32) names[n++] = m->fns[i].name;
      }
      diag_error(sema_name_loc(v), "model '%s' has no function '%s'%s (its functions: %s)", m->name, v->name,
                 suggest_text(&sg, sb, sizeof sb), sema_join_names(s->a, names, n, 32));
    }
    return f;
  }
  if (v->kind == N_NAME && v->name) {
    Model *m = sema_find_model(s, v->name);
    if (!m) {
      diag_error(v->loc, "unknown model '%s'%s", v->name, sema_suggest_model(s, v->name, sb, sizeof sb));
      return NULL;
    }
    model_use(s, m);
    if (m->nfns == 1) return &m->fns[0];
    diag_error(v->loc, "model '%s' has %d functions; name one: %s.fn", m->name, m->nfns, m->name);
    return NULL;
  }
  diag_error(v->loc, "expected the function to train, as in `train model.forward { ... }`");
  return NULL;
}

static const char *const loss_words[] = {"cross_entropy", "mse", NULL};
static const char *const optim_words[] = {"sgd", "adam", NULL};
static const char *const remat_words[] = {"none", "full", "dots", "selective", NULL};
static const char *const onoff_words[] = {"off", "on", NULL};

/* One `key = value` of a train step (keys: STEP_KEYS; language.md fixes them and their values). */
static void step_key(Sema *s, Step *st, StepKey k, const Node *v) {
  Name w = sema_kv_word(v);
  bool is_word = w && v->kind != N_NUM;
  switch (k) {
  case SK_LOSS: {
    int i = is_word ? word_index(w, loss_words) : -1;
    if (i < 0) diag_error(v->loc, "'loss' must be cross_entropy or mse");
    else st->loss = i == 0 ? LOSS_CROSS_ENTROPY : LOSS_MSE;
    break;
  }
  case SK_OPTIMIZER: {
    int i = is_word ? word_index(w, optim_words) : -1;
    if (i < 0) diag_error(v->loc, "'optimizer' must be adam or sgd");
    else st->optimizer = i == 0 ? OPT_SGD : OPT_ADAM;
    break;
  }
  case SK_MASTER:
    if (is_word && strcmp(w, "f32") == 0) st->master = DT_F32;
    else diag_error(v->loc, "'master' must be f32 (the dtype of the master copy)");
    break;
  case SK_REMAT: {
    int i = is_word ? word_index(w, remat_words) : -1;
    if (i < 0) diag_error(v->loc, "'remat' must be none, full, dots or selective");
    else st->remat = i == 0 ? REMAT_NONE : i == 1 ? REMAT_FULL : i == 2 ? REMAT_DOTS : REMAT_SELECTIVE;
    break;
  }
  case SK_MICROBATCHES: {
    int64_t n = 0;
    if (!eval_int(s, v, &n, 0)) break;
    if (n < 1 || n > INT_MAX)
      diag_error(v->loc, "'microbatches' must be from 1 to %d (found %lld)", INT_MAX, (long long)n);
    else st->microbatches = (int)n;
    break;
  }
  case SK_SCHEDULE:
    if (w && strcmp(w, "gpipe") == 0) {
      st->schedule = SCHED_GPIPE;
    } else if (w && strcmp(w, "1f1b") == 0) {
      st->schedule = SCHED_1F1B;
    } else if (v->kind == N_CALL && v->lhs && v->lhs->kind == N_NAME && v->lhs->name &&
               strcmp(v->lhs->name, "interleaved") == 0) {
      const Node *arg = v->items;
      double d;
      bool is_int;
      int64_t iv;
      if (!arg || arg->next || !sema_kv_number(arg, &d, &is_int, &iv) || !is_int || iv < 1 || iv > 1024) {
        diag_error(v->loc, "interleaved(V) takes the number of virtual stages per device, a whole number from 1 "
                           "to 1024");
      } else {
        st->schedule = SCHED_INTERLEAVED;
        st->interleave = (int)iv;
      }
    } else {
      diag_error(v->loc, "'schedule' must be gpipe, 1f1b or interleaved(V)");
    }
    break;
  case SK_LR: {
    double d;
    bool is_int;
    int64_t iv;
    if (!sema_kv_number(v, &d, &is_int, &iv) || !(d > 0) || d > 1e30)
      diag_error(v->loc, "'lr' must be a number greater than 0");
    else st->lr = d;
    break;
  }
  case SK_ZERO: {
    double d;
    bool is_int;
    int64_t iv;
    if (!sema_kv_number(v, &d, &is_int, &iv) || !is_int || iv < 0 || iv > 2)
      diag_error(v->loc, "'zero' must be 1 or 2 (or 0: no ZeRO sharding)");
    else st->zero = (int)iv;
    break;
  }
  case SK_TP_OVERLAP:
  case SK_DP_OVERLAP: {
    int i = is_word ? word_index(w, onoff_words) : -1;
    if (i < 0) diag_error(v->loc, "'%s' must be on or off", step_key_names[k]);
    else if (k == SK_TP_OVERLAP) st->tp_overlap = i == 1;
    else st->dp_overlap = i == 1;
    break;
  }
  case SK_GRAD_REDUCE: {
    DType dt = is_word ? dtype_from_name(w) : DT_NONE;
    if (dt != DT_F32 && dt != DT_BF16 && dt != DT_F16)
      diag_error(v->loc, "'grad_reduce' must be f32, bf16 or f16 (the dtype gradients are reduced in)");
    else st->grad_reduce = dt;
    break;
  }
  case SK_STAGE_LAYERS: {
    int n = 0;
    for (const Node *it = v->kind == N_LIST ? v->items : NULL; it; it = it->next) n++;
    if (v->kind != N_LIST || n == 0) {
      diag_error(v->loc, "'stage_layers' takes a list of layers per pipeline stage, as in [7, 8, 8, 7]");
      break;
    }
    int *L = ARENA_ARRAY(s->a, int, n);
    int i = 0;
    bool ok = true;
    for (const Node *it = v->items; it; it = it->next, i++) {
      int64_t x = 0;
      if (!eval_int(s, it, &x, 0)) {
        ok = false;
        continue;
      }
      if (x < 0 || x > INT_MAX) {
        diag_error(it->loc, "a stage's layers must be from 0 to %d (found %lld)", INT_MAX, (long long)x);
        ok = false;
        continue;
      }
      L[i] = (int)x;
    }
    if (ok) st->stage_layers = L, st->nstage_layers = n;
    break;
  }
  case SK__COUNT:
    break;
  }
}

/* train model.fn { key = value ... }: known keys once each, loss and optimizer required. A serve
 * step is recorded with its function; its keys are not read (compiling it is not implemented). */
static Step *sema_step(Sema *s, const Node *n) {
  Step *st = ARENA_NEW(s->a, Step);
  st->kind = n->flag == STEP_SERVE ? STEP_SERVE : STEP_TRAIN;
  st->loc = n->value && n->value->loc.file ? n->value->loc : n->loc;
  st->ast = n;
  st->master = DT_NONE;
  st->remat = REMAT_NONE;
  st->microbatches = 1;
  st->schedule = SCHED_1F1B;
  st->interleave = 1;
  st->tp_overlap = true; /* language.md: on by default, as published configurations run */
  st->dp_overlap = true;
  st->grad_reduce = DT_NONE;
  st->fn = step_fn(s, n->value);
  if (st->kind == STEP_SERVE) return st;

  const Node *first[SK__COUNT] = {0};
  for (const Node *kv = n->kvs; kv; kv = kv->next) {
    if (kv->kind != N_KV || !kv->name || !kv->value) continue;
    int k = 0;
    while (k < SK__COUNT && strcmp(step_key_names[k], kv->name) != 0) k++;
    SrcLoc loc = sema_name_loc(kv);
    if (k == SK__COUNT) {
      Suggest sg = suggest_begin(kv->name);
      for (int j = 0; j < SK__COUNT; j++) suggest_try(&sg, step_key_names[j]);
      char sb[160];
      diag_error(loc, "unknown train key '%s'%s (valid keys: loss, optimizer, master, remat, microbatches, "
                      "schedule, lr, zero, stage_layers, tp_overlap, dp_overlap, grad_reduce)", kv->name,
                 suggest_text(&sg, sb, sizeof sb));
      continue;
    }
    if (first[k]) {
      sema_duplicate("train key", kv->name, loc, sema_name_loc(first[k]));
      continue;
    }
    first[k] = kv;
    st->key_loc[k] = loc;
    step_key(s, st, (StepKey)k, kv->value);
  }
  if (!first[SK_LOSS]) diag_error(st->loc, "train step needs 'loss = cross_entropy' or 'loss = mse'");
  if (!first[SK_OPTIMIZER]) diag_error(st->loc, "train step needs 'optimizer = adam' or 'optimizer = sgd'");
  if (!first[SK_LR]) st->lr = st->optimizer == OPT_SGD ? 1e-2 : 1e-3;

  /* The microbatches split the global `batch`; whether the slices divide over the axes that shard
   * `batch` is checked once the mesh and layout are chosen (sema_check_microbatches). */
  if (first[SK_MICROBATCHES] && st->microbatches > 1) {
    int bi = namemap_get(&s->dim_map, intern_cstr("batch"));
    SrcLoc loc = first[SK_MICROBATCHES]->value->loc;
    if (bi < 0) {
      diag_error(loc, "microbatches split the dim 'batch', and the program declares none");
    } else if (s->dim_state[bi] == DIM_DONE && s->dims.data[bi]->size % st->microbatches != 0) {
      diag_error(loc, "microbatches = %d does not divide dim 'batch' (%lld)", st->microbatches,
                 (long long)s->dims.data[bi]->size);
    }
  }
  return st;
}

/* ---- choices: --mesh, --layout, --entry and their defaults ---- */

static void choose_all(Sema *s);

static void choose(Sema *s) {
  s->in_choices = true;
  choose_all(s);
  s->in_choices = false;
}

static void choose_all(Sema *s) {
  Program *p = s->p;
  const SemaOptions *o = s->opt;
  Name names[64];
  int n;
  char sb[160];
  Suggest sg;

  if (o && o->mesh) {
    p->mesh = program_find_mesh(p, intern_cstr(o->mesh));
    if (!p->mesh) {
      sg = suggest_begin(o->mesh);
      for (int i = 0; i < p->nmeshes; i++) suggest_try(&sg, p->meshes[i]->name);
      for (n = 0; n < p->nmeshes && n < 64; n++) names[n] = p->meshes[n]->name;
      sema_usage(s, arena_printf(s->a, "--mesh %s: no such mesh%s (meshes: %s)", o->mesh,
                                 suggest_text(&sg, sb, sizeof sb), sema_join_names(s->a, names, n, 64)));
    }
  } else if (p->nmeshes > 0) {
    p->mesh = p->meshes[0];
  }

  if (o && o->layout) {
    p->layout = program_find_layout(p, intern_cstr(o->layout));
    if (!p->layout) {
      sg = suggest_begin(o->layout);
      for (int i = 0; i < p->nlayouts; i++) suggest_try(&sg, p->layouts[i]->name);
      for (n = 0; n < p->nlayouts && n < 64; n++) names[n] = p->layouts[n]->name;
      sema_usage(s, arena_printf(s->a, "--layout %s: no such layout%s (layouts: %s)", o->layout,
                                 suggest_text(&sg, sb, sizeof sb), sema_join_names(s->a, names, n, 64)));
    }
  } else if (p->nlayouts > 0) {
    p->layout = p->layouts[0];
  }

  if (o && o->entry) {
    const char *dot = strchr(o->entry, '.');
    if (!dot || dot == o->entry || !dot[1] || strchr(dot + 1, '.')) {
      sema_usage(s, arena_printf(s->a, "--entry %s: expected model.fn, as in --entry llama.forward", o->entry));
      return;
    }
    Name mn = intern(o->entry, (size_t)(dot - o->entry)), fnn = intern_cstr(dot + 1);
    Model *m = program_find_model(p, mn);
    if (!m) {
      for (n = 0; n < p->nmodels && n < 64; n++) names[n] = p->models[n]->name;
      sema_usage(s, arena_printf(s->a, "--entry %s: no model '%s'%s (models: %s)", o->entry, mn,
                                 sema_suggest_model(s, mn, sb, sizeof sb), sema_join_names(s->a, names, n, 64)));
      return;
    }
    p->entry = model_find_fn(model_use(s, m), fnn);
    if (!p->entry) {
      sg = suggest_begin(fnn);
      for (int i = 0; i < m->nfns; i++) suggest_try(&sg, m->fns[i].name);
      for (n = 0; n < m->nfns && n < 64; n++) names[n] = m->fns[n].name;
      sema_usage(s, arena_printf(s->a, "--entry %s: model '%s' has no function '%s'%s (its functions: %s)", o->entry,
                                 mn, fnn, suggest_text(&sg, sb, sizeof sb), sema_join_names(s->a, names, n, 64)));
    }
    return;
  }

  /* Without --entry: the train step; else a serve step (the driver says it cannot compile one
   * yet); else the only function of the last model of the main file (of the program, if the
   * main file declares none); several functions there are an error asking for --entry. */
  Step *serve = NULL;
  for (int i = 0; i < p->nsteps; i++) {
    if (p->steps[i]->kind == STEP_TRAIN && !p->step) p->step = p->steps[i];
    if (p->steps[i]->kind == STEP_SERVE && !serve) serve = p->steps[i];
  }
  if (!p->step) p->step = serve;
  if (p->step) {
    p->entry = p->step->fn;
    return;
  }
  Model *last = NULL;
  for (int i = 0; i < s->models.len; i++)
    if (s->model_in_main.data[i]) last = s->models.data[i];
  if (!last && s->models.len > 0) last = s->models.data[s->models.len - 1];
  if (!last || model_use(s, last)->nfns == 0) return;
  if (last->nfns == 1) {
    p->entry = &last->fns[0];
    return;
  }
  for (n = 0; n < last->nfns && n < 64; n++) names[n] = last->fns[n].name;
  diag_error(last->loc, "model '%s' has several functions (%s) and the program has no train step: choose one "
             "with --entry %s.%s", last->name, sema_join_names(s->a, names, n, 64), last->name, last->fns[0].name);
}

/* ---- boundary types against the chosen mesh and layout ---- */

/* A spec over a dim whose own declaration is wrong (its size a placeholder) is not checked: its
 * divisibility would be a second, misleading report. */
static void check_spec(Sema *s, const TypeSpec *t) {
  if (t->dtype == DT_NONE) return;
  for (int i = 0; i < t->rank; i++)
    if (!t->dims[i] || s->dim_state[t->dims[i]->id] != DIM_DONE) return;
  Sharding sh;
  layout_apply(s->p, t, &sh, NULL);
}

/* Every boundary type of a model and the models it holds, once each. */
static void check_model_specs(Sema *s, const Model *m, uint8_t *done) {
  int i = namemap_get(&s->model_map, m->name);
  if (i < 0 || done[i]) return;
  done[i] = 1;
  for (int k = 0; k < m->nparams; k++) {
    const ParamDecl *pd = &m->params[k];
    if (pd->kind == PARAM_TENSOR) check_spec(s, &pd->type);
    else if (pd->model) check_model_specs(s, pd->model, done);
  }
  for (int k = 0; k < m->nfns; k++) {
    for (int a = 0; a < m->fns[k].nargs; a++) check_spec(s, &m->fns[k].args[a].type);
    check_spec(s, &m->fns[k].ret);
  }
}

/* batch / microbatches must divide by the product of the axes that shard `batch` in the step's
 * inputs and in its labels, which are sharded like the output (language.md: each microbatch is
 * sharded as `batch` is). */
static void check_microbatches(Sema *s) {
  Program *p = s->p;
  Step *st = p->step;
  if (!st || st->kind != STEP_TRAIN || !st->fn || st->microbatches <= 1 || !p->mesh) return;
  Dim *batch = program_find_dim(p, intern_cstr("batch"));
  if (!batch || batch->size % st->microbatches != 0) return;
  int64_t rows = batch->size / st->microbatches;
  /* the arguments, and the return type: the labels are sharded like the output */
  for (int a = 0; a <= st->fn->nargs; a++) {
    const TypeSpec *t = a < st->fn->nargs ? &st->fn->args[a].type : &st->fn->ret;
    Sharding sh;
    if (t->dtype == DT_NONE || !layout_apply(p, t, &sh, NULL)) continue;
    for (int d = 0; d < t->rank; d++) {
      if (t->dims[d] != batch || sh.naxes[d] == 0) continue;
      int64_t product = 1;
      char axes[256];
      size_t used = 0;
      axes[0] = 0;
      for (int j = 0; j < sh.naxes[d]; j++) {
        const MeshAxis *ax = &p->mesh->axes[sh.axes[d][j]];
        product *= ax->size;
        used += (size_t)snprintf(axes + used, used < sizeof axes ? sizeof axes - used : 0, "%s%s", j ? ", " : "",
                                 ax->name);
        if (used >= sizeof axes) used = sizeof axes - 1;
      }
      if (rows % product != 0) {
        diag_error(st->key_loc[SK_MICROBATCHES].file ? st->key_loc[SK_MICROBATCHES] : st->loc,
                   "each of the %d microbatches holds %lld rows of 'batch' (%lld), which do not divide over the "
                   "axes that shard it (%s: %lld)",
                   st->microbatches, (long long)rows, (long long)batch->size, axes, (long long)product);
        return;
      }
    }
  }
}

/* The first stacked param of model m, or of a model it holds (not through stacks), whose stacking
 * dim the layout shards on p->mesh: its mesh axes' product into *stages. NULL if none. */
static const ParamDecl *find_pipeline(const Program *p, const Model *m, int64_t *stages, int depth) {
  if (!m || depth > MAX_MODEL_DEPTH) return NULL;
  for (int k = 0; k < m->nparams; k++) {
    const ParamDecl *pd = &m->params[k];
    if (pd->kind == PARAM_STACK && pd->stack_dim) {
      /* The stacking dim alone, as the layout shards the leading dim of the stack's params. */
      TypeSpec t = {.dtype = DT_F32, .rank = 1, .dims = {pd->stack_dim}, .loc = pd->loc};
      Sharding sh;
      layout_apply(p, &t, &sh, NULL);
      if (sh.naxes[0] > 0) {
        *stages = 1;
        for (int j = 0; j < sh.naxes[0]; j++) *stages = sat_mul(*stages, p->mesh->axes[sh.axes[0][j]].size);
        if (*stages > 1) return pd;
      }
    }
    if (pd->kind == PARAM_MODEL) {
      const ParamDecl *in = find_pipeline(p, pd->model, stages, depth + 1);
      if (in) return in;
    }
  }
  return NULL;
}

/* `schedule` orders a pipeline's microbatches, so it needs a pipeline: a layout rule sharding a
 * stacking dim of the step's model (`layers: stage`) on the chosen mesh. Without one it does
 * nothing, which is a warning. With one, interleaved(V) cuts each stage's share of the layers into
 * V chunks: V must divide the layers per stage (stacking dim / stages), an error otherwise. */
static void check_schedule(Sema *s) {
  Program *p = s->p;
  const Step *st = p->step;
  if (!st || st->kind != STEP_TRAIN || !st->fn || !st->key_loc[SK_SCHEDULE].file || !p->mesh) return;
  const Node *value = NULL;
  for (const Node *kv = st->ast ? st->ast->kvs : NULL; kv; kv = kv->next)
    if (kv->kind == N_KV && kv->name && strcmp(kv->name, "schedule") == 0 && !value) value = kv->value;
  SrcLoc at = value ? value->loc : st->key_loc[SK_SCHEDULE];
  int64_t stages = 1;
  const ParamDecl *pipe = find_pipeline(p, st->fn->model, &stages, 0);
  if (!pipe) {
    diag_warning(st->key_loc[SK_SCHEDULE],
                 "'schedule' does nothing here: no pipeline, since layout '%s' shards no stacking dim of model "
                 "'%s' on mesh '%s' (a pipeline shards one, as in `layers: stage`)",
                 p->layout ? p->layout->name : "(none)", st->fn->model ? st->fn->model->name : "?", p->mesh->name);
    return;
  }
  if (st->schedule != SCHED_INTERLEAVED) return;
  int64_t per = pipe->stack_dim->size / stages;
  if (per % st->interleave != 0)
    diag_error(at, "interleaved(%d) cuts each stage's layers into %d chunks, but each of the %lld stages holds "
                   "%lld of the %lld '%s' (param '%s'): V must divide %lld",
               st->interleave, st->interleave, (long long)stages, (long long)per, (long long)pipe->stack_dim->size,
               pipe->stack_dim->name, pipe->name, (long long)per);
}

/* ---- what the layout's rules need of the models ---- */

/* The stacking dims of model m's stacked params and of the models it holds (depth-limited: a
 * cycle is reported elsewhere). */
static void stack_dims_of(Sema *s, const Model *m, int depth) {
  Program *p = s->p;
  if (!m || depth > MAX_MODEL_DEPTH) return;
  for (int k = 0; k < m->nparams; k++) {
    const ParamDecl *pd = &m->params[k];
    if (pd->kind == PARAM_STACK && pd->stack_dim) {
      bool seen = false;
      for (int i = 0; i < p->nstack_dims; i++) seen |= p->stack_dims[i] == pd->stack_dim;
      if (!seen && p->nstack_dims < MAX_RANK) p->stack_dims[p->nstack_dims++] = pd->stack_dim;
    }
    if (pd->kind != PARAM_TENSOR) stack_dims_of(s, pd->model, depth + 1);
  }
}

/* route(l, ..., over: e, tokens: t, ...) anywhere below n: (e, t) into p->route_dims. */
static void route_dims_in(Sema *s, const Node *n, int depth) {
  Program *p = s->p;
  for (; n && depth < 4096; n = n->next) {
    if (n->kind == N_CALL && n->lhs && n->lhs->kind == N_NAME && n->lhs->name && strcmp(n->lhs->name, "route") == 0) {
      const Dim *e = NULL, *t = NULL;
      for (const Node *a = n->items; a; a = a->next) {
        if (a->kind != N_NAMED_ARG || !a->name || !a->value || a->value->kind != N_NAME) continue;
        if (strcmp(a->name, "over") == 0) e = program_find_dim(p, a->value->name);
        if (strcmp(a->name, "tokens") == 0) t = program_find_dim(p, a->value->name);
      }
      bool seen = !e || !t || e == t;
      for (int i = 0; i < p->nroute_dims && !seen; i++)
        seen = p->route_dims[i].expert == e && p->route_dims[i].tokens == t;
      if (!seen) {
        RouteDims *nd = ARENA_ARRAY(s->a, RouteDims, p->nroute_dims + 1);
        if (p->nroute_dims) memcpy(nd, p->route_dims, sizeof *nd * (size_t)p->nroute_dims);
        nd[p->nroute_dims++] = (RouteDims){e, t};
        p->route_dims = nd;
      }
    }
    route_dims_in(s, n->lhs, depth + 1);
    route_dims_in(s, n->rhs, depth + 1);
    route_dims_in(s, n->value, depth + 1);
    route_dims_in(s, n->items, depth + 1);
    route_dims_in(s, n->body, depth + 1);
  }
}

static void layout_needs(Sema *s) {
  Program *p = s->p;
  p->stack_dims = ARENA_ARRAY(s->a, Dim *, MAX_RANK);
  p->nstack_dims = 0;
  if (p->entry) stack_dims_of(s, p->entry->model, 0);
  for (int i = 0; i < p->nmodels; i++)
    for (int k = 0; k < p->models[i]->nfns; k++)
      if (p->models[i]->fns[k].ast) route_dims_in(s, p->models[i]->fns[k].ast->body, 0);
}

/* `stage_layers = [...]` (language.md, Steps): one count per pipeline stage, summing to the
 * pipeline's stacking dim. The pipeline builder (shard/stages.c) splits layers evenly, so a list
 * that differs from the even split is refused here, at the list, rather than run as an even one. */
static void check_stage_layers(Sema *s) {
  Program *p = s->p;
  const Step *st = p->step;
  if (!st || st->kind != STEP_TRAIN || !st->fn || !st->key_loc[SK_STAGE_LAYERS].file || !st->stage_layers) return;
  SrcLoc at = st->key_loc[SK_STAGE_LAYERS];
  const Node *value = NULL;
  for (const Node *kv = st->ast ? st->ast->kvs : NULL; kv; kv = kv->next)
    if (kv->kind == N_KV && kv->name && strcmp(kv->name, "stage_layers") == 0 && !value) value = kv->value;
  if (value) at = value->loc;
  int64_t stages = 1;
  const ParamDecl *pipe = p->mesh ? find_pipeline(p, st->fn->model, &stages, 0) : NULL;
  if (!pipe) {
    diag_error(at, "'stage_layers' splits a pipeline's layers, and layout '%s' shards no stacking dim of model '%s'%s%s "
                   "(a pipeline shards one, as in `layers: stage`)",
               p->layout ? p->layout->name : "(none)", st->fn->model ? st->fn->model->name : "?",
               p->mesh ? " on mesh " : "", p->mesh ? p->mesh->name : "");
    return;
  }
  int64_t sum = 0;
  for (int i = 0; i < st->nstage_layers; i++) sum += st->stage_layers[i];
  if (st->nstage_layers != stages) {
    diag_error(at, "'stage_layers' lists %d stages, and the pipeline has %lld (the stage axes of mesh '%s')",
               st->nstage_layers, (long long)stages, p->mesh->name);
    return;
  }
  if (sum != pipe->stack_dim->size) {
    diag_error(at, "'stage_layers' sums to %lld, and '%s' (param '%s') has %lld", (long long)sum, pipe->stack_dim->name,
               pipe->name, (long long)pipe->stack_dim->size);
    return;
  }
  for (int i = 0; i < st->nstage_layers; i++)
    if (st->stage_layers[i] != pipe->stack_dim->size / stages) {
      diag_error(at, "stage %d holds %d layers where the even split holds %lld: uneven stages are not implemented yet "
                     "(the pipeline builder splits '%s' evenly; issue 19)",
                 i, st->stage_layers[i], (long long)(pipe->stack_dim->size / stages), pipe->stack_dim->name);
      return;
    }
}

/* ---- the whole program ---- */

/* Pass 1: every declaration by kind; duplicates of a name are errors (a note at the first). */
static void collect(Sema *s, const ParsedProgram *pp) {
  Program *p = s->p;
  for (int f = 0; f < pp->nfiles; f++) {
    const Ast *ast = pp->files[f];
    if (!ast) continue;
    bool is_main = f == pp->nfiles - 1;
    for (const Node *d = ast->decls; d; d = d->next) {
      if (!d->name && d->kind != N_STEP) continue;
      SrcLoc loc = sema_name_loc(d);
      int prev;
      switch (d->kind) {
      case N_DIM:
        if ((prev = namemap_get(&s->dim_map, d->name)) >= 0) {
          sema_duplicate("dim", d->name, loc, s->dims.data[prev]->loc);
          break;
        }
        {
          Dim *dim = ARENA_NEW(s->a, Dim);
          dim->name = d->name;
          dim->loc = loc;
          dim->id = s->dims.len;
          dim->size = 1;
          namemap_put(s->a, &s->dim_map, d->name, s->dims.len);
          VEC_PUSH(s->a, s->dims, dim);
          VEC_PUSH(s->a, s->dim_nodes, d);
        }
        break;
      case N_TARGET:
        VEC_PUSH(s->a, s->target_nodes, d);
        break;
      case N_MESH:
        if ((prev = namemap_get(&s->mesh_map, d->name)) >= 0) {
          sema_duplicate("mesh", d->name, loc, sema_name_loc(s->mesh_nodes.data[prev]));
          break;
        }
        namemap_put(s->a, &s->mesh_map, d->name, s->mesh_nodes.len);
        VEC_PUSH(s->a, s->mesh_nodes, d);
        break;
      case N_LAYOUT:
        if ((prev = namemap_get(&s->layout_map, d->name)) >= 0) {
          sema_duplicate("layout", d->name, loc, sema_name_loc(s->layout_nodes.data[prev]));
          break;
        }
        namemap_put(s->a, &s->layout_map, d->name, s->layout_nodes.len);
        VEC_PUSH(s->a, s->layout_nodes, d);
        break;
      case N_MODEL:
        if ((prev = namemap_get(&s->model_map, d->name)) >= 0) {
          sema_duplicate("model", d->name, loc, s->models.data[prev]->loc);
          break;
        }
        if (dtype_from_name(d->name) != DT_NONE) {
          diag_error(loc, "'%s' is a dtype and cannot name a model", d->name);
          break;
        }
        {
          Model *m = ARENA_NEW(s->a, Model);
          m->name = d->name;
          m->loc = loc;
          namemap_put(s->a, &s->model_map, d->name, s->models.len);
          VEC_PUSH(s->a, s->models, m);
          VEC_PUSH(s->a, s->model_nodes, d);
          VEC_PUSH(s->a, s->model_in_main, is_main);
          VEC_PUSH(s->a, s->model_built, (uint8_t)MODEL_UNBUILT);
        }
        break;
      case N_STEP:
        VEC_PUSH(s->a, s->step_nodes, d);
        break;
      default:
        break;
      }
    }
  }
  p->dims = s->dims.data;
  p->ndims = s->dims.len;
  p->models = s->models.data;
  p->nmodels = s->models.len;
}

Program *sema_program(Arena *a, const ParsedProgram *pp, const SemaOptions *opt) {
  Program *p = ARENA_NEW(a, Program);
  p->arena = a;
  p->diag_once = layout_diag_once_new(a);
  if (!pp || pp->nfiles <= 0 || !pp->files) return p;
  if (pp->files[pp->nfiles - 1]) p->main_file = pp->files[pp->nfiles - 1]->src;

  Sema s = {.p = p, .a = a, .opt = opt};
  collect(&s, pp);
  dims_resolve_all(&s);

  target_build_all(p, (const Node *const *)s.target_nodes.data, s.target_nodes.len);

  p->meshes = ARENA_ARRAY(a, Mesh *, s.mesh_nodes.len > 0 ? s.mesh_nodes.len : 1);
  for (int i = 0; i < s.mesh_nodes.len; i++) p->meshes[p->nmeshes++] = mesh_build(&s, s.mesh_nodes.data[i]);

  p->layouts = ARENA_ARRAY(a, Layout *, s.layout_nodes.len > 0 ? s.layout_nodes.len : 1);
  for (int i = 0; i < s.layout_nodes.len; i++) p->layouts[p->nlayouts++] = layout_build(&s, s.layout_nodes.data[i]);

  for (int i = 0; i < s.models.len; i++)
    if (s.model_in_main.data[i]) model_use(&s, s.models.data[i]);

  p->steps = ARENA_ARRAY(a, Step *, s.step_nodes.len > 0 ? s.step_nodes.len : 1);
  const Step *first_train = NULL;
  for (int i = 0; i < s.step_nodes.len; i++) {
    Step *st = sema_step(&s, s.step_nodes.data[i]);
    if (st->kind == STEP_TRAIN) {
      if (first_train) {
        diag_error(st->loc, "a program has one train step (compile another function with --entry model.fn)");
        diag_note(first_train->loc, "the train step is here");
        continue;
      }
      first_train = st;
    }
    p->steps[p->nsteps++] = st;
  }

  choose(&s);
  models_check_cycles(&s);
  models_check_depth(&s);
  models_check_stacks(&s);
  models_check_unused_params(&s);
  models_build_unused(&s);
  p->usage_error = s.usage;
  if (p->usage_error) return p;

  if (p->entry && !p->mesh)
    diag_error(p->entry->loc, "compiling '%s.%s' needs a mesh, and the program declares none (for example "
                              "`mesh pod = tpu_v5e[data: 8]` after `import \"targets\"`)",
               p->entry->model->name, p->entry->name);
  layout_needs(&s);
  layout_check_rules(p);
  uint8_t *done = ARENA_ARRAY(a, uint8_t, s.models.len > 0 ? s.models.len : 1);
  for (int i = 0; i < s.models.len; i++)
    if (s.model_in_main.data[i]) check_model_specs(&s, s.models.data[i], done);
  if (p->entry && p->entry->model) check_model_specs(&s, p->entry->model, done);
  check_microbatches(&s);
  check_schedule(&s);
  check_stage_layers(&s);
  return p;
}

/* ---- lookups ---- */

Dim *program_find_dim(const Program *p, Name n) {
  for (int i = 0; p && i < p->ndims; i++)
    if (p->dims[i]->name == n) return p->dims[i];
  return NULL;
}

Model *program_find_model(const Program *p, Name n) {
  for (int i = 0; p && i < p->nmodels; i++)
    if (p->models[i]->name == n) return p->models[i];
  return NULL;
}

Target *program_find_target(const Program *p, Name n) {
  for (int i = 0; p && i < p->ntargets; i++)
    if (p->targets[i]->name == n) return p->targets[i];
  return NULL;
}

Mesh *program_find_mesh(const Program *p, Name n) {
  for (int i = 0; p && i < p->nmeshes; i++)
    if (p->meshes[i]->name == n) return p->meshes[i];
  return NULL;
}

Layout *program_find_layout(const Program *p, Name n) {
  for (int i = 0; p && i < p->nlayouts; i++)
    if (p->layouts[i]->name == n) return p->layouts[i];
  return NULL;
}

FnDecl *model_find_fn(const Model *m, Name n) {
  for (int i = 0; m && i < m->nfns; i++)
    if (m->fns[i].name == n) return &m->fns[i];
  return NULL;
}

