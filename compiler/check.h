/* check.h: the front half every analysing command shares (check, explain, sim, run, build):
 * load the program, check its declarations, apply the command line's choices, and lower the entry
 * to IR. Commands then add their own stage. */
#ifndef SHARDC_CHECK_H
#define SHARDC_CHECK_H

#include "driver.h"
#include "ir.h"

typedef struct CheckedProgram {
  ParsedProgram *parsed;
  Program *prog;
  IrModule *ir;   /* NULL when the program has no entry (a declarations-only file) */
} CheckedProgram;

/* The IR a command analyses: the whole train step (step_build) when p's entry is one, else the
 * entry's forward (ir_build). NULL after errors. */
IrModule *check_build_ir(Arena *arena, const Program *p);

/* Returns the exit code so far: EXIT_OK (cp filled), EXIT_PROGRAM_ERROR (diagnostics printed),
 * or EXIT_USAGE (a bad --mesh/--layout/--entry/-D, message printed). */
int check_load(const Options *o, Arena *arena, CheckedProgram *cp);
/* check_load's work after loading, on a program already parsed (parse_program_source: the fuzzer).
 * NULL or an empty program is EXIT_PROGRAM_ERROR. */
int check_parsed(const Options *o, Arena *arena, ParsedProgram *parsed, CheckedProgram *cp);

/* The part after parsing that check_parsed and the interpreter's loader share: declarations
 * (sema) with these command-line choices, then the entry's IR. Errors are those reported since
 * the call. Same exit codes. */
int check_program(Arena *arena, ParsedProgram *parsed, const SemaOptions *so, CheckedProgram *cp);
#endif
