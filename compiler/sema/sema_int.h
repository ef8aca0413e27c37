/* sema_int.h: what the declaration checker's files share (sema.c, target.c, mesh.c, layout.c).
 *
 * Not for later stages: they read the finished Program (program.h). */
#ifndef SHARDC_SEMA_INT_H
#define SHARDC_SEMA_INT_H

#include "diag.h"
#include "program.h"

/* `what 'name' is declared twice` at loc, with a note at the first declaration. */
void sema_duplicate(const char *what, Name name, SrcLoc loc, SrcLoc first);

/* Where to point at a node: its name if it has one, else the whole node. */
SrcLoc sema_name_loc(const Node *n);

/* A number in a `key = value` body: a literal, possibly negated. False if v is not one. */
bool sema_kv_number(const Node *v, double *out, bool *is_int, int64_t *ival);

/* A word in a `key = value` body: a name, a string, or a number written like a word (`1f1b`). */
Name sema_kv_word(const Node *v);

/* "a, b, c" (at most `max` of them, then "..."), or "none"; from the arena. */
const char *sema_join_names(Arena *a, const Name *names, int n, int max);

/* target.c: p->targets from the N_TARGET declarations in program order (duplicates are errors),
 * resolving `base` first. A target with errors is kept with whatever figures it got; a mesh on it
 * is not formed (mesh_form checks the figures it needs). */
void target_build_all(Program *p, const Node *const *decls, int n);

/* layout.c: warns once at each rule of p->layout that names an axis p->mesh lacks (such a rule is
 * skipped by layout_apply). */
void layout_check_rules(const Program *p);
/* layout.c: a fresh set of reported diagnostics for Program.diag_once. */
struct DiagOnce *layout_diag_once_new(Arena *a);

#endif
