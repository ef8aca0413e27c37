/* diag.c: printing errors, warnings and notes.
 *
 * Text form:
 *   file:line:col: error: message
 *    12 |   let h = x @ w
 *       |           ^~~~~
 * The caret line copies the tabs of the source line so the caret lands under the culprit whatever
 * the tab width, and skips UTF-8 continuation bytes so it aligns on terminals. Lines longer than
 * DIAG_WINDOW bytes are cut to a window around the culprit, and the caret run is cut with them, so
 * a 1 MB token prints a short line. The source line is found through the source's line index
 * (source_line), so N diagnostics cost O(N), not N scans of the file.
 *
 * Machine form: `level|file|line|col|message`, one line each, with `\` written `\\`, `|` written
 * `\|` and a newline written `\n` in the file and the message, so that a line always splits on its
 * first four unescaped bars.
 *
 * After `limit` errors no more errors are printed, and after `limit` warnings no more warnings (a
 * flood helps nobody); the counts go on and diag_finish says how many were not shown. A note
 * belongs to the diagnostic before it and is dropped with it. */
#include <stdarg.h>
#include <string.h>

#include "diag.h"

enum { DIAG_WINDOW = 120, DIAG_LEAD = 40, DIAG_DEFAULT_LIMIT = 50 };

static struct {
  FILE *out;
  DiagFormat format;
  bool color;
  int errors, warnings;
  int limit;             /* errors printed at most, and warnings printed at most; 0 = no limit */
  int hidden_errors;     /* counted but not printed */
  int hidden_warnings;
  bool last_shown;       /* was the last error/warning printed (so its notes are too)? */
  int quiet;             /* diag_push_quiet depth: > 0 drops everything */
  int quiet_errors;      /* errors dropped while quiet (diag_quiet_error_count) */
  DiagSink sink;         /* diag_set_sink */
  void *sink_ctx;
} D = {NULL, DIAG_TEXT, false, 0, 0, DIAG_DEFAULT_LIMIT, 0, 0, true, 0, 0, NULL, NULL};

void diag_set_sink(DiagSink sink, void *ctx) {
  D.sink = sink;
  D.sink_ctx = ctx;
}

void diag_configure(FILE *out, DiagFormat fmt, bool color) {
  D.out = out;
  D.format = fmt;
  D.color = color;
}

void diag_reset(void) {
  D.errors = D.warnings = D.hidden_errors = D.hidden_warnings = D.quiet = D.quiet_errors = 0;
  D.last_shown = true;
}

void diag_set_error_limit(int n) { D.limit = n < 0 ? 0 : n; }
int diag_error_count(void) { return D.errors; }
int diag_warning_count(void) { return D.warnings; }
int diag_quiet_error_count(void) { return D.quiet_errors; }

bool diag_would_show(DiagLevel level) {
  if (D.quiet) return false;
  if (level == DIAG_ERROR) return !(D.limit > 0 && D.errors >= D.limit);
  if (level == DIAG_WARNING) return !(D.limit > 0 && D.warnings >= D.limit);
  return D.last_shown;
}

static FILE *diag_out(void) { return D.out ? D.out : stderr; }

static const char *const level_names[] = {"error", "warning", "note"};
static const char *const level_colors[] = {"\033[1;31m", "\033[1;35m", "\033[1;36m"};

static bool is_utf8_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

/* The source line with a caret run under bytes [col-1, col-1+len) of it, cut to a window. */
static void diag_print_snippet(FILE *f, SrcLoc loc) {
  const char *line;
  size_t line_len;
  if (!source_line(loc.file, loc.line, &line, &line_len)) return;
  size_t c0 = loc.col > 0 ? (size_t)loc.col - 1 : 0;
  size_t clen = loc.len > 0 ? (size_t)loc.len : 1;
  if (c0 > line_len) c0 = line_len;

  /* The window [w0, w1) of the line to show. */
  size_t w0 = 0, w1 = line_len;
  if (line_len > DIAG_WINDOW) {
    w0 = c0 > DIAG_LEAD ? c0 - DIAG_LEAD : 0;
    w1 = w0 + DIAG_WINDOW < line_len ? w0 + DIAG_WINDOW : line_len;
  }
  bool cut_left = w0 > 0, cut_right = w1 < line_len;
  size_t caret_end = c0 + clen;
  if (caret_end > w1 + 1) caret_end = w1 > c0 ? w1 : c0 + 1; /* a culprit past the window */

  char num[16];
  int numw = snprintf(num, sizeof num, "%d", loc.line);
  fprintf(f, " %s | %s", num, cut_left ? "..." : "");
  for (size_t i = w0; i < w1; i++) {
    unsigned char c = (unsigned char)line[i];
    fputc(c == '\t' || c >= 0x80 || (c >= 0x20 && c != 0x7F) ? c : ' ', f);
  }
  fprintf(f, "%s\n %*s | %s", cut_right ? "..." : "", numw, "", cut_left ? "   " : "");
  for (size_t i = w0; i < c0; i++) {
    unsigned char c = (unsigned char)line[i];
    if (c == '\t') fputc('\t', f);
    else if (!is_utf8_continuation(c)) fputc(' ', f);
  }
  if (D.color) fputs("\033[1;32m", f);
  fputc('^', f);
  for (size_t i = c0 + 1; i < caret_end; i++) {
    if (i >= line_len || !is_utf8_continuation((unsigned char)line[i])) fputc('~', f);
  }
  if (D.color) fputs("\033[0m", f);
  fputc('\n', f);
}

