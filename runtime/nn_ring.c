/* nn_ring.c: ring attention (context parallelism; shardrt.h's rt_nn_ring_attention and its
 * gradient). The key dim of k and v is split over a ring of devices; each device keeps its query
 * block and the K/V blocks come round by rt_permute_shift(+1), the block of rank r - j at hand at
 * step j, as the reference interpreter's spmd_ring / iop_ring_attention define it
 * (docs/interpreter.md, Ring attention). The products are f32 GEMMs (as nn.c's attention), the
 * softmax statistics and the sums in double, rounded once on store; the index space is nn.c's
 * RtAttn (batch dims, query, key, head and value dims). */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "rt_internal.h"

enum { AQ, AK, AV, AO, ADO };

/* as nn.c's: an element at dtype dt as a double, and stored rounded to dt */
static double ld(const void *p, int64_t dt, int64_t i) {
  switch (dt) {
  case RT_BF16: return rt_bf16_to_f32(((const uint16_t *)p)[i]);
  case RT_F16: return rt_f16_to_f32(((const uint16_t *)p)[i]);
  case RT_F8E4M3: return rt_f8e4m3_to_f32(((const uint8_t *)p)[i]);
  case RT_F8E5M2: return rt_f8e5m2_to_f32(((const uint8_t *)p)[i]);
  default: return ((const float *)p)[i];
  }
}

