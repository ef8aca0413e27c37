/* textbook.h: a layer's collectives against what the literature says its strategy needs.
 *
 * layer_census() counts the collectives of one layer (one iteration of the stacked loop, forward
 * and backward with its recomputation), per microbatch, by role (bucket.h's CollRole) and kind.
 * textbook_compare() recognises the strategies the plan uses and states, for each, the textbook's
 * figure next to the plan's:
 *   Megatron tensor parallelism (Shoeybi et al. 2019): per layer 2 AllReduces of the activation
 *     forward and 2 backward, 2 more when the backward recomputes the block (remat = full); the
 *     recompute of the block's last one may drop (its result is never read);
 *   Megatron sequence parallelism (Korthikanti et al. 2022): each AllReduce becomes an AllGather
 *     and a ReduceScatter of the same activation: at most 6 and 6 under full recomputation;
 *   FSDP (Zhao et al. 2023; ZeRO-3): per weight an AllGather forward, another backward, and one
 *     ReduceScatter of its gradient;
 *   data parallelism (PyTorch DDP): the gradients all-reduced once per step, one run per bucket;
 *   ZeRO-1/2 (Rajbhandari et al. 2020): a ReduceScatter of every gradient and an AllGather of every
 *     updated param, no AllReduce of a gradient;
 *   pipelines: one send forward and one back per microbatch and stage boundary;
 *   context parallelism (ring attention; Liu et al. 2023, Megatron-LM's context parallelism): n - 1
 *     steps of K and V per forward, n - 1 of K, V and their gradients per backward, n - 1 more
 *     where the backward recomputes the forward;
 *   expert parallelism (GShard, Lepikhin et al. 2021): per layer an AllToAll of the dispatched
 *     slots to their experts and one of the experts' outputs back, forward and backward, 2 more
 *     when the backward recomputes the block, each (n-1)/n of the dispatch buffer a device holds.
 * The bytes of an activation collective are (n-1)/n (AllGather, ReduceScatter) or 2(n-1)/n
 * (AllReduce) times the layer's activation [batch, seq, embed] as one microbatch holds it on a
 * device with the tensor-parallel axes gathered. */
#ifndef SHARDC_TEXTBOOK_H
#define SHARDC_TEXTBOOK_H

#include "cost.h"
#include "ir.h"
#include "program.h"

enum { CENSUS_KINDS = 5 }; /* AllGather, ReduceScatter, AllReduce, AllToAll, CollectivePermute */

typedef struct LayerCensus {
  const Op *loop;                         /* the forward's stacked loop; NULL: no layer */
  int n[3][CENSUS_KINDS];                 /* per CollRole and kind: ops in one layer, once each */
  int runs[3][CENSUS_KINDS];              /* the same, a bucket counted once */
  double bytes[3][CENSUS_KINDS];          /* bytes per device (cost_collective's), summed */
  double time_s[3][CENSUS_KINDS];         /* cost_collective's ideal time, summed */
  uint16_t axes[3];                       /* the axes the role's collectives run over */
  uint16_t dp;                            /* the axes sharding `batch` */
  int grad_scatters_dp;                   /* gradient ReduceScatters over (some of) dp in the layer */
  uint16_t ring;                          /* the axes of the layer's ring attentions, or 0 */
  int ring_steps;                         /* their CollectivePermute steps (n - 1 per ring: the
                                             forward's, the backward's, a recomputed forward's) */
  double ring_bytes;                      /* bytes per device of one forward step (K and V) */
  int nweights;                           /* stacked params the layer reads */
  int nweights_gathered;                  /* of which gathered (FSDP) */
  /* expert parallelism (route.h): the AllToAlls that take dispatched slots to their experts and
   * back, and the collectives of routed values, apart from the roles above */
  int ep_n[CENSUS_KINDS];
  double ep_bytes[CENSUS_KINDS];
  uint16_t ep_axes;
  double ep_slot_bytes;                   /* the forward's dispatch buffer as a device holds it */
  int nweights_ep;                        /* stacked params sharded over a batch axis on a route's
                                             expert dim and never gathered (not FSDP's) */
} LayerCensus;

/* Counts the layer's collectives: the first stacked loop of the step (or forward) that is not the
 * microbatch loop, with the backward's loop over the same stacked dim; inside a pipeline, a chunk
 * region's loops, divided by the layers of a chunk. */
void layer_census(const IrModule *m, const Mesh *mesh, LayerCensus *c);

typedef struct TextbookRow {
  const char *strategy;                   /* "Megatron sequence parallelism over model" */
  const char *source;                     /* "Korthikanti et al. 2022" */
  CollKind kind;
  int got, want;                          /* ops per layer and microbatch (or per step), and at most
                                             (-1: the book has no figure for this plan) */
  int runs;                               /* the plan's runs (buckets counted once) */
  double got_bytes, want_bytes;           /* bytes per device of one, as the plan and the book have it;
                                             want_bytes 0: no claim */
  const char *per;                        /* "per layer and microbatch", "per step" */
  bool differs;                           /* more than the book */
} TextbookRow;

enum { TEXTBOOK_MAX_ROWS = 16 };

/* The rows for the strategies m's plan uses (none recognised: 0). */
int textbook_compare(Arena *a, const IrModule *m, const Program *p, const LayerCensus *c, TextbookRow *rows);

#endif
