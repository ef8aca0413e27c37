/* runner.c: runs shardc over the .shard test cases and checks what it says.
 *
 * In: a shardc executable and suite directories (every *.shard below them is one case). Out: one
 * `PASS name` / `FAIL name` line per case (a failure is followed by indented reasons), then
 * `N passed, N failed`; the exit status is 1 if anything failed, 2 on a usage error.
 *
 * A case is run as `shardc CMD FILE --diag-format machine ARGS...` from the case's own directory,
 * FILE being its base name (so golden output is exactly what `shardc CMD X.shard` prints there).
 * CMD defaults by the suite directory's name: parse and syntax -> parse, check -> check,
 * explain -> explain, anything else -> check. Expectations are written in the case itself:
 *
 *   # RUN: check --format json -D batch=64   whole-line comment: replaces CMD and ARGS (the file goes
 *                                            right after the first word); write it at the top
 *   let h = x @ y   # error: no shared dim   a diagnostic of that level AT THIS LINE whose message
 *                                            contains the text; also `# warning:` and `# note:`
 *   # error@+1: text  / # error@-2: text     the same, for the line N below / above this one
 *   # error(lib.shard:12): text              reported in another file (imports): a path that ends in
 *                                            lib.shard, at line 12; `(lib.shard)` any line there;
 *                                            `(*)` anywhere, including diagnostics with no location
 *   # exit: N                                expected exit status (default 1 if any error is
 *                                            expected, else 0)
 *   # strict-warnings                        unexpected warnings fail the case too
 *   # fails-with: text                       under --expect-fail, the case must fail for a reason
 *                                            containing the text (the self-test's cases say why)
 *
 * Several markers may share one comment (`# error: a # error: b`). Every expected diagnostic must be
 * reported (each report satisfies one expectation) and every reported error must be expected;
 * unexpected warnings and notes are allowed unless the case says `# strict-warnings`.
 * If X.out sits beside X.shard, stdout must equal it byte for byte; `--update` rewrites existing
 * goldens with what shardc printed (create an empty X.out first to start a new one).
 * Always a failure: death by a signal, running past the timeout (20 s; the process group is
 * killed), or a sanitizer report on stderr.
 *
 * `--parse-all DIR...` instead requires every .shard below the directories to pass `shardc parse`
 * with exit 0 and nothing at all on stderr. `--expect-fail` inverts the verdict of every case: the
 * runner's self-test uses it to prove that each kind of mismatch is caught. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

/* ---- small utilities ---- */

static void *xrealloc(void *p, size_t n) {
  p = realloc(p, n ? n : 1);
  if (!p) {
    fprintf(stderr, "runner: out of memory\n");
    exit(2);
  }
  return p;
}

static char *xstrndup(const char *s, size_t n) {
  char *d = xrealloc(NULL, n + 1);
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}

static char *xstrdup(const char *s) { return xstrndup(s, strlen(s)); }

/* A growable array of T: `ARR(T) a = {0}; ARR_PUSH(a, x);` */
#define ARR(T) struct { T *data; size_t len, cap; }
#define ARR_PUSH(a, x)                                                  \
  do {                                                                  \
    if ((a).len == (a).cap) {                                           \
      (a).cap = (a).cap ? (a).cap * 2 : 16;                             \
      (a).data = xrealloc((a).data, sizeof(*(a).data) * (a).cap);       \
    }                                                                   \
    (a).data[(a).len++] = (x);                                          \
  } while (0)

/* A byte buffer, always NUL-terminated once anything was added. */
typedef struct Buf {
  char *data;
  size_t len, cap;
} Buf;

static void buf_add(Buf *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    b->cap = (b->len + n + 1) * 2;
    b->data = xrealloc(b->data, b->cap);
  }
  memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = 0;
}

