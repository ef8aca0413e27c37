/* threads.c: the shared-memory backend: one process, one thread per device, collectives that
 * read their peers' buffers directly.
 *
 * A collective is a rendezvous of its group in three steps:
 *   1. enter: the device publishes its call in its slot (buffers, sizes) and a signature of it
 *      (which barrier of the group, which kind) in an atomic word, and arrives at the group's
 *      barrier; once all have arrived, each compares its call with every member's (a mismatch
 *      fails them all, before a byte moves);
 *   2. work: each device *pulls* what it needs from its peers' buffers into its own output;
 *   3. leave: a second barrier, so that no device returns (and frees or rewrites its input)
 *      while a peer may still be reading it.
 * rt_barrier is step 1 alone: it lends no buffer, so nothing is owed after it. That is why a
 * device reads a peer's signature before its slot: a peer at a barrier may already have left
 * and be writing its slot for its next call, but its signature then no longer matches, and a
 * peer whose signature matches a two-step call cannot leave before this device does.
 * AllReduce adds a middle barrier: rank r sums chunk r of every input, in rank order, into its
 * own output; then each copies the other chunks from their owners' outputs. Each element is
 * summed once, in rank order, so every copy has the same bits, and the sum does not depend on
 * timing. Small buffers skip the middle step: every rank sums the whole buffer, in the same
 * order, to the same bits.
 *
 * Barriers. A group is identified by its axis mask and its base device (the member of rank 0);
 * it counts arrivals on one 32-bit word, groups[base][mask].count (groups with the same mask are
 * disjoint, so a word is never shared). A device's k-th barrier on a mask is complete when the
 * word reaches (k + 1) x n. Arriving is a fetch-add; the arrival that completes the barrier
 * rings the group's bell, which wakes every member asleep with one system call. While the
 * barrier is incomplete, a waiting device may leave (the run stopped, a timeout, a peer that
 * returned) by taking its arrival back with a compare-and-swap; once the word is complete no one
 * can, so either the whole group goes on or nobody has read anything. Leave and middle barriers
 * cannot be left: every member is inside the collective doing bounded work.
 *
 * Point to point: send copies the bytes into a message (on the sender's account) and queues it
 * on the receiver's mailbox; recv takes the first message with the same source and tag. Sends
 * never block, so a pipeline's stages can all send before they receive.
 *
 * Posted permutes (rt_permute_shift_start, rt_wait; docs/runtime.md, "Posted permutes"): no
 * rendezvous. _start publishes a Post (the call, in, out) in one of the device's RT_MAX_POSTED
 * post slots under a tag (the group's mask and the device's count of posts over it: the k-th post
 * of every member of a group is the same permute) and returns. The copy of a block from its
 * sender's `in` to its receiver's `out` is made by whichever of the two waits first, once both
 * have posted: the receiver pulls, or the sender pushes into the receiver's published `out`
 * (who copies is settled by a compare-and-swap on the sender's post). A wait returns when its
 * own block has arrived and the block it sends has been delivered, so neither a late sender nor
 * a late receiver holds the other up beyond posting, and a device may post, then call other
 * collectives, then wait. A peer looks at a post only while holding it (`inflight`, raised
 * before it re-reads the tag); a post is released by clearing its tag, then waiting until no
 * one holds it (seq_cst both ways, so either the peer sees the cleared tag or the owner sees the
 * hold), hence a copier never touches a buffer whose owner has left its wait. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

#define DIRECT_ALL_REDUCE_BYTES (64 * 1024) /* up to this, every rank reduces the whole buffer */

typedef struct Slot {
  RtCall c;
  int naxes;
  int axes[RT_MAX_AXES];
} Slot;

typedef struct Message {
  struct Message *next;
  int src, tag;
  size_t bytes; /* the data follows the struct */
} Message;

typedef struct Mailbox {
  pthread_mutex_t lock;
  Message *head, *tail;
  _Atomic uint32_t posted; /* sends so far: a receiver looks in the list only when it moved */
} Mailbox;

/* A device's call, as its peers check it: which barrier of which group, and the kind. */
#define SIG(instance, kind, mask) ((uint64_t)(instance) << 32 | (uint64_t)(kind) << 8 | (uint64_t)(mask))

/* A group's barrier: arrivals so far, and the bell its members sleep on (sync.c). */
typedef struct GroupWord {
  _Atomic uint32_t count;
  _Atomic uint32_t bell;
  _Atomic uint32_t sleepers;
} GroupWord;

/* A posted permute (see the top): written by its device before `tag` is published, read by the
 * peers that hold it. */
#define POST_TAG(mask, seq) (1ull << 63 | (uint64_t)(seq) << 8 | (uint64_t)(mask))
typedef struct Post {
  _Alignas(64) _Atomic uint64_t tag; /* POST_TAG while posted, 0 free */
  _Atomic uint32_t inflight;         /* peers holding it now */
  _Atomic int claimed;               /* the copy out of this post's `in` is being made, or made */
  _Atomic int sent, got;             /* its block delivered; its `out` filled */
  RtCall c;
  int src, dst;                      /* the devices it receives from and sends to (-1: none) */
  uint64_t in_hash;                  /* RT_POST_CHECKS: `in` at the post */
} Post;

