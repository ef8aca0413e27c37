/* nn_ring.c: ring attention (context parallelism; shardrt.h's rt_nn_ring_attention and its
 * gradient). The key dim of k and v is split over a ring of devices; each device keeps its query
 * block and the K/V blocks come round by rt_permute_shift(+1), the block of rank r - j at hand at
 * step j, as the reference interpreter's spmd_ring / iop_ring_attention define it
 * (docs/interpreter.md, Ring attention). Everything is computed in double and rounded once on
 * store; the index space is nn.c's RtAttn (batch dims, query, key, head and value dims). */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "shardrt.h"

enum { AQ, AK, AV, AO, ADO };

/* as nn.c's: an element at dtype dt as a double, and stored rounded to dt */
static double ld(const void *p, int64_t dt, int64_t i) {
  switch (dt) {
  case RT_BF16: return rt_bf16_to_f32(((const uint16_t *)p)[i]);
  case RT_F16: return rt_f16_to_f32(((const uint16_t *)p)[i]);
  default: return ((const float *)p)[i];
  }
}

static void st(void *p, int64_t dt, int64_t i, double v) {
  switch (dt) {
  case RT_BF16: ((uint16_t *)p)[i] = rt_f32_to_bf16((float)v); break;
  case RT_F16: ((uint16_t *)p)[i] = rt_f32_to_f16((float)v); break;
  default: ((float *)p)[i] = (float)v; break;
  }
}

/* Elements of a tensor: the largest offset it is indexed at, plus one. */
static int64_t extent_of(const RtAttn *a, int t) {
  int64_t e = 0;
  for (int64_t d = 0; d < a->nb; d++) e += (a->extent[d] - 1) * a->stride[t][d];
  e += (a->nq - 1) * a->sq[t] + (a->nk - 1) * a->sk[t] + (a->nh - 1) * a->sh[t] + (a->nv - 1) * a->sv[t];
  return e + 1;
}

/* The logical position of storage position p under the zigzag order (ir_zigzag_logical): blocks
 * of 2c, block b holding chunks b and 2n-1-b. */
static int64_t logical(int64_t n, int64_t c, int64_t p) {
  if (n < 2 || c <= 0) return p;
  int64_t b = p / (2 * c), o = p % (2 * c);
  return (o < c ? b : 2 * n - 1 - b) * c + o % c;
}

/* One device's ring: its group, rank and size, the buffers the blocks travel in, per batch index
 * each tensor's offset, the logical positions of its query rows. */
typedef struct Ring {
  RtDevice *dev;
  const RtAttn *a;
  const RtRing *R;
  int axes[RT_MAX_AXES], naxes;
  int n, rank;
  int64_t nbatch;
  int64_t *boff;        /* [nbatch][5] */
  int64_t *qpos;        /* [nq]: logical query positions */
  int64_t *kpos;        /* [nk]: logical key positions of the block at hand */
  double *s;            /* [nk]: one row's scores */
  void *kb[2], *vb[2];  /* the travelling K and V blocks (rt_alloc'd) */
  int64_t kn, vn;       /* their elements */
} Ring;

static void ring_free(Ring *g) {
  free(g->boff), free(g->qpos), free(g->kpos), free(g->s);
  for (int i = 0; i < 2; i++) rt_free(g->dev, g->kb[i]), rt_free(g->dev, g->vb[i]);
}

