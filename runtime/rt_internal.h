/* rt_internal.h: what the runtime's files share and the generated code never sees: the Runtime
 * and RtDevice structs, groups, the description of one collective call, and each file's
 * internal functions (prefixed by file: rtrun_ runtime.c, rtmem_ alloc.c, rtsync_ sync.c,
 * rtk_ kernels.c). The backend interface is backend.h. */
#ifndef SHARDRT_INTERNAL_H
#define SHARDRT_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "shardrt.h"

#define RT_MASKS (1 << RT_MAX_AXES) /* axis subsets: one barrier counter each per group */
#define RT_ERR_MAX 1024             /* bytes of the first failure's message */
#define RT_NAME_MAX 32              /* bytes of an axis name */
#define RT_LABEL_MAX 160            /* "device 3 [data=1, model=1]" */

/* Collective kinds, X(name, text): the text is the kind's name in messages and in
 * `explain --format json`. */
#define RT_COLL_LIST(X)               \
  X(ALL_GATHER, "all_gather")         \
  X(REDUCE_SCATTER, "reduce_scatter") \
  X(ALL_REDUCE, "all_reduce")         \
  X(ALL_TO_ALL, "all_to_all")         \
  X(PERMUTE, "collective_permute")    \
  X(BARRIER, "barrier")               \
  X(SEND, "send")                     \
  X(RECV, "recv")

typedef enum {
#define RT_X(name, text) RT_COLL_##name,
  RT_COLL_LIST(RT_X)
#undef RT_X
  RT_COLL_COUNT
} RtCollKind;

const char *rtrun_coll_name(RtCollKind k);

/* A device's bytes (alloc.c). Guarded by `lock`: a received message is freed by its receiver
 * on its sender's account. */
#define RT_SPARE_SLOTS 16           /* freed large buffers a device keeps for reuse (alloc.c) */
#define RT_SPARE_MIN (1u << 20)      /* ... each at least this many bytes */
typedef struct RtAccount {
  pthread_mutex_t lock;
  size_t current, peak; /* bytes */
  uint64_t allocs;
  struct RtBufHeader *live; /* every buffer not yet freed */
  struct RtBufHeader *spare[RT_SPARE_SLOTS]; /* freed, kept for an allocation of the same size */
  size_t spare_bytes;
} RtAccount;

/* What a device is doing, for timeout messages: RtCollKind + 1 (0: running its own code) in
 * the low byte, the group's axis mask in the next, a recv's source + 1 above. */
#define RT_WHERE(kind, mask, peer) \
  ((uint64_t)((kind) + 1) | (uint64_t)(mask) << 8 | (uint64_t)((peer) + 1) << 16)

struct RtDevice {
  Runtime *rt;
  int index;
  int coord[RT_MAX_AXES];
  char label[RT_LABEL_MAX]; /* "device 3 [data=1, model=1]" */
  RtAccount mem;
  _Atomic uint64_t where;   /* RT_WHERE */
  _Atomic int done;         /* returned from its entry function in this run */
  double spin_s;            /* how long this device spins before sleeping, learnt (sync.c; own thread) */
  uint64_t ncoll;           /* this run's collective calls (own thread only) */
  double coll_seconds;
  RtExecuted *executed;     /* this run's collectives, aggregated (rt_executed; own thread only) */
  int nexecuted, cap_executed;
  bool executed_lost;       /* a count could not be kept (out of host memory) */
  double clock[2];          /* the simulated clock (rt_clock_add; own thread only) */
  _Atomic int line;         /* the source line of the op it runs (rt_at_line; 0: unknown) */
  _Atomic int32_t *line_mirror; /* mpi: the same in the launcher's status file (NULL: none) */
  pthread_t thread;
  int rc;                   /* what the entry function returned */
  /* Sleeping (sync.c), on a cache line of its own: the bell this device sleeps on now (NULL
   * awake), and its own bell (for a recv) with the count of its sleepers. */
  _Alignas(64) _Atomic uint32_t *_Atomic sleep_bell;
  _Atomic uint32_t bell;
  _Atomic uint32_t sleepers;
  /* GEMM (gemm.c, gemm_dnnl.c; own thread only) */
  int gemm_engine;          /* RtGemmEngine: AUTO or forced */
  int omp_saved;            /* the thread's OpenMP team size before the run (restored after) */
  struct RtDnnlDev *dnnl;   /* its oneDNN stream and scratchpad, made at its first oneDNN product */
};

struct Runtime {
  int naxes;
  int axis_size[RT_MAX_AXES];
  int64_t axis_stride[RT_MAX_AXES]; /* devices between neighbours along the axis */
  char axis_name[RT_MAX_AXES][RT_NAME_MAX];
  int ndev;
  double timeout_s;
  size_t mem_cap;
  int64_t fail_alloc_nth;
  int fail_alloc_device;
  bool pack_members;
  double spin_s;    /* the most a waiter spins before it sleeps (sync.c); 0: never spins */
  const struct RtBackend *backend;
  void *backend_state;
  int threads_per_rank;  /* mpi: devices per process (1 under threads: unused) */
  int local_lo, local_hi; /* the devices this process runs: [local_lo, local_hi) */
  int process_rank, process_count;
  RtDevice *devices; /* [ndev] */
  struct RtDnnl *dnnl;  /* oneDNN's engine and the cache of primitives (gemm_dnnl.c) */
  int gemm_engine;      /* RtGemmEngine every device starts with (SHARDC_GEMM) */
  bool gemm_trace;      /* SHARDC_GEMM_TRACE: every product's shape and engine on stderr */
  RtEntry entry;
  void *entry_arg;

