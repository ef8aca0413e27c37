/* mpi.c: the MPI backend (backend.h): the mesh's devices spread over the ranks of an mpirun job,
 * T device threads per rank (RtConfig.threads_per_rank; rank r runs devices r T .. r T + T - 1),
 * the collectives on MPI's own (MPI_Allgather(v), MPI_Alltoall(v), MPI_Allgatherv, point to point
 * for permutes and messages). docs/runtime.md, "The MPI backend", has the design; in short:
 *
 * Communicators. One per group, made when the group is first used (MPI_Comm_create_group over
 * the ranks holding its members: collective over those ranks only, so a pipeline stage's groups
 * need not be known to the other stages), keyed by the group's members in rank order, so that it
 * does not matter how the front end named the group (an axis tuple today, explicit replica groups
 * later). Its ranks are ordered by their members' group ranks. Besides: a control communicator
 * (stop messages, the end of a run, rt_fetch_to_root), the parent of the groups', one for the
 * device-to-device signatures and permutes (the tag says which local slots, src mod T and dst mod
 * T, and which kind), and per pair of local slots one for rt_send (whose tags are the caller's).
 *
 * A collective, on each device:
 *   1. meet: it sends its call's signature (kind, dtype, sizes, the group's members, its line) to
 *      every other member and receives theirs, over the device-to-device channels. All arrived
 *      and equal: go on. A different call: RT_E_MISMATCH naming both, before a byte moves (every
 *      member sees a mismatch when any two differ, so none goes on). A member that returned from
 *      its entry function sends DONE on the same channel, after its last signature, so it is
 *      noticed at once. The waits poll (MPI_Test), then sleep, and time out after --timeout.
 *   2. the data, on the group's communicator: blocking MPI calls, since every member is in; with
 *      T > 1 the group's devices of one rank meet first in shared memory (a counter and a bell,
 *      sync.c) and the lowest-ranked of them (the leader) packs their buffers, makes the one MPI
 *      call for the rank, and unpacks into each.
 * Reductions are never MPI's: the blocks are moved (MPI_Alltoall(v) of the chunks, or
 * MPI_Allgather(v) of small buffers) and added with rtk_reduce in group rank order, accumulating
 * in f32, as threads.c does, so results are bitwise those of the threads backend.
 *
 * Failures. A failing device's rank sends its message to every other rank (control
 * communicator); ranks notice it when they next wait (MPI_Test) and unwind. A wait for a member's
 * signature does not end on a stop, only when the member comes, returns (DONE) or the timeout
 * passes: a member that has every signature goes into the data step, and must find everyone
 * there. A recv ends on a stop at once (nothing is posted: MPI_Improbe). At the end of a run every
 * rank drains its channels up to each device's DONE (and the messages nobody received, counted in
 * DONE), then the ranks exchange their first failures and device figures (MPI_Iallgather) and all
 * return the same message: the lowest rank's own failure. After a stop, a rank that does not
 * finish within the timeout (a device stuck in its own code) makes the others end the job
 * (MPI_Abort) rather than wait forever. */
#define _GNU_SOURCE
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "mpi_int.h"

#define DIRECT_ALL_REDUCE_BYTES (64 * 1024) /* as threads.c: every rank reduces the whole buffer */
enum { TAG_SIG = 0, TAG_PERM = 1 };         /* on the signature communicators */
enum { TAG_STOP = 1, TAG_FETCH = 2 };       /* on the control communicator */
enum { SIG_CALL = 1, SIG_DONE = 2 };
#define MAX_MISSING 8
/* After a stop, how long a rank waits for the others to finish before it ends the job: a device
 * may be in a long op of its own (it notices the stop at its next call), so at least this many
 * seconds, and the timeout if that is longer. */
#define STOP_GRACE_S 10.0

/* A collective's signature, or DONE. */
typedef struct Sig {
  uint32_t epoch, what;   /* the run; SIG_CALL or SIG_DONE */
  uint64_t group;         /* hash of the members in rank order */
  int32_t kind, dtype, op, nd, split, concat, shift, npairs, line, pad;
  int64_t outer, extent, inner, count;
  int64_t shape[RT_MAX_RANK];
  uint64_t pairs;         /* hash of a permute's pairs */
  uint64_t sent;          /* SIG_DONE: rt_send messages the sender sent the receiver in this run */
  char text[sizeof(((RtGroup *)0)->text)]; /* the group as the front end names it, "(data, model)" */
} Sig;

/* The channel from device m to a local device: at most one receive posted, and one message read
 * ahead (a recv looks for DONE without taking a signature). */
typedef struct Chan {
  MPI_Request req;
  Sig in;
  int have;
  Sig next;
  int done;               /* DONE read in this run */
  uint64_t sent;          /* ... its count */
  uint64_t recvd;         /* rt_send messages received from m in this run */
} Chan;

/* A send in flight: its buffer (malloc'd, or rt_alloc'd on `owner`'s account) freed when done. */
typedef struct Outgoing {
  MPI_Request req;
  void *buf;
  RtDevice *owner;
} Outgoing;

typedef struct Local {
  RtDevice *dev;
  Chan *chan;             /* [ndev] */
  uint64_t *sent;         /* [ndev]: rt_send messages sent to each device in this run */
  Outgoing *out;
  int nout, capout;
  void *stage[2];         /* the leader's packing buffers (the transport's, on no device's account) */
  size_t stage_bytes[2];
  int *counts;            /* [4 x ranks]: counts and displacements of the v-collectives */
  const void **srcs;      /* [ndev]: rtk_reduce's sources */
  /* what it was doing when its rank learnt that the run stopped */
  uint64_t snap_where;
  int snap_line, snap_done, snapped;
} Local;

/* A group, as this rank sees it. */
typedef struct Group {
  struct Group *next;
  uint64_t key;
  int n, *members;        /* the device of each group rank */
  int R, me;              /* ranks holding members (in the order of their lowest group rank); this one's index */
  int *proc, *cnt, *first; /* per such rank: its MPI rank, members held, first packed position */
  int *pos;               /* per group rank: packed position (ranks in order, members in rank order) */
  int *at;                /* per packed position: the group rank */
  int *rq, *rk;           /* per group rank: the index of its MPI rank among the R, and its index there */
  int nloc, *loc;         /* this rank's members: group ranks, ascending */
  MPI_Comm comm;          /* over the R ranks (made by the leader at first use; none when R == 1) */
  /* the local meeting (nloc > 1) */
  _Atomic uint32_t arrived, finished, bell, sleepers;
  const RtCall **slot;    /* [nloc] */
  uint32_t *count;        /* [nloc]: meetings each local member has been to (its own thread) */
  int result;             /* the leader's status, for the others (published by `finished`) */
} Group;

typedef struct StopMsg {
  int32_t code, device;
  char text[RT_ERR_MAX];
} StopMsg;

/* A device's figures and state, sent at the end of a run. */
typedef struct DevStat {
  uint64_t peak, current, allocs, ncoll, where;
  double coll_s, clock[2];
  int32_t line, done;
} DevStat;

typedef struct Report {
  int32_t code;            /* the first failure this rank recorded */
  int32_t origin;          /* 1: it happened here */
  int32_t broadcast;       /* 1: this rank sent it to the others */
  int32_t nmissing, missing[MAX_MISSING], cut; /* a timeout's missing devices; where their list starts in text */
  char text[RT_ERR_MAX];
  DevStat dev[];           /* [T] */
} Report;

#define GROUP_BUCKETS 256

typedef struct Mpi {
  int T, rank, nranks, lo;
  int spin;                /* poll without sleeping first: only when the ranks' threads have cores */
  MPI_Comm ctl, gparent, sigc; /* sigc: signatures and permutes, tags by kind and local slots (sig_tag) */
  MPI_Comm *data;          /* [T x T]: rt_send's, by (src mod T) x T + (dst mod T), tags the caller's */
  Local *local;            /* [T] */
  uint32_t epoch;
  pthread_mutex_t groups_lock;
  Group *buckets[GROUP_BUCKETS];
  /* stopping */
  pthread_mutex_t poll_lock;
  MPI_Request stop_req;
  StopMsg stop_in, stop_out;
  int stop_received;       /* stop messages received in this run */
  _Atomic int stop_remote; /* the failure recorded here came from another rank */
  _Atomic int stop_sent;   /* this rank sent its failure to the others */
  MPI_Request *stop_sends; /* [ranks] */
  double stopped_at;       /* when this rank learnt it (rt_seconds; 0: not yet) */
  /* a timeout's missing devices, for the final message (guarded by rt->err_lock) */
  int nmissing, missing[MAX_MISSING], cut;
  RtStatusDevice *status;  /* the launcher's status file's devices, or NULL */
  int kill_device;         /* tests (SHARDC_MPI_KILL=D:N[:exit]): device D's rank dies at its N-th call */
  uint64_t kill_at;
  int kill_exit;
} Mpi;

static Mpi *state(const Runtime *rt) { return rt->backend_state; }
static Local *local_of(const RtDevice *dev) { return &state(dev->rt)->local[dev->index - dev->rt->local_lo]; }
/* the signature communicator's tag of a kind of message from device src to device dst */
static int sig_tag(const Mpi *M, int kind, int src, int dst) { return kind + 2 * ((src % M->T) * M->T + dst % M->T); }
static MPI_Comm data_comm(const Mpi *M, int src, int dst) { return M->data[(src % M->T) * M->T + dst % M->T]; }

static MPI_Datatype elem_type(size_t es) { return es == 2 ? MPI_UINT16_T : es == 8 ? MPI_UINT64_T : MPI_UINT32_T; }

static void mirror_where(RtDevice *dev) {
  Mpi *M = state(dev->rt);
  if (M->status) atomic_store_explicit(&M->status[dev->index].where, atomic_load(&dev->where), memory_order_relaxed);
}

