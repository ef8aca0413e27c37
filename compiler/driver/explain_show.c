/* explain_show.c: `explain --show NAME`, a value's blocks drawn over the devices (explain_show.h).
 *
 * Each device's block is read off the value's sharding: along a dim sharded over axes (a1, ..., ak)
 * the device holds block number b = its coordinates on a1..ak read as a mixed-radix number, a1
 * most significant (docs/passes.md, Localisation), rows [b B, (b + 1) B) of B = size / (the axes'
 * product), or under a zigzag order (context parallelism) the logical rows those storage rows
 * hold. Devices are walked once, in order, so each cell's list is built as runs ("0-3, 8-11"). */
#include "explain_show.h"

#include <stdlib.h>
#include <string.h>

#include "partition.h"
#include "suggest.h"

enum {
  MAX_ROWS = 16,     /* rows and columns drawn; the rest are counted */
  MAX_COLS = 8,
  LABEL_MAX = 40,    /* a cell's device list is cut after this many bytes */
};

/* ---- finding the value ---- */

/* The bindings of `name` in program order (loop bodies and pipeline regions where they are), one
 * per source place: a name bound again (`x = ...`) has one per line; a binding the step repeats
 * (a recomputation in the backward) keeps its first. */
typedef struct Bindings {
  const Value *v[64];
  int n;
} Bindings;

static void find_bindings(const IrFunc *f, Name name, Bindings *b) {
  for (const Op *op = f->first; op && b->n < (int)ARRAY_LEN(b->v); op = op->next) {
    for (int r = 0; r < op->nresults; r++) {
      const Value *v = op->results[r];
      if (v->name != name || op->kind == OP_PARAM) continue;
      bool seen = false;
      for (int k = 0; k < b->n && !seen; k++)
        seen = b->v[k]->def && b->v[k]->def->loc.file == op->loc.file && b->v[k]->def->loc.line == op->loc.line;
      if (!seen && b->n < (int)ARRAY_LEN(b->v)) b->v[b->n++] = v;
    }
    if (op->kind == OP_LOOP && op->body) find_bindings(op->body, name, b);
    for (int r = 0; op->kind == OP_PIPELINE && op->pipe && r < PR__COUNT; r++)
      if (op->pipe->region[r]) find_bindings(op->pipe->region[r], name, b);
  }
}

static int binding_line(const Value *v) { return v->def ? v->def->loc.line : 0; }

static const char *binding_lines(Arena *a, const Bindings *b) {
  const char *t = "";
  for (int k = 0; k < b->n; k++) t = arena_printf(a, "%s%s%d", t, k ? ", " : "", binding_line(b->v[k]));
  return t;
}

const Value *explain_show_find(Arena *a, const IrModule *m, const char *name, const char **why, const char **note) {
  const IrFunc *f = m->main;
  *note = NULL;
  /* NAME@LINE: the binding of NAME at that line */
  const char *at = strchr(name, '@');
  if (at) {
    char *end;
    long line = strtol(at + 1, &end, 10);
    if (at == name || !at[1] || *end || line < 1) {
      *why = arena_printf(a, "--show %s: expected NAME or NAME@LINE (a binding of NAME at that line)", name);
      return NULL;
    }
    Bindings b = {.n = 0};
    find_bindings(f, intern((const char *)name, (size_t)(at - name)), &b);
    for (int k = 0; k < b.n; k++)
      if (binding_line(b.v[k]) == line) return b.v[k];
    *why = b.n ? arena_printf(a, "--show %s: %.*s is bound at line%s %s, not at line %ld", name, (int)(at - name), name,
                              b.n > 1 ? "s" : "", binding_lines(a, &b), line)
               : arena_printf(a, "--show %s: no named value of the program is called %.*s", name, (int)(at - name), name);
    return NULL;
  }
  Name n = intern_cstr(name);
  for (int i = 0; i < m->nparams; i++) {
    if (m->params[i].path != n) continue;
    for (const Op *op = f->first; op; op = op->next)
      if (op->kind == OP_PARAM && op->index == i) return op->results[0];
  }
  for (int i = 0; i < f->ninputs; i++)
    if (f->inputs[i]->name == n) return f->inputs[i];
  Bindings b = {.n = 0};
  find_bindings(f, n, &b);
  if (b.n > 1)
    *note = arena_printf(a, "%s is bound at lines %s: this is the binding at line %d (--show %s@%d shows the next)",
                         name, binding_lines(a, &b), binding_line(b.v[0]), name, binding_line(b.v[1]));
  if (b.n > 0) return b.v[0];
  Suggest sg = suggest_begin(name);
  for (int i = 0; i < m->nparams; i++) suggest_try(&sg, m->params[i].path);
  for (int i = 0; i < f->ninputs; i++)
    if (f->inputs[i]->name) suggest_try(&sg, f->inputs[i]->name);
  char sb[200];
  *why = arena_printf(a, "--show %s: no param, input or named value of the program is called that%s", name,
                      suggest_text(&sg, sb, sizeof sb));
  return NULL;
}

