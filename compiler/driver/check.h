/* check.h: the front half every analysing command shares (check, explain, sim, run, build):
 * load the program, check its declarations, apply the command line's choices, and lower the entry
 * to IR. Commands then add their own stage. */
#ifndef SHARDC_CHECK_H
#define SHARDC_CHECK_H

#include "driver.h"
#include "pipeline.h"

/* The name an inline `--mesh 'TARGET[axes]'` is declared under (check.c). */
#define CHECK_INLINE_MESH "cli"

/* Returns the exit code so far: EXIT_OK (cp filled), EXIT_PROGRAM_ERROR (diagnostics printed),
 * or EXIT_USAGE (a bad --mesh/--layout/--entry/-D, message printed). */
int check_load(const Options *o, Arena *arena, CheckedProgram *cp);
/* check_load's work after loading, on a program already parsed (parse_program_source: the fuzzer).
 * NULL or an empty program is EXIT_PROGRAM_ERROR. */
int check_parsed(const Options *o, Arena *arena, ParsedProgram *parsed, CheckedProgram *cp);

/* `shardc check`'s report on a program check_load loaded (cp->ir set): the pass pipeline, the
 * memory fit and FLOPs, the figures on `out` (JSON through report.h). The exit code: 0 fits, 1 an
 * error any stage reported (then no figures) or does not fit. */
int check_report(const Options *o, Arena *arena, CheckedProgram *cp, FILE *out);
#endif