static int ring_open(Ring *g, RtDevice *dev, const RtAttn *a, const RtRing *R, int64_t q_off, bool need_v) {
  memset(g, 0, sizeof *g);
  g->dev = dev, g->a = a, g->R = R;
  g->naxes = (int)R->naxes;
  for (int i = 0; i < g->naxes; i++) g->axes[i] = (int)R->axes[i];
  g->n = rt_group_size(dev, g->axes, g->naxes);
  g->rank = rt_group_rank(dev, g->axes, g->naxes);
  if (g->n < 1 || g->rank < 0) return rt_fail(dev, "ring attention: bad ring axes");
  g->nbatch = 1;
  for (int64_t d = 0; d < a->nb; d++) g->nbatch *= a->extent[d];
  g->boff = calloc((size_t)(g->nbatch > 0 ? g->nbatch : 1) * 5, sizeof(int64_t));
  g->qpos = malloc(sizeof(int64_t) * (size_t)(a->nq > 0 ? a->nq : 1));
  g->kpos = malloc(sizeof(int64_t) * (size_t)(a->nk > 0 ? a->nk : 1));
  g->s = malloc(sizeof(double) * (size_t)(a->nk > 0 ? a->nk : 1));
  if (!g->boff || !g->qpos || !g->kpos || !g->s) return rt_fail(dev, "ring attention: out of host memory");
  int64_t idx[RT_NN_DIMS] = {0};
  for (int64_t b = 0; b < g->nbatch; b++) { /* odometer over the batch dims, the last fastest */
    for (int t = 0; t < 5; t++) {
      int64_t o = 0;
      for (int64_t d = 0; d < a->nb; d++) o += idx[d] * a->stride[t][d];
      g->boff[b * 5 + t] = o;
    }
    for (int64_t d = a->nb - 1; d >= 0; d--) {
      if (++idx[d] < a->extent[d]) break;
      idx[d] = 0;
    }
  }
  for (int64_t i = 0; i < a->nq; i++) g->qpos[i] = logical(R->zz_n, R->zq_chunk, q_off + i);
  g->kn = extent_of(a, AK), g->vn = extent_of(a, AV);
  size_t kbytes = (size_t)g->kn * rt_dtype_size((RtDtype)a->dtype[AK]), vbytes = (size_t)g->vn * rt_dtype_size((RtDtype)a->dtype[AV]);
  for (int i = 0; g->n > 1 && i < 2; i++) {
    int rc = rt_alloc(dev, kbytes, "ring attention K block", &g->kb[i]);
    if (!rc && need_v) rc = rt_alloc(dev, vbytes, "ring attention V block", &g->vb[i]);
    if (rc) return rc;
  }
  return RT_OK;
}

/* The block at hand at step j: rank r - j's; its keys' logical positions. */
static void ring_at(Ring *g, int j) {
  int64_t src = ((g->rank - j) % g->n + g->n) % g->n;
  for (int64_t x = 0; x < g->a->nk; x++) g->kpos[x] = logical(g->R->zz_n, g->R->zk_chunk, src * g->a->nk + x);
}

/* Passes the block at hand (*k, *v) on and takes the next: +1 round the ring, into the spare
 * buffer (step j writes buffer j % 2; the device's own block is read, never written). */
static int ring_shift(Ring *g, int j, const void **k, const void **v) {
  const RtAttn *a = g->a;
  int rc = rt_permute_shift(g->dev, g->axes, g->naxes, (RtDtype)a->dtype[AK], *k, g->kb[j % 2], g->kn, 1);
  if (!rc && v) rc = rt_permute_shift(g->dev, g->axes, g->naxes, (RtDtype)a->dtype[AV], *v, g->vb[j % 2], g->vn, 1);
  if (rc) return rc;
  *k = g->kb[j % 2];
  if (v) *v = g->vb[j % 2];
  return RT_OK;
}

/* Row (b, i)'s scores against the block at hand: scale q.k, masked where the key's logical
 * position exceeds the query's; returns their max. */
static double ring_scores(const Ring *g, int64_t b, int64_t i, double scale, const void *q, const void *k) {
  const RtAttn *a = g->a;
  double m = -INFINITY;
  int64_t qo = g->boff[b * 5 + AQ] + i * a->sq[AQ], ko = g->boff[b * 5 + AK];
  for (int64_t j = 0; j < a->nk; j++) {
    if (a->causal && g->kpos[j] > g->qpos[i]) {
      g->s[j] = -INFINITY;
      continue;
    }
    double d = 0;
    for (int64_t h = 0; h < a->nh; h++)
      d += ld(q, a->dtype[AQ], qo + h * a->sh[AQ]) * ld(k, a->dtype[AK], ko + j * a->sk[AK] + h * a->sh[AK]);
    g->s[j] = scale * d;
    if (g->s[j] > m) m = g->s[j];
  }
  return m;
}

/* The forward: per query row the running max M and sum L of exponentials and the output acc,
 * rescaled by e^(M - M') when a block raises the max (the interpreter's online_step). */
