/* ir_build.c: function bodies -> IR, with every type rule of the language checked.
 *
 * In: the checked Program (sema.c): dims, models with their params and fn signatures, the entry.
 * Out: an IrModule for p->entry: the entry model's params flattened to paths (stacked ones with
 * their stacking dims first), and one function in SSA form in which calls of sub-model functions
 * are inlined and each `for b in blocks` is one OP_LOOP over an isolated body region.
 *
 * Scoping. A function sees its model's params and its arguments; `let` adds names (never
 * shadowing one already visible), `x = e` rebinds one with a value of the same type. A loop body
 * is a scope of its own: names it rebinds that were bound before the loop are the loop's carried
 * values (found by scanning the body before lowering it), names it introduces die with it.
 * Regions are isolated: when a body uses a value of an enclosing region (an outer param, a name
 * bound before the loop that it only reads), that value becomes a loop invariant: an operand of
 * the loop and an input of the body (use_in).
 *
 * Boundaries. Arguments and the return value of every function (the entry's and every inlined
 * callee's) and typed lets are converted to their written TypeSpec: same dtype and dim set, a
 * transpose where the order differs, and Value.spec set (a hard sharding constraint for
 * propagation). A value that already carries a spec with other `@`s is copied by an
 * order-preserving OP_TRANSPOSE, so that each constraint has a value of its own; where the two
 * written types are alike, the value simply takes the later one.
 *
 * Checking every function. Besides the entry, each function of each model of the main file is
 * lowered once on its own (into a scratch module), so a mistake in a model the entry never calls
 * is still reported (library models are checked where they are used: they may name dims that
 * only the programs using them declare).
 * Inlining cannot change a body's types (arguments are converted to the declared types at the
 * call), so the same mistake would be reported by every copy: diagnostics are reported once per
 * (place, message).
 *
 * Errors give the failing expression the error type (EX_ERR), which every consumer passes on
 * silently, so one mistake yields one diagnostic. Reporting stays linear in the number of
 * mistakes: scopes and the set of reported diagnostics are hash tables, and no did-you-mean search
 * is made for an error the limit will drop. ir_build ends with ir_fuse_attention (ir_fuse.c).
 *
 * Numbers. Literals, `let` constants and size(d) (a dim's size) are numbers until they meet a
 * tensor, folding through + - * / and the elementwise functions (`rsqrt(size(head))` is a
 * constant); then they take its dtype, which for an integer dtype they must fit. Every value made
 * holds at most SIZE_LIMIT bytes (size.c), so later stages can add sizes without overflow. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "diag.h"
#include "ir.h"
#include "route.h"
#include "suggest.h"

#define MAX_INLINE_DEPTH 64  /* calls nested deeper than this are reported, not followed */
#define MAX_CALL_ARGS 32
/* Models nesting deeper than MAX_MODEL_DEPTH (program.h; sema reports it) are not flattened. */

typedef VEC(Value *) ValueVec;
typedef VEC(Name) NameVec;

/* ---- expression results ---- */

/* What an expression denotes: a tensor value, a number literal not yet given a dtype (it takes
 * the other operand's), or the error type. */
typedef enum { EX_ERR, EX_VAL, EX_LIT } ExKind;
typedef struct Ex {
  ExKind kind;
  Value *v;        /* EX_VAL */
  double num;      /* EX_LIT */
  bool is_float;   /* EX_LIT: written with a point or exponent, or a fold made it fractional */
} Ex;

static Ex ex_err(void) { return (Ex){.kind = EX_ERR}; }
static Ex ex_val(Value *v) { return v ? (Ex){.kind = EX_VAL, .v = v} : ex_err(); }
static Ex ex_lit(double x, bool is_float) { return (Ex){.kind = EX_LIT, .num = x, .is_float = is_float}; }

/* ---- model instances ----
 * The params one function body sees: its model's tensor params as values, and its model params
 * as instances of their own. The root is the entry's model (values: OP_PARAM results); a loop body
 * sees a slice of a stacked instance (values: body inputs without the stacking dim). */
typedef struct Inst Inst;
struct Inst {
  const Model *model;
  Name path;                /* "blocks.attn"; NULL for the root */
  Value **tensor;           /* by param index: PARAM_TENSOR values (NULL elsewhere) */
  const TypeSpec **spec;    /* by param index: the written type of that value as seen here */
  Inst **sub;               /* by param index: PARAM_MODEL and PARAM_STACK instances */
  bool stacked;             /* a PARAM_STACK param: its leaves lead with stack_dim; iterate it */
  Dim *stack_dim;
};

/* ---- scopes ---- */
typedef enum { B_VALUE, B_PARAM, B_INST } BindKind;
typedef struct Binding Binding;
struct Binding {
  Name name;
  BindKind kind;
  Ex ex;            /* B_VALUE, B_PARAM */
  Inst *inst;       /* B_INST (NULL if its declaration was broken) */
  SrcLoc loc;       /* where the name was introduced */
  bool is_param;    /* a param of the function's model (else an argument, a let or a loop's `b`) */
  Binding *next;
};

typedef struct Loop Loop;
typedef struct Scope Scope;
struct Scope {
  Scope *parent;
  Binding *list;    /* newest first */
  Binding **table;  /* the newest binding of each name, open addressing on the interned pointer;
                       cap a power of 2, at most half full (so a body of N lets costs O(N)) */
  int ntable, cap;
  bool fn_boundary; /* a function's own scope: lookups stop here */
  Loop *loop;       /* this scope is that loop's body */
};

struct Loop {
  IrFunc *body;
  Loop *outer;             /* the enclosing active loop */
  Inst *iterated;          /* the stacked instance it runs over */
  ValueVec inv_outer;      /* invariants: the value in body->parent ... */
  ValueVec inv_inner;      /* ... and the body input standing for it */
};

/* ---- the builder ---- */
typedef struct Reported {
  const Source *file;
  int line, col;
  const char *msg;           /* NULL: an empty slot */
  uint64_t hash;
} Reported;

/* State shared by every module one ir_build makes (the entry's and the scratch checks). */
typedef struct Check {
  Arena tmp;                 /* messages and the table of reported diagnostics */
  Reported *seen;            /* open addressing on Reported.hash; cap a power of 2, at most half full */
  int nseen, cap;
} Check;

typedef struct Builder {
  const Program *p;
  IrModule *m;
  Check *ck;
  IrFunc *fn;                /* where ops are emitted */
  Scope *scope;
  Inst *inst;                /* the params of the function being lowered */
  const FnDecl *stack[MAX_INLINE_DEPTH];
  int depth;
  Loop *loop;                /* innermost active loop */
  bool last_reported;        /* the last err() printed (so its notes print too) */
  int param_cap;             /* room in m->params (count_leaves) */
  VEC(const Op *) matmuls;   /* the contractions written `a @ b` (for contract_hint) */
} Builder;

/* ---- diagnostics ---- */