void diag_push_quiet(void) { D.quiet++; }
void diag_pop_quiet(void) {
  if (D.quiet > 0) D.quiet--;
}

/* s with the machine form's escapes (\\, \|, \n), to f. */
static void put_escaped(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '\\') fputs("\\\\", f);
    else if (*s == '|') fputs("\\|", f);
    else if (*s == '\n') fputs("\\n", f);
    else fputc(*s, f);
  }
}

static void diag_vreport(DiagLevel level, SrcLoc loc, const char *fmt, va_list ap) {
  if (D.quiet) {
    D.quiet_errors += level == DIAG_ERROR && D.quiet == 1; /* an inner trial's errors are its own */
    return;
  }
  if (level == DIAG_ERROR) {
    D.errors++;
    D.last_shown = !(D.limit > 0 && D.errors > D.limit);
    if (!D.last_shown) D.hidden_errors++;
  } else if (level == DIAG_WARNING) {
    D.warnings++;
    D.last_shown = !(D.limit > 0 && D.warnings > D.limit);
    if (!D.last_shown) D.hidden_warnings++;
  }
  if (!D.last_shown && !D.sink) return;

  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  if (D.sink) D.sink(level, loc, msg, D.sink_ctx);
  if (!D.last_shown) return;
  FILE *f = diag_out();
  if (D.format == DIAG_MACHINE) {
    fprintf(f, "%s|", level_names[level]);
    if (loc.file) put_escaped(f, loc.file->path);
    fprintf(f, "|%d|%d|", loc.file ? loc.line : 0, loc.file ? loc.col : 0);
    put_escaped(f, msg);
    fputc('\n', f);
    return;
  }
  const char *bold = D.color ? "\033[1m" : "", *reset = D.color ? "\033[0m" : "";
  const char *lc = D.color ? level_colors[level] : "";
  if (!loc.file) {
    /* No place in any source: command-line and file-system problems ("shardc: cannot open ..."). */
    if (level == DIAG_ERROR) fprintf(f, "shardc: %s\n", msg);
    else fprintf(f, "shardc: %s%s:%s %s\n", lc, level_names[level], reset, msg);
    return;
  }
  fprintf(f, "%s%s:%d:%d:%s %s%s:%s %s%s%s\n", bold, loc.file->path, loc.line, loc.col, reset, lc,
          level_names[level], reset, bold, msg, reset);
  diag_print_snippet(f, loc);
}

void diag_usage(const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (D.sink) D.sink(DIAG_ERROR, (SrcLoc){0}, msg, D.sink_ctx);
  fprintf(diag_out(), "shardc: %s\n", msg);
}

void diag_error(SrcLoc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  diag_vreport(DIAG_ERROR, loc, fmt, ap);
  va_end(ap);
}

void diag_warning(SrcLoc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  diag_vreport(DIAG_WARNING, loc, fmt, ap);
  va_end(ap);
}

void diag_note(SrcLoc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  diag_vreport(DIAG_NOTE, loc, fmt, ap);
  va_end(ap);
}

/* "12 more errors and 3 more warnings not shown (the limit is 50 of each)" */
void diag_finish(void) {
  if (D.hidden_errors == 0 && D.hidden_warnings == 0) return;
  char msg[200];
  int n = 0;
  if (D.hidden_errors) n += snprintf(msg + n, sizeof msg - (size_t)n, "%d more error%s", D.hidden_errors,
                                     D.hidden_errors == 1 ? "" : "s");
  if (D.hidden_warnings) n += snprintf(msg + n, sizeof msg - (size_t)n, "%s%d more warning%s", n ? " and " : "",
                                       D.hidden_warnings, D.hidden_warnings == 1 ? "" : "s");
  const char *of = D.hidden_errors && D.hidden_warnings ? "of each" : D.hidden_errors ? "errors" : "warnings";
  snprintf(msg + n, sizeof msg - (size_t)n, " not shown (the limit is %d %s)", D.limit, of);
  FILE *f = diag_out();
  if (D.format == DIAG_MACHINE) fprintf(f, "note||0|0|%s\n", msg);
  else fprintf(f, "shardc: %s\n", msg);
  D.hidden_errors = D.hidden_warnings = 0;
}