/* ---- the grid ---- */

typedef struct Cell {
  char label[LABEL_MAX + 24];
  int len;
  int64_t count, run_start, prev;
  bool cut;
} Cell;

typedef struct Grid {
  const Value *v;
  const Mesh *mesh;
  int sd[MAX_RANK];          /* the sharded dims, in the value's order */
  int nsd;
  int64_t blocks[MAX_RANK];  /* per dim: its axes' product */
  int64_t rows, cols;        /* blocks of sd[0]; of sd[1..] together */
  int drows, dcols;          /* drawn */
  Cell *cells;               /* drows x dcols */
} Grid;

static void cell_flush(Cell *c) {
  if (c->count == 0 || c->cut) return;
  char run[48];
  if (c->prev == c->run_start) snprintf(run, sizeof run, "%s%lld", c->len ? ", " : "", (long long)c->run_start);
  else snprintf(run, sizeof run, "%s%lld-%lld", c->len ? ", " : "", (long long)c->run_start, (long long)c->prev);
  if (c->len + (int)strlen(run) > LABEL_MAX) {
    c->cut = true;
    return;
  }
  c->len += snprintf(c->label + c->len, sizeof c->label - (size_t)c->len, "%s", run);
}

static void cell_add(Cell *c, int64_t dev) {
  if (c->count > 0 && dev == c->prev + 1) {
    c->prev = dev;
  } else {
    cell_flush(c);
    c->run_start = c->prev = dev;
  }
  c->count++;
}

static void cell_end(Cell *c) {
  cell_flush(c);
  if (c->cut) snprintf(c->label + c->len, sizeof c->label - (size_t)c->len, ", ... (%lld devices)", (long long)c->count);
}

/* Device dev's block along dim d of v: its coordinates on d's axes, the first most significant. */
static int64_t device_block(const Grid *g, int d, int64_t dev) {
  const Sharding *s = &g->v->sharding;
  int64_t b = 0;
  for (int k = 0; k < s->naxes[d]; k++) {
    const MeshAxis *ax = &g->mesh->axes[s->axes[d][k]];
    int64_t stride = 1;
    for (int a = s->axes[d][k] + 1; a < g->mesh->naxes; a++) stride *= g->mesh->axes[a].size;
    b = b * ax->size + (dev / stride) % ax->size;
  }
  return b;
}

