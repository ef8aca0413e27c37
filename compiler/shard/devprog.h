/* devprog.h: the device program (DevModule): what every device runs, stated once.
 *
 * In: a module after localisation and the pipeline split (localize.h, stages.h), and its mesh. Out:
 * the facts every executor needs about the devices, computed here and nowhere else, which the
 * interpreter's per-device mode, the LLVM lowering, the runtime's descriptors, the simulator,
 * explain's per-device rows and check's memory read (docs/passes.md, "The device program"):
 *
 *   - replica groups (DevGroups, XLA's replica_groups): for an ordered tuple of mesh axes, the
 *     devices split into ngroups groups of `size`, each listed in rank order (its coordinates on
 *     the tuple read as a mixed-radix number, the first axis most significant), and each device's
 *     group and rank. Interned: one DevGroups per tuple (and per subset: a tied param's first and
 *     last stage), shared by every op that runs over it.
 *   - per value (DevValue): its local shape, per dim the groups its blocks are dealt over (the
 *     device of rank r holds block r) and its storage order (natural, a causal ring's zigzag, an
 *     interleaved pipeline's stage-major rows), the stages holding it under a pipeline, and (once
 *     the buffer plan annotates it, analysis/pipeline.c) the value whose buffer it lives in.
 *   - per op (DevOp, Op.dev): the stages that run it (one predicate: dev_runs_on), the global
 *     offsets it reads (each an extent and the groups whose rank numbers the block), a
 *     collective's groups and parts (DevColl; a bucket's members run as ONE collective at the last
 *     of them), a ring attention's ring (DevRing: its groups in the key dim's tuple order, the
 *     steps, the bytes each step moves, the query and key orders).
 *   - a pipeline's stage groups (rank = stage), the send split's groups.
 *
 * The block a device holds: along a dim of extent E (local) dealt over groups G, it starts at
 * E x G.rank_of[device] in storage order (dev_block_start: the one formula). */
#ifndef SHARDC_DEVPROG_H
#define SHARDC_DEVPROG_H

#include "cost.h"
#include "ir.h"
#include "shardrt.h" /* RtOrder, rt_order_logical: the storage orders, shared with the runtime */

typedef struct DevGroups {
  int id;               /* its index in DevModule.groups */
  int naxes;
  int8_t axes[MAX_MESH_AXES]; /* the tuple, major first (axes of one device left out) */
  uint16_t mask;        /* the same axes as a set */
  int ngroups, size;
  const int32_t *members;  /* [ngroups * size]: group g's device of rank r at g * size + r */
  const int32_t *group_of; /* [devices]: each device's group, -1 outside every group (a subset) */
  const int32_t *rank_of;  /* [devices]: its rank there (-1 outside) */
  const char *text;     /* "(data, model)", "()" for a group of one */
  bool subset;          /* some ranks of the tuple's groups only (a tied param's first and last stage) */
} DevGroups;

typedef struct DevValue {
  const Value *v;
  int64_t local[MAX_RANK];            /* per dim its extent on a device */
  const DevGroups *groups[MAX_RANK];  /* per dim the groups its blocks are dealt over; NULL: whole */
  RtOrder order[MAX_RANK];            /* per dim its storage order */
  uint8_t place;                      /* PLACE_*: the stages holding it (main's values under a pipeline) */
  int32_t buffer;                     /* the buffer plan's: the value whose buffer it lives in; -1 unknown */
} DevValue;

typedef struct DevOffset {   /* a dim whose global index the op reads (localize.h's DimIndex) */
  const Dim *dim;
  int64_t extent;
  const DevGroups *groups;   /* the block's start on device d: extent x rank_of[d] */
} DevOffset;

typedef struct DevCollPart {
  int dim;                   /* the operand's dim it gathers, scatters, splits or concatenates (-1 none) */
  const DevGroups *groups;   /* over the part's axes, in rank order */
} DevCollPart;

