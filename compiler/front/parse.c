/* parse.c: the front end's driver: source -> tokens -> Lemon parser -> Ast, and a program's
 * files through their imports.
 *
 * parse_source runs one loop (as SQLite's sqlite3RunParser does): take a token from the lexer,
 * hand it to the generated parser, stop after end of file (token 0). Around that loop the driver
 * keeps what the grammar cannot:
 * - a stack of open brackets, for the nesting limit (PARSE_MAX_NESTING: deeper input is one
 *   diagnostic at the culprit and the end of that file's parse) and for notes pointing back to the
 *   bracket a missing closer belongs to;
 * - error recovery help: while Lemon recovers from a syntax error, a bracketed group it cannot use
 *   is skipped whole (so its contents are not mistaken for statements of the enclosing block), and
 *   error reporting is re-armed at a statement or declaration keyword that begins a line.
 *
 * parse_program loads the main file and, depth first, everything it imports: each file is parsed
 * once (files are identified by their real path), imports come before the files that import them,
 * and a cycle or a missing file is a diagnostic at the import. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ast_build.h"
#include "diag.h"
#include "tokens.h"

/* ---- called from the grammar ---- */

void parse_add_decls(ParseCtx *P, NodeList decls) {
  for (Node *d = decls.head, *next; d; d = next) {
    next = d->next;
    P->decls = ast_list_append(P->decls, d);
  }
}

void parse_abort(ParseCtx *P, const char *why) {
  if (!P->aborted) diag_error(P->here, "%s", why);
  P->aborted = true;
}

static bool in_set(const bool *set, int n, const int *toks, int ntoks) {
  for (int i = 0; i < ntoks; i++)
    if (toks[i] >= n || !set[toks[i]]) return false;
  return true;
}

static void take_set(bool *set, int n, const int *toks, int ntoks) {
  for (int i = 0; i < ntoks; i++)
    if (toks[i] < n) set[toks[i]] = false;
}

static int closer_of(int opener) {
  return opener == TK_LPAREN ? TK_RPAREN : opener == TK_LBRACKET ? TK_RBRACKET : TK_RBRACE;
}

/* Families of tokens a message names with one word when the parser accepts all of them. */
static const int expr_start[] = {TK_NAME, TK_NUM, TK_STRING, TK_LPAREN, TK_MINUS};
static const int value_start[] = {TK_NAME, TK_NUM, TK_STRING, TK_WORD, TK_LBRACKET, TK_LBRACE, TK_MINUS};
static const int decl_start[] = {TK_IMPORT, TK_TARGET, TK_MESH, TK_DIM, TK_LAYOUT, TK_MODEL, TK_TRAIN, TK_SERVE};
static const int stmt_start[] = {TK_LET, TK_RETURN, TK_FOR, TK_NAME};
static const int axis_words[] = {TK_NAME, TK_IMPORT, TK_TARGET, TK_MESH, TK_DIM, TK_LAYOUT, TK_MODEL,
                                 TK_PARAM, TK_FN, TK_LET, TK_RETURN, TK_FOR, TK_IN, TK_TRAIN, TK_SERVE};
static const int binary_ops[] = {TK_PLUS, TK_MINUS, TK_STAR, TK_SLASH, TK_AT};
static const int postfix_ops[] = {TK_LPAREN, TK_DOT, TK_LBRACKET};

/* The %syntax_error action: "expected X, found Y" at the token, where X lists what the parser's
 * tables accept here (computed in parser.y), families folded into a word. At end of file, or at a
 * wrong closer where the right one was expected, a note points back to the open bracket. */