typedef struct Threads {
  GroupWord *groups;          /* [ndev][RT_MASKS]: by the group's base device and mask */
  _Atomic uint64_t *sig;      /* [ndev]: SIG of the call each device is entering */
  uint32_t *passed;           /* [ndev][RT_MASKS]: barriers each device has passed per mask (own thread) */
  Slot *slots;                /* [ndev] */
  Mailbox *mail;              /* [ndev] */
  Post *posts;                /* [ndev][RT_MAX_POSTED] */
  uint32_t *nposted;          /* [ndev][RT_MASKS]: permutes each device has posted per mask (own thread) */
} Threads;

static Threads *state(const Runtime *rt) { return rt->backend_state; }

/* ---- barriers ---- */

typedef struct ArriveWait {
  _Atomic uint32_t *count;
  uint32_t target;
  RtDevice *dev;
  const RtGroup *g;
  int gone; /* a member that returned from its entry function */
} ArriveWait;

static bool all_arrived(void *p) {
  ArriveWait *w = p;
  return (int32_t)(atomic_load_explicit(w->count, memory_order_acquire) - w->target) >= 0;
}

/* A member that returned from its entry function will never arrive. (One that arrived and left
 * did so by completing this barrier or by taking its arrival back.) */
static int member_gone(void *p) {
  ArriveWait *w = p;
  Runtime *rt = w->dev->rt;
  for (int r = 0; r < w->g->size; r++) {
    int m = rtgroup_member(w->g, r);
    if (atomic_load(&rt->devices[m].done)) {
      w->gone = m;
      return RT_E_MISMATCH;
    }
  }
  return RT_OK;
}

/* "device 3 [x=3] (running its own code)": the members not in this collective, for a timeout. */
static void missing_members(const RtDevice *dev, const RtGroup *g, RtCollKind kind, char *buf, size_t n) {
  Runtime *rt = dev->rt;
  size_t len = 0;
  int listed = 0, more = 0;
  buf[0] = 0;
  for (int r = 0; r < g->size; r++) {
    int m = rtgroup_member(g, r);
    uint64_t where = atomic_load(&rt->devices[m].where);
    if (m == dev->index || where == RT_WHERE(kind, g->mask, -1)) continue;
    if (listed == 3) {
      more++;
      continue;
    }
    char one[RT_LABEL_MAX + 96];
    rtrun_describe(rt, m, one, sizeof one);
    if (len < n) len += (size_t)snprintf(buf + len, n - len, "%s%s", listed ? ", " : "", one);
    listed++;
  }
  if (more && len < n) snprintf(buf + len, n - len, " and %d more", more);
  if (!listed) snprintf(buf, n, "the group to finish arriving");
}

/* Arrives at dev's next barrier over g->mask and waits for the group. With `may_leave`, a run
 * that stops, a peer that returned or the timeout take the arrival back and fail (with a
 * message, except on a stop, whose message is already recorded). */
static int group_barrier(RtDevice *dev, const RtGroup *g, RtCollKind kind, bool may_leave) {
  Runtime *rt = dev->rt;
  Threads *T = state(rt);
  uint32_t *passed = &T->passed[(size_t)dev->index * RT_MASKS + g->mask];
  GroupWord *word = &T->groups[(size_t)g->base * RT_MASKS + g->mask];
  ArriveWait w = {&word->count, (*passed + 1) * (uint32_t)g->size, dev, g, -1};
  if (atomic_fetch_add(w.count, 1) + 1 == w.target) {
    (*passed)++;
    rtsync_ring(&word->bell, &word->sleepers);
    return RT_OK;
  }
  RtWait wait = {all_arrived, may_leave ? member_gone : NULL, &w, may_leave, &word->bell, &word->sleepers};
  int rc = rtsync_wait(dev, &wait);
  if (rc) {
    uint32_t v = atomic_load(w.count);
    while ((int32_t)(v - w.target) < 0) {
      if (!atomic_compare_exchange_weak(w.count, &v, v - 1)) continue;
      if (rc == RT_E_STOPPED) return rc;
      char who[1024];
      if (rc == RT_E_MISMATCH) {
        rtrun_describe(rt, w.gone, who, sizeof who);
        return rtrun_fail(dev, rc, "%s over %s: %s without calling it", rtrun_coll_name(kind), g->text, who);
      }
      missing_members(dev, g, kind, who, sizeof who);
      return rtrun_fail(dev, rc, "%s over %s timed out after %g s waiting for %s", rtrun_coll_name(kind), g->text,
                        rt->timeout_s, who);
    }
    /* The barrier completed while we were giving up: go on with the group. */
  }
  (*passed)++;
  return RT_OK;
}

/* ---- the rendezvous ---- */

