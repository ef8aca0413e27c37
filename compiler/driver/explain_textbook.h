/* explain_textbook.h: explain's section comparing a layer's collectives with the literature's
 * (analysis/textbook.h), as text and as JSON. */
#ifndef SHARDC_EXPLAIN_TEXTBOOK_H
#define SHARDC_EXPLAIN_TEXTBOOK_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "ir.h"
#include "program.h"

/* Prints the section (nothing when no strategy is recognised). */
void explain_textbook_text(FILE *out, Arena *a, const IrModule *m, const Program *p);

/* The rows as a JSON array (empty when no strategy is recognised). */
cJSON *explain_textbook_json(Arena *a, const IrModule *m, const Program *p);

#endif
