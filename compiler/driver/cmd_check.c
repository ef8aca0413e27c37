/* cmd_check.c: `shardc check FILE`: parse, check, and report memory fit per device.
 *
 * Pipeline: load (parse.c) -> declarations (sema.c) -> the entry's IR (ir_build.c) -> shardings
 * (shard.c) -> memory fit and FLOPs (memory.c). Prints a text table or the JSON object whose keys
 * language.md fixes; exits 1 when the program is wrong or does not fit (with the largest buffers and
 * what would fit, fitsearch.h), 2 on usage errors. `--shardings` adds every param's and input's sharding with
 * where each axis came from. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "devprog.h"
#include "fitsearch.h"
#include "report.h"
#include "memory.h"
#include "shard.h"
#include "waste.h"

static const char *origin_text(Arena *a, OriginKind k, SrcLoc loc) {
  if (k == ORIGIN_NONE || !loc.file) return "";
  return arena_printf(a, "%s at %s:%d", k == ORIGIN_ANNOTATION ? "@" : "layout rule", loc.file->path, loc.line);
}

static void print_one_sharding(FILE *out, Arena *a, const Program *p, const char *what, Name name,
                               const TypeSpec *spec, const TensorType *t) {
  Sharding s;
  ShardOrigin o;
  if (!layout_apply(p, spec, &s, &o)) return;
  char buf[512];
  sharding_format(buf, sizeof buf, t, &s, p->mesh);
  fprintf(out, "  %-6s %-28s %s", what, name, buf);
  const char *sep = "   # ";
  for (int i = 0; i < spec->rank; i++) {
    if (!s.naxes[i]) continue;
    fprintf(out, "%s%s: %s", sep, spec->dims[i]->name, origin_text(a, o.kind[i], o.loc[i]));
    sep = "; ";
  }
  fputc('\n', out);
}

static TensorType spec_type(const TypeSpec *s) {
  TensorType t = {.dtype = s->dtype, .rank = s->rank};
  memcpy(t.dims, s->dims, sizeof t.dims);
  return t;
}

static void print_shardings(FILE *out, Arena *a, const Program *p, const IrModule *m) {
  fprintf(out, "shardings:\n");
  for (int i = 0; i < m->nparams; i++)
    print_one_sharding(out, a, p, "param", m->params[i].path, &m->params[i].spec, &m->params[i].type);
  for (int i = 0; p->entry && i < p->entry->nargs; i++) {
    TensorType t = spec_type(&p->entry->args[i].type);
    print_one_sharding(out, a, p, "input", p->entry->args[i].name, &p->entry->args[i].type, &t);
  }
  if (p->entry) {
    TensorType t = spec_type(&p->entry->ret);
    print_one_sharding(out, a, p, "output", intern_cstr("return"), &p->entry->ret, &t);
  }
}

static void print_header(FILE *out, const Program *p, const IrModule *m) {
  char mesh[256] = "";
  int k = 0;
  for (int i = 0; i < p->mesh->naxes && k < (int)sizeof mesh - 40; i++)
    k += snprintf(mesh + k, sizeof mesh - (size_t)k, "%s%s: %d", i ? ", " : "", p->mesh->axes[i].name,
                  p->mesh->axes[i].size);
  fprintf(out, "%s %s.%s on mesh %s = %s[%s] (%lld devices), layout %s\n",
          p->step ? (p->step->kind == STEP_TRAIN ? "train" : "serve") : "entry", p->entry->model->name,
          p->entry->name, p->mesh->name, p->mesh->target->name, mesh, (long long)p->mesh->devices,
          p->layout ? p->layout->name : "(none)");
  (void)m;
}

/* The suggestions: each plan with its changes and what each adds (the checked figures). */
static void json_advice(cJSON *o, const Program *p, const FitAdvice *fa) {
  cJSON *sg = cJSON_AddArrayToObject(o, "suggestions");
  for (int i = 0; i < fa->nplans; i++) {
    const FitPlan *pl = &fa->plans[i];
    const FitFigures *end = &pl->after[pl->n - 1];
    cJSON *s = cJSON_CreateObject();
    char change[FIT_MAX_CHANGES * 410] = "", adds[FIT_MAX_CHANGES * 410] = "";
    cJSON *cs = cJSON_CreateArray();
    const FitFigures *prev = &fa->base;
    for (int k = 0; k < pl->n; k++) {
      snprintf(change + strlen(change), sizeof change - strlen(change), "%s%s", k ? "; " : "", pl->text[k]);
      snprintf(adds + strlen(adds), sizeof adds - strlen(adds), "%s%s", k ? "; " : "", pl->what[k]);
      cJSON *c = cJSON_CreateObject();
      cJSON_AddStringToObject(c, "change", pl->text[k]);
      cJSON_AddStringToObject(c, "adds", pl->what[k]);
      if (pl->after[k].valid) { /* checked with the changes up to this one */
        cJSON_AddNumberToObject(c, "total", (double)pl->after[k].total);
        cJSON_AddNumberToObject(c, "adds_comm_s", pl->after[k].comm_s - prev->comm_s);
        cJSON_AddNumberToObject(c, "adds_compute_s", pl->after[k].compute_s - prev->compute_s);
        cJSON_AddNumberToObject(c, "adds_flops", pl->after[k].flops - prev->flops);
        prev = &pl->after[k];
      }
      cJSON_AddItemToArray(cs, c);
    }
    cJSON_AddStringToObject(s, "change", change);
    cJSON_AddItemToObject(s, "changes", cs);
    cJSON_AddNumberToObject(s, "saves_bytes", (double)(fa->base.total - end->total));
    cJSON_AddNumberToObject(s, "new_total", (double)end->total);
    cJSON_AddBoolToObject(s, "fits", end->fits);
    cJSON_AddStringToObject(s, "adds", adds);
    cJSON_AddNumberToObject(s, "comm_s", end->comm_s);
    cJSON_AddNumberToObject(s, "compute_s", end->compute_s);
    cJSON_AddNumberToObject(s, "adds_compute_s", end->compute_s - fa->base.compute_s);
    cJSON_AddNumberToObject(s, "adds_comm_s", end->comm_s - fa->base.comm_s);
    cJSON_AddNumberToObject(s, "flops_per_step", end->flops);
    cJSON_AddNumberToObject(s, "adds_s", pl->added_s);
    cJSON_AddItemToArray(sg, s);
  }
  cJSON *pads = cJSON_AddArrayToObject(o, "padding");
  for (int i = 0; i < fa->npads; i++) {
    const FitPlan *pl = &fa->pads[i];
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "dim", pl->change[0].dim->name);
    cJSON_AddNumberToObject(e, "size", (double)pl->change[0].dim->size);
    cJSON_AddNumberToObject(e, "padded", (double)pl->change[0].pad_to);
    cJSON_AddStringToObject(e, "change", pl->text[0]);
    cJSON_AddNumberToObject(e, "new_total", (double)pl->after[0].total);
    cJSON_AddNumberToObject(e, "adds_comm_s", pl->after[0].comm_s - fa->base.comm_s);
    cJSON_AddNumberToObject(e, "adds_flops", pl->after[0].flops - fa->base.flops);
    cJSON_AddItemToArray(pads, e);
  }
  if (fa->nplans == 0 && fa->checked == 0 && fa->candidates == 0) return;
  cJSON *n = cJSON_AddObjectToObject(o, "needs_devices");
  cJSON_AddNumberToObject(n, "at_least", (double)fa->min_devices);
  cJSON_AddStringToObject(n, "target", p->mesh->target->name);
  cJSON_AddNumberToObject(n, "params_bytes", fa->state_params);
  cJSON_AddNumberToObject(n, "grads_bytes", fa->state_grads);
  cJSON_AddNumberToObject(n, "optimizer_bytes", fa->state_optimizer);
  cJSON *se = cJSON_AddObjectToObject(o, "search");
  cJSON_AddNumberToObject(se, "candidates", fa->candidates);
  cJSON_AddNumberToObject(se, "checked", fa->checked);
  cJSON_AddNumberToObject(se, "invalid", fa->invalid);
  cJSON_AddBoolToObject(se, "found", fa->found);
  cJSON_AddNumberToObject(se, "seconds", fa->seconds);
}

