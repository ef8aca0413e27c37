/* table.h: check, explain and sim over several --layout and --mesh values: one row per
 * combination (layouts outer, meshes inner, in command-line order), as one aligned table, or with
 * --format json one object {"rows": [...]}, each row the command's own JSON object for that
 * combination with "layout" and "mesh" set to the values asked for (null: the program's first).
 * Each row runs in a child process of its own, so that rows share no state and a row's errors stay
 * in its row. The exit code is the worst row's: 0 all good, 1 a row whose program is wrong or does
 * not fit, 2 a row with a usage error (an unknown layout or mesh). */
#ifndef SHARDC_TABLE_H
#define SHARDC_TABLE_H

#include "driver.h"

int table_run(const Options *o, int (*cmd)(const Options *));
#endif
