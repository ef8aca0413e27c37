/* test_frontend.c: the front end (lexer, parser, diagnostics) on inputs too big, too binary or too
 * pathological for a .shard test file: 10,000 nested brackets, a 1 MB identifier, NUL bytes, random
 * bytes and random token soup, and the formatting of diagnostics themselves (machine-form escapes,
 * the warning limit, the line index that keeps N diagnostics linear), and reading input (the size
 * limit, pipes).
 *
 * Each case calls parse_source on a memory buffer with diagnostics captured in memory, then checks
 * the error count, the messages and the size of what was printed. The contract under test: any
 * input gives a tree or located diagnostics, quickly, never a crash or a hang. Prints PASS/FAIL per
 * case and "N passed, N failed"; exits 1 on any failure. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ast.h"
#include "diag.h"
#include "parse.h"
#include "unit_test.h"

/* ---- one parse, diagnostics captured ---- */

typedef struct Result {
  Ast *ast;
  int errors;
  int ndecls;
  char *diags;       /* everything diag printed (text or machine form), NUL-terminated */
  size_t diags_len;
  double seconds;
} Result;

static Arena arena;

static Result parse_mem(const char *text, size_t len, DiagFormat fmt) {
  Result r = {0};
  FILE *out = open_memstream(&r.diags, &r.diags_len);
  diag_reset();
  diag_configure(out, fmt, false);
  Source *src = source_from_memory("t.shard", text, len);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  r.ast = parse_source(&arena, src);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  diag_finish();
  fclose(out);
  r.seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  r.errors = diag_error_count();
  for (Node *d = r.ast ? r.ast->decls : NULL; d; d = d->next) r.ndecls++;
  return r;
}

static Result parse_str(const char *text) { return parse_mem(text, strlen(text), DIAG_MACHINE); }

static void done(Result *r) { free(r->diags); }

/* ---- checks ---- */

static void expect_errors(const Result *r, int n) {
  UT_CHECK(r->errors == n, "expected %d errors, got %d; diagnostics:\n%.2000s", n, r->errors, r->diags);
}

static void expect_diag(const Result *r, const char *text) {
  UT_CHECK(r->diags && strstr(r->diags, text), "expected a diagnostic containing \"%s\"; got:\n%.2000s", text, r->diags);
}

static void expect_fast(const Result *r, double limit) {
  UT_CHECK(r->seconds < limit, "took %.3f s (limit %.1f s)", r->seconds, limit);
}

/* A case: its block runs once, then the case ends and the arena starts afresh. */
#define CASE(name) for (int once_ = (ut_begin(name), 1); once_; once_ = 0, case_end())

static void case_end(void) {
  ut_end();
  arena_free(&arena);
  arena_init(&arena);
}

static char *repeat(const char *prefix, const char *unit, int n, const char *middle, const char *close_unit,
                    const char *suffix) {
  size_t len = strlen(prefix) + strlen(unit) * (size_t)n + strlen(middle) + strlen(close_unit) * (size_t)n +
               strlen(suffix) + 1;
  char *s = malloc(len), *p = s;
  p += sprintf(p, "%s", prefix);
  for (int i = 0; i < n; i++) p += sprintf(p, "%s", unit);
  p += sprintf(p, "%s", middle);
  for (int i = 0; i < n; i++) p += sprintf(p, "%s", close_unit);
  sprintf(p, "%s", suffix);
  return s;
}