static bool same_call(const Slot *a, const Slot *b) {
  const RtCall *x = &a->c, *y = &b->c;
  if (x->kind != y->kind || x->dtype != y->dtype || a->naxes != b->naxes ||
      memcmp(a->axes, b->axes, (size_t)a->naxes * sizeof *a->axes))
    return false;
  if (x->coll || y->coll) { /* rt_collective: the same description (the program's one constant, or equal) */
    const RtColl *p = x->coll, *q = y->coll;
    if (!p || !q || p->kind != q->kind || p->op != q->op || p->nmembers != q->nmembers) return false;
    for (int i = 0; i < p->nmembers; i++) {
      const RtCollMember *a = &p->members[i], *b = &q->members[i];
      if (a->rank != b->rank || a->nparts != b->nparts || memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->rank)) return false;
      for (int k = 0; k < a->nparts; k++)
        if (a->parts[k].dim != b->parts[k].dim || a->parts[k].groups->size != b->parts[k].groups->size) return false;
    }
    return true;
  }
  switch (x->kind) {
  case RT_COLL_ALL_GATHER:
  case RT_COLL_REDUCE_SCATTER:
    return x->op == y->op && x->outer == y->outer && x->extent == y->extent && x->inner == y->inner;
  case RT_COLL_ALL_REDUCE: return x->op == y->op && x->count == y->count;
  case RT_COLL_ALL_TO_ALL:
    return x->nd == y->nd && x->split_dim == y->split_dim && x->concat_dim == y->concat_dim &&
           !memcmp(x->shape, y->shape, (size_t)x->nd * sizeof *x->shape);
  case RT_COLL_PERMUTE:
    if (x->count != y->count || !x->pairs != !y->pairs) return false;
    if (!x->pairs) return x->shift == y->shift;
    return x->npairs == y->npairs && !memcmp(x->pairs, y->pairs, 2 * (size_t)x->npairs * sizeof *x->pairs);
  default: return true;
  }
}

/* "all_gather over (x) of f32 [2, 3, 4]" */
static void call_text(const Runtime *rt, const Slot *s, char *buf, size_t n) {
  const RtCall *c = &s->c;
  size_t len = (size_t)snprintf(buf, n, "%s over (", rtrun_coll_name(c->kind));
  for (int k = 0; k < s->naxes && len < n; k++)
    len += (size_t)snprintf(buf + len, n - len, "%s%s", k ? ", " : "", rt->axis_name[s->axes[k]]);
  if (len >= n) return;
  if (c->coll) {
    snprintf(buf + len, n - len, ") of %d %s member%s", c->coll->nmembers, rt_dtype_name(c->dtype), c->coll->nmembers == 1 ? "" : "s");
    return;
  }
  switch (c->kind) {
  case RT_COLL_ALL_GATHER:
  case RT_COLL_REDUCE_SCATTER:
    snprintf(buf + len, n - len, ") of %s [%lld, %lld, %lld]", rt_dtype_name(c->dtype), (long long)c->outer,
             (long long)c->extent, (long long)c->inner);
    break;
  case RT_COLL_ALL_REDUCE:
  case RT_COLL_PERMUTE:
    snprintf(buf + len, n - len, ") of %lld %s", (long long)c->count, rt_dtype_name(c->dtype));
    break;
  case RT_COLL_ALL_TO_ALL:
    len += (size_t)snprintf(buf + len, n - len, ") of %s [", rt_dtype_name(c->dtype));
    for (int i = 0; i < c->nd && len < n; i++)
      len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? ", " : "", (long long)c->shape[i]);
    if (len < n) snprintf(buf + len, n - len, "] split %d concat %d", c->split_dim, c->concat_dim);
    break;
  default: snprintf(buf + len, n - len, ")"); break;
  }
}

/* Step 1. RT_OK: the group met and every member made the same call; the caller then owes the
 * leave barrier (except rt_barrier). Otherwise the status, and nothing is owed: a group that
 * did not meet read nothing, and in a group that met with a mismatch every member sees one
 * (whoever differs from someone), so none of them reads a peer's buffer. */
static int enter(RtDevice *dev, const RtGroup *g, const RtCall *c) {
  Runtime *rt = dev->rt;
  Threads *T = state(rt);
  Slot *mine = &T->slots[dev->index];
  uint32_t instance = T->passed[(size_t)dev->index * RT_MASKS + g->mask];
  uint64_t sig = SIG(instance, c->kind, g->mask);
  mine->c = *c;
  mine->naxes = g->naxes;
  memcpy(mine->axes, g->axes, sizeof mine->axes);
  atomic_store(&T->sig[dev->index], sig);
  int rc = group_barrier(dev, g, c->kind, true);
  if (rc) return rc;
  for (int r = 0; r < g->size; r++) {
    int m = rtgroup_member(g, r);
    if (m == dev->index) continue;
    uint64_t theirs = atomic_load(&T->sig[m]);
    /* A signature for another barrier means the peer has left this one: it was an rt_barrier. */
    bool left = theirs >> 32 != instance || (theirs & 0xff) != g->mask;
    RtCollKind kind = left ? RT_COLL_BARRIER : (RtCollKind)(theirs >> 8 & 0xff);
    if (kind == c->kind && (kind == RT_COLL_BARRIER || same_call(mine, &T->slots[m]))) continue;
    char a[400], b[400];
    call_text(rt, mine, a, sizeof a);
    if (kind == RT_COLL_BARRIER) snprintf(b, sizeof b, "barrier over %s", g->text);
    else call_text(rt, &T->slots[m], b, sizeof b); /* a two-step call: its slot holds still */
    return rtrun_fail(dev, RT_E_MISMATCH, "called %s while %s called %s", a, rt->devices[m].label, b);
  }
  return RT_OK;
}

static void leave(RtDevice *dev, const RtGroup *g, RtCollKind kind) { group_barrier(dev, g, kind, false); }

static const Slot *peer(const RtDevice *dev, const RtGroup *g, int rank) {
  return &state(dev->rt)->slots[rtgroup_member(g, rank)];
}

/* ---- the collectives ---- */

