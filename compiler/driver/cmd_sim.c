/* cmd_sim.c: `shardc sim FILE`: the step simulated on the mesh's target.
 *
 * Pipeline: load and lower (check.c) -> the pass pipeline (pipeline.h) -> memory fit (memory.h;
 * sim does not require a fit: it warns and reports `fits`) -> the simulation (sim/sim.h) -> this
 * report: the step time and its split (compute, communication and its exposed part, pipeline
 * bubble, idle), MFU and HFU (language.md's convention), tokens per second, with --tokens the days
 * to train on that many tokens, the slowest source lines and collectives, per stage figures under
 * a pipeline; --trace writes the Chrome trace. Text, or with --format json one object whose keys
 * language.md fixes (step_time_s compute_s comm_s exposed_comm_s mfu tokens_per_s) and more; with
 * errors the object holds `errors` (every diagnostic, located) and no figures. docs/sim.md. */
#define _GNU_SOURCE /* fopencookie: the diagnostics' tee */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "explain_textbook.h"
#include "memory.h"
#include "outfile.h"
#include "partition.h"
#include "report.h"
#include "sim.h"
#include "waste.h"

enum { TOP_LINES = 8, TOP_COLLECTIVES = 8 };

/* ---- formatting ---- */

static const char *fmt_time(Arena *a, double s) {
  if (!(s >= 1e-12)) return "0";
  if (s >= 86400 * 2) return arena_printf(a, "%.3g days", s / 86400);
  if (s >= 1) return arena_printf(a, "%.4g s", s);
  if (s >= 1e-3) return arena_printf(a, "%.4g ms", s * 1e3);
  if (s >= 1e-6) return arena_printf(a, "%.4g us", s * 1e6);
  return arena_printf(a, "%.3g ns", s * 1e9);
}

static const char *fmt_bytes(Arena *a, double b) {
  char buf[32];
  memory_format_bytes(buf, sizeof buf, b);
  return arena_printf(a, "%s", buf);
}

static const char *pct(Arena *a, double x, double of) {
  return of > 0 ? arena_printf(a, "%.1f%%", 100 * x / of) : "-";
}

/* "layers.shard:25", "line 12" as explain names places; the file alone for JSON. */
static const char *where(Arena *a, const Program *p, SrcLoc loc) { return partition_where(a, p, loc); }

static const char *file_of(Arena *a, const Program *p, SrcLoc loc) {
  if (!loc.file) return NULL;
  const char *w = partition_where(a, p, loc), *colon = strrchr(w, ':');
  if (loc.file == p->main_file) return loc.file->path;
  return colon ? arena_strndup(a, w, (size_t)(colon - w)) : w;
}

/* ---- diagnostics as JSON ----
 * With --format json every diagnostic (and a command-line problem the front half prints on
 * stderr) still reaches stderr as the user asked, and a copy is kept: a tee FILE replaces stderr
 * and the diagnostics' output while the command runs, and the copy's header lines are parsed
 * into `errors` and `warnings` (text form `file:line:col: level: message`, `shardc: message`;
 * machine form `level|file|line|col|message`). */

typedef struct Tee {
  FILE *to;
  char *buf;
  size_t len, cap;
} Tee;

static ssize_t tee_write(void *cookie, const char *data, size_t n) {
  Tee *t = cookie;
  if (t->to) fwrite(data, 1, n, t->to);
  if (t->len + n + 1 > t->cap) {
    size_t nc = t->cap ? t->cap : 1024;
    while (nc < t->len + n + 1) nc *= 2;
    char *b = realloc(t->buf, nc);
    if (!b) return -1;
    t->buf = b, t->cap = nc;
  }
  memcpy(t->buf + t->len, data, n);
  t->len += n;
  t->buf[t->len] = 0;
  return (ssize_t)n;
}

static char *unescape_field(char *s) { /* machine form: \\ \| \n */
  char *w = s;
  for (char *r = s; *r; r++) {
    if (*r == '\\' && r[1]) {
      r++;
      *w++ = *r == 'n' ? '\n' : *r;
    } else {
      *w++ = *r;
    }
  }
  *w = 0;
  return s;
}