static void err(Builder *b, SrcLoc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void note(Builder *b, SrcLoc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* FNV-1a over a diagnostic's place and message. */
static uint64_t reported_hash(SrcLoc loc, const char *msg) {
  uint64_t h = 1469598103934665603ull;
  uint64_t parts[3] = {(uint64_t)(uintptr_t)loc.file, (uint64_t)loc.line, (uint64_t)loc.col};
  for (int i = 0; i < 3; i++) h = (h ^ parts[i]) * 1099511628211ull;
  for (const char *p = msg; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  return h;
}

/* True the first time (loc, msg) is seen; remembers it. A hash table, so that N errors cost O(N). */
static bool first_report(Check *ck, SrcLoc loc, const char *msg) {
  if (2 * (ck->nseen + 1) > ck->cap) {
    int ncap = ck->cap ? 2 * ck->cap : 64;
    Reported *t = ARENA_ARRAY(&ck->tmp, Reported, ncap);
    for (int i = 0; i < ck->cap; i++) {
      if (!ck->seen[i].msg) continue;
      int j = (int)(ck->seen[i].hash & (uint64_t)(ncap - 1));
      while (t[j].msg) j = (j + 1) & (ncap - 1);
      t[j] = ck->seen[i];
    }
    ck->seen = t;
    ck->cap = ncap;
  }
  uint64_t h = reported_hash(loc, msg);
  int j = (int)(h & (uint64_t)(ck->cap - 1));
  for (; ck->seen[j].msg; j = (j + 1) & (ck->cap - 1)) {
    const Reported *r = &ck->seen[j];
    if (r->hash == h && r->file == loc.file && r->line == loc.line && r->col == loc.col && strcmp(r->msg, msg) == 0)
      return false;
  }
  ck->seen[j] = (Reported){loc.file, loc.line, loc.col, arena_strndup(&ck->tmp, msg, strlen(msg)), h};
  ck->nseen++;
  return true;
}

/* Reports once per (place, message): a body inlined several times has the same mistakes. */
static void err(Builder *b, SrcLoc loc, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (!first_report(b->ck, loc, msg)) {
    b->last_reported = false;
    return;
  }
  diag_error(loc, "%s", msg);
  b->last_reported = true;
}

static void note(Builder *b, SrcLoc loc, const char *fmt, ...) {
  if (!b->last_reported) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  diag_note(loc, "%s", msg);
}

/* ---- text for messages ---- */

static const char *tstr(Builder *b, const TensorType *t) {
  char buf[512];
  tensor_type_format(buf, sizeof buf, t);
  return arena_strndup(&b->ck->tmp, buf, strlen(buf));
}

static SrcLoc nloc(const Node *n) { return n->name_loc.file ? n->name_loc : n->loc; }

/* The whole source span of an expression (from its first to its last byte when on one line):
 * parser locations of operators and calls need not cover their operands. */
static SrcLoc expr_span(const Node *n) {
  if (!n) return (SrcLoc){0};
  switch (n->kind) {
  case N_BINARY: return srcloc_span(expr_span(n->lhs), expr_span(n->rhs));
  case N_UNARY: return srcloc_span(n->loc, expr_span(n->lhs));
  case N_CALL:
  case N_RENAME: return srcloc_span(expr_span(n->lhs), n->loc);
  case N_MEMBER: return srcloc_span(expr_span(n->lhs), n->name_loc.file ? n->name_loc : n->loc);
  case N_ARROW: return srcloc_span(expr_span(n->lhs), expr_span(n->rhs));
  case N_NAMED_ARG: return srcloc_span(n->loc, expr_span(n->value));
  default: return n->loc;
  }
}

/* The source text of a short one-line expression ("x", "h @ w"), else `fallback`. */
static const char *expr_text(Builder *b, const Node *n, const char *fallback) {
  if (!n) return fallback;
  if (n->kind == N_NAME) return n->name;
  SrcLoc l = expr_span(n);
  const char *s;
  size_t line_len;
  if (!l.file || l.len <= 0 || l.len > 40 || l.col < 1 || !source_line(l.file, l.line, &s, &line_len)) return fallback;
  if ((size_t)(l.col - 1) + (size_t)l.len > line_len) return fallback;
  s += l.col - 1;
  for (int i = 0; i < l.len; i++)
    if (s[i] == 0) return fallback;
  return arena_strndup(&b->ck->tmp, s, (size_t)l.len);
}

/* The source text at loc when it is short and on one line ("h @ x"), else NULL. */
static const char *loc_text(Builder *b, SrcLoc l) {
  const char *s;
  size_t line_len;
  if (!l.file || l.len <= 0 || l.len > 40 || l.col < 1 || !source_line(l.file, l.line, &s, &line_len)) return NULL;
  if ((size_t)(l.col - 1) + (size_t)l.len > line_len) return NULL;
  return arena_strndup(&b->ck->tmp, s + l.col - 1, (size_t)l.len);
}

/* "batch and seq", "batch, seq and embed" */
static const char *dims_text(Builder *b, Dim *const *dims, int n) {
  char buf[512];
  size_t used = 0;
  buf[0] = 0;
  for (int i = 0; i < n && used < sizeof buf; i++)
    used += (size_t)snprintf(buf + used, sizeof buf - used, "%s%s", i == 0 ? "" : i == n - 1 ? " and " : ", ",
                             dims[i]->name);
  return arena_strndup(&b->ck->tmp, buf, strlen(buf));
}

/* Where a value whose type is wrong came out of a contraction (directly, or through elementwise
 * functions, casts, transposes and the first operand of an elementwise operator), which dims it
 * contracted: "; h @ x contracted batch and seq (`@` contracts every dim the two share; to
 * contract fewer, use contract(a, b, over: d))". "" otherwise. */
static const char *contract_hint(Builder *b, const Value *v) {
  for (int step = 0; v && v->def && step < 16; step++) {
    const Op *o = v->def;
    if (o->kind == OP_CONTRACT) {
      bool matmul = false;
      for (int i = 0; i < b->matmuls.len; i++) matmul |= b->matmuls.data[i] == o;
      const char *text = loc_text(b, o->loc);
      const char *what = text ? text : arena_printf(&b->ck->tmp, "the contraction at line %d", o->loc.line);
      if (matmul && o->ndims > 1)
        return arena_printf(&b->ck->tmp, "; %s contracted %s (`@` contracts every dim the two share; to contract "
                                         "fewer, use contract(a, b, over: d))", what, dims_text(b, o->dims, o->ndims));
      return arena_printf(&b->ck->tmp, "; %s contracted %s", what, dims_text(b, o->dims, o->ndims));
    }
    bool follow = ir_op_is_elementwise(o->kind) || o->kind == OP_CAST || o->kind == OP_TRANSPOSE;
    if (!follow || o->noperands < 1) break;
    v = o->operands[0];
  }
  return "";
}

/* A suggestion searches every candidate name; for an error the limit will drop (or that is a
 * repeat err() drops) it is not searched, so a flood of unknown names stays linear. */
static bool worth_suggesting(void) { return diag_would_show(DIAG_ERROR); }

/* ---- dims ---- */

static Dim *find_dim(const Program *p, Name n) {
  for (int i = 0; i < p->ndims; i++)
    if (p->dims[i] && p->dims[i]->name == n) return p->dims[i];
  return NULL;
}

/* A dim named where one is expected (over:, causal's dims, rename and split/merge arrows). */
static Dim *dim_ref(Builder *b, const Node *n) {
  if (!n) return NULL;
  if (n->kind != N_NAME) {
    err(b, expr_span(n), "expected a dim name here");
    return NULL;
  }
  Dim *d = find_dim(b->p, n->name);
  if (d) return d;
  Suggest s = suggest_begin(worth_suggesting() ? n->name : NULL);
  for (int i = 0; i < b->p->ndims; i++)
    if (b->p->dims[i]) suggest_try(&s, b->p->dims[i]->name);
  char sb[160];
  err(b, n->loc, "unknown dim '%s'%s", n->name, suggest_text(&s, sb, sizeof sb));
  return NULL;
}

/* `d` or `(d1, d2)`: distinct dims into out[]; returns how many, or -1 after an error. */
static int dim_list(Builder *b, const Node *n, Dim **out, SrcLoc *locs, int max) {
  const Node *first = n, *single = n;
  if (n && n->kind == N_TUPLE) first = n->items, single = NULL;
  int k = 0;
  bool ok = true;
  for (const Node *x = first; x; x = single ? NULL : x->next) {
    Dim *d = dim_ref(b, x);
    if (!d) {
      ok = false;
      continue;
    }
    bool dup = false;
    for (int i = 0; i < k; i++) dup |= out[i] == d;
    if (dup) {
      err(b, x->loc, "dim %s is listed twice", d->name);
      ok = false;
      continue;
    }
    if (k == max) {
      err(b, x->loc, "too many dims (at most %d)", max);
      return -1;
    }
    if (locs) locs[k] = x->loc;
    out[k++] = d;
  }
  return ok ? k : -1;
}

/* ---- scopes ---- */

static unsigned scope_hash(Name n) { return (unsigned)(((uintptr_t)n >> 3) * 2654435761u); }

/* The slot of name n in s's table: its binding, or the empty slot where it would go. */
static Binding **scope_slot(Scope *s, Name n) {
  unsigned mask = (unsigned)s->cap - 1, j = scope_hash(n) & mask;
  while (s->table[j] && s->table[j]->name != n) j = (j + 1) & mask;
  return &s->table[j];
}

static Binding *bind(Builder *b, Scope *s, Name name, BindKind kind, Ex ex, Inst *inst, SrcLoc loc) {
  Binding *x = ARENA_NEW(&b->ck->tmp, Binding);
  x->name = name;
  x->kind = kind;
  x->ex = ex;
  x->inst = inst;
  x->loc = loc;
  x->next = s->list;
  s->list = x;
  if (2 * (s->ntable + 1) > s->cap) {
    Scope grown = {.cap = s->cap ? 2 * s->cap : 16};
    grown.table = ARENA_ARRAY(&b->ck->tmp, Binding *, grown.cap);
    for (int i = 0; i < s->cap; i++)
      if (s->table[i]) *scope_slot(&grown, s->table[i]->name) = s->table[i];
    s->table = grown.table, s->cap = grown.cap;
  }
  Binding **slot = scope_slot(s, name);
  if (!*slot) s->ntable++;
  *slot = x;
  return x;
}

/* The binding of `n` visible here (not past the function's own scope); *crossed tells whether it
 * lives outside the innermost loop body being lowered. */
static Binding *lookup2(Builder *b, Name n, bool *crossed) {
  bool c = false;
  for (Scope *s = b->scope; s; s = s->parent) {
    Binding *x = s->cap ? *scope_slot(s, n) : NULL;
    if (x) {
      if (crossed) *crossed = c;
      return x;
    }
    if (s->fn_boundary) break;
    if (s->loop) c = true;
  }
  return NULL;
}

static Binding *lookup(Builder *b, Name n) { return lookup2(b, n, NULL); }

/* ---- builtins ---- */

typedef enum { OVER_NO, OVER_ONE, OVER_DIMS } OverMode;
typedef struct Builtin {
  const char *name;
  OpKind op;
  int nargs;
  OverMode over;
} Builtin;

/* The elementwise functions are the op table's OPF_CALL ops (ops.def), by their names; then these. */
static const Builtin op_builtins[OP__COUNT] = {
#define OP(e, nm, ...) [e] = {nm, e, 1, OVER_NO},
#include "ops.def"
};

static const Builtin builtins[] = {
  {"sum", OP_SUM, 1, OVER_DIMS},         {"mean", OP_MEAN, 1, OVER_DIMS},
  {"max", OP_MAX, 1, OVER_DIMS},         {"softmax", OP_SOFTMAX, 1, OVER_ONE},
  {"rmsnorm", OP_RMSNORM, 2, OVER_ONE},  {"layernorm", OP_LAYERNORM, 3, OVER_ONE},
  {"contract", OP_CONTRACT, 2, OVER_DIMS}, {"split", OP_SPLIT, 2, OVER_NO},
  {"merge", OP_MERGE, 2, OVER_NO},       {"take", OP_TAKE, 2, OVER_NO},
  {"causal", OP_CAUSAL, 3, OVER_NO},     {"dropout", OP_DROPOUT, 2, OVER_NO},
};

static bool is_call_op(int k) { return ir_op_info((OpKind)k)->flags & OPF_CALL; }

static const Builtin *find_builtin(Name n) {
  for (int k = 0; k < OP__COUNT; k++)
    if (is_call_op(k) && strcmp(op_builtins[k].name, n) == 0) return &op_builtins[k];
  for (size_t i = 0; i < ARRAY_LEN(builtins); i++)
    if (strcmp(builtins[i].name, n) == 0) return &builtins[i];
  return NULL;
}

/* Every builtin, in the order find_builtin tries them (for suggestions). */
static void suggest_builtins(Suggest *s) {
  for (int k = 0; k < OP__COUNT; k++)
    if (is_call_op(k)) suggest_try(s, op_builtins[k].name);
  for (size_t i = 0; i < ARRAY_LEN(builtins); i++) suggest_try(s, builtins[i].name);
}

/* "exp, log, ..., causal, route, size, the casts ..., and a model's own fns" */
static const char *known_functions(Builder *b) {
  static const char rest[] = "route, size, the casts f32 bf16 f16 f8e4m3 f8e5m2 i32 i8, and a model's own fns";
  size_t n = sizeof rest;
  for (int k = 0; k < OP__COUNT; k++)
    if (is_call_op(k)) n += strlen(op_builtins[k].name) + 2;
  for (size_t i = 0; i < ARRAY_LEN(builtins); i++) n += strlen(builtins[i].name) + 2;
  char *t = arena_alloc(&b->ck->tmp, n), *p = t;
  for (int k = 0; k < OP__COUNT; k++)
    if (is_call_op(k)) p += sprintf(p, "%s, ", op_builtins[k].name);
  for (size_t i = 0; i < ARRAY_LEN(builtins); i++) p += sprintf(p, "%s, ", builtins[i].name);
  strcpy(p, rest);
  return t;
}

/* ---- emitting ---- */

static Loop *loop_of(Builder *b, const IrFunc *f) {
  for (Loop *l = b->loop; l; l = l->outer)
    if (l->body == f) return l;
  return NULL;
}

/* The value standing for `v` in region f: v itself if f defines it, else f's invariant input
 * for it (made on first use, through every loop in between). */
static Value *use_in(Builder *b, IrFunc *f, Value *v) {
  if (!v || v->func == f) return v;
  Loop *l = loop_of(b, f);
  if (!l) return v; /* not inside an active loop: cannot happen for values of enclosing regions */
  Value *outer = use_in(b, f->parent, v);
  for (int i = 0; i < l->inv_outer.len; i++)
    if (l->inv_outer.data[i] == outer) return l->inv_inner.data[i];
  Value *in = ir_func_add_input(b->m, f, outer->type, outer->name);
  in->spec = outer->spec;
  VEC_PUSH(&b->ck->tmp, l->inv_outer, outer);
  VEC_PUSH(&b->ck->tmp, l->inv_inner, in);
  return in;
}

/* Every value the builder makes holds at most SIZE_LIMIT bytes (size.c): later stages add and
 * multiply sizes freely. False, after an error at loc, for one that does not. */
static bool size_fits(Builder *b, SrcLoc loc, const TensorType *t) {
  if (t->dtype == DT_NONE) return true;
  const char *big = tensor_size_error(&b->ck->tmp, t->dims, t->rank, t->dtype);
  if (!big) return true;
  err(b, loc, "%s", big);
  return false;
}

static Op *emit_op(Builder *b, OpKind k, SrcLoc loc, Value **ops, int n, TensorType t) {
  size_fits(b, loc, &t);
  Value *cap[4];
  for (int i = 0; i < n && i < 4; i++) cap[i] = use_in(b, b->fn, ops[i]);
  return ir_emit(b->m, b->fn, k, loc, cap, n, t);
}

static Value *emit(Builder *b, OpKind k, SrcLoc loc, Value **ops, int n, TensorType t) {
  return ir_result(emit_op(b, k, loc, ops, n, t));
}

static void op_dims(Builder *b, Op *op, Dim *const *dims, int n) {
  op->dims = ARENA_ARRAY(b->m->arena, Dim *, n > 0 ? n : 1);
  for (int i = 0; i < n; i++) op->dims[i] = dims[i];
  op->ndims = n;
}

static Value *emit_dims(Builder *b, OpKind k, SrcLoc loc, Value **ops, int n, TensorType t, Dim *const *dims,
                        int nd) {
  Op *op = emit_op(b, k, loc, ops, n, t);
  op_dims(b, op, dims, nd);
  return ir_result(op);
}

static bool is_integral(double x) { return isfinite(x) && x == floor(x); }

/* A number literal as a rank-0 tensor of dtype dt (language.md: literals take the other
 * operand's dtype; a non-integer literal with an integer tensor is an error). `other` names that
 * operand for the message. */
static Value *materialize(Builder *b, Ex e, DType dt, SrcLoc loc, const char *other_text,
                          const TensorType *other) {
  if (dtype_is_int(dt) && !is_integral(e.num)) {
    if (other)
      err(b, loc, "non-integer literal %g with integer tensor %s: %s", e.num, other_text, tstr(b, other));
    else
      err(b, loc, "non-integer literal %g where %s is expected", e.num, dtype_name(dt));
    return NULL;
  }
  /* An integer constant takes the integer dtype: it must fit in it, or it would wrap. */
  double lo = dt == DT_I8 ? -128.0 : -2147483648.0, hi = dt == DT_I8 ? 127.0 : 2147483647.0;
  if (dtype_is_int(dt) && (e.num < lo || e.num > hi)) {
    err(b, loc, "integer literal %.17g overflows %s (%.0f to %.0f)%s%s", e.num, dtype_name(dt), lo, hi,
        other ? " with " : "", other ? other_text : "");
    return NULL;
  }
  TensorType t = {.dtype = dt, .rank = 0};
  Op *op = ir_emit(b->m, b->fn, OP_CONST, loc, NULL, 0, t);
  op->scalar = e.num;
  return ir_result(op);
}

/* result = x's dims (minus skip), then y's dims that x lacks (minus skip): the result-dims rule
 * of language.md for contractions and elementwise ops. */
static bool union_dims(Builder *b, SrcLoc loc, const TensorType *x, const TensorType *y, Dim *const *skip,
                       int nskip, TensorType *out) {
  Dim *dims[2 * MAX_RANK];
  int n = 0;
  for (int i = 0; i < x->rank; i++) {
    bool s = false;
    for (int k = 0; k < nskip; k++) s |= skip[k] == x->dims[i];
    if (!s) dims[n++] = x->dims[i];
  }
  for (int i = 0; i < y->rank; i++) {
    bool s = tensor_type_find(x, y->dims[i]) >= 0;
    for (int k = 0; k < nskip; k++) s |= skip[k] == y->dims[i];
    if (!s) dims[n++] = y->dims[i];
  }
  if (n > MAX_RANK) {
    err(b, loc, "a tensor has at most %d dims; the result would have %d", MAX_RANK, n);
    return false;
  }
  out->rank = n;
  for (int i = 0; i < n; i++) out->dims[i] = dims[i];
  return true;
}

/* The cast to suggest when dtypes differ: the wider one (f32 for bf16 vs f16). */
static DType wider(DType a, DType c) {
  if (dtype_is_int(a) != dtype_is_int(c)) return dtype_is_int(a) ? c : a;
  if (dtype_bytes(a) != dtype_bytes(c)) return dtype_bytes(a) > dtype_bytes(c) ? a : c;
  return dtype_is_int(a) ? DT_I32 : DT_F32;
}

static bool same_dtype(Builder *b, SrcLoc loc, const char *op, const Value *x, const Value *y) {
  if (x->type.dtype == y->type.dtype) return true;
  err(b, loc, "dtype mismatch: %s %s %s; cast one with %s(x)", dtype_name(x->type.dtype), op,
      dtype_name(y->type.dtype), dtype_name(wider(x->type.dtype, y->type.dtype)));
  return false;
}

/* ---- boundaries ---- */

static bool spec_ok(const TypeSpec *s) {
  if (!s || s->dtype < 0 || s->dtype >= DT__COUNT || s->rank < 0 || s->rank > MAX_RANK) return false;
  for (int i = 0; i < s->rank; i++)
    if (!s->dims[i]) return false;
  return true;
}

/* Two written types that constrain a value identically: same dtype, dims in the same order, the
 * same explicit @ axes (the layout is global, so it treats both alike). */
static bool spec_same(const TypeSpec *a, const TypeSpec *c) {
  if (a == c) return true;
  if (a->dtype != c->dtype || a->rank != c->rank) return false;
  for (int i = 0; i < a->rank; i++) {
    if (a->dims[i] != c->dims[i] || a->nat[i] != c->nat[i]) return false;
    for (int k = 0; k < a->nat[i] && k < MAX_MESH_AXES; k++)
      if (a->at[i][k] != c->at[i][k]) return false;
  }
  return true;
}

/* Makes `e` a value of exactly spec's type (dtype, and dims in spec's order) carrying `spec`:
 * the written type of a boundary. A value already bound by a different written type (other @s)
 * is copied by an order-preserving transpose so that each constraint has a value of its own.
 * `what` starts the message on a mismatch. */
static Ex to_spec(Builder *b, Ex e, const TypeSpec *spec, SrcLoc loc, const char *what) {
  if (e.kind == EX_ERR || !spec_ok(spec)) return ex_err();
  TensorType want = tensor_type_from_spec(spec);
  Value *v;
  if (e.kind == EX_LIT) {
    if (want.rank != 0) {
      err(b, loc, "%s: expected %s, found a number", what, tstr(b, &want));
      return ex_err();
    }
    v = materialize(b, e, want.dtype, loc, NULL, NULL);
    if (!v) return ex_err();
  } else {
    v = use_in(b, b->fn, e.v);
    if (v->type.dtype != want.dtype || !tensor_type_same_dims(&v->type, &want)) {
      err(b, loc, "%s: expected %s, found %s%s", what, tstr(b, &want), tstr(b, &v->type), contract_hint(b, v));
      return ex_err();
    }
  }
  if (!tensor_type_equal(&v->type, &want) || (v->spec && !spec_same(v->spec, spec)))
    v = emit(b, OP_TRANSPOSE, loc, &v, 1, want);
  v->spec = spec;
  return ex_val(v);
}

/* A type written in a typed let: like a param's (sema.c), resolved here because only bodies hold
 * them. The @ axes are checked against the mesh where layouts are applied (layout.c). */
static const TypeSpec *spec_from_ast(Builder *b, const Node *t) {
  if (!t || t->kind != N_TYPE) return NULL;
  DType dt = dtype_from_name(t->name);
  if (dt == DT_NONE) {
    bool model = false;
    for (int i = 0; i < b->p->nmodels; i++) model |= b->p->models[i] && b->p->models[i]->name == t->name;
    if (model) err(b, t->loc, "a let holds a tensor, not a model (%s); expected a type like bf16[batch, embed]", t->name);
    else {
      Suggest sg = suggest_begin(t->name);
      for (int i = 0; i < DT__COUNT; i++) suggest_try(&sg, dtype_name((DType)i));
      char sb[160];
      err(b, t->loc, "unknown dtype %s%s (dtypes: f32 bf16 f16 f8e4m3 f8e5m2 i32 i8)", t->name, suggest_text(&sg, sb, sizeof sb));
    }
    return NULL;
  }
  TypeSpec *s = ARENA_NEW(b->m->arena, TypeSpec);
  s->dtype = dt;
  s->loc = t->loc;
  bool ok = true;
  for (const Node *d = t->items; d; d = d->next) {
    Dim *dim = d->name ? find_dim(b->p, d->name) : NULL;
    if (!dim) {
      Node tmp = *d;
      tmp.kind = N_NAME;
      tmp.loc = nloc(d);
      dim_ref(b, &tmp); /* reports it, with a suggestion */
      ok = false;
      continue;
    }
    for (int i = 0; i < s->rank; i++)
      if (s->dims[i] == dim) {
        err(b, d->loc, "dim %s appears twice in this type", dim->name);
        ok = false;
      }
    if (s->rank == MAX_RANK) {
      err(b, d->loc, "a tensor has at most %d dims; '%s' is the %dth", MAX_RANK, dim->name, MAX_RANK + 1);
      return NULL;
    }
    int r = s->rank++;
    s->dims[r] = dim;
    s->dim_loc[r] = d->loc;
    for (const Node *a = d->items; a; a = a->next) {
      if (s->nat[r] == MAX_AXES_PER_DIM) {
        err(b, a->loc, "a dim is sharded over at most %d axes; '%s' is the %dth for '%s'", MAX_AXES_PER_DIM, a->name,
            MAX_AXES_PER_DIM + 1, dim->name);
        ok = false;
        break;
      }
      s->at[r][s->nat[r]++] = a->name;
    }
  }
  if (!ok) return NULL;
  /* Report a wrong `@` (unknown axis, not divisible, an axis on two dims) here, at the let; the
   * layout's own warnings for this type come out once, whoever applies it first. */
  Sharding sh;
  layout_apply(b->p, s, &sh, NULL);
  return s;
}

/* ---- expressions ---- */

static Ex lower_expr(Builder *b, const Node *n);
static Ex lower_fn(Builder *b, const FnDecl *fn, Inst *inst, const Ex *args);

static void undefined(Builder *b, Name name, SrcLoc loc) {
  if (find_dim(b->p, name)) {
    err(b, loc, "%s is a dim, not a value", name);
    return;
  }
  if (dtype_from_name(name) != DT_NONE) {
    err(b, loc, "%s is a dtype, not a value; to cast, write %s(x)", name, name);
    return;
  }
  if (find_builtin(name) || strcmp(name, "size") == 0) {
    err(b, loc, "%s is a function; call it as %s(...)", name, name);
    return;
  }
  Suggest s = suggest_begin(worth_suggesting() ? name : NULL);
  for (Scope *sc = b->scope; sc && s.want; sc = sc->parent) {
    for (Binding *x = sc->list; x; x = x->next) suggest_try(&s, x->name);
    if (sc->fn_boundary) break;
  }
  char sb[160];
  err(b, loc, "undefined name %s%s", name, suggest_text(&s, sb, sizeof sb));
}

static Ex lower_name(Builder *b, const Node *n) {
  Binding *x = lookup(b, n->name);
  if (!x) {
    undefined(b, n->name, n->loc);
    return ex_err();
  }
  if (x->kind != B_INST) return x->ex;
  if (!x->inst) return ex_err();
  if (x->inst->stacked)
    err(b, n->loc,
        "wrong stacked-model use: %s is a stack of %lld %s models, not a value; iterate it with "
        "`for b in %s { ... b.forward(...) ... }`",
        n->name, (long long)(x->inst->stack_dim ? x->inst->stack_dim->size : 0), x->inst->model->name, n->name);
  else
    err(b, n->loc, "%s is a model (%s), not a value; call one of its fns, like %s.forward(...)", n->name,
        x->inst->model->name, n->name);
  return ex_err();
}

static Ex need_tensor(Builder *b, Ex e, const Node *n, const char *who) {
  if (e.kind == EX_LIT) {
    err(b, expr_span(n), "%s needs a tensor here, found a number", who);
    return ex_err();
  }
  return e;
}

static bool need_float(Builder *b, const Value *v, const Node *n, const char *who) {
  if (!dtype_is_int(v->type.dtype)) return true;
  err(b, expr_span(n), "%s needs a float tensor, found %s: %s", who, expr_text(b, n, "an integer tensor"),
      tstr(b, &v->type));
  return false;
}

/* a @ b contracts every dim the two share; contract(a, b, over: ...) exactly the listed ones
 * (each in both), other shared dims being batch dims kept once in a's position. Result: a's
 * surviving dims, then b's new ones. */
static Ex lower_contract(Builder *b, SrcLoc loc, const Node *xn, Value *x, const Node *yn, Value *y,
                         Dim **over, SrcLoc *over_loc, int nover, bool all) {
  Dim *dims[MAX_RANK];
  int nd = 0;
  const char *xt = expr_text(b, xn, "the left operand"), *yt = expr_text(b, yn, "the right operand");
  if (all) {
    for (int i = 0; i < x->type.rank; i++)
      if (tensor_type_find(&y->type, x->type.dims[i]) >= 0) dims[nd++] = x->type.dims[i];
    if (nd == 0) {
      const char *hint = contract_hint(b, x);
      if (!*hint) hint = contract_hint(b, y);
      err(b, loc, "no shared dim between %s: %s and %s: %s%s", xt, tstr(b, &x->type), yt, tstr(b, &y->type), hint);
      return ex_err();
    }
  } else {
    bool ok = true;
    for (int i = 0; i < nover; i++) {
      const char *who = NULL;
      const Value *w = NULL;
      if (tensor_type_find(&x->type, over[i]) < 0) who = xt, w = x;
      else if (tensor_type_find(&y->type, over[i]) < 0) who = yt, w = y;
      if (who) {
        err(b, over_loc[i], "contract over %s: %s: %s has no dim %s%s", over[i]->name, who, tstr(b, &w->type),
            over[i]->name, contract_hint(b, w));
        ok = false;
      }
      dims[nd++] = over[i];
    }
    if (!ok) return ex_err();
  }
  /* FP8 operands, of either format, make a bf16 result (f32 accumulation): Transformer Engine's
   * recipe, whose backward contracts e5m2 gradients with e4m3 values */
  bool fp8 = dtype_is_f8(x->type.dtype) && dtype_is_f8(y->type.dtype);
  if (x->type.dtype != y->type.dtype && !fp8) {
    err(b, loc, "dtype mismatch: %s %s %s, contracting %s; cast one with %s(x)", dtype_name(x->type.dtype),
        all ? "@" : "contracted with", dtype_name(y->type.dtype), dims_text(b, dims, nd),
        dtype_name(wider(x->type.dtype, y->type.dtype)));
    return ex_err();
  }
  TensorType t = {.dtype = dtype_contract_result(x->type.dtype)};
  if (!union_dims(b, loc, &x->type, &y->type, dims, nd, &t)) {
    note(b, loc, "%s contracts %s; the other dims of both operands make the result", all ? "@" : "contract",
         dims_text(b, dims, nd));
    return ex_err();
  }
  Value *ops[2] = {x, y};
  Value *r = emit_dims(b, OP_CONTRACT, loc, ops, 2, t, dims, nd);
  if (all) VEC_PUSH(&b->ck->tmp, b->matmuls, r->def);
  return ex_val(r);
}

static Ex fold(Builder *b, int op, Ex l, Ex r, SrcLoc loc) {
  double x = l.num, y = r.num, z = 0;
  bool f = l.is_float || r.is_float;
  switch (op) {
  case BIN_ADD: z = x + y; break;
  case BIN_SUB: z = x - y; break;
  case BIN_MUL: z = x * y; break;
  case BIN_DIV:
    if (y == 0) {
      err(b, loc, "division by zero");
      return ex_err();
    }
    z = x / y;
    if (!is_integral(z)) f = true;
    break;
  }
  if (!isfinite(z)) {
    err(b, loc, "this constant is not a finite number");
    return ex_err();
  }
  return ex_lit(z, f);
}

static const char *binop_text(int op) {
  switch (op) {
  case BIN_ADD: return "+";
  case BIN_SUB: return "-";
  case BIN_MUL: return "*";
  case BIN_DIV: return "/";
  default: return "@";
  }
}

/* Elementwise + - * / broadcast by dim name: a's dims, then b's new dims; both operands of one
 * dtype; a literal takes the tensor's dtype; two literals fold. */
static Ex lower_binary(Builder *b, const Node *n) {
  Ex l = lower_expr(b, n->lhs), r = lower_expr(b, n->rhs);
  if (l.kind == EX_ERR || r.kind == EX_ERR) return ex_err();
  SrcLoc loc = expr_span(n);
  if (n->op == BIN_MATMUL) {
    if (l.kind == EX_LIT || r.kind == EX_LIT) {
      err(b, expr_span(l.kind == EX_LIT ? n->lhs : n->rhs), "@ contracts two tensors, found a number (to scale, use *)");
      return ex_err();
    }
    return lower_contract(b, loc, n->lhs, l.v, n->rhs, r.v, NULL, NULL, 0, true);
  }
  if (l.kind == EX_LIT && r.kind == EX_LIT) return fold(b, n->op, l, r, loc);
  if (n->op == BIN_DIV && r.kind == EX_LIT && r.num == 0 && l.kind == EX_VAL && dtype_is_int(l.v->type.dtype)) {
    err(b, expr_span(n->rhs), "integer division by zero: %s: %s / 0", expr_text(b, n->lhs, "the tensor"),
        tstr(b, &l.v->type));
    return ex_err();
  }
  Value *x, *y;
  if (l.kind == EX_LIT) {
    x = materialize(b, l, r.v->type.dtype, expr_span(n->lhs), expr_text(b, n->rhs, "the other operand"), &r.v->type);
    y = r.v;
  } else if (r.kind == EX_LIT) {
    x = l.v;
    y = materialize(b, r, l.v->type.dtype, expr_span(n->rhs), expr_text(b, n->lhs, "the other operand"), &l.v->type);
  } else {
    x = l.v, y = r.v;
    if (!same_dtype(b, loc, binop_text(n->op), x, y)) return ex_err();
  }
  if (!x || !y) return ex_err();
  TensorType t = {.dtype = x->type.dtype};
  if (!union_dims(b, loc, &x->type, &y->type, NULL, 0, &t)) return ex_err();
  static const OpKind kinds[] = {[BIN_ADD] = OP_ADD, [BIN_SUB] = OP_SUB, [BIN_MUL] = OP_MUL, [BIN_DIV] = OP_DIV};
  Value *ops[2] = {x, y};
  return ex_val(emit(b, kinds[n->op], loc, ops, 2, t));
}

static Ex lower_neg(Builder *b, const Node *n) {
  Ex e = lower_expr(b, n->lhs);
  if (e.kind == EX_ERR) return e;
  if (e.kind == EX_LIT) return ex_lit(-e.num, e.is_float);
  return ex_val(emit(b, OP_NEG, expr_span(n), &e.v, 1, e.v->type));
}

/* x[a -> b, c -> d]: each a a dim of x, each b a declared dim of a's size not already in x;
 * applied left to right; dims keep their positions. */
static Ex lower_rename(Builder *b, const Node *n) {
  Ex e = lower_expr(b, n->lhs);
  if (e.kind == EX_LIT) {
    err(b, expr_span(n->lhs), "a number has no dims to rename");
    return ex_err();
  }
  int narrows = 0;
  for (const Node *a = n->items; a; a = a->next) narrows++;
  Dim **pairs = ARENA_ARRAY(b->m->arena, Dim *, 2 * narrows + 1);
  int np = 0;
  bool ok = e.kind == EX_VAL;
  TensorType t = ok ? e.v->type : (TensorType){0};
  const char *xt = expr_text(b, n->lhs, "the tensor");
  for (const Node *a = n->items; a; a = a->next) {
    if (a->kind != N_ARROW) {
      err(b, expr_span(a), "expected a rename `a -> b`");
      ok = false;
      continue;
    }
    Dim *from = dim_ref(b, a->lhs), *to = NULL;
    if (a->rhs && a->rhs->kind == N_NAME && !find_dim(b->p, a->rhs->name)) {
      /* A new name for a dim is declared like any dim: say how, beside the closest declared one. */
      Suggest sg = suggest_begin(worth_suggesting() ? a->rhs->name : NULL);
      for (int i = 0; i < b->p->ndims; i++)
        if (b->p->dims[i] && b->p->dims[i] != from) suggest_try(&sg, b->p->dims[i]->name);
      char sb[160];
      err(b, a->rhs->loc, "unknown dim '%s'%s%s", a->rhs->name,
          from ? arena_printf(b->m->arena, ": a rename's new name must be a declared dim (`dim %s = %s` declares one "
                                           "of %s's size)", a->rhs->name, from->name, from->name) : "",
          suggest_text(&sg, sb, sizeof sb));
    } else {
      to = dim_ref(b, a->rhs);
    }
    if (!from || !to || e.kind != EX_VAL) {
      ok = false;
      continue;
    }
    int pos = tensor_type_find(&t, from);
    if (pos < 0) {
      err(b, a->lhs->loc, "cannot rename %s: %s: %s has no dim %s", from->name, xt, tstr(b, &t), from->name);
      ok = false;
      continue;
    }
    if (to == from) {
      err(b, expr_span(a), "renaming %s to itself does nothing (a rename names a different dim of the same size, "
                           "like %s -> k%s)", from->name, from->name, from->name);
      ok = false;
      continue;
    }
    if (tensor_type_find(&t, to) >= 0) {
      err(b, a->rhs->loc, "cannot rename %s to %s: %s: %s already has a dim %s", from->name, to->name, xt,
          tstr(b, &t), to->name);
      ok = false;
      continue;
    }
    if (to->size != from->size) {
      err(b, a->rhs->loc, "cannot rename %s (%lld) to %s (%lld): sizes differ", from->name,
          (long long)from->size, to->name, (long long)to->size);
      ok = false;
      continue;
    }
    t.dims[pos] = to;
    pairs[np++] = from;
    pairs[np++] = to;
  }
  if (!ok) return ex_err();
  if (np == 0) return e;
  return ex_val(emit_dims(b, OP_RENAME, expr_span(n), &e.v, 1, t, pairs, np));
}

/* ---- calls ---- */

typedef struct CallArgs {
  const Node *pos[MAX_CALL_ARGS];
  int npos;
  const Node *over;  /* the value after over: */
} CallArgs;

/* Sorts a call's arguments into positional ones and `over:`. `over` says whether over: is
 * accepted; other named arguments are errors. */
static bool call_args(Builder *b, const Node *call, const char *fname, bool takes_over, CallArgs *ca) {
  memset(ca, 0, sizeof *ca);
  bool ok = true;
  Name over_name = intern_cstr("over");
  for (const Node *a = call->items; a; a = a->next) {
    if (a->kind == N_NAMED_ARG) {
      if (a->name != over_name) {
        err(b, nloc(a), "unknown named argument %s: in %s (%s)", a->name, fname,
            takes_over ? "it takes over:" : "it takes none");
        ok = false;
      } else if (!takes_over) {
        err(b, nloc(a), "%s takes no over: argument", fname);
        ok = false;
      } else if (ca->over) {
        err(b, nloc(a), "over: is given twice");
        ok = false;
      } else {
        ca->over = a->value;
      }
      continue;
    }
    if (ca->npos == MAX_CALL_ARGS) {
      err(b, expr_span(a), "too many arguments (at most %d)", MAX_CALL_ARGS);
      return false;
    }
    ca->pos[ca->npos++] = a;
  }
  return ok;
}

static bool arity(Builder *b, const Node *call, const char *fname, const CallArgs *ca, int want) {
  if (ca->npos == want) return true;
  err(b, expr_span(call), "%s takes %d argument%s, found %d", fname, want, want == 1 ? "" : "s", ca->npos);
  return false;
}

/* The functions (OPF_CALL ops: exp ... silu): one float tensor, same type out. On a number they
 * fold. */
static Ex lower_unary_fn(Builder *b, const Builtin *bi, const Node *call, const Node *arg, Ex x) {
  if (x.kind == EX_ERR) return x;
  if (x.kind == EX_LIT) {
    double v = x.num, r = ir_scalar(bi->op, NULL, &v); /* the interpreter's numerics (ops.def) */
    if (!isfinite(r)) {
      err(b, expr_span(call), "%s(%g) is not a finite number", bi->name, v);
      return ex_err();
    }
    return ex_lit(r, true);
  }
  if (!need_float(b, x.v, arg, bi->name)) return ex_err();
  return ex_val(emit(b, bi->op, expr_span(call), &x.v, 1, x.v->type));
}

static bool dims_in(Builder *b, const char *fname, const Node *xn, const Value *x, Dim **dims, SrcLoc *locs, int n) {
  bool ok = true;
  for (int i = 0; i < n; i++)
    if (tensor_type_find(&x->type, dims[i]) < 0) {
      err(b, locs[i], "%s over %s: %s: %s has no dim %s", fname, dims[i]->name, expr_text(b, xn, "the tensor"),
          tstr(b, &x->type), dims[i]->name);
      ok = false;
    }
  return ok;
}

/* scale (and bias) of a norm: a float tensor whose dims are all dims of x. */
static bool norm_operand(Builder *b, const char *fname, const char *what, const Node *n, Ex e, const Node *xn,
                         const Value *x) {
  if (e.kind == EX_ERR) return false;
  if (e.kind == EX_LIT) {
    err(b, expr_span(n), "the %s of %s must be a tensor, found a number", what, fname);
    return false;
  }
  if (!need_float(b, e.v, n, fname)) return false;
  for (int i = 0; i < e.v->type.rank; i++)
    if (tensor_type_find(&x->type, e.v->type.dims[i]) < 0) {
      err(b, expr_span(n), "the %s of %s has dim %s, which %s: %s lacks", what, fname, e.v->type.dims[i]->name,
          expr_text(b, xn, "x"), tstr(b, &x->type));
      return false;
    }
  return true;
}

/* split(x, d -> (d1, d2, ...)): d a dim of x, new dims declared, distinct and not in x, the
 * product of their sizes d's size; they take d's place, major to minor. */
static Ex lower_split(Builder *b, const Node *call, const CallArgs *ca, Ex x) {
  const Node *arrow = ca->pos[1];
  if (arrow->kind != N_ARROW || !arrow->rhs || arrow->rhs->kind != N_TUPLE) {
    err(b, expr_span(arrow), "split's second argument is `d -> (d1, d2, ...)`");
    return ex_err();
  }
  Dim *from = dim_ref(b, arrow->lhs);
  Dim *to[MAX_RANK];
  SrcLoc locs[MAX_RANK];
  int n = dim_list(b, arrow->rhs, to, locs, MAX_RANK);
  if (!from || n < 0 || x.kind != EX_VAL) return ex_err();
  const Value *v = x.v;
  const char *xt = expr_text(b, ca->pos[0], "the tensor");
  int pos = tensor_type_find(&v->type, from);
  if (pos < 0) {
    err(b, arrow->lhs->loc, "cannot split %s: %s: %s has no dim %s", from->name, xt, tstr(b, &v->type), from->name);
    return ex_err();
  }
  int64_t prod = 1;
  char sizes[256] = "", names[256] = "";
  for (int i = 0; i < n; i++) {
    if (tensor_type_find(&v->type, to[i]) >= 0) {
      err(b, locs[i], "cannot split %s into %s: %s: %s already has a dim %s", from->name, to[i]->name, xt,
          tstr(b, &v->type), to[i]->name);
      return ex_err();
    }
    prod = sat_mul(prod, to[i]->size);
    size_t ls = strlen(sizes), ln = strlen(names);
    snprintf(sizes + ls, sizeof sizes - ls, "%s%lld", i ? " x " : "", (long long)to[i]->size);
    snprintf(names + ln, sizeof names - ln, "%s%s", i ? ", " : "", to[i]->name);
  }
  if (prod != from->size) {
    err(b, expr_span(arrow), "cannot split %s (%lld) into (%s) = %s = %lld: sizes differ", from->name,
        (long long)from->size, names, sizes, (long long)prod);
    return ex_err();
  }
  if (v->type.rank - 1 + n > MAX_RANK) {
    err(b, expr_span(call), "a tensor has at most %d dims; the result would have %d", MAX_RANK, v->type.rank - 1 + n);
    return ex_err();
  }
  TensorType t = {.dtype = v->type.dtype};
  Dim *dims[MAX_RANK + 1];
  dims[0] = from;
  for (int i = 0; i < v->type.rank; i++) {
    if (i == pos)
      for (int k = 0; k < n; k++) t.dims[t.rank++] = to[k];
    else
      t.dims[t.rank++] = v->type.dims[i];
  }
  for (int k = 0; k < n; k++) dims[k + 1] = to[k];
  Value *in = x.v;
  return ex_val(emit_dims(b, OP_SPLIT, expr_span(call), &in, 1, t, dims, n + 1));
}

/* merge(x, (d1, d2, ...) -> d): each di a dim of x, d declared and not in x, sizes multiply to
 * d's; d takes the place of the first of them in x's order, major to minor as listed. */
static Ex lower_merge(Builder *b, const Node *call, const CallArgs *ca, Ex x) {
  const Node *arrow = ca->pos[1];
  if (arrow->kind != N_ARROW || !arrow->lhs || arrow->lhs->kind != N_TUPLE) {
    err(b, expr_span(arrow), "merge's second argument is `(d1, d2, ...) -> d`");
    return ex_err();
  }
  Dim *from[MAX_RANK];
  SrcLoc locs[MAX_RANK];
  int n = dim_list(b, arrow->lhs, from, locs, MAX_RANK);
  Dim *to = dim_ref(b, arrow->rhs);
  if (!to || n < 0 || x.kind != EX_VAL) return ex_err();
  const Value *v = x.v;
  const char *xt = expr_text(b, ca->pos[0], "the tensor");
  int first = MAX_RANK;
  int64_t prod = 1;
  char sizes[256] = "", names[256] = "";
  for (int i = 0; i < n; i++) {
    int pos = tensor_type_find(&v->type, from[i]);
    if (pos < 0) {
      err(b, locs[i], "cannot merge %s: %s: %s has no dim %s", from[i]->name, xt, tstr(b, &v->type), from[i]->name);
      return ex_err();
    }
    if (pos < first) first = pos;
    prod = sat_mul(prod, from[i]->size);
    size_t ls = strlen(sizes), ln = strlen(names);
    snprintf(sizes + ls, sizeof sizes - ls, "%s%lld", i ? " x " : "", (long long)from[i]->size);
    snprintf(names + ln, sizeof names - ln, "%s%s", i ? ", " : "", from[i]->name);
  }
  if (tensor_type_find(&v->type, to) >= 0) {
    err(b, arrow->rhs->loc, "cannot merge into %s: %s: %s already has a dim %s", to->name, xt, tstr(b, &v->type),
        to->name);
    return ex_err();
  }
  if (prod != to->size) {
    err(b, expr_span(arrow), "cannot merge (%s) = %s = %lld into %s (%lld): sizes differ", names, sizes,
        (long long)prod, to->name, (long long)to->size);
    return ex_err();
  }
  TensorType t = {.dtype = v->type.dtype};
  for (int i = 0; i < v->type.rank; i++) {
    bool merged = false;
    for (int k = 0; k < n; k++) merged |= from[k] == v->type.dims[i];
    if (i == first) t.dims[t.rank++] = to;
    else if (!merged) t.dims[t.rank++] = v->type.dims[i];
  }
  Dim *dims[MAX_RANK + 1];
  for (int k = 0; k < n; k++) dims[k] = from[k];
  dims[n] = to;
  Value *in = x.v;
  return ex_val(emit_dims(b, OP_MERGE, expr_span(call), &in, 1, t, dims, n + 1));
}

/* take(table, idx): idx an integer tensor; result: idx's dims, then table's dims after the
 * first, in table's dtype. */
static Ex lower_take(Builder *b, const Node *call, const CallArgs *ca, Ex tab, Ex idx) {
  if (tab.kind != EX_VAL || idx.kind != EX_VAL) return ex_err();
  const Value *t = tab.v, *i = idx.v;
  if (t->type.rank < 1) {
    err(b, expr_span(ca->pos[0]), "take needs a table with at least one dim, found %s", tstr(b, &t->type));
    return ex_err();
  }
  if (!dtype_is_int(i->type.dtype)) {
    err(b, expr_span(ca->pos[1]), "take index must be an integer tensor (i32 or i8), found %s: %s",
        expr_text(b, ca->pos[1], "the index"), tstr(b, &i->type));
    return ex_err();
  }
  TensorType r = {.dtype = t->type.dtype};
  for (int k = 0; k < i->type.rank; k++) r.dims[r.rank++] = i->type.dims[k];
  for (int k = 1; k < t->type.rank; k++) {
    if (tensor_type_find(&i->type, t->type.dims[k]) >= 0) {
      err(b, expr_span(call), "take: dim %s is in both the index and the table's rows", t->type.dims[k]->name);
      return ex_err();
    }
    if (r.rank == MAX_RANK) {
      err(b, expr_span(call), "a tensor has at most %d dims; the result would have more", MAX_RANK);
      return ex_err();
    }
    r.dims[r.rank++] = t->type.dims[k];
  }
  Value *ops[2] = {tab.v, idx.v};
  return ex_val(emit(b, OP_TAKE, expr_span(call), ops, 2, r));
}

/* f32(x) etc.: a cast to the dtype; a no-op when x has it already. */
static Ex lower_cast(Builder *b, const Node *call, DType dt, Ex x) {
  if (x.kind == EX_ERR) return x;
  if (x.kind == EX_LIT) {
    Value *c = materialize(b, x, dt, expr_span(call), NULL, NULL);
    return ex_val(c);
  }
  if (x.v->type.dtype == dt) return x;
  TensorType t = x.v->type;
  t.dtype = dt;
  return ex_val(emit(b, OP_CAST, expr_span(call), &x.v, 1, t));
}

static const FnDecl *model_fn(const Model *m, Name n) {
  if (!m) return NULL;
  for (int i = 0; i < m->nfns; i++)
    if (m->fns[i].name == n) return &m->fns[i];
  return NULL;
}

/* size(d): dim d's global size, as a number literal (language.md, fixed): it follows -D, and the
 * elementwise functions of numbers fold it (`rsqrt(size(head))` is a constant the attention
 * pattern still fuses). */
static Ex lower_size(Builder *b, const Node *call) {
  CallArgs ca;
  bool ok = call_args(b, call, "size", false, &ca);
  if (!arity(b, call, "size", &ca, 1) || !ok) return ex_err();
  const Node *arg = ca.pos[0];
  if (arg->kind == N_NAME && !find_dim(b->p, arg->name) && lookup(b, arg->name)) {
    err(b, arg->loc, "size takes a dim, as in size(head); %s is a value, not a dim", arg->name);
    return ex_err();
  }
  Dim *d = dim_ref(b, arg);
  if (!d) return ex_err();
  return ex_lit((double)d->size, false);
}

/* route(l, top: k, over: e, tokens: t, slots: c) (language.md, fixed): l a float tensor, e and t
 * two different dims of it, c a declared dim it lacks, k a whole number in [1, |e|]; the result is
 * f32 with l's dims then c (route.h). Its named arguments are its own, so it reads them itself. */
static Ex lower_route(Builder *b, const Node *call) {
  static const char *const keys[4] = {"top", "over", "tokens", "slots"};
  const Node *named[4] = {NULL, NULL, NULL, NULL}, *logits = NULL;
  bool ok = true;
  int npos = 0;
  for (const Node *a = call->items; a; a = a->next) {
    if (a->kind != N_NAMED_ARG) {
      if (npos++ == 0) logits = a;
      continue;
    }
    int k = 0;
    while (k < 4 && strcmp(a->name, keys[k]) != 0) k++;
    if (k == 4) {
      err(b, nloc(a), "unknown named argument %s: in route (it takes top:, over:, tokens: and slots:)", a->name);
      ok = false;
    } else if (named[k]) {
      err(b, nloc(a), "%s: is given twice", keys[k]);
      ok = false;
    } else {
      named[k] = a;
    }
  }
  if (npos != 1) {
    err(b, expr_span(call), "route takes 1 argument (the logits) and top:, over:, tokens:, slots:, found %d "
        "arguments", npos);
    return ex_err();
  }
  for (int k = 0; k < 4; k++)
    if (!named[k]) {
      err(b, expr_span(call), "route needs %s: (route(logits, top: 2, over: expert, tokens: seq, slots: cap))",
          keys[k]);
      ok = false;
    }
  if (!ok) return ex_err();
  Ex l = need_tensor(b, lower_expr(b, logits), logits, "route");
  Ex top = lower_expr(b, named[0]->value);
  Dim *e = dim_ref(b, named[1]->value), *t = dim_ref(b, named[2]->value), *c = dim_ref(b, named[3]->value);
  if (l.kind != EX_VAL || top.kind == EX_ERR || !e || !t || !c) return ex_err();
  const Value *x = l.v;
  if (!need_float(b, x, logits, "route")) return ex_err();
  SrcLoc eloc = expr_span(named[1]->value), tloc = expr_span(named[2]->value), cloc = expr_span(named[3]->value);
  if (tensor_type_find(&x->type, e) < 0) {
    err(b, eloc, "route over %s: %s: %s has no dim %s", e->name, expr_text(b, logits, "the logits"),
        tstr(b, &x->type), e->name);
    return ex_err();
  }
  if (tensor_type_find(&x->type, t) < 0) {
    err(b, tloc, "route tokens %s: %s: %s has no dim %s", t->name, expr_text(b, logits, "the logits"),
        tstr(b, &x->type), t->name);
    return ex_err();
  }
  if (t == e) {
    err(b, tloc, "route needs the tokens dim to differ from the experts dim, found %s for both", e->name);
    return ex_err();
  }
  if (tensor_type_find(&x->type, c) >= 0) {
    err(b, cloc, "route slots %s: the slot dim must be new, but %s: %s has it already", c->name,
        expr_text(b, logits, "the logits"), tstr(b, &x->type));
    return ex_err();
  }
  SrcLoc kloc = expr_span(named[0]->value);
  if (top.kind != EX_LIT || top.is_float || top.num != floor(top.num)) {
    err(b, kloc, "route's top: must be a whole number (how many experts each token picks)");
    return ex_err();
  }
  if (top.num < 1 || top.num > (double)e->size) {
    err(b, kloc, "route's top: is %g, but a token can pick 1 to %lld experts (%s = %lld)", top.num,
        (long long)e->size, e->name, (long long)e->size);
    return ex_err();
  }
  if (x->type.rank == MAX_RANK) {
    err(b, expr_span(call), "a tensor has at most %d dims; route's result would have more", MAX_RANK);
    return ex_err();
  }
  TensorType r = x->type;
  r.dtype = DT_F32;
  r.dims[r.rank++] = c;
  Dim *dims[3] = {e, t, c};
  Value *ops[1] = {l.v};
  Value *v = emit_dims(b, OP_ROUTE, expr_span(call), ops, 1, r, dims, 3);
  v->def->index = (int)top.num;
  return ex_val(v);
}

/* Calls of model functions are inlined: each argument converted to the declared type (a
 * boundary), the callee's body lowered with its params bound to `inst`. */
static Ex call_fn(Builder *b, const Node *call, const FnDecl *fn, Inst *inst, const char *shown) {
  CallArgs ca;
  bool ok = call_args(b, call, shown, false, &ca);
  Ex *args = ARENA_ARRAY(&b->ck->tmp, Ex, ca.npos + 1); /* off the stack: calls nest deeply */
  for (int i = 0; i < ca.npos; i++) {
    args[i] = lower_expr(b, ca.pos[i]);
    if (args[i].kind == EX_ERR) ok = false;
  }
  if (!arity(b, call, shown, &ca, fn->nargs)) return ex_err();
  if (!ok) return ex_err();
  for (int i = 0; i < fn->nargs; i++) {
    char what[256];
    snprintf(what, sizeof what, "argument %s of %s", fn->args[i].name, shown);
    args[i] = to_spec(b, args[i], &fn->args[i].type, expr_span(ca.pos[i]), what);
    if (args[i].kind == EX_ERR) ok = false;
  }
  if (!ok) return ex_err();
  for (int i = 0; i < b->depth; i++)
    if (b->stack[i] == fn) {
      err(b, expr_span(call), "recursive call: %s is already being called (functions cannot recurse)", shown);
      return ex_err();
    }
  if (b->depth == MAX_INLINE_DEPTH) {
    err(b, expr_span(call), "calls are nested more than %d deep", MAX_INLINE_DEPTH);
    return ex_err();
  }
  return lower_fn(b, fn, inst, args);
}

/* a.forward(x): a a model param of the current model, or the instance of an enclosing `for`. */
static Ex lower_member_call(Builder *b, const Node *call) {
  const Node *mem = call->lhs, *obj = mem->lhs;
  if (!obj || obj->kind != N_NAME) {
    err(b, expr_span(mem), "expected a model param before .%s", mem->name);
    return ex_err();
  }
  Binding *x = lookup(b, obj->name);
  if (!x) {
    undefined(b, obj->name, obj->loc);
    return ex_err();
  }
  if (x->kind != B_INST) {
    if (x->ex.kind == EX_ERR) return ex_err();
    err(b, obj->loc, "%s is %s, not a model; only a model param's fns can be called (like attn.forward(x))",
        obj->name, x->ex.kind == EX_LIT ? "a number" : "a tensor");
    return ex_err();
  }
  Inst *in = x->inst;
  if (!in) return ex_err();
  if (in->stacked) {
    err(b, obj->loc,
        "wrong stacked-model use: %s is a stack of %lld %s models; call one inside `for b in %s { ... b.%s(...) ... }`",
        obj->name, (long long)(in->stack_dim ? in->stack_dim->size : 0), in->model->name, obj->name, mem->name);
    return ex_err();
  }
  const FnDecl *fn = model_fn(in->model, mem->name);
  if (!fn) {
    char list[256] = "";
    for (int i = 0; i < in->model->nfns; i++) {
      size_t l = strlen(list);
      snprintf(list + l, sizeof list - l, "%s%s", i ? ", " : " (it has: ", in->model->fns[i].name);
    }
    if (list[0]) {
      size_t l = strlen(list);
      snprintf(list + l, sizeof list - l, ")");
    }
    Suggest sg = suggest_begin(mem->name);
    for (int i = 0; i < in->model->nfns; i++) suggest_try(&sg, in->model->fns[i].name);
    char sb[160];
    err(b, nloc(mem), "model %s has no fn %s%s%s", in->model->name, mem->name, suggest_text(&sg, sb, sizeof sb), list);
    return ex_err();
  }
  char shown[200];
  snprintf(shown, sizeof shown, "%s.%s", obj->name, fn->name);
  return call_fn(b, call, fn, in, shown);
}

static Ex lower_call(Builder *b, const Node *call) {
  const Node *callee = call->lhs;
  if (callee && callee->kind == N_MEMBER) return lower_member_call(b, call);
  if (!callee || callee->kind != N_NAME) {
    err(b, expr_span(callee ? callee : call), "only functions and model fns can be called");
    return ex_err();
  }
  Name fname = callee->name;
  if (strcmp(fname, "size") == 0) return lower_size(b, call);
  if (strcmp(fname, "route") == 0) return lower_route(b, call);
  DType cast = dtype_from_name(fname);
  const Builtin *bi = find_builtin(fname);
  CallArgs ca;
  if (cast != DT_NONE) {
    bool ok = call_args(b, call, fname, false, &ca);
    if (!arity(b, call, fname, &ca, 1) || !ok) return ex_err();
    return lower_cast(b, call, cast, lower_expr(b, ca.pos[0]));
  }
  if (!bi) {
    const FnDecl *fn = b->inst ? model_fn(b->inst->model, fname) : NULL;
    if (fn) return call_fn(b, call, fn, b->inst, fname);
    Suggest s = suggest_begin(worth_suggesting() ? fname : NULL);
    suggest_builtins(&s);
    suggest_try(&s, "size");
    suggest_try(&s, "route");
    for (int i = 0; i < DT__COUNT; i++) suggest_try(&s, dtype_name((DType)i));
    for (int i = 0; b->inst && i < b->inst->model->nfns; i++) suggest_try(&s, b->inst->model->fns[i].name);
    char sb[160];
    err(b, callee->loc, "unknown function %s%s (known: %s)", fname, suggest_text(&s, sb, sizeof sb), known_functions(b));
    return ex_err();
  }
  bool ok = call_args(b, call, fname, bi->over != OVER_NO, &ca);
  if (!arity(b, call, fname, &ca, bi->nargs)) return ex_err();
  if (bi->over != OVER_NO && !ca.over) {
    err(b, expr_span(call), "%s needs over: %s", fname, bi->over == OVER_ONE ? "d" : "d or over: (d1, d2)");
    ok = false;
  }
  Dim *over[MAX_RANK];
  SrcLoc over_loc[MAX_RANK];
  int nover = 0;
  if (ca.over) {
    if (bi->over == OVER_ONE && ca.over->kind == N_TUPLE) {
      err(b, expr_span(ca.over), "%s takes one dim in over:", fname);
      ok = false;
    } else {
      nover = dim_list(b, ca.over, over, over_loc, MAX_RANK);
      if (nover < 0) ok = false;
    }
  }
  /* The value arguments (split/merge's arrow and causal's dims are read by their lowering). */
  Ex a[3] = {ex_err(), ex_err(), ex_err()};
  int nvals = bi->op == OP_SPLIT || bi->op == OP_MERGE || bi->op == OP_CAUSAL || bi->op == OP_DROPOUT ? 1 : bi->nargs;
  for (int i = 0; i < nvals; i++) {
    a[i] = lower_expr(b, ca.pos[i]);
    if (a[i].kind == EX_ERR) ok = false;
  }
  if (!ok) return ex_err();
  SrcLoc loc = expr_span(call);
  if (is_call_op(bi->op)) return lower_unary_fn(b, bi, call, ca.pos[0], a[0]);
  switch (bi->op) { /* each builtin's own checks and result type */
  case OP_SUM: case OP_MEAN: case OP_MAX: {
    a[0] = need_tensor(b, a[0], ca.pos[0], fname);
    if (a[0].kind != EX_VAL) return ex_err();
    Value *x = a[0].v;
    if (bi->op == OP_MEAN && !need_float(b, x, ca.pos[0], fname)) return ex_err();
    if (!dims_in(b, fname, ca.pos[0], x, over, over_loc, nover)) return ex_err();
    TensorType t = {.dtype = x->type.dtype};
    for (int i = 0; i < x->type.rank; i++) {
      bool drop = false;
      for (int k = 0; k < nover; k++) drop |= over[k] == x->type.dims[i];
      if (!drop) t.dims[t.rank++] = x->type.dims[i];
    }
    return ex_val(emit_dims(b, bi->op, loc, &x, 1, t, over, nover));
  }
  case OP_SOFTMAX: {
    a[0] = need_tensor(b, a[0], ca.pos[0], fname);
    if (a[0].kind != EX_VAL) return ex_err();
    Value *x = a[0].v;
    if (!need_float(b, x, ca.pos[0], fname) || !dims_in(b, fname, ca.pos[0], x, over, over_loc, nover))
      return ex_err();
    return ex_val(emit_dims(b, OP_SOFTMAX, loc, &x, 1, x->type, over, nover));
  }
  case OP_RMSNORM: case OP_LAYERNORM: {
    a[0] = need_tensor(b, a[0], ca.pos[0], fname);
    if (a[0].kind != EX_VAL) return ex_err();
    Value *x = a[0].v;
    if (!need_float(b, x, ca.pos[0], fname) || !dims_in(b, fname, ca.pos[0], x, over, over_loc, nover))
      return ex_err();
    if (!norm_operand(b, fname, "scale", ca.pos[1], a[1], ca.pos[0], x)) return ex_err();
    if (bi->op == OP_LAYERNORM && !norm_operand(b, fname, "bias", ca.pos[2], a[2], ca.pos[0], x)) return ex_err();
    Value *ops[3] = {x, a[1].v, a[2].v};
    return ex_val(emit_dims(b, bi->op, loc, ops, bi->nargs, x->type, over, nover));
  }
  case OP_CONTRACT: {
    a[0] = need_tensor(b, a[0], ca.pos[0], fname);
    a[1] = need_tensor(b, a[1], ca.pos[1], fname);
    if (a[0].kind != EX_VAL || a[1].kind != EX_VAL) return ex_err();
    return lower_contract(b, loc, ca.pos[0], a[0].v, ca.pos[1], a[1].v, over, over_loc, nover, false);
  }
  case OP_SPLIT: case OP_MERGE: {
    a[0] = need_tensor(b, a[0], ca.pos[0], fname);
    return bi->op == OP_SPLIT ? lower_split(b, call, &ca, a[0]) : lower_merge(b, call, &ca, a[0]);
  }
  case OP_TAKE:
    a[0] = need_tensor(b, a[0], ca.pos[0], fname);
    a[1] = need_tensor(b, a[1], ca.pos[1], fname);
    return lower_take(b, call, &ca, a[0], a[1]);
  case OP_CAUSAL: {
    a[0] = need_tensor(b, a[0], ca.pos[0], fname);
    Dim *q = dim_ref(b, ca.pos[1]), *k = dim_ref(b, ca.pos[2]);
    if (a[0].kind != EX_VAL || !q || !k) return ex_err();
    Value *s = a[0].v;
    Dim *qk[2] = {q, k};
    SrcLoc ql[2] = {ca.pos[1]->loc, ca.pos[2]->loc};
    if (q == k) {
      err(b, ca.pos[2]->loc, "causal needs two different dims (query, key), found %s twice", q->name);
      return ex_err();
    }
    if (!dims_in(b, fname, ca.pos[0], s, qk, ql, 2)) return ex_err();
    return ex_val(emit_dims(b, OP_CAUSAL, loc, &s, 1, s->type, qk, 2));
  }
  case OP_DROPOUT: { /* dropout(x, p): p a number literal in [0, 1); p = 0 is x itself */
    a[0] = need_tensor(b, a[0], ca.pos[0], fname);
    if (a[0].kind != EX_VAL) return ex_err();
    Value *x = a[0].v;
    if (!need_float(b, x, ca.pos[0], fname)) return ex_err();
    const Node *pn = ca.pos[1];
    double pv = pn->kind == N_NUM ? (pn->num.is_float ? pn->num.f : (double)pn->num.i) : NAN;
    if (pn->kind != N_NUM) {
      err(b, expr_span(pn), "dropout's probability must be a number literal");
      return ex_err();
    }
    if (!(pv >= 0 && pv < 1)) {
      err(b, expr_span(pn), "dropout's probability must be in [0, 1), found %g", pv);
      return ex_err();
    }
    if (pv == 0) return ex_val(x);
    Value *r = emit_dims(b, OP_DROPOUT, loc, &x, 1, x->type, x->type.dims, x->type.rank);
    r->def->scalar = pv;
    /* the seed: the call site (the same in every sharding of the program) */
    r->def->index = (int)(((uint32_t)loc.line * 2654435761u ^ (uint32_t)loc.col * 40503u) & 0x7fffffff);
    return ex_val(r);
  }
  default:
    return ex_err();
  }
}

static Ex lower_expr(Builder *b, const Node *n) {
  if (!n) return ex_err();
  switch (n->kind) {
  case N_NUM: return ex_lit(n->num.is_float ? n->num.f : (double)n->num.i, n->num.is_float);
  case N_NAME: return lower_name(b, n);
  case N_BINARY: return lower_binary(b, n);
  case N_UNARY: return lower_neg(b, n);
  case N_CALL: return lower_call(b, n);
  case N_RENAME: return lower_rename(b, n);
  case N_MEMBER:
    err(b, expr_span(n), "%s is a function; call it with (...)", expr_text(b, n, "this"));
    return ex_err();
  case N_TUPLE:
    err(b, expr_span(n), "a tuple is not a value; tuples of dims go after over: and in split or merge");
    return ex_err();
  case N_ARROW:
    err(b, expr_span(n), "an arrow `a -> b` is only an argument of split or merge");
    return ex_err();
  case N_NAMED_ARG:
    err(b, expr_span(n), "a named argument like over: only goes in a call");
    return ex_err();
  case N_STRING:
    err(b, n->loc, "a string is not a value");
    return ex_err();
  default:
    err(b, n->loc, "expected an expression");
    return ex_err();
  }
}

/* ---- statements ---- */

static void lower_stmt(Builder *b, const Node *s);

static void already_defined(Builder *b, SrcLoc loc, Name name, const Binding *prev) {
  err(b, loc, "%s is already defined", name);
  if (prev->is_param) note(b, prev->loc, "%s is a param of this model", name);
  else note(b, prev->loc, "%s was first defined here", name);
}

/* let x = e / let x: T = e: a new name (shadowing none visible); with T, e must have T's dtype
 * and dim set and becomes a value in T's order carrying T (a sharding constraint). */
static void lower_let(Builder *b, const Node *s) {
  Binding *prev = lookup(b, s->name);
  if (prev) already_defined(b, nloc(s), s->name, prev);
  Ex e = lower_expr(b, s->value);
  if (s->type) {
    const TypeSpec *spec = spec_from_ast(b, s->type);
    char what[200];
    snprintf(what, sizeof what, "type of %s", s->name);
    e = spec ? to_spec(b, e, spec, expr_span(s->value), what) : ex_err();
  }
  if (prev) return;
  if (e.kind == EX_VAL && !e.v->name) e.v->name = s->name;
  bind(b, b->scope, s->name, B_VALUE, e, NULL, nloc(s));
}

/* x = e: x bound before (not a param), e of the same type (dtype and dim set; transposed back to
 * x's order). Inside a loop body, only names bound before the loop or in the body. */
static void lower_assign(Builder *b, const Node *s) {
  bool crossed = false;
  Binding *x = lookup2(b, s->name, &crossed);
  Ex e = lower_expr(b, s->value);
  SrcLoc loc = nloc(s);
  if (!x) {
    undefined(b, s->name, loc);
    return;
  }
  if (x->kind == B_PARAM) {
    err(b, loc, "cannot assign to param %s", s->name);
    return;
  }
  if (x->kind == B_INST) {
    err(b, loc, "cannot assign to %s: it is a model", s->name);
    return;
  }
  if (e.kind == EX_ERR || x->ex.kind == EX_ERR) return;
  if (x->ex.kind == EX_LIT) {
    if (crossed) err(b, loc, "%s holds a number; a loop body cannot rebind it", s->name);
    else if (e.kind != EX_LIT) err(b, loc, "%s holds a number; it cannot be rebound to a tensor (use a new name)", s->name);
    else x->ex = e;
    return;
  }
  const TensorType *want = &x->ex.v->type;
  if (e.kind == EX_LIT) {
    err(b, expr_span(s->value), "rebinding %s changes its type: expected %s, found a number", s->name, tstr(b, want));
    return;
  }
  Value *v = use_in(b, b->fn, e.v);
  if (v->type.dtype != want->dtype || !tensor_type_same_dims(&v->type, want)) {
    err(b, expr_span(s->value), "rebinding %s changes its type: expected %s, found %s%s", s->name, tstr(b, want),
        tstr(b, &v->type), contract_hint(b, v));
    return;
  }
  if (!tensor_type_equal(&v->type, want)) {
    TensorType t = *want;
    v = emit(b, OP_TRANSPOSE, expr_span(s->value), &v, 1, t);
  }
  if (!v->name) v->name = s->name;
  x->ex = ex_val(v);
}

/* The names a loop body assigns (nested loops included), each once. */
static void collect_assigned(Builder *b, const Node *stmts, NameVec *out) {
  for (const Node *s = stmts; s; s = s->next) {
    if (s->kind == N_FOR) collect_assigned(b, s->body, out);
    if (s->kind != N_ASSIGN) continue;
    bool dup = false;
    for (int i = 0; i < out->len; i++) dup |= out->data[i] == s->name;
    if (!dup) VEC_PUSH(&b->ck->tmp, *out, s->name);
  }
}

static TypeSpec *spec_drop_first(Builder *b, const TypeSpec *s) {
  TypeSpec *r = ARENA_NEW(b->m->arena, TypeSpec);
  r->dtype = s->dtype;
  r->loc = s->loc;
  r->rank = s->rank > 0 ? s->rank - 1 : 0;
  for (int i = 1; i < s->rank; i++) {
    r->dims[i - 1] = s->dims[i];
    r->nat[i - 1] = s->nat[i];
    r->dim_loc[i - 1] = s->dim_loc[i];
    memcpy(r->at[i - 1], s->at[i], sizeof r->at[i]);
  }
  return r;
}

/* One iteration's view of a stacked instance: every leaf becomes a body input without the
 * leading stacking dim (the leaf's outer value an operand of the loop), depth first in
 * declaration order, the same order as the params' paths. Nested stacks stay stacked. */
static Inst *inst_slice(Builder *b, const Inst *st, IrFunc *body, ValueVec *ops, int depth) {
  const Model *mo = st->model;
  Inst *r = ARENA_NEW(b->m->arena, Inst);
  r->model = mo;
  r->path = st->path;
  r->stacked = depth > 0 && st->stacked;
  r->stack_dim = depth > 0 ? st->stack_dim : NULL;
  r->tensor = ARENA_ARRAY(b->m->arena, Value *, mo->nparams + 1);
  r->spec = ARENA_ARRAY(b->m->arena, const TypeSpec *, mo->nparams + 1);
  r->sub = ARENA_ARRAY(b->m->arena, Inst *, mo->nparams + 1);
  for (int i = 0; i < mo->nparams; i++) {
    if (st->tensor[i]) {
      Value *outer = use_in(b, b->fn, st->tensor[i]);
      VEC_PUSH(&b->ck->tmp, *ops, outer);
      TensorType t = outer->type;
      if (t.rank > 0) {
        for (int k = 1; k < t.rank; k++) t.dims[k - 1] = t.dims[k];
        t.rank--;
      }
      Value *in = ir_func_add_input(b->m, body, t, outer->name);
      const TypeSpec *spec = st->spec[i] ? spec_drop_first(b, st->spec[i]) : NULL;
      in->spec = spec;
      r->tensor[i] = in;
      r->spec[i] = spec;
    }
    if (st->sub[i]) r->sub[i] = inst_slice(b, st->sub[i], body, ops, depth + 1);
  }
  return r;
}

typedef struct Carried {
  Name name;
  Binding *outer;   /* the binding before the loop (rebound to the loop's result) */
  Binding *inner;   /* the body's binding (its final value is the body output) */
} Carried;

/* for b in blocks { ... }: blocks a stacked param; one OP_LOOP whose body takes the slices of
 * blocks' params, then the carried values (names the body rebinds that were bound before), then
 * invariants; count = the stacking dim's size; results rebind the carried names. */
static void lower_for(Builder *b, const Node *s) {
  const Node *it = s->value;
  Binding *src = it && it->kind == N_NAME ? lookup(b, it->name) : NULL;
  if (it && it->kind == N_NAME && !src) {
    undefined(b, it->name, it->loc);
    return;
  }
  if (!src || src->kind != B_INST || (src->inst && !src->inst->stacked)) {
    if (src && src->kind != B_INST && src->ex.kind == EX_ERR) return;
    const char *what = !src                  ? "this is not a name"
                       : src->kind == B_INST ? arena_printf(&b->ck->tmp, "%s is one %s model, not a stack", it->name,
                                                            src->inst->model->name)
                                             : arena_printf(&b->ck->tmp, "%s is a %s", it->name,
                                                            src->ex.kind == EX_LIT ? "number" : "tensor");
    err(b, expr_span(it),
        "wrong stacked-model use: `for` iterates a stacked param (declared like `param blocks: block[layers]`); %s",
        what);
    return;
  }
  Inst *stack = src->inst;
  if (!stack) return;
  for (Loop *l = b->loop; l; l = l->outer)
    if (l->iterated == stack) {
      err(b, expr_span(it), "wrong stacked-model use: the enclosing loop already iterates %s", it->name);
      return;
    }
  Binding *prev = lookup(b, s->name);
  if (prev) already_defined(b, nloc(s), s->name, prev);

  IrModule *m = b->m;
  IrFunc *body = ir_func_new(m, stack->path ? stack->path : it->name, b->fn);
  Loop loop = {.body = body, .outer = b->loop, .iterated = stack};
  Scope ls = {.parent = b->scope, .loop = &loop};
  ValueVec ops = {0};
  Inst *slice = inst_slice(b, stack, body, &ops, 0);
  int nslices = ops.len;
  bind(b, &ls, s->name, B_INST, ex_err(), slice, nloc(s));

  NameVec names = {0};
  collect_assigned(b, s->body, &names);
  VEC(Carried) carried = {0};
  for (int i = 0; i < names.len; i++) {
    Binding *o = lookup(b, names.data[i]);
    if (!o || o->kind != B_VALUE || o->ex.kind != EX_VAL) continue;
    Value *outer = use_in(b, b->fn, o->ex.v);
    VEC_PUSH(&b->ck->tmp, ops, outer);
    Value *in = ir_func_add_input(m, body, outer->type, names.data[i]);
    Carried c = {names.data[i], o, bind(b, &ls, names.data[i], B_VALUE, ex_val(in), NULL, o->loc)};
    VEC_PUSH(&b->ck->tmp, carried, c);
  }

  IrFunc *save_fn = b->fn;
  Scope *save_scope = b->scope;
  Loop *save_loop = b->loop;
  b->fn = body, b->scope = &ls, b->loop = &loop;
  for (const Node *st = s->body; st; st = st->next) lower_stmt(b, st);
  body->noutputs = carried.len;
  body->outputs = ARENA_ARRAY(m->arena, Value *, carried.len + 1);
  TensorType *types = ARENA_ARRAY(&b->ck->tmp, TensorType, carried.len + 1);
  for (int i = 0; i < carried.len; i++) {
    Binding *in = carried.data[i].inner;
    Value *v = in->ex.kind == EX_VAL ? use_in(b, body, in->ex.v) : body->inputs[nslices + i];
    body->outputs[i] = v;
    types[i] = v->type;
  }
  b->fn = save_fn, b->scope = save_scope, b->loop = save_loop;

  for (int i = 0; i < loop.inv_outer.len; i++) VEC_PUSH(&b->ck->tmp, ops, loop.inv_outer.data[i]);
  Op *op = ir_op_new(m, b->fn, OP_LOOP, srcloc_span(s->loc, it->loc), ops.data, ops.len, types, carried.len);
  op->body = body;
  op->stack_dim = stack->stack_dim;
  op->count = stack->stack_dim ? stack->stack_dim->size : 0;
  op->index = stack->stack_dim ? stack->stack_dim->id : -1;
  op->nslices = nslices;
  op->ncarried = carried.len;
  ir_append(b->fn, op);
  for (int i = 0; i < carried.len; i++) {
    op->results[i]->name = carried.data[i].name;
    carried.data[i].outer->ex = ex_val(op->results[i]);
  }
}

static void lower_stmt(Builder *b, const Node *s) {
  if (!s) return;
  switch (s->kind) {
  case N_LET: lower_let(b, s); break;
  case N_ASSIGN: lower_assign(b, s); break;
  case N_FOR: lower_for(b, s); break;
  case N_RETURN:
    err(b, s->loc, "return inside a for loop (a loop body only rebinds names)");
    break;
  default:
    err(b, s->loc, "expected a statement");
    break;
  }
}

/* A function body with `args` (already converted to the declared types) bound to its arguments
 * and `inst` as its params: the statements in order, then `return e` (last) converted to the
 * declared return type. */
static Ex lower_fn(Builder *b, const FnDecl *fn, Inst *inst, const Ex *args) {
  Scope fs = {.fn_boundary = true};
  Scope *save_scope = b->scope;
  Inst *save_inst = b->inst;
  b->scope = &fs, b->inst = inst;
  b->stack[b->depth++] = fn;
  const Model *mo = inst ? inst->model : NULL;
  for (int i = 0; mo && i < mo->nparams; i++) {
    const ParamDecl *pd = &mo->params[i];
    if (pd->kind == PARAM_TENSOR) {
      Value *v = inst->tensor[i];
      Ex e = v && spec_ok(inst->spec[i]) ? ex_val(v) : ex_err();
      bind(b, &fs, pd->name, B_PARAM, e, NULL, pd->loc)->is_param = true;
    } else {
      bind(b, &fs, pd->name, B_INST, ex_err(), inst->sub[i], pd->loc)->is_param = true;
    }
  }
  for (int i = 0; i < fn->nargs; i++) {
    Binding *prev = lookup(b, fn->args[i].name);
    if (prev) {
      already_defined(b, fn->args[i].loc, fn->args[i].name, prev);
      continue;
    }
    bind(b, &fs, fn->args[i].name, B_VALUE, args[i], NULL, fn->args[i].loc);
  }
  Ex ret = ex_err();
  bool returned = false;
  const Node *body = fn->ast ? fn->ast->body : NULL;
  for (const Node *s = body; s; s = s->next) {
    if (returned) {
      err(b, s->loc, "unreachable statement after return");
      break;
    }
    if (s->kind == N_RETURN) {
      returned = true;
      Ex e = lower_expr(b, s->value);
      ret = to_spec(b, e, &fn->ret, expr_span(s->value), "return type mismatch");
      continue;
    }
    lower_stmt(b, s);
  }
  if (!returned && fn->ast) err(b, fn->loc, "fn %s has no return", fn->name);
  b->depth--;
  b->scope = save_scope, b->inst = save_inst;
  return ret;
}

/* ---- params ---- */

/* How many tensor leaves inst_build will flatten (it skips the same cycles). */
static int count_leaves(const Model *mo, const Model **chain, int depth) {
  if (!mo || depth > MAX_MODEL_DEPTH) return 0;
  for (int k = 0; k < depth; k++)
    if (chain[k] == mo) return 0;
  chain[depth] = mo;
  int n = 0;
  for (int i = 0; i < mo->nparams; i++)
    n += mo->params[i].kind == PARAM_TENSOR ? 1 : count_leaves(mo->params[i].model, chain, depth + 1);
  return n;
}

typedef struct StackCtx {
  Dim *dims[MAX_RANK];
  SrcLoc locs[MAX_RANK];
  int n;
  const Model *chain[MAX_MODEL_DEPTH + 2];
  int depth;
} StackCtx;

/* The instance tree of `mo` with every tensor leaf flattened into m->params (path, type with the
 * enclosing stacking dims first) and read by one OP_PARAM in main. */
static Inst *inst_build(Builder *b, const Model *mo, Name path, StackCtx *sc) {
  IrModule *m = b->m;
  Inst *in = ARENA_NEW(m->arena, Inst);
  in->model = mo;
  in->path = path;
  in->tensor = ARENA_ARRAY(m->arena, Value *, mo->nparams + 1);
  in->spec = ARENA_ARRAY(m->arena, const TypeSpec *, mo->nparams + 1);
  in->sub = ARENA_ARRAY(m->arena, Inst *, mo->nparams + 1);
  sc->chain[sc->depth++] = mo;
  for (int i = 0; i < mo->nparams; i++) {
    const ParamDecl *pd = &mo->params[i];
    Name ppath = path ? intern_cstr(arena_printf(&b->ck->tmp, "%s.%s", path, pd->name)) : pd->name;
    if (pd->kind == PARAM_TENSOR) {
      if (m->nparams >= b->param_cap) continue; /* cannot happen: count_leaves counted these */
      IrParam *ip = &m->params[m->nparams];
      int index = m->nparams++;
      ip->path = ppath;
      ip->loc = pd->loc;
      ip->stack_depth = sc->n;
      TypeSpec *s = &ip->spec;
      *s = pd->type;
      if (spec_ok(&pd->type) && sc->n > 0) {
        if (pd->type.rank + sc->n > MAX_RANK) {
          err(b, pd->loc, "a tensor has at most %d dims; param %s would have %d with its stacking dims", MAX_RANK,
              ppath, pd->type.rank + sc->n);
          s->dtype = DT_NONE;
        } else {
          for (int k = 0; k < sc->n; k++)
            for (int j = 0; j < pd->type.rank; j++)
              if (pd->type.dims[j] == sc->dims[k]) {
                err(b, pd->loc, "param %s already has the stacking dim %s", ppath, sc->dims[k]->name);
                s->dtype = DT_NONE;
              }
          s->rank = pd->type.rank + sc->n;
          for (int k = 0; k < sc->n; k++) {
            s->dims[k] = sc->dims[k];
            s->nat[k] = 0;
            s->dim_loc[k] = sc->locs[k];
          }
          for (int j = 0; j < pd->type.rank; j++) {
            s->dims[sc->n + j] = pd->type.dims[j];
            s->nat[sc->n + j] = pd->type.nat[j];
            s->dim_loc[sc->n + j] = pd->type.dim_loc[j];
            memcpy(s->at[sc->n + j], pd->type.at[j], sizeof s->at[0]);
          }
        }
      }
      ip->type = spec_ok(s) ? tensor_type_from_spec(s) : (TensorType){.dtype = DT_NONE};
      if (!size_fits(b, pd->loc, &ip->type)) ip->type.dtype = DT_NONE, s->dtype = DT_NONE;
      Op *op = ir_emit(m, m->main, OP_PARAM, pd->loc, NULL, 0, ip->type);
      op->index = index;
      Value *v = ir_result(op);
      v->name = ppath;
      v->spec = s;
      in->tensor[i] = v;
      in->spec[i] = s;
      continue;
    }
    const Model *sub = pd->model;
    if (!sub) continue;
    bool cycle = false;
    for (int k = 0; k < sc->depth; k++) cycle |= sc->chain[k] == sub;
    if (cycle) {
      err(b, pd->loc, "model %s contains itself (through param %s)", sub->name, ppath);
      continue;
    }
    if (sc->depth >= MAX_MODEL_DEPTH) {
      err(b, pd->loc, "models nest at most %d deep; param %s holds one %d deep", MAX_MODEL_DEPTH, ppath,
          sc->depth + 1);
      continue;
    }
    if (pd->kind == PARAM_STACK) {
      if (!pd->stack_dim) continue;
      if (sc->n == MAX_RANK) {
        err(b, pd->loc, "stacked models are nested more than %d deep", MAX_RANK);
        continue;
      }
      sc->dims[sc->n] = pd->stack_dim;
      sc->locs[sc->n] = pd->loc;
      sc->n++;
      in->sub[i] = inst_build(b, sub, ppath, sc);
      sc->n--;
      in->sub[i]->stacked = true;
      in->sub[i]->stack_dim = pd->stack_dim;
    } else {
      in->sub[i] = inst_build(b, sub, ppath, sc);
    }
  }
  sc->depth--;
  return in;
}

/* The module for one function: its model's params, its inputs, its body. */
static IrModule *build_module(Check *ck, Arena *a, const Program *p, const FnDecl *fn) {
  IrModule *m = ir_module_new(a, p);
  m->entry = fn;
  Builder b = {.p = p, .m = m, .ck = ck};
  m->main = b.fn = ir_func_new(m, fn->name, NULL);
  const Model *chain[MAX_MODEL_DEPTH + 2];
  int n = count_leaves(fn->model, chain, 0);
  m->params = ARENA_ARRAY(a, IrParam, n + 1);
  b.param_cap = n;
  Inst *root = NULL;
  if (fn->model) {
    StackCtx sc = {0};
    root = inst_build(&b, fn->model, NULL, &sc);
  }
  IrFunc *f = m->main;
  f->inputs = ARENA_ARRAY(a, Value *, fn->nargs + 1);
  f->cap_inputs = fn->nargs + 1;
  Ex *args = ARENA_ARRAY(a, Ex, fn->nargs + 1);
  for (int i = 0; i < fn->nargs; i++) {
    const TypeSpec *s = &fn->args[i].type;
    TensorType t = spec_ok(s) ? tensor_type_from_spec(s) : (TensorType){.dtype = DT_NONE};
    Op *op = ir_emit(m, f, OP_INPUT, fn->args[i].loc, NULL, 0, t);
    op->index = i;
    Value *v = ir_result(op);
    v->name = fn->args[i].name;
    v->spec = s;
    f->inputs[f->ninputs++] = v;
    args[i] = spec_ok(s) ? ex_val(v) : ex_err();
  }
  Ex r = lower_fn(&b, fn, root, args);
  if (r.kind == EX_VAL) {
    f->outputs = ARENA_ARRAY(a, Value *, 1);
    f->outputs[0] = use_in(&b, f, r.v);
    f->noutputs = 1;
  }
  return m;
}

IrModule *ir_build(Arena *a, const Program *p) {
  if (!p) return NULL;
  int before = diag_error_count();
  Check ck = {0};
  arena_init(&ck.tmp);
  IrModule *m = p->entry ? build_module(&ck, a, p, p->entry) : NULL;
  /* The other functions of the main file's models (library models are checked where a program
   * uses them: they may name dims only their users declare, as stdlib/layers.shard does). */
  for (int i = 0; i < p->nmodels; i++) {
    const Model *mo = p->models[i];
    if (!mo || (p->main_file && mo->loc.file != p->main_file)) continue;
    for (int k = 0; k < mo->nfns; k++) {
      if (&mo->fns[k] == p->entry) continue;
      Arena scratch;
      arena_init(&scratch);
      build_module(&ck, &scratch, p, &mo->fns[k]);
      arena_free(&scratch);
    }
  }
  arena_free(&ck.tmp);
  if (!m || diag_error_count() > before) return NULL;
  ir_fuse_attention(m);
  ir_route_mark(m);
  return m;
}