/* A small deterministic generator (xorshift), so failures reproduce. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

int main(void) {
  arena_init(&arena);
  diag_set_error_limit(50);

  CASE("empty input is an empty program") {
    Result r = parse_mem("", 0, DIAG_MACHINE);
    expect_errors(&r, 0);
    UT_CHECK(r.ast && r.ast->decls == NULL, "expected no declarations");
    done(&r);
  }

  CASE("whitespace, comments and CRLF only") {
    Result r = parse_str("# c\r\n\r\n \t\f\v # c\n#");
    expect_errors(&r, 0);
    UT_CHECK(r.ndecls == 0, "expected no declarations, got %d", r.ndecls);
    done(&r);
  }

  CASE("a lone CR ends a line (old Mac files): not one comment") {
    /* line 3 holds the error: with CR read as a space, the whole file would be the comment on line 1 */
    Result r = parse_str("# a comment\rdim a = 1\rdim b = 4__096\rdim c = 3\r");
    expect_errors(&r, 1);
    expect_diag(&r, "error|t.shard|3|9|");
    UT_CHECK(r.ndecls == 3, "expected 3 declarations, got %d", r.ndecls);
    done(&r);
    /* mixed endings count one line each: LF, CR LF, CR */
    r = parse_str("dim a = 1\ndim b = 2\r\ndim c = 3\rdim d = 4__096\n");
    expect_errors(&r, 1);
    expect_diag(&r, "error|t.shard|4|9|");
    done(&r);
    /* a string ends at a lone CR like at a newline */
    r = parse_str("dim a = \"x\rdim b = 2\r");
    expect_diag(&r, "error|t.shard|1|9|unterminated string");
    UT_CHECK(r.ndecls == 2, "expected 2 declarations, got %d", r.ndecls);
    done(&r);
    /* the text form shows the culprit's own line, without the CR */
    r = parse_mem("dim a = 1\rdim b = 4__096\rdim c = 3\r", 35, DIAG_TEXT);
    expect_diag(&r, " 2 | dim b = 4__096\n");
    done(&r);
  }

  CASE("10,000 nested parentheses: one error, small output") {
    char *s = repeat("dim a = ", "(", 10000, "1", ")", "\n");
    Result r = parse_str(s);
    expect_errors(&r, 1);
    expect_diag(&r, "t.shard|1|265|brackets nested too deeply (more than 256 levels");
    expect_fast(&r, 2.0);
    done(&r);
    r = parse_mem(s, strlen(s), DIAG_TEXT);
    UT_CHECK(r.diags_len < 1000, "text diagnostic is %zu bytes", r.diags_len);
    done(&r);
    free(s);
  }

  CASE("10,000 nested brackets and braces") {
    char *s = repeat("target t { a = ", "[{ b = ", 5000, "1", "}]", " }\n");
    Result r = parse_str(s);
    expect_errors(&r, 1);
    expect_diag(&r, "brackets nested too deeply");
    done(&r);
    free(s);
  }

  CASE("256 levels of nesting are fine") {
    char *s = repeat("model m { fn f() -> t { return ", "g(x, ", PARSE_MAX_NESTING - 2, "1", ")", " } }\n");
    Result r = parse_str(s);
    expect_errors(&r, 0);
    UT_CHECK(r.ndecls == 1, "expected 1 declaration, got %d", r.ndecls);
    done(&r);
    free(s);
  }

  CASE("1 MB identifier: one error, capped caret, fast") {
    size_t n = 1 << 20;
    char *s = malloc(n + 32);
    memcpy(s, "dim ", 4);
    memset(s + 4, 'x', n);
    strcpy(s + 4 + n, " = 1\n");
    Result r = parse_mem(s, strlen(s), DIAG_TEXT);
    expect_errors(&r, 1);
    expect_diag(&r, "identifier too long (1048576 bytes; the limit is 1024)");
    UT_CHECK(r.diags_len < 1000, "text diagnostic is %zu bytes", r.diags_len);
    UT_CHECK(r.ndecls == 1, "the dim still parses (got %d declarations)", r.ndecls);
    expect_fast(&r, 2.0);
    done(&r);
    free(s);
  }

  CASE("1 MB string and 1 MB comment") {
    size_t n = 1 << 20;
    char *s = malloc(2 * n + 64), *p = s;
    p += sprintf(p, "dim a = \"");
    memset(p, 's', n), p += n;
    p += sprintf(p, "\"\n# ");
    memset(p, 'c', n), p += n;
    p += sprintf(p, "\ndim b = 2\n");
    Result r = parse_mem(s, (size_t)(p - s), DIAG_MACHINE);
    expect_errors(&r, 0);
    UT_CHECK(r.ndecls == 2, "expected 2 declarations, got %d", r.ndecls);
    done(&r);
    free(s);
  }

  CASE("NUL byte: reported, and the rest parses") {
    static const char text[] = "dim a = 1\0dim b = 2\n";
    Result r = parse_mem(text, sizeof text - 1, DIAG_MACHINE);
    expect_errors(&r, 1);
    expect_diag(&r, "error|t.shard|1|10|unexpected NUL byte");
    UT_CHECK(r.ndecls == 2, "expected 2 declarations, got %d", r.ndecls);
    done(&r);
  }

  CASE("NUL bytes only: the error limit holds the output down") {
    char s[2000] = {0};
    Result r = parse_mem(s, sizeof s, DIAG_MACHINE);
    expect_errors(&r, 2000);
    expect_diag(&r, "note||0|0|1950 more errors not shown (the limit is 50 errors)");
    UT_CHECK(r.diags_len < 5000, "printed %zu bytes", r.diags_len);
    done(&r);
  }

  CASE("a run of 20,000 unary minus signs: one error") {
    char *s = repeat("dim a = ", "- ", 20000, "1", "", "\n");
    Result r = parse_str(s);
    expect_errors(&r, 1);
    expect_diag(&r, "nested too deeply");
    done(&r);
    free(s);
  }

  CASE("a sum of 100,000 terms: one error (trees stay shallow)") {
    char *s = repeat("dim a = ", "x + ", 100000, "x", "", "\n");
    Result r = parse_str(s);
    expect_errors(&r, 1);
    expect_diag(&r, "expression nested too deeply (more than 1000 levels)");
    expect_fast(&r, 2.0);
    done(&r);
    free(s);
  }

  CASE("input ending inside tokens") {
    const char *cases[] = {"dim a = 1e", "dim a = \"abc", "dim a = 4_", "model m { fn f(", "dim a = -", "x", "\""};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      Result r = parse_str(cases[i]);
      UT_CHECK(r.errors >= 1, "'%s': expected an error", cases[i]);
      UT_CHECK(r.errors <= 2, "'%s': %d errors", cases[i], r.errors);
      done(&r);
    }
  }

  CASE("numbers convert") {
    Result r = parse_str("dim a = 4_096, b = 9223372036854775807, c = 1.97e14\n"
                         "target t { n = -3  f = - 0.5 }\n");
    expect_errors(&r, 0);
    Node *a = r.ast->decls, *b = a->next, *c = b->next, *t = c->next;
    UT_CHECK(a->value->kind == N_NUM && !a->value->num.is_float && a->value->num.i == 4096, "4_096");
    UT_CHECK(b->value->num.i == INT64_MAX, "INT64_MAX");
    UT_CHECK(c->value->num.is_float && c->value->num.f == 1.97e14, "1.97e14");
    UT_CHECK(t->kvs->value->kind == N_NUM && t->kvs->value->num.i == -3, "-3 is one number");
    UT_CHECK(t->kvs->next->value->num.f == -0.5, "- 0.5 is one number");
    done(&r);
  }

  CASE("several errors in one run, one per statement") {
    Result r = parse_str("model m {\n"
                         "  fn f() -> t {\n"
                         "    let a = = 1\n"
                         "    let b = (1 +\n"
                         "    let c = 2 3\n"
                         "    return ]\n"
                         "  }\n"
                         "}\n"
                         "dim = 4\n");
    expect_errors(&r, 5);
    expect_diag(&r, "t.shard|3|13|expected an expression, found '='");
    expect_diag(&r, "t.shard|5|5|expected an expression, found 'let'");
    expect_diag(&r, "t.shard|5|15|expected an operator, a statement or '}', found '3'");
    expect_diag(&r, "t.shard|6|12|expected an expression, found ']'");
    expect_diag(&r, "t.shard|9|5|expected a name, found '='");
    done(&r);
  }

  CASE("diagnostic text: tabs kept so the caret aligns") {
    const char *text = "dim a = 1\n\tdim\tb = 1 $\n";
    Result r = parse_mem(text, strlen(text), DIAG_TEXT);
    expect_errors(&r, 1);
    expect_diag(&r, "t.shard:2:12: error: unexpected character '$'\n"
                    " 2 | \tdim\tb = 1 $\n"
                    "   | \t   \t      ^\n");
    done(&r);
  }

  CASE("diagnostic text: the caret spans the culprit; long lines are cut") {
    Result r = parse_mem("dim a = 12abc\n", 14, DIAG_TEXT);
    expect_diag(&r, "   |         ^~~~~\n");
    done(&r);
    char *s = malloc(20100);
    memset(s, ' ', 20000);
    memcpy(s, "dim a = 1", 9);
    strcpy(s + 10000, "$ # a long line\n");
    s[10015] = ' ';
    r = parse_mem(s, strlen(s), DIAG_TEXT);
    expect_errors(&r, 1);
    expect_diag(&r, "t.shard:1:10001: error: unexpected character '$'");
    UT_CHECK(r.diags_len < 600, "printed %zu bytes for a 20,000-byte line", r.diags_len);
    expect_diag(&r, "...");
    done(&r);
    free(s);
  }

  CASE("unclosed brace: error at the end, note at the opener") {
    Result r = parse_str("model m {\n  param w: f32[a]\n");
    expect_errors(&r, 1);
    expect_diag(&r, "error|t.shard|2|18|expected 'param', 'fn', '}' or ',', found end of file\n"
                    "note|t.shard|1|9|to close '{' at line 1\n");
    done(&r);
  }

  CASE("random bytes never crash") {
    char buf[4096];
    int total_errors = 0;
    for (int round = 0; round < 300; round++) {
      size_t len = rng() % sizeof buf;
      for (size_t i = 0; i < len; i++) {
        uint64_t x = rng();
        /* mostly printable, some newlines, some anything */
        buf[i] = (char)(x % 8 == 0 ? (x >> 8) : x % 8 == 1 ? '\n' : 32 + (x >> 8) % 95);
      }
      Result r = parse_mem(buf, len, round % 2 ? DIAG_TEXT : DIAG_MACHINE);
      total_errors += r.errors;
      done(&r);
      arena_free(&arena);
      arena_init(&arena);
    }
    UT_CHECK(total_errors > 0, "random bytes gave no errors at all");
  }

  CASE("random token soup never crashes") {
    static const char *const words[] = {
      "import", "target", "mesh", "dim", "layout", "model", "param", "fn", "let", "return", "for", "in",
      "train", "serve", "x", "y", "bf16", "4096", "1.5e3", "\"s\"", "1f1b", "{", "}", "(", ")", "[",
      "]", ",", ":", "=", ".", "@", "->", "+", "-", "*", "/", "\n", "#c\n", "4__0", "$"};
    char buf[8192];
    for (int round = 0; round < 2000; round++) {
      size_t len = 0, n = rng() % 300;
      for (size_t i = 0; i < n && len + 16 < sizeof buf; i++) {
        const char *w = words[rng() % (sizeof words / sizeof words[0])];
        len += (size_t)sprintf(buf + len, "%s ", w);
      }
      Result r = parse_mem(buf, len, DIAG_TEXT);
      FILE *sink = fopen("/dev/null", "w");
      if (r.ast && sink) ast_print(sink, r.ast);
      if (sink) fclose(sink);
      done(&r);
      arena_free(&arena);
      arena_init(&arena);
    }
  }

  CASE("a valid program round-trips through the printer") {
    Result r = parse_str("mesh pod = tpu_v5e[data: 4, model: 2]\n"
                         "model m { param w: bf16[a@model] fn f(x: f32[a]) -> f32[a] { return x @ w } }\n");
    expect_errors(&r, 0);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ast_print(f, r.ast);
    fclose(f);
    UT_CHECK(strstr(text, "(axis model @1:29\n") != NULL, "keyword `model` as an axis name:\n%s", text);
    UT_CHECK(strstr(text, "(binary matmul @2:69\n") != NULL, "matmul node:\n%s", text);
    free(text);
    done(&r);
  }


  CASE("machine form escapes backslash, bar and newline in paths and messages") {
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    diag_reset();
    diag_configure(out, DIAG_MACHINE, false);
    Source *src = source_from_memory("dir|a\\b.shard", "dim a = 1\n", 10);
    diag_error((SrcLoc){src, 1, 5, 1}, "one | two \\ three\nfour");
    diag_warning((SrcLoc){0}, "no place|here");
    fclose(out);
    UT_CHECK(strcmp(text, "error|dir\\|a\\\\b.shard|1|5|one \\| two \\\\ three\\nfour\n"
                          "warning||0|0|no place\\|here\n") == 0,
             "got:\n%s", text);
    free(text);
  }

  CASE("warnings are capped like errors") {
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    diag_reset();
    diag_configure(out, DIAG_TEXT, false);
    Source *src = source_from_memory("w.shard", "dim a = 1\n", 10);
    for (int i = 0; i < 1000; i++) {
      diag_warning((SrcLoc){src, 1, 5, 1}, "warning %d", i);
      diag_note((SrcLoc){src, 1, 1, 3}, "its note %d", i);
    }
    diag_error((SrcLoc){src, 1, 1, 3}, "one error");
    diag_finish();
    fclose(out);
    UT_CHECK(strstr(text, "warning 49\n") && !strstr(text, "warning 50\n"), "50 warnings shown");
    UT_CHECK(strstr(text, "its note 49\n") && !strstr(text, "its note 50\n"), "notes go with their warning");
    UT_CHECK(strstr(text, "error: one error"), "errors still shown after the warning limit");
    UT_CHECK(strstr(text, "shardc: 950 more warnings not shown (the limit is 50 warnings)\n"), "got:\n%.3000s",
             text);
    UT_CHECK(diag_warning_count() == 1000, "counted %d warnings", diag_warning_count());
    free(text);
  }

  CASE("diagnostics index a source's lines once: linear in the input") {
    /* 20,000 lines, a warning at each: the old way scanned from the top for every one (200 MB of
     * scanning here); the index scans the file once, whatever the number of diagnostics. */
    enum { LINES = 20000 };
    char *s = malloc(LINES * 24), *p = s;
    for (int i = 0; i < LINES; i++) p += sprintf(p, "dim d%d = %d\n", i, i + 1);
    size_t len = (size_t)(p - s);
    FILE *out = fopen("/dev/null", "w");
    diag_reset();
    diag_set_error_limit(0);
    diag_configure(out, DIAG_TEXT, false);
    Source *src = source_from_memory("lines.shard", s, len);
    size_t before = source_indexed_bytes();
    for (int i = LINES; i >= 1; i--) diag_warning((SrcLoc){src, i, 1, 3}, "w");
    size_t scanned = source_indexed_bytes() - before;
    UT_CHECK(scanned <= 2 * len, "scanned %zu bytes to print %d diagnostics on a %zu-byte file", scanned, LINES, len);
    const char *line;
    size_t n;
    UT_CHECK(source_line(src, 1, &line, &n) && n == 10 && strncmp(line, "dim d0 = 1", 10) == 0, "line 1");
    UT_CHECK(source_line(src, LINES, &line, &n) && strncmp(line, "dim d19999 = 20000", n) == 0, "last line");
    UT_CHECK(source_line(src, LINES + 1, &line, &n) && n == 0, "the empty line after the final newline");
    UT_CHECK(!source_line(src, LINES + 2, &line, &n), "no line past the end");
    fclose(out);
    diag_set_error_limit(50);
    free(s);
  }

  CASE("input over the size limit is refused; a pipe is read to its end") {
    char path[] = "/tmp/shardc_test_frontend_XXXXXX";
    int fd = mkstemp(path);
    UT_CHECK(fd >= 0, "mkstemp");
    char buf[3000];
    memset(buf, '#', sizeof buf);
    UT_CHECK(write(fd, buf, sizeof buf) == (ssize_t)sizeof buf, "write");
    close(fd);
    setenv("SHARDC_MAX_INPUT", "3000", 1);
    Source *ok = source_load(path);
    UT_CHECK(ok && ok->len == 3000, "a file of exactly the limit is read");
    setenv("SHARDC_MAX_INPUT", "2999", 1);
    errno = 0;
    UT_CHECK(source_load(path) == NULL && errno == EFBIG, "a file one byte over the limit is refused (EFBIG)");
    /* A stream with no size: /dev/zero is refused after limit + 1 bytes, not read for ever. */
    errno = 0;
    UT_CHECK(source_load("/dev/zero") == NULL && errno == EFBIG, "/dev/zero is refused");
    unsetenv("SHARDC_MAX_INPUT");
    UT_CHECK(source_max_bytes() == (size_t)64 << 20, "the default limit is 64 MiB");
    unlink(path);

    /* A pipe: 100,000 bytes written by a child, more than one read() returns. */
    int fds[2];
    UT_CHECK(pipe(fds) == 0, "pipe");
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      char chunk[1000];
      memset(chunk, '#', sizeof chunk);
      chunk[sizeof chunk - 1] = '\n';
      for (int i = 0; i < 100; i++)
        if (write(fds[1], chunk, sizeof chunk) != (ssize_t)sizeof chunk) _exit(1);
      _exit(0);
    }
    close(fds[1]);
    char dev[64];
    snprintf(dev, sizeof dev, "/dev/fd/%d", fds[0]);
    Source *piped = source_load(dev);
    UT_CHECK(piped && piped->len == 100000, "read %zu bytes from a pipe", piped ? piped->len : 0);
    close(fds[0]);
    waitpid(pid, NULL, 0);
  }

  CASE("a file is named the same way wherever it is reported: its tidied path") {
    char dir[] = "/tmp/shardc_paths_XXXXXX";
    UT_CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char a[256], b[256], sub[256], main_path[300];
    snprintf(a, sizeof a, "%s/a.shard", dir);
    snprintf(b, sizeof b, "%s/b.shard", dir);
    snprintf(sub, sizeof sub, "%s/sub", dir);
    snprintf(main_path, sizeof main_path, "%s/./sub/../a.shard", dir);
    mkdir(sub, 0700);
    FILE *f = fopen(a, "w");
    fputs("import \"./sub/../b\"\ndim x = $\n", f);
    fclose(f);
    f = fopen(b, "w");
    fputs("dim y = $\n", f);
    fclose(f);
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    diag_reset();
    diag_configure(out, DIAG_MACHINE, false);
    parse_program(&arena, main_path, NULL);
    fclose(out);
    char want_a[300], want_b[300];
    snprintf(want_a, sizeof want_a, "error|%s|2|9|", a);
    snprintf(want_b, sizeof want_b, "error|%s|1|9|", b);
    UT_CHECK(text && strstr(text, want_a) && strstr(text, want_b), "want %s and %s; got:\n%s", want_a, want_b, text);
    free(text);
    unlink(a), unlink(b), rmdir(sub), rmdir(dir);
  }

  source_free_all();
  intern_reset();
  arena_free(&arena);
  return ut_summary();
}