static void buf_printf(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_printf(Buf *b, const char *fmt, ...) {
  char tmp[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  buf_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static void buf_free(Buf *b) {
  free(b->data);
  *b = (Buf){0};
}

static const char *buf_str(const Buf *b) { return b->data ? b->data : ""; }

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool read_file(const char *path, Buf *out) {
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  char tmp[65536];
  size_t n;
  buf_add(out, "", 0);
  while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) buf_add(out, tmp, n);
  bool ok = !ferror(f);
  fclose(f);
  return ok;
}

static bool write_file(const char *path, const char *data, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f) return false;
  bool ok = fwrite(data, 1, len, f) == len;
  return fclose(f) == 0 && ok;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && memcmp(s + a - b, suffix, b) == 0;
}

/* `path` names the file `suffix` names: equal, or ending in "/suffix". */
static bool path_has_suffix(const char *path, const char *suffix) {
  size_t a = strlen(path), b = strlen(suffix);
  if (!ends_with(path, suffix)) return false;
  return a == b || path[a - b - 1] == '/';
}

/* One line of text, shown in a reason: at most 160 bytes, control characters escaped. */
static void buf_add_shown(Buf *b, const char *s, size_t n) {
  size_t shown = n > 160 ? 160 : n;
  for (size_t i = 0; i < shown; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c < 32 || c == 127) buf_printf(b, "\\x%02x", c);
    else buf_add(b, (const char *)&s[i], 1);
  }
  if (shown < n) buf_add(b, "...", 3);
}

/* ---- finding cases ---- */

typedef ARR(char *) StrList;

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every *.shard below dir (hidden entries skipped), appended to out. */
static void find_cases(const char *dir, StrList *out) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "runner: cannot open directory %s: %s\n", dir, strerror(errno));
    return;
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    size_t n = strlen(dir) + strlen(e->d_name) + 2;
    char *path = xrealloc(NULL, n);
    snprintf(path, n, "%s/%s", dir, e->d_name);
    struct stat st;
    if (stat(path, &st) != 0) {
      free(path);
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      find_cases(path, out);
      free(path);
    } else if (S_ISREG(st.st_mode) && ends_with(e->d_name, ".shard")) {
      ARR_PUSH(*out, path);
    } else {
      free(path);
    }
  }
  closedir(d);
}

/* ---- what a case expects ---- */

typedef enum { LV_ERROR, LV_WARNING, LV_NOTE } Level;
static const char *const level_names[] = {"error", "warning", "note"};

typedef struct Expect {
  Level level;
  char *file;   /* NULL: the case itself; "*": anywhere; else a path suffix */
  int line;     /* 0 with a file: any line */
  char *text;   /* the message must contain it */
  int written;  /* the line the expectation is written on */
  bool matched;
} Expect;

typedef struct Spec {
  ARR(Expect) expects;
  StrList run;          /* the # RUN: words, if any */
  int exit_code;        /* -1: derive from the expected errors */
  bool strict_warnings;
  char *fails_with;     /* # fails-with: the reason an --expect-fail case must fail for */
} Spec;

static bool parse_level(const char **pp, Level *lv) {
  for (int i = 0; i < 3; i++) {
    size_t n = strlen(level_names[i]);
    if (strncmp(*pp, level_names[i], n) == 0) {
      *pp += n;
      *lv = (Level)i;
      return true;
    }
  }
  return false;
}

/* Reads one marker `# LEVEL[@+N|@-N|(FILE[:N])|(*)]:` starting at the '#' at p. Fills e (not its
 * text) and returns the position after the ':', or NULL if p does not start a marker. */
static const char *parse_marker(const char *p, const char *end, int lineno, Expect *e) {
  if (p >= end || *p != '#') return NULL;
  p++;
  while (p < end && (*p == ' ' || *p == '\t')) p++;
  *e = (Expect){.line = lineno, .written = lineno};
  if (!parse_level(&p, &e->level)) return NULL;
  if (p < end && *p == '@') {
    p++;
    int sign = 1;
    if (p < end && (*p == '+' || *p == '-')) sign = *p++ == '-' ? -1 : 1;
    if (p >= end || *p < '0' || *p > '9') return NULL;
    int n = 0;
    while (p < end && *p >= '0' && *p <= '9' && n < 1000000) n = n * 10 + (*p++ - '0');
    e->line = lineno + sign * n;
  } else if (p < end && *p == '(') {
    const char *spec = ++p;
    while (p < end && *p != ')') p++;
    if (p >= end || p == spec) return NULL;
    const char *colon = NULL;
    for (const char *q = spec; q < p; q++)
      if (*q == ':') colon = q;
    e->line = 0;
    if (colon && colon + 1 < p && strspn(colon + 1, "0123456789") >= (size_t)(p - colon - 1)) {
      e->file = xstrndup(spec, (size_t)(colon - spec));
      e->line = atoi(colon + 1);
    } else {
      e->file = xstrndup(spec, (size_t)(p - spec));
    }
    p++;
  }
  if (p >= end || *p != ':') {
    free(e->file);
    e->file = NULL;
    return NULL;
  }
  return p + 1;
}

