/* parser.y: the .shard grammar (Lemon; generated into build/gen/parser.{c,h}).
 *
 * In: tokens from the lexer, fed one at a time by parse.c, ending with 0. Out: declarations,
 * appended to the ParseCtx as each one is reduced (so a file that fails half-way still yields what
 * parsed). Every action is one call into the constructors of ast_build.h: no logic lives here.
 *
 * Newlines mean nothing: statements, layout rules, model items and key = value entries are simply
 * written one after another (a comma between entries is accepted). An expression therefore ends
 * where the next token cannot continue it (`let a = b  c = d` is two statements).
 *
 * Precedence, loosest first: `+ -`; `* / @`; unary `-`; postfix call f(a), member a.b and rename
 * x[a -> b]; primaries. Written as one rule level per precedence level rather than %left so the
 * tables stay small and the shape of an expression reads off the grammar.
 *
 * Two words are looser than the rest: a mesh axis name may be spelled like a keyword (`model`),
 * and a value in a key = value body may be a word that starts with digits (`schedule = 1f1b`).
 *
 * Errors: %syntax_error reports "expected X, found Y", X read off the parser's tables for the
 * state the token met (parser_report_syntax_error below). Recovery uses Lemon's `error` symbol at
 * the level of declarations, model items, statements, key = value entries and layout rules: after
 * an error, input is skipped up to something that can start the next one. parse.c re-arms error
 * reporting when a statement or declaration keyword begins a line (see parser_rearm), so every
 * bad statement gets its own message. */

%name ShardParse
%token_prefix TK_
%token_type {Token}
%default_type {Node *}
%extra_context {ParseCtx *P}
%start_symbol program

/* Deep enough for PARSE_MAX_NESTING levels of brackets (a level takes at most about 6 entries, as
 * in `f(a, over: g(...`); only a pathological run of unary minus signs can fill it. */
%stack_size 4000

%include {
/* Generated from grammar/parser.y by lemon. */
#include <assert.h>
#include <string.h>
#include "ast_build.h"
#include "diag.h"
#include "tokens.h"
struct yyParser;
static void parser_report_syntax_error(struct yyParser *p, int found, const Token *tok);
}

%syntax_error { parser_report_syntax_error(yypParser, yymajor, &TOKEN); }
%stack_overflow { parse_abort(P, "this is nested too deeply for the parser (its stack is full)"); }

/* The order here fixes the TK_* numbers; compiler/tokens.h names each one for diagnostics. */
%token IMPORT TARGET MESH DIM LAYOUT MODEL PARAM FN LET RETURN FOR IN TRAIN SERVE
       NAME NUM STRING WORD
       LBRACE RBRACE LPAREN RPAREN LBRACKET RBRACKET COMMA COLON EQ DOT AT ARROW
       PLUS MINUS STAR SLASH.

%type decl {NodeList}
%type dim_defs {NodeList}
%type kvs {NodeList}
%type values {NodeList}
%type value_list {NodeList}
%type mesh_axes {NodeList}
%type rules {NodeList}
%type axes {NodeList}
%type axis {Token}
%type model_items {NodeList}
%type fn_args {NodeList}
%type fn_arg_list {NodeList}
%type tdims {NodeList}
%type stmts {NodeList}
%type args {NodeList}
%type arg_list {NodeList}
%type renames {NodeList}
%type rename_list {NodeList}
%type exprs {NodeList}

/* ---- program and declarations ---- */

program ::= decls.
decls ::= .
decls ::= decls decl(D).                                { parse_add_decls(P, D); }

decl(L) ::= IMPORT(K) STRING(S).                        { L = ast_list_one(ast_import(P, &K, &S)); }
decl(L) ::= TARGET(K) NAME(N) LBRACE kvs(B) RBRACE.     { L = ast_list_one(ast_target(P, &K, &N, B.head)); }
decl(L) ::= MESH(K) NAME(N) EQ NAME(T) LBRACKET mesh_axes(A) RBRACKET.
                                                        { L = ast_list_one(ast_mesh(P, &K, &N, &T, A.head)); }
