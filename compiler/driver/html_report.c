/* html_report.c: the HTML page of `shardc report` (see html_report.h). */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "html_report.h"

/* The memory classes drawn as stacked bars, in order: JSON key, label, colour. */
#define HTML_MEM_CLASSES(X)                     \
  X("params", "params", "#4e79a7")              \
  X("grads", "grads", "#f28e2b")                \
  X("optimizer", "optimizer", "#e15759")        \
  X("activations", "activations", "#76b7b2")    \
  X("temporaries", "temporaries", "#59a14f")

typedef struct { const char *key, *label, *colour; } MemClass;
static const MemClass mem_classes[] = {
#define X(k, l, c) {k, l, c},
  HTML_MEM_CLASSES(X)
#undef X
};
enum { NMEM = sizeof mem_classes / sizeof mem_classes[0] };

static void esc(FILE *out, const char *s) {
  for (; s && *s; s++) {
    switch (*s) {
    case '<': fputs("&lt;", out); break;
    case '>': fputs("&gt;", out); break;
    case '&': fputs("&amp;", out); break;
    case '"': fputs("&quot;", out); break;
    default: fputc(*s, out);
    }
  }
}

static double num(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static const char *str(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsString(v) ? v->valuestring : "";
}

static void bytes(FILE *out, double b) {
  static const char *units[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  int u = 0;
  while (b >= 1000 && u < 5) b /= 1000, u++;
  fprintf(out, u ? "%.2f %s" : "%.0f %s", b, units[u]);
}

static void seconds(FILE *out, double s) {
  if (s <= 0) fputs("0", out);
  else if (s >= 1) fprintf(out, "%.3g s", s);
  else if (s >= 1e-3) fprintf(out, "%.3g ms", s * 1e3);
  else if (s >= 1e-6) fprintf(out, "%.3g us", s * 1e6);
  else fprintf(out, "%.3g ns", s * 1e9);
}

/* printf for the page: the C conversions %d %s %f %g (with flags, width and precision) and three
 * of the page's own: %H a string HTML-escaped, %B a byte count (double) as "1.50 GB", %T seconds
 * (double) as "3.2 ms". Each drawn row is one call. */
static void emit(FILE *out, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  for (const char *p = fmt; *p; p++) {
    if (*p != '%') {
      fputc(*p, out);
      continue;
    }
    char spec[16] = "%";
    size_t k = 1;
    while (p[1] && strchr("-+ #0123456789.", p[1]) && k < sizeof spec - 2) spec[k++] = *++p;
    char conv = *++p;
    spec[k++] = conv, spec[k] = 0;
    switch (conv) {
    case 'H': esc(out, va_arg(ap, const char *)); break;
    case 'B': bytes(out, va_arg(ap, double)); break;
    case 'T': seconds(out, va_arg(ap, double)); break;
    case 'd': fprintf(out, spec, va_arg(ap, int)); break;
    case 's': fprintf(out, spec, va_arg(ap, const char *)); break;
    case 'f': case 'g': fprintf(out, spec, va_arg(ap, double)); break;
    case '%': fputc('%', out); break;
    default: /* none of these (the formats are this file's literals): printed as written */
      spec[k - 1] = 0;
      fputs(spec, out);
      if (!conv) p--;
      else fputc(conv, out);
    }
  }
  va_end(ap);
}

/* One stacked bar: row label, the classes of obj against capacity, scaled to the larger; kind "peak"
 * (the peak by class) or "resident" (what is held between steps). */
static void mem_bar(FILE *out, const char *kind, const char *label, const cJSON *obj, double capacity) {
  double total = 0;
  for (int k = 0; k < NMEM; k++) total += num(obj, mem_classes[k].key);
  double scale = 600.0 / fmax(fmax(total, capacity), 1);
  emit(out, "<div class=\"bar\"><span class=\"lbl\">%H</span><svg width=\"640\" height=\"22\" role=\"img\" "
            "data-kind=\"%s\" data-total=\"%.17g\" data-capacity=\"%.17g\">", label, kind, total, capacity);
  double x = 0;
  for (int k = 0; k < NMEM; k++) {
    double v = num(obj, mem_classes[k].key), w = v * scale;
    if (w <= 0) continue;
    emit(out, "<rect x=\"%.2f\" y=\"2\" width=\"%.2f\" height=\"18\" fill=\"%s\" data-class=\"%s\" data-bytes=\"%.17g\">"
              "<title>%s %B</title></rect>", x, w, mem_classes[k].colour, mem_classes[k].key, v, mem_classes[k].label, v);
    x += w;
  }
  if (capacity > 0)
    fprintf(out, "<line x1=\"%.2f\" x2=\"%.2f\" y1=\"0\" y2=\"22\" stroke=\"#000\" stroke-width=\"2\"><title>HBM</title></line>",
            capacity * scale, capacity * scale);
  emit(out, "</svg> %B of %B</div>\n", total, capacity);
}

static void memory(FILE *out, const cJSON *check) {
  const cJSON *mem = cJSON_GetObjectItemCaseSensitive(check, "memory");
  if (!mem) return;
  double cap = num(mem, "capacity");
  fprintf(out, "<h2>Memory per device</h2>\n<p class=\"legend\">");
  for (int k = 0; k < NMEM; k++)
    fprintf(out, "<span style=\"background:%s\">&nbsp;&nbsp;</span> %s &nbsp;", mem_classes[k].colour, mem_classes[k].label);
  fprintf(out, "| the black line: HBM</p>\n");
  mem_bar(out, "peak", "peak, each device", cJSON_GetObjectItemCaseSensitive(mem, "per_device"), cap);
  const cJSON *st, *stages = cJSON_GetObjectItemCaseSensitive(mem, "per_stage");
  cJSON_ArrayForEach(st, stages) {
    char l[64];
    snprintf(l, sizeof l, "stage %d peak", (int)num(st, "stage"));
    mem_bar(out, "peak", l, st, cap);
  }
  /* resident state as bars: each stage's own under a pipeline (its layers, the first stage's
   * embedding, the last's head), else the device's; optimizer = moments + master copies */
  const cJSON *rs;
  int nst = cJSON_GetArraySize(stages);
  for (int i = 0; i < (nst > 0 ? nst : 1); i++) {
    const cJSON *holder = nst > 0 ? cJSON_GetArrayItem(stages, i) : mem;
    if (!(rs = cJSON_GetObjectItemCaseSensitive(holder, "resident"))) continue;
    cJSON *bar = cJSON_CreateObject();
    cJSON_AddNumberToObject(bar, "params", num(rs, "params"));
    cJSON_AddNumberToObject(bar, "grads", num(rs, "grads"));
    cJSON_AddNumberToObject(bar, "optimizer", num(rs, "moments") + num(rs, "master"));
    char l[64];
    if (holder == mem) snprintf(l, sizeof l, "resident, each device");
    else snprintf(l, sizeof l, "stage %d resident", (int)num(holder, "stage"));
    mem_bar(out, "resident", l, bar, cap);
    cJSON_Delete(bar);
  }
  rs = cJSON_GetObjectItemCaseSensitive(mem, "resident");
  if (rs) {
    emit(out, "<p>Resident between steps%s: params %B, grads %B, optimizer moments %B, master copies %B (total %B)</p>\n",
         nst > 0 ? " (the stage holding most)" : "", num(rs, "params"), num(rs, "grads"), num(rs, "moments"),
         num(rs, "master"), num(rs, "total"));
  }
}

static void phases(FILE *out, const cJSON *sim) {
  emit(out, "<h2>Step</h2>\n<p>step <b data-key=\"step_time_s\" data-value=\"%.17g\">%T</b>, MFU <b data-key=\"mfu\" "
            "data-value=\"%.17g\">%.1f%%</b>, %.4g tokens/s on %d devices (%H, %H)</p>\n",
       num(sim, "step_time_s"), num(sim, "step_time_s"), num(sim, "mfu"), 100 * num(sim, "mfu"), num(sim, "tokens_per_s"),
       (int)num(sim, "devices"), str(sim, "target"), str(sim, "mesh"));
  fprintf(out, "<table><tr><th>phase</th><th>time</th><th>compute</th><th>comm</th><th>exposed comm</th>"
               "<th>TFLOP/s per device</th></tr>\n");
  const cJSON *ph;
  cJSON_ArrayForEach(ph, cJSON_GetObjectItemCaseSensitive(sim, "phases")) {
    emit(out, "<tr class=\"phase\" data-phase=\"%H\" data-time-s=\"%.17g\" data-flops-per-s=\"%.17g\"><td>%H</td><td>%T</td>"
              "<td>%T</td><td>%T</td><td>%T</td><td>%.1f</td></tr>\n",
         str(ph, "phase"), num(ph, "time_s"), num(ph, "flops_per_s"), str(ph, "phase"), num(ph, "time_s"),
         num(ph, "compute_s"), num(ph, "comm_s"), num(ph, "exposed_comm_s"), num(ph, "flops_per_s") / 1e12);
  }
  fprintf(out, "</table>\n");
}

/* A row (pid, tid) of the trace and its name. */
typedef struct { int pid, tid; char name[96]; } Row;
enum { MAX_ROWS = 256 };

static int row_of(Row *rows, int *n, int pid, int tid) {
  for (int i = 0; i < *n; i++)
    if (rows[i].pid == pid && rows[i].tid == tid) return i;
  if (*n == MAX_ROWS) return -1;
  rows[*n] = (Row){pid, tid, ""};
  return (*n)++;
}

static const char *colour_of(const cJSON *e) {
  const char *cat = str(e, "cat");
  if (strcmp(cat, "compute") == 0) return "#4e79a7";
  if (strstr(cat, "comm")) return "#e15759";
  return "#b07aa1";
}

/* The timeline: one SVG row per stream of each simulated device, one rect per complete event. */
static void timeline(FILE *out, const cJSON *trace) {
  const cJSON *evs = cJSON_GetObjectItemCaseSensitive(trace, "traceEvents"), *e;
  if (!evs) return;
  static Row rows[MAX_ROWS];
  int n = 0;
  double end = 0;
  char pname[MAX_ROWS][64] = {{0}};
  cJSON_ArrayForEach(e, evs) {
    const char *ph = str(e, "ph");
    int pid = (int)num(e, "pid"), tid = (int)num(e, "tid");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
    if (strcmp(ph, "M") == 0 && strcmp(str(e, "name"), "thread_name") == 0) {
      int r = row_of(rows, &n, pid, tid);
      if (r >= 0) snprintf(rows[r].name, sizeof rows[r].name, "%s", str(args, "name"));
    } else if (strcmp(ph, "M") == 0 && strcmp(str(e, "name"), "process_name") == 0 && pid >= 0 && pid < MAX_ROWS) {
      snprintf(pname[pid], sizeof pname[pid], "%s", str(args, "name"));
    } else if (strcmp(ph, "X") == 0) {
      row_of(rows, &n, pid, tid);
      end = fmax(end, num(e, "ts") + num(e, "dur"));
    }
  }
  if (n == 0 || end <= 0) return;
  const double W = 900, H = 18, L = 220;
  fprintf(out, "<h2>Timeline of the simulated step</h2>\n<p>Compute in blue, collectives in red, pipeline transfers "
               "and others in purple; hover for the op and its source line.</p>\n");
  fprintf(out, "<svg class=\"timeline\" width=\"%.0f\" height=\"%.0f\" data-end-us=\"%.17g\">\n", L + W + 10, n * (H + 4) + 24, end);
  for (int i = 0; i < n; i++) {
    const char *dev = rows[i].pid >= 0 && rows[i].pid < MAX_ROWS ? pname[rows[i].pid] : "";
    emit(out, "<text x=\"0\" y=\"%.1f\" font-size=\"11\">%H%s%H</text>\n", i * (H + 4) + 13.0, dev, dev[0] ? ": " : "",
         rows[i].name[0] ? rows[i].name : "stream");
  }
  cJSON_ArrayForEach(e, evs) {
    if (strcmp(str(e, "ph"), "X") != 0) continue;
    int r = row_of(rows, &n, (int)num(e, "pid"), (int)num(e, "tid"));
    if (r < 0) continue;
    double x = L + num(e, "ts") / end * W, w = fmax(num(e, "dur") / end * W, 0.5);
    emit(out, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.0f\" fill=\"%s\"><title>%H %.4g us</title></rect>\n", x,
         r * (H + 4), w, H, colour_of(e), str(e, "name"), num(e, "dur"));
  }
  fprintf(out, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\">0</text><text x=\"%.0f\" y=\"%.0f\" font-size=\"11\" "
               "text-anchor=\"end\">%.4g ms</text>\n</svg>\n",
          L, n * (H + 4) + 16, L + W, n * (H + 4) + 16, end / 1e3);
}

/* Collectives by kind and axes, summed over explain's list (each with its bytes per device and
 * its time as explain prices it). */
typedef struct { char kind[32], axes[96]; double time_s, bytes; int count; } Coll;
enum { MAX_COLL = 128 };

static void collectives(FILE *out, const cJSON *explain) {
  static Coll c[MAX_COLL];
  int n = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(explain, "collectives")) {
    char axes[96] = "";
    const cJSON *a;
    cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(e, "axes")) {
      if (!cJSON_IsString(a)) continue;
      size_t l = strlen(axes);
      snprintf(axes + l, sizeof axes - l, "%s%s", l ? ", " : "", a->valuestring);
    }
    int i = 0;
    while (i < n && !(strcmp(c[i].kind, str(e, "kind")) == 0 && strcmp(c[i].axes, axes) == 0)) i++;
    if (i == n) {
      if (n == MAX_COLL) continue;
      memset(&c[n], 0, sizeof c[n]);
      snprintf(c[n].kind, sizeof c[n].kind, "%s", str(e, "kind"));
      snprintf(c[n].axes, sizeof c[n].axes, "%s", axes);
      n++;
    }
    c[i].count++;
    c[i].time_s += num(e, "time_s");
    c[i].bytes += num(e, "bytes_per_device");
  }
  fprintf(out, "<h2>Collectives by axis and kind</h2>\n");
  if (n == 0) {
    fprintf(out, "<p>none</p>\n");
    return;
  }
  fprintf(out, "<table><tr><th>kind</th><th>axes</th><th>count</th><th>bytes per device</th><th>time (explain)</th></tr>\n");
  for (int i = 0; i < n; i++) {
    emit(out, "<tr class=\"coll\" data-kind=\"%H\" data-axes=\"%H\" data-count=\"%d\" data-bytes=\"%.17g\" "
              "data-time-s=\"%.17g\"><td>%H</td><td>%H</td><td>%d</td><td>%B</td><td>%T</td></tr>\n",
         c[i].kind, c[i].axes, c[i].count, c[i].bytes, c[i].time_s, c[i].kind, c[i].axes[0] ? c[i].axes : "-", c[i].count,
         c[i].bytes, c[i].time_s);
  }
  fprintf(out, "</table>\n");
}

