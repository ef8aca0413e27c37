/* coll.c: rt_collective, one collective of the program as the lowering describes it (shardrt.h,
 * RtColl): a collective op of the device program, or a bucket of them (docs/passes.md, "Buckets").
 *
 * One member of one part, an all-reduce, an all-to-all or a permute of one member run as they are,
 * on the members' own buffers. Otherwise the members are packed into one buffer, the collective
 * runs once over the call's groups, and the result is unpacked:
 *   all-gather      the members' blocks side by side (S elements); the group's n packed blocks come
 *                   back in rank order, and the block of the device of rank r goes, in each member,
 *                   where its parts place that device: along part p's dim at the device's rank in
 *                   the part's groups times the block's extent;
 *   reduce-scatter  for each rank r, the blocks the device of rank r keeps, side by side; rank r
 *                   keeps the reduction of the r-th S elements, which are its members' blocks;
 *   all-reduce      the members side by side, reduced, split back.
 * A backend that moves members in place (backend.h's `members`: the threads backend reads its peers'
 * member buffers directly) does all of this without the packed buffers. The reductions keep the
 * runtime's order (rank order of the call's groups), and the call is one collective to
 * rt_executed, of the summed bytes. */
#include <string.h>

#include "backend.h"

static int64_t count_of(const int64_t *shape, int rank) {
  int64_t n = 1;
  for (int d = 0; d < rank; d++) n *= shape[d];
  return n;
}

static int bad(RtDevice *dev, const RtColl *c, const char *what) {
  static const char *const names[] = {"all_gather", "reduce_scatter", "all_reduce", "all_to_all", "collective_permute"};
  const char *k = c && c->kind >= 0 && c->kind < 5 ? names[c->kind] : "collective";
  return rtrun_fail(dev, RT_E_ARG, "%s over %s: %s", k, c && c->groups && c->groups->text ? c->groups->text : "(?)", what);
}

bool rtcoll_shapes(const RtCollMember *m, int kind, int64_t *block, int64_t *whole) {
  if (m->rank < 0 || m->rank > RT_MAX_RANK || m->nparts < 0 || m->nparts > RT_MAX_RANK) return false;
  for (int d = 0; d < m->rank; d++) block[d] = whole[d] = m->shape[d];
  for (int p = 0; p < m->nparts; p++) {
    int d = m->parts[p].dim;
    const RtGroups *g = m->parts[p].groups;
    if (d < 0 || d >= m->rank || !g || g->size < 1) return false;
    if (kind == RT_ALL_GATHER) whole[d] *= g->size;
    else if (block[d] % g->size) return false;
    else block[d] /= g->size;
  }
  return true;
}

/* Copies the box of block shape `block` between a packed run (row-major) and position `pos` (per
 * dim, in blocks) of a tensor of shape `whole`; to_whole: into the tensor. */
static void box(int rank, const int64_t *block, const int64_t *whole, const int64_t *pos, char *packed, char *tensor, size_t es,
                bool to_whole) {
  int64_t bs[RT_MAX_RANK], ws[RT_MAX_RANK], off = 0;
  rtk_row_major_strides(block, rank, bs);
  rtk_row_major_strides(whole, rank, ws);
  for (int d = 0; d < rank; d++) off += pos[d] * block[d] * ws[d];
  if (to_whole) rtk_copy_box(tensor + (size_t)off * es, ws, packed, bs, block, rank, es);
  else rtk_copy_box(packed, bs, tensor + (size_t)off * es, ws, block, rank, es);
}

bool rtcoll_position(const RtCollMember *m, int dev_at_r, int64_t *pos) {
  for (int d = 0; d < m->rank; d++) pos[d] = 0;
  for (int p = 0; p < m->nparts; p++) {
    int32_t r = m->parts[p].groups->rank_of[dev_at_r];
    if (r < 0) return false;
    pos[m->parts[p].dim] = r;
  }
  return true;
}

