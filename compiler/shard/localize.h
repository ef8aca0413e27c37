/* localize.h: the partitioned IR as the program each device runs.
 *
 * In: a module after propagation and partitioning (every value sharded, every collective
 * inserted; ops may still read an operand "sliced" through Op.in_shard, or compute a block their
 * operands hold more of). Out: the same module where everything a device needs to run it is
 * stated (m->localized):
 *   - every value has its local extents (Value.local: the dim's size over the product of its axes);
 *   - every slice is an OP_SLICE (a device keeping a finer block of a value it holds): before an
 *     op that reads an operand finer than it is held, after an op whose result is sharded finer
 *     than what it computes from its operands (a split, a merge); Op.in_shard is gone;
 *   - every op that reads global indices has them as offsets (Op.offs: causal's and attention's
 *     query and key dims, take's table rows, take_grad's and onehot's rows, pick's dim, broadcast's
 *     added dims), every mean its global divisor (Op.divisor);
 *   - every collective its CollSpec: the dims it gathers, scatters or moves, each with its ordered
 *     axes (the rank order), or a permute's shift.
 * The interpreter runs this program and treats an implicit slice as an error; the LLVM lowering
 * and the simulator read the same facts. */
#ifndef SHARDC_LOCALIZE_H
#define SHARDC_LOCALIZE_H

#include "ir.h"

/* Localises m on p's mesh. Returns false (and reports a located error) if the partitioned IR has a
 * shape the per-device program cannot express (a partitioning bug, not a user error). */
bool localize_module(IrModule *m, const Program *p);

/* The local extent of dim `pos` of v under sharding s on mesh (the global size when mesh is NULL). */
int64_t localize_extent(const Mesh *mesh, const TensorType *t, const Sharding *s, int pos);

/* Counts, for a test, what localisation left implicit: ops with an in_shard, collectives without a
 * CollSpec, values without local extents, means without a divisor. 0 on a localised module. */
int localize_count_implicit(const IrModule *m);
#endif
