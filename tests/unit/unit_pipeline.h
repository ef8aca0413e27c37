/* unit_pipeline.h: the front half of the compiler as the IR-level unit tests (test_ir,
 * test_autodiff) run it, with the diagnostics captured in memory (machine form), and the list of
 * samples they build. Compiled into each of those tests (ir.cmake, autodiff.cmake). */
#ifndef SHARDC_UNIT_PIPELINE_H
#define SHARDC_UNIT_PIPELINE_H

#include <stdio.h>

#include "ir.h"
#include "parse.h"

typedef struct UnitRun {
  Arena arena;
  Program *p;    /* after sema_program */
  IrModule *m;   /* after the build */
  char *diags;   /* what diag printed (machine form); complete after a fflush(df) */
  size_t ndiags;
  FILE *df;
  char *text;    /* source text the run owns (malloc'd; freed by unit_run_free), or NULL */
  char path[64]; /* a temporary file the run wrote (removed by unit_run_free), or "" */
} UnitRun;

/* Empties r, resets diag and sends its output to r->diags. */
void unit_run_start(UnitRun *r);

/* Parses `path` with its imports (stdlib at SHARDC_SOURCE_STDLIB), checks it with `entry` (NULL:
 * the default) and, when that gives no errors and an entry, builds it with `build` (ir_build,
 * step_build). Returns r->m: NULL after any error (the diagnostics in r->diags). */
IrModule *unit_run_file(UnitRun *r, const char *path, const char *entry,
                        IrModule *(*build)(Arena *, const Program *));

/* Frees all r holds, and the sources and interned names of the run. */
void unit_run_free(UnitRun *r);

/* The ops of kind k in f, and with `deep` in the bodies of its loops (at any depth). */
int unit_count_ops(const IrFunc *f, OpKind k, bool deep);

/* The .shard files of samples/ (beside SHARDC_SOURCE_STDLIB), sorted, into names (at most `max`),
 * the directory into dir. Returns how many; 0 when it cannot be read. */
int unit_samples(char *dir, size_t ndir, char (*names)[256], int max);

/* The stdlib directory: $SHARDC_STDLIB, else SHARDC_SOURCE_STDLIB. */
const char *unit_stdlib_dir(void);

/* The meshes and layouts `path` declares in its own file (not in its imports), as malloc'd names
 * into meshes[*nm] and layouts[*nl] (at most max each); where it declares none, one NULL (the
 * default). Frees nothing of the caller's; free the names with free(). Diagnostics go where diag
 * sends them. */
void unit_declared(const char *path, char **meshes, int *nm, char **layouts, int *nl, int max);

#endif
