/* collective.c: the collectives' front end, the same whatever the backend. For each call it
 * looks the device's group up in the replica groups the call names (who the members are, in which
 * rank order: the compiler's, never worked out here), checks the arguments (dtype, sizes that
 * divide, buffers that do not overlap), so that a lowering mistake fails here with a message
 * naming the device, the collective and its axes, then hands the call to the backend (backend.h),
 * keeps the device's statistics and counts what it executed (rt_executed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

int rtgroup_lookup(RtDevice *dev, const RtGroups *G, const char *what, RtGroup *g) {
  const Runtime *rt = dev->rt;
  memset(g, 0, sizeof *g);
  if (!G || G->naxes < 0 || G->naxes > rt->naxes || G->size < 1 || G->ngroups < 1 || (int64_t)G->ngroups * G->size > rt->ndev ||
      !G->members || !G->group_of || !G->rank_of)
    return rtrun_fail(dev, RT_E_ARG, "%s: malformed replica groups", what);
  int grp = G->group_of[dev->index], rank = G->rank_of[dev->index];
  if (grp < 0 || grp >= G->ngroups || rank < 0 || rank >= G->size || G->members[(int64_t)grp * G->size + rank] != dev->index)
    return rtrun_fail(dev, RT_E_ARG, "%s over %s: the replica groups hold no group of this device", what, G->text ? G->text : "(?)");
  g->G = G;
  g->group = grp;
  g->rank = rank;
  g->size = G->size;
  g->base = G->members[(int64_t)grp * G->size];
  g->naxes = G->naxes;
  size_t len = (size_t)snprintf(g->text, sizeof g->text, "(");
  for (int k = 0; k < G->naxes; k++) {
    int a = G->axes[k];
    if (a < 0 || a >= rt->naxes || (g->mask >> a & 1u)) return rtrun_fail(dev, RT_E_ARG, "%s: malformed replica groups", what);
    g->axes[k] = a;
    if (rt->axis_size[a] > 1) g->mask |= 1u << a;
    len += (size_t)snprintf(g->text + len, sizeof g->text - len, "%s%s", k ? ", " : "", rt->axis_name[a]);
  }
  snprintf(g->text + len, sizeof g->text - len, ")");
  return RT_OK;
}

/* ---- argument checks ---- */