int rt_nn_ring_attention(RtDevice *dev, const RtAttn *a, const RtRing *R, double scale, int64_t q_off, const void *q,
                         const void *k, const void *v, void *o) {
  Ring g;
  int rc = ring_open(&g, dev, a, R, q_off, true);
  int64_t rows = g.nbatch * a->nq;
  double *M = NULL, *L = NULL, *acc = NULL;
  if (!rc) {
    M = malloc(sizeof(double) * (size_t)(rows > 0 ? rows : 1));
    L = calloc((size_t)(rows > 0 ? rows : 1), sizeof(double));
    acc = calloc((size_t)(rows > 0 ? rows : 1) * (size_t)(a->nv > 0 ? a->nv : 1), sizeof(double));
    if (!M || !L || !acc) rc = rt_fail(dev, "ring attention: out of host memory");
    for (int64_t x = 0; M && x < rows; x++) M[x] = -INFINITY;
  }
  const void *kc = k, *vc = v;
  for (int j = 0; !rc && j < g.n; j++) {
    ring_at(&g, j);
    for (int64_t b = 0; b < g.nbatch; b++)
      for (int64_t i = 0; i < a->nq; i++) {
        int64_t row = b * a->nq + i;
        double mb = ring_scores(&g, b, i, scale, q, kc), m = M[row], mn = mb > m ? mb : m;
        double al = mn == -INFINITY ? 1 : exp(m - mn), sum = 0;
        double *ac = acc + row * a->nv;
        for (int64_t x = 0; x < a->nk; x++) sum += g.s[x] = mn == -INFINITY ? 0 : exp(g.s[x] - mn);
        M[row] = mn;
        L[row] = L[row] * al + sum;
        int64_t vo = g.boff[b * 5 + AV];
        for (int64_t c = 0; c < a->nv; c++) {
          double pv = 0;
          for (int64_t x = 0; x < a->nk; x++)
            if (g.s[x] != 0) pv += g.s[x] * ld(vc, a->dtype[AV], vo + x * a->sk[AV] + c * a->sv[AV]);
          ac[c] = ac[c] * al + pv;
        }
      }
    if (j < g.n - 1) rc = ring_shift(&g, j, &kc, &vc);
    if (!rc) rc = rt_check(dev);
  }
  for (int64_t b = 0; !rc && b < g.nbatch; b++)
    for (int64_t i = 0; i < a->nq; i++) {
      int64_t row = b * a->nq + i;
      for (int64_t c = 0; c < a->nv; c++)
        st(o, a->dtype[AO], g.boff[b * 5 + AO] + i * a->sq[AO] + c * a->sv[AO],
           L[row] > 0 ? acc[row * a->nv + c] / L[row] : 0);
    }
  free(M), free(L), free(acc);
  ring_free(&g);
  return rc;
}

/* The backward (ring_backward's sums): lse per query row over every key block, D = do . o per
 * row; then per visiting block p = e^(s - lse), ds = p (do . v - D): dq += scale ds k (kept),
 * dk += scale ds q and dv += p do (travelling with their block, one more shift brings them home).
 * The travelling gradient is a double array moved as raw bytes (two f32 words per element). */
