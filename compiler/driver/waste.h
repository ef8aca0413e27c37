/* waste.h: setups that waste the machine, found from the device program (issue 22), each with a
 * fix that is checked in full before it is offered.
 *
 * In: a checked program after the pass pipeline (localised: every value with its sharding and
 * local extents, every collective with its axes and role). Out: findings, each a warning that
 * check, explain and sim print in their text summary and report in JSON `warnings`:
 *
 *   replicated axis   a mesh axis of more than one device, other than a pipeline's stage axes, over
 *                     which at least half of each device's FLOPs are computed the same on every
 *                     device of the axis: the op (a contraction, an attention, ...) is counted as
 *                     replicated over axis a when none of its results is split over a (no dim of
 *                     the result sharded over it, no partial sum over it) and it reads no operand
 *                     sliced over a (Op.in_shard). FLOPs are per device (opcost's local count,
 *                     recomputation included) times the runs a step makes of the op (loop trips,
 *                     microbatches, pipeline regions averaged over the stages). The message gives
 *                     the bound that follows: MFU <= model FLOPs / (devices x FLOPs per device).
 *                     Fixes tried, in order, each checked as the program it proposes (the IR, the
 *                     pass pipeline) and offered only when axis a then shards the compute: a `-D`
 *                     that lets a layout rule naming a apply where it is skipped for not dividing
 *                     its dim (the smallest multiple of the rule's devices, times the microbatches
 *                     for the step's batch); a to the layout's batch rule (or a new `batch: a`);
 *                     both.
 *   slow tensor       an axis whose devices do not share one fast domain (GPU: it straddles or
 *   parallelism       crosses NVLink domains; TPU: it rides DCN between slices) and that carries
 *                     per-layer activation collectives: AllGather, ReduceScatter or AllReduce of
 *                     an activation (CollRole ROLE_ACTIVATION) inside a stacked-layer loop (any
 *                     loop but the step's microbatch loop, a pipeline's chunk regions included).
 *                     The figure: those collectives' ideal time per step and device. The fix: the
 *                     mesh with that axis moved minor (`--mesh 'h100[data: 8, model: 8]'`), formed
 *                     and checked, offered when the axis then rides the fast links.
 * Nothing here depends on the names of dims or axes except the fix's wording (the step's
 * microbatched dim is `batch`, language.md's Steps). */
#ifndef SHARDC_WASTE_H
#define SHARDC_WASTE_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "pipeline.h"

typedef enum { WASTE_REPLICATED_AXIS, WASTE_SLOW_TP } WasteKind;

#define WASTE_REPLICATED_SHARE 0.5 /* a replicated axis: at least this share of a device's FLOPs */

typedef struct WasteFinding {
  WasteKind kind;
  int axis;              /* mesh axis index */
  SrcLoc loc;            /* the axis in the mesh declaration */
  double share;          /* replicated axis: the share of a device's FLOPs replicated over it */
  double mfu_bound;      /* replicated axis: model FLOPs / (devices x FLOPs per device), all axes */
  double comm_s;         /* slow TP: its per-layer activation collectives, ideal s per step and device */
  int64_t collectives;   /* slow TP: how many such collectives a step runs per device */
  const char *message;   /* one line, the fix included (arena) */
  const char *fix;       /* the fix alone: "-D batch=4096", "batch: (data, model) in layout fsdp",
                            "--mesh 'h100[data: 8, model: 8]'"; NULL when none was found */
  double fixed_share;    /* replicated axis: the share after the fix (checked) */
  double fixed_mfu_bound;
  double fixed_comm_s;   /* slow TP: after the fix (checked) */
} WasteFinding;

typedef struct WasteReport {
  WasteFinding *v;
  int n;
  double device_flops;   /* per device and step (averaged over a pipeline's stages) */
  double model_flops;    /* global, without recomputation */
} WasteReport;

/* The findings for cp (cp->ir after pipeline_run). Re-checks fixes quietly (no diagnostics). */
void waste_find(Arena *a, const CheckedProgram *cp, WasteReport *out);
/* Each finding as a located warning (diag.h: on stderr, and in JSON `warnings` through the sink). */
void waste_warn(const WasteReport *r);
/* The text summary's lines ("warnings:" and one line each); nothing when there are none. */
void waste_print(FILE *out, const WasteReport *r);
/* [{"kind": "replicated_axis"|"slow_tensor_parallelism", "axis", "message", "fix" (or null), then
 *   replicated_share, mfu_bound (and fixed_replicated_share, fixed_mfu_bound with a fix), or
 *   comm_s, collectives (and fixed_comm_s with a fix)}]: check's and sim's JSON `waste` */
cJSON *waste_json(const WasteReport *r, const Mesh *mesh);
#endif
