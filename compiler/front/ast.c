/* ast.c: building syntax trees.
 *
 * The generic pieces of ast.h (ast_new, lists, kind names) and the constructors the grammar's
 * actions call (ast_build.h). A constructor decides only where a node is: `loc` spans the construct
 * on its first line (keyword through name for declarations, the whole expression for expressions),
 * `name_loc` is the declared name, key or operator. Expression constructors also track the tree's
 * height and stop the parse, with one diagnostic, past PARSE_MAX_EXPR_DEPTH. */
#include <string.h>

#include "ast_build.h"
#include "diag.h"

static const char *const kind_names[] = {
#define X(e, s) s,
  AST_NODE_KINDS(X)
#undef X
};

const char *ast_kind_name(NodeKind k) {
  return (unsigned)k < ARRAY_LEN(kind_names) ? kind_names[k] : "?";
}

Node *ast_new(Arena *a, NodeKind kind, SrcLoc loc) {
  Node *n = ARENA_NEW(a, Node);
  n->kind = kind;
  n->loc = loc;
  n->name_loc = loc;
  return n;
}

NodeList ast_list_empty(void) { return (NodeList){NULL, NULL, 0}; }

NodeList ast_list_one(Node *n) { return ast_list_append(ast_list_empty(), n); }

/* NULL items (what an `error` production yields) are dropped, so recovery leaves no holes. */
NodeList ast_list_append(NodeList l, Node *n) {
  if (!n) return l;
  n->next = NULL;
  if (l.tail) l.tail->next = n;
  else l.head = n;
  l.tail = n;
  l.n++;
  return l;
}

NodeList ast_list_prepend(Node *n, NodeList l) {
  if (!n) return l;
  n->next = l.head;
  l.head = n;
  if (!l.tail) l.tail = n;
  l.n++;
  return l;
}

/* ---- helpers ---- */

static Node *node(ParseCtx *P, NodeKind kind, SrcLoc loc) { return ast_new(P->arena, kind, loc); }

static Node *named(ParseCtx *P, NodeKind kind, SrcLoc loc, const Token *name) {
  Node *n = node(P, kind, loc);
  n->name = name->name;
  n->name_loc = name->loc;
  return n;
}

static int depth_of(const Node *n) { return n ? n->depth : 0; }

static int list_depth(const Node *n) {
  int d = 0;
  for (; n; n = n->next)
    if (n->depth > d) d = n->depth;
  return d;
}

/* Set the node's height to one more than its tallest child; past the limit, report once and stop
 * the parse (the driver checks P->aborted after every token). */
static Node *grown(ParseCtx *P, Node *n, int child_depth) {
  n->depth = child_depth + 1;
  if (n->depth > PARSE_MAX_EXPR_DEPTH && !P->aborted) {
    diag_error(n->name_loc, "expression nested too deeply (more than %d levels)", PARSE_MAX_EXPR_DEPTH);
    P->aborted = true;
  }
  return n;
}

/* ---- declarations ---- */

Node *ast_import(ParseCtx *P, const Token *kw, const Token *path) {
  Node *n = node(P, N_IMPORT, srcloc_span(kw->loc, path->loc));
  n->str = path->name;
  n->name_loc = path->loc;
  return n;
}

Node *ast_target(ParseCtx *P, const Token *kw, const Token *name, Node *kvs) {
  Node *n = named(P, N_TARGET, srcloc_span(kw->loc, name->loc), name);
  n->kvs = kvs;
  return n;
}

Node *ast_mesh(ParseCtx *P, const Token *kw, const Token *name, const Token *target, Node *axes) {
  Node *n = named(P, N_MESH, srcloc_span(kw->loc, name->loc), name);
  n->target = ast_name(P, target);
  n->items = axes;
  return n;
}

Node *ast_mesh_axis(ParseCtx *P, const Token *name, const Token *size) {
  Node *n = named(P, N_MESH_AXIS, srcloc_span(name->loc, size->loc), name);
  n->value = ast_num(P, size);
  return n;
}

Node *ast_dim(ParseCtx *P, const Token *name, Node *value) {
  Node *n = named(P, N_DIM, srcloc_span(name->loc, value->loc), name);
  n->value = value;
  return n;
}