static void grid_build(Arena *a, Grid *g, const Value *v, const Mesh *mesh) {
  memset(g, 0, sizeof *g);
  g->v = v, g->mesh = mesh;
  for (int d = 0; d < v->type.rank; d++) {
    int64_t n = 1;
    for (int k = 0; k < v->sharding.naxes[d]; k++) n *= mesh->axes[v->sharding.axes[d][k]].size;
    g->blocks[d] = n;
    if (n > 1) g->sd[g->nsd++] = d;
  }
  g->rows = g->nsd > 0 ? g->blocks[g->sd[0]] : 1;
  g->cols = 1;
  for (int i = 1; i < g->nsd; i++) g->cols *= g->blocks[g->sd[i]];
  g->drows = (int)(g->rows < MAX_ROWS ? g->rows : MAX_ROWS);
  g->dcols = (int)(g->cols < MAX_COLS ? g->cols : MAX_COLS);
  g->cells = ARENA_ARRAY(a, Cell, g->drows * g->dcols);
  for (int64_t dev = 0; dev < mesh->devices; dev++) {
    int64_t r = g->nsd > 0 ? device_block(g, g->sd[0], dev) : 0, c = 0;
    for (int i = 1; i < g->nsd; i++) c = c * g->blocks[g->sd[i]] + device_block(g, g->sd[i], dev);
    if (r < g->drows && c < g->dcols) cell_add(&g->cells[r * g->dcols + c], dev);
  }
  for (int i = 0; i < g->drows * g->dcols; i++) cell_end(&g->cells[i]);
}

/* Block b of dim d as rows of the global value: "0:256", or under a zigzag order the logical
 * pieces its storage rows hold ("0:64,448:512"). */
static const char *block_range(Arena *a, const IrModule *m, const Grid *g, int d, int64_t b) {
  const Dim *dim = g->v->type.dims[d];
  int64_t size = dim->size, B = size / g->blocks[d], lo = b * B;
  int64_t step = B;
  if (m->zigzag.axes && m->zigzag.n >= 2 && (dim == m->zigzag.dims[0] || dim == m->zigzag.dims[1])) {
    int64_t c = size / (2 * m->zigzag.n);
    if (c > 0 && B % c == 0) step = c;
  }
  const char *t = "";
  int64_t start = -1, end = -1;
  for (int64_t p = lo; p < lo + B; p += step) {
    int64_t l = ir_zigzag_logical(m, dim, p);
    if (l == end) {
      end = l + step;
      continue;
    }
    if (start >= 0) t = arena_printf(a, "%s%s%lld:%lld", t, *t ? "," : "", (long long)start, (long long)end);
    start = l, end = l + step;
  }
  return arena_printf(a, "%s%s%lld:%lld", t, *t ? "," : "", (long long)start, (long long)end);
}

/* Column c's label: each of sd[1..]'s dims with its block ("seq 0:64 heads 0:8"). */
static const char *col_label(Arena *a, const IrModule *m, const Grid *g, int64_t c) {
  if (g->nsd < 2) return "";
  const char *t = "";
  for (int i = g->nsd - 1; i >= 1; i--) {
    int d = g->sd[i];
    int64_t b = c % g->blocks[d];
    c /= g->blocks[d];
    t = arena_printf(a, "%s %s%s%s", g->v->type.dims[d]->name, block_range(a, m, g, d, b), *t ? " " : "", t);
  }
  return t;
}

static const char *value_title(Arena *a, const Mesh *mesh, const char *name, const Value *v) {
  char sh[512];
  sharding_format(sh, sizeof sh, &v->type, &v->sharding, mesh);
  return arena_printf(a, "%s: %s", name, sh);
}

static const char *axes_list(Arena *a, const Mesh *mesh, const Sharding *s, int d) {
  const char *t = "";
  for (int k = 0; k < s->naxes[d]; k++) t = arena_printf(a, "%s%s%s", t, k ? ", " : "", mesh->axes[s->axes[d][k]].name);
  return s->naxes[d] > 1 ? arena_printf(a, "(%s)", t) : t;
}

static const char *mask_list(Arena *a, const Mesh *mesh, uint16_t mask) {
  const char *t = "";
  int n = 0;
  for (int i = 0; i < mesh->naxes; i++)
    if ((mask >> i) & 1) t = arena_printf(a, "%s%s%s", t, n++ ? ", " : "", mesh->axes[i].name);
  return n > 1 ? arena_printf(a, "(%s)", t) : t;
}