/* The first '#' of the line outside a string literal, or NULL. */
static const char *comment_start(const char *s, const char *end) {
  bool in_string = false;
  for (; s < end; s++) {
    if (in_string) {
      if (*s == '\\' && s + 1 < end) s++;
      else if (*s == '"') in_string = false;
    } else if (*s == '"') {
      in_string = true;
    } else if (*s == '#') {
      return s;
    }
  }
  return NULL;
}

/* Splits a # RUN: line into words; "double quotes" group a word. */
static void split_words(const char *s, const char *end, StrList *out) {
  while (s < end) {
    while (s < end && (*s == ' ' || *s == '\t')) s++;
    if (s >= end) break;
    Buf w = {0};
    buf_add(&w, "", 0);
    while (s < end && *s != ' ' && *s != '\t') {
      if (*s == '"') {
        for (s++; s < end && *s != '"'; s++) buf_add(&w, s, 1);
        if (s < end) s++;
      } else {
        buf_add(&w, s++, 1);
      }
    }
    ARR_PUSH(*out, w.data);
  }
}

static void trim_end(const char *start, const char **end) {
  while (*end > start && ((*end)[-1] == ' ' || (*end)[-1] == '\t' || (*end)[-1] == '\r')) (*end)--;
}

/* Reads the directives and expected diagnostics out of a case's text. */
static void spec_parse(const char *text, size_t len, Spec *sp) {
  *sp = (Spec){.exit_code = -1};
  const char *p = text, *end = text + len;
  for (int lineno = 1; p < end; lineno++) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol) eol = end;
    const char *c = comment_start(p, eol);
    if (c) {
      /* Whole-line directives. */
      const char *first = p;
      while (first < c && (*first == ' ' || *first == '\t')) first++;
      const char *d = c + 1;
      while (d < eol && (*d == ' ' || *d == '\t')) d++;
      const char *dend = eol;
      trim_end(d, &dend);
      if (first == c && strncmp(d, "RUN:", 4) == 0 && d + 4 <= eol) {
        split_words(d + 4, dend, &sp->run);
      } else if (first == c && strncmp(d, "exit:", 5) == 0 && d + 5 <= eol) {
        sp->exit_code = atoi(d + 5);
      } else if (first == c && strncmp(d, "fails-with:", 11) == 0 && d + 11 <= dend) {
        const char *t = d + 11;
        while (t < dend && (*t == ' ' || *t == '\t')) t++;
        free(sp->fails_with);
        sp->fails_with = xstrndup(t, (size_t)(dend - t));
      } else if (first == c && (size_t)(dend - d) == 15 && strncmp(d, "strict-warnings", 15) == 0) {
        sp->strict_warnings = true;
      } else {
        /* Markers: each one's text runs to the next marker or the end of the line. */
        Expect e;
        const char *after = parse_marker(c, eol, lineno, &e);
        while (after) {
          const char *t = after, *next_after = NULL, *q;
          Expect next;
          while (t < eol && (*t == ' ' || *t == '\t')) t++;
          for (q = t; q < eol; q++)
            if (*q == '#' && (next_after = parse_marker(q, eol, lineno, &next)) != NULL) break;
          const char *tend = q;
          trim_end(t, &tend);
          e.text = xstrndup(t, (size_t)(tend - t));
          ARR_PUSH(sp->expects, e);
          e = next;
          after = next_after;
        }
      }
    }
    p = eol < end ? eol + 1 : end;
  }
}

static void spec_free(Spec *sp) {
  for (size_t i = 0; i < sp->expects.len; i++) {
    free(sp->expects.data[i].file);
    free(sp->expects.data[i].text);
  }
  free(sp->expects.data);
  for (size_t i = 0; i < sp->run.len; i++) free(sp->run.data[i]);
  free(sp->run.data);
  free(sp->fails_with);
}

/* ---- running shardc ---- */

typedef struct RunResult {
  Buf out, err;
  int status;       /* from waitpid */
  bool timed_out;
  double seconds;
} RunResult;

/* Runs argv[0] in dir with stdin from /dev/null, capturing stdout and stderr, killing its whole
 * process group after timeout seconds. A path ending in .sh is run by /bin/sh (the self-test's fake
 * shardc), so the script need not be executable. */
