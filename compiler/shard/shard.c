/* shard.c: a sharding for every IR value (see shard.h): propagation (propagate.c) decides. */
#include "propagate.h"
#include "shard.h"

void shard_assign(IrModule *m, const Program *p) { propagate_module(m, p); }