static void put_repeat(FILE *out, char ch, int n) {
  for (int i = 0; i < n; i++) fputc(ch, out);
}

static void put_centered(FILE *out, const char *s, int width) {
  int len = (int)strlen(s), left = (width - len) / 2;
  fprintf(out, "%*s%s%*s", left, "", s, width - len - left, "");
}

void explain_show_text(FILE *out, Arena *a, const IrModule *m, const Program *p, const char *name, const Value *v) {
  const Mesh *mesh = p->mesh;
  Grid g;
  grid_build(a, &g, v, mesh);
  const char *axes = "";
  for (int i = 0; i < mesh->naxes; i++)
    axes = arena_printf(a, "%s%s%s: %d", axes, i ? ", " : "", mesh->axes[i].name, mesh->axes[i].size);
  fprintf(out, "%s, on mesh %s = %s[%s] (%lld devices)\n", value_title(a, mesh, name, v), mesh->name, mesh->target->name,
          axes, (long long)mesh->devices);
  /* how to read it */
  const char *num = "";
  for (int i = 0; i < mesh->naxes; i++) {
    int64_t stride = 1;
    for (int k = i + 1; k < mesh->naxes; k++) stride *= mesh->axes[k].size;
    num = arena_printf(a, "%s%s%s", num, i ? " + " : "", stride > 1 ? arena_printf(a, "%s x %lld", mesh->axes[i].name,
                                                                                     (long long)stride)
                                                                      : mesh->axes[i].name);
  }
  if (g.nsd == 0) {
    fprintf(out, "sharded over no axis: every device holds all of it\n");
  } else {
    const char *what = "";
    for (int i = 0; i < g.nsd; i++) {
      int d = g.sd[i];
      what = arena_printf(a, "%s%s%s over %s (%lld blocks of %lld)", what, i == 0 ? "rows: " : i == 1 ? "; columns: " : ", ",
                          v->type.dims[d]->name, axes_list(a, mesh, &v->sharding, d), (long long)g.blocks[d],
                          (long long)(v->type.dims[d]->size / g.blocks[d]));
    }
    fprintf(out, "%s; other dims whole\n", what);
  }
  fprintf(out, "devices numbered major axis first: device = %s\n\n", num);

  /* widths: the row labels, then each column (its label or its widest cell) */
  const char **rl = ARENA_ARRAY(a, const char *, g.drows);
  int rw = 0;
  for (int r = 0; r < g.drows; r++) {
    rl[r] = g.nsd > 0 ? arena_printf(a, "%s %s", v->type.dims[g.sd[0]]->name, block_range(a, m, &g, g.sd[0], r)) : "";
    if ((int)strlen(rl[r]) > rw) rw = (int)strlen(rl[r]);
  }
  const char **cl = ARENA_ARRAY(a, const char *, g.dcols);
  int *cw = ARENA_ARRAY(a, int, g.dcols);
  for (int c = 0; c < g.dcols; c++) {
    cl[c] = col_label(a, m, &g, c);
    cw[c] = (int)strlen(cl[c]);
    for (int r = 0; r < g.drows; r++)
      if ((int)strlen(g.cells[r * g.dcols + c].label) > cw[c]) cw[c] = (int)strlen(g.cells[r * g.dcols + c].label);
    cw[c] += 2;
  }
  if (g.nsd > 1) { /* the columns' labels, centred over them (no trailing blanks) */
    const char *line = arena_printf(a, "%*s ", rw, "");
    for (int c = 0; c < g.dcols; c++) {
      int len = (int)strlen(cl[c]), left = (cw[c] - len) / 2;
      line = arena_printf(a, "%s %*s%s%*s", line, left, "", cl[c], cw[c] - len - left, "");
    }
    size_t n = strlen(line);
    while (n > 0 && line[n - 1] == ' ') n--;
    fprintf(out, "%.*s\n", (int)n, line);
  }
  for (int r = 0; r <= g.drows; r++) {
    fprintf(out, "%*s +", rw, "");
    for (int c = 0; c < g.dcols; c++) {
      put_repeat(out, '-', cw[c]);
      fputc('+', out);
    }
    fputc('\n', out);
    if (r == g.drows) break;
    fprintf(out, "%-*s |", rw, rl[r]);
    for (int c = 0; c < g.dcols; c++) {
      put_centered(out, g.cells[r * g.dcols + c].label, cw[c]);
      fputc('|', out);
    }
    fputc('\n', out);
  }
  if (g.rows > g.drows || g.cols > g.dcols)
    fprintf(out, "(drawn: %d of %lld rows, %d of %lld columns)\n", g.drows, (long long)g.rows, g.dcols, (long long)g.cols);
  if (v->sharding.partial)
    fprintf(out, "an unreduced partial %s over %s: the devices of a cell hold different terms of its block\n",
            v->partial_max ? "max" : "sum", mask_list(a, mesh, v->sharding.partial));
}

