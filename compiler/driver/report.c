/* report.c: one JSON object per command, and the text reports' line width (see report.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "report.h"

enum { REPORT_MAX_DIAGS = 1000 }; /* a flood is cut here, as the text form cuts it at 50 */

static struct {
  bool json;
  bool printed;
  cJSON *errors, *warnings;
  int n;
} R;

const char *report_file(SrcLoc loc) { return loc.file ? loc.file->path : NULL; }

static void sink(DiagLevel level, SrcLoc loc, const char *message, void *ctx) {
  (void)ctx;
  if (level == DIAG_NOTE || R.n >= REPORT_MAX_DIAGS) return;
  R.n++;
  cJSON *e = cJSON_CreateObject();
  if (loc.file) {
    cJSON_AddStringToObject(e, "file", report_file(loc));
    cJSON_AddNumberToObject(e, "line", loc.line);
    cJSON_AddNumberToObject(e, "col", loc.col);
  }
  cJSON_AddStringToObject(e, "message", message);
  cJSON_AddItemToArray(level == DIAG_ERROR ? R.errors : R.warnings, e);
}

void report_begin(const Options *o) {
  memset(&R, 0, sizeof R);
  R.json = o->format == FORMAT_JSON;
  if (!R.json) return;
  R.errors = cJSON_CreateArray();
  R.warnings = cJSON_CreateArray();
  diag_set_sink(sink, NULL);
}

static cJSON **capture;

void report_capture(cJSON **slot) { capture = slot; }

void report_json(cJSON *obj) {
  if (capture) {
    cJSON_Delete(*capture);
    *capture = obj;
    R.printed = true;
    return;
  }
  char *s = cJSON_Print(obj);
  if (s) {
    fputs(s, stdout);
    fputc('\n', stdout);
    cJSON_free(s);
  }
  cJSON_Delete(obj);
  R.printed = true;
}

cJSON *report_warnings(void) {
  return R.json && R.warnings ? cJSON_Duplicate(R.warnings, true) : cJSON_CreateArray();
}

int report_end(const Options *o, int rc) {
  (void)o;
  if (R.json) {
    diag_set_sink(NULL, NULL);
    if (!R.printed && (rc != EXIT_OK || cJSON_GetArraySize(R.errors) > 0)) {
      cJSON *obj = cJSON_CreateObject();
      if (cJSON_GetArraySize(R.errors) == 0) { /* a failure with no located diagnostic */
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "message", rc == EXIT_USAGE ? "usage error (see 'shardc --help')" : "failed");
        cJSON_AddItemToArray(R.errors, e);
      }
      cJSON_AddItemToObject(obj, "errors", R.errors);
      cJSON_AddItemToObject(obj, "warnings", R.warnings);
      R.errors = R.warnings = NULL;
      report_json(obj);
    }
    cJSON_Delete(R.errors);
    cJSON_Delete(R.warnings);
  }
  memset(&R, 0, sizeof R);
  return rc;
}

int report_width(void) {
  enum { DEFAULT = 100, NARROWEST = 60 };
  if (!isatty(STDOUT_FILENO)) return DEFAULT;
  struct winsize ws;
  int w = ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 ? ws.ws_col : 0;
  if (w <= 0) {
    const char *c = getenv("COLUMNS");
    w = c ? atoi(c) : DEFAULT;
  }
  return w < NARROWEST ? NARROWEST : w;
}

void report_wrapped(FILE *out, int width, const char *first, const char *indent, const char *text) {
  int col = fprintf(out, "%s", first), start = col, ind = (int)strlen(indent);
  for (const char *w = text; *w;) {
    while (*w == ' ') w++;
    const char *e = w;
    while (*e && *e != ' ') e++;
    int len = (int)(e - w);
    if (len == 0) break;
    if (col > start && col + 1 + len > width) {
      fprintf(out, "\n%s", indent);
      col = start = ind;
    } else if (col > start) {
      col += fprintf(out, " ");
    }
    col += fprintf(out, "%.*s", len, w);
    w = e;
  }
  fputc('\n', out);
}

const char *report_seconds(Arena *a, double s) {
  if (s <= 0) return "0";
  if (s >= 1) return arena_printf(a, "%.3g s", s);
  if (s >= 1e-3) return arena_printf(a, "%.3g ms", s * 1e3);
  if (s >= 1e-6) return arena_printf(a, "%.3g us", s * 1e6);
  return arena_printf(a, "%.3g ns", s * 1e9);
}
