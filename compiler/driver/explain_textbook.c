/* explain_textbook.c: explain's "against the textbook" section (explain_textbook.h). */
#include "explain_textbook.h"

#include <string.h>

#include "partition.h"
#include "report.h"
#include "textbook.h"

static const char *fmt_mb(Arena *a, double b) { return arena_printf(a, "%.2f MB", b / 1e6); }


void explain_textbook_text(FILE *out, Arena *a, const IrModule *m, const Program *p) {
  LayerCensus c;
  layer_census(m, p->mesh, &c);
  TextbookRow rows[TEXTBOOK_MAX_ROWS];
  int n = textbook_compare(a, m, p, &c, rows);
  const struct LayoutWeigh *w = &m->weigh;
  if (n == 0 && !(w->done && w->cheaper)) return;
  fprintf(out, "\nagainst the textbook (each strategy's collectives as the literature counts them):\n");
  if (w->done) {
    if (!w->cheaper)
      fprintf(out, "  plan: the layout's, as written (it binds every value; propagation chose only what no rule\n"
                   "    maps); the plan propagation finds without the binding moves no less.\n");
    else
      fprintf(out, "  plan: the layout's, as written (it binds every value; propagation chose only what no rule\n"
                   "    maps); the plan propagation finds without the binding moves %.2fx less collective time\n"
                   "    (the summary's `layout:` line says which rule forbids it).\n",
              w->free_s > 0 ? w->bound_s / w->free_s : 1);
  }
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

/* "hidden: model", "seq: (ctx, model)" */
static const char *rule_text(Arena *a, const LayoutRule *r) {
  const char *ax = "";
  for (int i = 0; i < r->naxes; i++) ax = arena_printf(a, "%s%s%s", ax, i ? ", " : "", r->axes[i]);
  return arena_printf(a, r->naxes > 1 ? "%s: (%s)" : "%s: %s", r->dim, ax);
}

static const char *seconds_text(Arena *a, double s) {
  if (s >= 1) return arena_printf(a, "%.3g s", s);
  if (s >= 1e-3) return arena_printf(a, "%.3g ms", s * 1e3);
  return arena_printf(a, "%.3g us", s * 1e6);
}

static const char *value_where(Arena *a, const Program *p, const Value *v) {
  const Op *d = v->def;
  const char *name = v->name ? arena_printf(a, " %s", v->name) : "";
  if (!d || !d->loc.file) return arena_printf(a, "a loop's value%s", name);
  return arena_printf(a, "the %s%s at %s", ir_op_name(d->kind), name, partition_where(a, p, d->loc));
}

const char *layout_weigh_text(Arena *a, const IrModule *m, const Program *p) {
  const struct LayoutWeigh *w = &m->weigh;
  if (!w->done || !w->cheaper || !p->mesh) return NULL;
  const char *save = seconds_text(a, w->bound_s - w->free_s);
  const char *tail = arena_printf(a, "would save %s of collective time per step (ideal figures: %s against %s; "
                                     "`shardc plan` searches layouts)",
                                  save, seconds_text(a, w->free_s), seconds_text(a, w->bound_s));
  if (!w->rule || !w->example)
    return arena_printf(a, "the layout binds every value; letting propagation choose instead %s", tail);
  const Value *v = w->example;
  char bound[512], unbound[512];
  sharding_format(bound, sizeof bound, &v->type, &v->sharding, p->mesh);
  sharding_format(unbound, sizeof unbound, &v->type, &w->example_free, p->mesh);
  const char *axes = "";
  for (int i = 0; i < w->rule->naxes; i++) axes = arena_printf(a, "%s%s%s", axes, i ? ", " : "", w->rule->axes[i]);
  return arena_printf(a,
                      "layout rule `%s` (%s) binds %s to %s%s in %d value%s (the first: %s, %s); letting "
                      "propagation choose instead (there: %s) %s",
                      rule_text(a, w->rule), partition_where(a, p, w->rule->loc), w->rule->dim,
                      w->rule->naxes > 1 ? "(" : "", arena_printf(a, "%s%s", axes, w->rule->naxes > 1 ? ")" : ""),
                      w->nvalues, w->nvalues == 1 ? "" : "s", value_where(a, p, v), bound, unbound, tail);
}

cJSON *layout_weigh_json(Arena *a, const IrModule *m, const Program *p) {
  const struct LayoutWeigh *w = &m->weigh;
  const char *text = layout_weigh_text(a, m, p);
  if (!text) return cJSON_CreateNull();
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "saves_s", w->bound_s - w->free_s);
  cJSON_AddNumberToObject(o, "bound_comm_s", w->bound_s);
  cJSON_AddNumberToObject(o, "unbound_comm_s", w->free_s);
  if (w->rule) {
    cJSON_AddStringToObject(o, "rule", rule_text(a, w->rule));
    const SrcLoc loc = w->rule->loc;
    /* another file by the name partition_where gives it (explain's json does the same): the same
     * whatever directory the tree or the command runs from */
    const char *file = "";
    if (loc.file && loc.file == p->main_file) file = report_file(loc);
    else if (loc.file) {
      const char *w = partition_where(a, p, loc), *colon = strrchr(w, ':');
      file = colon ? arena_strndup(a, w, (size_t)(colon - w)) : w;
    }
    cJSON_AddStringToObject(o, "file", file);
    cJSON_AddNumberToObject(o, "line", w->rule->loc.line);
    cJSON_AddNumberToObject(o, "values", w->nvalues);
  }
  cJSON_AddStringToObject(o, "message", text);
  return o;
}