typedef struct DevColl {
  CollKind kind;
  const DevGroups *groups;   /* the whole collective: its parts' axes in part order (all-reduce: the
                                op's axes in mesh order; a subset: a tied param's first and last stage) */
  DevCollPart parts[MAX_RANK];
  int nparts;
  int shift;                 /* permute: rank r sends to r + shift */
  int64_t period;            /* a pipeline's stage-to-stage permute inside a loop body: it moves its
                                operand once every `period` iterations (the layers per stage); 0 */
  bool reduce_max;
  /* buckets: a member that is not the last carries `lead`, the last carries every member in program
   * order; the whole bucket runs there as one collective of the members packed together */
  const Op *lead;
  const Op **members;
  int nmembers;
  double bytes;              /* the operand's bytes per device (all-gather: the result's), summed over a
                                bucket's members at its lead; what cost_collective calls `bytes` */
} DevColl;

typedef struct DevRing {
  uint16_t axes;             /* the ring's axes as partitioning chose them (size-1 axes included): the
                                Ulysses alternative explain prices runs over them */
  const DevGroups *groups;   /* the ring: the key dim's axes in the order its tuple lists them; the
                                key block of rank r is storage block r */
  int steps;                 /* n - 1 CollectivePermute steps (cost_ring) */
  double k_bytes, v_bytes;   /* the device's K and V blocks */
  double step_bytes;         /* what each step moves per device: the K and V blocks (and, in the
                                backward, their gradients; cost_ring) */
  bool carries;              /* the op that runs the ring (the forward, or the backward's dq) */
  RtOrder qorder, korder;    /* the query's and the key's storage orders */
} DevRing;

/* A collective matmul (language.md, Steps: tp_overlap; docs/passes.md, "Collective matmuls"):
 * a tensor-parallel AllGather whose readers are all contractions that keep the gathered dim (and
 * whose other operands lack it, or that contract it against an operand holding it whole), run
 * as a ring at the first of them: the device's own block and
 * then, step by step, the block of rank r - j (mod n) that n - 1 CollectivePermutes (+1 around the
 * collective's groups) bring, each permute posted before the partial contractions of the block at
 * hand and waited after them; each partial contraction writes its result's block along the
 * gathered dim, or (the dim contracted) adds its product with the other operand's block. The later readers run in the first's ring (their other operands exist there,
 * which is checked). The collective stays listed as the AllGather it implements (explain's
 * "overlapped": true); the gathered value is never made whole. shard/cmm.c chooses it where the
 * cost model says it pays.
 *
 * The ReduceScatter side (`scatter`): a tensor-parallel ReduceScatter whose operand is a
 * contraction's partial sum (read by it alone), scattering a dim the contraction keeps from one
 * operand (or from both: a batch dim), run as a ring at the contraction: step j = 0 .. n-1
 * computes the partial product of block (r - 1 - j) mod n along the scattered dim (the operands'
 * blocks along it against the rest whole), adds it to the accumulator the neighbour r - 1 sent
 * (step 0: none), and sends it on to r + 1 (n - 1 permutes of shift +1, each posted after a step's
 * addition and waited after the next step's partial contraction); the last step's block is r's
 * own, the result's. The ReduceScatter stays listed as itself ("overlapped": true); the partial
 * sum is never made whole. There nreaders = 1, readers[0] = contract = the contraction,
 * operand = an operand holding the scattered dim, dim_in = its position there, dim_w = its
 * position in the other operand (-1: lacks it), dim_out = its position in the contraction's
 * result (= the ReduceScatter's operand), block = the ReduceScatter result's extent along it. */
