/* cmd_check.c: `shardc check FILE`: parse, check, and report memory fit per device.
 *
 * Pipeline: load (parse.c) -> declarations (sema.c) -> the entry's IR (ir_build.c) -> shardings
 * (shard.c) -> memory fit and FLOPs (memory.c). Prints a text table or the JSON object whose keys
 * language.md fixes; exits 1 when the program is wrong or does not fit (with the largest buffers and
 * ranked suggestions), 2 on usage errors. `--shardings` adds every param's and input's sharding with
 * where each axis came from. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "report.h"
#include "memory.h"
#include "shard.h"

#define MAX_SUGGESTIONS 5

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

static cJSON *json_report(const Program *p, const MemoryReport *r, const MemSuggestion *sug, int nsug) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "devices", (double)r->devices);
  cJSON *params = cJSON_AddObjectToObject(o, "params");
  cJSON_AddNumberToObject(params, "count", (double)r->param_count);
  cJSON_AddNumberToObject(params, "bytes", (double)r->param_bytes);
  cJSON *mem = cJSON_AddObjectToObject(o, "memory");
  cJSON *pd = cJSON_AddObjectToObject(mem, "per_device");
  cJSON_AddNumberToObject(pd, "params", (double)r->params);
  cJSON_AddNumberToObject(pd, "grads", (double)r->grads);
  cJSON_AddNumberToObject(pd, "optimizer", (double)r->optimizer);
  cJSON_AddNumberToObject(pd, "activations", (double)r->activations);
  cJSON_AddNumberToObject(pd, "temporaries", (double)r->temporaries);
  cJSON_AddNumberToObject(pd, "total", (double)r->total);
  if (r->nstages > 0) { /* a pipeline: each stage's device */
    cJSON *ps = cJSON_AddArrayToObject(mem, "per_stage");
    for (int s = 0; s < r->nstages; s++) {
      const MemStage *m = &r->stages[s];
      cJSON *e = cJSON_CreateObject();
      cJSON_AddNumberToObject(e, "stage", m->stage);
      cJSON_AddNumberToObject(e, "params", (double)m->params);
      cJSON_AddNumberToObject(e, "grads", (double)m->grads);
      cJSON_AddNumberToObject(e, "optimizer", (double)m->optimizer);
      cJSON_AddNumberToObject(e, "activations", (double)m->activations);
      cJSON_AddNumberToObject(e, "temporaries", (double)m->temporaries);
      cJSON_AddNumberToObject(e, "total", (double)m->total);
      cJSON_AddNumberToObject(e, "in_flight", m->in_flight);
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
    if (r->largest[i].loc.file) cJSON_AddNumberToObject(b, "line", r->largest[i].loc.line);
    cJSON_AddItemToArray(lg, b);
  }
  cJSON *sg = cJSON_AddArrayToObject(o, "suggestions");
  for (int i = 0; i < nsug; i++) {
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "change", sug[i].text);
    cJSON_AddNumberToObject(s, "saves_bytes", (double)sug[i].saved);
    cJSON_AddNumberToObject(s, "new_total", (double)sug[i].new_total);
    cJSON_AddBoolToObject(s, "fits", sug[i].fits);
    cJSON_AddStringToObject(s, "adds", sug[i].comm);
    cJSON_AddItemToArray(sg, s);
  }
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

int check_report(const Options *o, Arena *arena, CheckedProgram *cp, FILE *out) {
  const Program *p = cp->prog;
  IrModule *m = cp->ir;
  int before = diag_error_count();
  /* one verdict: an error any pass reports is the answer; no figures after it */
  if (!pipeline_run(m, p) || diag_error_count() > before) return EXIT_PROGRAM_ERROR;
  MemoryReport r;
  memory_estimate(p, m, &r);
  MemSuggestion sug[MAX_SUGGESTIONS];
  int nsug = r.fits ? 0 : memory_suggest(p, m, &r, sug, MAX_SUGGESTIONS);
  if (diag_error_count() > before) return EXIT_PROGRAM_ERROR;

  if (o->format == FORMAT_JSON) {
    report_json(json_report(p, &r, sug, nsug));
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
    if (o->emit_ir) ir_print(out, m);
    if (!r.fits) {
      fprintf(out, "largest buffers per device:\n");
      for (int i = 0; i < r.nlargest; i++) {
        memory_format_bytes(b, sizeof b, (double)r.largest[i].bytes);
        fprintf(out, "  %10s  %s", b, r.largest[i].what);
        if (r.largest[i].loc.file) fprintf(out, " (%s:%d)", r.largest[i].loc.file->path, r.largest[i].loc.line);
        fputc('\n', out);
      }
      fprintf(out, nsug ? "suggestions, most bytes saved first:\n" : "no single change found that saves memory\n");
      for (int i = 0; i < nsug; i++) {
        char t[32];
        memory_format_bytes(b, sizeof b, (double)sug[i].saved);
        memory_format_bytes(t, sizeof t, (double)sug[i].new_total);
        fprintf(out, "  %d. %s: saves %s per device (total %s, %s)\n     adds: %s\n", i + 1, sug[i].text, b, t,
                sug[i].fits ? "fits" : "still does not fit", sug[i].comm);
      }
    }
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
