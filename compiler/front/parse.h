/* parse.h: the front end's entry points: lex + parse one source into an Ast, and load a program
 * (a file and, transitively, its imports) into a list of parsed files.
 *
 * Errors go through diag.h; a file with syntax errors still yields the declarations that parsed. */
#ifndef SHARDC_PARSE_H
#define SHARDC_PARSE_H

#include "ast.h"

/* Deepest nesting of (), [], {} the parser accepts; deeper input is a diagnostic, not a crash. */
#define PARSE_MAX_NESTING 256

Ast *parse_source(Arena *arena, const Source *src);

/* Every file of a program, imports first (each once), the main file last. */
typedef struct ParsedProgram {
  Ast **files;
  int nfiles;
} ParsedProgram;

/* Resolves `import "targets"` against the stdlib directory and `import "./x.shard"` against the
 * importing file's directory. Import cycles and missing files are diagnostics. */
ParsedProgram *parse_program(Arena *arena, const char *path, const char *stdlib_dir);

/* The same with the main file already in memory (the fuzzer; tests): its relative imports resolve
 * against main->path's directory, and nothing is read for the main file itself. */
ParsedProgram *parse_program_source(Arena *arena, Source *main, const char *stdlib_dir);

/* The stdlib directory: $SHARDC_STDLIB, else next to the executable (../share/shardc/stdlib, or the
 * build tree's copy of the source stdlib/). NULL if none found. */
const char *stdlib_locate(const char *argv0);
#endif