static void mirror_clear(RtDevice *dev) {
  Mpi *M = state(dev->rt);
  if (M->status) atomic_store_explicit(&M->status[dev->index].where, 0, memory_order_relaxed);
}

/* ---- waiting: poll, then sleep a little longer each time ----
 * MPI has no wait that a stop or a timeout can interrupt, nor one that sleeps: every wait here
 * tests (MPI_Test), spins for up to 50 us when the ranks' threads have a core each, then sleeps
 * 1, 2, 4 ... us up to BACKOFF_MAX_NS between looks, so that a late peer is seen at most that long
 * after it came while a waiter costs little CPU (on 2 cores shared by 4 or 8 ranks the CPU is what
 * the late peer needs). */
#define BACKOFF_MAX_NS 64000

typedef struct Backoff {
  double t0;
  long sleep_ns;
} Backoff;

static void backoff(const Mpi *M, Backoff *b) {
  if (b->t0 == 0) b->t0 = rt_seconds();
  if (M->spin && rt_seconds() - b->t0 < 50e-6) return;
  if (b->sleep_ns == 0) b->sleep_ns = 1000;
  struct timespec ts = {0, b->sleep_ns};
  nanosleep(&ts, NULL);
  if (b->sleep_ns < BACKOFF_MAX_NS) b->sleep_ns *= 2;
}

/* ---- sends in flight ---- */

static int outgoing(Local *L, MPI_Request req, void *buf, RtDevice *owner) {
  if (L->nout == L->capout) {
    int cap = L->capout ? 2 * L->capout : 16;
    Outgoing *o = realloc(L->out, (size_t)cap * sizeof *o);
    if (!o) return RT_E_NOMEM;
    L->out = o, L->capout = cap;
  }
  L->out[L->nout++] = (Outgoing){req, buf, owner};
  return RT_OK;
}

static void free_outgoing(Outgoing *o) {
  if (o->owner) rt_free(o->owner, o->buf);
  else free(o->buf);
}

/* Frees the sends that completed. */
static void progress_outgoing(Local *L) {
  int k = 0;
  for (int i = 0; i < L->nout; i++) {
    int flag = 0;
    MPI_Test(&L->out[i].req, &flag, MPI_STATUS_IGNORE);
    if (flag) free_outgoing(&L->out[i]);
    else L->out[k++] = L->out[i];
  }
  L->nout = k;
}

/* A copy of sig to device m's channel from this device. */
static int send_sig(Mpi *M, Local *L, int m, const Sig *sig) {
  Sig *copy = malloc(sizeof *copy);
  if (!copy) return RT_E_NOMEM;
  *copy = *sig;
  MPI_Request req;
  MPI_Isend(copy, sizeof *copy, MPI_BYTE, m / M->T, sig_tag(M, TAG_SIG, L->dev->index, m), M->sigc, &req);
  if (outgoing(L, req, copy, NULL)) { /* no room to keep it: wait for it here */
    MPI_Wait(&req, MPI_STATUS_IGNORE);
    free(copy);
  }
  return RT_OK;
}

/* The next message of the run from device m on L's channel, if it has come: 1 (into *out), or 0. */
static int chan_take(Mpi *M, Local *L, int m, Sig *out) {
  Chan *ch = &L->chan[m];
  if (ch->have) {
    *out = ch->next;
    ch->have = 0;
    return 1;
  }
  for (;;) {
    if (ch->req == MPI_REQUEST_NULL)
      MPI_Irecv(&ch->in, sizeof ch->in, MPI_BYTE, m / M->T, sig_tag(M, TAG_SIG, m, L->dev->index), M->sigc, &ch->req);
    int flag = 0;
    MPI_Test(&ch->req, &flag, MPI_STATUS_IGNORE);
    if (!flag) return 0;
    if (ch->in.epoch != M->epoch) continue; /* from an earlier run: cannot happen after a drain, but harmless */
    *out = ch->in;
    return 1;
  }
}

/* The next message from m, left in place; NULL if none has come. */
static const Sig *chan_peek(Mpi *M, Local *L, int m) {
  Chan *ch = &L->chan[m];
  if (!ch->have && chan_take(M, L, m, &ch->next)) ch->have = 1;
  return ch->have ? &ch->next : NULL;
}

/* ---- stopping ---- */

/* What this rank's devices are doing now, for the final message. */
static void snapshot(Runtime *rt) {
  Mpi *M = state(rt);
  for (int i = 0; i < M->T; i++) {
    Local *L = &M->local[i];
    if (L->snapped) continue;
    L->snap_where = atomic_load(&L->dev->where);
    L->snap_line = atomic_load_explicit(&L->dev->line, memory_order_relaxed);
    L->snap_done = atomic_load(&L->dev->done);
    L->snapped = 1;
  }
  if (M->stopped_at == 0) M->stopped_at = rt_seconds();
}

/* Another rank's failure: recorded as it was written (it names its device), unless one is
 * recorded here already. */
static void record_remote(Runtime *rt, const StopMsg *s) {
  Mpi *M = state(rt);
  pthread_mutex_lock(&rt->err_lock);
  if (!rt->err_code) {
    rt->err_code = s->code ? s->code : RT_E_FAILED;
    snprintf(rt->err, sizeof rt->err, "%s", s->text);
    atomic_store(&M->stop_remote, 1);
  }
  pthread_mutex_unlock(&rt->err_lock);
  atomic_store(&rt->stopped, 1);
  rtsync_wake_all(rt);
}

/* Has the run stopped? Looks for another rank's stop message (one thread at a time). */
static bool poll_stop(Runtime *rt) {
  Mpi *M = state(rt);
  if (!rtrun_stopped(rt) && !pthread_mutex_trylock(&M->poll_lock)) {
    int flag = 0;
    if (M->stop_req != MPI_REQUEST_NULL) MPI_Test(&M->stop_req, &flag, MPI_STATUS_IGNORE);
    if (flag) {
      M->stop_received++;
      record_remote(rt, &M->stop_in);
    }
    pthread_mutex_unlock(&M->poll_lock);
  }
  if (rtrun_stopped(rt)) {
    pthread_mutex_lock(&M->poll_lock);
    snapshot(rt);
    pthread_mutex_unlock(&M->poll_lock);
    return true;
  }
  return false;
}

/* Tests: a rank that dies mid-step at device D's N-th call: SIGKILL (as the OOM killer would), or
 * with SHARDC_MPI_KILL=D:N:exit a process that exits (status 3) without a word. */
static void maybe_die(RtDevice *dev) {
  Mpi *M = state(dev->rt);
  if (dev->index == M->kill_device && dev->ncoll + 1 == M->kill_at) {
    mirror_where(dev);
    if (M->kill_exit) _exit(3);
    raise(SIGKILL);
  }
}

/* At the start of a call: has the run stopped? If this call is how the rank learns it, the device
 * was running its own code until now, and the final message says so. */
static bool stopped_at_entry(RtDevice *dev) {
  Runtime *rt = dev->rt;
  Mpi *M = state(rt);
  maybe_die(dev);
  if (rtrun_stopped(rt)) return true;
  if (!poll_stop(rt)) return false;
  pthread_mutex_lock(&M->poll_lock);
  local_of(dev)->snap_where = 0;
  pthread_mutex_unlock(&M->poll_lock);
  return true;
}

/* rtrun_vfail stopped the run: tell the other ranks, once, if the failure is this rank's own. */
static void stop_mpi(Runtime *rt) {
  Mpi *M = state(rt);
  rtsync_wake_all(rt);
  pthread_mutex_lock(&M->poll_lock);
  snapshot(rt);
  pthread_mutex_unlock(&M->poll_lock);
  if (atomic_load(&M->stop_remote) || atomic_exchange(&M->stop_sent, 1)) return;
  pthread_mutex_lock(&rt->err_lock);
  M->stop_out.code = rt->err_code;
  snprintf(M->stop_out.text, sizeof M->stop_out.text, "%s", rt->err);
  pthread_mutex_unlock(&rt->err_lock);
  for (int r = 0; r < M->nranks; r++)
    if (r != M->rank) MPI_Isend(&M->stop_out, sizeof M->stop_out, MPI_BYTE, r, TAG_STOP, M->ctl, &M->stop_sends[r]);
}

/* ---- groups ---- */

static uint64_t hash_ints(const int *v, int n, uint64_t h) {
  for (int i = 0; i < n; i++) {
    h ^= (uint32_t)v[i];
    h *= 0x100000001b3ull;
    h ^= h >> 29;
  }
  return h;
}

static void group_free(Group *G) {
  if (G->comm != MPI_COMM_NULL) MPI_Comm_free(&G->comm);
  free(G->members), free(G->proc), free(G->cnt), free(G->first), free(G->pos), free(G->loc);
  free(G->at), free(G->rq), free(G->rk);
  free(G->slot), free(G->count);
  free(G);
}