/* Byte counts under their keys, in order (n of each). */
static void json_bytes(cJSON *o, const char *const *keys, const int64_t *v, int n) {
  for (int i = 0; i < n; i++) cJSON_AddNumberToObject(o, keys[i], (double)v[i]);
}

/* The peak by class: language.md's memory keys. */
static void json_classes(cJSON *o, int64_t params, int64_t grads, int64_t opt, int64_t act, int64_t temp, int64_t total) {
  static const char *const keys[] = {"params", "grads", "optimizer", "activations", "temporaries", "total"};
  json_bytes(o, keys, (int64_t[]){params, grads, opt, act, temp, total}, 6);
}

/* "resident": {"params", "grads", "moments", "master", "total"}: what a device holds between steps. */
static void json_resident(cJSON *into, const MemResident *r) {
  static const char *const keys[] = {"params", "grads", "moments", "master", "total"};
  json_bytes(cJSON_AddObjectToObject(into, "resident"), keys,
             (int64_t[]){r->params, r->grads, r->moments, r->master, r->total}, 5);
}

static cJSON *json_report(Arena *a, const Program *p, const MemoryReport *r, const FitAdvice *fa) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "devices", (double)r->devices);
  cJSON *params = cJSON_AddObjectToObject(o, "params");
  cJSON_AddNumberToObject(params, "count", (double)r->param_count);
  cJSON_AddNumberToObject(params, "bytes", (double)r->param_bytes);
  cJSON *mem = cJSON_AddObjectToObject(o, "memory");
  cJSON *pd = cJSON_AddObjectToObject(mem, "per_device");
  json_classes(pd, r->params, r->grads, r->optimizer, r->activations, r->temporaries, r->total);
  if (r->training) json_resident(mem, &r->resident); /* between steps (memory.h's MemResident) */
  if (r->nstages > 0) { /* a pipeline: each stage's device */
    cJSON *ps = cJSON_AddArrayToObject(mem, "per_stage");
    for (int s = 0; s < r->nstages; s++) {
      const MemStage *m = &r->stages[s];
      cJSON *e = cJSON_CreateObject();
      cJSON_AddNumberToObject(e, "stage", m->stage);
      json_classes(e, m->params, m->grads, m->optimizer, m->activations, m->temporaries, m->total);
      cJSON_AddNumberToObject(e, "in_flight", m->in_flight);
      if (r->training) json_resident(e, &m->resident);
      cJSON_AddItemToArray(ps, e);
    }
  }
  cJSON_AddNumberToObject(mem, "capacity", r->capacity);
  cJSON_AddBoolToObject(mem, "fits", r->fits);
  cJSON_AddNumberToObject(o, "flops_per_step", r->flops_per_step);
  cJSON_AddNumberToObject(o, "model_flops_per_step", r->model_flops_per_step);
  cJSON_AddStringToObject(o, "mesh", p->mesh->name);
  cJSON_AddStringToObject(o, "target", p->mesh->target->name);
  if (p->layout) cJSON_AddStringToObject(o, "layout", p->layout->name);
  cJSON *lg = cJSON_AddArrayToObject(o, "largest");
  for (int i = 0; i < r->nlargest; i++) {
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "what", r->largest[i].what);
    cJSON_AddNumberToObject(b, "bytes", (double)r->largest[i].bytes);
    cJSON_AddStringToObject(b, "class", r->largest[i].cls);
    cJSON_AddStringToObject(b, "tensor", r->largest[i].name);
    cJSON_AddStringToObject(b, "dtype", r->largest[i].dtype);
    cJSON_AddStringToObject(b, "shape", r->largest[i].shape);
    if (r->largest[i].loc.file) {
      cJSON_AddStringToObject(b, "file", report_file(r->largest[i].loc));
      cJSON_AddNumberToObject(b, "line", r->largest[i].loc.line);
      cJSON_AddStringToObject(b, "where", memory_where(a, p, r->largest[i].loc));
    }
    cJSON_AddItemToArray(lg, b);
  }
  json_advice(o, p, fa);
  return o;
}

