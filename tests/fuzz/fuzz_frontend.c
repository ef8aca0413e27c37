/* fuzz_frontend.c: libFuzzer target for the front end (lexer, parser, AST printer, diagnostics).
 *
 * In: arbitrary bytes, taken as the text of one .shard file. Out: nothing; the contract under test
 * is that any input yields an Ast or diagnostics, never a crash, a sanitizer report, a leak or a
 * hang. Diagnostics are rendered in full (text form, with source line and caret) into /dev/null so
 * that their formatting is exercised too. Between inputs every piece of global state is reset:
 * the arena, the sources, the interner and the diagnostic counts.
 *
 * Build: cmake -DCMAKE_C_COMPILER=clang-19 -DSHARDC_FUZZ=ON; run: tests/fuzz/run.sh BUILD_DIR. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ast.h"
#include "common.h"
#include "diag.h"
#include "parse.h"

static FILE *sink; /* /dev/null, opened once */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  sink = fopen("/dev/null", "w");
  if (!sink) {
    perror("fuzz_frontend: /dev/null");
    abort();
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  diag_configure(sink, DIAG_TEXT, false);
  Arena arena;
  arena_init(&arena);
  Source *src = source_from_memory("fuzz.shard", (const char *)data, size);
  if (src) {
    Ast *ast = parse_source(&arena, src);
    if (ast) ast_print(sink, ast);
  }
  arena_free(&arena);
  source_free_all();
  intern_reset();
  diag_reset();
  return 0;
}