static void add_diag(cJSON *errors, cJSON *warnings, const char *level, const char *file, int line, int col,
                     const char *msg) {
  cJSON *arr = strcmp(level, "error") == 0 ? errors : strcmp(level, "warning") == 0 ? warnings : NULL;
  if (!arr) return;
  cJSON *e = cJSON_CreateObject();
  cJSON_AddStringToObject(e, "file", file ? file : "");
  cJSON_AddNumberToObject(e, "line", line);
  cJSON_AddNumberToObject(e, "col", col);
  cJSON_AddStringToObject(e, "message", msg);
  cJSON_AddItemToArray(arr, e);
}

/* Splits a machine-form line at its unescaped '|'s. */
static int split_machine(char *s, char **f, int max) {
  int n = 0;
  f[n++] = s;
  for (char *p = s; *p && n < max; p++) {
    if (*p == '\\' && p[1]) {
      p++;
      continue;
    }
    if (*p == '|') *p = 0, f[n++] = p + 1;
  }
  return n;
}

static void parse_diags(char *text, bool machine, cJSON *errors, cJSON *warnings) {
  for (char *line = text; line && *line;) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = 0;
    char *f[5];
    if (machine && split_machine(line, f, 5) == 5) {
      add_diag(errors, warnings, f[0], unescape_field(f[1]), atoi(f[2]), atoi(f[3]), unescape_field(f[4]));
    } else if (strncmp(line, "shardc: ", 8) == 0) {
      const char *m = line + 8;
      if (strncmp(m, "warning: ", 9) == 0) add_diag(errors, warnings, "warning", NULL, 0, 0, m + 9);
      else if (strncmp(m, "note: ", 6) != 0) add_diag(errors, warnings, "error", NULL, 0, 0, m);
    } else if (line[0] != ' ') {
      static const char *const levels[] = {"error", "warning", "note"};
      for (int k = 0; k < 2; k++) {
        char pat[16];
        snprintf(pat, sizeof pat, ": %s: ", levels[k]);
        char *hit = strstr(line, pat);
        if (!hit) continue;
        *hit = 0;
        char *msg = hit + strlen(pat);
        char *c2 = strrchr(line, ':');
        char *c1 = c2 ? (*c2 = 0, strrchr(line, ':')) : NULL;
        if (c1) {
          *c1 = 0;
          add_diag(errors, warnings, levels[k], line, atoi(c1 + 1), atoi(c2 + 1), msg);
        }
        break;
      }
    }
    line = nl ? nl + 1 : NULL;
  }
}

/* ---- the report ---- */

typedef struct Line { /* a source line's ops over the step */
  SrcLoc loc;
  double time_s, flops;
  const SimItem *top[3]; /* its slowest ops */
  int n;
} Line;

static int line_cmp(const void *pa, const void *pb) {
  const Line *a = pa, *b = pb;
  return a->time_s > b->time_s ? -1 : a->time_s < b->time_s;
}

/* The items grouped by source line (compute and collectives apart), slowest first. */
static int group_lines(const SimReport *r, bool collectives, Line *out, int max) {
  int n = 0;
  Line *all = mem_calloc((size_t)r->nitems + 1, sizeof *all, "the report's slowest lines");
  for (int i = 0; i < r->nitems; i++) {
    const SimItem *it = &r->items[i];
    if ((it->kind == SIMK_COLLECTIVE) != collectives || !(it->time_s > 0)) continue;
    int k = 0;
    while (k < n && !(all[k].loc.file == it->loc.file && all[k].loc.line == it->loc.line)) k++;
    if (k == n) all[n++] = (Line){.loc = it->loc};
    all[k].time_s += it->time_s;
    all[k].flops += it->flops;
    if (all[k].n < 3) all[k].top[all[k].n++] = it; /* items come slowest first */
  }
  qsort(all, (size_t)n, sizeof *all, line_cmp);
  int m = n < max ? n : max;
  memcpy(out, all, sizeof *out * (size_t)m);
  free(all);
  return m;
}

static const char *runs_text(Arena *a, double runs) {
  if (runs == (double)(long long)runs && runs < 1e15) return arena_printf(a, "x%lld", (long long)runs);
  return arena_printf(a, "x%.3g", runs);
}