Node *ast_layout(ParseCtx *P, const Token *kw, const Token *name, Node *rules) {
  Node *n = named(P, N_LAYOUT, srcloc_span(kw->loc, name->loc), name);
  n->items = rules;
  return n;
}

Node *ast_rule(ParseCtx *P, const Token *dim, Node *axes) {
  Node *n = named(P, N_RULE, dim->loc, dim);
  n->items = axes;
  return n;
}

Node *ast_model(ParseCtx *P, const Token *kw, const Token *name, Node *items) {
  Node *n = named(P, N_MODEL, srcloc_span(kw->loc, name->loc), name);
  n->items = items;
  return n;
}

Node *ast_param(ParseCtx *P, const Token *kw, const Token *name, Node *type) {
  Node *n = named(P, N_PARAM, srcloc_span(kw->loc, name->loc), name);
  n->type = type;
  return n;
}

Node *ast_fn(ParseCtx *P, const Token *kw, const Token *name, Node *args, Node *ret, Node *body) {
  Node *n = named(P, N_FN, srcloc_span(kw->loc, name->loc), name);
  n->items = args;
  n->type = ret;
  n->body = body;
  return n;
}

Node *ast_fn_arg(ParseCtx *P, const Token *name, Node *type) {
  Node *n = named(P, N_FN_ARG, srcloc_span(name->loc, type->loc), name);
  n->type = type;
  return n;
}

Node *ast_step(ParseCtx *P, const Token *kw, StepKind kind, Node *fn, Node *kvs) {
  Node *n = node(P, N_STEP, srcloc_span(kw->loc, fn->loc));
  n->flag = kind;
  n->value = fn;
  n->kvs = kvs;
  return n;
}

/* ---- key = value bodies ---- */

Node *ast_kv(ParseCtx *P, const Token *key, Node *value) {
  Node *n = named(P, N_KV, srcloc_span(key->loc, value->loc), key);
  n->value = value;
  return n;
}

Node *ast_list_node(ParseCtx *P, const Token *open, Node *items, const Token *close) {
  Node *n = node(P, N_LIST, srcloc_span(open->loc, close->loc));
  n->items = items;
  return grown(P, n, list_depth(items));
}

Node *ast_block(ParseCtx *P, const Token *open, Node *kvs, const Token *close) {
  Node *n = node(P, N_BLOCK, srcloc_span(open->loc, close->loc));
  n->kvs = kvs;
  return n;
}

/* ---- types ---- */

Node *ast_type(ParseCtx *P, const Token *name, Node *dims, bool brackets, const Token *close) {
  Node *n = named(P, N_TYPE, close ? srcloc_span(name->loc, close->loc) : name->loc, name);
  n->items = dims;
  n->flag = brackets;
  return n;
}

Node *ast_tdim(ParseCtx *P, const Token *name, const Token *at, Node *axes) {
  SrcLoc loc = name->loc;
  for (Node *a = axes; a; a = a->next) loc = srcloc_span(loc, a->loc);
  Node *n = named(P, N_TYPE_DIM, loc, name);
  n->items = axes;
  n->flag = at != NULL;
  return n;
}

/* ---- statements ---- */

Node *ast_let(ParseCtx *P, const Token *kw, const Token *name, Node *type, Node *value) {
  Node *n = named(P, N_LET, srcloc_span(kw->loc, value->loc), name);
  n->type = type;
  n->value = value;
  return n;
}

Node *ast_assign(ParseCtx *P, const Token *name, Node *value) {
  Node *n = named(P, N_ASSIGN, srcloc_span(name->loc, value->loc), name);
  n->value = value;
  return n;
}

Node *ast_for(ParseCtx *P, const Token *kw, const Token *var, Node *iter, Node *body) {
  Node *n = named(P, N_FOR, srcloc_span(kw->loc, iter->loc), var);
  n->value = iter;
  n->body = body;
  return n;
}

Node *ast_return(ParseCtx *P, const Token *kw, Node *value) {
  Node *n = node(P, N_RETURN, srcloc_span(kw->loc, value->loc));
  n->value = value;
  return n;
}