static int all_gather(RtDevice *dev, const RtGroup *g, const RtCall *c) {
  int rc = enter(dev, g, c);
  if (rc) return rc;
  size_t es = rt_dtype_size(c->dtype), block = (size_t)(c->extent * c->inner) * es;
  int n = g->size;
  for (int r = 0; r < n; r++) {
    const char *src = peer(dev, g, r)->c.in;
    for (int64_t o = 0; o < c->outer; o++)
      memcpy((char *)c->out + ((size_t)o * (size_t)n + (size_t)r) * block, src + (size_t)o * block, block);
  }
  leave(dev, g, c->kind);
  return RT_OK;
}

static int reduce_scatter(RtDevice *dev, const RtGroup *g, const RtCall *c) {
  int rc = enter(dev, g, c);
  if (rc) return rc;
  size_t es = rt_dtype_size(c->dtype), block = (size_t)(c->extent * c->inner);
  int n = g->size;
  const void *srcs[RT_HARD_MAX_DEVICES];
  for (int64_t o = 0; o < c->outer; o++) {
    for (int r = 0; r < n; r++)
      srcs[r] = (const char *)peer(dev, g, r)->c.in + ((size_t)o * (size_t)n + (size_t)g->rank) * block * es;
    rtk_reduce(c->dtype, c->op, (char *)c->out + (size_t)o * block * es, srcs, n, block);
  }
  leave(dev, g, c->kind);
  return RT_OK;
}

/* Rank r's chunk of an all_reduce: [lo, hi), whole cache lines where the buffer allows. */
static void chunk(int64_t count, int n, int r, size_t es, int64_t *lo, int64_t *hi) {
  int64_t line = (int64_t)(64 / es), per = (count + n - 1) / n;
  per = (per + line - 1) / line * line;
  *lo = r * per < count ? r * per : count;
  *hi = *lo + per < count ? *lo + per : count;
}

static int all_reduce(RtDevice *dev, const RtGroup *g, const RtCall *c) {
  int rc = enter(dev, g, c);
  if (rc) return rc;
  size_t es = rt_dtype_size(c->dtype);
  int n = g->size;
  const void *srcs[RT_HARD_MAX_DEVICES];
  bool in_place = false;
  for (int r = 0; r < n; r++) {
    const Slot *p = peer(dev, g, r);
    srcs[r] = p->c.in;
    in_place |= p->c.in == p->c.out;
  }
  if (!in_place && (size_t)c->count * es <= DIRECT_ALL_REDUCE_BYTES) {
    rtk_reduce(c->dtype, c->op, c->out, srcs, n, (size_t)c->count);
  } else {
    int64_t lo, hi;
    chunk(c->count, n, g->rank, es, &lo, &hi);
    for (int r = 0; r < n; r++) srcs[r] = (const char *)srcs[r] + (size_t)lo * es;
    rtk_reduce(c->dtype, c->op, (char *)c->out + (size_t)lo * es, srcs, n, (size_t)(hi - lo));
    group_barrier(dev, g, c->kind, false);
    for (int r = 0; r < n; r++) {
      if (r == g->rank) continue;
      chunk(c->count, n, r, es, &lo, &hi);
      memcpy((char *)c->out + (size_t)lo * es, (const char *)peer(dev, g, r)->c.out + (size_t)lo * es,
             (size_t)(hi - lo) * es);
    }
  }
  leave(dev, g, c->kind);
  return RT_OK;
}

static int all_to_all(RtDevice *dev, const RtGroup *g, const RtCall *c) {
  int rc = enter(dev, g, c);
  if (rc) return rc;
  int n = g->size, nd = c->nd, a = c->split_dim, b = c->concat_dim;
  int64_t box[RT_MAX_RANK], out_shape[RT_MAX_RANK], in_stride[RT_MAX_RANK], out_stride[RT_MAX_RANK];
  memcpy(box, c->shape, (size_t)nd * sizeof *box);
  box[a] /= n; /* one block: what rank j sends to rank r */
  memcpy(out_shape, box, (size_t)nd * sizeof *box);
  out_shape[b] *= n;
  rtk_row_major_strides(c->shape, nd, in_stride);
  rtk_row_major_strides(out_shape, nd, out_stride);
  size_t es = rt_dtype_size(c->dtype);
  for (int j = 0; j < n; j++) {
    const char *src = (const char *)peer(dev, g, j)->c.in + (size_t)(g->rank * box[a] * in_stride[a]) * es;
    char *dst = (char *)c->out + (size_t)(j * box[b] * out_stride[b]) * es;
    rtk_copy_box(dst, out_stride, src, in_stride, box, nd, es);
  }
  leave(dev, g, c->kind);
  return RT_OK;
}

static int permute(RtDevice *dev, const RtGroup *g, const RtCall *c) {
  int rc = enter(dev, g, c);
  if (rc) return rc;
  size_t bytes = (size_t)c->count * rt_dtype_size(c->dtype);
  if (c->src_of_me < 0) memset(c->out, 0, bytes);
  else memcpy(c->out, peer(dev, g, c->src_of_me)->c.in, bytes);
  leave(dev, g, c->kind);
  return RT_OK;
}

/* A program's collective of several members or parts (rt_collective), each member's blocks read
 * from the peers' own member buffers and put where its parts say: no packed copy. */