#define CMM_MAX_READERS 8
typedef struct DevCmm {
  const Op *coll;            /* the AllGather (or, scatter: the ReduceScatter) it implements */
  bool scatter;              /* the ReduceScatter side: a contraction feeding it */
  const Op *contract;        /* the first reader: the ring runs there */
  const Op *readers[CMM_MAX_READERS]; /* every contraction reading the gathered value, in program order */
  const Value *via[CMM_MAX_READERS];  /* what each reads: the gathered value, or a rename of it */
  int operand[CMM_MAX_READERS];       /* which operand of each reads it */
  int dim_out[CMM_MAX_READERS];       /* the gathered dim's position in each one's result; -1: contracted */
  int dim_w[CMM_MAX_READERS];         /* contracted: its position in the other operand (held whole),
                                         whose block r - j each step reads; the partial products are
                                         summed in f32 */
  int nreaders;
  const DevGroups *groups;   /* the ring: the collective's groups (rank r's block is block r) */
  int steps;                 /* n - 1 permutes of shift +1 */
  int dim_in;                /* the gathered dim's position in the AllGather's operand and result */
  int64_t block;             /* the block's extent along it (the operand's local extent) */
  double step_bytes;         /* one permute's bytes per device (the operand's block) */
  double contract_s;         /* the cost model's (calibrated) time of the contractions whole */
  double coll_s;             /* ... of the AllGather whole */
  double step_s;             /* ... of one permute */
  double chunk_s;            /* ... of one step's partial contractions */
  double pair_s;             /* the whole as a collective matmul: chunk + (n - 1) max(chunk, step) */
  const char *reason;        /* why (explain prints it) */
} DevCmm;

typedef struct DevOp {
  const Op *op;
  uint8_t runs;              /* PLACE_*: the stages that run it (an op of main under a pipeline) */
  DevOffset *offs;
  int noffs;
  DevColl *coll;
  DevRing *ring;
  DevCmm *cmm;               /* a collective matmul: on its AllGather and on its contraction */
  struct DevWindow *win;      /* a data-parallel collective's overlap window (shard/dpwin.h), or NULL */
} DevOp;

typedef struct DevPipe {
  const DevGroups *stages;   /* over the stage axes: a device's rank is its stage, its peer on stage s is
                                members[group * size + s] */
  const DevGroups *split;    /* the send split's groups (PipeInfo.send_split), or NULL */
} DevPipe;

typedef struct DevModule {
  Arena *arena;
  const IrModule *m;
  const Mesh *mesh;          /* NULL: the one-device program */
  int ndev;
  VEC(DevGroups *) groups;
  DevValue *values;          /* [nvalues + 1], by value id */
  int nvalues;
  DevPipe *pipe;             /* NULL without a pipeline */
  bool buffers;              /* the buffer plan has annotated DevValue.buffer */
} DevModule;

/* Builds m's device program on mesh (NULL: one device) into m->dev and every op's Op.dev. Works on
 * any partitioned module (the interpreter checks hand-made ones); a localised one gets its offsets
 * and collectives' parts, a pipelined one its stage groups. Returns false after a located internal
 * error (a module whose facts disagree: a bucket whose members cannot run as one collective, a ring
 * whose key dim is not sharded over exactly its axes). */
bool devprog_build(IrModule *m, const Mesh *mesh);
/* A device program with no values or ops yet: its interner, stages and orders (the interpreter's, for
 * a module without one: it reads blocks off the shardings it checks). */
DevModule *devprog_bare(Arena *a, const IrModule *m, const Mesh *mesh);

/* The groups over an ordered tuple of mesh axes (axes of one device are dropped; the empty tuple is
 * a group of one), interned. */
const DevGroups *dev_groups(DevModule *dm, const int8_t *axes, int naxes);
/* ... over a set of axes, in mesh order. */
const DevGroups *dev_groups_mask(DevModule *dm, uint16_t mask);
/* ... the subset of g's groups made of the ranks ranks[0..n) (in that order). */
const DevGroups *dev_groups_subset(DevModule *dm, const DevGroups *g, const int *ranks, int n);
/* ... of one dim of a sharding (its tuple). */
const DevGroups *dev_groups_of_dim(DevModule *dm, const Sharding *s, int dim);

/* ---- the one formula for blocks, and the one for stages ---- */

/* The start of device dev's block along a dim of local extent `extent` dealt over g (0 for NULL). */
int64_t dev_block_start(const DevGroups *g, int64_t dev, int64_t extent);
/* Device dev's block of a value of type t under sharding s: per dim its start (storage order) and
 * shape. */
void dev_sharding_block(DevModule *dm, const TensorType *t, const Sharding *s, int64_t dev, int64_t *start,
                        int64_t *shape);
/* ... of value v (its DevValue). */
void dev_value_block(const DevModule *dm, const Value *v, int64_t dev, int64_t *start, int64_t *shape);
/* The start of op's offset for dim d on device dev (0 when the op has none for it). */
int64_t dev_op_offset(const DevOp *o, const Dim *d, int64_t dev);

