/* shard.h: giving every IR value a sharding.
 *
 * Boundary values (inputs, params, typed lets, function arguments and results) take what their
 * written type and the layout say (layout_apply); intermediates are inferred by propagation
 * (propagate.h: factor-based, forward and backward through every op, conflicts decided by the cost
 * of the collectives they imply). shard_assign is the entry point the other stages call. */
#ifndef SHARDC_SHARD_H
#define SHARDC_SHARD_H

#include "ir.h"

void shard_assign(IrModule *m, const Program *p);
#endif
