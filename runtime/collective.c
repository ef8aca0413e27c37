/* collective.c: the collectives' front end, the same whatever the backend. For each call it
 * builds the device's group from the axis tuple (who the members are, in which rank order),
 * checks the arguments (axes, dtype, sizes that divide, buffers that do not overlap), so that a
 * lowering mistake fails here with a message naming the device, the collective and its axes,
 * then hands the call to the backend (backend.h) and keeps the device's statistics.
 *
 * Groups. Devices are numbered major to minor (device = sum of coord x stride, the last axis
 * fastest). The group of a device over the tuple (a1, ..., ak) is the devices equal to it off
 * those axes; rank = its coordinates on a1..ak as a mixed-radix number, a1 most significant. So
 * the same set of axes in another order is the same group with other ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

/* Builds dev's group over the tuple; RT_E_ARG (not recorded) for bad axes. */
static int group_make(const RtDevice *dev, const int *axes, int naxes, RtGroup *g) {
  const Runtime *rt = dev->rt;
  if (naxes < 0 || naxes > rt->naxes || (naxes && !axes)) return RT_E_ARG;
  g->naxes = naxes;
  g->size = 1;
  g->rank = 0;
  g->base = dev->index;
  g->mask = 0;
  size_t len = (size_t)snprintf(g->text, sizeof g->text, "(");
  unsigned seen = 0;
  for (int k = 0; k < naxes; k++) {
    int a = axes[k];
    if (a < 0 || a >= rt->naxes || (seen >> a & 1)) return RT_E_ARG;
    seen |= 1u << a;
    g->axes[k] = a;
    g->size *= rt->axis_size[a];
    g->rank = g->rank * rt->axis_size[a] + dev->coord[a];
    g->base -= (int)(dev->coord[a] * rt->axis_stride[a]);
    if (rt->axis_size[a] > 1) g->mask |= 1u << a;
    len += (size_t)snprintf(g->text + len, sizeof g->text - len, "%s%s", k ? ", " : "", rt->axis_name[a]);
  }
  snprintf(g->text + len, sizeof g->text - len, ")");
  return RT_OK;
}

int rtgroup_member(const Runtime *rt, const RtGroup *g, int rank) {
  int dev = g->base;
  for (int k = g->naxes - 1; k >= 0; k--) {
    int a = g->axes[k];
    dev += (int)((rank % rt->axis_size[a]) * rt->axis_stride[a]);
    rank /= rt->axis_size[a];
  }
  return dev;
}

int rt_group_rank(const RtDevice *dev, const int *axes, int naxes) {
  RtGroup g;
  return group_make(dev, axes, naxes, &g) ? -1 : g.rank;
}

int rt_group_size(const RtDevice *dev, const int *axes, int naxes) {
  RtGroup g;
  return group_make(dev, axes, naxes, &g) ? -1 : g.size;
}

/* ---- argument checks ---- */

