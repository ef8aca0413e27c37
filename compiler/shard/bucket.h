/* bucket.h: small collectives of weights and gradients fused into buckets, as PyTorch DDP and
 * FSDP do (docs/passes.md, "Buckets").
 *
 * A bucket is a run of collectives of one kind, over the same axes, in one function and phase,
 * each of a weight (an AllGather of a param's shard) or of a gradient (an AllReduce or a
 * ReduceScatter whose result becomes a param's gradient), each smaller than BUCKET_CAP_BYTES per
 * device, together at most that size (one larger collective is a bucket of its own and is not
 * marked). The pass moves the members next to each other (a reduction waits for the bucket's last
 * gradient; a gather runs where the bucket's first weight is needed) and marks them with one
 * Op.bucket number: every consumer (explain, sim, the runtime) treats the members as one
 * collective of their summed bytes, which pays the link's latency once. The members keep their
 * own operands and results, so what each device computes does not change. */
#ifndef SHARDC_BUCKET_H
#define SHARDC_BUCKET_H

#include "ir.h"
#include "program.h"

/* PyTorch DDP's default bucket_cap_mb (25 MiB). */
#define BUCKET_CAP_BYTES (25ll << 20)

/* Forms the buckets of every function of m and sets every collective's Op.role; returns how many
 * buckets it formed. */
int bucket_module(IrModule *m, const Program *p);

#endif
