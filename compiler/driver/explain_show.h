/* explain_show.h: `shardc explain --show NAME`: which block of a value each device holds, drawn as
 * a grid over the mesh axes, as jax.debug.visualize_array_sharding draws one.
 *
 * NAME is a param's path (`w_in`, `blocks.attn.wq`), an input of the entry, or a named value of the
 * program (a `let`; the first binding in program order when the name is bound again, and NAME@LINE
 * the binding at that source line). The grid's
 * rows are the blocks of the value's first sharded dim, its columns those of the other sharded
 * dims together (the last varying fastest); each cell names the devices holding that block, by
 * their index in the mesh (major axis first: device = sum of coordinate x the product of the sizes
 * of the axes after it). A value sharded over no axis is one cell holding every device; a partial
 * sum says over which axes the devices of a cell hold different terms of it. */
#ifndef SHARDC_EXPLAIN_SHOW_H
#define SHARDC_EXPLAIN_SHOW_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "ir.h"

/* The value NAME (or NAME@LINE) shows, or NULL (then *why holds the usage message, with a
 * did-you-mean or the lines NAME is bound at). *note: where NAME is bound at several lines, which
 * one this is and how to pick another; else NULL. */
const Value *explain_show_find(Arena *a, const IrModule *m, const char *name, const char **why, const char **note);

/* The grid, as text. */
void explain_show_text(FILE *out, Arena *a, const IrModule *m, const Program *p, const char *name, const Value *v);

/* The grid as JSON: {"name", "sharding", "mesh", "devices", "sharded_dims": [{"dim", "axes",
 * "blocks"}, ...] (the rows' dim first), "rows", "columns", "cells": the drawn rows of cells
 * [{"devices": "0-3, 8-11", "count", "block": [{"dim", "range": "0:256"}, ...]}], "partial": [axes]}. */
cJSON *explain_show_json(Arena *a, const IrModule *m, const Program *p, const char *name, const Value *v);
#endif