/* A param's blocks over the mesh (explain --show's JSON): a table of rows x columns cells, each
 * with its devices and its block's ranges. */
static void grid(FILE *out, const cJSON *show) {
  emit(out, "<div class=\"grid\" data-param=\"%H\"><h3>%H: <code>%H</code></h3>\n<table>", str(show, "name"),
       str(show, "name"), str(show, "sharding"));
  const cJSON *row, *cell, *b;
  cJSON_ArrayForEach(row, cJSON_GetObjectItemCaseSensitive(show, "cells")) {
    fprintf(out, "<tr>");
    cJSON_ArrayForEach(cell, row) {
      emit(out, "<td data-count=\"%.17g\" data-devices=\"%H\"><b>%H</b>", num(cell, "count"), str(cell, "devices"),
           str(cell, "devices"));
      cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(cell, "block"))
        emit(out, "<br><small>%H %H</small>", str(b, "dim"), str(b, "range"));
      fprintf(out, "</td>");
    }
    fprintf(out, "</tr>\n");
  }
  fprintf(out, "</table></div>\n");
}

static void grids(FILE *out, const cJSON *shows, int omitted) {
  if (cJSON_GetArraySize(shows) == 0) return;
  fprintf(out, "<h2>Each param's blocks over the mesh</h2>\n<p>What <code>explain --show NAME</code> draws: each cell "
               "is the devices holding that block.</p>\n");
  const cJSON *s;
  cJSON_ArrayForEach(s, shows) grid(out, s);
  if (omitted > 0) fprintf(out, "<p>(%d more params not drawn)</p>\n", omitted);
}