int rt_collective(RtDevice *dev, const RtColl *c, const void *const *in, void *const *out) {
  if (rtrun_stopped(dev->rt)) return RT_E_STOPPED;
  if (!c || c->nmembers < 1 || !c->members || !in || !out || c->kind < RT_ALL_GATHER || c->kind > RT_PERMUTE)
    return bad(dev, c, "a malformed collective");
  RtDtype dt = (RtDtype)c->dtype;
  size_t es = rt_dtype_size(dt);
  if (!es) return bad(dev, c, "an unknown dtype");
  const RtGroups *G = c->groups;
  if (c->kind == RT_ALL_REDUCE && G && G->subset) { /* a tied param's first and last stage */
    if (c->nmembers != 1) return bad(dev, c, "a bucket among a subset of the groups");
    return rt_all_reduce_group(dev, G, dt, (RtReduceOp)c->op, in[0], out[0], count_of(c->members[0].shape, c->members[0].rank));
  }
  const RtCollMember *m0 = &c->members[0];
  if (c->nmembers == 1) {
    int64_t n = count_of(m0->shape, m0->rank);
    switch (c->kind) {
    case RT_ALL_REDUCE: return rt_all_reduce(dev, G, dt, (RtReduceOp)c->op, in[0], out[0], n);
    case RT_ALL_TO_ALL: return rt_all_to_all(dev, G, dt, in[0], out[0], m0->rank, m0->shape, c->split_dim, c->concat_dim);
    case RT_PERMUTE: return rt_permute_shift(dev, G, dt, in[0], out[0], n, c->shift);
    default:
      if (m0->nparts == 1 && m0->parts[0].groups == G) { /* [outer, extent, inner] around the part's dim */
        int d = m0->parts[0].dim;
        if (d < 0 || d >= m0->rank) return bad(dev, c, "a part outside its member's dims");
        int64_t outer = count_of(m0->shape, d), inner = count_of(m0->shape + d + 1, m0->rank - d - 1), ext = m0->shape[d];
        if (c->kind == RT_ALL_GATHER) return rt_all_gather(dev, G, dt, in[0], out[0], outer, ext, inner);
        if (!G || G->size < 1 || ext % G->size) return bad(dev, c, "a scattered dim that does not divide");
        return rt_reduce_scatter(dev, G, dt, (RtReduceOp)c->op, in[0], out[0], outer, ext / G->size, inner);
      }
      break;
    }
  }
  if (c->kind == RT_ALL_TO_ALL || c->kind == RT_PERMUTE) return bad(dev, c, "a bucket of all-to-alls or permutes");
  if (dev->rt->backend->members && !dev->rt->pack_members) return rtcall_members(dev, c, in, out); /* moved in place (collective.c) */
  RtGroup g;
  int rc = rtgroup_lookup(dev, G, "a packed collective", &g);
  if (rc) return rc;
  int64_t blocks[RT_MAX_RANK], whole[RT_MAX_RANK], pos[RT_MAX_RANK], S = 0;
  for (int i = 0; i < c->nmembers; i++) {
    if (!rtcoll_shapes(&c->members[i], c->kind, blocks, whole)) return bad(dev, c, "a malformed member");
    S += count_of(c->kind == RT_ALL_REDUCE ? c->members[i].shape : blocks, c->members[i].rank);
  }
  int64_t n = g.size, nin = c->kind == RT_ALL_GATHER ? S : c->kind == RT_REDUCE_SCATTER ? n * S : S;
  int64_t nout = c->kind == RT_ALL_GATHER ? n * S : S;
  char *pin = NULL, *pout = NULL;
  rc = rt_alloc(dev, (size_t)(nin > 0 ? nin : 1) * es, "packed collective in", (void **)&pin);
  if (!rc) rc = rt_alloc(dev, (size_t)(nout > 0 ? nout : 1) * es, "packed collective out", (void **)&pout);
  /* pack */
  for (int64_t r = 0, off = 0; !rc && r < (c->kind == RT_REDUCE_SCATTER ? n : 1); r++) {
    int e = rtgroup_member(&g, (int)r);
    for (int i = 0; i < c->nmembers; i++) {
      const RtCollMember *m = &c->members[i];
      rtcoll_shapes(m, c->kind, blocks, whole);
      if (c->kind == RT_REDUCE_SCATTER) { /* the block rank r keeps, out of the whole operand */
        if (!rtcoll_position(m, e, pos)) rc = bad(dev, c, "a member's part groups do not hold the call's devices");
        else box(m->rank, blocks, m->shape, pos, pin + (size_t)off * es, (char *)in[i], es, false);
        off += count_of(blocks, m->rank);
      } else {
        int64_t k = count_of(m->shape, m->rank);
        memcpy(pin + (size_t)off * es, in[i], (size_t)k * es);
        off += k;
      }
    }
  }
  if (!rc) {
    if (c->kind == RT_ALL_GATHER) rc = rt_all_gather(dev, G, dt, pin, pout, 1, S, 1);
    else if (c->kind == RT_REDUCE_SCATTER) rc = rt_reduce_scatter(dev, G, dt, (RtReduceOp)c->op, pin, pout, 1, S, 1);
    else rc = rt_all_reduce(dev, G, dt, (RtReduceOp)c->op, pin, pout, S);
  }
  /* unpack */
  for (int64_t r = 0; !rc && r < (c->kind == RT_ALL_GATHER ? n : 1); r++) {
    int e = rtgroup_member(&g, (int)r);
    int64_t off = 0; /* within rank r's packed block */
    for (int i = 0; i < c->nmembers; i++) {
      const RtCollMember *m = &c->members[i];
      rtcoll_shapes(m, c->kind, blocks, whole);
      if (c->kind == RT_ALL_GATHER) {
        if (!rtcoll_position(m, e, pos)) rc = bad(dev, c, "a member's part groups do not hold the call's devices");
        else box(m->rank, m->shape, whole, pos, pout + (size_t)(r * S + off) * es, out[i], es, true);
        off += count_of(m->shape, m->rank);
      } else {
        int64_t k = count_of(c->kind == RT_ALL_REDUCE ? m->shape : blocks, m->rank);
        memcpy(out[i], pout + (size_t)off * es, (size_t)k * es);
        off += k;
      }
    }
  }
  rt_free(dev, pin);
  rt_free(dev, pout);
  return rc;
}