static int members(RtDevice *dev, const RtGroup *g, const RtCall *c) {
  int rc = enter(dev, g, c);
  if (rc) return rc;
  const RtColl *k = c->coll;
  size_t es = rt_dtype_size(c->dtype);
  int n = g->size;
  int64_t block[RT_MAX_RANK], whole[RT_MAX_RANK], pos[RT_MAX_RANK], bs[RT_MAX_RANK], ws[RT_MAX_RANK];
  const void *srcs[RT_HARD_MAX_DEVICES];
  if (k->kind == RT_ALL_GATHER) {
    for (int r = 0; r < n; r++) {
      int e = rtgroup_member(g, r);
      const Slot *p = &state(dev->rt)->slots[e];
      for (int i = 0; i < k->nmembers; i++) {
        const RtCollMember *m = &k->members[i];
        rtcoll_shapes(m, k->kind, block, whole);
        rtcoll_position(m, e, pos);
        rtk_row_major_strides(block, m->rank, bs);
        rtk_row_major_strides(whole, m->rank, ws);
        int64_t off = 0;
        for (int d = 0; d < m->rank; d++) off += pos[d] * block[d] * ws[d];
        rtk_copy_box((char *)c->outs[i] + (size_t)off * es, ws, p->c.ins[i], bs, block, m->rank, es);
      }
    }
  } else if (k->kind == RT_REDUCE_SCATTER) {
    for (int i = 0; i < k->nmembers; i++) { /* my block of every peer's operand, row by row */
      const RtCollMember *m = &k->members[i];
      rtcoll_shapes(m, k->kind, block, whole);
      rtcoll_position(m, dev->index, pos);
      rtk_row_major_strides(whole, m->rank, ws);
      int last = m->rank - 1;
      int64_t run = m->rank ? block[last] : 1, rows = 1, idx[RT_MAX_RANK] = {0};
      for (int d = 0; d < last; d++) rows *= block[d];
      for (int64_t row = 0; row < rows; row++) {
        int64_t off = 0;
        for (int d = 0; d < m->rank; d++) off += (pos[d] * block[d] + (d < last ? idx[d] : 0)) * ws[d];
        for (int r = 0; r < n; r++) srcs[r] = (const char *)state(dev->rt)->slots[rtgroup_member(g, r)].c.ins[i] + (size_t)off * es;
        rtk_reduce(c->dtype, c->op, (char *)c->outs[i] + (size_t)(row * run) * es, srcs, n, (size_t)run);
        for (int d = last - 1; d >= 0; d--) {
          if (++idx[d] < block[d]) break;
          idx[d] = 0;
        }
      }
    }
  } else { /* all-reduce: every member as all_reduce does one buffer, one barrier between the phases */
    bool in_place = false;
    int64_t total = 0;
    for (int i = 0; i < k->nmembers; i++) {
      int64_t count = 1;
      for (int d = 0; d < k->members[i].rank; d++) count *= k->members[i].shape[d];
      total += count;
      for (int r = 0; r < n; r++) in_place |= peer(dev, g, r)->c.ins[i] == peer(dev, g, r)->c.outs[i];
    }
    bool direct = !in_place && (size_t)total * es <= DIRECT_ALL_REDUCE_BYTES;
    for (int phase = 0; phase < (direct ? 1 : 2); phase++) {
      if (phase == 1) group_barrier(dev, g, c->kind, false);
      for (int i = 0; i < k->nmembers; i++) {
        int64_t count = 1, lo, hi;
        for (int d = 0; d < k->members[i].rank; d++) count *= k->members[i].shape[d];
        if (direct) {
          for (int r = 0; r < n; r++) srcs[r] = peer(dev, g, r)->c.ins[i];
          rtk_reduce(c->dtype, c->op, c->outs[i], srcs, n, (size_t)count);
        } else if (phase == 0) {
          chunk(count, n, g->rank, es, &lo, &hi);
          for (int r = 0; r < n; r++) srcs[r] = (const char *)peer(dev, g, r)->c.ins[i] + (size_t)lo * es;
          rtk_reduce(c->dtype, c->op, (char *)c->outs[i] + (size_t)lo * es, srcs, n, (size_t)(hi - lo));
        } else {
          for (int r = 0; r < n; r++) {
            if (r == g->rank) continue;
            chunk(count, n, r, es, &lo, &hi);
            memcpy((char *)c->outs[i] + (size_t)lo * es, (const char *)peer(dev, g, r)->c.outs[i] + (size_t)lo * es,
                   (size_t)(hi - lo) * es);
          }
        }
      }
    }
  }
  leave(dev, g, c->kind);
  return RT_OK;
}

/* One round: a barrier lends no buffer, so no peer needs it to stay. */
static int barrier(RtDevice *dev, const RtGroup *g, const RtCall *c) { return enter(dev, g, c); }

/* ---- point to point ---- */

static int send(RtDevice *dev, int dst, int tag, const void *buf, size_t bytes) {
  Runtime *rt = dev->rt;
  char name[64];
  snprintf(name, sizeof name, "message to device %d (tag %d)", dst, tag);
  Message *m;
  if (bytes > SIZE_MAX - sizeof *m) return rtrun_fail(dev, RT_E_ARG, "send of %zu bytes", bytes);
  int rc = rt_alloc(dev, sizeof *m + bytes, name, (void **)&m);
  if (rc) return rc;
  m->next = NULL;
  m->src = dev->index;
  m->tag = tag;
  m->bytes = bytes;
  if (bytes) memcpy(m + 1, buf, bytes);
  Mailbox *box = &state(rt)->mail[dst];
  pthread_mutex_lock(&box->lock);
  if (box->tail) box->tail->next = m;
  else box->head = m;
  box->tail = m;
  pthread_mutex_unlock(&box->lock);
  atomic_fetch_add(&box->posted, 1);
  rtsync_wake(&rt->devices[dst]); /* rings its own bell if it sleeps in a recv */
  return RT_OK;
}