static bool run_process(char **argv, const char *dir, double timeout, RunResult *r) {
  *r = (RunResult){0};
  buf_add(&r->out, "", 0);
  buf_add(&r->err, "", 0);
  int po[2], pe[2];
  if (pipe(po) != 0) return false;
  if (pipe(pe) != 0) {
    close(po[0]);
    close(po[1]);
    return false;
  }
  double start = now_seconds();
  pid_t pid = fork();
  if (pid < 0) {
    close(po[0]); close(po[1]); close(pe[0]); close(pe[1]);
    return false;
  }
  if (pid == 0) {
    setpgid(0, 0);
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, 0);
    dup2(po[1], 1);
    dup2(pe[1], 2);
    close(po[0]); close(po[1]); close(pe[0]); close(pe[1]);
    if (dir && chdir(dir) != 0) {
      fprintf(stderr, "runner: cannot enter %s: %s\n", dir, strerror(errno));
      _exit(127);
    }
    if (ends_with(argv[0], ".sh")) {
      int n = 0;
      while (argv[n]) n++;
      char **sh = calloc((size_t)n + 2, sizeof *sh);
      if (!sh) _exit(127);
      sh[0] = "/bin/sh";
      for (int i = 0; i < n; i++) sh[i + 1] = argv[i];
      execv("/bin/sh", sh);
    } else {
      execv(argv[0], argv);
    }
    fprintf(stderr, "runner: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid); /* also in the parent, so the kill below cannot miss */
  close(po[1]);
  close(pe[1]);

  struct pollfd fds[2] = {{.fd = po[0], .events = POLLIN}, {.fd = pe[0], .events = POLLIN}};
  Buf *bufs[2] = {&r->out, &r->err};
  int open_fds = 2;
  while (open_fds > 0) {
    double left = start + timeout - now_seconds();
    if (left <= 0) {
      r->timed_out = true;
      kill(-pid, SIGKILL);
      break;
    }
    int ready = poll(fds, 2, (int)(left * 1000) + 1);
    if (ready < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; i++) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char tmp[65536];
      ssize_t n = read(fds[i].fd, tmp, sizeof tmp);
      if (n > 0) {
        buf_add(bufs[i], tmp, (size_t)n);
      } else if (n == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        open_fds--;
      }
    }
  }
  for (int i = 0; i < 2; i++)
    if (fds[i].fd >= 0) close(fds[i].fd);
  while (waitpid(pid, &r->status, 0) < 0 && errno == EINTR) {}
  r->seconds = now_seconds() - start;
  return true;
}

static void result_free(RunResult *r) {
  buf_free(&r->out);
  buf_free(&r->err);
}

/* ---- checking what came back ---- */

typedef struct Diag {
  Level level;
  char *file;
  int line, col;
  char *msg;
  bool in_case;   /* file is the case itself */
  bool matched;
} Diag;

typedef ARR(Diag) DiagList;

/* `level|file|line|col|message`; false for any other line. */
static bool parse_diag(const char *s, size_t n, Diag *d) {
  const char *end = s + n, *p = s;
  *d = (Diag){0};
  if (!parse_level(&p, &d->level) || p >= end || *p != '|') return false;
  const char *file = ++p;
  while (p < end && *p != '|') p++;
  if (p >= end) return false;
  const char *file_end = p++;
  for (int *field = &d->line; field; field = field == &d->line ? &d->col : NULL) {
    int v = 0;
    bool digits = false;
    while (p < end && *p >= '0' && *p <= '9') {
      if (v < 100000000) v = v * 10 + (*p - '0');
      p++;
      digits = true;
    }
    if (p >= end || *p != '|' || (!digits && p[-1] != '|')) return false;
    *field = v;
    p++;
  }
  d->file = xstrndup(file, (size_t)(file_end - file));
  d->msg = xstrndup(p, (size_t)(end - p));
  return true;
}

/* Does a reported path name the case? Relative paths are relative to the case's directory. */
static bool names_case(const char *reported, const char *case_dir, const char *case_real) {
  if (!*reported) return false;
  char joined[PATH_MAX * 2], real[PATH_MAX];
  if (reported[0] == '/') snprintf(joined, sizeof joined, "%s", reported);
  else snprintf(joined, sizeof joined, "%s/%s", case_dir, reported);
  return realpath(joined, real) && strcmp(real, case_real) == 0;
}

static const char *const sanitizer_marks[] = {
    "runtime error:", "ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
    "WARNING: ThreadSanitizer", "ERROR: libFuzzer"};

