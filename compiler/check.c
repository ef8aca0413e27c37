/* check.c: load, check declarations, choose mesh/layout/entry, lower the entry to IR (check.h). */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "step.h"

IrModule *check_build_ir(Arena *arena, const Program *p) {
  return step_build(arena, p); /* the entry's forward alone unless p's step is a train step */
}

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

int check_program(Arena *arena, ParsedProgram *parsed, const SemaOptions *so, CheckedProgram *cp) {
  int before = diag_error_count();
  cp->parsed = parsed;
  cp->prog = sema_program(arena, cp->parsed, so);
  if (cp->prog->usage_error) {
    fprintf(stderr, "shardc: %s\n", cp->prog->usage_error);
    return EXIT_USAGE;
  }
  if (diag_error_count() > before) return EXIT_PROGRAM_ERROR;
  if (!cp->prog->entry) return EXIT_OK;
  if (!cp->prog->mesh) {
    diag_error(cp->prog->entry->loc, "no mesh is declared: declare one (mesh pod = tpu_v5e[data: 4, model: 2]) "
               "to check memory per device");
    return EXIT_PROGRAM_ERROR;
  }
  if (cp->prog->step && cp->prog->step->kind == STEP_SERVE) {
    fprintf(stderr, "shardc: compiling a `serve` step is not implemented yet; use --entry model.fn\n");
    return EXIT_USAGE;
  }
  cp->ir = check_build_ir(arena, cp->prog);
  if (!cp->ir || diag_error_count() > before) return EXIT_PROGRAM_ERROR;
  return EXIT_OK;
}