/* The per-phase breakdown (sim.h's sim_phases): time = compute + exposed communication. */
static void print_phases(FILE *out, Arena *a, const SimReport *r) {
  SimPhase ph[SIMPH__COUNT];
  sim_phases(r, ph);
  fprintf(out, "per phase (per device; time = compute + exposed comm; TFLOP/s achieved in that time):\n");
  for (int k = 0; k < SIMPH__COUNT; k++) {
    const SimPhase *x = &ph[k];
    if (!(x->compute_s > 0) && !(x->comm_s > 0)) continue;
    char line[256];
    int n = snprintf(line, sizeof line, "  %-19s %-11s compute %-11s comm %-11s exposed %-11s", sim_phase_name(x->kind),
                     fmt_time(a, x->time_s), fmt_time(a, x->compute_s), fmt_time(a, x->comm_s),
                     fmt_time(a, x->exposed_comm_s));
    if (x->flops > 0 && n > 0 && n < (int)sizeof line)
      snprintf(line + n, sizeof line - (size_t)n, " %7.1f TFLOP/s", x->flops_per_s / 1e12);
    for (size_t e = strlen(line); e > 0 && line[e - 1] == ' '; e--) line[e - 1] = 0;
    fprintf(out, "%s\n", line);
  }
}

static void print_text(FILE *out, Arena *a, const Program *p, const IrModule *m, const SimReport *r,
                       const MemoryReport *mem, const Options *o) {
  const Mesh *mesh = p->mesh;
  char axes[256] = "";
  int k = 0;
  for (int i = 0; i < mesh->naxes && k < (int)sizeof axes - 40; i++)
    k += snprintf(axes + k, sizeof axes - (size_t)k, "%s%s: %d", i ? ", " : "", mesh->axes[i].name, mesh->axes[i].size);
  fprintf(out, "sim %s %s.%s on mesh %s = %s[%s] (%lld devices), layout %s\n",
          p->step ? (p->step->kind == STEP_TRAIN ? "train" : "serve") : "entry", p->entry->model->name, p->entry->name,
          mesh->name, mesh->target->name, axes, (long long)mesh->devices, p->layout ? p->layout->name : "(none)");
  fprintf(out, "%s\n", r->ideal ? "ideal: peak FLOP/s, HBM and link bandwidth, no efficiency factors (the book's arithmetic)"
                                : "calibrated: the target's efficiencies (docs/cost-model.md); --ideal for peak figures");
  double st = r->step_s;
  fprintf(out, "\nstep time          %s\n", fmt_time(a, st));
  fprintf(out, "  compute          %-12s %s\n", fmt_time(a, r->compute_s), pct(a, r->compute_s, st));
  fprintf(out, "  exposed comm     %-12s %s\n", fmt_time(a, r->exposed_comm_s), pct(a, r->exposed_comm_s, st));
  if (r->nstages > 1 || r->bubble_s > 0)
    fprintf(out, "  pipeline bubble  %-12s %s\n", fmt_time(a, r->bubble_s), pct(a, r->bubble_s, st));
  fprintf(out, "  idle             %-12s %s\n", fmt_time(a, r->idle_s), pct(a, r->idle_s, st));
  fprintf(out, "communication      %s in all, %s of it hidden behind compute\n", fmt_time(a, r->comm_s),
          fmt_time(a, r->comm_s - r->exposed_comm_s > 0 ? r->comm_s - r->exposed_comm_s : 0));
  print_phases(out, a, r);
  fprintf(out, "MFU                %.1f%%  (%.4g model FLOPs per step / (step x %lld devices x %.4g FLOP/s))\n",
          100 * r->mfu, r->model_flops_per_step, (long long)r->devices, r->peak_flops);
  fprintf(out, "HFU                %.1f%%  (%.4g FLOPs per step with recomputation)\n", 100 * r->hfu, r->flops_per_step);
  fprintf(out, "tokens per second  %.4g  (%.0f tokens per step)\n", r->tokens_per_s, r->tokens_per_step);
  if (o->tokens > 0) {
    double mfu = o->mfu > 0 ? o->mfu : r->mfu;
    double secs = o->mfu > 0 && r->tokens_per_step > 0
                      ? sim_train_seconds(r->model_flops_per_step / r->tokens_per_step * o->tokens, (double)r->devices,
                                          r->peak_flops, o->mfu)
                      : sim_days_for_tokens(o->tokens, r->tokens_per_s) * 86400;
    fprintf(out, "to train on %.4g tokens: %.4g days at %.1f%% MFU%s (%.4g model FLOPs)\n", o->tokens, secs / 86400,
            100 * mfu, o->mfu > 0 ? " (--mfu)" : "", r->tokens_per_step > 0 ? r->model_flops_per_step / r->tokens_per_step * o->tokens : 0);
  }
  fprintf(out, "memory per device  %s of %s: %s\n", fmt_bytes(a, (double)mem->total), fmt_bytes(a, mem->capacity),
          mem->fits ? "fits" : "DOES NOT FIT");
  const char *forbidden = layout_weigh_text(a, m, p);
  if (forbidden) fprintf(out, "layout             %s\n", forbidden);

  Line lines[TOP_LINES];
  int nl = group_lines(r, false, lines, TOP_LINES);
  fprintf(out, "\nslowest source lines (compute, per step, per device%s):\n", r->nstages > 1 ? ", averaged over the stages" : "");
  if (nl == 0) fprintf(out, "  (none)\n");
  for (int i = 0; i < nl; i++) {
    fprintf(out, "  %2d. %-26s %12s %6s ", i + 1, where(a, p, lines[i].loc), fmt_time(a, lines[i].time_s),
            pct(a, lines[i].time_s, st));
    for (int j = 0; j < lines[i].n; j++)
      fprintf(out, "%s%s %s", j ? ", " : " ", lines[i].top[j]->what, runs_text(a, lines[i].top[j]->runs));
    fputc('\n', out);
  }
  fprintf(out, "\nslowest collectives (per step, per device; exposed: not hidden behind compute):\n");
  int nc = 0;
  for (int i = 0; i < r->nitems && nc < TOP_COLLECTIVES; i++) {
    const SimItem *it = &r->items[i];
    if (it->kind != SIMK_COLLECTIVE || !(it->time_s > 0)) continue;
    nc++;
    fprintf(out, "  %2d. %-26s %12s, exposed %-10s %s %s\n", nc, where(a, p, it->loc), fmt_time(a, it->time_s),
            fmt_time(a, it->exposed_s), it->what, runs_text(a, it->runs));
  }
  if (nc == 0) fprintf(out, "  (none)\n");
  if (r->nstages > 1) {
    fprintf(out, "\nper pipeline stage (one simulated device each, %lld devices apiece):\n", (long long)r->stages[0].represents);
    fprintf(out, "  %5s %12s %12s %12s %12s %12s %12s\n", "stage", "compute", "comm", "exposed", "bubble", "idle",
            "memory");
    for (int s = 0; s < r->nstages; s++) {
      if (r->nstages > 16 && s >= 3 && s < r->nstages - 3) {
        if (s == 3) fprintf(out, "  %5s\n", "...");
        continue;
      }
      const SimStageStats *x = &r->stages[s];
      fprintf(out, "  %5d %12s %12s %12s %12s %12s %12s\n", s, fmt_time(a, x->compute_s), fmt_time(a, x->comm_s),
              fmt_time(a, x->exposed_comm_s), fmt_time(a, x->bubble_s), fmt_time(a, x->idle_s),
              s < mem->nstages ? fmt_bytes(a, (double)mem->stages[s].total) : "-");
    }
  }
  fprintf(out, "\nsimulated: %d device%s standing for %lld, %lld task%s%s\n", r->nstages, r->nstages == 1 ? "" : "s",
          (long long)r->devices, (long long)r->tasks, r->tasks == 1 ? "" : "s",
          r->steady_loops ? arena_printf(a, " (%d loop%s as blocks from their steady state: the task budget)",
                                         r->steady_loops, r->steady_loops == 1 ? "" : "s")
                          : "");
  if (r->microbatches_simulated)
    fprintf(out, "steady state: the pipeline's %d microbatches from its steady state, simulated at %d and %d\n",
            r->microbatches, r->microbatches_simulated, r->microbatches_simulated + r->microbatches_period);
  if (o->trace) fprintf(out, "trace: %s (open in ui.perfetto.dev)\n", o->trace);
}

