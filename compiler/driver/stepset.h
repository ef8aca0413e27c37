/* stepset.h: `--set key=value`, a train step key given on the command line.
 *
 * A --set is checked as the key written in the program would be: its text is parsed as a line of
 * a train block in a source of its own named `--set`, and the resulting `key = value` replaces the
 * key in every train step of the program (or joins it there). Sema then checks it with the same
 * rules and messages as a written key, and a wrong value is a located diagnostic (`--set:1:7`) with
 * a caret under it, exit 1. What can be told without the program is a usage error (exit 2): text
 * that is not KEY=VALUE, a key no train step has (with a did-you-mean), a key given twice with
 * different values. */
#ifndef SHARDC_STEPSET_H
#define SHARDC_STEPSET_H

#include <stdbool.h>
#include <stddef.h>

#include "parse.h"

/* Is `text` (a --set value) KEY=VALUE with KEY a train step key? On false, msg holds why (with a
 * did-you-mean for a near key). `key` receives the key's length. */
bool stepset_valid(const char *text, size_t *keylen, char *msg, size_t size);

/* Applies the sets (each stepset_valid) to every train step of `parsed`. Returns 0; or 1 after a
 * located diagnostic (a value that does not parse); or 2 after a usage message (no train step). */
int stepset_apply(Arena *arena, ParsedProgram *parsed, const char *const *sets, int nsets);
#endif
