/* ast_build.h: what the generated parser (grammar/parser.y) calls, and the front end's internals.
 *
 * - ParseCtx, the parser's %extra_context: the arena, the declarations parsed so far, and the
 *   driver's view of open brackets (for "to close '{' at line 12" notes).
 * - One constructor per construct (ast.c). Each takes the tokens that locate it and the children
 *   the grammar already built, fills in the node, and checks the expression depth limit.
 * - The Lemon entry points and the table-reading helpers defined in parser.y's %code. */
#ifndef SHARDC_AST_BUILD_H
#define SHARDC_AST_BUILD_H

#include "lexer.h"
#include "parse.h"

/* Deepest expression tree accepted (a + a + ... nests to the left): later stages walk trees
 * recursively, so a fuzzer's million-term sum must be a diagnostic, not a stack overflow. */
#define PARSE_MAX_EXPR_DEPTH 1000

/* How many states from the top of the parser's stack parser_snapshot keeps. */
#define PARSER_SNAPSHOT 32

typedef struct OpenBracket {
  int kind;   /* TK_LPAREN, TK_LBRACKET or TK_LBRACE */
  SrcLoc loc;
} OpenBracket;

typedef struct ParseCtx {
  Arena *arena;
  const Source *src;
  NodeList decls;    /* completed declarations, in source order */
  bool aborted;      /* stop feeding tokens: a limit was hit and reported */
  SrcLoc here;       /* the token being fed, for messages raised inside the parser */
  OpenBracket open[PARSE_MAX_NESTING];
  int depth;         /* entries of open[] in use */
  unsigned short snap[PARSER_SNAPSHOT]; /* parser states at the top of its stack before this token */
  int snap_base, snap_n; /* stack index of snap[0]; entries used */
} ParseCtx;

/* parse.c */
void parse_add_decls(ParseCtx *P, NodeList decls);
void parse_abort(ParseCtx *P, const char *why);
void parse_report_expected(ParseCtx *P, const bool *expected, int ntokens, int found, const Token *tok);

/* Lemon's parser (%name ShardParse) and the helpers from parser.y's %code. */
void *ShardParseAlloc(void *(*alloc)(size_t), ParseCtx *P);
void ShardParse(void *parser, int kind, Token tok);
void ShardParseFree(void *parser, void (*dealloc)(void *));
bool parser_accepts(void *parser, int tok);
void parser_rearm(void *parser);
bool parser_recovering(void *parser);
bool parser_top_is(void *parser, int tok);
void parser_snapshot(void *parser);

/* ---- constructors (ast.c) ---- */
NodeList ast_list_empty(void);
NodeList ast_list_prepend(Node *n, NodeList l);

Node *ast_import(ParseCtx *P, const Token *kw, const Token *path);
Node *ast_target(ParseCtx *P, const Token *kw, const Token *name, Node *kvs);
Node *ast_mesh(ParseCtx *P, const Token *kw, const Token *name, const Token *target, Node *axes);
Node *ast_mesh_axis(ParseCtx *P, const Token *name, const Token *size);
Node *ast_dim(ParseCtx *P, const Token *name, Node *value);
Node *ast_layout(ParseCtx *P, const Token *kw, const Token *name, Node *rules);
Node *ast_rule(ParseCtx *P, const Token *dim, Node *axes);
Node *ast_model(ParseCtx *P, const Token *kw, const Token *name, Node *items);
Node *ast_param(ParseCtx *P, const Token *kw, const Token *name, Node *type);
Node *ast_fn(ParseCtx *P, const Token *kw, const Token *name, Node *args, Node *ret, Node *body);
Node *ast_fn_arg(ParseCtx *P, const Token *name, Node *type);
Node *ast_step(ParseCtx *P, const Token *kw, StepKind kind, Node *fn, Node *kvs);
Node *ast_kv(ParseCtx *P, const Token *key, Node *value);
Node *ast_list_node(ParseCtx *P, const Token *open, Node *items, const Token *close);
Node *ast_block(ParseCtx *P, const Token *open, Node *kvs, const Token *close);
Node *ast_type(ParseCtx *P, const Token *name, Node *dims, bool brackets, const Token *close);
Node *ast_tdim(ParseCtx *P, const Token *name, const Token *at, Node *axes);
Node *ast_let(ParseCtx *P, const Token *kw, const Token *name, Node *type, Node *value);
Node *ast_assign(ParseCtx *P, const Token *name, Node *value);
Node *ast_for(ParseCtx *P, const Token *kw, const Token *var, Node *iter, Node *body);
Node *ast_return(ParseCtx *P, const Token *kw, Node *value);
Node *ast_num(ParseCtx *P, const Token *num);
Node *ast_neg_num(ParseCtx *P, const Token *minus, const Token *num);
Node *ast_string(ParseCtx *P, const Token *str);
Node *ast_name(ParseCtx *P, const Token *name);
Node *ast_binary(ParseCtx *P, const Token *op, BinOp bop, Node *lhs, Node *rhs);
Node *ast_unary(ParseCtx *P, const Token *op, Node *operand);
Node *ast_call(ParseCtx *P, Node *callee, Node *args, const Token *close);
Node *ast_member(ParseCtx *P, Node *lhs, const Token *name);
Node *ast_rename(ParseCtx *P, Node *lhs, Node *arrows, const Token *close);
Node *ast_arrow(ParseCtx *P, Node *lhs, const Token *arrow, Node *rhs);
Node *ast_named_arg(ParseCtx *P, const Token *name, Node *value);
Node *ast_paren(ParseCtx *P, const Token *open, Node *inner, const Token *close);
Node *ast_tuple(ParseCtx *P, const Token *open, Node *items, const Token *close);

#endif
