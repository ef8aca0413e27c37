/* shardrt.h: the shardc runtime, the one header the code shardc generates includes.
 *
 * A program sharded over a device mesh runs here as one thread per device. The launcher
 * (rt_open, rt_run) starts the threads; each runs the same entry function with its own RtDevice,
 * through which it allocates its buffers, takes part in collectives with the other devices of
 * its groups, and reports failures. Compute helpers (GEMM, dtype conversions, a counter-based
 * random generator) are plain functions.
 *
 * Conventions (docs/runtime.md has them with examples):
 *   - Devices are numbered major to minor over the mesh axes, the last axis varying fastest.
 *   - A collective runs over an ordered tuple of mesh axes (a1, ..., ak), as a dim's sharding
 *     lists them. The group of a device is the devices that differ from it only on those axes;
 *     its rank in the group is its coordinates on a1..ak read as a mixed-radix number, a1 most
 *     significant. Block r of a gathered or scattered dim belongs to rank r.
 *   - Reductions add (or take the maximum) in rank order, accumulating bf16 and f16 in f32 and
 *     rounding once (round to nearest even), so every run gives the same bits.
 *   - Every call that can fail returns an RtStatus: RT_OK (0), or an error after which the
 *     device function should unwind (`if (rc) return rc;`). The first failure of a run stops
 *     every device; rt_run returns its code and rt_errmsg its message, which names the device.
 *
 * Thread safety: a Runtime runs one rt_run at a time, and only one rt_run per process at a time
 * (it sets OpenBLAS's process-wide thread count). An RtDevice belongs to its thread during a
 * run, and to the host thread between runs. */
#ifndef SHARDRT_H
#define SHARDRT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RT_MAX_AXES 8              /* mesh axes */
#define RT_MAX_RANK 8              /* dims of a tensor shape passed to the runtime */
#define RT_DEFAULT_MAX_DEVICES 64  /* device threads, unless RtConfig.max_devices says otherwise */
#define RT_HARD_MAX_DEVICES 4096   /* the most RtConfig.max_devices may allow */
#define RT_DEFAULT_TIMEOUT_S 60.0  /* longest wait in a collective or a recv */

/* ---- status codes: X(name, description), in the order of their values ---- */
#define RT_STATUS_LIST(X)                                                   \
  X(OK, "ok")                                                               \
  X(E_ARG, "invalid argument")                                              \
  X(E_LIMIT, "over a limit of the runtime")                                 \
  X(E_NOMEM, "out of memory")                                               \
  X(E_TIMEOUT, "timed out")                                                 \
  X(E_FAILED, "the device failed")                                          \
  X(E_STOPPED, "stopped because another device failed")                     \
  X(E_MISMATCH, "the devices of a group called different collectives")      \
  X(E_SYS, "system error")

typedef enum {
#define RT_X(name, text) RT_##name,
  RT_STATUS_LIST(RT_X)
#undef RT_X
} RtStatus;

const char *rt_status_name(int status); /* "RT_E_TIMEOUT" */

/* ---- element types: X(name, text, bytes) ----
 * bf16 and f16 are stored at their width as uint16_t bit patterns, f8e4m3 and f8e5m2 as uint8_t
 * ones (OCP FP8: E4M3FN saturating at 448, E5M2 with infinities; runtime/dtype.h). */
#define RT_DTYPE_LIST(X)   \
  X(F32, "f32", 4)         \
  X(BF16, "bf16", 2)       \
  X(F16, "f16", 2)         \
  X(I32, "i32", 4)         \
  X(F8E4M3, "f8e4m3", 1)   \
  X(F8E5M2, "f8e5m2", 1)

typedef enum {
#define RT_X(name, text, bytes) RT_##name,
  RT_DTYPE_LIST(RT_X)
#undef RT_X
  RT_DTYPE_COUNT
} RtDtype;

size_t rt_dtype_size(RtDtype dt);      /* bytes per element; 0 for an unknown dtype */
const char *rt_dtype_name(RtDtype dt); /* "bf16" */

typedef enum { RT_SUM, RT_MAX } RtReduceOp;

/* ---- the launcher ---- */

typedef struct Runtime Runtime;   /* one per program run; owns the devices */
typedef struct RtDevice RtDevice; /* one device: its thread, its buffers, its place in the mesh */

/* What runs on each device thread. Returns RT_OK, or the status of the call that failed. */
typedef int (*RtEntry)(RtDevice *dev, void *arg);

/* threads: one process, one thread per device. mpi: one process (MPI rank) per threads_per_rank
 * devices, started by mpirun (docs/runtime.md, "The MPI backend"; the process must have called
 * rt_mpi_init, shardrt_mpi.h). */
typedef enum { RT_BACKEND_THREADS, RT_BACKEND_MPI } RtBackendKind;

/* Zero-initialised fields take their defaults, so `RtConfig c = {0}` plus a mesh is a config. */
typedef struct RtConfig {
  int naxes;                            /* 0..RT_MAX_AXES; 0 is a single device */
  int axis_size[RT_MAX_AXES];           /* major to minor, each >= 1 */
  const char *axis_name[RT_MAX_AXES];   /* for messages (copied); NULL: "a0", "a1", ... */
  int max_devices;                      /* 0: RT_DEFAULT_MAX_DEVICES; at most RT_HARD_MAX_DEVICES */
  double timeout_s;                     /* per wait; 0: RT_DEFAULT_TIMEOUT_S */
  size_t mem_cap;                       /* bytes per device (the target's HBM); 0: no cap */
  int64_t fail_alloc_nth;               /* tests: the Nth allocation (from 1) on a device fails; 0: none */
  int fail_alloc_device;                /* ... on this device; -1: on every device */
  int pack_members;                     /* tests: rt_collective packs a bucket's members into one buffer
                                           even where the backend moves them in place */
  RtBackendKind backend;                /* how devices exchange data */
  struct RtRouteLog *route_log;         /* rt_nn_route's decisions shared with another run, or NULL */
  int route_mode;                       /* RtRouteMode: what this run does with route_log */
  int threads_per_rank;                 /* mpi: device threads in each rank (0: 1); ranks = devices / it */
} RtConfig;