/* The group of dev's call: found by its members in rank order, or made. NULL: out of memory. */
static Group *group_get(RtDevice *dev, const RtGroup *g) {
  Runtime *rt = dev->rt;
  Mpi *M = state(rt);
  int n = g->size;
  int *members = malloc((size_t)n * sizeof *members);
  if (!members) return NULL;
  for (int r = 0; r < n; r++) members[r] = rtgroup_member(g, r);
  uint64_t key = hash_ints(members, n, 0xcbf29ce484222325ull ^ (uint64_t)n);
  pthread_mutex_lock(&M->groups_lock);
  Group **head = &M->buckets[key % GROUP_BUCKETS], *G = *head;
  while (G && !(G->key == key && G->n == n && !memcmp(G->members, members, (size_t)n * sizeof *members))) G = G->next;
  if (G) {
    pthread_mutex_unlock(&M->groups_lock);
    free(members);
    return G;
  }
  G = calloc(1, sizeof *G);
  if (G) {
    G->key = key, G->n = n, G->members = members, G->comm = MPI_COMM_NULL;
    G->proc = malloc((size_t)n * sizeof *G->proc), G->cnt = calloc((size_t)n, sizeof *G->cnt);
    G->first = malloc((size_t)n * sizeof *G->first), G->pos = malloc((size_t)n * sizeof *G->pos);
    G->loc = malloc((size_t)n * sizeof *G->loc), G->at = malloc((size_t)n * sizeof *G->at);
    G->rq = malloc((size_t)n * sizeof *G->rq), G->rk = malloc((size_t)n * sizeof *G->rk);
    int *idx = malloc((size_t)M->nranks * sizeof *idx); /* MPI rank -> index among the group's ranks */
    if (!G->proc || !G->cnt || !G->first || !G->pos || !G->loc || !G->at || !G->rq || !G->rk || !idx) {
      free(idx);
      group_free(G);
      pthread_mutex_unlock(&M->groups_lock);
      return NULL;
    }
    for (int p = 0; p < M->nranks; p++) idx[p] = -1;
    for (int r = 0; r < n; r++) { /* ranks in the order of their lowest member */
      int p = members[r] / M->T;
      if (idx[p] < 0) idx[p] = G->R, G->proc[G->R++] = p;
      G->cnt[idx[p]]++;
    }
    for (int q = 0, at = 0; q < G->R; q++) G->first[q] = at, at += G->cnt[q];
    int *fill = calloc((size_t)(G->R > 0 ? G->R : 1), sizeof *fill);
    for (int r = 0; fill && r < n; r++) {
      int q = idx[members[r] / M->T];
      G->rq[r] = q, G->rk[r] = fill[q];
      G->pos[r] = G->first[q] + fill[q]++;
      G->at[G->pos[r]] = r;
      if (members[r] / M->T == M->rank) G->loc[G->nloc++] = r;
    }
    G->me = idx[M->rank];
    free(idx);
    G->slot = calloc((size_t)(G->nloc ? G->nloc : 1), sizeof *G->slot);
    G->count = calloc((size_t)(G->nloc ? G->nloc : 1), sizeof *G->count);
    if (!fill || !G->slot || !G->count) {
      free(fill);
      group_free(G);
      pthread_mutex_unlock(&M->groups_lock);
      return NULL;
    }
    free(fill);
    G->next = *head;
    *head = G;
  } else {
    free(members);
  }
  pthread_mutex_unlock(&M->groups_lock);
  return G;
}

/* The group's communicator, made by the leader at the group's first collective (every rank of the
 * group is in it then). */
static int group_comm(Mpi *M, Group *G) {
  if (G->R == 1 || G->comm != MPI_COMM_NULL) return RT_OK;
  MPI_Group world, sub;
  MPI_Comm_group(M->gparent, &world);
  MPI_Group_incl(world, G->R, G->proc, &sub);
  int rc = MPI_Comm_create_group(M->gparent, sub, (int)(G->key & 0x3fffffff), &G->comm);
  MPI_Group_free(&sub);
  MPI_Group_free(&world);
  return rc == MPI_SUCCESS ? RT_OK : RT_E_SYS;
}

/* ---- step 1: the members meet ---- */

static uint64_t pairs_hash(const RtCall *c) {
  if (!c->pairs) return 0;
  return hash_ints(c->pairs, 2 * c->npairs, 0x9e3779b97f4a7c15ull);
}

static void make_sig(Sig *s, uint32_t epoch, const Group *G, const RtGroup *g, const RtCall *c, int line) {
  memset(s, 0, sizeof *s);
  s->epoch = epoch, s->what = SIG_CALL, s->group = G->key;
  s->kind = (int32_t)c->kind, s->dtype = (int32_t)c->dtype, s->op = (int32_t)c->op, s->line = line;
  switch (c->kind) {
  case RT_COLL_ALL_GATHER:
  case RT_COLL_REDUCE_SCATTER: s->outer = c->outer, s->extent = c->extent, s->inner = c->inner; break;
  case RT_COLL_ALL_REDUCE: s->count = c->count; break;
  case RT_COLL_ALL_TO_ALL:
    s->nd = c->nd, s->split = c->split_dim, s->concat = c->concat_dim;
    memcpy(s->shape, c->shape, (size_t)c->nd * sizeof *c->shape);
    break;
  case RT_COLL_PERMUTE:
    s->count = c->count, s->shift = c->pairs ? 0 : c->shift, s->npairs = c->pairs ? c->npairs : -1;
    s->pairs = pairs_hash(c);
    break;
  default: break;
  }
  if (c->kind != RT_COLL_ALL_REDUCE && c->kind != RT_COLL_REDUCE_SCATTER) s->op = 0;
  if (c->kind == RT_COLL_BARRIER) s->dtype = 0;
  snprintf(s->text, sizeof s->text, "%s", g->text);
}

static bool same_sig(const Sig *a, const Sig *b) {
  return a->group == b->group && a->kind == b->kind && a->dtype == b->dtype && a->op == b->op && a->nd == b->nd &&
         a->split == b->split && a->concat == b->concat && a->shift == b->shift && a->npairs == b->npairs &&
         a->outer == b->outer && a->extent == b->extent && a->inner == b->inner && a->count == b->count &&
         !memcmp(a->shape, b->shape, sizeof a->shape) && a->pairs == b->pairs;
}

/* "all_gather over (x) of f32 [2, 3, 4]", as threads.c says it. */
static void sig_text(const Sig *s, char *buf, size_t n) {
  size_t len = (size_t)snprintf(buf, n, "%s over %s", rtrun_coll_name((RtCollKind)s->kind), s->text);
  if (len >= n) return;
  const char *dt = rt_dtype_name((RtDtype)s->dtype);
  switch (s->kind) {
  case RT_COLL_ALL_GATHER:
  case RT_COLL_REDUCE_SCATTER:
    snprintf(buf + len, n - len, " of %s [%lld, %lld, %lld]", dt, (long long)s->outer, (long long)s->extent, (long long)s->inner);
    break;
  case RT_COLL_ALL_REDUCE:
  case RT_COLL_PERMUTE: snprintf(buf + len, n - len, " of %lld %s", (long long)s->count, dt); break;
  case RT_COLL_ALL_TO_ALL:
    len += (size_t)snprintf(buf + len, n - len, " of %s [", dt);
    for (int i = 0; i < s->nd && len < n; i++) len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? ", " : "", (long long)s->shape[i]);
    if (len < n) snprintf(buf + len, n - len, "] split %d concat %d", s->split, s->concat);
    break;
  default: break;
  }
  if (s->line > 0 && (len = strlen(buf)) < n) snprintf(buf + len, n - len, " at line %d", s->line);
}

/* A timeout: the message names who is missing; the end of the run adds what each was doing. */
static int fail_timeout(RtDevice *dev, const char *what, const int *missing, int nmissing) {
  Runtime *rt = dev->rt;
  Mpi *M = state(rt);
  char list[1024] = "";
  size_t len = 0;
  for (int i = 0; i < nmissing && i < 3 && len < sizeof list; i++)
    len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", rt->devices[missing[i]].label);
  if (nmissing > 3 && len < sizeof list) snprintf(list + len, sizeof list - len, " and %d more", nmissing - 3);
  int rc = rtrun_fail(dev, RT_E_TIMEOUT, "%s timed out after %g s waiting for %s", what, rt->timeout_s, list);
  pthread_mutex_lock(&rt->err_lock);
  size_t total = strlen(rt->err), tail = strlen(list);
  if (!atomic_load(&M->stop_remote) && total >= tail && !strcmp(rt->err + total - tail, list) && !M->nmissing) {
    M->nmissing = nmissing < MAX_MISSING ? nmissing : MAX_MISSING;
    memcpy(M->missing, missing, (size_t)M->nmissing * sizeof *missing);
    M->cut = (int)(total - tail);
  }
  pthread_mutex_unlock(&rt->err_lock);
  return rc;
}

/* Step 1: RT_OK once every member made this call. */
static int meet(RtDevice *dev, const RtGroup *g, const Group *G, const RtCall *c) {
  Runtime *rt = dev->rt;
  Mpi *M = state(rt);
  Local *L = local_of(dev);
  int n = g->size;
  if (n == 1) return RT_OK;
  Sig mine;
  make_sig(&mine, M->epoch, G, g, c, atomic_load_explicit(&dev->line, memory_order_relaxed));
  for (int r = 0; r < n; r++)
    if (r != g->rank && send_sig(M, L, G->members[r], &mine)) return rtrun_fail(dev, RT_E_NOMEM, "out of memory for a signature");
  char *got = calloc((size_t)n, 1);
  if (!got) return rtrun_fail(dev, RT_E_NOMEM, "out of memory for a collective of %d", n);
  got[g->rank] = 1;
  int need = n - 1, rc = RT_OK;
  double deadline = rt_seconds() + rt->timeout_s;
  Backoff b = {0};
  while (need) {
    for (int r = 0; r < n && rc == RT_OK; r++) {
      Sig s;
      if (got[r] || !chan_take(M, L, G->members[r], &s)) continue;
      int m = G->members[r];
      if (s.what == SIG_DONE) {
        L->chan[m].done = 1, L->chan[m].sent = s.sent;
        if (poll_stop(rt)) rc = RT_E_STOPPED;
        else rc = rtrun_fail(dev, RT_E_MISMATCH, "%s over %s: %s (returned from its entry function) without calling it",
                             rtrun_coll_name(c->kind), g->text, rt->devices[m].label);
      } else if (!same_sig(&mine, &s)) {
        char a[400], bb[400];
        sig_text(&mine, a, sizeof a);
        sig_text(&s, bb, sizeof bb);
        if (s.group != mine.group && !strcmp(s.text, mine.text)) /* the same name, other devices */
          snprintf(bb + strlen(bb), sizeof bb - strlen(bb), " (another group of devices)");
        rc = rtrun_fail(dev, RT_E_MISMATCH, "called %s while %s called %s", a, rt->devices[m].label, bb);
      }
      got[r] = 1;
      need--;
    }
    if (rc || !need) break;
    progress_outgoing(L);
    poll_stop(rt); /* noticed, but the wait goes on: see the top of the file */
    if (rt_seconds() > deadline) {
      int missing[MAX_MISSING], nm = 0;
      for (int r = 0; r < n; r++)
        if (!got[r] && nm < MAX_MISSING) missing[nm++] = G->members[r];
      char what[sizeof g->text + 32];
      snprintf(what, sizeof what, "%s over %s", rtrun_coll_name(c->kind), g->text);
      rc = rtrun_stopped(rt) ? RT_E_STOPPED : fail_timeout(dev, what, missing, nm);
      break;
    }
    backoff(M, &b);
  }
  free(got);
  return rc;
}