static cJSON *json_report(Arena *a, const Program *p, const IrModule *m, const SimReport *r, const MemoryReport *mem,
                          const Options *o) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddNumberToObject(j, "step_time_s", r->step_s);
  cJSON_AddNumberToObject(j, "compute_s", r->compute_s);
  cJSON_AddNumberToObject(j, "comm_s", r->comm_s);
  cJSON_AddNumberToObject(j, "exposed_comm_s", r->exposed_comm_s);
  cJSON_AddNumberToObject(j, "mfu", r->mfu);
  cJSON_AddNumberToObject(j, "tokens_per_s", r->tokens_per_s);
  cJSON_AddNumberToObject(j, "bubble_s", r->bubble_s);
  cJSON_AddNumberToObject(j, "idle_s", r->idle_s);
  cJSON_AddNumberToObject(j, "hfu", r->hfu);
  cJSON_AddNumberToObject(j, "flops_per_step", r->flops_per_step);
  cJSON_AddNumberToObject(j, "model_flops_per_step", r->model_flops_per_step);
  SimPhase ph[SIMPH__COUNT];
  sim_phases(r, ph);
  cJSON *phs = cJSON_AddArrayToObject(j, "phases");
  for (int k = 0; k < SIMPH__COUNT; k++) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "phase", sim_phase_name(ph[k].kind));
    cJSON_AddNumberToObject(e, "time_s", ph[k].time_s);
    cJSON_AddNumberToObject(e, "compute_s", ph[k].compute_s);
    cJSON_AddNumberToObject(e, "comm_s", ph[k].comm_s);
    cJSON_AddNumberToObject(e, "exposed_comm_s", ph[k].exposed_comm_s);
    cJSON_AddNumberToObject(e, "flops", ph[k].flops);
    cJSON_AddNumberToObject(e, "flops_per_s", ph[k].flops_per_s);
    cJSON_AddItemToArray(phs, e);
  }
  cJSON_AddNumberToObject(j, "tokens_per_step", r->tokens_per_step);
  cJSON_AddNumberToObject(j, "peak_flops", r->peak_flops);
  cJSON_AddItemToObject(j, "forbidden_cheaper", layout_weigh_json(a, m, p));
  if (o->tokens > 0) {
    double flops = r->tokens_per_step > 0 ? r->model_flops_per_step / r->tokens_per_step * o->tokens : 0;
    double secs = o->mfu > 0 ? sim_train_seconds(flops, (double)r->devices, r->peak_flops, o->mfu)
                             : sim_days_for_tokens(o->tokens, r->tokens_per_s) * 86400;
    cJSON *t = cJSON_AddObjectToObject(j, "train");
    cJSON_AddNumberToObject(t, "tokens", o->tokens);
    cJSON_AddNumberToObject(t, "model_flops", flops);
    cJSON_AddNumberToObject(t, "mfu", o->mfu > 0 ? o->mfu : r->mfu);
    cJSON_AddNumberToObject(t, "days", secs / 86400);
  }
  cJSON_AddBoolToObject(j, "ideal", r->ideal);
  cJSON_AddStringToObject(j, "mesh", p->mesh->name);
  cJSON_AddStringToObject(j, "target", p->mesh->target->name);
  if (p->layout) cJSON_AddStringToObject(j, "layout", p->layout->name);
  cJSON_AddNumberToObject(j, "devices", (double)r->devices);
  cJSON_AddNumberToObject(j, "simulated_devices", r->nstages);
  cJSON_AddNumberToObject(j, "tasks", (double)r->tasks);
  if (r->steady_loops) cJSON_AddNumberToObject(j, "steady_loops", r->steady_loops);
  if (r->microbatches_simulated) {
    cJSON *ms = cJSON_AddArrayToObject(j, "microbatches_simulated");
    for (int k = 0; k < 2; k++)
      cJSON_AddItemToArray(ms, cJSON_CreateNumber(r->microbatches_simulated + k * r->microbatches_period));
  }
  cJSON_AddBoolToObject(j, "fits", mem->fits);
  cJSON *mj = cJSON_AddObjectToObject(j, "memory");
  cJSON_AddNumberToObject(mj, "total", (double)mem->total);
  cJSON_AddNumberToObject(mj, "capacity", mem->capacity);
  cJSON_AddBoolToObject(mj, "fits", mem->fits);
  if (r->nstages > 1) {
    cJSON *ps = cJSON_AddArrayToObject(j, "stages");
    for (int s = 0; s < r->nstages; s++) {
      const SimStageStats *x = &r->stages[s];
      cJSON *e = cJSON_CreateObject();
      cJSON_AddNumberToObject(e, "stage", x->stage);
      cJSON_AddNumberToObject(e, "compute_s", x->compute_s);
      cJSON_AddNumberToObject(e, "comm_s", x->comm_s);
      cJSON_AddNumberToObject(e, "exposed_comm_s", x->exposed_comm_s);
      cJSON_AddNumberToObject(e, "bubble_s", x->bubble_s);
      cJSON_AddNumberToObject(e, "idle_s", x->idle_s);
      if (s < mem->nstages) cJSON_AddNumberToObject(e, "memory_bytes", (double)mem->stages[s].total);
      cJSON_AddItemToArray(ps, e);
    }
  }
  for (int pass = 0; pass < 2; pass++) {
    cJSON *arr = cJSON_AddArrayToObject(j, pass ? "slowest_collectives" : "slowest_lines");
    if (pass == 0) {
      Line lines[TOP_LINES];
      int nl = group_lines(r, false, lines, TOP_LINES);
      for (int i = 0; i < nl; i++) {
        cJSON *e = cJSON_CreateObject();
        const char *file = file_of(a, p, lines[i].loc);
        if (file) cJSON_AddStringToObject(e, "file", file);
        cJSON_AddNumberToObject(e, "line", lines[i].loc.line);
        cJSON_AddNumberToObject(e, "time_s", lines[i].time_s);
        cJSON *ops = cJSON_AddArrayToObject(e, "ops");
        for (int k = 0; k < lines[i].n; k++) cJSON_AddItemToArray(ops, cJSON_CreateString(lines[i].top[k]->what));
        cJSON_AddItemToArray(arr, e);
      }
      continue;
    }
    int nc = 0;
    for (int i = 0; i < r->nitems && nc < TOP_COLLECTIVES; i++) {
      const SimItem *it = &r->items[i];
      if (it->kind != SIMK_COLLECTIVE || !(it->time_s > 0)) continue;
      nc++;
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "what", it->what);
      const char *file = file_of(a, p, it->loc);
      if (file) cJSON_AddStringToObject(e, "file", file);
      cJSON_AddNumberToObject(e, "line", it->loc.line);
      cJSON_AddNumberToObject(e, "runs", it->runs);
      cJSON_AddNumberToObject(e, "time_s", it->time_s);
      cJSON_AddNumberToObject(e, "exposed_s", it->exposed_s);
      cJSON_AddItemToArray(arr, e);
    }
  }
  return j;
}

