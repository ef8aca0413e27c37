/* ast.h: the syntax tree the parser builds (grammar/parser.y) and `shardc parse` prints.
 *
 * One Node type with a kind and a union, allocated from one arena and freed whole. Lists are
 * singly linked through `next` (NodeList while they are being built). Names are interned.
 * The tree is purely syntactic: `f32(x)` is a call, `block[layers]` is a TypeExpr like
 * `bf16[embed, hidden]`; semantic checking (compiler/sema.c) decides what each one is. */
#ifndef SHARDC_AST_H
#define SHARDC_AST_H

#include <stdio.h>
#include "common.h"

/* Node kinds, in the order the printer and tests rely on. X(enum, printed name) */
#define AST_NODE_KINDS(X)                                                            \
  /* top-level declarations */                                                     \
  X(N_IMPORT, "import")         /* str: path as written, without quotes */          \
  X(N_TARGET, "target")         /* name; kvs */                                    \
  X(N_MESH, "mesh")             /* name; target (N_NAME); items: N_MESH_AXIS */     \
  X(N_MESH_AXIS, "axis")        /* name; value: size expression (N_NUM) */          \
  X(N_DIM, "dim")               /* name; value: integer expression (one node per declared dim) */ \
  X(N_LAYOUT, "layout")         /* name; items: N_RULE */                          \
  X(N_RULE, "rule")             /* name: the logical dim; items: N_NAME axes, major to minor */ \
  X(N_MODEL, "model")           /* name; items: N_PARAM and N_FN in source order */  \
  X(N_PARAM, "param")           /* name; type */                                   \
  X(N_FN, "fn")                 /* name; items: N_FN_ARG; type: return type; body */ \
  X(N_FN_ARG, "arg")            /* name; type */                                   \
  X(N_STEP, "step")             /* flag: STEP_TRAIN/STEP_SERVE; value: the fn (N_MEMBER or N_NAME); kvs */ \
  X(N_KV, "kv")                 /* name: key; value */                             \
  /* types */                                                                      \
  X(N_TYPE, "type")             /* name: dtype or model name; items: N_TYPE_DIM; flag: had brackets */ \
  X(N_TYPE_DIM, "tdim")         /* name: dim; items: N_NAME axes (empty: no @); flag: had @ */ \
  /* statements */                                                                 \
  X(N_LET, "let")               /* name; type (optional); value */                 \
  X(N_ASSIGN, "assign")         /* name; value */                                  \
  X(N_FOR, "for")               /* name: loop variable; value: what it iterates; body */ \
  X(N_RETURN, "return")         /* value */                                        \
  /* expressions */                                                                \
  X(N_NUM, "num")               /* num (in key = value bodies `-3` is one N_NUM) */  \
  X(N_STRING, "string")         /* str */                                          \
  X(N_NAME, "name")             /* name (in key = value bodies also a word: 1f1b) */ \
  X(N_BINARY, "binary")         /* op: BinOp; lhs; rhs; name_loc: the operator */  \
  X(N_UNARY, "unary")           /* op: '-'; lhs */                                 \
  X(N_CALL, "call")             /* lhs: callee (N_NAME or N_MEMBER); items: args */ \
  X(N_NAMED_ARG, "named")       /* name; value   (over: d) */                      \
  X(N_MEMBER, "member")         /* lhs; name     (b.forward) */                    \
  X(N_RENAME, "rename")         /* lhs; items: N_ARROW of two N_NAMEs  (x[a -> b]) */ \
  X(N_ARROW, "arrow")           /* lhs; rhs; name_loc: '->'  (qdim -> (heads, head)) */ \
  X(N_TUPLE, "tuple")           /* items         ((d1, d2)) */                     \
  X(N_LIST, "list")             /* items         ([1, 2] in target/step bodies) */  \
  X(N_BLOCK, "block")           /* kvs           ({ k = v } in target/step bodies) */

typedef enum {
#define X(e, s) e,
  AST_NODE_KINDS(X)
#undef X
  N__COUNT
} NodeKind;

typedef enum { BIN_ADD, BIN_SUB, BIN_MUL, BIN_DIV, BIN_MATMUL } BinOp;
typedef enum { STEP_TRAIN = 1, STEP_SERVE = 2 } StepKind;

typedef struct Number {
  bool is_float;
  int64_t i;      /* value when !is_float */
  double f;       /* value (also set for integers) */
  const char *text; int text_len; /* as written, for stable printing */
} Number;

typedef struct Node Node;
struct Node {
  NodeKind kind;
  int op;          /* BinOp or '-' */
  int flag;        /* see the table above */
  int depth;       /* expressions: height of the tree below (the parser caps it) */
  SrcLoc loc;      /* the whole construct where sensible; name_loc for the declared name */
  SrcLoc name_loc;
  Node *next;      /* next sibling in a list */

  Name name;       /* declared name, key, dim, callee field, ... */
  Name str;        /* string literal contents / import path (interned) */
  Node *type;      /* N_TYPE for params, args, typed lets, fn return */
  Node *value;     /* initializer, kv value, for-iterable, return value, step function */
  Node *target;    /* N_MESH: target name */
  Node *lhs, *rhs; /* operands */
  Node *items;     /* generic child list (see the table above) */
  Node *kvs;       /* N_KV list for target/step/block */
  Node *body;      /* statement list */
  Number num;
};

typedef struct NodeList { Node *head, *tail; int n; } NodeList;

/* A parsed file: its declarations in source order. */
typedef struct Ast {
  const Source *src;
  Node *decls;
} Ast;

/* Constructors used by the parser actions (one line each in parser.y). */
Node *ast_new(Arena *a, NodeKind kind, SrcLoc loc);
NodeList ast_list_one(Node *n);
NodeList ast_list_append(NodeList l, Node *n);
const char *ast_kind_name(NodeKind k);

/* Stable text form for `shardc parse` and golden tests. */
void ast_print(FILE *out, const Ast *ast);
#endif