/* ---- step 2: the data ---- */

static void *stage(Local *L, int which, size_t bytes) {
  if (L->stage_bytes[which] < bytes) {
    free(L->stage[which]);
    L->stage[which] = malloc(bytes ? bytes : 1);
    L->stage_bytes[which] = L->stage[which] ? bytes : 0;
  }
  return L->stage[which];
}

static bool fits_int(int64_t x) { return x >= 0 && x <= 0x7fffffff; }

/* Waits for a request of the data step (bounded: every member is in it). */
static void finish(const Mpi *M, MPI_Request *req) {
  Backoff b = {0};
  for (;;) {
    int flag = 0;
    MPI_Test(req, &flag, MPI_STATUS_IGNORE);
    if (flag) return;
    backoff(M, &b);
  }
}

/* The data step's MPI calls are the non-blocking forms, completed by finish(): Open MPI's blocking
 * waits spin, or sched_yield when mpirun was told to oversubscribe, and either starves the ranks
 * that share the cores with it; finish() sleeps between its looks. */
#define NB(call, ...)              \
  do {                             \
    MPI_Request req_;              \
    call(__VA_ARGS__, &req_);      \
    finish(X->M, &req_);           \
  } while (0)

typedef struct Exec {
  Runtime *rt;
  Mpi *M;
  Local *L;              /* the leader's */
  Group *G;
  const RtCall *const *cs; /* the local members' calls, in the order of G->loc */
  size_t es;
  MPI_Datatype dt;
} Exec;

static int too_large(Exec *X) {
  return rtrun_fail(X->L->dev, RT_E_LIMIT, "%s over MPI: more than 2^31 elements in one MPI call (not supported yet)",
                    rtrun_coll_name(X->cs[0]->kind));
}

static int x_all_gather(Exec *X) {
  Group *G = X->G;
  const RtCall *c0 = X->cs[0];
  int n = G->n, nl = G->nloc;
  int64_t E = c0->extent * c0->inner, blk = c0->outer * E;
  size_t es = X->es;
  if (!fits_int(blk * n)) return too_large(X);
  const void *send = c0->in;
  void *recv;
  bool direct = G->R == n && c0->outer == 1; /* one member per rank: packed order is rank order */
  if (nl > 1) {
    char *s = stage(X->L, 0, (size_t)(nl * blk) * es);
    if (!s) return RT_E_NOMEM;
    for (int i = 0; i < nl; i++) memcpy(s + (size_t)(i * blk) * es, X->cs[i]->in, (size_t)blk * es);
    send = s;
  }
  recv = direct ? c0->out : stage(X->L, 1, (size_t)(n * blk) * es);
  if (!recv) return RT_E_NOMEM;
  if (G->R == 1) {
    if (recv != send) memcpy(recv, send, (size_t)(n * blk) * es);
  } else if (G->R == n) {
    NB(MPI_Iallgather, send, (int)blk, X->dt, recv, (int)blk, X->dt, G->comm);
  } else {
    int *cnt = X->L->counts, *dsp = cnt + G->R;
    for (int q = 0; q < G->R; q++) cnt[q] = (int)(G->cnt[q] * blk), dsp[q] = (int)(G->first[q] * blk);
    NB(MPI_Iallgatherv, send, (int)(nl * blk), X->dt, recv, cnt, dsp, X->dt, G->comm);
  }
  if (direct) return RT_OK;
  for (int i = 0; i < nl; i++) {
    char *out = X->cs[i]->out;
    for (int r = 0; r < n; r++) {
      const char *src = (const char *)recv + (size_t)(G->pos[r] * blk) * es;
      for (int64_t o = 0; o < c0->outer; o++)
        memcpy(out + (size_t)((o * n + r) * E) * es, src + (size_t)(o * E) * es, (size_t)E * es);
    }
  }
  return RT_OK;
}

static int x_reduce_scatter(Exec *X) {
  Group *G = X->G;
  const RtCall *c0 = X->cs[0];
  int n = G->n, nl = G->nloc, R = G->R;
  int64_t E = c0->extent * c0->inner, OE = c0->outer * E;
  size_t es = X->es;
  if (!fits_int(OE * n * nl)) return too_large(X);
  /* send: for each rank q, for each local member i, for each member r of q: block r of i's input */
  const char *send;
  char *recv = stage(X->L, 1, (size_t)(n * nl * OE) * es);
  if (!recv) return RT_E_NOMEM;
  bool direct_send = R == n && c0->outer == 1;
  if (direct_send) {
    send = c0->in;
  } else {
    char *s = stage(X->L, 0, (size_t)(n * nl * OE) * es);
    if (!s) return RT_E_NOMEM;
    size_t at = 0;
    for (int q = 0; q < R; q++)
      for (int i = 0; i < nl; i++)
        for (int k = 0; k < G->cnt[q]; k++) {
          int r = G->at[G->first[q] + k]; /* the k-th member of rank q */
          const char *in = X->cs[i]->in;
          for (int64_t o = 0; o < c0->outer; o++, at += (size_t)E * es)
            memcpy(s + at, in + (size_t)((o * n + r) * E) * es, (size_t)E * es);
        }
    send = s;
  }
  if (R == 1) {
    memcpy(recv, send, (size_t)(n * nl * OE) * es);
  } else if (R == n) {
    NB(MPI_Ialltoall, send, (int)OE, X->dt, recv, (int)OE, X->dt, G->comm);
  } else {
    int *sc = X->L->counts, *sd = sc + R, *rc = sd + R, *rd = rc + R;
    for (int q = 0, s = 0, r = 0; q < R; q++) {
      sc[q] = (int)(nl * G->cnt[q] * OE), sd[q] = s, s += sc[q];
      rc[q] = (int)(G->cnt[q] * nl * OE), rd[q] = r, r += rc[q];
    }
    NB(MPI_Ialltoallv, send, sc, sd, X->dt, recv, rc, rd, X->dt, G->comm);
  }
  /* recv: for each rank q, each of its members j, each local member i: block (j -> i) */
  const void **srcs = X->L->srcs;
  for (int i = 0; i < nl; i++) {
    for (int j = 0; j < n; j++) {
      size_t at = ((size_t)G->pos[j] * (size_t)nl + (size_t)i) * (size_t)OE;
      srcs[j] = recv + at * es;
    }
    rtk_reduce(c0->dtype, c0->op, X->cs[i]->out, srcs, n, (size_t)OE);
  }
  return RT_OK;
}

static void ar_chunk(int64_t count, int n, int r, size_t es, int64_t *lo, int64_t *hi) {
  int64_t line = (int64_t)(64 / es), per = (count + n - 1) / n;
  per = (per + line - 1) / line * line;
  *lo = r * per < count ? r * per : count;
  *hi = *lo + per < count ? *lo + per : count;
}