decl(L) ::= DIM dim_defs(D).                            { L = D; }
decl(L) ::= LAYOUT(K) NAME(N) LBRACE rules(R) RBRACE.   { L = ast_list_one(ast_layout(P, &K, &N, R.head)); }
decl(L) ::= MODEL(K) NAME(N) LBRACE model_items(I) RBRACE.
                                                        { L = ast_list_one(ast_model(P, &K, &N, I.head)); }
decl(L) ::= TRAIN(K) step_fn(F) LBRACE kvs(B) RBRACE.   { L = ast_list_one(ast_step(P, &K, STEP_TRAIN, F, B.head)); }
decl(L) ::= SERVE(K) step_fn(F) LBRACE kvs(B) RBRACE.   { L = ast_list_one(ast_step(P, &K, STEP_SERVE, F, B.head)); }
decl(L) ::= error.                                      { L = ast_list_empty(); }

/* dim a = 4096, b = a, g = heads / kv_heads */
dim_defs(L) ::= dim_def(D).                             { L = ast_list_one(D); }
dim_defs(L) ::= dim_defs(L0) COMMA dim_def(D).          { L = ast_list_append(L0, D); }
dim_def(D) ::= NAME(N) EQ expr(E).                      { D = ast_dim(P, &N, E); }

/* mesh pod = tpu_v5e[data: 4, model: 2] */
mesh_axes(L) ::= mesh_axis(A).                          { L = ast_list_one(A); }
mesh_axes(L) ::= mesh_axes(L0) COMMA mesh_axis(A).      { L = ast_list_append(L0, A); }
mesh_axes(L) ::= mesh_axes(L0) COMMA.                   { L = L0; }
mesh_axis(A) ::= axis(N) COLON NUM(V).                  { A = ast_mesh_axis(P, &N, &V); }

/* layout NAME { batch: data  seq: (ctx, model) } */
rules(L) ::= .                                          { L = ast_list_empty(); }
rules(L) ::= rules(L0) rule(R).                         { L = ast_list_append(L0, R); }
rules(L) ::= rules(L0) rule(R) COMMA.                   { L = ast_list_append(L0, R); }
rule(R) ::= NAME(N) COLON axis(A).                      { R = ast_rule(P, &N, ast_list_one(ast_name(P, &A)).head); }
rule(R) ::= NAME(N) COLON LPAREN axes(A) RPAREN.        { R = ast_rule(P, &N, A.head); }
rule(R) ::= error.                                      { R = NULL; }

/* Mesh axis names may be spelled like keywords: `model` is the usual tensor-parallel axis, and no
 * keyword can stand where an axis does, so this costs no ambiguity. */
axes(L) ::= axis(N).                                    { L = ast_list_one(ast_name(P, &N)); }
axes(L) ::= axes(L0) COMMA axis(N).                     { L = ast_list_append(L0, ast_name(P, &N)); }
axis(A) ::= NAME(N).                                    { A = N; }
axis(A) ::= IMPORT(N).                                  { A = N; }
axis(A) ::= TARGET(N).                                  { A = N; }
axis(A) ::= MESH(N).                                    { A = N; }
axis(A) ::= DIM(N).                                     { A = N; }
axis(A) ::= LAYOUT(N).                                  { A = N; }
axis(A) ::= MODEL(N).                                   { A = N; }
axis(A) ::= PARAM(N).                                   { A = N; }
axis(A) ::= FN(N).                                      { A = N; }
axis(A) ::= LET(N).                                     { A = N; }
axis(A) ::= RETURN(N).                                  { A = N; }
axis(A) ::= FOR(N).                                     { A = N; }
axis(A) ::= IN(N).                                      { A = N; }
axis(A) ::= TRAIN(N).                                   { A = N; }
axis(A) ::= SERVE(N).                                   { A = N; }

/* ---- key = value bodies of target, train and serve ---- */

kvs(L) ::= .                                            { L = ast_list_empty(); }
kvs(L) ::= kvs(L0) kv(K).                               { L = ast_list_append(L0, K); }
kvs(L) ::= kvs(L0) kv(K) COMMA.                         { L = ast_list_append(L0, K); }
kv(K) ::= NAME(N) EQ value(V).                          { K = ast_kv(P, &N, V); }
kv(K) ::= error.                                        { K = NULL; }

