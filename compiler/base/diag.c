/* diag.c: printing errors, warnings and notes.
 *
 * Text form:
 *   file:line:col: error: message
 *    12 |   let h = x @ w
 *       |           ^~~~~
 * The caret line copies the tabs of the source line so the caret lands under the culprit whatever
 * the tab width, and skips UTF-8 continuation bytes so it aligns on terminals. Lines longer than
 * DIAG_WINDOW bytes are cut to a window around the culprit, and the caret run is cut with them, so
 * a 1 MB token prints a short line. Machine form: `error|file|line|col|message`, one line each.
 *
 * After `error_limit` errors nothing more is printed (a flood helps nobody); the counts go on and
 * diag_finish says how many were not shown. A note belongs to the diagnostic before it and is
 * dropped with it. */
#include <stdarg.h>
#include <string.h>

#include "diag.h"

enum { DIAG_WINDOW = 120, DIAG_LEAD = 40, DIAG_DEFAULT_LIMIT = 50 };

static struct {
  FILE *out;
  DiagFormat format;
  bool color;
  int errors;
  int limit;          /* errors printed at most; 0 = no limit */
  int hidden;         /* errors and warnings counted but not printed */
  bool last_shown;    /* was the last error/warning printed (so its notes are too)? */
  int quiet;          /* diag_push_quiet depth: > 0 drops everything */
} D = {NULL, DIAG_TEXT, false, 0, DIAG_DEFAULT_LIMIT, 0, true, 0};

void diag_configure(FILE *out, DiagFormat fmt, bool color) {
  D.out = out;
  D.format = fmt;
  D.color = color;
}

void diag_reset(void) {
  D.errors = D.hidden = D.quiet = 0;
  D.last_shown = true;
}

void diag_set_error_limit(int n) { D.limit = n < 0 ? 0 : n; }
int diag_error_count(void) { return D.errors; }

static FILE *diag_out(void) { return D.out ? D.out : stderr; }

static const char *const level_names[] = {"error", "warning", "note"};
static const char *const level_colors[] = {"\033[1;31m", "\033[1;35m", "\033[1;36m"};

/* Find line `line` (1-based) of src: its start and length without the newline. False if the file
 * has fewer lines (a location past the end, such as end of file after a final newline). */
static bool diag_find_line(const Source *src, int line, const char **start, size_t *len) {
  const char *p = src->text, *end = src->text + src->len;
  for (int l = 1; l < line; l++) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl) return false;
    p = nl + 1;
  }
  const char *nl = memchr(p, '\n', (size_t)(end - p));
  *start = p;
  *len = (size_t)((nl ? nl : end) - p);
  return true;
}

static bool is_utf8_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

/* The source line with a caret run under bytes [col-1, col-1+len) of it, cut to a window. */
static void diag_print_snippet(FILE *f, SrcLoc loc) {
  const char *line;
  size_t line_len;
  if (!diag_find_line(loc.file, loc.line, &line, &line_len)) return;
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

static void diag_vreport(DiagLevel level, SrcLoc loc, const char *fmt, va_list ap) {
  if (D.quiet) return;
  if (level == DIAG_ERROR) D.errors++;
  if (level != DIAG_NOTE) {
    D.last_shown = !(D.limit > 0 && D.errors - (level == DIAG_ERROR) >= D.limit);
    if (!D.last_shown) D.hidden++;
  }
  if (!D.last_shown) return;

  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  FILE *f = diag_out();
  if (D.format == DIAG_MACHINE) {
    for (char *p = msg; *p; p++)
      if (*p == '\n' || *p == '|') *p = ' ';
    if (loc.file) fprintf(f, "%s|%s|%d|%d|%s\n", level_names[level], loc.file->path, loc.line, loc.col, msg);
    else fprintf(f, "%s||0|0|%s\n", level_names[level], msg);
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

void diag_finish(void) {
  if (D.hidden == 0) return;
  FILE *f = diag_out();
  if (D.format == DIAG_MACHINE)
    fprintf(f, "note||0|0|%d more errors and warnings not shown (the limit is %d errors)\n", D.hidden, D.limit);
  else
    fprintf(f, "shardc: %d more errors and warnings not shown (the limit is %d errors)\n", D.hidden, D.limit);
  D.hidden = 0;
}