/* ---- the command ---- */

/* The first contraction of FP8 operands in f (its loop bodies and pipeline regions too), or NULL. */
static const Op *first_fp8_contract(const IrFunc *f) {
  for (const Op *op = f ? f->first : NULL; op; op = op->next) {
    if (op->kind == OP_CONTRACT && op->noperands == 2 && dtype_is_f8(op->operands[0]->type.dtype)) return op;
    const Op *in = op->body ? first_fp8_contract(op->body) : NULL;
    for (int r = 0; !in && op->pipe && r < PR__COUNT; r++) in = first_fp8_contract(op->pipe->region[r]);
    if (in) return in;
  }
  return NULL;
}

/* One line where the target has no FP8 units (its flops.f8 no faster than its bf16): the FP8
 * contractions are priced at that rate, the bf16 one, as the hardware would run them. */
static void warn_fp8_rate(const IrModule *m, const Target *t) {
  const Op *op = first_fp8_contract(m->main);
  if (!op || !t || t->flops[DT_F8E4M3] > t->flops[DT_BF16]) return;
  diag_warning(op->loc, "%s has no FP8 units: this %s contraction and the others run at its bf16 rate (%.3g FLOP/s)",
               t->name, dtype_name(op->operands[0]->type.dtype), cost_peak_flops(t, DT_F8E4M3, true));
}

