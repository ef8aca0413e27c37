/* report.h: one JSON object per command, whatever happens (language.md, Machine-readable output).
 *
 * With `--format json` a command prints its report with report_json; if it printed none (the
 * program has errors, a usage error, an internal failure), report_end prints
 * {"errors": [{"file": F, "line": L, "col": C, "message": "..."}], "warnings": [...]} from the
 * diagnostics the run reported (diag.h's sink), so that a script always reads one object. In
 * text mode both do nothing but print. */
#ifndef SHARDC_REPORT_H
#define SHARDC_REPORT_H

#include <cjson/cJSON.h>

#include "driver.h"

void report_begin(const Options *o);        /* collect diagnostics (JSON mode) */
void report_json(cJSON *obj);               /* prints obj to stdout, then deletes it (or hands it to
                                               the slot report_capture set) */
/* `report` runs check and sim in-process: while slot is set, report_json stores its object in
 * *slot (the caller deletes it) instead of printing it. NULL: print again. */
void report_capture(cJSON **slot);
cJSON *report_warnings(void);            /* the warnings reported so far (a new array; empty in text form) */
int report_end(const Options *o, int rc);   /* the errors object if nothing was printed; returns rc */
/* The columns text is wrapped to: the terminal's width when stdout is a terminal (at least 60),
 * else 100 (a file, a pipe: output that does not change with the window). */
int report_width(void);
/* `first`, then `text`'s words, wrapped at `width` columns, each further line starting with
 * `indent`; a newline at the end. A word longer than a line stays whole. */
void report_wrapped(FILE *out, int width, const char *first, const char *indent, const char *text);
/* The file of a place as reports print it: the path as given on the command line or resolved by
 * import (diagnostics print the same). */
const char *report_file(SrcLoc loc);
/* A time to 3 significant digits in s, ms, us or ns ("0" for none), in the arena. */
const char *report_seconds(Arena *a, double s);
#endif