/* ---- routing decisions shared between two runs (route_log.c) ----
 * Top-k routing is discontinuous: where two of a token's logits are nearly equal, rounding alone
 * (a gate's partial sums rounded under tensor parallelism) can flip its choice between the sharded
 * and the one-device run. To compare the two with the same routing, the one-device run records
 * (RT_ROUTE_RECORD) every group's logits and choices; the sharded run (RT_ROUTE_FOLLOW) finds the
 * recorded group its own logits match (the nearest, within 1/16 of their largest magnitude) and,
 * for a token whose choices differ, takes the recorded ones where they are within rounding of its
 * own: each recorded choice's logit at least its own choice's minus twice the largest difference
 * between the two runs' logits for that token. Any other difference stands (and shows in the
 * comparison). Decisions are counted: rt_route_log_followed. */
typedef enum { RT_ROUTE_OWN, RT_ROUTE_RECORD, RT_ROUTE_FOLLOW } RtRouteMode;
typedef struct RtRouteLog RtRouteLog;
RtRouteLog *rt_route_log_new(void);   /* NULL: out of memory */
void rt_route_log_clear(RtRouteLog *log); /* forget the recorded decisions (before a step) */
void rt_route_log_free(RtRouteLog *log);
/* Tokens a following run routed, and those whose choices it took from the log. */
void rt_route_log_counts(const RtRouteLog *log, int64_t *tokens, int64_t *followed);
/* Under MPI (rank 0 alone runs the one-device program, which records): rank 0's recorded decisions
 * copied to every other rank's log, so that the sharded run's devices follow them in every process.
 * Each process calls it after the recording run's step and before the following run's. Returns 0
 * (on every process) when a process ran out of host memory: then no rank follows any decision.
 * Under threads: nothing to do (1). The counts of rt_route_log_counts are then those of rank 0's
 * devices. */
int rt_route_log_share(Runtime *rt, RtRouteLog *log);

/* Creates the runtime for a mesh. As with sqlite3_open, *out is set even on failure (except out
 * of memory, where it is NULL): read rt_errmsg, then rt_close it. A mesh with more devices than
 * the limit is refused with RT_E_LIMIT and a message giving both numbers. */
int rt_open(const RtConfig *cfg, Runtime **out);

/* Runs fn(dev, arg) on one thread per device and waits for all of them. OpenBLAS is held to one
 * thread for the run (then restored). Returns RT_OK, or the first failure's status; its message
 * is rt_errmsg. Buffers outlive the run: what the devices leave allocated is still there. */
int rt_run(Runtime *rt, RtEntry fn, void *arg);

const char *rt_errmsg(const Runtime *rt); /* "" when nothing failed */
void rt_close(Runtime *rt);               /* frees every buffer still allocated */

int rt_device_count(const Runtime *rt);
/* A device for the host to allocate on between runs (inputs, params kept across steps). */
RtDevice *rt_device(Runtime *rt, int index);

typedef struct RtStats {
  size_t mem_current;   /* bytes allocated on the device now */
  size_t mem_peak;      /* the most ever allocated at once */
  size_t mem_cap;       /* 0: no cap */
  uint64_t allocs;      /* allocations so far (failed ones included) */
  uint64_t collectives; /* collective, barrier, send and recv calls in the last run */
  double coll_seconds;  /* wall time spent inside them in the last run, waiting included */
  double sim_compute_s; /* the simulated clock of the last run (rt_clock_add): compute kernels */
  double sim_comm_s;    /* ... and collectives */
} RtStats;
int rt_stats(const Runtime *rt, int device, RtStats *out);

/* ---- processes: which devices this process runs ----
 * Under threads one process runs every device. Under mpi, rank r runs devices r T .. r T + T - 1
 * (T = threads_per_rank): the host places inputs and reads results on its own devices only
 * (rt_alloc refuses another process's device), rt_stats covers every device after a run (the
 * ranks exchange their figures at its end), and process 0 gathers what is printed or saved. */
int rt_device_local(const Runtime *rt, int device); /* 1: this process runs it */
int rt_process_rank(const Runtime *rt);             /* 0 under threads */
int rt_process_count(const Runtime *rt);            /* 1 under threads */
/* A device's buffer, on process 0. Every process calls it for the same device and bytes, in the
 * same order (between runs); `buf` is the device's buffer where the device is local (NULL: it
 * holds none). Process 0 gets `buf` when the device is its own, else `scratch` (bytes long)
 * filled from the owner, or NULL when the owner holds none; the other processes get NULL. */
const void *rt_fetch_to_root(Runtime *rt, int device, const void *buf, size_t bytes, void *scratch);
/* Whether every process got through a step of the host's (placing the inputs, say): each calls it
 * with its ok (nonzero) and its error message; 1 if all are ok, else 0 and, on every process, msg
 * holds the message of the lowest rank that failed. Under threads: ok. */
int rt_processes_agree(Runtime *rt, int ok, char *msg, size_t n);
/* Process 0's `bytes` at buf copied to buf on every process (each calls it, in the same order,
 * between runs, with the same bytes): the one-device run's state (rank 0's alone) handed to the
 * sharded run's ranks in lockstep. Under threads: nothing to do. */
void rt_bcast_from_root(Runtime *rt, void *buf, size_t bytes);

/* ---- inside a device function ---- */

/* The device's simulated clock: generated code adds the time the simulated target (shardc sim's
 * model) takes for each kernel it runs, stream RT_CLOCK_COMPUTE or RT_CLOCK_COMM; rt_stats reads
 * the sums of the last run. The device's own thread only. */
enum { RT_CLOCK_COMPUTE, RT_CLOCK_COMM };
void rt_clock_add(RtDevice *dev, int stream, double seconds);