static int run(const Options *o, Arena *arena, bool json, cJSON **report) {
  CheckedProgram cp;
  int rc = check_load(o, arena, &cp);
  if (rc == EXIT_OK && !cp.ir) {
    diag_error((SrcLoc){0}, "%s declares no function to simulate (a model with a function, or a train step)", o->input);
    return EXIT_PROGRAM_ERROR;
  }
  if (rc != EXIT_OK) return rc;
  char err[700];
  if (o->trace && !outfile_check(o->trace, err, sizeof err)) { /* before the work: the trace is not an input */
    diag_error((SrcLoc){0}, "sim: --trace: %s", err);
    return EXIT_PROGRAM_ERROR;
  }
  Program *p = cp.prog;
  IrModule *m = cp.ir;
  m->weigh.want = true; /* a plan the layout forbids, weighed (never taken): sim says so */
  if (!pipeline_run(m, p) || diag_error_count() > 0) return EXIT_PROGRAM_ERROR;
  MemoryReport mem;
  memory_estimate(p, m, &mem);
  if (!mem.fits)
    diag_warning(p->step ? p->step->loc : p->entry->loc,
                 "does not fit: %s per device on %s, which has %s of HBM (sim goes on)",
                 fmt_bytes(arena, (double)mem.total), p->mesh->target->name, fmt_bytes(arena, mem.capacity));
  warn_fp8_rate(m, p->mesh->target);
  WasteReport waste;
  waste_find(arena, &cp, &waste);
  waste_warn(&waste);
  SimOptions so = {.ideal = o->ideal, .keep_graph = o->trace != NULL};
  SimReport r;
  if (!sim_program(p, m, &so, &r)) {
    sim_report_free(&r);
    return EXIT_PROGRAM_ERROR;
  }
  if (o->trace && !sim_report_trace_write(&r, o->trace, err, sizeof err)) {
    diag_error((SrcLoc){0}, "sim: --trace: %s", err);
    sim_report_free(&r);
    return EXIT_PROGRAM_ERROR;
  }
  if (json) {
    *report = json_report(arena, p, m, &r, &mem, o);
    cJSON_AddItemToObject(*report, "waste", waste_json(&waste, p->mesh));
  } else {
    print_text(stdout, arena, p, m, &r, &mem, o);
    waste_print(stdout, &waste);
  }
  sim_report_free(&r);
  return EXIT_OK;
}

