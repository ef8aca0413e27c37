/* unit_pipeline.c: see unit_pipeline.h. */
#include "unit_pipeline.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"

#ifndef SHARDC_SOURCE_STDLIB
#define SHARDC_SOURCE_STDLIB "stdlib"
#endif

void unit_run_start(UnitRun *r) {
  memset(r, 0, sizeof *r);
  diag_reset();
  r->df = open_memstream(&r->diags, &r->ndiags);
  diag_configure(r->df, DIAG_MACHINE, false);
  arena_init(&r->arena);
}

IrModule *unit_run_file(UnitRun *r, const char *path, const char *entry,
                        IrModule *(*build)(Arena *, const Program *)) {
  ParsedProgram *pp = parse_program(&r->arena, path, SHARDC_SOURCE_STDLIB);
  if (pp && diag_error_count() == 0) {
    SemaOptions so = {.entry = entry};
    r->p = sema_program(&r->arena, pp, &so);
    if (diag_error_count() == 0 && r->p->entry) r->m = build(&r->arena, r->p);
  }
  fflush(r->df);
  return r->m;
}

void unit_run_free(UnitRun *r) {
  if (r->df) fclose(r->df);
  free(r->diags);
  free(r->text);
  if (r->path[0]) remove(r->path);
  arena_free(&r->arena);
  source_free_all();
  intern_reset();
}

int unit_count_ops(const IrFunc *f, OpKind k, bool deep) {
  int n = 0;
  for (const Op *o = f->first; o; o = o->next) {
    n += o->kind == k;
    if (deep && o->kind == OP_LOOP && o->body) n += unit_count_ops(o->body, k, true);
  }
  return n;
}

int unit_samples(char *dir, size_t ndir, char (*names)[256], int max) {
  snprintf(dir, ndir, "%s/../samples", SHARDC_SOURCE_STDLIB);
  DIR *d = opendir(dir);
  if (!d) return 0;
  struct dirent *e;
  int n = 0;
  while ((e = readdir(d)) && n < max) {
    size_t l = strlen(e->d_name);
    if (l > 6 && strcmp(e->d_name + l - 6, ".shard") == 0) snprintf(names[n++], 256, "%s", e->d_name);
  }
  closedir(d);
  qsort(names, (size_t)n, sizeof names[0], (int (*)(const void *, const void *))strcmp);
  return n;
}

const char *unit_stdlib_dir(void) {
  const char *e = getenv("SHARDC_STDLIB");
  return e ? e : SHARDC_SOURCE_STDLIB;
}

void unit_declared(const char *path, char **meshes, int *nm, char **layouts, int *nl, int max) {
  Arena a;
  arena_init(&a);
  diag_reset();
  ParsedProgram *pp = parse_program(&a, path, unit_stdlib_dir());
  *nm = *nl = 0;
  if (pp && pp->nfiles > 0 && diag_error_count() == 0) {
    SemaOptions so = {0};
    Program *p = sema_program(&a, pp, &so);
    for (int i = 0; i < p->nmeshes && *nm < max; i++)
      if (p->meshes[i]->loc.file == p->main_file) meshes[(*nm)++] = strdup(p->meshes[i]->name);
    for (int i = 0; i < p->nlayouts && *nl < max; i++)
      if (p->layouts[i]->loc.file == p->main_file) layouts[(*nl)++] = strdup(p->layouts[i]->name);
  }
  arena_free(&a);
  if (*nm == 0) meshes[(*nm)++] = NULL;
  if (*nl == 0) layouts[(*nl)++] = NULL;
}