static int x_all_reduce(Exec *X) {
  Group *G = X->G;
  const RtCall *c0 = X->cs[0];
  int n = G->n, nl = G->nloc, R = G->R;
  int64_t C = c0->count;
  size_t es = X->es;
  const void **srcs = X->L->srcs;
  if (!fits_int(C * n)) return too_large(X);
  if ((size_t)C * es <= DIRECT_ALL_REDUCE_BYTES) {
    /* every rank gathers every input and reduces the whole buffer, in rank order */
    const void *send = c0->in;
    if (nl > 1) {
      char *s = stage(X->L, 0, (size_t)(nl * C) * es);
      if (!s) return RT_E_NOMEM;
      for (int i = 0; i < nl; i++) memcpy(s + (size_t)(i * C) * es, X->cs[i]->in, (size_t)C * es);
      send = s;
    }
    char *recv = stage(X->L, 1, (size_t)(n * C) * es);
    if (!recv) return RT_E_NOMEM;
    if (R == 1) memcpy(recv, send, (size_t)(n * C) * es);
    else if (R == n) NB(MPI_Iallgather, send, (int)C, X->dt, recv, (int)C, X->dt, G->comm);
    else {
      int *cnt = X->L->counts, *dsp = cnt + R;
      for (int q = 0; q < R; q++) cnt[q] = (int)(G->cnt[q] * C), dsp[q] = (int)(G->first[q] * C);
      NB(MPI_Iallgatherv, send, (int)(nl * C), X->dt, recv, cnt, dsp, X->dt, G->comm);
    }
    for (int j = 0; j < n; j++) srcs[j] = recv + (size_t)(G->pos[j] * C) * es;
    rtk_reduce(c0->dtype, c0->op, X->cs[0]->out, srcs, n, (size_t)C);
    for (int i = 1; i < nl; i++) memcpy(X->cs[i]->out, X->cs[0]->out, (size_t)C * es);
    return RT_OK;
  }
  /* chunk r belongs to group rank r: its owner reduces it (MPI_Alltoall(v) brings it every
   * member's chunk r), then every rank gathers the reduced chunks (MPI_Allgather(v)) */
  int64_t *lo = malloc((size_t)n * 2 * sizeof *lo), *hi = lo ? lo + n : NULL;
  if (!lo) return RT_E_NOMEM;
  for (int r = 0; r < n; r++) ar_chunk(C, n, r, es, &lo[r], &hi[r]);
  int64_t mine = 0; /* elements of this rank's members' chunks */
  for (int i = 0; i < nl; i++) mine += hi[G->loc[i]] - lo[G->loc[i]];
  int *sc = X->L->counts, *sd = sc + R, *rc = sd + R, *rd = rc + R;
  char *recv = stage(X->L, 1, (size_t)(n * mine > C ? n * mine : C) * es);
  if (!recv) {
    free(lo);
    return RT_E_NOMEM;
  }
  if (R == n && R > 1) { /* one member per rank: straight from the input, the result gathered in place */
    for (int q = 0; q < R; q++) sc[q] = (int)(hi[q] - lo[q]), sd[q] = (int)lo[q], rc[q] = (int)mine, rd[q] = (int)(q * mine);
    NB(MPI_Ialltoallv, c0->in, sc, sd, X->dt, recv, rc, rd, X->dt, G->comm);
    for (int j = 0; j < n; j++) srcs[j] = recv + (size_t)(j * mine) * es;
    int me = G->loc[0];
    rtk_reduce(c0->dtype, c0->op, (char *)c0->out + (size_t)lo[me] * es, srcs, n, (size_t)(hi[me] - lo[me]));
    for (int q = 0; q < R; q++) rc[q] = (int)(hi[q] - lo[q]), rd[q] = (int)lo[q];
    NB(MPI_Iallgatherv, MPI_IN_PLACE, 0, X->dt, c0->out, rc, rd, X->dt, G->comm);
    free(lo);
    return RT_OK;
  }
  /* send to rank q: for each local member i, for each member r of q: chunk r of i's input */
  char *s = stage(X->L, 0, (size_t)(nl * C > mine ? nl * C : mine) * es);
  if (!s) {
    free(lo);
    return RT_E_NOMEM;
  }
  size_t at = 0;
  for (int q = 0; q < R; q++) {
    size_t from = at;
    for (int i = 0; i < nl; i++)
      for (int k = 0; k < G->cnt[q]; k++) {
        int r = G->at[G->first[q] + k];
        memcpy(s + at * es, (const char *)X->cs[i]->in + (size_t)lo[r] * es, (size_t)(hi[r] - lo[r]) * es);
        at += (size_t)(hi[r] - lo[r]);
      }
    sc[q] = (int)(at - from), sd[q] = (int)from;
  }
  /* received from rank q: for each of its members j, for each local member i: chunk loc[i] of j */
  for (int q = 0, o = 0; q < R; q++) rc[q] = (int)(G->cnt[q] * mine), rd[q] = o, o += rc[q];
  if (R == 1) memcpy(recv, s, (size_t)(n * mine) * es);
  else NB(MPI_Ialltoallv, s, sc, sd, X->dt, recv, rc, rd, X->dt, G->comm);
  int64_t off = 0; /* where local member i's chunk starts within one member's part */
  for (int i = 0; i < nl; i++) {
    int r = G->loc[i];
    for (int j = 0; j < n; j++) srcs[j] = recv + (size_t)(G->pos[j] * mine + off) * es;
    rtk_reduce(c0->dtype, c0->op, (char *)X->cs[i]->out + (size_t)lo[r] * es, srcs, n, (size_t)(hi[r] - lo[r]));
    off += hi[r] - lo[r];
  }
  /* the reduced chunks, this rank's in the order of loc, every rank's to every local member */
  at = 0;
  for (int i = 0; i < nl; i++) {
    int r = G->loc[i];
    memcpy(s + at * es, (const char *)X->cs[i]->out + (size_t)lo[r] * es, (size_t)(hi[r] - lo[r]) * es);
    at += (size_t)(hi[r] - lo[r]);
  }
  for (int q = 0, o = 0; q < R; q++) {
    int64_t len = 0;
    for (int k = 0; k < G->cnt[q]; k++) len += hi[G->at[G->first[q] + k]] - lo[G->at[G->first[q] + k]];
    rc[q] = (int)len, rd[q] = o, o += (int)len;
  }
  if (R == 1) memcpy(recv, s, (size_t)C * es);
  else NB(MPI_Iallgatherv, s, (int)mine, X->dt, recv, rc, rd, X->dt, G->comm);
  for (int q = 0; q < R; q++) {
    int64_t o = rd[q];
    for (int k = 0; k < G->cnt[q]; k++) {
      int j = G->at[G->first[q] + k];
      for (int i = 0; i < nl; i++)
        if (G->loc[i] != j) memcpy((char *)X->cs[i]->out + (size_t)lo[j] * es, recv + (size_t)o * es, (size_t)(hi[j] - lo[j]) * es);
      o += hi[j] - lo[j];
    }
  }
  free(lo);
  return RT_OK;
}

static int x_all_to_all(Exec *X) {
  Group *G = X->G;
  const RtCall *c0 = X->cs[0];
  int n = G->n, nl = G->nloc, R = G->R, nd = c0->nd, a = c0->split_dim, b = c0->concat_dim;
  size_t es = X->es;
  int64_t box[RT_MAX_RANK], out_shape[RT_MAX_RANK], in_stride[RT_MAX_RANK], out_stride[RT_MAX_RANK], box_stride[RT_MAX_RANK];
  memcpy(box, c0->shape, (size_t)nd * sizeof *box);
  box[a] /= n;
  memcpy(out_shape, box, (size_t)nd * sizeof *box);
  out_shape[b] *= n;
  rtk_row_major_strides(c0->shape, nd, in_stride);
  rtk_row_major_strides(out_shape, nd, out_stride);
  rtk_row_major_strides(box, nd, box_stride);
  int64_t V = 1;
  for (int i = 0; i < nd; i++) V *= box[i];
  if (!fits_int(V * n * nl)) return too_large(X);
  char *s = stage(X->L, 0, (size_t)(n * nl * V) * es), *recv = stage(X->L, 1, (size_t)(n * nl * V) * es);
  if (!s || !recv) return RT_E_NOMEM;
  /* send: for each rank q, each local member i, each member r of q: i's block r */
  size_t at = 0;
  for (int q = 0; q < R; q++)
    for (int i = 0; i < nl; i++)
      for (int k = 0; k < G->cnt[q]; k++) {
        int r = G->at[G->first[q] + k];
        const char *src = (const char *)X->cs[i]->in + (size_t)(r * box[a] * in_stride[a]) * es;
        rtk_copy_box(s + at * es, box_stride, src, in_stride, box, nd, es);
        at += (size_t)V;
      }
  if (R == 1) memcpy(recv, s, at * es);
  else if (R == n) NB(MPI_Ialltoall, s, (int)V, X->dt, recv, (int)V, X->dt, G->comm);
  else {
    int *sc = X->L->counts, *sd = sc + R, *rc = sd + R, *rd = rc + R;
    for (int q = 0, o = 0; q < R; q++) sc[q] = rc[q] = (int)(nl * G->cnt[q] * V), sd[q] = rd[q] = o, o += sc[q];
    NB(MPI_Ialltoallv, s, sc, sd, X->dt, recv, rc, rd, X->dt, G->comm);
  }
  /* recv: for each rank q, each of its members j, each local member i: j's block for i */
  for (int i = 0; i < nl; i++)
    for (int j = 0; j < n; j++) {
      size_t from = ((size_t)G->pos[j] * (size_t)nl + (size_t)i) * (size_t)V;
      char *dst = (char *)X->cs[i]->out + (size_t)(j * box[b] * out_stride[b]) * es;
      rtk_copy_box(dst, out_stride, recv + from * es, box_stride, box, nd, es);
    }
  return RT_OK;
}

/* The local members meet (T > 1); the leader (loc[0]) runs the data step for all of them. */
typedef struct MeetWait {
  _Atomic uint32_t *word;
  uint32_t target;
} MeetWait;

static bool reached(void *p) {
  MeetWait *w = p;
  return (int32_t)(atomic_load_explicit(w->word, memory_order_acquire) - w->target) >= 0;
}

static int (*const exec_of[RT_COLL_COUNT])(Exec *) = {
    [RT_COLL_ALL_GATHER] = x_all_gather,
    [RT_COLL_REDUCE_SCATTER] = x_reduce_scatter,
    [RT_COLL_ALL_REDUCE] = x_all_reduce,
    [RT_COLL_ALL_TO_ALL] = x_all_to_all,
};

/* What every call on a group does first: stop if the run is stopping, find the group, say where
 * the device waits and meet the group's other members. On success the device's "where" stays set
 * (the caller clears it when the call is done); on failure it is cleared. */
static int group_enter(RtDevice *dev, const RtGroup *g, const RtCall *c, Group **G) {
  if (stopped_at_entry(dev)) return RT_E_STOPPED;
  *G = group_get(dev, g);
  if (!*G) return rtrun_fail(dev, RT_E_NOMEM, "out of memory for the group %s", g->text);
  mirror_where(dev);
  int rc = meet(dev, g, *G, c);
  if (rc) mirror_clear(dev);
  return rc;
}