static void warnings(FILE *out, const cJSON *check, const cJSON *sim) {
  fprintf(out, "<h2>Warnings</h2>\n<ul class=\"warnings\">\n");
  int n = 0;
  const cJSON *objs[] = {check, sim}, *w;
  const char *from[] = {"check", "sim"};
  for (int k = 0; k < 2; k++)
    cJSON_ArrayForEach(w, cJSON_GetObjectItemCaseSensitive(objs[k], "warnings")) {
      emit(out, "<li data-from=\"%s\">%s: ", from[k], from[k]);
      if (*str(w, "file")) emit(out, "%H:%d:%d: ", str(w, "file"), (int)num(w, "line"), (int)num(w, "col"));
      emit(out, "%H</li>\n", str(w, "message"));
      n++;
    }
  if (n == 0) fprintf(out, "<li>none</li>\n");
  fprintf(out, "</ul>\n");
}

/* cJSON's text, with "</" written "<\/" so that the data block cannot end the <script> early. */
static void data_block(FILE *out, const cJSON *check, const cJSON *sim, const cJSON *explain) {
  cJSON *d = cJSON_CreateObject();
  cJSON_AddItemToObject(d, "explain_collectives",
                        cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(explain, "collectives"), true));
  cJSON_AddItemToObject(d, "check", cJSON_Duplicate(check, true));
  cJSON_AddItemToObject(d, "sim", cJSON_Duplicate(sim, true));
  char *s = cJSON_PrintUnformatted(d);
  cJSON_Delete(d);
  fprintf(out, "<script type=\"application/json\" id=\"shardc-data\">");
  for (const char *p = s; p && *p; p++) {
    if (p[0] == '<' && p[1] == '/') fputs("<\\", out);
    else fputc(*p, out);
  }
  fprintf(out, "</script>\n");
  cJSON_free(s);
}

void html_report_write(FILE *out, const char *title, const cJSON *check, const cJSON *sim, const cJSON *explain,
                       const cJSON *trace, const cJSON *shows, int omitted) {
  emit(out, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>shardc report: %H</title>\n<style>body{font-family:sans-serif;margin:1.5em;max-width:1200px}"
               "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
               "td:first-child,th:first-child{text-align:left}.bar{margin:4px 0}.lbl{display:inline-block;width:12em}"
               ".legend span{display:inline-block;width:1em}</style>\n</head><body>\n<h1>shardc report: %H</h1>\n"
       "<p>mesh <b>%H</b> (%H), layout <b>%H</b>, %d devices</p>\n",
       title, title, str(check, "mesh"), str(check, "target"), str(check, "layout"), (int)num(check, "devices"));
  memory(out, check);
  phases(out, sim);
  if (trace) timeline(out, trace);
  collectives(out, explain);
  grids(out, shows, omitted);
  warnings(out, check, sim);
  data_block(out, check, sim, explain);
  fprintf(out, "</body></html>\n");
}