void parse_report_expected(ParseCtx *P, const bool *expected, int ntokens, int found, const Token *tok) {
  bool set[128] = {false};
  int n = ntokens < 128 ? ntokens : 128;
  memcpy(set, expected, (size_t)n * sizeof(bool));
  const char *words[24];
  int nwords = 0;

  /* Operators and expressions share '-' and '(': judge those two families on the full set. */
  bool ops = in_set(expected, n, binary_ops, ARRAY_LEN(binary_ops));
  bool values = in_set(expected, n, value_start, ARRAY_LEN(value_start));
  bool exprs = in_set(expected, n, expr_start, ARRAY_LEN(expr_start));
  if (ops) {
    words[nwords++] = "an operator";
    take_set(set, n, binary_ops, ARRAY_LEN(binary_ops));
    take_set(set, n, postfix_ops, ARRAY_LEN(postfix_ops));
  }
  if (in_set(set, n, axis_words, ARRAY_LEN(axis_words))) {
    words[nwords++] = "a mesh axis name";
    take_set(set, n, axis_words, ARRAY_LEN(axis_words));
  }
  if (in_set(set, n, decl_start, ARRAY_LEN(decl_start))) {
    words[nwords++] = "a declaration";
    take_set(set, n, decl_start, ARRAY_LEN(decl_start));
  }
  if (in_set(set, n, stmt_start, ARRAY_LEN(stmt_start))) {
    words[nwords++] = "a statement";
    take_set(set, n, stmt_start, ARRAY_LEN(stmt_start));
  }
  if (values) {
    words[nwords++] = "a value";
    take_set(set, n, value_start, ARRAY_LEN(value_start));
  } else if (exprs) {
    words[nwords++] = "an expression";
    take_set(set, n, expr_start, ARRAY_LEN(expr_start));
  }
  for (int t = 1; t < n && nwords < (int)ARRAY_LEN(words) - 1; t++)
    if (set[t]) words[nwords++] = token_kind_name(t);
  if (nwords == 0) words[nwords++] = token_kind_name(0); /* only end of file would do */

  char list[512];
  size_t len = 0;
  list[0] = '\0';
  for (int i = 0; i < nwords && len < sizeof list; i++) {
    const char *sep = i == 0 ? "" : i == nwords - 1 ? " or " : ", ";
    len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", sep, words[i]);
  }
  char what[96];
  diag_error(tok->loc, "expected %s, found %s", list, token_describe(tok, what, sizeof what));

  if (P->depth > 0) {
    const OpenBracket *o = &P->open[P->depth - 1];
    int want = closer_of(o->kind);
    bool wrong_closer = (found == TK_RPAREN || found == TK_RBRACKET || found == TK_RBRACE) &&
                        found != want && want < n && expected[want];
    if (found == 0 || wrong_closer)
      diag_note(o->loc, "to close %s at line %d", token_kind_name(o->kind), o->loc.line);
  }
}

/* ---- one file ---- */

static bool is_opener(int k) { return k == TK_LPAREN || k == TK_LBRACKET || k == TK_LBRACE; }
static bool is_closer(int k) { return k == TK_RPAREN || k == TK_RBRACKET || k == TK_RBRACE; }

/* Keywords that begin a statement, model item or declaration, and '}' that ends a block: where
 * the parser can pick up again after an error. */
static bool is_sync(int k) {
  switch (k) {
  case TK_LET: case TK_RETURN: case TK_FOR: case TK_FN: case TK_PARAM: case TK_MODEL:
  case TK_DIM: case TK_MESH: case TK_LAYOUT: case TK_TARGET: case TK_TRAIN: case TK_SERVE:
  case TK_IMPORT: case TK_RBRACE:
    return true;
  default:
    return false;
  }
}

/* A closer closes the innermost open bracket of its kind, and any left open inside it. A closer
 * with no opener of its kind closes nothing (the parser reports it). */
static void close_bracket(ParseCtx *P, int kind) {
  for (int i = P->depth - 1; i >= 0; i--) {
    if (closer_of(P->open[i].kind) == kind) {
      P->depth = i;
      return;
    }
  }
}

/* During recovery: skip the bracketed group opened by the token just read, through its matching
 * closer, and return the token after it (in *t); *line is the closer's line. Nesting is counted,
 * not stored, so no depth is too deep to skip. */
static int skip_group(Lexer *lx, Token *t, int *line) {
  long depth = 1;
  int kind;
  do {
    kind = lexer_next(lx, t);
    if (is_opener(kind)) depth++;
    else if (is_closer(kind)) depth--;
  } while (kind != 0 && depth > 0);
  *line = t->loc.line;
  return kind == 0 ? 0 : lexer_next(lx, t);
}