/* Appends the reasons a finished process failed whatever the case expected: a signal, the timeout,
 * a sanitizer report on stderr. Returns true if there was one. */
static bool check_process(const RunResult *r, double timeout, Buf *why) {
  bool bad = false;
  if (r->timed_out) {
    buf_printf(why, "timed out after %g s (process group killed)\n", timeout);
    bad = true;
  } else if (WIFSIGNALED(r->status)) {
    int sig = WTERMSIG(r->status);
    buf_printf(why, "killed by signal %d (%s)\n", sig, strsignal(sig));
    bad = true;
  }
  for (size_t i = 0; i < sizeof sanitizer_marks / sizeof *sanitizer_marks; i++) {
    const char *hit = strstr(buf_str(&r->err), sanitizer_marks[i]);
    if (!hit) continue;
    const char *bol = hit, *eol = strchr(hit, '\n');
    while (bol > r->err.data && bol[-1] != '\n') bol--;
    if (!eol) eol = hit + strlen(hit);
    buf_add(why, "sanitizer report: ", 18);
    buf_add_shown(why, bol, (size_t)(eol - bol));
    buf_add(why, "\n", 1);
    bad = true;
    break;
  }
  return bad;
}

static void buf_add_loc(Buf *b, const Diag *d) {
  if (d->in_case) buf_printf(b, "line %d:%d", d->line, d->col);
  else if (*d->file) buf_printf(b, "%s:%d:%d", d->file, d->line, d->col);
  else buf_printf(b, "no location");
}

static bool expect_matches(const Expect *e, const Diag *d) {
  if (d->matched || d->level != e->level || !strstr(d->msg, e->text)) return false;
  if (!e->file) return d->in_case && d->line == e->line;
  if (strcmp(e->file, "*") == 0) return true;
  return path_has_suffix(d->file, e->file) && (e->line == 0 || d->line == e->line);
}

/* Pairs each expectation with one unused report of its level, place and text, in order; then
 * every leftover expectation, and every leftover error (and warning under strict-warnings), is a
 * reason to fail. Returns true if all is well. */
static bool check_diags(Spec *sp, DiagList *diags, Buf *why) {
  bool ok = true;
  for (size_t i = 0; i < sp->expects.len; i++) {
    Expect *e = &sp->expects.data[i];
    for (size_t j = 0; j < diags->len && !e->matched; j++)
      if (expect_matches(e, &diags->data[j])) e->matched = diags->data[j].matched = true;
  }
  for (size_t i = 0; i < sp->expects.len; i++) {
    Expect *e = &sp->expects.data[i];
    if (e->matched) continue;
    ok = false;
    buf_printf(why, "expected %s", level_names[e->level]);
    if (!e->file) buf_printf(why, " at line %d", e->line);
    else if (strcmp(e->file, "*") != 0) buf_printf(why, " in %s:%d", e->file, e->line);
    buf_printf(why, " containing '%s' (written at line %d): not reported\n", e->text, e->written);
    for (size_t j = 0; j < diags->len; j++) {
      Diag *d = &diags->data[j];
      if (!e->file && d->in_case && d->line == e->line) {
        buf_printf(why, "  that line got %s: ", level_names[d->level]);
        buf_add_shown(why, d->msg, strlen(d->msg));
        buf_add(why, "\n", 1);
      }
    }
  }
  for (size_t j = 0; j < diags->len; j++) {
    Diag *d = &diags->data[j];
    if (d->matched || d->level == LV_NOTE || (d->level == LV_WARNING && !sp->strict_warnings)) continue;
    ok = false;
    buf_printf(why, "unexpected %s at ", level_names[d->level]);
    buf_add_loc(why, d);
    buf_add(why, ": ", 2);
    buf_add_shown(why, d->msg, strlen(d->msg));
    buf_add(why, "\n", 1);
  }
  return ok;
}

