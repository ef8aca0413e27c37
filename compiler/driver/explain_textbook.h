/* explain_textbook.h: explain's section comparing a layer's collectives with the literature's
 * (analysis/textbook.h), as text and as JSON; and the line explain and sim print where a plan the
 * layout forbids would move less (IrModule.weigh). */
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

/* Where a plan the layout forbids would be cheaper (IrModule.weigh: propagation weighed the plan it
 * finds without the layout's binding, and never took it), the one line explain and sim print: the
 * collective time it would save per step and the layout rule that forbids it; else NULL. */
const char *layout_weigh_text(Arena *a, const IrModule *m, const Program *p);
/* The same as a JSON object ("forbidden_cheaper"), or a JSON null. */
cJSON *layout_weigh_json(Arena *a, const IrModule *m, const Program *p);

#endif
