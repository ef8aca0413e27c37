/* check.c: load the file named on the command line, then the front half (pipeline.h) with the
 * command line's choices (check.h). */
#include <stdio.h>
#include <string.h>

#include "check.h"

ParsedProgram *driver_load_program(const Options *o, Arena *arena) {
  ParsedProgram *prog = parse_program(arena, o->input, stdlib_locate(o->argv0));
  return prog->nfiles > 0 ? prog : NULL;
}

int check_load(const Options *o, Arena *arena, CheckedProgram *cp) {
  return check_parsed(o, arena, driver_load_program(o, arena), cp);
}

int check_parsed(const Options *o, Arena *arena, ParsedProgram *parsed, CheckedProgram *cp) {
  memset(cp, 0, sizeof *cp);
  cp->parsed = parsed;
  if (!cp->parsed || cp->parsed->nfiles == 0) return EXIT_PROGRAM_ERROR;
  if (diag_error_count() > 0) return EXIT_PROGRAM_ERROR;
  SemaOptions so = {.mesh = o->mesh, .layout = o->layout, .entry = o->entry};
  so.overrides = ARENA_ARRAY(arena, DimOverride, o->ndims + 1);
  for (int i = 0; i < o->ndims; i++)
    so.overrides[so.noverrides++] = (DimOverride){intern_cstr(o->dims[i].name), o->dims[i].value};
  return check_program(arena, parsed, &so, cp);
}