static void st(void *p, int64_t dt, int64_t i, double v) {
  switch (dt) {
  case RT_BF16: ((uint16_t *)p)[i] = rt_f32_to_bf16((float)v); break;
  case RT_F16: ((uint16_t *)p)[i] = rt_f32_to_f16((float)v); break;
  case RT_F8E4M3: ((uint8_t *)p)[i] = rt_f32_to_f8e4m3((float)v); break;
  case RT_F8E5M2: ((uint8_t *)p)[i] = rt_f32_to_f8e5m2((float)v); break;
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

/* Per position of the batch dims, the blocks at hand are copied to f32 and multiplied as GEMMs
 * (OpenBLAS, one thread per device), over tiles of RING_TILE query rows, as nn.c's attention does;
 * the online softmax, the logsumexp and the gradient sums stay in double. */
#define RING_TILE 256

/* One device's ring: its group, rank and size, the buffers the blocks travel in, per batch index
 * each tensor's offset, the logical positions of its query rows and of the keys at hand, the f32
 * copies of one batch position's blocks. */
typedef struct Ring {
  RtDevice *dev;
  const RtAttn *a;
  const RtRing *R;
  RtGroup grp;          /* the device's ring: its group of R->groups */
  int n, rank;
  bool joint;           /* K and V travel together, one permute a step (the same dtype) */
  int64_t nbatch;
  int64_t *boff;        /* [nbatch][5] */
  int64_t *qpos;        /* [nq]: logical query positions */
  int64_t *kpos;        /* [nk]: logical key positions of the block at hand */
  float *q, *k, *v, *dout; /* [nq, nh], [nk, nh], [nk, nv], [nq, nv] of one batch position */
  float *s, *dp;        /* [tile, nk]: scores, then (unnormalised) probabilities; dout . v */
  float *tmp;           /* [max(tile, nk), max(nh, nv)]: a product before it is added */
  int64_t tile;
  void *kb[2], *vb[2];  /* the travelling K and V blocks (rt_alloc'd; joint: kb[i] holds K, then V) */
  int64_t kn, vn;       /* their elements */
} Ring;

static void ring_free(Ring *g) {
  free(g->boff), free(g->qpos), free(g->kpos);
  free(g->q), free(g->k), free(g->v), free(g->dout), free(g->s), free(g->dp), free(g->tmp);
  for (int i = 0; i < 2; i++) rt_free(g->dev, g->kb[i]), rt_free(g->dev, g->joint ? NULL : g->vb[i]);
}

static int ring_open(Ring *g, RtDevice *dev, const RtAttn *a, const RtRing *R, int64_t q_off, bool need_v) {
  memset(g, 0, sizeof *g);
  g->dev = dev, g->a = a, g->R = R;
  int rc0 = rtgroup_lookup(dev, R->groups, "ring attention", &g->grp);
  if (rc0) return rc0;
  g->n = g->grp.size, g->rank = g->grp.rank;
  g->joint = need_v && a->dtype[AK] == a->dtype[AV];
  g->nbatch = 1;
  for (int64_t d = 0; d < a->nb; d++) g->nbatch *= a->extent[d];
  int64_t nq = a->nq > 0 ? a->nq : 1, nk = a->nk > 0 ? a->nk : 1, nh = a->nh > 0 ? a->nh : 1, nv = a->nv > 0 ? a->nv : 1;
  g->tile = nq < RING_TILE ? nq : RING_TILE;
  int64_t rows = g->tile > nk ? g->tile : nk, cols = nh > nv ? nh : nv;
  g->boff = calloc((size_t)(g->nbatch > 0 ? g->nbatch : 1) * 5, sizeof(int64_t));
  g->qpos = malloc(sizeof(int64_t) * (size_t)nq);
  g->kpos = malloc(sizeof(int64_t) * (size_t)nk);
  g->q = malloc(sizeof(float) * (size_t)(nq * nh));
  g->k = malloc(sizeof(float) * (size_t)(nk * nh));
  g->v = malloc(sizeof(float) * (size_t)(nk * nv));
  g->dout = malloc(sizeof(float) * (size_t)(nq * nv));
  g->s = malloc(sizeof(float) * (size_t)(g->tile * nk));
  g->dp = malloc(sizeof(float) * (size_t)(g->tile * nk));
  g->tmp = malloc(sizeof(float) * (size_t)(rows * cols));
  if (!g->boff || !g->qpos || !g->kpos || !g->q || !g->k || !g->v || !g->dout || !g->s || !g->dp || !g->tmp)
    return rt_fail(dev, "ring attention: out of host memory");
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
  for (int64_t i = 0; i < a->nq; i++) g->qpos[i] = rt_order_logical(&R->qorder, q_off + i);
  g->kn = extent_of(a, AK), g->vn = extent_of(a, AV);
  size_t kbytes = (size_t)g->kn * rt_dtype_size((RtDtype)a->dtype[AK]), vbytes = (size_t)g->vn * rt_dtype_size((RtDtype)a->dtype[AV]);
  for (int i = 0; g->n > 1 && i < 2; i++) {
    int rc = rt_alloc(dev, g->joint ? kbytes + vbytes : kbytes, g->joint ? "ring attention K and V block" : "ring attention K block", &g->kb[i]);
    if (!rc && need_v && !g->joint) rc = rt_alloc(dev, vbytes, "ring attention V block", &g->vb[i]);
    if (!rc && g->joint) g->vb[i] = (char *)g->kb[i] + kbytes;
    if (rc) return rc;
  }
  return RT_OK;
}

/* The block at hand at step j: rank r - j's; its keys' logical positions. */
static void ring_at(Ring *g, int j) {
  int64_t src = ((g->rank - j) % g->n + g->n) % g->n;
  for (int64_t x = 0; x < g->a->nk; x++) g->kpos[x] = rt_order_logical(&g->R->korder, src * g->a->nk + x);
}

/* Passes the block at hand (*k, *v) on and takes the next: +1 round the ring, into the spare
 * buffer (step j writes buffer j % 2; the device's own block is read, never written). K and V of
 * one dtype go as one permute (the step `explain` counts): the own block is first copied into the
 * other spare buffer, which the next step's block then replaces. */
static int ring_shift(Ring *g, int j, const void **k, const void **v) {
  const RtAttn *a = g->a;
  int rc;
  if (v && g->joint) {
    size_t kbytes = (size_t)g->kn * rt_dtype_size((RtDtype)a->dtype[AK]), vbytes = (size_t)g->vn * rt_dtype_size((RtDtype)a->dtype[AV]);
    void *from = g->kb[(j + 1) % 2];
    if (*k != from) { /* the own block (step 0): into the spare buffer, K then V */
      memcpy(from, *k, kbytes);
      memcpy((char *)from + kbytes, *v, vbytes);
    }
    rc = rt_permute_shift(g->dev, g->R->groups, (RtDtype)a->dtype[AK], from, g->kb[j % 2], g->kn + g->vn, 1);
  } else {
    rc = rt_permute_shift(g->dev, g->R->groups, (RtDtype)a->dtype[AK], *k, g->kb[j % 2], g->kn, 1);
    if (!rc && v) rc = rt_permute_shift(g->dev, g->R->groups, (RtDtype)a->dtype[AV], *v, g->vb[j % 2], g->vn, 1);
  }
  if (rc) return rc;
  *k = g->kb[j % 2];
  if (v) *v = g->vb[j % 2];
  return RT_OK;
}

/* rows x cols of tensor t at base (row stride rs, column stride cs) into dst, row-major f32 */
static void gather(float *dst, const void *src, int64_t dt, int64_t base, int64_t rows, int64_t rs, int64_t cols, int64_t cs) {
  for (int64_t i = 0; i < rows; i++)
    for (int64_t c = 0; c < cols; c++) dst[i * cols + c] = (float)ld(src, dt, base + i * rs + c * cs);
}

/* tmp ([rows, cols] row-major) added into the double array g at base (strides rs, cs) */
static void add_into(double *g, int64_t base, const float *tmp, int64_t rows, int64_t rs, int64_t cols, int64_t cs) {
  for (int64_t i = 0; i < rows; i++)
    for (int64_t c = 0; c < cols; c++) g[base + i * rs + c * cs] += tmp[i * cols + c];
}

/* Batch position b's q (and do) rows and the block at hand's k (and v) into the f32 copies. */
static void ring_gather(Ring *g, int64_t b, const void *q, const void *k, const void *v, const void *dout) {
  const RtAttn *a = g->a;
  const int64_t *o = g->boff + b * 5;
  gather(g->q, q, a->dtype[AQ], o[AQ], a->nq, a->sq[AQ], a->nh, a->sh[AQ]);
  gather(g->k, k, a->dtype[AK], o[AK], a->nk, a->sk[AK], a->nh, a->sh[AK]);
  if (v) gather(g->v, v, a->dtype[AV], o[AV], a->nk, a->sk[AV], a->nv, a->sv[AV]);
  if (dout) gather(g->dout, dout, a->dtype[ADO], o[ADO], a->nq, a->sq[ADO], a->nv, a->sv[ADO]);
}

/* The scores of query rows [i0, i0 + n) against the block at hand into g->s: scale q.k, -inf
 * where the key's logical position exceeds the query's. */
static void ring_scores(Ring *g, double scale, int64_t i0, int64_t n) {
  const RtAttn *a = g->a;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)a->nk, (int)a->nh, (float)scale, g->q + i0 * a->nh,
              (int)a->nh, g->k, (int)a->nh, 0.0f, g->s, (int)a->nk);
  if (!a->causal) return;
  for (int64_t r = 0; r < n; r++)
    for (int64_t x = 0; x < a->nk; x++)
      if (g->kpos[x] > g->qpos[i0 + r]) g->s[r * a->nk + x] = -INFINITY;
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
    for (int64_t b = 0; b < g.nbatch; b++) {
      ring_gather(&g, b, q, kc, vc, NULL);
      for (int64_t i0 = 0; i0 < a->nq; i0 += g.tile) {
        int64_t n = a->nq - i0 < g.tile ? a->nq - i0 : g.tile;
        ring_scores(&g, scale, i0, n);
        double al[RING_TILE];
        for (int64_t r = 0; r < n; r++) {
          int64_t row = b * a->nq + i0 + r;
          float *s = g.s + r * a->nk;
          double m = M[row], mn = m, sum = 0;
          for (int64_t x = 0; x < a->nk; x++) mn = s[x] > mn ? s[x] : mn;
          al[r] = mn == -INFINITY ? 1 : exp(m - mn);
          for (int64_t x = 0; x < a->nk; x++) {
            double e = mn == -INFINITY || s[x] == -INFINITY ? 0 : exp((double)s[x] - mn);
            s[x] = (float)e;
            sum += e;
          }
          M[row] = mn;
          L[row] = L[row] * al[r] + sum;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)a->nv, (int)a->nk, 1.0f, g.s, (int)a->nk, g.v,
                    (int)a->nv, 0.0f, g.tmp, (int)a->nv);
        for (int64_t r = 0; r < n; r++) {
          double *ac = acc + (b * a->nq + i0 + r) * a->nv;
          for (int64_t c = 0; c < a->nv; c++) ac[c] = ac[c] * al[r] + g.tmp[r * a->nv + c];
        }
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
  int64_t rows = g.nbatch * a->nq, NK = a->nk, NH = a->nh, NV = a->nv;
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
    for (int64_t b = 0; b < g.nbatch; b++) {
      ring_gather(&g, b, q, kc, NULL, NULL);
      for (int64_t i0 = 0; i0 < a->nq; i0 += g.tile) {
        int64_t n = a->nq - i0 < g.tile ? a->nq - i0 : g.tile;
        ring_scores(&g, scale, i0, n);
        for (int64_t r = 0; r < n; r++) {
          int64_t row = b * a->nq + i0 + r;
          const float *s = g.s + r * NK;
          double m = lse[row], mn = m, sum = 0;
          for (int64_t x = 0; x < NK; x++) mn = s[x] > mn ? s[x] : mn;
          for (int64_t x = 0; x < NK; x++) sum += mn == -INFINITY || s[x] == -INFINITY ? 0 : exp((double)s[x] - mn);
          L[row] = L[row] * (mn == -INFINITY ? 1 : exp(m - mn)) + sum;
          lse[row] = mn;
        }
      }
    }
    if (j < g.n - 1) rc = ring_shift(&g, j, &kc, NULL);
  }
  for (int64_t x = 0; !rc && x < rows; x++) lse[x] = L[x] > 0 ? lse[x] + log(L[x]) : -INFINITY;
  for (int64_t b = 0; !rc && b < g.nbatch; b++)
    for (int64_t i = 0; i < a->nq; i++) {
      double d = 0;
      int64_t oo = g.boff[b * 5 + AO] + i * a->sq[AO], dd = g.boff[b * 5 + ADO] + i * a->sq[ADO];
      for (int64_t c = 0; c < NV; c++) d += ld(dout, a->dtype[ADO], dd + c * a->sv[ADO]) * ld(o, a->dtype[AO], oo + c * a->sv[AO]);
      D[b * a->nq + i] = d;
    }
  /* round 2: the gradient sums */
  kc = k, vc = v;
  double *G = gr[0];
  for (int j = 0; !rc && j < g.n; j++) {
    ring_at(&g, j);
    for (int64_t b = 0; b < g.nbatch; b++) {
      ring_gather(&g, b, q, kc, which != 2 ? vc : NULL, dout);
      const int64_t *bo = g.boff + b * 5;
      for (int64_t i0 = 0; i0 < a->nq; i0 += g.tile) {
        int64_t n = a->nq - i0 < g.tile ? a->nq - i0 : g.tile;
        ring_scores(&g, scale, i0, n);
        for (int64_t r = 0; r < n; r++) { /* p = e^(s - lse) */
          double l = lse[b * a->nq + i0 + r];
          float *s = g.s + r * NK;
          for (int64_t x = 0; x < NK; x++) s[x] = l == -INFINITY || s[x] == -INFINITY ? 0 : (float)exp((double)s[x] - l);
        }
        if (which == 2) { /* dv += p^T do */
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)NK, (int)NV, (int)n, 1.0f, g.s, (int)NK,
                      g.dout + i0 * NV, (int)NV, 0.0f, g.tmp, (int)NV);
          add_into(G, bo[AV], g.tmp, NK, a->sk[AV], NV, a->sv[AV]);
          continue;
        }
        /* ds = p (do . v^T - D) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)NK, (int)NV, 1.0f, g.dout + i0 * NV, (int)NV, g.v,
                    (int)NV, 0.0f, g.dp, (int)NK);
        for (int64_t r = 0; r < n; r++) {
          double Dr = D[b * a->nq + i0 + r];
          for (int64_t x = 0; x < NK; x++) g.dp[r * NK + x] = (float)(g.s[r * NK + x] * ((double)g.dp[r * NK + x] - Dr));
        }
        if (which == 0) { /* dq += scale ds k */
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)NH, (int)NK, (float)scale, g.dp, (int)NK, g.k,
                      (int)NH, 0.0f, g.tmp, (int)NH);
          add_into(G, bo[AQ] + i0 * a->sq[AQ], g.tmp, n, a->sq[AQ], NH, a->sh[AQ]);
        } else { /* dk += scale ds^T q */
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)NK, (int)NH, (int)n, (float)scale, g.dp, (int)NK,
                      g.q + i0 * NH, (int)NH, 0.0f, g.tmp, (int)NH);
          add_into(G, bo[AK], g.tmp, NK, a->sk[AK], NH, a->sh[AK]);
        }
      }
    }
    if (j < g.n - 1) rc = ring_shift(&g, j, &kc, which != 2 ? &vc : NULL);
    if (!rc && which != 0 && g.n > 1) { /* the block's gradient goes with it (after the last step: home) */
      double *next = G == gr[0] ? gr[1] : gr[0];
      rc = rt_permute_shift(dev, R->groups, RT_F32, G, next, gn * 2, 1);
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