cJSON *explain_show_json(Arena *a, const IrModule *m, const Program *p, const char *name, const Value *v) {
  const Mesh *mesh = p->mesh;
  Grid g;
  grid_build(a, &g, v, mesh);
  cJSON *o = cJSON_CreateObject();
  char sh[512];
  sharding_format(sh, sizeof sh, &v->type, &v->sharding, mesh);
  cJSON_AddStringToObject(o, "name", name);
  cJSON_AddStringToObject(o, "sharding", sh);
  cJSON_AddStringToObject(o, "mesh", mesh->name);
  cJSON_AddNumberToObject(o, "devices", (double)mesh->devices);
  cJSON *dims = cJSON_AddArrayToObject(o, "sharded_dims"); /* rows first, then the columns' dims */
  for (int i = 0; i < g.nsd; i++) {
    int d = g.sd[i];
    cJSON *e = cJSON_CreateObject(), *ax = cJSON_AddArrayToObject(e, "axes");
    cJSON_AddStringToObject(e, "dim", v->type.dims[d]->name);
    for (int k = 0; k < v->sharding.naxes[d]; k++)
      cJSON_AddItemToArray(ax, cJSON_CreateString(mesh->axes[v->sharding.axes[d][k]].name));
    cJSON_AddNumberToObject(e, "blocks", (double)g.blocks[d]);
    cJSON_AddItemToArray(dims, e);
  }
  cJSON_AddNumberToObject(o, "rows", (double)g.rows);
  cJSON_AddNumberToObject(o, "columns", (double)g.cols);
  cJSON *cells = cJSON_AddArrayToObject(o, "cells"); /* the drawn ones: rows of columns */
  for (int r = 0; r < g.drows; r++) {
    cJSON *row = cJSON_CreateArray();
    for (int c = 0; c < g.dcols; c++) {
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "devices", g.cells[r * g.dcols + c].label);
      cJSON_AddNumberToObject(e, "count", (double)g.cells[r * g.dcols + c].count);
      cJSON *blk = cJSON_AddArrayToObject(e, "block");
      int64_t b[MAX_RANK], cc = c; /* the cell's block along each sharded dim, the rows' first */
      for (int i = g.nsd - 1; i >= 1; i--) b[i] = cc % g.blocks[g.sd[i]], cc /= g.blocks[g.sd[i]];
      b[0] = r;
      for (int i = 0; i < g.nsd; i++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "dim", v->type.dims[g.sd[i]]->name);
        cJSON_AddStringToObject(x, "range", block_range(a, m, &g, g.sd[i], b[i]));
        cJSON_AddItemToArray(blk, x);
      }
      cJSON_AddItemToArray(row, e);
    }
    cJSON_AddItemToArray(cells, row);
  }
  cJSON *part = cJSON_AddArrayToObject(o, "partial");
  for (int i = 0; i < mesh->naxes; i++)
    if ((v->sharding.partial >> i) & 1) cJSON_AddItemToArray(part, cJSON_CreateString(mesh->axes[i].name));
  return o;
}