/* stdout against the golden file, byte for byte; on a mismatch, the first differing line. */
static bool check_golden(const char *golden_path, const char *golden_name, const Buf *got, Buf *why) {
  Buf want = {0};
  if (!read_file(golden_path, &want)) {
    buf_printf(why, "cannot read %s: %s\n", golden_name, strerror(errno));
    buf_free(&want);
    return false;
  }
  bool same = want.len == got->len && memcmp(want.data, buf_str(got), got->len) == 0;
  if (!same) {
    const char *a = buf_str(&want), *b = buf_str(got);
    const char *aend = a + want.len, *bend = b + got->len;
    for (int line = 1;; line++) {
      const char *ae = memchr(a, '\n', (size_t)(aend - a)), *be = memchr(b, '\n', (size_t)(bend - b));
      if (!ae) ae = aend;
      if (!be) be = bend;
      bool a_done = a >= aend, b_done = b >= bend;
      if (a_done || b_done || ae - a != be - b || memcmp(a, b, (size_t)(ae - a)) != 0 ||
          (ae == aend) != (be == bend)) {
        buf_printf(why, "stdout differs from %s at line %d\n  expected: ", golden_name, line);
        if (a_done) buf_printf(why, "<end of output>");
        else buf_add_shown(why, a, (size_t)(ae - a));
        buf_printf(why, "\n  got:      ");
        if (b_done) buf_printf(why, "<end of output>");
        else buf_add_shown(why, b, (size_t)(be - b));
        if ((ae == aend) != (be == bend) && ae - a == be - b) buf_printf(why, "  (final newline differs)");
        buf_add(why, "\n", 1);
        break;
      }
      a = ae + 1;
      b = be + 1;
    }
  }
  buf_free(&want);
  return same;
}

/* ---- cases ---- */

typedef struct Options {
  const char *shardc;    /* absolute path */
  const char *cmd;       /* --cmd: the suite's default command, instead of the one its name implies */
  const char *filter;    /* run only cases whose name contains this */
  double timeout;        /* seconds per case */
  bool update, expect_fail, verbose;
} Options;

/* The command a suite's cases run by default, from the suite directory's name. */
static const char *default_command(const char *suite_dir) {
  const char *base = strrchr(suite_dir, '/');
  base = base ? base + 1 : suite_dir;
  if (strcmp(base, "parse") == 0 || strcmp(base, "syntax") == 0) return "parse";
  if (strcmp(base, "explain") == 0) return "explain";
  return "check";
}

static void buf_add_command(Buf *b, const char *dir, char **argv) {
  buf_printf(b, "command: (cd %s && %s", dir, argv[0]);
  for (int i = 1; argv[i]; i++) buf_printf(b, " %s", argv[i]);
  buf_printf(b, ")\n");
}

/* The first lines of stderr that are not diagnostics the case expected, for context. */
static void buf_add_stderr_head(Buf *b, const Buf *err) {
  const char *p = buf_str(err), *end = p + err->len;
  int shown = 0;
  while (p < end && shown < 8) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol) eol = end;
    buf_add(b, shown == 0 ? "stderr:  " : "         ", 9);
    buf_add_shown(b, p, (size_t)(eol - p));
    buf_add(b, "\n", 1);
    shown++;
    p = eol + 1;
  }
  if (p < end) buf_printf(b, "         ...\n");
}

/* Runs one case and judges it; the reasons for a failure go to why. `dir` and `base` split the
 * case's real path; in parse-all mode, the case must merely parse cleanly. */