Ast *parse_source(Arena *arena, const Source *src) {
  ParseCtx *P = calloc(1, sizeof *P);
  if (!P) abort();
  P->arena = arena;
  P->src = src;
  void *parser = ShardParseAlloc(malloc, P);
  if (!parser) abort();

  Lexer lx;
  lexer_init(&lx, src);
  Token t;
  int kind = lexer_next(&lx, &t), prev_line = 0;
  for (;;) {
    if (is_opener(kind) && parser_recovering(parser) && !parser_accepts(parser, kind)) {
      kind = skip_group(&lx, &t, &prev_line);
      continue;
    }
    if (kind == TK_WORD && !parser_accepts(parser, TK_WORD)) {
      char q[48];
      diag_error(t.loc, "malformed number '%s'", token_text(&t, q, sizeof q));
      kind = t.kind = TK_NUM; /* as the number 0, so parsing goes on undisturbed */
      t.num = (Number){false, 0, 0.0, t.text, t.loc.len};
    }
    P->here = t.loc;
    if (is_opener(kind)) {
      if (P->depth == PARSE_MAX_NESTING) {
        diag_error(t.loc, "brackets nested too deeply (more than %d levels of (), [] and {})",
                   PARSE_MAX_NESTING);
        break;
      }
      P->open[P->depth++] = (OpenBracket){kind, t.loc};
    }
    /* A keyword (or '}') that begins a line is taken as a fresh start: if it is wrong there, that
     * is a new mistake, and once it is in, the next mistake is new too. A keyword in the middle of
     * a line is more likely debris (`dim model = 3`). Unclosed brackets are always reported. */
    bool fresh = is_sync(kind) && t.loc.line > prev_line;
    if (kind == 0 || (fresh && parser_recovering(parser))) parser_rearm(parser);
    parser_snapshot(parser);
    ShardParse(parser, kind, t);
    if (kind == 0 || P->aborted) break;
    if (fresh && parser_recovering(parser) && parser_top_is(parser, kind)) parser_rearm(parser);
    if (is_opener(kind) && !parser_top_is(parser, kind)) {
      /* The parser threw the bracket away (it was the error, or came during recovery): its group
       * goes too. */
      P->depth--;
      kind = skip_group(&lx, &t, &prev_line);
      continue;
    }
    if (is_closer(kind)) close_bracket(P, kind);
    prev_line = t.loc.line;
    kind = lexer_next(&lx, &t);
  }
  ShardParseFree(parser, free);

  Ast *ast = ARENA_NEW(arena, Ast);
  ast->src = src;
  ast->decls = P->decls.head;
  free(P);
  return ast;
}

/* ---- a program: the main file and its imports ---- */

typedef struct LoadedFile {
  const char *key;      /* real path: the file's identity */
  const char *shown; /* path as the program names it, for cycle messages */
  bool done;       /* false while its imports are being loaded */
} LoadedFile;

typedef struct Loader {
  Arena *arena;
  const char *stdlib_dir;
  VEC(LoadedFile) files;
  VEC(Ast *) asts;  /* finished files, imports first */
} Loader;