int cmd_check(const Options *o) {
  Arena arena;
  arena_init(&arena);
  CheckedProgram cp;
  int rc = check_load(o, &arena, &cp);
  if (rc == EXIT_OK && !cp.ir) {
    /* A declarations-only file (a target or layer library): it checks, and there is nothing to fit. */
    const Program *p = cp.prog;
    if (o->format == FORMAT_JSON) {
      cJSON *j = cJSON_CreateObject();
      cJSON_AddNullToObject(j, "entry");
      cJSON_AddNumberToObject(j, "dims", p->ndims);
      cJSON_AddNumberToObject(j, "targets", p->ntargets);
      cJSON_AddNumberToObject(j, "meshes", p->nmeshes);
      cJSON_AddNumberToObject(j, "layouts", p->nlayouts);
      cJSON_AddNumberToObject(j, "models", p->nmodels);
      report_json(j);
    } else
      printf("%s: declarations check (%d dims, %d targets, %d meshes, %d layouts, %d models); no function to "
             "compile, so no memory fit\n", o->input, p->ndims, p->ntargets, p->nmeshes, p->nlayouts, p->nmodels);
  }
  if (rc == EXIT_OK && cp.ir) rc = check_report(o, &arena, &cp, stdout);
  arena_free(&arena);
  return rc;
}