typedef struct RecvWait {
  RtDevice *dev;
  Mailbox *box;
  int src, tag;
  uint32_t seen; /* box->posted when last looked */
  Message *got;
} RecvWait;

static bool take_message(void *p) {
  RecvWait *w = p;
  if (w->got) return true;
  uint32_t posted = atomic_load(&w->box->posted);
  if (posted == w->seen) return false;
  w->seen = posted;
  pthread_mutex_lock(&w->box->lock);
  Message *prev = NULL, *m = w->box->head;
  while (m && !(m->src == w->src && m->tag == w->tag)) prev = m, m = m->next;
  if (m) {
    if (prev) prev->next = m->next;
    else w->box->head = m->next;
    if (w->box->tail == m) w->box->tail = prev;
  }
  pthread_mutex_unlock(&w->box->lock);
  w->got = m;
  return m != NULL;
}

/* The sender returned: unless its message is already here, it will never come. */
static int sender_gone(void *p) {
  RecvWait *w = p;
  if (!atomic_load(&w->dev->rt->devices[w->src].done)) return RT_OK;
  w->seen--; /* look in the mailbox once more: the send may have come just before */
  return take_message(w) ? RT_OK : RT_E_MISMATCH;
}

static int recv(RtDevice *dev, int src, int tag, void *buf, size_t bytes) {
  Runtime *rt = dev->rt;
  RecvWait w = {dev, &state(rt)->mail[dev->index], src, tag, 0, NULL};
  w.seen = atomic_load(&w.box->posted) - 1; /* look at least once */
  RtWait wait = {take_message, sender_gone, &w, true, NULL, NULL};
  int rc = rtsync_wait(dev, &wait);
  if (!w.got) {
    if (rc == RT_E_STOPPED) return rc;
    char who[RT_LABEL_MAX + 96];
    rtrun_describe(rt, src, who, sizeof who);
    if (rc == RT_E_MISMATCH)
      return rtrun_fail(dev, rc, "recv from device %d (tag %d): %s without sending it", src, tag, who);
    return rtrun_fail(dev, RT_E_TIMEOUT, "recv from device %d (tag %d) timed out after %g s; %s", src, tag,
                      rt->timeout_s, who);
  }
  Message *m = w.got;
  if (m->bytes != bytes) {
    size_t sent = m->bytes;
    rt_free(dev, m);
    return rtrun_fail(dev, RT_E_MISMATCH, "recv from device %d (tag %d) of %zu bytes: the send has %zu", src, tag,
                      bytes, sent);
  }
  if (bytes) memcpy(buf, m + 1, bytes);
  rt_free(dev, m);
  return RT_OK;
}


/* ---- posted permutes ---- */

static Post *posts_of(const Runtime *rt, int device) { return &state(rt)->posts[(size_t)device * RT_MAX_POSTED]; }