value(V) ::= NUM(N).                                    { V = ast_num(P, &N); }
value(V) ::= MINUS(M) NUM(N).                           { V = ast_neg_num(P, &M, &N); }
value(V) ::= STRING(S).                                 { V = ast_string(P, &S); }
value(V) ::= NAME(N).                                   { V = ast_name(P, &N); }
value(V) ::= WORD(N).                                   { V = ast_name(P, &N); }
value(V) ::= NAME(N) LPAREN values(A) RPAREN(R).        { V = ast_call(P, ast_name(P, &N), A.head, &R); }
value(V) ::= LBRACKET(B) values(A) RBRACKET(R).         { V = ast_list_node(P, &B, A.head, &R); }
value(V) ::= LBRACE(B) kvs(A) RBRACE(R).                { V = ast_block(P, &B, A.head, &R); }

values(L) ::= .                                         { L = ast_list_empty(); }
values(L) ::= value_list(L0).                           { L = L0; }
values(L) ::= value_list(L0) COMMA.                     { L = L0; }
value_list(L) ::= value(V).                             { L = ast_list_one(V); }
value_list(L) ::= value_list(L0) COMMA value(V).        { L = ast_list_append(L0, V); }

/* train llama.forward { ... } */
step_fn(F) ::= NAME(N).                                 { F = ast_name(P, &N); }
step_fn(F) ::= step_fn(L) DOT NAME(N).                  { F = ast_member(P, L, &N); }

/* ---- models ---- */

model_items(L) ::= .                                    { L = ast_list_empty(); }
model_items(L) ::= model_items(L0) model_item(I).       { L = ast_list_append(L0, I); }
model_items(L) ::= model_items(L0) model_item(I) COMMA. { L = ast_list_append(L0, I); }

model_item(I) ::= PARAM(K) NAME(N) COLON type(T).       { I = ast_param(P, &K, &N, T); }
model_item(I) ::= FN(K) NAME(N) LPAREN fn_args(A) RPAREN ARROW type(T) LBRACE stmts(B) RBRACE.
                                                        { I = ast_fn(P, &K, &N, A.head, T, B.head); }
model_item(I) ::= error.                                { I = NULL; }

fn_args(L) ::= .                                        { L = ast_list_empty(); }
fn_args(L) ::= fn_arg_list(L0).                         { L = L0; }
fn_args(L) ::= fn_arg_list(L0) COMMA.                   { L = L0; }
fn_arg_list(L) ::= fn_arg(A).                           { L = ast_list_one(A); }
fn_arg_list(L) ::= fn_arg_list(L0) COMMA fn_arg(A).     { L = ast_list_append(L0, A); }
fn_arg(A) ::= NAME(N) COLON type(T).                    { A = ast_fn_arg(P, &N, T); }

/* bf16[batch, embed@data, seq@(ctx, model)]; attention; block[layers]; f32[] */
type(T) ::= NAME(N).                                    { T = ast_type(P, &N, NULL, false, NULL); }
type(T) ::= NAME(N) LBRACKET RBRACKET(R).               { T = ast_type(P, &N, NULL, true, &R); }
type(T) ::= NAME(N) LBRACKET tdims(D) RBRACKET(R).      { T = ast_type(P, &N, D.head, true, &R); }
type(T) ::= NAME(N) LBRACKET tdims(D) COMMA RBRACKET(R).{ T = ast_type(P, &N, D.head, true, &R); }
tdims(L) ::= tdim(D).                                   { L = ast_list_one(D); }
tdims(L) ::= tdims(L0) COMMA tdim(D).                   { L = ast_list_append(L0, D); }
tdim(D) ::= NAME(N).                                    { D = ast_tdim(P, &N, NULL, NULL); }
tdim(D) ::= NAME(N) AT(A) axis(X).                      { D = ast_tdim(P, &N, &A, ast_list_one(ast_name(P, &X)).head); }
tdim(D) ::= NAME(N) AT(A) LPAREN axes(X) RPAREN.        { D = ast_tdim(P, &N, &A, X.head); }

/* ---- statements ---- */

