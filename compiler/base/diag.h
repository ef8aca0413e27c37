/* diag.h: diagnostics for every stage.
 *
 * Text form (default):
 *   file:line:col: error: message
 *    12 |   let h = x @ w
 *       |           ^~~~~
 * Machine form (--diag-format=machine), one line each:  error|file|line|col|message, where the file
 * and the message write `\` as `\\`, `|` as `\|` and a newline as `\n`.
 * Notes attach to the diagnostic before them ("to close '{' at line 12"). Stages collect errors and
 * go on; the driver skips later stages once diag_error_count() > 0. */
#ifndef SHARDC_DIAG_H
#define SHARDC_DIAG_H

#include <stdio.h>
#include "common.h"

typedef enum { DIAG_ERROR, DIAG_WARNING, DIAG_NOTE } DiagLevel;
typedef enum { DIAG_TEXT, DIAG_MACHINE } DiagFormat;

void diag_configure(FILE *out, DiagFormat fmt, bool color);
void diag_reset(void); /* forget counts (tests, fuzzer) */
void diag_error(SrcLoc loc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void diag_warning(SrcLoc loc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void diag_note(SrcLoc loc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A usage problem (a bad --mesh, -D naming no dim): "shardc: message" on the diagnostics' stream in
 * every format, not counted as an error of the program (the command exits 2), passed to the sink. */
void diag_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int diag_error_count(void);
int diag_warning_count(void);
/* Would a diagnostic of this level reported now be printed (not dropped by the limit or by quiet)?
 * For work only the printed text needs, such as a did-you-mean search, so that a flood of
 * diagnostics stays linear. */
bool diag_would_show(DiagLevel level);
/* Stop printing errors after this many errors, and warnings after this many warnings (a flood
 * helps nobody); counts keep going. Default 50; 0 means no limit. */
void diag_set_error_limit(int n);
/* Say how many diagnostics the limit kept back, if any ("shardc: 12 more errors and 3 more
 * warnings not shown (the limit is 50 of each)"). The driver calls it once before exiting. */
void diag_finish(void);
/* Every diagnostic counted (errors and warnings, also those the limit does not print; notes too)
 * is passed to `sink` as well, with its message formatted: the driver collects them for the
 * `errors` of a JSON report. NULL: none. */
typedef void (*DiagSink)(DiagLevel level, SrcLoc loc, const char *message, void *ctx);
void diag_set_sink(DiagSink sink, void *ctx);

/* Between push and pop (they nest), diagnostics are dropped: neither printed nor counted. For
 * trial runs of a stage whose complaints belong to the real run (memory.c's suggestions). */
void diag_push_quiet(void);
void diag_pop_quiet(void);
/* Errors dropped while quiet, ever, at the outermost level only (a trial run compares the count
 * before and after it: did the changed program have errors? A quiet section inside it, such as
 * sema's build of unused library models, drops errors that are no one's). */
int diag_quiet_error_count(void);

#endif
