/* html_report.h: `shardc report`'s page: check's, sim's and the trace's JSON as one self-contained
 * HTML page (inline CSS and SVG, no script but the data block; nothing fetched from the network).
 *
 * The objects are embedded whole in <script type="application/json" id="shardc-data">
 * {"check": ..., "sim": ..., "explain_collectives": [...]} so a reader (the tests) can compare every figure with
 * `check --format json` and `sim --format json`; the figures drawn carry data-* attributes. */
#ifndef SHARDC_HTML_REPORT_H
#define SHARDC_HTML_REPORT_H

#include <stdio.h>

#include <cjson/cJSON.h>

/* Writes the page to out. check, sim and explain are the commands' JSON objects; trace the Chrome
 * trace of sim's step (NULL: no timeline); shows an array of `explain --show NAME`'s objects, one
 * per param drawn, omitted how many more were left out; title is the program's path. */
void html_report_write(FILE *out, const char *title, const cJSON *check, const cJSON *sim, const cJSON *explain,
                       const cJSON *trace, const cJSON *shows, int omitted);

#endif