static int collective(RtDevice *dev, const RtGroup *g, const RtCall *c) {
  Runtime *rt = dev->rt;
  Mpi *M = state(rt);
  Group *G;
  int rc = group_enter(dev, g, c, &G);
  if (rc) return rc;
  int li = 0;
  while (G->loc[li] != g->rank) li++;
  const RtCall *one[1] = {c};
  Exec X = {rt, M, local_of(dev), G, one, rt_dtype_size(c->dtype), elem_type(rt_dtype_size(c->dtype))};
  if (G->nloc == 1) {
    rc = group_comm(M, G);
    if (!rc) rc = exec_of[c->kind](&X);
  } else {
    uint32_t k = G->count[li]++;
    G->slot[li] = c;
    atomic_fetch_add_explicit(&G->arrived, 1, memory_order_acq_rel);
    if (li) rtsync_ring(&G->bell, &G->sleepers); /* the leader may sleep on it */
    if (li == 0) {
      MeetWait w = {&G->arrived, (k + 1) * (uint32_t)G->nloc};
      rtsync_wait(dev, &(RtWait){reached, NULL, &w, false, &G->bell, &G->sleepers});
      X.cs = G->slot;
      rc = group_comm(M, G);
      if (!rc) rc = exec_of[c->kind](&X);
      G->result = rc;
      atomic_store_explicit(&G->finished, k + 1, memory_order_release);
      rtsync_ring(&G->bell, &G->sleepers);
    } else {
      MeetWait w = {&G->finished, k + 1};
      rtsync_wait(dev, &(RtWait){reached, NULL, &w, false, &G->bell, &G->sleepers});
      rc = G->result;
    }
  }
  mirror_clear(dev);
  if (rc == RT_E_NOMEM) return rtrun_fail(dev, rc, "out of memory for %s's staging buffers", rtrun_coll_name(c->kind));
  if (rc == RT_E_SYS) return rtrun_fail(dev, rc, "MPI could not make the communicator of %s", g->text);
  return rc;
}

static int barrier_mpi(RtDevice *dev, const RtGroup *g, const RtCall *c) {
  Group *G;
  int rc = group_enter(dev, g, c, &G);
  if (!rc) mirror_clear(dev);
  return rc;
}

/* ---- permutes: point to point on the signature channels (tag TAG_PERM) ---- */

typedef struct PermState {
  MPI_Request req[2];
  int zero;
} PermState;

static int perm_dst(const RtGroup *g, const RtCall *c) {
  int n = g->size;
  if (!c->pairs) return (int)((g->rank + ((int64_t)c->shift % n + n)) % n);
  for (int i = 0; i < c->npairs; i++)
    if (c->pairs[2 * i] == g->rank) return c->pairs[2 * i + 1];
  return -1;
}

static int perm_post(RtDevice *dev, const RtGroup *g, const RtCall *c, PermState *p) {
  Runtime *rt = dev->rt;
  Mpi *M = state(rt);
  Group *G;
  int rc = group_enter(dev, g, c, &G);
  if (rc) return rc;
  size_t es = rt_dtype_size(c->dtype);
  if (!fits_int(c->count)) {
    mirror_clear(dev);
    return rtrun_fail(dev, RT_E_LIMIT, "collective_permute over MPI: more than 2^31 elements (not supported yet)");
  }
  p->req[0] = p->req[1] = MPI_REQUEST_NULL;
  int dst = perm_dst(g, c), me = dev->index;
  p->zero = c->src_of_me < 0;
  if (c->src_of_me >= 0 && c->src_of_me == g->rank) {
    memcpy(c->out, c->in, (size_t)c->count * es); /* a shift by a multiple of n */
    return RT_OK;
  }
  if (c->src_of_me >= 0) {
    int src = G->members[c->src_of_me];
    MPI_Irecv(c->out, (int)c->count, elem_type(es), src / M->T, sig_tag(M, TAG_PERM, src, me), M->sigc, &p->req[0]);
  }
  if (dst >= 0) {
    int d = G->members[dst];
    MPI_Isend(c->in, (int)c->count, elem_type(es), d / M->T, sig_tag(M, TAG_PERM, me, d), M->sigc, &p->req[1]);
  }
  return RT_OK;
}

/* Bounded: every member posted its part. */
static int perm_finish(RtDevice *dev, const RtCall *c, PermState *p) {
  Backoff b = {0};
  for (;;) {
    int flag = 0;
    MPI_Testall(2, p->req, &flag, MPI_STATUSES_IGNORE);
    if (flag) break;
    backoff(state(dev->rt), &b);
  }
  if (p->zero) memset(c->out, 0, (size_t)c->count * rt_dtype_size(c->dtype));
  mirror_clear(dev);
  return RT_OK;
}

static int permute_mpi(RtDevice *dev, const RtGroup *g, const RtCall *c) {
  PermState p;
  int rc = perm_post(dev, g, c, &p);
  return rc ? rc : perm_finish(dev, c, &p);
}

static int permute_start(RtDevice *dev, const RtGroup *g, const RtCall *c, RtRequest *req) {
  PermState *p = malloc(sizeof *p);
  if (!p) return rtrun_fail(dev, RT_E_NOMEM, "out of memory for a permute request");
  int rc = perm_post(dev, g, c, p);
  if (rc) {
    free(p);
    return rc;
  }
  mirror_clear(dev);
  req->state = p;
  return RT_OK;
}

static int wait_request(RtDevice *dev, RtRequest *req) {
  PermState *p = req->state;
  mirror_where(dev);
  int rc = perm_finish(dev, &req->c, p);
  free(p);
  req->state = NULL;
  return rc;
}

/* ---- point to point ---- */

static int send_mpi(RtDevice *dev, int dst, int tag, const void *buf, size_t bytes) {
  Runtime *rt = dev->rt;
  Mpi *M = state(rt);
  if (tag < 0) return rtrun_fail(dev, RT_E_ARG, "send to device %d with tag %d: MPI's tags are >= 0", dst, tag);
  if (bytes > 0x7fffffff) return rtrun_fail(dev, RT_E_LIMIT, "send of %zu bytes over MPI: more than 2 GiB (not supported yet)", bytes);
  if (stopped_at_entry(dev)) return RT_E_STOPPED;
  char name[64];
  snprintf(name, sizeof name, "message to device %d (tag %d)", dst, tag);
  void *copy;
  int rc = rt_alloc(dev, bytes ? bytes : 1, name, &copy);
  if (rc) return rc;
  if (bytes) memcpy(copy, buf, bytes);
  Local *L = local_of(dev);
  MPI_Request req;
  MPI_Isend(copy, (int)bytes, MPI_BYTE, dst / M->T, tag, data_comm(M, dev->index, dst), &req);
  L->sent[dst]++;
  if (outgoing(L, req, copy, dev)) {
    MPI_Wait(&req, MPI_STATUS_IGNORE);
    rt_free(dev, copy);
  }
  progress_outgoing(L);
  return RT_OK;
}