int rt_device_index(const RtDevice *dev);
int rt_device_coord(const RtDevice *dev, int axis); /* -1 for an axis the mesh lacks */
/* Generated code, before each op: its source line, which failure and timeout messages name
 * ("device 2 [x=2]: line 14: all_reduce over (x) timed out ..."). The device's own thread only. */
void rt_at_line(RtDevice *dev, int line);

/* Fails this device and stops the run: every device waiting in the runtime wakes and returns
 * RT_E_STOPPED. The message (printf format) should say what failed and where, e.g.
 * "line 12: take: index 70 out of range [0, 64)"; the runtime prefixes the device. Returns
 * RT_E_FAILED, so `return rt_fail(dev, ...);` unwinds. */
int rt_fail(RtDevice *dev, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* RT_E_STOPPED once the run is stopping, else RT_OK: for long loops that call nothing else. */
int rt_check(RtDevice *dev);

/* ---- memory: every per-device buffer comes from here ----
 * Allocates `bytes` (64-byte aligned, not zeroed) on the device's account, named for messages
 * ("blocks.attn.wq", "h1 grad"). Over the cap, or an injected failure, fails the device with a
 * message naming it, the buffer and the sizes, and returns RT_E_NOMEM. */
int rt_alloc(RtDevice *dev, size_t bytes, const char *name, void **out);
/* Frees a buffer from rt_alloc (NULL: nothing), on whichever device's account it is. A pointer
 * rt_alloc did not return is caught (RT_E_ARG) by its missing header, as far as reading the 128
 * bytes before it is safe; freeing twice is undefined, as with free. */
int rt_free(RtDevice *dev, void *p);

/* ---- replica groups ----
 * Every collective runs over replica groups the compiler computed (its device program,
 * compiler/shard/devprog.h; XLA's replica_groups): the devices split into `ngroups` groups of
 * `size`, each listed in rank order, with each device's group and rank. The groups over an ordered
 * axis tuple (a1, ..., ak) are the devices equal off the tuple, ranked by their coordinates on
 * a1..ak read as a mixed-radix number (a1 most significant); `axes` names the tuple (for messages,
 * and for a backend's bookkeeping: groups over the same axes are the same groups), `text` is
 * "(a1, a2)". A subset (a tied param's first and last pipeline stage) leaves some devices in no
 * group (group_of -1). The runtime looks groups up; it never works them out. An MPI backend makes
 * one communicator per RtGroups: MPI_Comm_split(colour = group_of[me], key = rank_of[me]). */
typedef struct RtGroups {
  int32_t naxes;
  int32_t axes[RT_MAX_AXES];   /* the tuple, major first */
  int32_t ngroups, size;
  int32_t subset;              /* nonzero: some devices are in no group */
  const int32_t *members;      /* [ngroups * size]: group g's rank r at g * size + r */
  const int32_t *group_of;     /* [devices]: each device's group, -1 in none */
  const int32_t *rank_of;      /* [devices]: its rank there */
  const char *text;            /* "(data, model)" */
} RtGroups;

/* ---- collectives ----
 * Every device of a group must make the same call (kind, dtype, sizes, groups); a mismatch fails
 * with RT_E_MISMATCH rather than exchanging garbage. `in` and `out` must not overlap unless
 * stated. Sizes are in elements. A device in none of the groups fails (RT_E_ARG). */

/* in: [outer, extent, inner] row-major; out: [outer, n*extent, inner], the group's blocks in rank
 * order along the middle dim. */
int rt_all_gather(RtDevice *dev, const RtGroups *g, RtDtype dt, const void *in, void *out, int64_t outer, int64_t extent,
                  int64_t inner);

/* in: [outer, n*extent, inner]; out: [outer, extent, inner], rank r keeps the reduction of block
 * r over the group. Float dtypes (and i32, wrapping). */
int rt_reduce_scatter(RtDevice *dev, const RtGroups *g, RtDtype dt, RtReduceOp op, const void *in, void *out,
                      int64_t outer, int64_t extent, int64_t inner);

/* count elements, reduced over the group; in == out is allowed. */
int rt_all_reduce(RtDevice *dev, const RtGroups *g, RtDtype dt, RtReduceOp op, const void *in, void *out, int64_t count);

/* in has the row-major shape `shape` (ndims dims). Dim split_dim is cut into n blocks, block j
 * sent to rank j; out has the received blocks concatenated in rank order along concat_dim
 * (out's shape: shape[split_dim] / n there, shape[concat_dim] * n there; the same dim is
 * allowed). */
int rt_all_to_all(RtDevice *dev, const RtGroups *g, RtDtype dt, const void *in, void *out, int ndims,
                  const int64_t *shape, int split_dim, int concat_dim);

/* Ring shift: rank r sends its count elements to rank (r + shift) mod n and receives from
 * (r - shift) mod n. */
int rt_permute_shift(RtDevice *dev, const RtGroups *g, RtDtype dt, const void *in, void *out, int64_t count, int shift);
/* Explicit pairs of group ranks, pairs[2i] sends to pairs[2i+1]; each rank sends at most once
 * and receives at most once. A rank that receives nothing gets zeros (as XLA does). */
int rt_permute_pairs(RtDevice *dev, const RtGroups *g, RtDtype dt, const void *in, void *out, int64_t count,
                     const int *pairs, int npairs);

/* Waits for the whole group. */
int rt_barrier(RtDevice *dev, const RtGroups *g);

/* A permute that overlaps computation: _start posts the ring shift and returns with *req without
 * waiting for any peer; the device computes (it may call other collectives too), then
 * rt_wait(dev, req) completes it. Every member starts the same permutes in the same order; a
 * device may hold up to RT_MAX_POSTED and wait for them in any order, and must wait for each (a
 * request is freed by its wait; a device that returns with one not waited for fails the run).
 * The buffers belong to the transfer from _start until rt_wait returns:
 *   - a sender must not write `in` before its wait returns (a peer copies from it meanwhile;
 *     reading it is fine);
 *   - a receiver must not read or write `out` before its wait returns (a peer copies into it).
 * In debug builds and under the sanitizers the threads backend checks them: `in` is hashed at the
 * post and at the wait (a change fails the run, RT_E_ARG), and `out` is filled with 0xff bytes
 * at the post (a premature read sees NaNs). Under threads the block is copied by whichever of
 * the sender and the receiver waits first once both have posted; under mpi, while the device
 * computes (MPI_Isend/MPI_Irecv). */
#define RT_MAX_POSTED 16
typedef struct RtRequest RtRequest;
int rt_permute_shift_start(RtDevice *dev, const RtGroups *g, RtDtype dt, const void *in, void *out, int64_t count,
                           int shift, RtRequest **req);
int rt_wait(RtDevice *dev, RtRequest *req);

/* Point to point between any two devices (by index). send copies the bytes and returns at once
 * (the copy is on the sender's account until received); recv blocks until the matching send
 * (same source, same tag; in send order per source and tag) and its size must match. Tags are
 * >= 0 (MPI's). */
int rt_send(RtDevice *dev, int dst, int tag, const void *buf, size_t bytes);
int rt_recv(RtDevice *dev, int src, int tag, void *buf, size_t bytes);

/* An AllReduce among the members of dev's group of a subset (a tied param's first and last
 * pipeline stage): every member sends its count elements to the others (rt_send, tag
 * RT_TAG_GROUP) and sums what it has in rank order, in f64, rounded once to dt, so every member
 * ends with the same bits; in == out is allowed. */
#define RT_TAG_GROUP 0x7f000000
int rt_all_reduce_group(RtDevice *dev, const RtGroups *g, RtDtype dt, RtReduceOp op, const void *in, void *out,
                        int64_t count);

/* ---- one collective of the program: what the generated code calls ----
 * The lowering emits, per collective of the device program (and per bucket: its members packed
 * together, docs/passes.md), a constant RtColl and one call of rt_collective with the members'
 * operand and result buffers. The members' blocks are packed into one buffer, the collective runs
 * once over c->groups, and each member's blocks are unpacked where its parts put them: along part
 * p's dim, the block of the device of rank r in c->groups goes to position parts[p].groups's rank
 * of that device (so a member's own rank order need not be the call's). One member of one part (or
 * an all-reduce, an all-to-all, a permute of one member) runs in place of the buffers, unpacked.
 * A subset's all-reduce is rt_all_reduce_group. */
#define RT_COLL_KINDS(X)              \
  X(ALL_GATHER, "all_gather")         \
  X(REDUCE_SCATTER, "reduce_scatter") \
  X(ALL_REDUCE, "all_reduce")         \
  X(ALL_TO_ALL, "all_to_all")         \
  X(PERMUTE, "collective_permute")
enum {
#define RT_X(name, text) RT_##name,
  RT_COLL_KINDS(RT_X)
#undef RT_X
};
typedef struct RtCollPart {
  int32_t dim;                 /* the member's dim it gathers (all-gather) or scatters (reduce-scatter) */
  const RtGroups *groups;      /* whose rank places the block along it */
} RtCollPart;
typedef struct RtCollMember {
  int32_t rank;
  int64_t shape[RT_MAX_RANK];  /* its operand's local shape */
  int32_t nparts;
  RtCollPart parts[RT_MAX_RANK];
} RtCollMember;
typedef struct RtColl {
  int32_t kind;                /* RT_ALL_GATHER, ... */
  int32_t dtype;               /* RtDtype */
  int32_t op;                  /* RtReduceOp */
  int32_t shift;               /* a permute's */
  int32_t split_dim, concat_dim; /* an all-to-all's */
  const RtGroups *groups;
  int32_t nmembers;
  const RtCollMember *members;
} RtColl;
int rt_collective(RtDevice *dev, const RtColl *c, const void *const *in, void *const *out);

/* ---- what ran ----
 * The collectives each device executed in the last run, aggregated: kind (an RT_ALL_GATHER ...),
 * the axes as a set (bit a: mesh axis a), what the device sends for one of them as `explain`
 * defines it (language.md: all-gather (n-1)/n x the gathered array, reduce-scatter (n-1)/n x its
 * input, all-reduce 2(n-1)/n x the array, all-to-all (n-1)/n x the local shard, a permute or a
 * pipeline transfer the bytes sent), and how many ran. A bucket or a multi-part collective is one;
 * a ring attention's step moves K and V as one permute. Returns the number of kinds (filling at
 * most n of them), or -1 when the counts are incomplete (out of host memory) or not in this process
 * (under MPI, a device another rank runs). */
typedef struct RtExecuted {
  int32_t kind;
  uint32_t axes;
  double bytes_per_device;
  int64_t count;
} RtExecuted;
int rt_executed(const Runtime *rt, int device, RtExecuted *out, int n);

/* ---- pipelines (pipeline.c): a device runs its stage's actions ----
 * The lowering makes one function per region (what a stage runs per microbatch and chunk: the
 * embedding, a chunk of layers forward or backward, the loss, the embedding's gradient) and a
 * constant RtPipe describing the schedule; rt_pipeline runs on each device the action list of the
 * device's stage in order: a region bound to its inputs (a microbatch's row of a sliced operand,
 * a chunk's rows of a stacked one, the activation that arrived, the residuals its forward kept),
 * its outputs routed (an activation to the mailbox, residuals to the store, gradients added in
 * f32 into the accumulators), sends and receives with rt_send / rt_recv to the device of the peer
 * stage with the same coordinates elsewhere. Tags: (direction, slot, microbatch), distinct. */
typedef int (*RtRegionFn)(RtDevice *dev, void **in, void **out);
enum { RT_PR_FIRST, RT_PR_CHUNK_FWD, RT_PR_LAST, RT_PR_CHUNK_BWD, RT_PR_FIRST_BWD, RT_PR_COUNT };
enum { RT_PIN_ENV, RT_PIN_ACT, RT_PIN_CHUNK, RT_PIN_SAVED };            /* ir.h's PipeInKind */
enum { RT_POUT_ACT, RT_POUT_SAVE, RT_POUT_ACC, RT_POUT_RESULT };       /* ir.h's PipeOutKind */
enum { RT_PA_FIRST, RT_PA_FWD, RT_PA_LAST, RT_PA_BWD, RT_PA_FIRST_BWD, RT_PA_SEND, RT_PA_RECV };
typedef struct RtPipeSlot {
  int32_t kind, index;          /* RT_PIN_* / RT_POUT_*, and the operand, result or residual */
  int32_t dtype;                /* RtDtype of the value */
  int64_t count;                /* its elements on this device */
} RtPipeSlot;
typedef struct RtPipeAction {
  int32_t kind, backward, mb, chunk, peer; /* ir.h's PipeAction */
  int64_t row0;                          /* a chunk region's: the chunk's first row among the stacked
                                            rows the stage holds (their storage order's) */
} RtPipeAction;
typedef struct RtPipe {
  int32_t stages, chunks, microbatches;  /* p, V, N */
  int64_t chunk_layers;                  /* Lc */
  const RtGroups *stage_groups;          /* over the stage axes: a device's rank is its stage, its peer on
                                            stage s the member of rank s of its group */
  const RtGroups *split;                 /* the send split (Megatron): each member sends 1/n, the receivers
                                            all-gather; NULL: none */
  int32_t nslices, ncarried, noperands, nresults, nsave;
  const int64_t *row_bytes;              /* per operand: bytes of one row of its leading dim */
  const int32_t *acc_dtype;              /* per carried result: RtDtype */
  const int64_t *acc_count;              /* ... elements on this device */
  const uint8_t *result_on;              /* [nresults * stages]: 1 where stage s holds result k (k * stages + s);
                                            NULL: every stage holds every result */
  RtRegionFn region[RT_PR_COUNT];        /* NULL: none */
  int32_t nin[RT_PR_COUNT], nout[RT_PR_COUNT];
  const RtPipeSlot *in[RT_PR_COUNT], *out[RT_PR_COUNT];
  const RtPipeAction *actions;           /* every stage's, stage 0's first */
  const int32_t *first_action;           /* [stages + 1] */
  const char *where;                     /* "file:line" of the pipeline, for messages */
  /* the simulated clock (rt_clock_add): after each run of region r, clock_acc[r] of compute (its
   * f32 gradient accumulation); at each send, clock_send[r] of communication, r the region run
   * last (none yet: first forward, last backward) */
  double clock_acc[RT_PR_COUNT], clock_send[RT_PR_COUNT];
} RtPipe;
/* Runs the device's stage of the pipeline. operands: the pipeline op's (NULL where the device does
 * not hold one); results: set to new buffers (the accumulators, which start as copies of the
 * carried operands; NULL on a stage that does not hold a result). */
int rt_pipeline(RtDevice *dev, const RtPipe *p, void *const *operands, void **results);

/* ---- compute helpers ---- */

/* C = alpha op(A) op(B) + beta C, row-major, products accumulated in f32 and C rounded once to
 * its dtype. Leading dims and batch strides are in elements; batch 0 or 1 is one product; a
 * stride of 0 shares that operand across the batch. The engine (OpenBLAS's sgemm or oneDNN's
 * matmul, bf16 natively where the CPU has it, else bf16 and f16 widened to f32 through rt_alloc'd
 * scratch) is chosen per shape by a measured rule (gemm.c, docs/runtime.md "GEMM engines"). */
typedef struct RtGemm {
  RtDtype a_type, b_type, c_type; /* RT_F32, RT_BF16 or RT_F16 */
  int trans_a, trans_b;           /* nonzero: op(X) = X transposed */
  int64_t m, n, k;                /* op(A) is m x k, op(B) k x n, C m x n */
  int64_t batch;
  const void *a;
  int64_t lda, stride_a;
  const void *b;
  int64_t ldb, stride_b;
  void *c;
  int64_t ldc, stride_c;
  float alpha, beta;
} RtGemm;
int rt_gemm(RtDevice *dev, const RtGemm *g);

/* The engine of a device's products: RT_GEMM_AUTO is gemm.c's rule; the others force one (benches,
 * tests; SHARDC_GEMM=auto|openblas|onednn-f32|onednn sets every device's at rt_open).
 * RT_GEMM_ONEDNN_F32 widens bf16 and f16 operands as OpenBLAS does; RT_GEMM_ONEDNN takes them as
 * they are (emulated where the CPU has no bf16 units). A product oneDNN has no implementation
 * for runs on OpenBLAS. The device's own thread, or the host between runs. */
typedef enum { RT_GEMM_AUTO, RT_GEMM_OPENBLAS, RT_GEMM_ONEDNN_F32, RT_GEMM_ONEDNN } RtGemmEngine;
int rt_gemm_engine(RtDevice *dev, RtGemmEngine e);
/* What the rule picks for g on this CPU (the engine AUTO runs, before any fallback). */
RtGemmEngine rt_gemm_choice(const RtGemm *g);
const char *rt_gemm_engine_name(RtGemmEngine e);
/* oneDNN primitives this runtime created, and products that reused one (created once per shape). */
int rt_gemm_cache_stats(const Runtime *rt, uint64_t *created, uint64_t *reused);
/* The OpenMP team size a oneDNN product would use on the calling thread (1 on a device thread). */
int rt_gemm_threads(void);

/* The CPU, detected at run time (cpuid, and oneDNN's own ISA query, which ONEDNN_MAX_CPU_ISA can
 * lower): what the GEMM rule decides on. */
enum { RT_CPU_AVX512F = 1, RT_CPU_AVX512_BF16 = 2, RT_CPU_AVX512_FP16 = 4, RT_CPU_AMX_TILE = 8, RT_CPU_AMX_BF16 = 16 };
typedef struct RtCpu {
  unsigned features;      /* RT_CPU_* from cpuid */
  bool bf16_native;       /* oneDNN runs bf16 products on AVX512-BF16 or AMX units */
  bool amx;               /* ... on AMX tiles */
  const char *dnnl_isa;   /* oneDNN's effective ISA, "avx512_core_vnni" */
  char dnnl_version[16];  /* "2.6.3" */
} RtCpu;
const RtCpu *rt_cpu(void);

/* Conversions, round to nearest even; NaN stays NaN, overflow goes to infinity. */
uint16_t rt_f32_to_bf16(float x);
float rt_bf16_to_f32(uint16_t h);
uint16_t rt_f32_to_f16(float x);
float rt_f16_to_f32(uint16_t h);
/* FP8 (runtime/dtype.h): f8e4m3 saturates at +-448 (infinity too), f8e5m2 overflows to infinity. */
uint8_t rt_f32_to_f8e4m3(float x);
float rt_f8e4m3_to_f32(uint8_t c);
uint8_t rt_f32_to_f8e5m2(float x);
float rt_f8e5m2_to_f32(uint8_t c);
/* count elements between float dtypes (any pair; f16 <-> bf16 goes through f32, exactly), or
 * i32 to i32. */
int rt_convert(void *dst, RtDtype dst_type, const void *src, RtDtype src_type, size_t count);

/* Counter-based random numbers: a pure function of (seed, tensor, global element index), so a
 * device generates exactly its shard and every device count sees the same values:
 *   key  = mix(seed ^ mix(tensor + G)),  bits = mix(key + (index + 1) * G)
 * with G = 0x9e3779b97f4a7c15 and mix splitmix64's finaliser (docs/runtime.md). */
uint64_t rt_random_bits(uint64_t seed, uint64_t tensor, uint64_t index);
/* Uniform in [lo, hi): lo + (hi - lo) * u, u the top 24 bits over 2^24, in double, as f32. */
float rt_random_float(uint64_t seed, uint64_t tensor, uint64_t index, float lo, float hi);
/* Uniform integer in [lo, hi), hi > lo: lo + ((bits >> 32) * (hi - lo) >> 32). */
int32_t rt_random_int(uint64_t seed, uint64_t tensor, uint64_t index, int32_t lo, int32_t hi);

/* Storage orders: storage position p of a dim holds logical position rt_order_logical(o, p).
 *   RT_ORDER_NATURAL      p itself.
 *   RT_ORDER_ZIGZAG       a causal ring's balance over n devices: the dim is cut into 2n chunks of
 *                         `chunk`, and storage block b (2 chunk long: device b's) holds chunks b and
 *                         2n-1-b, so every device keeps as many unmasked pairs.
 *   RT_ORDER_INTERLEAVED  a pipeline's stacked dim under interleaved(v) over n stages, chunks of
 *                         `chunk` layers: stage-major, storage row (s v + c) chunk + j holds the
 *                         model's layer (c n + s) chunk + j (stage s's chunks c = 0..v-1).
 * The one definition of both orders: the compiler (compiler/shard/devprog.c), the runtime's ring
 * kernel and its block placement all call it. Every field an int64_t, so the lowering emits an
 * RtOrder as a constant. */
enum { RT_ORDER_NATURAL, RT_ORDER_ZIGZAG, RT_ORDER_INTERLEAVED };
typedef struct RtOrder {
  int64_t kind, n, v, chunk;
} RtOrder;
static inline int64_t rt_order_logical(const RtOrder *o, int64_t p) {
  if (!o || o->chunk <= 0) return p;
  if (o->kind == RT_ORDER_ZIGZAG && o->n >= 2) {
    int64_t c = o->chunk, b = p / (2 * c), r = p % (2 * c);
    return (r < c ? b : 2 * o->n - 1 - b) * c + r % c;
  }
  if (o->kind == RT_ORDER_INTERLEAVED && o->v > 1 && o->n > 0) {
    int64_t g = p / o->chunk, j = p % o->chunk, stage = g / o->v, c = g % o->v;
    return (c * o->n + stage) * o->chunk + j;
  }
  return p;
}

/* A block of a row-major tensor: `shape` elements from `start` along each of the global dims. */
typedef struct RtBlock {
  int ndims;
  int64_t global[RT_MAX_RANK];
  int64_t start[RT_MAX_RANK];
  int64_t shape[RT_MAX_RANK];
} RtBlock;
/* Fills out (the block, row-major, of dtype dt) with the values of the global tensor: floats
 * uniform in [lo, hi) rounded to dt, i32 uniform integers in [lo, hi). */
int rt_random_fill(void *out, RtDtype dt, const RtBlock *block, uint64_t seed, uint64_t tensor, double lo,
                   double hi);

/* ---- block placement (place.c): a whole tensor's blocks onto the devices, and back ----
 * What `shardc run` and a built executable do with a program's inputs, params and outputs, from a
 * description the compiler makes from its device program (compiler/shard/devprog.h). Device d's
 * block is `local` elements from start[d] along each dim, in storage positions; storage position q
 * of dim k holds logical position rt_order_logical(&order[k], q). */
typedef struct RtPlace {
  int32_t dtype;             /* RtDtype */
  int32_t rank;
  int32_t ndev;
  int32_t partial;           /* nonzero: the blocks are partial sums (rt_place_gather adds them) */
  int64_t global[RT_MAX_RANK];
  int64_t local[RT_MAX_RANK];
  RtOrder order[RT_MAX_RANK];
  const int64_t *start;      /* [ndev * rank]: device d's block starts; NULL: 0 */
  const uint8_t *holds;      /* [ndev]: whether device d holds a block (a pipeline's stages); NULL: all */
  const uint8_t *take;       /* [ndev]: whether rt_place_gather reads device d's block (one copy of each
                                block, every summand of a partial sum); NULL: all */
} RtPlace;
int64_t rt_place_elements(const RtPlace *p); /* of one block */
bool rt_place_holds(const RtPlace *p, int dev);
/* Fills out (device dev's block, row-major, p->dtype) from `global` (the whole tensor, row-major in
 * logical order) or, global NULL, with the values rt_random_fill gives each global index (seed, key,
 * lo, hi; lo == hi: that constant). */
int rt_place_fill(const RtPlace *p, int dev, void *out, const double *global, uint64_t seed, uint64_t key, double lo,
                  double hi);
/* Writes (partial: adds) device dev's block into `global` where p->take reads it; nothing elsewhere. */
int rt_place_gather(const RtPlace *p, int dev, const void *block, double *global);

/* ---- neural-network kernels (nn.c), for the ops shardc lowers to calls ----
 * They match the reference interpreter's semantics (docs/interpreter.md): f32 storage or bf16/f16 at
 * their width, computed in double within a row, rounded once on store.
 *
 * RtRows describes an op over one dim (the row) of tensors sharing an outer index space: `nd` outer
 * dims of extents `extent`, and per tensor t (in each kernel's stated order) its element strides
 * along them (`stride[t]`, 0 where the tensor lacks the dim), along the row (`row_stride[t]`), and
 * its RtDtype. Every field is an int64_t so that generated code can emit it as a constant array. */
#define RT_NN_DIMS 8
#define RT_NN_TENSORS 5
typedef struct RtRows {
  int64_t nd;
  int64_t extent[RT_NN_DIMS];
  int64_t stride[RT_NN_TENSORS][RT_NN_DIMS];
  int64_t n;                          /* the row's length here */
  int64_t row_stride[RT_NN_TENSORS];
  int64_t dtype[RT_NN_TENSORS];
  int64_t size;                       /* the row dim's global size (the norms' means) */
} RtRows;

/* y = softmax(x) along the row (tensors x, y); a row of -inf only gives zeros. */
void rt_nn_softmax(const RtRows *r, const void *x, void *y);
/* rmsnorm (layer 0) or layernorm (layer 1, with bias) along the row, epsilon 1e-5 (tensors x,
 * scale, bias, y; bias NULL for rmsnorm). */
void rt_nn_norm(const RtRows *r, int layer, const void *x, const void *scale, const void *bias, void *y);
/* dx = y (dy - sum(dy y)) (tensors y, dy, dx). */
void rt_nn_softmax_grad(const RtRows *r, const void *y, const void *dy, void *dx);
/* The norms' input gradient, ir.h's OP_RMSNORM_GRAD / OP_LAYERNORM_GRAD (tensors x, scale, dy, dx). */
void rt_nn_norm_grad(const RtRows *r, int layer, const void *x, const void *scale, const void *dy, void *dx);
/* Cross entropy along the class row: out = logsumexp(logits) - logits[label] (tensors logits,
 * labels, out; out's row stride 0); with dl (grad != 0: tensors logits, labels, dl, dx): dx =
 * (softmax(logits) - onehot(label)) dl. A label outside [0, n) fails the device, naming `line`. */
int rt_nn_cross_entropy(RtDevice *dev, const RtRows *r, int grad, const void *logits, const int32_t *labels,
                        const void *dl, void *out, int line);
/* take(table, idx): for each index (outer dims: tensors idx, out) the table's row idx - row_offset
 * (row_elems contiguous elements, tensor 1's dtype) into out, zeros where the row is not held here
 * (rows_local rows from row_offset); an index outside [0, rows_global) fails the device. */
int rt_nn_take(RtDevice *dev, const RtRows *r, const int32_t *idx, const void *table, void *out, int64_t rows_local,
               int64_t row_offset, int64_t rows_global, int64_t row_elems, int line);
/* take's gradient: out (rows_local x row_elems, tensor 1's dtype) = per row the sum, in f32, of dy's
 * rows (outer dims: tensors idx, dy) whose index names it. */
int rt_nn_take_grad(RtDevice *dev, const RtRows *r, const int32_t *idx, const void *dy, void *out, int64_t rows_local,
                    int64_t row_offset, int64_t rows_global, int64_t row_elems, int line);

/* onehot along the row (tensors out, idx; idx's row stride 0): out = 1 where idx == row_offset + j,
 * else 0. pick along the row (tensors x, idx, out): out = x[idx - row_offset] where that is inside
 * the row held here, else 0. An index outside [0, size) fails the device. */
int rt_nn_onehot(RtDevice *dev, const RtRows *r, const int32_t *idx, void *out, int64_t row_offset, int line);
int rt_nn_pick(RtDevice *dev, const RtRows *r, const void *x, const int32_t *idx, void *out, int64_t row_offset, int line);

/* max's gradient along the row (tensors x, y, dy, dx; y and dy with row stride 0): dx = dy / n
 * where x equals the row's max y, else 0; n counts the row's ties. */
void rt_nn_max_grad(const RtRows *r, const void *x, const void *y, const void *dy, void *dx);

/* route (ir.h's OP_ROUTE): per group (the outer dims; tensors logits, out) each of T tokens picks
 * its k largest of E logits (ties to the lower index; NaN lowest); expert slots fill with every
 * first choice in token order, then every second, ...; a choice finding its expert's C slots full
 * is dropped. out (f32, out_elems elements, zeroed here) gets 1 at [token, expert, slot]. Strides:
 * the logits' along experts and tokens (le, lt), out's along experts, tokens and slots. Token order
 * is logical: order (or NULL: storage order is logical) gives the storage position of the i-th
 * token, for a sequence stored in a causal ring's zigzag order. */
int rt_nn_route(RtDevice *dev, const RtRows *r, int k, int64_t E, int64_t T, int64_t C, int64_t le, int64_t lt, int64_t re,
                int64_t rtk, int64_t rc, const void *logits, float *out, int64_t out_elems, const int64_t *order);

/* Fused attention over an index space: `nb` batch dims, the query dim (nq), the key dim (nk), the
 * head dim contracted in q.k (nh) and the value dim (nv). Tensors q, k, v, o, do; their strides
 * along each (0 where a tensor lacks the dim) and dtypes; dq, dk, dv have q's, k's and v's types.
 * o = softmax(scale q.k, causally masked where k_off + key > q_off + query) . v. */
typedef struct RtAttn {
  int64_t nb;
  int64_t extent[RT_NN_DIMS];
  int64_t stride[RT_NN_TENSORS][RT_NN_DIMS];
  int64_t nq, nk, nh, nv;
  int64_t sq[RT_NN_TENSORS], sk[RT_NN_TENSORS], sh[RT_NN_TENSORS], sv[RT_NN_TENSORS];
  int64_t dtype[RT_NN_TENSORS];
  int64_t causal;
} RtAttn;
int rt_nn_attention(RtDevice *dev, const RtAttn *a, double scale, int64_t q_off, int64_t k_off, const void *q,
                    const void *k, const void *v, void *o);
/* The gradients (ir.h's OP_ATTENTION_GRAD), each summed over the dims its tensor lacks; dq, dk or
 * dv NULL: not stored (all three are computed). */
int rt_nn_attention_grad(RtDevice *dev, const RtAttn *a, double scale, int64_t q_off, int64_t k_off, const void *q,
                         const void *k, const void *v, const void *o, const void *dout, void *dq, void *dk, void *dv);

/* Ring attention (context parallelism; nn_ring.c): the key dim is split over the ring, `groups`
 * (the device program's: over the key dim's axes in their tuple's order): rank r holds key block r
 * (keys r * nk .. r * nk + nk - 1, storage positions), and q, o, do this device's query block
 * (from q_off). The K/V blocks travel the ring by rt_permute_shift(+1), n - 1 steps (K and V of
 * one dtype as one permute), block r - j (mod n) at hand at step j, merged by online softmax
 * (running row max and sum). The causal mask compares the logical positions the query's and the
 * keys' storage positions hold (qorder, korder: a causal ring's zigzag order). */
typedef struct RtRing {
  const RtGroups *groups;
  RtOrder qorder, korder;
} RtRing;
int rt_nn_ring_attention(RtDevice *dev, const RtAttn *a, const RtRing *ring, double scale, int64_t q_off, const void *q,
                         const void *k, const void *v, void *o);
/* One gradient of a ring attention into out (which: 0 dq, 1 dk, 2 dv; out has q's, k's or v's
 * layout and dtype): each query row's logsumexp over every key block first (K goes round once),
 * then K/V go round again; dq sums over the blocks that visit, dk and dv travel with their blocks
 * (one more shift brings each home). */
int rt_nn_ring_attention_grad(RtDevice *dev, const RtAttn *a, const RtRing *ring, double scale, int64_t q_off,
                              const void *q, const void *k, const void *v, const void *o, const void *dout, int which,
                              void *out);

/* ---- stand-alone programs (launch.c): what `shardc build` links ----
 * A built executable holds the program lowered twice (for the mesh and for one device) and this
 * description of its slots; rt_launch_main runs both as `shardc run` does and prints its report. */
typedef struct RtSlotDesc {
  RtPlace sharded;                  /* its blocks in the per-device program (the device program's) */
  RtPlace whole;                    /* ... in the one-device program: the whole tensor on device 0 */
  uint64_t key;                     /* inputs and params: rt_random_fill's tensor key */
  double lo, hi;                    /* ... its range (lo == hi: that constant) */
} RtSlotDesc;

typedef struct RtProgram {
  const char *name;                 /* the source file */
  const char *mesh;                 /* the mesh's name, for the report */
  int naxes;
  int axis_size[RT_MAX_AXES];
  const char *axis_name[RT_MAX_AXES];
  RtEntry reference, device;        /* the one-device and the per-device functions */
  int nin, nparams, nout;           /* slots: inputs, params, outputs */
  const RtSlotDesc *slots;          /* nin + nparams + nout of them */
  int step;                         /* a train step: output 0 is the loss */
  int nt;                           /* adam's step count input, or -1 */
  int ncarry;                       /* carried slots after a step: carry[2i] (an input or param slot) */
  const int *carry;                 /* takes output carry[2i + 1] */
  const struct RtCmpDesc *cmp;      /* per output: how it is compared (verdict.h, docs/run.md) */
  double lr;                        /* a train step's learning rate (adam's updates are checked) */
  uint64_t seed;                    /* the inputs' and params' seed (fixed when built) */
  const char *target;               /* the mesh's target, whose model the simulated clock keeps */
  double sim_compute_s, sim_comm_s, sim_step_s; /* `shardc sim`'s figures for the program (-1: none) */
  int nexecuted;                    /* the devices whose executed collectives the JSON report gives (their */
  const int32_t *executed;          /* counts averaged: one device of each pipeline stage, or device 0) */
  int backend;                      /* RtBackendKind: RT_BACKEND_MPI in an executable built with
                                       --backend mpi (its main is rt_mpi_main, shardrt_mpi.h) */
} RtProgram;

/* main() of a built executable: options --steps N --seed N --timeout S --hbm BYTES --format
 * text|json --no-reference, under mpi --threads-per-rank T (each also --opt=VALUE), --help; returns
 * the exit status (0 PASS or --help, 1 FAIL or a failure, 2 a usage error). */
int rt_launch_main(int argc, char **argv, const RtProgram *p);

/* ---- command-line values (args.c): a built executable and shardc parse their options alike ---- */
#define RT_MAX_STEPS 1000000       /* --steps N: 1 ..= this */
#define RT_MAX_TIMEOUT_S 1e6       /* --timeout S: > 0 and at most this */
/* argv[*i]'s value when it is option opt: `opt VALUE` (*i then moves to VALUE) or `opt=VALUE`;
 * NULL when argv[*i] is something else; "" when the value is missing. */
const char *rt_arg_value(int argc, char **argv, int *i, const char *opt);
/* s as a decimal integer in [min, max]: digits only (no sign, space, base prefix or suffix), no
 * overflow. 1 and *out set on success, else 0. */
int rt_arg_uint(const char *s, uint64_t min, uint64_t max, uint64_t *out);
/* s as seconds: a finite number > 0 and at most RT_MAX_TIMEOUT_S (not nan, inf, 0 or "5s"). */
int rt_arg_seconds(const char *s, double *out);

/* Wall-clock seconds from an arbitrary origin (CLOCK_MONOTONIC). */
double rt_seconds(void);

#endif