stmts(L) ::= .                                          { L = ast_list_empty(); }
stmts(L) ::= stmts(L0) stmt(S).                         { L = ast_list_append(L0, S); }

stmt(S) ::= LET(K) NAME(N) EQ expr(E).                  { S = ast_let(P, &K, &N, NULL, E); }
stmt(S) ::= LET(K) NAME(N) COLON type(T) EQ expr(E).    { S = ast_let(P, &K, &N, T, E); }
stmt(S) ::= NAME(N) EQ expr(E).                         { S = ast_assign(P, &N, E); }
stmt(S) ::= FOR(K) NAME(N) IN expr(E) LBRACE stmts(B) RBRACE.
                                                        { S = ast_for(P, &K, &N, E, B.head); }
stmt(S) ::= RETURN(K) expr(E).                          { S = ast_return(P, &K, E); }
stmt(S) ::= error.                                      { S = NULL; }

/* ---- expressions ---- */

expr(E) ::= expr(L) PLUS(O) term(R).                    { E = ast_binary(P, &O, BIN_ADD, L, R); }
expr(E) ::= expr(L) MINUS(O) term(R).                   { E = ast_binary(P, &O, BIN_SUB, L, R); }
expr(E) ::= term(T).                                    { E = T; }

term(E) ::= term(L) STAR(O) unary(R).                   { E = ast_binary(P, &O, BIN_MUL, L, R); }
term(E) ::= term(L) SLASH(O) unary(R).                  { E = ast_binary(P, &O, BIN_DIV, L, R); }
term(E) ::= term(L) AT(O) unary(R).                     { E = ast_binary(P, &O, BIN_MATMUL, L, R); }
term(E) ::= unary(U).                                   { E = U; }

unary(E) ::= MINUS(O) unary(U).                         { E = ast_unary(P, &O, U); }
unary(E) ::= postfix(X).                                { E = X; }

postfix(E) ::= primary(X).                              { E = X; }
postfix(E) ::= postfix(F) LPAREN args(A) RPAREN(R).     { E = ast_call(P, F, A.head, &R); }
postfix(E) ::= postfix(L) DOT NAME(N).                  { E = ast_member(P, L, &N); }
postfix(E) ::= postfix(L) LBRACKET renames(A) RBRACKET(R).
                                                        { E = ast_rename(P, L, A.head, &R); }

primary(E) ::= NUM(N).                                  { E = ast_num(P, &N); }
primary(E) ::= STRING(S).                               { E = ast_string(P, &S); }
primary(E) ::= NAME(N).                                 { E = ast_name(P, &N); }
primary(E) ::= LPAREN(B) expr(X) RPAREN(R).            { E = ast_paren(P, &B, X, &R); }
primary(E) ::= LPAREN(B) expr(X) COMMA exprs(L) RPAREN(R).
                                                        { E = ast_tuple(P, &B, ast_list_prepend(X, L).head, &R); }
exprs(L) ::= expr(E).                                   { L = ast_list_one(E); }
exprs(L) ::= exprs(L0) COMMA expr(E).                   { L = ast_list_append(L0, E); }

/* f(x, over: d), split(x, qdim -> (heads, head)), merge(x, (heads, head) -> qdim) */
args(L) ::= .                                           { L = ast_list_empty(); }
args(L) ::= arg_list(L0).                               { L = L0; }
args(L) ::= arg_list(L0) COMMA.                         { L = L0; }
arg_list(L) ::= arg(A).                                 { L = ast_list_one(A); }
arg_list(L) ::= arg_list(L0) COMMA arg(A).              { L = ast_list_append(L0, A); }
arg(A) ::= expr(E).                                     { A = E; }
arg(A) ::= NAME(N) COLON expr(E).                       { A = ast_named_arg(P, &N, E); }
arg(A) ::= expr(L) ARROW(O) expr(R).                    { A = ast_arrow(P, L, &O, R); }

/* x[seq -> kseq, a -> b] */
renames(L) ::= rename_list(L0).                         { L = L0; }
renames(L) ::= rename_list(L0) COMMA.                   { L = L0; }
rename_list(L) ::= rename(R).                           { L = ast_list_one(R); }
rename_list(L) ::= rename_list(L0) COMMA rename(R).     { L = ast_list_append(L0, R); }
rename(R) ::= NAME(A) ARROW(O) NAME(B).                 { R = ast_arrow(P, ast_name(P, &A), &O, ast_name(P, &B)); }