/* A difference of two sums of the same times taken in another order: under a nanosecond is noise. */
static double tidy(double s) { return s < 1e-9 && s > -1e-9 ? 0 : s; }

static const char *fmt_seconds(char *buf, size_t n, double s) {
  double a = s < 0 ? -s : s;
  if (a == 0) snprintf(buf, n, "0 s");
  else if (a >= 1) snprintf(buf, n, "%.3g s", s);
  else if (a >= 1e-3) snprintf(buf, n, "%.3g ms", s * 1e3);
  else snprintf(buf, n, "%.3g us", s * 1e6);
  return buf;
}

/* What a checked change (or plan) added over `prev`: memory, the collectives' time, FLOPs. */
static void print_delta(FILE *out, const FitFigures *prev, const FitFigures *f, const char *indent) {
  char a[32], b[32], t[32];
  memory_format_bytes(a, sizeof a, (double)prev->total);
  memory_format_bytes(b, sizeof b, (double)f->total);
  double dc = tidy(f->comm_s - prev->comm_s), dp = tidy(f->compute_s - prev->compute_s), df = f->flops - prev->flops;
  char u[32];
  fprintf(out, "%s%s -> %s per device; compute %s%s, collectives %s%s per step", indent, a, b, dp >= 0 ? "+" : "",
          fmt_seconds(u, sizeof u, dp), dc >= 0 ? "+" : "", fmt_seconds(t, sizeof t, dc));
  if (df != 0) fprintf(out, ", FLOPs %+.3g (%+.2g%%)", df, prev->flops > 0 ? 100 * df / prev->flops : 0);
  fputc('\n', out);
}

/* check's answer when the program does not fit: plans that do (fitsearch.h), or the closest and the
 * devices the model needs at least. */
static void print_advice(FILE *out, const Program *p, const FitAdvice *fa) {
  char b[32], c[32], t[32];
  const Mesh *mesh = p->mesh;
  double all = fa->state_params + fa->state_grads + fa->state_optimizer;
  if (!fa->found) {
    memory_format_bytes(b, sizeof b, all);
    memory_format_bytes(c, sizeof c, mesh->target->hbm);
    char parts[200];
    char x[32], y[32], z[32];
    memory_format_bytes(x, sizeof x, fa->state_params);
    memory_format_bytes(y, sizeof y, fa->state_grads);
    memory_format_bytes(z, sizeof z, fa->state_optimizer);
    if (fa->state_grads > 0)
      snprintf(parts, sizeof parts, "params %s + grads %s + optimizer %s", x, y, z);
    else
      snprintf(parts, sizeof parts, "the params");
    if (fa->min_devices > mesh->devices)
      fprintf(out, "no program on mesh %s fits: it needs at least %lld devices of %s, since %s = %s, and each "
              "device has %s of HBM, whatever the layout (the mesh has %lld)\n", mesh->name, (long long)fa->min_devices,
              mesh->target->name, parts, b, c, (long long)mesh->devices);
    else
      fprintf(out, "no combination of up to %d changes found fits on mesh %s (%s = %s would fit over its %lld "
              "devices; the rest is activations and temporaries)\n", FIT_MAX_CHANGES, mesh->name, parts, b,
              (long long)mesh->devices);
  }
  if (fa->nplans > 0)
    fprintf(out, "%s (each checked in full; times ideal, per step and device):\n",
            fa->found ? "what would fit" : "the closest programs found");
  for (int i = 0; i < fa->nplans; i++) {
    const FitPlan *pl = &fa->plans[i];
    const FitFigures *end = &pl->after[pl->n - 1];
    if (i == 0) {
      const FitFigures *prev = &fa->base;
      for (int k = 0; k < pl->n; k++) {
        fprintf(out, "  %d. %s\n     adds %s\n", k + 1, pl->text[k], pl->what[k]);
        if (pl->after[k].valid) {
          print_delta(out, prev, &pl->after[k], "     ");
          if (pl->enabling[k]) fprintf(out, "     (saves nothing by itself; the plan without it, checked, is worse)\n");
          prev = &pl->after[k];
        }
      }
      memory_format_bytes(b, sizeof b, (double)end->total);
      memory_format_bytes(c, sizeof c, mesh->target->hbm);
      char t2[32], t3[32], t4[32];
      fprintf(out, "  %s: %s of %s per device; compute %s -> %s, collectives %s -> %s per step",
              end->fits ? "fits" : "still does not fit", b, c, fmt_seconds(t3, sizeof t3, fa->base.compute_s),
              fmt_seconds(t4, sizeof t4, end->compute_s), fmt_seconds(t, sizeof t, fa->base.comm_s),
              fmt_seconds(t2, sizeof t2, end->comm_s));
      if (end->flops != fa->base.flops)
        fprintf(out, ", FLOPs %.4g -> %.4g", fa->base.flops, end->flops);
      fputc('\n', out);
      if (fa->nplans > 1) fprintf(out, "%s:\n", fa->found ? "other programs that fit" : "others");
      continue;
    }
    fprintf(out, "  - ");
    for (int k = 0; k < pl->n; k++) fprintf(out, "%s%s", k ? "; " : "", pl->text[k]);
    memory_format_bytes(b, sizeof b, (double)end->total);
    char u[32];
    double dp = tidy(end->compute_s - fa->base.compute_s), dc = tidy(end->comm_s - fa->base.comm_s);
    fprintf(out, "\n    %s per device, %s; compute %s%s, collectives %s%s per step\n", b, end->fits ? "fits" : "does not fit",
            dp >= 0 ? "+" : "", fmt_seconds(u, sizeof u, dp), dc >= 0 ? "+" : "", fmt_seconds(t, sizeof t, dc));
  }
  for (int i = 0; i < fa->npads; i++) {
    const FitPlan *pl = &fa->pads[i];
    if (i == 0) fprintf(out, "padding (checked):\n");
    fprintf(out, "  - %s\n    adds %s\n", pl->text[0], pl->what[0]);
    print_delta(out, &fa->base, &pl->after[0], "    ");
  }
  fprintf(out, "searched %d programs by estimate, checked %d in full", fa->candidates, fa->checked);
  if (fa->invalid) fprintf(out, " (%d of them had errors: not suggested)", fa->invalid);
  fprintf(out, "\n");
}

