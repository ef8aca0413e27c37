/* explain_textbook.c: explain's "against the textbook" section (explain_textbook.h). */
#include "explain_textbook.h"

#include <string.h>

#include "textbook.h"

static const char *fmt_mb(Arena *a, double b) { return arena_printf(a, "%.2f MB", b / 1e6); }


/* text after `first`, wrapped at 100 columns, continuation lines after `indent` */
static void print_wrapped(FILE *out, const char *first, const char *indent, const char *text) {
  enum { WIDTH = 100 };
  int col = fprintf(out, "%s", first), start = col;
  for (const char *w = text; *w;) {
    while (*w == ' ') w++;
    const char *e = w;
    while (*e && *e != ' ') e++;
    int len = (int)(e - w);
    if (len == 0) break;
    if (col > start && col + 1 + len > WIDTH) col = start = fprintf(out, "\n%s", indent) - 1;
    else if (col > start) col += fprintf(out, " ");
    col += fprintf(out, "%.*s", len, w);
    w = e;
  }
  fputc('\n', out);
}

void explain_textbook_text(FILE *out, Arena *a, const IrModule *m, const Program *p) {
  LayerCensus c;
  layer_census(m, p->mesh, &c);
  TextbookRow rows[TEXTBOOK_MAX_ROWS];
  int n = textbook_compare(a, m, p, &c, rows);
  const struct PlanChoice *pc = &m->plan_choice;
  if (n == 0 && !pc->tp_axes) return;
  fprintf(out, "\nagainst the textbook (each strategy's collectives as the literature counts them):\n");
  if (pc->tp_axes) {
    const char *ax = mesh_axes_text(a, p->mesh, pc->tp_axes);
    double ratio = pc->kept ? (pc->kept_s > 0 ? pc->free_s / pc->kept_s : 1) : (pc->free_s > 0 ? pc->kept_s / pc->free_s : 1);
    if (pc->kept && ratio < 1.005)
      fprintf(out, "  plan: tensor parallelism as the layout writes it (every weight kept sharded over %s), the first\n"
                   "    candidate; the free search finds no plan that moves less.\n",
              ax);
    else if (pc->kept)
      fprintf(out, "  plan: tensor parallelism as the layout writes it (every weight kept sharded over %s), the first\n"
                   "    candidate; the best plan that gathers weights over %s moves %.2fx its collective time.\n",
              ax, ax, ratio);
    else
      fprintf(out, "  plan: weights gathered over %s. Keeping them sharded over %s, as the layout's tensor\n"
                   "    parallelism writes it, moves %.2fx the collective time of this plan (a typed `let` or `@` on\n"
                   "    a weight's use pins it).\n",
              ax, ax, ratio);
  }
  const char *note = textbook_note(a, m, p, &c);
  if (note) print_wrapped(out, "  why: ", "    ", arena_printf(a, "%s.", note));
  const char *last = NULL;
  for (int i = 0; i < n; i++) {
    const TextbookRow *r = &rows[i];
    if (!last || r->strategy != last) {
      fprintf(out, "  %s (%s), %s:\n", r->strategy, r->source, r->per);
      last = r->strategy;
    }
    fprintf(out, "    %-16s %3d", coll_kind_name(r->kind), r->got);
    if (r->runs != r->got) fprintf(out, " in %d run%s (buckets)", r->runs, r->runs == 1 ? "" : "s");
    if (r->want >= 0) fprintf(out, ", the book %s %d", r->want == 0 ? "has" : "at most", r->want);
    if (r->want_bytes > 0) fprintf(out, "; %s each, the book %s", fmt_mb(a, r->got_bytes), fmt_mb(a, r->want_bytes));
    else if (r->want < 0 && r->got_bytes > 0) fprintf(out, "; %s each", fmt_mb(a, r->got_bytes));
    fprintf(out, "%s\n", r->differs ? "  <- more than the book" : "");
  }
}

cJSON *explain_textbook_json(Arena *a, const IrModule *m, const Program *p) {
  cJSON *arr = cJSON_CreateArray();
  LayerCensus c;
  layer_census(m, p->mesh, &c);
  TextbookRow rows[TEXTBOOK_MAX_ROWS];
  int n = textbook_compare(a, m, p, &c, rows);
  for (int i = 0; i < n; i++) {
    const TextbookRow *r = &rows[i];
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "strategy", r->strategy);
    cJSON_AddStringToObject(e, "source", r->source);
    cJSON_AddStringToObject(e, "per", r->per);
    cJSON_AddStringToObject(e, "kind", coll_kind_name(r->kind));
    cJSON_AddNumberToObject(e, "count", r->got);
    cJSON_AddNumberToObject(e, "runs", r->runs);
    if (r->want >= 0) cJSON_AddNumberToObject(e, "textbook_at_most", r->want);
    else cJSON_AddNullToObject(e, "textbook_at_most");
    if (r->got_bytes > 0) cJSON_AddNumberToObject(e, "bytes_per_device", r->got_bytes);
    if (r->want_bytes > 0) cJSON_AddNumberToObject(e, "textbook_bytes_per_device", r->want_bytes);
    cJSON_AddBoolToObject(e, "differs", r->differs);
    cJSON_AddItemToArray(arr, e);
  }
  return arr;
}