/* ---- expressions ---- */

Node *ast_num(ParseCtx *P, const Token *num) {
  Node *n = node(P, N_NUM, num->loc);
  n->num = num->num;
  n->depth = 1;
  return n;
}

/* `-3` as a value in a key = value body: one negative number, written as "-3" whatever the
 * spacing between the sign and the digits. */
Node *ast_neg_num(ParseCtx *P, const Token *minus, const Token *num) {
  Node *n = node(P, N_NUM, srcloc_span(minus->loc, num->loc));
  n->num = num->num;
  n->num.i = -n->num.i;
  n->num.f = -n->num.f;
  n->num.text = arena_printf(P->arena, "-%.*s", num->num.text_len, num->num.text);
  n->num.text_len = num->num.text_len + 1;
  n->depth = 1;
  return n;
}

Node *ast_string(ParseCtx *P, const Token *str) {
  Node *n = node(P, N_STRING, str->loc);
  n->str = str->name;
  n->depth = 1;
  return n;
}

Node *ast_name(ParseCtx *P, const Token *name) {
  Node *n = named(P, N_NAME, name->loc, name);
  n->depth = 1;
  return n;
}

Node *ast_binary(ParseCtx *P, const Token *op, BinOp bop, Node *lhs, Node *rhs) {
  Node *n = node(P, N_BINARY, srcloc_span(lhs->loc, rhs->loc));
  n->name_loc = op->loc;
  n->op = (int)bop;
  n->lhs = lhs;
  n->rhs = rhs;
  int d = depth_of(lhs) > depth_of(rhs) ? depth_of(lhs) : depth_of(rhs);
  return grown(P, n, d);
}

Node *ast_unary(ParseCtx *P, const Token *op, Node *operand) {
  Node *n = node(P, N_UNARY, srcloc_span(op->loc, operand->loc));
  n->name_loc = op->loc;
  n->op = '-';
  n->lhs = operand;
  return grown(P, n, depth_of(operand));
}

Node *ast_call(ParseCtx *P, Node *callee, Node *args, const Token *close) {
  Node *n = node(P, N_CALL, srcloc_span(callee->loc, close->loc));
  n->name_loc = callee->name_loc;
  n->lhs = callee;
  n->items = args;
  int d = list_depth(args);
  return grown(P, n, d > depth_of(callee) ? d : depth_of(callee));
}

Node *ast_member(ParseCtx *P, Node *lhs, const Token *name) {
  Node *n = named(P, N_MEMBER, srcloc_span(lhs->loc, name->loc), name);
  n->lhs = lhs;
  return grown(P, n, depth_of(lhs));
}

Node *ast_rename(ParseCtx *P, Node *lhs, Node *arrows, const Token *close) {
  Node *n = node(P, N_RENAME, srcloc_span(lhs->loc, close->loc));
  n->lhs = lhs;
  n->items = arrows;
  return grown(P, n, depth_of(lhs));
}

Node *ast_arrow(ParseCtx *P, Node *lhs, const Token *arrow, Node *rhs) {
  Node *n = node(P, N_ARROW, srcloc_span(lhs->loc, rhs->loc));
  n->name_loc = arrow->loc;
  n->lhs = lhs;
  n->rhs = rhs;
  int d = depth_of(lhs) > depth_of(rhs) ? depth_of(lhs) : depth_of(rhs);
  return grown(P, n, d);
}

Node *ast_named_arg(ParseCtx *P, const Token *name, Node *value) {
  Node *n = named(P, N_NAMED_ARG, srcloc_span(name->loc, value->loc), name);
  n->value = value;
  return grown(P, n, depth_of(value));
}

/* `(e)` is e itself, located from '(' to ')' so a caret under it covers the parentheses. */
Node *ast_paren(ParseCtx *P, const Token *open, Node *inner, const Token *close) {
  inner->loc = srcloc_span(open->loc, close->loc);
  return inner;
}

Node *ast_tuple(ParseCtx *P, const Token *open, Node *items, const Token *close) {
  Node *n = node(P, N_TUPLE, srcloc_span(open->loc, close->loc));
  n->items = items;
  return grown(P, n, list_depth(items));
}