static bool run_case(const Options *o, const char *path, const char *default_cmd, bool parse_all,
                     bool *updated, char **fails_with, Buf *why) {
  char real[PATH_MAX];
  Buf text = {0};
  if (!realpath(path, real) || !read_file(real, &text)) {
    buf_printf(why, "cannot read %s: %s\n", path, strerror(errno));
    buf_free(&text);
    return false;
  }
  char *slash = strrchr(real, '/');
  char *dir = xstrndup(real, (size_t)(slash - real));
  if (!*dir) {
    free(dir);
    dir = xstrdup("/");
  }
  const char *base = slash + 1;

  Spec sp;
  spec_parse(buf_str(&text), text.len, &sp);
  if (parse_all) sp.run.len = 0;
  if (sp.fails_with) *fails_with = xstrdup(sp.fails_with);

  /* shardc CMD FILE --diag-format machine ARGS... */
  ARR(char *) argv = {0};
  ARR_PUSH(argv, (char *)o->shardc);
  ARR_PUSH(argv, sp.run.len ? sp.run.data[0] : (char *)default_cmd);
  ARR_PUSH(argv, (char *)base);
  ARR_PUSH(argv, "--diag-format");
  ARR_PUSH(argv, "machine");
  for (size_t i = 1; i < sp.run.len; i++) ARR_PUSH(argv, sp.run.data[i]);
  ARR_PUSH(argv, NULL);

  bool ok = true;
  RunResult r;
  if (o->verbose) {
    Buf cmd = {0};
    buf_add_command(&cmd, dir, argv.data);
    fputs(buf_str(&cmd), stdout);
    buf_free(&cmd);
  }
  if (!run_process(argv.data, dir, o->timeout, &r)) {
    buf_printf(why, "cannot start %s: %s\n", o->shardc, strerror(errno));
    ok = false;
    goto done;
  }
  if (check_process(&r, o->timeout, why)) ok = false;

  if (parse_all) {
    if (ok && WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0) {
      buf_printf(why, "exit status %d, expected 0\n", WEXITSTATUS(r.status));
      ok = false;
    }
    if (r.err.len > 0) {
      if (ok) buf_printf(why, "stderr is not empty\n");
      ok = false;
    }
  } else {
    DiagList diags = {0};
    const char *p = buf_str(&r.err), *end = p + r.err.len;
    while (p < end) {
      const char *eol = memchr(p, '\n', (size_t)(end - p));
      if (!eol) eol = end;
      Diag d;
      if (parse_diag(p, (size_t)(eol - p), &d)) {
        d.in_case = names_case(d.file, dir, real);
        ARR_PUSH(diags, d);
      }
      p = eol + 1;
    }
    int want_exit = sp.exit_code;
    if (want_exit < 0) {
      want_exit = 0;
      for (size_t i = 0; i < sp.expects.len; i++)
        if (sp.expects.data[i].level == LV_ERROR) want_exit = 1;
    }
    if (!r.timed_out && WIFEXITED(r.status) && WEXITSTATUS(r.status) != want_exit) {
      buf_printf(why, "exit status %d, expected %d\n", WEXITSTATUS(r.status), want_exit);
      ok = false;
    }
    if (!r.timed_out && !check_diags(&sp, &diags, why)) ok = false;
    for (size_t i = 0; i < diags.len; i++) {
      free(diags.data[i].file);
      free(diags.data[i].msg);
    }
    free(diags.data);

    /* Golden stdout: X.out beside X.shard. */
    size_t n = strlen(real);
    char *golden = xrealloc(NULL, n + 2);
    memcpy(golden, real, n - 6);
    strcpy(golden + n - 6, ".out");
    if (access(golden, F_OK) == 0 && !r.timed_out) {
      const char *golden_name = strrchr(golden, '/') + 1;
      if (o->update) {
        Buf old = {0};
        read_file(golden, &old);
        if (old.len != r.out.len || memcmp(buf_str(&old), buf_str(&r.out), r.out.len) != 0) {
          if (write_file(golden, buf_str(&r.out), r.out.len)) {
            *updated = true;
          } else {
            buf_printf(why, "cannot write %s: %s\n", golden_name, strerror(errno));
            ok = false;
          }
        }
        buf_free(&old);
      } else if (!check_golden(golden, golden_name, &r.out, why)) {
        ok = false;
      }
    }
    free(golden);
  }
  if (!ok) {
    buf_add_command(why, dir, argv.data);
    buf_add_stderr_head(why, &r.err);
  }
  result_free(&r);
done:
  free(argv.data);
  spec_free(&sp);
  free(dir);
  buf_free(&text);
  return ok;
}

/* Prints the verdict on one case; returns whether it counts as passed. Under --expect-fail a case
 * passes if it failed, and for the reason its `# fails-with:` names, if any. */
static bool report(const Options *o, const char *name, bool ok, bool updated, const char *fails_with,
                   const Buf *why) {
  bool wrong_reason = !ok && fails_with && !strstr(buf_str(why), fails_with);
  bool pass = o->expect_fail ? !ok && !wrong_reason : ok;
  if (pass) {
    printf("PASS %s", name);
    if (o->expect_fail) {
      const char *first = buf_str(why), *eol = strchr(first, '\n');
      printf(" (failed as expected: %.*s)", (int)(eol ? eol - first : (long)strlen(first)), first);
    }
    if (updated) printf(" (golden updated)");
    printf("\n");
  } else {
    printf("FAIL %s\n", name);
    if (o->expect_fail && ok) {
      printf("    expected this case to fail, but it passed\n");
    } else {
      if (o->expect_fail) printf("    expected a failure containing '%s', got:\n", fails_with);
      const char *p = buf_str(why);
      while (*p) {
        const char *eol = strchr(p, '\n');
        size_t n = eol ? (size_t)(eol - p) : strlen(p);
        printf("    %.*s\n", (int)n, p);
        p += n + (eol ? 1 : 0);
      }
    }
  }
  fflush(stdout);
  return pass;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: runner --shardc PATH --suite DIR [--suite DIR...] [options]\n"
          "       runner --shardc PATH --parse-all DIR...\n"
          "options:\n"
          "  --update        rewrite existing X.out goldens with what shardc printed\n"
          "  --expect-fail   every case must fail (the runner's self-test)\n"
          "  --cmd CMD       default command for the suites' cases (else from the suite's name)\n"
          "  --filter TEXT   run only cases whose name contains TEXT\n"
          "  --timeout SECS  per case (default 20)\n"
          "  --verbose       print each command before running it\n");
}