  struct RtRouteLog *route_log; /* RtConfig's; route_log.c */
  int route_mode;

  _Atomic int stopped;     /* a device failed: every wait ends */
  pthread_mutex_t err_lock;
  int err_code;            /* the first failure's status */
  char err[RT_ERR_MAX];    /* its message */
};

/* A device's group, looked up in the replica groups the call names (collective.c). */
typedef struct RtGroup {
  const RtGroups *G;       /* the replica groups */
  int group;               /* the device's group in them */
  int naxes;
  int axes[RT_MAX_AXES];   /* the groups' axis tuple */
  int size;                /* n */
  int rank;                /* the device's rank */
  int base;                /* the member of rank 0 */
  unsigned mask;           /* the tuple's axes larger than 1, as a set: groups of equal masks (the same
                              replica groups) are disjoint */
  char text[RT_MAX_AXES * (RT_NAME_MAX + 2) + 4]; /* "(data, model)" */
} RtGroup;

/* dev's group in G; RT_OK, or a failure naming the call (`what`) when G is malformed or holds no
 * group of dev's. */
int rtgroup_lookup(RtDevice *dev, const RtGroups *G, const char *what, RtGroup *g);
static inline int rtgroup_member(const RtGroup *g, int rank) { return g->G->members[g->group * g->size + rank]; }

/* Counts one collective dev executed (rt_executed): kind, over g, sending `bytes` as explain
 * defines it. */
void rtrun_count(RtDevice *dev, RtCollKind kind, unsigned axes, double bytes);

/* One collective call, as the front end (collective.c) checked it; what a backend executes and
 * what the members of a group compare to be sure they made the same call. */
typedef struct RtCall {
  RtCollKind kind;
  RtDtype dtype;
  RtReduceOp op;
  const void *in;
  void *out;
  int64_t outer, extent, inner; /* all_gather, reduce_scatter */
  int64_t count;                /* all_reduce, permutes: elements */
  int nd;                       /* all_to_all: in's rank, shape, the two dims */
  int64_t shape[RT_MAX_RANK];
  int split_dim, concat_dim;
  int shift;                    /* permute: ring shift, or pairs */
  const int *pairs;
  int npairs;
  int src_of_me;                /* permute: the rank this one receives from, -1 none (front end) */
  /* a program's collective of several members or parts (rt_collective): its description and the
   * members' buffers, which a backend's `members` op moves directly (in, out unused) */
  const RtColl *coll;
  const void *const *ins;
  void *const *outs;
} RtCall;

/* ---- collective.c ---- */
/* rt_collective's call of several members or parts, through the backend's `members`: looked up,
 * checked, counted as one collective. */
int rtcall_members(RtDevice *dev, const RtColl *k, const void *const *in, void *const *out);

/* ---- coll.c ---- */
/* Member m's block shape (a reduce-scatter's result; an all-gather's operand) and whole shape (an
 * all-gather's result; a reduce-scatter's operand), or false when malformed. */
bool rtcoll_shapes(const RtCollMember *m, int kind, int64_t *block, int64_t *whole);
/* Where device dev's block sits in member m's whole tensor, in blocks per dim (its rank in each
 * part's groups), or false when a part's groups hold no group of dev's. */
bool rtcoll_position(const RtCollMember *m, int dev, int64_t *pos);

/* A posted permute (rt_permute_shift_start): the checked call, the group, and what the backend
 * keeps until rt_wait. */
struct RtRequest {
  RtCall c;
  RtGroup g;
  int done;          /* the transfer already happened (a backend without permute_start) */
  int rc;
  void *state;       /* the backend's */
};

/* ---- runtime.c ---- */
/* The MPI backend, once rt_mpi_init has registered it (mpi.c; NULL in a process without MPI). */
extern const struct RtBackend *rtrun_mpi_backend;
extern int rtrun_world_rank;
static inline bool rtrun_local(const Runtime *rt, int device) { return device >= rt->local_lo && device < rt->local_hi; }
/* Records the run's first failure (the device's label, then the message) and stops the run.
 * Returns code. */