int cmd_sim(const Options *o) {
  Arena arena;
  arena_init(&arena);
  bool json = o->format == FORMAT_JSON;
  if (!json) {
    cJSON *none = NULL;
    int rc = run(o, &arena, false, &none);
    arena_free(&arena);
    return rc;
  }
  /* JSON: tee stderr (and the diagnostics, which write to it) to keep a copy */
  Tee tee = {.to = stderr};
  cookie_io_functions_t io = {.write = tee_write};
  FILE *tf = fopencookie(&tee, "w", io);
  FILE *saved = stderr;
  if (tf) {
    setvbuf(tf, NULL, _IONBF, 0);
    stderr = tf;
    diag_configure(tf, o->diag_format, false);
  }
  cJSON *report = NULL;
  int rc = run(o, &arena, true, &report);
  if (tf) {

    fflush(tf);
    stderr = saved;
    fclose(tf);
    diag_configure(stderr, o->diag_format, o->diag_format == DIAG_TEXT && isatty(STDERR_FILENO) && !getenv("NO_COLOR"));
  }
  cJSON *errors = cJSON_CreateArray(), *warnings = cJSON_CreateArray();
  if (tee.buf) parse_diags(tee.buf, o->diag_format == DIAG_MACHINE, errors, warnings);
  free(tee.buf);
  if (rc != EXIT_OK || !report) {
    cJSON_Delete(report);
    report = cJSON_CreateObject();
    if (cJSON_GetArraySize(errors) == 0)
      add_diag(errors, NULL, "error", o->input, 0, 0, "the program could not be simulated");
    cJSON_AddItemToObject(report, "errors", errors);
    cJSON_Delete(warnings);
    if (rc == EXIT_OK) rc = EXIT_PROGRAM_ERROR;
  } else {
    cJSON_Delete(errors);
    cJSON_AddItemToObject(report, "warnings", warnings);
  }
  report_json(report); /* the one object: report_end prints no second one */
  arena_free(&arena);
  return rc;
}