%code {
/* ---- reading the tables (for messages and recovery in parse.c) ---- */

_Static_assert(sizeof(YYACTIONTYPE) == sizeof(unsigned short), "ParseCtx.snap holds YYACTIONTYPEs");

/* Would a parser whose stack holds `win` (states at stack indexes base, base+1, ...; below base,
 * the real stack) shift terminal `tok`, after whatever reductions it makes first? Simulates the
 * reductions on a private copy: the real stack is only read. */
static bool parser_would_shift_from(const yyParser *p, const YYACTIONTYPE *win, int nwin, int base, int tok) {
  YYACTIONTYPE st[PARSER_SNAPSHOT + 64];
  int n = nwin;
  memcpy(st, win, (size_t)nwin * sizeof st[0]);
  YYACTIONTYPE state = st[n - 1];
  for (int guard = 0; guard < 10000; guard++) {
    YYACTIONTYPE act = yy_find_shift_action((YYCODETYPE)tok, state);
    if (act <= YY_MAX_SHIFTREDUCE || act == YY_ACCEPT_ACTION) return true;
    if (act < YY_MIN_REDUCE || act > YY_MAX_REDUCE) return false; /* error, or no action */
    unsigned rule = act - YY_MIN_REDUCE;
    int k = -yyRuleInfoNRhs[rule];
    if (k <= n) n -= k;
    else base -= k - n, n = 0;
    if (n == 0 && base < 1) return false;
    YYACTIONTYPE top = n ? st[n - 1] : p->yystack[base - 1].stateno;
    if (n == (int)ARRAY_LEN(st)) return false;
    state = st[n++] = yy_find_reduce_action(top, yyRuleInfoLhs[rule]);
  }
  return false;
}

bool parser_accepts(void *parser, int tok) {
  const yyParser *p = parser;
  return parser_would_shift_from(p, &p->yytos->stateno, 1, (int)(p->yytos - p->yystack), tok);
}

/* Keep the top of the stack as it is before a token goes in: by the time Lemon finds the token
 * wrong it has already made the reductions its default actions allow, and the state it is in
 * then accepts less than the state the token met ("expected ')' or '+'" where '*' would do too). */
void parser_snapshot(void *parser) {
  const yyParser *p = parser;
  ParseCtx *P = p->P;
  int top = (int)(p->yytos - p->yystack);
  int n = top + 1 < PARSER_SNAPSHOT ? top + 1 : PARSER_SNAPSHOT;
  P->snap_base = top + 1 - n;
  P->snap_n = n;
  for (int i = 0; i < n; i++) P->snap[i] = p->yystack[P->snap_base + i].stateno;
}

/* After a syntax error Lemon stays quiet until three tokens have been shifted, so as not to
 * report the debris of one mistake. parse.c calls parser_rearm when a new statement or
 * declaration has begun cleanly, so the next mistake is reported however close it is. */
void parser_rearm(void *parser) { ((yyParser *)parser)->yyerrcnt = -1; }
bool parser_recovering(void *parser) { return ((yyParser *)parser)->yyerrcnt >= 0; }
bool parser_top_is(void *parser, int tok) { return ((yyParser *)parser)->yytos->major == tok; }

/* "expected X, found Y" at the offending token, X being every terminal the state before the
 * token accepts (from the snapshot, when the reductions since stayed inside it). */
static void parser_report_syntax_error(yyParser *p, int found, const Token *tok) {
  ParseCtx *P = p->P;
  int top = (int)(p->yytos - p->yystack);
  bool use_snap = P->snap_n > 0 && (P->snap_base == 0 || top >= P->snap_base + 8);
  bool ok[YYNTOKEN] = {false};
  for (int t = 0; t < YYNTOKEN; t++) {
    if (use_snap) ok[t] = parser_would_shift_from(p, P->snap, P->snap_n, P->snap_base, t);
    else ok[t] = parser_accepts(p, t);
  }
  parse_report_expected(P, ok, YYNTOKEN, found, tok);
}
}