static bool has_suffix(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Tidy a path for messages and Source names: drop "." and empty segments, fold "dir/.." (never a
 * leading ".."): "./sub/../a.shard" -> "a.shard". Symbolic links make this differ from the file
 * system's view, so it is only used for names; files are identified by realpath. */
static char *tidy_path(Arena *a, const char *path) {
  size_t n = strlen(path);
  char *out = arena_alloc(a, n + 2);
  const char **seg = ARENA_ARRAY(a, const char *, n / 2 + 2);
  size_t *len = ARENA_ARRAY(a, size_t, n / 2 + 2);
  int nseg = 0;
  for (const char *p = path; *p;) {
    const char *e = strchr(p, '/');
    size_t l = e ? (size_t)(e - p) : strlen(p);
    bool dotdot = l == 2 && p[0] == '.' && p[1] == '.';
    if (l == 0 || (l == 1 && p[0] == '.')) {
      /* skip */
    } else if (dotdot && nseg > 0 && !(len[nseg - 1] == 2 && memcmp(seg[nseg - 1], "..", 2) == 0)) {
      nseg--;
    } else {
      seg[nseg] = p;
      len[nseg++] = l;
    }
    p += l;
    if (*p == '/') p++;
  }
  size_t k = 0;
  if (path[0] == '/') out[k++] = '/';
  for (int i = 0; i < nseg; i++) {
    if (i) out[k++] = '/';
    memcpy(out + k, seg[i], len[i]);
    k += len[i];
  }
  if (k == 0) out[k++] = '.';
  out[k] = '\0';
  return out;
}

/* Where `import "spec"` in file `from` points: "./x", "../x" relative to from's directory, an
 * absolute path as is, anything else under the stdlib directory; ".shard" appended if missing.
 * NULL when it needs a stdlib directory and there is none. */
static char *resolve_import(Loader *L, const char *from, const char *spec) {
  const char *ext = has_suffix(spec, ".shard") ? "" : ".shard";
  if (strncmp(spec, "./", 2) == 0 || strncmp(spec, "../", 3) == 0) {
    const char *slash = strrchr(from, '/');
    if (!slash) return tidy_path(L->arena, arena_printf(L->arena, "%s%s", spec, ext));
    return tidy_path(L->arena, arena_printf(L->arena, "%.*s/%s%s", (int)(slash - from), from, spec, ext));
  }
  if (spec[0] == '/') return tidy_path(L->arena, arena_printf(L->arena, "%s%s", spec, ext));
  if (!L->stdlib_dir) return NULL;
  return tidy_path(L->arena, arena_printf(L->arena, "%s/%s%s", L->stdlib_dir, spec, ext));
}

static void load_file(Loader *L, const char *path, const Node *import);
static void load_source(Loader *L, const char *key, Source *src);

/* The chain of files being loaded, from the one `key` names to the newest: "a -> b -> a". */
static const char *cycle_text(Loader *L, const char *key) {
  int i = L->files.len - 1;
  while (i > 0 && strcmp(L->files.data[i].key, key) != 0) i--;
  char *s = arena_printf(L->arena, "%s", L->files.data[i].shown);
  for (int j = i + 1; j < L->files.len; j++)
    if (!L->files.data[j].done) s = arena_printf(L->arena, "%s -> %s", s, L->files.data[j].shown);
  return arena_printf(L->arena, "%s -> %s", s, L->files.data[i].shown);
}

/* "cannot open 'x': reason" (or read) for the main file, at the import for another; a file over the input
 * limit says what the limit is. */
static void report_unreadable(const char *path, const Node *import, int e) {
  char why[160];
  if (e == EFBIG) {
    size_t max = source_max_bytes();
    if (max % ((size_t)1 << 20) == 0)
      snprintf(why, sizeof why, "it is larger than %zu MiB, the most shardc reads (SHARDC_MAX_INPUT sets another "
                                "limit, in bytes)", max >> 20);
    else
      snprintf(why, sizeof why, "it is larger than %zu bytes, the most shardc reads (SHARDC_MAX_INPUT)", max);
  } else {
    snprintf(why, sizeof why, "%s", strerror(e));
  }
  if (!import) diag_error((SrcLoc){0}, "cannot %s '%s': %s", e == EFBIG ? "read" : "open", path, why);
  else if (e == ENOENT || e == ENOTDIR)
    diag_error(import->name_loc, "cannot find import \"%s\" (looked in %s)", import->str, path);
  else diag_error(import->name_loc, "cannot read import \"%s\" (%s): %s", import->str, path, why);
}

/* Load `path` (imported by `import`, or the main file when NULL) unless it is loaded already;
 * then its imports; then append it to the program. Every Source is named by its tidied path, so
 * a file is shown the same way whoever names it (`./a.shard` and `a.shard` alike). */
static void load_file(Loader *L, const char *path, const Node *import) {
  char *key = realpath(path, NULL);
  if (!key && !import && errno == ENOENT && access(path, R_OK) == 0) {
    /* A pipe given as the main file (`shardc check <(generate)`, /dev/stdin): its /proc link names
     * no file, but it can be read. Its path is its identity. */
    key = strdup(path);
    if (!key) abort();
  }
  if (!key) {
    report_unreadable(path, import, errno);
    return;
  }
  for (int i = 0; i < L->files.len; i++) {
    LoadedFile *f = &L->files.data[i];
    if (strcmp(f->key, key) != 0) continue;
    if (!f->done && import)
      diag_error(import->name_loc, "import cycle: %s", cycle_text(L, key));
    free(key);
    return;
  }
  Source *src = source_load_named(path, tidy_path(L->arena, path));
  if (!src) {
    report_unreadable(path, import, errno);
    free(key);
    return;
  }
  char *k = arena_strndup(L->arena, key, strlen(key));
  free(key);
  load_source(L, k, src);
}

/* Parse src (identified by key), then its imports; then append it to the program. */
static void load_source(Loader *L, const char *key, Source *src) {
  int index = L->files.len;
  VEC_PUSH(L->arena, L->files, ((LoadedFile){key, src->path, false}));

  Ast *ast = parse_source(L->arena, src);
  for (Node *d = ast->decls; d; d = d->next) {
    if (d->kind != N_IMPORT) continue;
    char *target = resolve_import(L, src->path, d->str);
    if (!target)
      diag_error(d->name_loc, "cannot find import \"%s\" (no stdlib directory: set SHARDC_STDLIB)", d->str);
    else load_file(L, target, d);
  }
  L->files.data[index].done = true;
  VEC_PUSH(L->arena, L->asts, ast);
}

ParsedProgram *parse_program(Arena *arena, const char *path, const char *stdlib_dir) {
  Loader L = {arena, stdlib_dir, {0}, {0}};
  load_file(&L, path, NULL);
  ParsedProgram *prog = ARENA_NEW(arena, ParsedProgram);
  prog->files = L.asts.data;
  prog->nfiles = L.asts.len;
  return prog;
}

ParsedProgram *parse_program_source(Arena *arena, Source *main, const char *stdlib_dir) {
  Loader L = {arena, stdlib_dir, {0}, {0}};
  /* Not a real path, so it can never equal an import's realpath: importing it is "not found". */
  load_source(&L, arena_printf(arena, "<memory>/%s", main->path), main);
  ParsedProgram *prog = ARENA_NEW(arena, ParsedProgram);
  prog->files = L.asts.data;
  prog->nfiles = L.asts.len;
  return prog;
}

/* ---- the stdlib directory ---- */

static bool is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* $SHARDC_STDLIB; else, from the executable's directory (/proc/self/exe, or argv0 when that is
 * unavailable), ../share/shardc/stdlib (installed) or stdlib/ (beside it); else the source tree's
 * stdlib (SHARDC_SOURCE_STDLIB, fixed by CMake). The answer is computed once. */
const char *stdlib_locate(const char *argv0) {
  static char *found;
  if (found) return found;
  const char *env = getenv("SHARDC_STDLIB");
  if (env && *env) return found = strdup(env);

  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) exe[n] = '\0';
  else if (argv0 && strchr(argv0, '/') && strlen(argv0) < sizeof exe) strcpy(exe, argv0);
  else exe[0] = '\0';
  char *slash = strrchr(exe, '/');
  if (slash) {
    *slash = '\0';
    char cand[PATH_MAX + 32];
    snprintf(cand, sizeof cand, "%s/../share/shardc/stdlib", exe);
    if (is_dir(cand)) return found = realpath(cand, NULL);
    snprintf(cand, sizeof cand, "%s/stdlib", exe);
    if (is_dir(cand)) return found = realpath(cand, NULL);
  }
#ifdef SHARDC_SOURCE_STDLIB
  if (is_dir(SHARDC_SOURCE_STDLIB)) return found = strdup(SHARDC_SOURCE_STDLIB);
#endif
  return NULL;
}
