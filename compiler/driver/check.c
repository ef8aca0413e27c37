/* check.c: load the file named on the command line, then the front half (pipeline.h) with the
 * command line's choices (check.h). `--mesh 'h100[data: 2, model: 2]'` gives a mesh inline: it is
 * parsed and checked as the declaration `mesh cli = h100[data: 2, model: 2]` in a source of its own
 * named `--mesh`, so its errors are located diagnostics like any other. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "stepset.h"

ParsedProgram *driver_load_program(const Options *o, Arena *arena) {
  ParsedProgram *prog = parse_program(arena, o->input, stdlib_locate(o->argv0));
  return prog->nfiles > 0 ? prog : NULL;
}

int check_load(const Options *o, Arena *arena, CheckedProgram *cp) {
  return check_parsed(o, arena, driver_load_program(o, arena), cp);
}

/* A --mesh value that is not a name: TARGET[axis: size, ...]. */
static bool mesh_is_inline(const char *mesh) { return mesh && strchr(mesh, '['); }

/* Adds the inline mesh's declaration to the program, before the main file (which stays last).
 * Returns the name to choose, or NULL after a diagnostic. */
static const char *add_inline_mesh(Arena *arena, ParsedProgram *parsed, const char *text) {
  const char *decl = arena_printf(arena, "mesh %s = %s\n", CHECK_INLINE_MESH, text);
  Source *src = source_from_memory("--mesh", decl, strlen(decl));
  if (!src) return NULL;
  int before = diag_error_count();
  Ast *ast = parse_source(arena, src);
  if (diag_error_count() > before) return NULL;
  /* one mesh declaration and nothing else (the text could hold a newline and more declarations) */
  if (!ast || !ast->decls || ast->decls->kind != N_MESH || ast->decls->next) {
    SrcLoc loc = {.file = src, .line = 1, .col = 1, .len = (int)strcspn(decl, "\n")};
    diag_error(loc, "--mesh '%s': expected one mesh, TARGET[axis: size, ...], or the name of a declared mesh", text);
    return NULL;
  }
  Ast **files = ARENA_ARRAY(arena, Ast *, parsed->nfiles + 1);
  memcpy(files, parsed->files, sizeof(Ast *) * (size_t)(parsed->nfiles - 1));
  files[parsed->nfiles - 1] = ast;
  files[parsed->nfiles] = parsed->files[parsed->nfiles - 1];
  parsed->files = files;
  parsed->nfiles++;
  return CHECK_INLINE_MESH;
}

int check_parsed(const Options *o, Arena *arena, ParsedProgram *parsed, CheckedProgram *cp) {
  memset(cp, 0, sizeof *cp);
  cp->parsed = parsed;
  if (!cp->parsed || cp->parsed->nfiles == 0) return EXIT_PROGRAM_ERROR;
  if (diag_error_count() > 0) return EXIT_PROGRAM_ERROR;
  SemaOptions so = {.mesh = o->mesh, .layout = o->layout, .entry = o->entry};
  if (mesh_is_inline(o->mesh) && !(so.mesh = add_inline_mesh(arena, parsed, o->mesh))) return EXIT_PROGRAM_ERROR;
  if (o->nsets && o->entry) {
    diag_usage("--set %s: --entry compiles %s alone, with no train step to set", o->sets[0], o->entry);
    return EXIT_USAGE;
  }
  int set = stepset_apply(arena, parsed, o->sets, o->nsets);
  if (set) return set == 2 ? EXIT_USAGE : EXIT_PROGRAM_ERROR;
  so.overrides = ARENA_ARRAY(arena, DimOverride, o->ndims + 1);
  for (int i = 0; i < o->ndims; i++)
    so.overrides[so.noverrides++] = (DimOverride){intern_cstr(o->dims[i].name), o->dims[i].value};
  return check_program(arena, parsed, &so, cp);
}