int rt_nn_ring_attention_grad(RtDevice *dev, const RtAttn *a, const RtRing *R, double scale, int64_t q_off,
                              const void *q, const void *k, const void *v, const void *o, const void *dout, int which,
                              void *out) {
  if (which < 0 || which > 2) return rt_fail(dev, "ring attention_grad: gradient %d is not 0, 1 or 2", which);
  Ring g;
  int rc = ring_open(&g, dev, a, R, q_off, which != 2);
  int64_t rows = g.nbatch * a->nq;
  int gt = which == 0 ? AQ : which == 1 ? AK : AV; /* the tensor whose gradient this is */
  int64_t gn = which == 0 ? extent_of(a, AQ) : which == 1 ? g.kn : g.vn;
  double *lse = NULL, *L = NULL, *D = NULL, *gr[2] = {NULL, NULL};
  if (!rc) {
    lse = malloc(sizeof(double) * (size_t)(rows > 0 ? rows : 1));
    L = calloc((size_t)(rows > 0 ? rows : 1), sizeof(double));
    D = calloc((size_t)(rows > 0 ? rows : 1), sizeof(double));
    gr[0] = calloc((size_t)gn, sizeof(double));
    if (which != 0 && g.n > 1) rc = rt_alloc(dev, sizeof(double) * (size_t)gn, "ring attention gradient block", (void **)&gr[1]);
    if (!rc && (!lse || !L || !D || !gr[0])) rc = rt_fail(dev, "ring attention_grad: out of host memory");
    for (int64_t x = 0; lse && x < rows; x++) lse[x] = -INFINITY;
  }
  /* round 1: the logsumexp of each query row (lse holds the running max until the end) */
  const void *kc = k, *vc = v;
  for (int j = 0; !rc && j < g.n; j++) {
    ring_at(&g, j);
    for (int64_t b = 0; b < g.nbatch; b++)
      for (int64_t i = 0; i < a->nq; i++) {
        int64_t row = b * a->nq + i;
        double mb = ring_scores(&g, b, i, scale, q, kc), m = lse[row], mn = mb > m ? mb : m, sum = 0;
        for (int64_t x = 0; x < a->nk; x++) sum += mn == -INFINITY ? 0 : exp(g.s[x] - mn);
        L[row] = L[row] * (mn == -INFINITY ? 1 : exp(m - mn)) + sum;
        lse[row] = mn;
      }
    if (j < g.n - 1) rc = ring_shift(&g, j, &kc, NULL);
  }
  for (int64_t x = 0; !rc && x < rows; x++) lse[x] = L[x] > 0 ? lse[x] + log(L[x]) : -INFINITY;
  for (int64_t b = 0; !rc && b < g.nbatch; b++)
    for (int64_t i = 0; i < a->nq; i++) {
      double d = 0;
      int64_t oo = g.boff[b * 5 + AO] + i * a->sq[AO], dd = g.boff[b * 5 + ADO] + i * a->sq[ADO];
      for (int64_t c = 0; c < a->nv; c++) d += ld(dout, a->dtype[ADO], dd + c * a->sv[ADO]) * ld(o, a->dtype[AO], oo + c * a->sv[AO]);
      D[b * a->nq + i] = d;
    }
  /* round 2: the gradient sums */
  kc = k, vc = v;
  double *G = gr[0];
  for (int j = 0; !rc && j < g.n; j++) {
    ring_at(&g, j);
    for (int64_t b = 0; b < g.nbatch; b++)
      for (int64_t i = 0; i < a->nq; i++) {
        int64_t row = b * a->nq + i;
        if (lse[row] == -INFINITY) continue; /* p = 0 throughout */
        ring_scores(&g, b, i, scale, q, kc);
        int64_t qo = g.boff[b * 5 + AQ] + i * a->sq[AQ], ko = g.boff[b * 5 + AK], vo = g.boff[b * 5 + AV];
        int64_t dd = g.boff[b * 5 + ADO] + i * a->sq[ADO];
        for (int64_t x = 0; x < a->nk; x++) {
          if (g.s[x] == -INFINITY) continue;
          double p = exp(g.s[x] - lse[row]);
          if (which == 2) {
            for (int64_t c = 0; c < a->nv; c++) G[vo + x * a->sk[AV] + c * a->sv[AV]] += p * ld(dout, a->dtype[ADO], dd + c * a->sv[ADO]);
            continue;
          }
          double dp = 0;
          for (int64_t c = 0; c < a->nv; c++)
            dp += ld(dout, a->dtype[ADO], dd + c * a->sv[ADO]) * ld(vc, a->dtype[AV], vo + x * a->sk[AV] + c * a->sv[AV]);
          double ds = scale * p * (dp - D[row]);
          for (int64_t h = 0; h < a->nh; h++) {
            if (which == 0) G[qo + h * a->sh[AQ]] += ds * ld(kc, a->dtype[AK], ko + x * a->sk[AK] + h * a->sh[AK]);
            else G[ko + x * a->sk[AK] + h * a->sh[AK]] += ds * ld(q, a->dtype[AQ], qo + h * a->sh[AQ]);
          }
        }
      }
    if (j < g.n - 1) rc = ring_shift(&g, j, &kc, which != 2 ? &vc : NULL);
    if (!rc && which != 0 && g.n > 1) { /* the block's gradient goes with it (after the last step: home) */
      double *next = G == gr[0] ? gr[1] : gr[0];
      rc = rt_permute_shift(dev, g.axes, g.naxes, RT_F32, G, next, gn * 2, 1);
      G = next;
    }
    if (!rc) rc = rt_check(dev);
  }
  for (int64_t x = 0; !rc && x < gn; x++) st(out, a->dtype[gt], x, G[x]);
  free(lse), free(L), free(D), free(gr[0]);
  rt_free(dev, gr[1]);
  ring_free(&g);
  return rc;
}