int check_report(const Options *o, Arena *arena, CheckedProgram *cp, FILE *out) {
  const Program *p = cp->prog;
  IrModule *m = cp->ir;
  int before = diag_error_count();
  /* one verdict: an error any pass reports is the answer; no figures after it */
  if (!pipeline_run(m, p) || diag_error_count() > before) return EXIT_PROGRAM_ERROR;
  MemoryReport r;
  memory_estimate(p, m, &r);
  FitAdvice fa;
  FitInput fin = {.cp = cp, .base = &r};
  fit_search(&fin, &fa);
  if (diag_error_count() > before) return EXIT_PROGRAM_ERROR;
  WasteReport waste;
  waste_find(arena, cp, &waste);
  waste_warn(&waste);

  if (o->format == FORMAT_JSON) {
    cJSON *j = json_report(arena, p, &r, &fa);
    cJSON_AddItemToObject(j, "waste", waste_json(&waste, p->mesh));
    cJSON_AddItemToObject(j, "warnings", report_warnings());
    report_json(j);
  } else {
    print_header(out, p, m);
    char b[32];
    memory_format_bytes(b, sizeof b, (double)r.param_bytes);
    fprintf(out, "params: %lld (%s)\n", (long long)r.param_count, b);
    memory_print_text(out, p, &r);
    fprintf(out, "flops per step: %.4g", r.flops_per_step);
    if (r.recompute_flops > 0) fprintf(out, " (model %.4g + recomputation %.4g)", r.model_flops_per_step, r.recompute_flops);
    fputc('\n', out);
    if (o->shardings) print_shardings(out, arena, p, m);
    if (o->emit_ir) devprog_print(out, m);
    if (r.nlargest > 0) fprintf(out, "largest buffers per device at the peak:\n");
    for (int i = 0; i < r.nlargest; i++) {
      memory_format_bytes(b, sizeof b, (double)r.largest[i].bytes);
      fprintf(out, "  %10s  %s", b, r.largest[i].what);
      if (r.largest[i].loc.file) fprintf(out, " at %s", memory_where(arena, p, r.largest[i].loc));
      fputc('\n', out);
    }
    if (!r.fits) print_advice(out, p, &fa);
    waste_print(out, &waste);
  }
  if (!r.fits) {
    char t[32], c[32];
    memory_format_bytes(t, sizeof t, (double)r.total);
    memory_format_bytes(c, sizeof c, r.capacity);
    diag_error(p->step ? p->step->loc : p->entry->loc,
               "does not fit: %s per device on %s, which has %s of HBM", t, p->mesh->target->name, c);
  }
  return r.fits ? EXIT_OK : EXIT_PROGRAM_ERROR;
}
