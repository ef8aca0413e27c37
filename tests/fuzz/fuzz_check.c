/* fuzz_check.c: libFuzzer target for everything `shardc check` runs after the front end: imports
 * (the real stdlib), declarations (sema), the entry's IR (ir_build / step_build), the pass pipeline
 * (propagation, partitioning, localisation, pipeline stages), the buffer plan, memory fit and
 * suggestions (check_report).
 *
 * In: arbitrary bytes, taken as the text of the main .shard file (in memory: parse_program_source;
 * `import "targets"` and the other stdlib imports resolve against the source tree's stdlib). Out:
 * nothing; the contract under test is that any input yields a result or located diagnostics, never
 * a crash, a sanitizer report, a leak or a hang; that a program any stage reported an error for is
 * never given exit 0 (one verdict); and that the localised IR always verifies (an IR that does not
 * is an internal error: abort, so libFuzzer saves the input). Diagnostics and
 * reports are rendered into /dev/null. Between inputs every piece of global state is reset: the
 * arena, the sources, the interner and the diagnostic counts.
 *
 * Build: cmake -DCMAKE_C_COMPILER=clang-19 -DSHARDC_FUZZ=ON; run: tests/fuzz/run.sh BUILD_DIR. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "common.h"
#include "diag.h"
#include "parse.h"

static FILE *sink;           /* /dev/null, opened once */
static const char *stdlib_dir;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  sink = fopen("/dev/null", "w");
  if (!sink) {
    perror("fuzz_check: /dev/null");
    abort();
  }
  stdlib_dir = stdlib_locate((*argv)[0]);
  if (!stdlib_dir) {
    fprintf(stderr, "fuzz_check: no stdlib directory (set SHARDC_STDLIB)\n");
    abort();
  }
  return 0;
}

/* What cmd_check does once the program loads (its report rendered into /dev/null), and what explain
 * reads after it. One verdict: a program any stage reported an error for never exits 0. */
static void analyse(const Options *o, Arena *arena, CheckedProgram *cp) {
  int before = diag_error_count();
  int rc = check_report(o, arena, cp, sink);
  if (rc == EXIT_OK && diag_error_count() > before) {
    fprintf(stderr, "fuzz_check: check exits 0 after reporting an error\n");
    abort();
  }
  if (rc != EXIT_OK && diag_error_count() > before && cp->ir && !cp->ir->localized) return;
  if (cp->ir && cp->ir->localized && !ir_verify(cp->ir, stderr)) {
    fprintf(stderr, "fuzz_check: the partitioned IR does not verify\n");
    abort();
  }
  if (cp->ir) ir_print(sink, cp->ir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  diag_configure(sink, DIAG_TEXT, false);
  Arena arena;
  arena_init(&arena);
  Source *src = source_from_memory("fuzz.shard", (const char *)data, size);
  Options o = {.argv0 = "fuzz_check", .command = "check", .input = "fuzz.shard"};
  CheckedProgram cp;
  if (check_parsed(&o, &arena, parse_program_source(&arena, src, stdlib_dir), &cp) == EXIT_OK && cp.ir)
    analyse(&o, &arena, &cp);
  arena_free(&arena);
  source_free_all();
  intern_reset();
  diag_reset();
  return 0;
}
