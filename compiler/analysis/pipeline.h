/* pipeline.h: the compiler's front half as every command and tool runs it: the parsed program's
 * declarations checked (sema) with the command line's choices, and the entry lowered to IR (the
 * whole train step when the entry is one). Commands (driver/), the interpreter's loader and the
 * tests start here. */
#ifndef SHARDC_PIPELINE_H
#define SHARDC_PIPELINE_H

#include "ir.h"
#include "parse.h"

enum { EXIT_OK = 0, EXIT_PROGRAM_ERROR = 1, EXIT_USAGE = 2 };

typedef struct CheckedProgram {
  ParsedProgram *parsed;
  Program *prog;
  IrModule *ir;   /* NULL when the program has no entry (a declarations-only file) */
  SemaOptions so; /* the command line's choices it was checked with (the suggestions re-check) */
} CheckedProgram;

/* The IR a command analyses: the whole train step (step_build) when p's entry is one, else the
 * entry's forward (ir_build). NULL after errors. */
IrModule *check_build_ir(Arena *arena, const Program *p);

/* Declarations (sema) with these command-line choices, then the entry's IR. Errors are those
 * reported since the call. Returns EXIT_OK (cp filled), EXIT_PROGRAM_ERROR (diagnostics
 * printed), or EXIT_USAGE (a bad --mesh/--layout/--entry/-D, message printed). */
int check_program(Arena *arena, ParsedProgram *parsed, const SemaOptions *so, CheckedProgram *cp);
/* The passes after the IR is built, in this order, run once on a module (each requires the ones
 * before it; the commands, the interpreter and the tests only read what they leave):
 *   propagate  a sharding for every value (shard/propagate.h)
 *   partition  the collectives those shardings imply, each with its reason (shard/partition.h)
 *   verify     the IR's structural invariants (ir_verify)
 *   localize   the per-device program: local extents, explicit slices, offsets, divisors, each
 *              collective's runtime facts (shard/localize.h)
 *   stages     a pipelined step's per-stage regions, transfers and schedule, and where each op
 *              of main runs (shard/stages.h)
 *   devprog    the device program: replica groups, blocks, storage orders, each op's devices,
 *              collectives and rings (shard/devprog.h)
 * Errors are reported (located); returns false after any. Running it again on a module it has
 * run on does nothing. */
bool pipeline_run(IrModule *m, const Program *p);
#endif
