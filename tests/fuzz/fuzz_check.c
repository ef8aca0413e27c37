/* fuzz_check.c: libFuzzer target for everything `shardc check` and `shardc explain` run after the
 * front end: imports (the real stdlib), declarations (sema), the entry's IR (ir_build / step_build),
 * sharding propagation, memory fit and suggestions (memory.c), and partitioning (partition.c).
 *
 * In: arbitrary bytes, taken as the text of the main .shard file (in memory: parse_program_source;
 * `import "targets"` and the other stdlib imports resolve against the source tree's stdlib). Out:
 * nothing; the contract under test is that any input yields a result or located diagnostics, never
 * a crash, a sanitizer report, a leak or a hang, and that the partitioned IR always verifies (an
 * IR that does not is an internal error: abort, so libFuzzer saves the input). Diagnostics and
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
#include "memory.h"
#include "parse.h"
#include "partition.h"

#define MAX_SUGGESTIONS 5

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

/* What cmd_check and cmd_explain do once the program checks (explain.c's own rendering aside). */
static void analyse(const Program *p, IrModule *m) {
  MemoryReport r;
  memory_estimate(p, m, &r);
  memory_print_text(sink, p, &r);
  MemSuggestion sug[MAX_SUGGESTIONS];
  if (!r.fits) memory_suggest(p, m, &r, sug, MAX_SUGGESTIONS);
  if (!partition_module(m, p) || diag_error_count() > 0) return;
  if (!ir_verify(m, stderr)) {
    fprintf(stderr, "fuzz_check: the partitioned IR does not verify\n");
    abort();
  }
  Pipeline pipe;
  partition_pipeline(m, &pipe);
  ir_print(sink, m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  diag_configure(sink, DIAG_TEXT, false);
  Arena arena;
  arena_init(&arena);
  Source *src = source_from_memory("fuzz.shard", (const char *)data, size);
  Options o = {.argv0 = "fuzz_check", .command = "check", .input = "fuzz.shard"};
  CheckedProgram cp;
  if (check_parsed(&o, &arena, parse_program_source(&arena, src, stdlib_dir), &cp) == EXIT_OK && cp.ir)
    analyse(cp.prog, cp.ir);
  arena_free(&arena);
  source_free_all();
  intern_reset();
  diag_reset();
  return 0;
}