int main(int argc, char **argv) {
  Options o = {.timeout = 20};
  StrList suites = {0}, parse_all = {0};
  bool in_parse_all = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bool has_value = i + 1 < argc;
    if (strcmp(a, "--shardc") == 0 && has_value) o.shardc = argv[++i], in_parse_all = false;
    else if (strcmp(a, "--suite") == 0 && has_value) {
      ARR_PUSH(suites, argv[++i]);
      in_parse_all = false;
    }
    else if (strcmp(a, "--cmd") == 0 && has_value) o.cmd = argv[++i], in_parse_all = false;
    else if (strcmp(a, "--filter") == 0 && has_value) o.filter = argv[++i], in_parse_all = false;
    else if (strcmp(a, "--timeout") == 0 && has_value) o.timeout = atof(argv[++i]), in_parse_all = false;
    else if (strcmp(a, "--update") == 0) o.update = true, in_parse_all = false;
    else if (strcmp(a, "--expect-fail") == 0) o.expect_fail = true, in_parse_all = false;
    else if (strcmp(a, "--verbose") == 0 || strcmp(a, "-v") == 0) o.verbose = true, in_parse_all = false;
    else if (strcmp(a, "--parse-all") == 0) in_parse_all = true;
    else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return usage(stdout), 0;
    else if (in_parse_all && a[0] != '-') {
      ARR_PUSH(parse_all, argv[i]);
    }
    else {
      fprintf(stderr, "runner: unknown or incomplete argument '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (!o.shardc || (suites.len == 0 && parse_all.len == 0) || o.timeout <= 0) {
    usage(stderr);
    return 2;
  }
  char shardc_real[PATH_MAX];
  if (!realpath(o.shardc, shardc_real) ||
      access(shardc_real, ends_with(shardc_real, ".sh") ? R_OK : X_OK) != 0) {
    fprintf(stderr, "runner: cannot use shardc '%s': %s\n", o.shardc, strerror(errno));
    return 2;
  }
  o.shardc = shardc_real;

  int passed = 0, failed = 0;
  for (int mode = 0; mode < 2; mode++) {
    StrList *dirs = mode == 0 ? &suites : &parse_all;
    for (size_t s = 0; s < dirs->len; s++) {
      const char *root = dirs->data[s];
      char root_real[PATH_MAX];
      if (!realpath(root, root_real)) {
        fprintf(stderr, "runner: no such directory %s\n", root);
        failed++;
        continue;
      }
      StrList cases = {0};
      find_cases(root_real, &cases);
      qsort(cases.data, cases.len, sizeof *cases.data, cmp_str);
      if (cases.len == 0) {
        printf("FAIL %s\n    no .shard cases found\n", root);
        failed++;
      }
      /* A case's name: the suite directory's name, then its path below it. */
      const char *root_base = strrchr(root_real, '/');
      root_base = root_base ? root_base + 1 : root_real;
      const char *cmd = o.cmd ? o.cmd : default_command(root_real);
      for (size_t i = 0; i < cases.len; i++) {
        char name[PATH_MAX * 2];
        snprintf(name, sizeof name, "%s%s", root_base, cases.data[i] + strlen(root_real));
        if (o.filter && !strstr(name, o.filter)) continue;
        Buf why = {0};
        bool updated = false;
        char *fails_with = NULL;
        bool ok = run_case(&o, cases.data[i], mode == 0 ? cmd : "parse", mode == 1, &updated,
                           &fails_with, &why);
        if (report(&o, name, ok, updated, fails_with, &why)) passed++;
        else failed++;
        free(fails_with);
        buf_free(&why);
      }
      for (size_t i = 0; i < cases.len; i++) free(cases.data[i]);
      free(cases.data);
    }
  }
  free(suites.data);
  free(parse_all.data);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