/* The stage of device dev (0 without a pipeline). */
int dev_stage(const DevModule *dm, int64_t dev);
/* Whether something placed `place` (PLACE_*, 0 everywhere) runs on stage s of p: THE stage predicate. */
bool dev_stage_runs(uint8_t place, int s, int p);
/* ... on device dev. */
bool dev_runs_on(const DevModule *dm, uint8_t place, int64_t dev);
/* The stages that run op (PLACE_*): its DevOp's `runs` (an op of main: where the pipeline split put
 * it; inside a loop or a pipeline region: its parent's or its region's stages). PLACE_ALL for an op
 * of a module without a device program (nothing is pipelined there). */
static inline uint8_t dev_op_runs(const Op *op) { return op->dev ? op->dev->runs : (uint8_t)PLACE_ALL; }
/* op's ring (ring attention), NULL for an op that is not one (or without a device program). */
static inline const struct DevRing *dev_op_ring(const Op *op) { return op->dev ? op->dev->ring : NULL; }
/* A collective among a subset of its groups' devices (a tied param's first and last stage): how many
 * (what cost_collective_group calls ngroup); 0 for one over whole groups. */
static inline int dev_op_subset(const Op *op) {
  const DevColl *c = op->dev ? op->dev->coll : NULL;
  return c && c->groups->subset ? c->groups->size : 0;
}
/* A pipeline's permute inside a loop body: its period in iterations (DevColl.period); 0 otherwise. */
static inline int64_t dev_op_period(const Op *op) { return op->dev && op->dev->coll ? op->dev->coll->period : 0; }
/* The offsets op reads (DevOp.offs), and how many (0 without a device program). */
static inline int dev_op_noffs(const Op *op) { return op->dev ? op->dev->noffs : 0; }

/* The logical position that storage position p holds along dim `dim` of v (its DevValue's order). */
int64_t dev_value_logical(const DevModule *dm, const Value *v, int dim, int64_t p);
/* The storage order of dim d in dm's program (every value with that dim keeps it; its position in
 * the value matters for the interleaved order, which is a stacked value's leading dim only). */
RtOrder dev_dim_order(const DevModule *dm, const Dim *d, int pos);

/* The first row, among the rows its stage holds, of model chunk g (0 .. p V - 1) of the pipeline's
 * stacked dim, found through its storage order (the one-device program: g Lc). */
int64_t dev_chunk_row0(const DevModule *dm, int g);

/* ---- what the host and the runtime are given ---- */

/* The RtDtype of a dtype, -1 for one the runtime lacks (i8). */
int devprog_rt_dtype(DType dt);
/* How value v of main is placed on the devices (the runtime's block placement, shardrt.h's RtPlace):
 * each device's block start, the devices holding it (its stages), which copy of each block is read
 * back (the first device in rank order of its group over the axes v is replicated over that holds
 * it), each dim's storage order. dm NULL: the one-device program (the whole tensor on device 0). The
 * arrays are dm's arena's (or a's). */
void devprog_place(DevModule *dm, Arena *a, const Value *v, RtPlace *out);

/* The devices whose view of what ran (the runtime's executed collectives) a run reports: one device
 * of each pipeline stage (device 0's stage group, in stage order), or device 0 alone; at most max
 * into out. Returns how many. */
int devprog_record_devices(const DevModule *dm, int32_t *out, int max);

/* The DevValue of v. */
static inline const DevValue *dev_value(const DevModule *dm, const Value *v) { return &dm->values[v->id]; }

/* Prints the program's replica groups (`--emit-ir`): `groups #3 (data, model): {0, 1, 2, 3} {4, ...}`. */
void devprog_print_groups(FILE *out, const DevModule *dm);
/* An op's device facts as --emit-ir prints them after its attributes (" ring #2 (b, a), 3 steps ..."). */
void devprog_print_op(FILE *out, const DevOp *o);
/* `--emit-ir`: the IR with each op's device facts, then the device count and every replica group
 * (ir_print when m has no device program). */
void devprog_print(FILE *out, const IrModule *m);
#endif
