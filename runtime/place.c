/* place.c: a whole tensor's blocks onto the devices and back (shardrt.h, RtPlace): what `shardc run`
 * (compiler/driver/run_host.c) and a built executable (launch.c) do with a program's inputs, params
 * and outputs. The description is the compiler's (its device program: each device's block start,
 * the devices holding the tensor, the copies read back, each dim's storage order); nothing here
 * works out which block a device holds.
 *
 * A block element at local position (i0, ..., ik) is storage position start[d] + id along each dim
 * d, which holds logical position rt_order_logical(order[d], start[d] + id): the global row-major
 * index of the element is made of those. */
#include <math.h>

#include "rt_internal.h"

int64_t rt_place_elements(const RtPlace *p) {
  int64_t n = 1;
  for (int d = 0; p && d < p->rank; d++) n *= p->local[d];
  return n;
}

bool rt_place_holds(const RtPlace *p, int dev) { return p && dev >= 0 && dev < p->ndev && (!p->holds || p->holds[dev]); }


static bool valid(const RtPlace *p, int dev) {
  if (!p || p->rank < 0 || p->rank > RT_MAX_RANK || !rt_dtype_size((RtDtype)p->dtype) || dev < 0 || dev >= p->ndev) return false;
  for (int d = 0; d < p->rank; d++) {
    int64_t s = p->start ? p->start[(int64_t)dev * p->rank + d] : 0;
    if (p->local[d] < 0 || s < 0 || s + p->local[d] > p->global[d]) return false;
  }
  return true;
}

static bool ordered(const RtPlace *p) {
  for (int d = 0; d < p->rank; d++)
    if (p->order[d].kind != RT_ORDER_NATURAL) return true;
  return false;
}

/* Visits device dev's block: gi the logical global row-major index of local element li. */
static void each(const RtPlace *p, int dev, void (*fn)(void *, int64_t, int64_t), void *ctx) {
  int64_t n = rt_place_elements(p), idx[RT_MAX_RANK] = {0};
  const int64_t *st = p->start ? &p->start[(int64_t)dev * p->rank] : NULL;
  for (int64_t li = 0; li < n; li++) {
    int64_t gi = 0;
    for (int d = 0; d < p->rank; d++) gi = gi * p->global[d] + rt_order_logical(&p->order[d], (st ? st[d] : 0) + idx[d]);
    fn(ctx, gi, li);
    for (int d = p->rank - 1; d >= 0; d--) {
      if (++idx[d] < p->local[d]) break;
      idx[d] = 0;
    }
  }
}

typedef struct Fill {
  const RtPlace *p;
  void *buf;
  const double *global;
  uint64_t seed, key;
  double lo, hi;
  bool add;
} Fill;

static void from_global(void *c, int64_t gi, int64_t li) {
  Fill *f = c;
  rtk_put(f->buf, (RtDtype)f->p->dtype, li, f->global[gi]);
}

static void generated(void *c, int64_t gi, int64_t li) {
  Fill *f = c;
  RtDtype dt = (RtDtype)f->p->dtype;
  if (dt == RT_I32) { /* as rt_random_fill makes them: hi may be 2^31 (exclusive) */
    uint64_t bits = rt_random_bits(f->seed, f->key, (uint64_t)gi);
    int64_t lo = (int64_t)f->lo, hi = (int64_t)f->hi;
    ((int32_t *)f->buf)[li] = (int32_t)(lo + (int64_t)(((bits >> 32) * (uint64_t)(hi - lo)) >> 32));
  } else {
    rtk_put(f->buf, dt, li, rt_random_float(f->seed, f->key, (uint64_t)gi, (float)f->lo, (float)f->hi));
  }
}

int rt_place_fill(const RtPlace *p, int dev, void *out, const double *global, uint64_t seed, uint64_t key, double lo,
                  double hi) {
  if (!valid(p, dev)) return RT_E_ARG;
  int64_t n = rt_place_elements(p);
  if (n && !out) return RT_E_ARG;
  Fill f = {.p = p, .buf = out, .global = global, .seed = seed, .key = key, .lo = lo, .hi = hi};
  if (global) {
    each(p, dev, from_global, &f);
    return RT_OK;
  }
  if (lo == hi) { /* a constant */
    for (int64_t i = 0; i < n; i++) rtk_put(out, (RtDtype)p->dtype, i, lo);
    return RT_OK;
  }
  if (!ordered(p)) { /* the block is a box of the global tensor */
    RtBlock b = {.ndims = p->rank};
    for (int d = 0; d < p->rank; d++)
      b.global[d] = p->global[d], b.shape[d] = p->local[d], b.start[d] = p->start ? p->start[(int64_t)dev * p->rank + d] : 0;
    return rt_random_fill(out, (RtDtype)p->dtype, &b, seed, key, lo, hi);
  }
  if (p->dtype == RT_I32 && (hi > (double)INT32_MAX + 1 || lo != floor(lo) || hi != floor(hi))) return RT_E_ARG;
  each(p, dev, generated, &f);
  return RT_OK;
}

static void to_global(void *c, int64_t gi, int64_t li) {
  Fill *f = c;
  double v = rtk_get(f->buf, (RtDtype)f->p->dtype, li);
  ((double *)f->global)[gi] = f->add ? f->global[gi] + v : v;
}

int rt_place_gather(const RtPlace *p, int dev, const void *block, double *global) {
  if (!valid(p, dev) || !global) return RT_E_ARG;
  if (!rt_place_holds(p, dev) || (p->take && !p->take[dev]) || !block) return RT_OK;
  Fill f = {.p = p, .buf = (void *)block, .global = global, .add = p->partial != 0};
  each(p, dev, to_global, &f);
  return RT_OK;
}