static int bad(RtDevice *dev, const RtCall *c, const RtGroup *g, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int bad(RtDevice *dev, const RtCall *c, const RtGroup *g, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return rtrun_fail(dev, RT_E_ARG, "%s over %s: %s", rtrun_coll_name(c->kind), g ? g->text : "(?)", what);
}

static bool overlap(const void *a, size_t na, const void *b, size_t nb) {
  const char *x = a, *y = b;
  return na && nb && x < y + nb && y < x + na;
}

/* Elements of a [outer, extent, inner] box, or -1 if a size is negative or the product
 * overflows. */
static int64_t box_count(int64_t outer, int64_t extent, int64_t inner, int64_t n) {
  if (outer < 0 || extent < 0 || inner < 0) return -1;
  int64_t c = 1;
  int64_t f[4] = {outer, extent, inner, n};
  for (int i = 0; i < 4; i++) {
    if (f[i] && c > INT64_MAX / f[i]) return -1;
    c *= f[i];
  }
  return c;
}

/* A members call (rt_collective through the backend's `members`): every member's buffers and
 * shapes; bytes: the summed operands (all-reduce, reduce-scatter) or results (all-gather). */
static int check_members(RtDevice *dev, const RtGroup *g, RtCall *c, double *elems) {
  const RtColl *k = c->coll;
  *elems = 0;
  for (int i = 0; i < k->nmembers; i++) {
    const RtCollMember *m = &k->members[i];
    int64_t block[RT_MAX_RANK], whole[RT_MAX_RANK], nb = 1, nw = 1;
    if (!rtcoll_shapes(m, k->kind, block, whole)) return bad(dev, c, g, "member %d is malformed", i);
    for (int d = 0; d < m->rank; d++) nb *= block[d], nw *= whole[d];
    int64_t count = 1;
    for (int d = 0; d < m->rank; d++) count *= m->shape[d];
    int64_t parts = 1;
    for (int p = 0; p < m->nparts; p++) parts *= m->parts[p].groups->size;
    if (k->kind != RT_ALL_REDUCE && parts != g->size)
      return bad(dev, c, g, "member %d's parts deal %lld blocks over a group of %d", i, (long long)parts, g->size);
    if (count && (!c->ins[i] || !c->outs[i])) return bad(dev, c, g, "a NULL buffer");
    size_t es = rt_dtype_size(c->dtype);
    size_t inb = (size_t)count * es, outb = (size_t)(k->kind == RT_ALL_GATHER ? nw : k->kind == RT_REDUCE_SCATTER ? nb : count) * es;
    if (k->kind != RT_ALL_REDUCE && overlap(c->ins[i], inb, c->outs[i], outb)) return bad(dev, c, g, "the input and the output overlap");
    *elems += (double)(k->kind == RT_ALL_GATHER ? nw : count);
  }
  return RT_OK;
}

static int check_args(RtDevice *dev, const RtGroup *g, RtCall *c) {
  size_t es = rt_dtype_size(c->dtype);
  int n = g->size;
  if (c->kind != RT_COLL_BARRIER && !es) return bad(dev, c, g, "unknown dtype %d", (int)c->dtype);
  if ((c->kind == RT_COLL_ALL_REDUCE || c->kind == RT_COLL_REDUCE_SCATTER) && c->op != RT_SUM && c->op != RT_MAX)
    return bad(dev, c, g, "unknown reduction %d", (int)c->op);
  size_t in_bytes = 0, out_bytes = 0;
  switch (c->kind) {
  case RT_COLL_ALL_GATHER:
  case RT_COLL_REDUCE_SCATTER: {
    int64_t small = box_count(c->outer, c->extent, c->inner, 1), large = box_count(c->outer, c->extent, c->inner, n);
    if (small < 0 || large < 0)
      return bad(dev, c, g, "bad sizes [%lld, %lld, %lld]", (long long)c->outer, (long long)c->extent,
                 (long long)c->inner);
    in_bytes = (size_t)(c->kind == RT_COLL_ALL_GATHER ? small : large) * es;
    out_bytes = (size_t)(c->kind == RT_COLL_ALL_GATHER ? large : small) * es;
    break;
  }
  case RT_COLL_ALL_REDUCE:
  case RT_COLL_PERMUTE:
    if (c->count < 0) return bad(dev, c, g, "negative count %lld", (long long)c->count);
    in_bytes = out_bytes = (size_t)c->count * es;
    break;
  case RT_COLL_ALL_TO_ALL: {
    if (c->nd < 1 || c->nd > RT_MAX_RANK)
      return bad(dev, c, g, "%d dims: the runtime takes 1 to %d", c->nd, RT_MAX_RANK);
    if (c->split_dim < 0 || c->split_dim >= c->nd || c->concat_dim < 0 || c->concat_dim >= c->nd)
      return bad(dev, c, g, "split dim %d and concat dim %d of a %d-dim tensor", c->split_dim, c->concat_dim, c->nd);
    int64_t count = 1;
    for (int i = 0; i < c->nd; i++) {
      if (c->shape[i] < 0 || (c->shape[i] && count > INT64_MAX / c->shape[i]))
        return bad(dev, c, g, "bad size %lld of dim %d", (long long)c->shape[i], i);
      count *= c->shape[i];
    }
    if (c->shape[c->split_dim] % n)
      return bad(dev, c, g, "split dim %d (size %lld) does not divide into %d blocks", c->split_dim,
                 (long long)c->shape[c->split_dim], n);
    in_bytes = out_bytes = (size_t)count * es;
    break;
  }
  default:
    break;
  }
  if ((in_bytes && !c->in) || (out_bytes && !c->out)) return bad(dev, c, g, "a NULL buffer");
  /* all_reduce works in place (each element is read before it is written); elsewhere a rank
   * writes what a peer may still be reading. */
  if (c->kind != RT_COLL_ALL_REDUCE && overlap(c->in, in_bytes, c->out, out_bytes))
    return bad(dev, c, g, "the input and the output overlap");
  if (c->kind == RT_COLL_ALL_REDUCE && c->in != c->out && overlap(c->in, in_bytes, c->out, out_bytes))
    return bad(dev, c, g, "the input and the output overlap without being the same buffer");

  if (c->kind == RT_COLL_PERMUTE) {
    c->src_of_me = -1;
    if (!c->pairs) { /* ring */
      int s = (int)(((int64_t)c->shift % n + n) % n);
      c->src_of_me = (g->rank - s + n) % n;
    } else {
      if (c->npairs < 0 || c->npairs > n) return bad(dev, c, g, "%d pairs in a group of %d", c->npairs, n);
      unsigned char sends[RT_HARD_MAX_DEVICES] = {0}, recvs[RT_HARD_MAX_DEVICES] = {0};
      for (int i = 0; i < c->npairs; i++) {
        int s = c->pairs[2 * i], d = c->pairs[2 * i + 1];
        if (s < 0 || s >= n || d < 0 || d >= n)
          return bad(dev, c, g, "pair %d (%d -> %d) names a rank outside the group of %d", i, s, d, n);
        if (sends[s]++ || recvs[d]++)
          return bad(dev, c, g, "rank %d %s twice in the pairs", sends[s] > 1 ? s : d,
                     sends[s] > 1 ? "sends" : "receives");
        if (d == g->rank) c->src_of_me = s;
      }
    }
  }
  return RT_OK;
}

/* ---- dispatch ---- */

/* What the device sends for the call, as `explain` defines it (language.md), over n members. */
static double sent_bytes(const RtCall *c, int n) {
  double es = (double)rt_dtype_size(c->dtype), f = n > 0 ? (double)(n - 1) / n : 0;
  switch (c->kind) {
  case RT_COLL_ALL_GATHER:
  case RT_COLL_REDUCE_SCATTER: return f * (double)c->outer * (double)c->extent * (double)c->inner * n * es;
  case RT_COLL_ALL_REDUCE: return 2 * f * (double)c->count * es;
  case RT_COLL_ALL_TO_ALL: {
    double e = es;
    for (int i = 0; i < c->nd; i++) e *= (double)c->shape[i];
    return f * e;
  }
  case RT_COLL_PERMUTE: return (double)c->count * es;
  default: return 0;
  }
}

static int collective(RtDevice *dev, const RtGroups *G, RtCall *c) {
  Runtime *rt = dev->rt;
  if (rtrun_stopped(rt)) return RT_E_STOPPED;
  RtGroup g;
  int rc = rtgroup_lookup(dev, G, rtrun_coll_name(c->kind), &g);
  if (rc) return rc;
  double member_elems = 0;
  rc = c->coll ? check_members(dev, &g, c, &member_elems) : check_args(dev, &g, c);
  if (rc) return rc;

  double t0 = rt_seconds();
  atomic_store(&dev->where, RT_WHERE(c->kind, g.mask, -1));
  const RtBackend *b = rt->backend;
  if (c->coll) rc = b->members(dev, &g, c);
  else switch (c->kind) {
    case RT_COLL_ALL_GATHER: rc = b->all_gather(dev, &g, c); break;
    case RT_COLL_REDUCE_SCATTER: rc = b->reduce_scatter(dev, &g, c); break;
    case RT_COLL_ALL_REDUCE: rc = b->all_reduce(dev, &g, c); break;
    case RT_COLL_ALL_TO_ALL: rc = b->all_to_all(dev, &g, c); break;
    case RT_COLL_PERMUTE: rc = b->permute(dev, &g, c); break;
    default: rc = b->barrier(dev, &g, c); break;
    }
  atomic_store(&dev->where, 0);
  dev->ncoll++;
  dev->coll_seconds += rt_seconds() - t0;
  if (c->coll) { /* the members' summed elements: a count the formula reads as one array */
    c->count = (int64_t)member_elems;
    c->outer = c->inner = 1, c->extent = g.size ? (int64_t)member_elems / g.size : 0;
  }
  if (rc == RT_OK && c->kind != RT_COLL_BARRIER) rtrun_count(dev, c->kind, g.mask, sent_bytes(c, g.size));
  return rc;
}

int rtcall_members(RtDevice *dev, const RtColl *k, const void *const *in, void *const *out) {
  RtCall c = {.kind = k->kind == RT_ALL_GATHER ? RT_COLL_ALL_GATHER : k->kind == RT_REDUCE_SCATTER ? RT_COLL_REDUCE_SCATTER
                                                                                                 : RT_COLL_ALL_REDUCE,
              .dtype = (RtDtype)k->dtype, .op = (RtReduceOp)k->op, .coll = k, .ins = in, .outs = out};
  return collective(dev, k->groups, &c);
}

int rt_all_gather(RtDevice *dev, const RtGroups *g, RtDtype dt, const void *in, void *out, int64_t outer, int64_t extent,
                  int64_t inner) {
  RtCall c = {.kind = RT_COLL_ALL_GATHER, .dtype = dt, .in = in, .out = out, .outer = outer, .extent = extent, .inner = inner};
  return collective(dev, g, &c);
}

int rt_reduce_scatter(RtDevice *dev, const RtGroups *g, RtDtype dt, RtReduceOp op, const void *in, void *out,
                      int64_t outer, int64_t extent, int64_t inner) {
  RtCall c = {.kind = RT_COLL_REDUCE_SCATTER, .dtype = dt, .op = op, .in = in, .out = out,
              .outer = outer, .extent = extent, .inner = inner};
  return collective(dev, g, &c);
}

int rt_all_reduce(RtDevice *dev, const RtGroups *g, RtDtype dt, RtReduceOp op, const void *in, void *out, int64_t count) {
  RtCall c = {.kind = RT_COLL_ALL_REDUCE, .dtype = dt, .op = op, .in = in, .out = out, .count = count};
  return collective(dev, g, &c);
}

int rt_all_to_all(RtDevice *dev, const RtGroups *g, RtDtype dt, const void *in, void *out, int ndims,
                  const int64_t *shape, int split_dim, int concat_dim) {
  RtCall c = {.kind = RT_COLL_ALL_TO_ALL, .dtype = dt, .in = in, .out = out, .nd = ndims,
              .split_dim = split_dim, .concat_dim = concat_dim};
  if (ndims >= 1 && ndims <= RT_MAX_RANK && shape) memcpy(c.shape, shape, (size_t)ndims * sizeof *shape);
  else c.nd = shape ? ndims : 0;
  return collective(dev, g, &c);
}

int rt_permute_shift(RtDevice *dev, const RtGroups *g, RtDtype dt, const void *in, void *out, int64_t count, int shift) {
  RtCall c = {.kind = RT_COLL_PERMUTE, .dtype = dt, .in = in, .out = out, .count = count, .shift = shift};
  return collective(dev, g, &c);
}

int rt_permute_pairs(RtDevice *dev, const RtGroups *g, RtDtype dt, const void *in, void *out, int64_t count,
                     const int *pairs, int npairs) {
  static const int none[1] = {0};
  RtCall c = {.kind = RT_COLL_PERMUTE, .dtype = dt, .in = in, .out = out, .count = count,
              .pairs = pairs ? pairs : none, .npairs = pairs ? npairs : 0};
  return collective(dev, g, &c);
}

int rt_barrier(RtDevice *dev, const RtGroups *g) {
  RtCall c = {.kind = RT_COLL_BARRIER, .dtype = RT_F32};
  return collective(dev, g, &c);
}

int rt_permute_shift_start(RtDevice *dev, const RtGroups *G, RtDtype dt, const void *in, void *out, int64_t count, int shift,
                           RtRequest **req) {
  if (!dev) return RT_E_ARG;
  if (!req) return rtrun_fail(dev, RT_E_ARG, "rt_permute_shift_start: no place for the request");
  *req = NULL;
  if (rtrun_stopped(dev->rt)) return RT_E_STOPPED;
  RtRequest *r = calloc(1, sizeof *r);
  if (!r) return rtrun_fail(dev, RT_E_NOMEM, "out of memory for a permute request");
  r->c = (RtCall){.kind = RT_COLL_PERMUTE, .dtype = dt, .in = in, .out = out, .count = count, .shift = shift};
  int rc = rtgroup_lookup(dev, G, rtrun_coll_name(r->c.kind), &r->g);
  if (!rc) rc = check_args(dev, &r->g, &r->c);
  if (rc) {
    free(r);
    return rc;
  }
  const RtBackend *b = dev->rt->backend;
  double t0 = rt_seconds();
  atomic_store(&dev->where, RT_WHERE(r->c.kind, r->g.mask, -1));
  if (b->permute_start) {
    rc = b->permute_start(dev, &r->g, &r->c, r);
  } else {
    rc = b->permute(dev, &r->g, &r->c);
    r->done = 1, r->rc = rc;
  }
  atomic_store(&dev->where, 0);
  dev->ncoll++;
  dev->coll_seconds += rt_seconds() - t0;
  if (rc) {
    free(r);
    return rc;
  }
  rtrun_count(dev, r->c.kind, r->g.mask, sent_bytes(&r->c, r->g.size));
  *req = r;
  return RT_OK;
}

int rt_wait(RtDevice *dev, RtRequest *r) {
  if (!dev || !r) return RT_E_ARG;
  int rc = r->rc;
  if (!r->done) {
    double t0 = rt_seconds();
    atomic_store(&dev->where, RT_WHERE(r->c.kind, r->g.mask, -1));
    rc = dev->rt->backend->wait_request(dev, r);
    atomic_store(&dev->where, 0);
    dev->coll_seconds += rt_seconds() - t0;
  }
  free(r);
  return rc;
}

/* ---- point to point ---- */

static int p2p(RtDevice *dev, RtCollKind kind, int peer, int tag, const void *buf, size_t bytes) {
  Runtime *rt = dev->rt;
  if (rtrun_stopped(rt)) return RT_E_STOPPED;
  if (peer < 0 || peer >= rt->ndev)
    return rtrun_fail(dev, RT_E_ARG, "%s %s device %d: the mesh has devices 0 to %d", rtrun_coll_name(kind),
                      kind == RT_COLL_SEND ? "to" : "from", peer, rt->ndev - 1);
  if (bytes && !buf) return rtrun_fail(dev, RT_E_ARG, "%s with a NULL buffer", rtrun_coll_name(kind));
  double t0 = rt_seconds();
  atomic_store(&dev->where, RT_WHERE(kind, 0, peer));
  int rc = kind == RT_COLL_SEND ? rt->backend->send(dev, peer, tag, buf, bytes)
                                : rt->backend->recv(dev, peer, tag, (void *)buf, bytes);
  atomic_store(&dev->where, 0);
  dev->ncoll++;
  dev->coll_seconds += rt_seconds() - t0;
  return rc;
}

int rt_send(RtDevice *dev, int dst, int tag, const void *buf, size_t bytes) {
  return p2p(dev, RT_COLL_SEND, dst, tag, buf, bytes);
}

int rt_recv(RtDevice *dev, int src, int tag, void *buf, size_t bytes) {
  return p2p(dev, RT_COLL_RECV, src, tag, buf, bytes);
}