#if RT_POST_CHECKS
static uint64_t hash_bytes(const void *p, size_t n) { /* FNV-1a */
  const unsigned char *b = p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
#endif

static size_t post_bytes(const RtCall *c) { return (size_t)c->count * rt_dtype_size(c->dtype); }

/* The rank g's rank sends to under c, or -1. */
static int dest_rank(const RtGroup *g, const RtCall *c) {
  int n = g->size;
  if (!c->pairs) return (int)((g->rank + ((int64_t)c->shift % n + n)) % n);
  for (int i = 0; i < c->npairs; i++)
    if (c->pairs[2 * i] == g->rank) return c->pairs[2 * i + 1];
  return -1;
}

static int permute_start(RtDevice *dev, const RtGroup *g, const RtCall *c, RtRequest *req) {
  Runtime *rt = dev->rt;
  Threads *T = state(rt);
  Post *mine = NULL, *ps = posts_of(rt, dev->index);
  for (int i = 0; i < RT_MAX_POSTED && !mine; i++)
    if (!atomic_load(&ps[i].tag)) mine = &ps[i];
  if (!mine)
    return rtrun_fail(dev, RT_E_LIMIT, "%s over %s: %d permutes posted and not waited for: the most a device may hold is %d",
                      rtrun_coll_name(c->kind), g->text, RT_MAX_POSTED + 1, RT_MAX_POSTED);
  uint32_t *seq = &T->nposted[(size_t)dev->index * RT_MASKS + g->mask];
  int dst = dest_rank(g, c);
  mine->c = *c;
  mine->src = c->src_of_me < 0 ? -1 : rtgroup_member(g, c->src_of_me);
  mine->dst = dst < 0 ? -1 : rtgroup_member(g, dst);
  atomic_store(&mine->claimed, 0);
  atomic_store(&mine->sent, mine->dst < 0);
  atomic_store(&mine->got, mine->src < 0);
#if RT_POST_CHECKS /* the ownership rules (shardrt.h): in hashed now and at the wait; out poisoned */
  mine->in_hash = hash_bytes(c->in, post_bytes(c));
  if (mine->src >= 0) memset(c->out, 0xff, post_bytes(c));
#endif
  atomic_store(&mine->tag, POST_TAG(g->mask, *seq));
  (*seq)++;
  req->state = mine;
  if (mine->src >= 0) rtsync_wake(&rt->devices[mine->src]); /* either may be waiting for this post */
  if (mine->dst >= 0) rtsync_wake(&rt->devices[mine->dst]);
  return RT_OK;
}

/* device's post under tag, held (release with unhold), or NULL while it has not posted it. */
static Post *hold(const Runtime *rt, int device, uint64_t tag) {
  Post *ps = posts_of(rt, device);
  for (int i = 0; i < RT_MAX_POSTED; i++) {
    if (atomic_load(&ps[i].tag) != tag) continue;
    atomic_fetch_add(&ps[i].inflight, 1);
    if (atomic_load(&ps[i].tag) == tag) return &ps[i];
    atomic_fetch_sub(&ps[i].inflight, 1);
  }
  return NULL;
}

static void unhold(Post *p) { atomic_fetch_sub(&p->inflight, 1); }

/* Clears the tag, then waits until no peer holds the post (each holds it for a bounded copy at
 * most). */
static void release(Post *p) {
  atomic_store(&p->tag, 0);
  while (atomic_load(&p->inflight)) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

typedef struct PostWait {
  RtDevice *dev;
  const RtGroup *g;
  Post *mine;
  uint64_t tag;
  int rc;       /* a mismatch found while matching */
  int missing;  /* the device whose post is still missing */
  double since; /* when the wait began */
} PostWait;

/* A sender pushes its block only once its receiver has not pulled it for this long: a receiver
 * that comes soon pulls it itself, so the two copies of a ring step run on two devices, not one
 * (bench_posted: pushing at once made the first waiter do both, 1.5x the blocking time); a
 * receiver held elsewhere (another collective before its wait) still gets its block. */
#define PUSH_AFTER_S 200e-6

/* The copy from S's post to R's (one of them mine, the other held): made unless already claimed. */
static void copy_block(PostWait *w, Post *S, Post *R) {
  int zero = 0;
  if (!atomic_compare_exchange_strong(&S->claimed, &zero, 1)) return;
  size_t bytes = post_bytes(&S->c);
  if (bytes) memcpy(R->c.out, S->c.in, bytes);
  atomic_store(&S->sent, 1);
  atomic_store(&R->got, 1);
  Post *other = S == w->mine ? R : S;
  int who = S == w->mine ? w->mine->dst : w->mine->src;
  if (other != w->mine) rtsync_wake(&w->dev->rt->devices[who]);
}

/* One side of my post: the block I receive (from src) or the one I send (to dst). */
static void try_side(PostWait *w, bool sending) {
  Post *mine = w->mine;
  int peer_dev = sending ? mine->dst : mine->src;
  Post *other = hold(w->dev->rt, peer_dev, w->tag);
  if (!other) {
    w->missing = peer_dev;
    return;
  }
  const RtCall *a = &mine->c, *b = &other->c;
  if (a->dtype != b->dtype || a->count != b->count || a->shift != b->shift || !a->pairs != !b->pairs) {
    if (!w->rc) {
      char who[RT_LABEL_MAX + 96];
      rtrun_describe(w->dev->rt, peer_dev, who, sizeof who);
      w->rc = rtrun_fail(w->dev, RT_E_MISMATCH, "posted %s over %s of %lld %s (shift %d) while %s posted one of %lld %s (shift %d)",
                         rtrun_coll_name(a->kind), w->g->text, (long long)a->count, rt_dtype_name(a->dtype), a->shift, who,
                         (long long)b->count, rt_dtype_name(b->dtype), b->shift);
    }
  } else if (sending) {
    copy_block(w, mine, other);
  } else {
    copy_block(w, other, mine);
  }
  unhold(other);
}

static bool post_done(void *p) {
  PostWait *w = p;
  Post *mine = w->mine;
  w->missing = -1;
  if (!w->rc && !atomic_load(&mine->got)) try_side(w, false);
  if (!w->rc && !atomic_load(&mine->sent) && (mine->dst == w->dev->index || rt_seconds() - w->since > PUSH_AFTER_S))
    try_side(w, true);
  return w->rc || (atomic_load(&mine->got) && atomic_load(&mine->sent));
}

/* The peer whose post is missing returned: unless it posts nothing more, it never will. */
static int post_hopeless(void *p) {
  PostWait *w = p;
  if (w->missing < 0 || !atomic_load(&w->dev->rt->devices[w->missing].done)) return RT_OK;
  return post_done(w) ? RT_OK : RT_E_MISMATCH;
}

static int wait_request(RtDevice *dev, RtRequest *req) {
  Runtime *rt = dev->rt;
  Post *mine = req->state;
  PostWait w = {dev, &req->g, mine, atomic_load(&mine->tag), RT_OK, -1, rt_seconds()};
  RtWait wait = {post_done, post_hopeless, &w, true, NULL, NULL};
  int rc = rtsync_wait(dev, &wait);
  if (!rc) rc = w.rc;
  if (rc && rc != RT_E_STOPPED && !w.rc) {
    char who[RT_LABEL_MAX + 96];
    if (w.missing >= 0) rtrun_describe(rt, w.missing, who, sizeof who);
    else snprintf(who, sizeof who, "its peers' copies");
    if (rc == RT_E_MISMATCH)
      rc = rtrun_fail(dev, rc, "wait for %s over %s: %s without posting it", rtrun_coll_name(req->c.kind), req->g.text, who);
    else
      rc = rtrun_fail(dev, RT_E_TIMEOUT, "wait for %s over %s timed out after %g s waiting for %s", rtrun_coll_name(req->c.kind),
                      req->g.text, rt->timeout_s, who);
  }
  release(mine); /* after this no peer touches in or out */
#if RT_POST_CHECKS
  if (!rc && hash_bytes(req->c.in, post_bytes(&req->c)) != mine->in_hash)
    rc = rtrun_fail(dev, RT_E_ARG, "%s over %s: its send buffer changed between rt_permute_shift_start and rt_wait "
                    "(a sender must leave it unchanged until its wait returns)", rtrun_coll_name(req->c.kind), req->g.text);
#endif
  if (!rc && mine->src < 0 && post_bytes(&req->c)) memset(req->c.out, 0, post_bytes(&req->c));
  req->state = NULL;
  return rc;
}

/* A device that returned with permutes posted and not waited for: its peers may not copy from or
 * into its buffers any longer. */
static void drop_posts(RtDevice *dev) {
  Post *ps = posts_of(dev->rt, dev->index);
  int left = 0;
  for (int i = 0; i < RT_MAX_POSTED; i++)
    if (atomic_load(&ps[i].tag)) left++, release(&ps[i]);
  if (left && !dev->rc)
    rtrun_fail(dev, RT_E_ARG, "returned with %d posted permute%s it never waited for (every rt_permute_shift_start needs its rt_wait)",
               left, left == 1 ? "" : "s");
}

/* ---- running ---- */

static void drop_messages(Runtime *rt) {
  Threads *T = state(rt);
  for (int i = 0; i < rt->ndev; i++) {
    Mailbox *box = &T->mail[i];
    while (box->head) {
      Message *m = box->head;
      box->head = m->next;
      rt_free(&rt->devices[i], m);
    }
    box->tail = NULL;
  }
}

static void *device_thread(void *p) {
  rtrun_device_main(p);
  drop_posts(p);
  return NULL;
}

static int run(Runtime *rt) {
  Threads *T = state(rt);
  /* A fresh start: a stopped run may have left barriers half full and messages unread. */
  memset(T->groups, 0, (size_t)rt->ndev * RT_MASKS * sizeof *T->groups);
  memset(T->passed, 0, (size_t)rt->ndev * RT_MASKS * sizeof *T->passed);
  memset(T->sig, 0, (size_t)rt->ndev * sizeof *T->sig);
  memset(T->posts, 0, (size_t)rt->ndev * RT_MAX_POSTED * sizeof *T->posts);
  memset(T->nposted, 0, (size_t)rt->ndev * RT_MASKS * sizeof *T->nposted);
  drop_messages(rt);
  int started = 0, rc = RT_OK;
  for (; started < rt->ndev; started++) {
    RtDevice *d = &rt->devices[started];
    int err = pthread_create(&d->thread, NULL, device_thread, d);
    if (err) {
      rc = rtrun_fail(d, RT_E_SYS, "could not start its thread: %s", strerror(err));
      break;
    }
  }
  for (int i = 0; i < started; i++) pthread_join(rt->devices[i].thread, NULL);
  return rc;
}

static void stop(Runtime *rt) { rtsync_wake_all(rt); }

static int open_threads(Runtime *rt) {
  Threads *T = calloc(1, sizeof *T);
  if (!T) return RT_E_NOMEM;
  size_t n = (size_t)rt->ndev;
  T->groups = calloc(n * RT_MASKS, sizeof *T->groups);
  T->passed = calloc(n * RT_MASKS, sizeof *T->passed);
  T->sig = calloc(n, sizeof *T->sig);
  T->slots = calloc(n, sizeof *T->slots);
  T->mail = calloc(n, sizeof *T->mail);
  T->posts = aligned_alloc(_Alignof(Post), n * RT_MAX_POSTED * sizeof *T->posts); /* sizeof is a multiple */
  T->nposted = calloc(n * RT_MASKS, sizeof *T->nposted);
  if (!T->groups || !T->passed || !T->sig || !T->slots || !T->mail || !T->posts || !T->nposted) {
    free(T->posts);
    free(T->nposted);
    free(T->groups);
    free(T->sig);
    free(T->passed);
    free(T->slots);
    free(T->mail);
    free(T);
    return RT_E_NOMEM;
  }
  for (size_t i = 0; i < n; i++) pthread_mutex_init(&T->mail[i].lock, NULL);
  memset(T->posts, 0, n * RT_MAX_POSTED * sizeof *T->posts);
  rt->backend_state = T;
  return RT_OK;
}

static void close_threads(Runtime *rt) {
  Threads *T = state(rt);
  if (!T) return;
  drop_messages(rt);
  for (int i = 0; i < rt->ndev; i++) pthread_mutex_destroy(&T->mail[i].lock);
  free(T->groups);
  free(T->passed);
  free(T->sig);
  free(T->slots);
  free(T->mail);
  free(T->posts);
  free(T->nposted);
  free(T);
  rt->backend_state = NULL;
}

const RtBackend rt_threads_backend = {
    .name = "threads",
    .open = open_threads,
    .close = close_threads,
    .run = run,
    .stop = stop,
    .all_gather = all_gather,
    .reduce_scatter = reduce_scatter,
    .all_reduce = all_reduce,
    .all_to_all = all_to_all,
    .permute = permute,
    .barrier = barrier,
    .members = members,
    .send = send,
    .recv = recv,
    .permute_start = permute_start,
    .wait_request = wait_request,
};