int rtrun_fail(RtDevice *dev, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int rtrun_vfail(RtDevice *dev, int code, const char *fmt, va_list ap);
static inline bool rtrun_stopped(const Runtime *rt) { return atomic_load_explicit(&rt->stopped, memory_order_acquire); }
/* Runs the entry function on dev (in the calling thread) and marks the device done. */
void rtrun_device_main(RtDevice *dev);
/* "device 3 [data=1, model=0] (in all_gather over (data))": a device and what it is doing. */
void rtrun_describe(const Runtime *rt, int device, char *buf, size_t n);

/* ---- alloc.c ---- */
void rtmem_init(RtAccount *a);
void rtmem_release_all(RtDevice *dev); /* frees what is left (rt_close) */

/* ---- sync.c: spin, then sleep ---- */
typedef struct RtWait {
  bool (*ready)(void *ctx);    /* the condition waited for */
  int (*hopeless)(void *ctx);  /* optional: nonzero status when the condition can no longer come */
  void *ctx;
  bool abandon;                /* give up when the run stops, or after the timeout */
  _Atomic uint32_t *bell;      /* what to sleep on, rung by whoever makes the condition true */
  _Atomic uint32_t *sleepers;  /* ... and its count of sleepers; NULL bell: the device's own */
} RtWait;
/* RT_OK once ready; else, if w->abandon, RT_E_STOPPED, RT_E_TIMEOUT or hopeless's status. A
 * wait that does not abandon only ends when ready (its peers are bound to arrive). */
int rtsync_wait(RtDevice *dev, const RtWait *w);
/* After making a condition true: wakes whoever sleeps on the bell. */
void rtsync_ring(_Atomic uint32_t *bell, _Atomic uint32_t *sleepers);
/* After changing what dev may be waiting for (a message, a stop, a peer gone): rings the bell
 * dev sleeps on, whichever it is. */
void rtsync_wake(RtDevice *dev);
void rtsync_wake_all(Runtime *rt);
void rtsync_policy(Runtime *rt);   /* sets the spin budgets for the mesh and the cores */

/* ---- gemm_dnnl.c: oneDNN's matmul ---- */
int rtdnnl_open(Runtime *rt);   /* the cache (the engine is made at the first product) */
void rtdnnl_close(Runtime *rt); /* the primitives, the devices' streams and scratchpads */
/* Around a device's entry function: its OpenMP team size set to 1 (checked), then restored. */
int rtdnnl_device_begin(RtDevice *dev);
void rtdnnl_device_end(RtDevice *dev);
/* g through the cached primitive for its key (made if new). *ran false (and RT_OK) when oneDNN
 * has no implementation for it: the caller runs it elsewhere. */
int rtdnnl_gemm(RtDevice *dev, const RtGemm *g, bool *ran);
void rtdnnl_counts(const Runtime *rt, uint64_t *created, uint64_t *hits);

/* Loops worth vectorising: compiled for AVX-512 (x86-64-v4), AVX2 + FMA (v3) and the baseline,
 * the CPU's best version picked when the program loads (function multiversioning: the CPU is
 * detected at run time, never assumed from the build machine). The files holding them are
 * compiled at -O3 (runtime/CMakeLists.txt): GCC's -O2 vectorises only the cheapest loops. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define RT_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define RT_SANITIZED 1
#endif
/* Not under the sanitizers: the clones' resolvers run while the dynamic loader relocates the
 * program, before the sanitizer's runtime is up, and their instrumentation crashes there. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(RT_SANITIZED)
#define RT_VECTOR __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define RT_VECTOR
#endif

/* The posted permutes' ownership rules (shardrt.h, rt_permute_shift_start) checked by the threads
 * backend: in debug builds and under the sanitizers (CI's ASan and TSan trees). */
#if !defined(NDEBUG) || defined(RT_SANITIZED)
#define RT_POST_CHECKS 1
#else
#define RT_POST_CHECKS 0
#endif

/* ---- kernels.c ---- */
/* bf16 <-> f32 over arrays, vectorised (round to nearest even, NaN kept quiet) */
void rtk_bf16_to_f32(float *restrict dst, const uint16_t *restrict src, size_t n);
void rtk_f32_to_bf16(uint16_t *restrict dst, const float *restrict src, size_t n);
/* dst[i] = op over srcs[0..n-1][i] in that order; floats accumulate in f32 and round once. Any
 * src may alias dst elementwise (each element is read before it is written). */
void rtk_reduce(RtDtype dt, RtReduceOp op, void *dst, const void *const *srcs, int n, size_t count);
/* Copies a `shape` box between strided arrays (strides in elements). */
void rtk_copy_box(void *dst, const int64_t *dst_stride, const void *src, const int64_t *src_stride,
                  const int64_t *shape, int nd, size_t elem);
void rtk_row_major_strides(const int64_t *shape, int nd, int64_t *stride);
/* Element i of a buffer of dtype dt as a double, and back (rounded to nearest even; i32 truncated). */
double rtk_get(const void *buf, RtDtype dt, int64_t i);
void rtk_put(void *buf, RtDtype dt, int64_t i, double v);

/* route_log.c: rt_nn_route's choices for one group of T tokens over E experts (k each, choice[j k
 * + q] the q-th of token j; logits[j E + x]), recorded or followed as the device's runtime says. */
void rtroute_settle(RtDevice *dev, int64_t E, int64_t T, int k, const double *logits, int64_t *choice);

#endif