static int recv_mpi(RtDevice *dev, int src, int tag, void *buf, size_t bytes) {
  Runtime *rt = dev->rt;
  Mpi *M = state(rt);
  Local *L = local_of(dev);
  if (tag < 0) return rtrun_fail(dev, RT_E_ARG, "recv from device %d with tag %d: MPI's tags are >= 0", src, tag);
  if (stopped_at_entry(dev)) return RT_E_STOPPED;
  MPI_Comm comm = data_comm(M, src, dev->index);
  double deadline = rt_seconds() + rt->timeout_s;
  Backoff b = {0};
  mirror_where(dev);
  for (;;) {
    int flag = 0;
    MPI_Message msg;
    MPI_Status st;
    MPI_Improbe(src / M->T, tag, comm, &flag, &msg, &st);
    if (flag) {
      int count = 0;
      MPI_Get_count(&st, MPI_BYTE, &count);
      void *into = (size_t)count == bytes ? buf : malloc(count > 0 ? (size_t)count : 1);
      MPI_Mrecv(into ? into : buf, into ? count : 0, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
      L->chan[src].recvd++;
      mirror_clear(dev);
      if (into != buf) {
        free(into);
        return rtrun_fail(dev, RT_E_MISMATCH, "recv from device %d (tag %d) of %zu bytes: the send has %d", src, tag, bytes, count);
      }
      return RT_OK;
    }
    progress_outgoing(L);
    if (poll_stop(rt)) {
      mirror_clear(dev);
      return RT_E_STOPPED;
    }
    const Sig *s = chan_peek(M, L, src);
    if (s && s->what == SIG_DONE && L->chan[src].recvd >= s->sent) {
      /* the sender returned, and every message it sent this device was received */
      mirror_clear(dev);
      return rtrun_fail(dev, RT_E_MISMATCH, "recv from device %d (tag %d): %s (returned from its entry function) without sending it",
                        src, tag, rt->devices[src].label);
    }
    if (rt_seconds() > deadline) {
      mirror_clear(dev);
      char what[96];
      snprintf(what, sizeof what, "recv from device %d (tag %d)", src, tag);
      return fail_timeout(dev, what, &src, 1);
    }
    backoff(M, &b);
  }
}

/* ---- running ---- */

/* After the entry function: DONE to every other device, with the count of messages sent it. */
static void send_done(Mpi *M, Local *L, int ndev) {
  Sig done;
  memset(&done, 0, sizeof done);
  done.epoch = M->epoch, done.what = SIG_DONE;
  for (int m = 0; m < ndev; m++) {
    if (m == L->dev->index) continue;
    done.sent = L->sent[m];
    send_sig(M, L, m, &done);
  }
}

static void device_main(Local *L) {
  Mpi *M = state(L->dev->rt);
  rtrun_device_main(L->dev);
  if (M->status) atomic_store(&M->status[L->dev->index].done, 1);
  send_done(M, L, L->dev->rt->ndev);
}

static void *device_thread(void *p) {
  device_main(p);
  return NULL;
}

/* Ends the job: a rank that does not finish after a stop. */
static double grace(const Runtime *rt) { return rt->timeout_s > STOP_GRACE_S ? rt->timeout_s : STOP_GRACE_S; }

static void give_up(Runtime *rt, const char *who) {
  fprintf(stderr, "error: %s\nerror: the run stopped, but %s did not finish within %g s; ending the job (MPI_Abort)\n", rt->err, who,
          grace(rt));
  fflush(stderr);
  rtmpi_mark_aborting();
  MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Waits for a request; after a stop, for at most the timeout (then ends the job). */
static void await(Runtime *rt, MPI_Request *req, const char *who) {
  Mpi *M = state(rt);
  Backoff b = {0};
  for (;;) {
    int flag = 0;
    MPI_Test(req, &flag, MPI_STATUS_IGNORE);
    if (flag) return;
    for (int i = 0; i < M->T; i++) progress_outgoing(&M->local[i]);
    if (poll_stop(rt) && rt_seconds() > M->stopped_at + grace(rt)) give_up(rt, who);
    backoff(M, &b);
  }
}

/* Reads every channel up to its device's DONE, then the messages no recv took. */
static void drain(Runtime *rt) {
  Mpi *M = state(rt);
  for (int i = 0; i < M->T; i++) {
    Local *L = &M->local[i];
    for (int m = 0; m < rt->ndev; m++) {
      if (m == L->dev->index) continue;
      Chan *ch = &L->chan[m];
      while (!ch->done) {
        Sig s;
        Backoff b = {0};
        while (!chan_take(M, L, m, &s)) {
          for (int k = 0; k < M->T; k++) progress_outgoing(&M->local[k]);
          if (poll_stop(rt) && rt_seconds() > M->stopped_at + grace(rt)) give_up(rt, rt->devices[m].label);
          backoff(M, &b);
        }
        if (s.what == SIG_DONE) ch->done = 1, ch->sent = s.sent;
      }
      MPI_Comm comm = data_comm(M, m, L->dev->index);
      while (ch->recvd < ch->sent) { /* sent here, never received: taken and dropped */
        int flag = 0;
        MPI_Message msg;
        MPI_Status st;
        MPI_Improbe(m / M->T, MPI_ANY_TAG, comm, &flag, &msg, &st);
        if (!flag) {
          struct timespec ts = {0, 20000};
          nanosleep(&ts, NULL);
          continue;
        }
        int count = 0;
        MPI_Get_count(&st, MPI_BYTE, &count);
        void *tmp = malloc(count > 0 ? (size_t)count : 1);
        MPI_Mrecv(tmp, tmp ? count : 0, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
        free(tmp);
        ch->recvd++;
      }
    }
  }
  for (int i = 0; i < M->T; i++) {
    Local *L = &M->local[i];
    while (L->nout) {
      progress_outgoing(L);
      if (L->nout) {
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
      }
    }
  }
}

/* The ranks agree on the run's outcome and share their devices' figures. */
static void agree(Runtime *rt) {
  Mpi *M = state(rt);
  size_t size = sizeof(Report) + (size_t)M->T * sizeof(DevStat);
  Report *mine = calloc(1, size), *all = calloc((size_t)M->nranks, size);
  if (!mine || !all) {
    fprintf(stderr, "error: out of memory at the end of an MPI run\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  pthread_mutex_lock(&rt->err_lock);
  mine->code = rt->err_code;
  mine->origin = rt->err_code && !atomic_load(&M->stop_remote);
  mine->broadcast = atomic_load(&M->stop_sent);
  snprintf(mine->text, sizeof mine->text, "%s", rt->err);
  mine->nmissing = M->nmissing, mine->cut = M->cut;
  memcpy(mine->missing, M->missing, sizeof M->missing);
  pthread_mutex_unlock(&rt->err_lock);
  for (int i = 0; i < M->T; i++) {
    Local *L = &M->local[i];
    RtDevice *d = L->dev;
    DevStat *s = &mine->dev[i];
    pthread_mutex_lock(&d->mem.lock);
    s->peak = d->mem.peak, s->current = d->mem.current, s->allocs = d->mem.allocs;
    pthread_mutex_unlock(&d->mem.lock);
    s->ncoll = d->ncoll, s->coll_s = d->coll_seconds, s->clock[0] = d->clock[0], s->clock[1] = d->clock[1];
    s->where = L->snapped ? L->snap_where : 0;
    s->line = L->snapped ? L->snap_line : 0;
    s->done = L->snapped ? L->snap_done : 1;
  }
  MPI_Request req;
  MPI_Iallgather(mine, (int)size, MPI_BYTE, all, (int)size, MPI_BYTE, M->ctl, &req);
  await(rt, &req, "another rank");
  int broadcasts = 0, chosen = -1;
  for (int q = 0; q < M->nranks; q++) {
    const Report *r = (const Report *)((const char *)all + (size_t)q * size);
    broadcasts += r->broadcast;
    if (r->code && r->origin && chosen < 0) chosen = q;
    for (int i = 0; i < M->T; i++) {
      RtDevice *d = &rt->devices[q * M->T + i];
      const DevStat *s = &r->dev[i];
      if (q != M->rank) {
        pthread_mutex_lock(&d->mem.lock);
        d->mem.peak = s->peak, d->mem.current = s->current, d->mem.allocs = s->allocs;
        pthread_mutex_unlock(&d->mem.lock);
        d->ncoll = s->ncoll, d->coll_seconds = s->coll_s, d->clock[0] = s->clock[0], d->clock[1] = s->clock[1];
      }
      /* what each was doing when the run stopped (for the message below) */
      atomic_store(&d->where, s->where);
      atomic_store(&d->done, s->done);
      atomic_store_explicit(&d->line, s->line, memory_order_relaxed);
    }
  }
  for (int q = 0; chosen < 0 && q < M->nranks; q++)
    if (((const Report *)((const char *)all + (size_t)q * size))->code) chosen = q;
  if (chosen >= 0) {
    const Report *r = (const Report *)((const char *)all + (size_t)chosen * size);
    char text[RT_ERR_MAX];
    snprintf(text, sizeof text, "%s", r->text);
    if (r->nmissing > 0 && r->cut > 0 && r->cut < (int)sizeof text) { /* a timeout: who was missing, doing what */
      size_t len = (size_t)r->cut;
      text[len] = 0;
      for (int i = 0; i < r->nmissing && i < 3 && len < sizeof text; i++) {
        char who[RT_LABEL_MAX + 96];
        rtrun_describe(rt, r->missing[i], who, sizeof who);
        len += (size_t)snprintf(text + len, sizeof text - len, "%s%s", i ? ", " : "", who);
      }
      if (r->nmissing > 3 && len < sizeof text) snprintf(text + len, sizeof text - len, " and %d more", r->nmissing - 3);
    }
    pthread_mutex_lock(&rt->err_lock);
    rt->err_code = r->code;
    snprintf(rt->err, sizeof rt->err, "%s", text);
    pthread_mutex_unlock(&rt->err_lock);
  }
  /* the stop messages still on their way here */
  int expect = broadcasts - (atomic_load(&M->stop_sent) ? 1 : 0);
  while (M->stop_received < expect) {
    if (M->stop_req == MPI_REQUEST_NULL)
      MPI_Irecv(&M->stop_in, sizeof M->stop_in, MPI_BYTE, MPI_ANY_SOURCE, TAG_STOP, M->ctl, &M->stop_req);
    MPI_Wait(&M->stop_req, MPI_STATUS_IGNORE);
    M->stop_received++;
  }
  if (M->stop_req == MPI_REQUEST_NULL)
    MPI_Irecv(&M->stop_in, sizeof M->stop_in, MPI_BYTE, MPI_ANY_SOURCE, TAG_STOP, M->ctl, &M->stop_req);
  if (atomic_load(&M->stop_sent)) MPI_Waitall(M->nranks, M->stop_sends, MPI_STATUSES_IGNORE);
  free(mine);
  free(all);
}

static int run_mpi(Runtime *rt) {
  Mpi *M = state(rt);
  M->epoch++;
  M->stop_received = 0, M->stopped_at = 0, M->nmissing = 0, M->cut = 0;
  atomic_store(&M->stop_remote, 0);
  atomic_store(&M->stop_sent, 0);
  for (int r = 0; r < M->nranks; r++) M->stop_sends[r] = MPI_REQUEST_NULL;
  for (int i = 0; i < M->T; i++) {
    Local *L = &M->local[i];
    for (int m = 0; m < rt->ndev; m++) {
      Chan *ch = &L->chan[m];
      ch->have = 0, ch->done = 0, ch->sent = 0, ch->recvd = 0;
      L->sent[m] = 0;
    }
    L->snapped = 0;
    if (M->status) atomic_store(&M->status[L->dev->index].done, 0);
  }
  int rc = RT_OK;
  if (M->T == 1) {
    device_main(&M->local[0]);
  } else {
    pthread_t *th = calloc((size_t)M->T, sizeof *th);
    int started = 0;
    for (; th && started < M->T; started++) {
      int err = pthread_create(&th[started], NULL, device_thread, &M->local[started]);
      if (err) {
        rc = rtrun_fail(M->local[started].dev, RT_E_SYS, "could not start its thread: %s", strerror(err));
        break;
      }
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    for (int i = started; i < M->T; i++) send_done(M, &M->local[i], rt->ndev); /* never started: done */
    free(th);
  }
  if (rtrun_stopped(rt)) snapshot(rt);
  drain(rt);
  agree(rt);
  return rc;
}

/* ---- open, close ---- */

static void close_mpi(Runtime *rt) {
  Mpi *M = state(rt);
  if (!M) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) { /* too late to free MPI's objects: only ours */
    fprintf(stderr, "shardrt: a runtime on the MPI backend was closed after rt_mpi_finalize\n");
    abort();
  }
  if (M->stop_req != MPI_REQUEST_NULL) {
    MPI_Cancel(&M->stop_req);
    MPI_Wait(&M->stop_req, MPI_STATUS_IGNORE);
  }
  for (int i = 0; M->local && i < M->T; i++) {
    Local *L = &M->local[i];
    for (int m = 0; L->chan && m < rt->ndev; m++)
      if (L->chan[m].req != MPI_REQUEST_NULL) {
        MPI_Cancel(&L->chan[m].req);
        MPI_Wait(&L->chan[m].req, MPI_STATUS_IGNORE);
      }
    for (int k = 0; k < L->nout; k++) {
      MPI_Wait(&L->out[k].req, MPI_STATUS_IGNORE);
      free_outgoing(&L->out[k]);
    }
    free(L->out), free(L->chan), free(L->sent), free(L->stage[0]), free(L->stage[1]), free(L->counts), free(L->srcs);
  }
  for (int b = 0; b < GROUP_BUCKETS; b++)
    while (M->buckets[b]) {
      Group *G = M->buckets[b];
      M->buckets[b] = G->next;
      group_free(G);
    }
  for (int i = 0; M->data && i < M->T * M->T; i++)
    if (M->data[i] != MPI_COMM_NULL) MPI_Comm_free(&M->data[i]);
  if (M->sigc != MPI_COMM_NULL) MPI_Comm_free(&M->sigc);
  if (M->ctl != MPI_COMM_NULL) MPI_Comm_free(&M->ctl);
  if (M->gparent != MPI_COMM_NULL) MPI_Comm_free(&M->gparent);
  for (int i = rt->local_lo; i < rt->local_hi; i++) rt->devices[i].line_mirror = NULL;
  pthread_mutex_destroy(&M->groups_lock);
  pthread_mutex_destroy(&M->poll_lock);
  free(M->data), free(M->local), free(M->stop_sends);
  free(M);
  rt->backend_state = NULL;
}

static int open_mpi(Runtime *rt) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (!inited || finalized) {
    snprintf(rt->err, sizeof rt->err, "the MPI backend needs MPI started (rt_mpi_init) and not yet ended");
    return RT_E_SYS;
  }
  int size, rank, provided;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Query_thread(&provided);
  int T = rt->threads_per_rank, need = rt->ndev / T;
  if (size != need) {
    char mesh[256];
    size_t len = (size_t)snprintf(mesh, sizeof mesh, "[");
    for (int a = 0; a < rt->naxes && len < sizeof mesh; a++)
      len += (size_t)snprintf(mesh + len, sizeof mesh - len, "%s%s: %d", a ? ", " : "", rt->axis_name[a], rt->axis_size[a]);
    if (len < sizeof mesh) snprintf(mesh + len, sizeof mesh - len, "]");
    snprintf(rt->err, sizeof rt->err,
             "mesh %s has %d device%s and the MPI backend runs %d per rank, so the job needs %d rank%s (mpirun -np %d); "
             "this one has %d",
             mesh, rt->ndev, rt->ndev == 1 ? "" : "s", T, need, need == 1 ? "" : "s", need, size);
    return RT_E_ARG;
  }
  if (T > 1 && provided < MPI_THREAD_MULTIPLE) {
    snprintf(rt->err, sizeof rt->err, "%d threads per rank need MPI_THREAD_MULTIPLE, which this MPI does not provide", T);
    return RT_E_SYS;
  }
  Mpi *M = calloc(1, sizeof *M);
  if (!M) return RT_E_NOMEM;
  rt->backend_state = M;
  M->T = T, M->rank = rank, M->nranks = size, M->lo = rank * T;
  rt->local_lo = M->lo, rt->local_hi = M->lo + T, rt->process_rank = rank, rt->process_count = size;
  pthread_mutex_init(&M->groups_lock, NULL);
  pthread_mutex_init(&M->poll_lock, NULL);
  M->ctl = M->gparent = M->sigc = MPI_COMM_NULL;
  M->stop_req = MPI_REQUEST_NULL;
  const char *local_size = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  long cores = sysconf(_SC_NPROCESSORS_ONLN), here = local_size ? atol(local_size) : size;
  M->spin = here * T <= cores;
  M->data = malloc((size_t)(T * T) * sizeof *M->data);
  M->local = calloc((size_t)T, sizeof *M->local);
  M->stop_sends = malloc((size_t)size * sizeof *M->stop_sends);
  if (!M->data || !M->local || !M->stop_sends) {
    free(M->data), M->data = NULL;
    close_mpi(rt);
    return RT_E_NOMEM;
  }
  /* every rank makes the same communicators in the same order */
  MPI_Comm_dup(MPI_COMM_WORLD, &M->ctl);
  MPI_Comm_dup(MPI_COMM_WORLD, &M->gparent);
  MPI_Comm_dup(MPI_COMM_WORLD, &M->sigc);
  for (int i = 0; i < T * T; i++) MPI_Comm_dup(MPI_COMM_WORLD, &M->data[i]);
  for (int r = 0; r < size; r++) M->stop_sends[r] = MPI_REQUEST_NULL;
  RtStatusFile *sf = rtmpi_status(rt->ndev, size);
  M->status = sf ? rt_status_devices(sf) : NULL;
  for (int i = 0; i < T; i++) {
    Local *L = &M->local[i];
    L->dev = &rt->devices[M->lo + i];
    L->chan = calloc((size_t)rt->ndev, sizeof *L->chan);
    L->sent = calloc((size_t)rt->ndev, sizeof *L->sent);
    L->counts = calloc((size_t)(4 * size), sizeof *L->counts);
    L->srcs = calloc((size_t)rt->ndev, sizeof *L->srcs);
    if (!L->chan || !L->sent || !L->counts || !L->srcs) {
      close_mpi(rt);
      return RT_E_NOMEM;
    }
    for (int m = 0; m < rt->ndev; m++) L->chan[m].req = MPI_REQUEST_NULL;
    if (M->status) L->dev->line_mirror = &M->status[L->dev->index].line;
  }
  MPI_Irecv(&M->stop_in, sizeof M->stop_in, MPI_BYTE, MPI_ANY_SOURCE, TAG_STOP, M->ctl, &M->stop_req);
  const char *kill = getenv("SHARDC_MPI_KILL");
  M->kill_device = -1;
  if (kill && sscanf(kill, "%d:%llu", &M->kill_device, (unsigned long long *)&M->kill_at) != 2) M->kill_device = -1;
  M->kill_exit = kill && strstr(kill, ":exit") != NULL;
  return RT_OK;
}

/* ---- the host: a device's buffer to rank 0 (rt_fetch_to_root; scratch NULL on rank 0: the block
 * is received and dropped, so that the owner is not left waiting) ---- */

static void send_bytes(const void *buf, size_t bytes, int to, MPI_Comm comm) {
  for (size_t at = 0; at < bytes;) {
    int k = bytes - at > (1u << 30) ? 1 << 30 : (int)(bytes - at);
    MPI_Send((const char *)buf + at, k, MPI_BYTE, to, TAG_FETCH, comm);
    at += (size_t)k;
  }
}

static void recv_bytes(void *buf, size_t bytes, int from, MPI_Comm comm) {
  for (size_t at = 0; at < bytes;) {
    int k = bytes - at > (1u << 30) ? 1 << 30 : (int)(bytes - at);
    MPI_Recv((char *)buf + at, k, MPI_BYTE, from, TAG_FETCH, comm, MPI_STATUS_IGNORE);
    at += (size_t)k;
  }
}

static const void *fetch_to_root(Runtime *rt, int device, const void *buf, size_t bytes, void *scratch) {
  Mpi *M = state(rt);
  int owner = device / M->T;
  if (owner == 0) return M->rank == 0 ? buf : NULL;
  if (M->rank == owner) {
    int have = buf != NULL;
    MPI_Send(&have, 1, MPI_INT, 0, TAG_FETCH, M->ctl);
    if (have) send_bytes(buf, bytes, 0, M->ctl);
    return NULL;
  }
  if (M->rank != 0) return NULL;
  int have = 0;
  MPI_Recv(&have, 1, MPI_INT, owner, TAG_FETCH, M->ctl, MPI_STATUS_IGNORE);
  if (!have) return NULL;
  void *into = scratch ? scratch : malloc(bytes ? bytes : 1); /* no scratch: taken and dropped */
  if (!into) {
    fprintf(stderr, "error: out of host memory for a block of %zu bytes from rank %d\n", bytes, owner);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  recv_bytes(into, bytes, owner, M->ctl);
  if (!scratch) free(into);
  return scratch;
}

static int processes_agree(Runtime *rt, int ok, char *msg, size_t n) {
  Mpi *M = state(rt);
  int first_bad = ok ? M->nranks : M->rank, worst;
  MPI_Allreduce(&first_bad, &worst, 1, MPI_INT, MPI_MIN, M->ctl);
  if (worst == M->nranks) return 1;
  char text[RT_ERR_MAX] = "";
  if (M->rank == worst && msg) snprintf(text, sizeof text, "%s", msg);
  MPI_Bcast(text, sizeof text, MPI_CHAR, worst, M->ctl);
  if (msg && n) snprintf(msg, n, "%s", text);
  return 0;
}

static void bcast_from_root(Runtime *rt, void *buf, size_t bytes) {
  Mpi *M = state(rt);
  for (size_t at = 0; at < bytes;) {
    int k = bytes - at > (1u << 30) ? 1 << 30 : (int)(bytes - at);
    MPI_Bcast((char *)buf + at, k, MPI_BYTE, 0, M->ctl);
    at += (size_t)k;
  }
}

const RtBackend rt_mpi_backend = {
    .name = "mpi",
    .open = open_mpi,
    .close = close_mpi,
    .run = run_mpi,
    .stop = stop_mpi,
    .all_gather = collective,
    .reduce_scatter = collective,
    .all_reduce = collective,
    .all_to_all = collective,
    .permute = permute_mpi,
    .barrier = barrier_mpi,
    .send = send_mpi,
    .recv = recv_mpi,
    .permute_start = permute_start,
    .wait_request = wait_request,
    .fetch_to_root = fetch_to_root,
    .processes_agree = processes_agree,
    .bcast_from_root = bcast_from_root,
};
