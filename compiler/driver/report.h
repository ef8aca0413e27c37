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
void report_json(cJSON *obj);               /* prints obj to stdout, then deletes it */
int report_end(const Options *o, int rc);   /* the errors object if nothing was printed; returns rc */
/* The file of a place as reports print it: the path as given on the command line or resolved by
 * import (diagnostics print the same). */
const char *report_file(SrcLoc loc);
#endif