static int bad(RtDevice *dev, const RtColl *c, const RtGroup *g, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int bad(RtDevice *dev, const RtColl *c, const RtGroup *g, const char *fmt, ...) {
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

static int check_args(RtDevice *dev, const RtGroup *g, RtColl *c) {
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

/* The group and the checked call, or the failure. */
static int prepare(RtDevice *dev, const int *axes, int naxes, RtColl *c, RtGroup *gp) {
  Runtime *rt = dev->rt;
  if (rtrun_stopped(rt)) return RT_E_STOPPED;
  RtGroup g;
  if (group_make(dev, axes, naxes, &g)) {
    char list[64] = "";
    size_t len = 0;
    for (int k = 0; axes && k < naxes && k < 8 && len < sizeof list; k++)
      len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", k ? ", " : "", axes[k]);
    return rtrun_fail(dev, RT_E_ARG, "%s over axes (%s): not distinct axes of this %d-axis mesh",
                      rtrun_coll_name(c->kind), list, rt->naxes);
  }
  *gp = g;
  return check_args(dev, gp, c);
}

static int collective(RtDevice *dev, const int *axes, int naxes, RtColl *c) {
  Runtime *rt = dev->rt;
  RtGroup g;
  int rc = prepare(dev, axes, naxes, c, &g);
  if (rc) return rc;

  double t0 = rt_seconds();
  atomic_store(&dev->where, RT_WHERE(c->kind, g.mask, -1));
  const RtBackend *b = rt->backend;
  switch (c->kind) {
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
  return rc;
}

int rt_all_gather(RtDevice *dev, const int *axes, int naxes, RtDtype dt, const void *in, void *out,
                  int64_t outer, int64_t extent, int64_t inner) {
  RtColl c = {.kind = RT_COLL_ALL_GATHER, .dtype = dt, .in = in, .out = out,
              .outer = outer, .extent = extent, .inner = inner};
  return collective(dev, axes, naxes, &c);
}

int rt_reduce_scatter(RtDevice *dev, const int *axes, int naxes, RtDtype dt, RtReduceOp op,
                      const void *in, void *out, int64_t outer, int64_t extent, int64_t inner) {
  RtColl c = {.kind = RT_COLL_REDUCE_SCATTER, .dtype = dt, .op = op, .in = in, .out = out,
              .outer = outer, .extent = extent, .inner = inner};
  return collective(dev, axes, naxes, &c);
}

int rt_all_reduce(RtDevice *dev, const int *axes, int naxes, RtDtype dt, RtReduceOp op,
                  const void *in, void *out, int64_t count) {
  RtColl c = {.kind = RT_COLL_ALL_REDUCE, .dtype = dt, .op = op, .in = in, .out = out, .count = count};
  return collective(dev, axes, naxes, &c);
}

int rt_all_to_all(RtDevice *dev, const int *axes, int naxes, RtDtype dt, const void *in, void *out,
                  int ndims, const int64_t *shape, int split_dim, int concat_dim) {
  RtColl c = {.kind = RT_COLL_ALL_TO_ALL, .dtype = dt, .in = in, .out = out, .nd = ndims,
              .split_dim = split_dim, .concat_dim = concat_dim};
  if (ndims >= 1 && ndims <= RT_MAX_RANK && shape) memcpy(c.shape, shape, (size_t)ndims * sizeof *shape);
  else c.nd = shape ? ndims : 0;
  return collective(dev, axes, naxes, &c);
}

int rt_permute_shift(RtDevice *dev, const int *axes, int naxes, RtDtype dt, const void *in, void *out,
                     int64_t count, int shift) {
  RtColl c = {.kind = RT_COLL_PERMUTE, .dtype = dt, .in = in, .out = out, .count = count, .shift = shift};
  return collective(dev, axes, naxes, &c);
}

int rt_permute_pairs(RtDevice *dev, const int *axes, int naxes, RtDtype dt, const void *in, void *out,
                     int64_t count, const int *pairs, int npairs) {
  static const int none[1] = {0};
  RtColl c = {.kind = RT_COLL_PERMUTE, .dtype = dt, .in = in, .out = out, .count = count,
              .pairs = pairs ? pairs : none, .npairs = pairs ? npairs : 0};
  return collective(dev, axes, naxes, &c);
}

int rt_permute_shift_start(RtDevice *dev, const int *axes, int naxes, RtDtype dt, const void *in, void *out,
                           int64_t count, int shift, RtRequest **req) {
  if (!dev) return RT_E_ARG;
  if (!req) return rtrun_fail(dev, RT_E_ARG, "rt_permute_shift_start: no place for the request");
  *req = NULL;
  RtRequest *r = calloc(1, sizeof *r);
  if (!r) return rtrun_fail(dev, RT_E_NOMEM, "out of memory for a permute request");
  r->c = (RtColl){.kind = RT_COLL_PERMUTE, .dtype = dt, .in = in, .out = out, .count = count, .shift = shift};
  int rc = prepare(dev, axes, naxes, &r->c, &r->g);
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

int rt_barrier(RtDevice *dev, const int *axes, int naxes) {
  RtColl c = {.kind = RT_COLL_BARRIER, .dtype = RT_F32};
  return collective(dev, axes, naxes, &c);
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
