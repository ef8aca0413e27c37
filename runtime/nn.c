/* nn.c: the kernels generated code calls for the ops it does not open-code (shardrt.h: softmax,
 * the norms, cross entropy, take, attention and their gradients). Each walks an index space the
 * caller describes by strides (RtRows, RtAttn), computes in double as the reference interpreter does
 * (docs/interpreter.md), and rounds once when it stores at the tensor's dtype. Attention's two
 * contractions (and its backward's four) are f32 GEMMs instead, as a fused attention kernel on a
 * GPU runs them; its softmax and row sums stay in double. */
#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"
#include "shardrt.h"

#define NN_EPS 1e-5 /* rmsnorm and layernorm (the interpreter's NORM_EPS) */

static double ld(const void *p, int64_t dt, int64_t i) {
  switch (dt) {
  case RT_BF16: return rt_bf16_to_f32(((const uint16_t *)p)[i]);
  case RT_F16: return rt_f16_to_f32(((const uint16_t *)p)[i]);
  case RT_F8E4M3: return rt_f8e4m3_to_f32(((const uint8_t *)p)[i]);
  case RT_F8E5M2: return rt_f8e5m2_to_f32(((const uint8_t *)p)[i]);
  case RT_I32: return ((const int32_t *)p)[i];
  default: return ((const float *)p)[i];
  }
}

static void st(void *p, int64_t dt, int64_t i, double v) {
  switch (dt) {
  case RT_BF16: ((uint16_t *)p)[i] = rt_f32_to_bf16((float)v); break;
  case RT_F16: ((uint16_t *)p)[i] = rt_f32_to_f16((float)v); break;
  case RT_F8E4M3: ((uint8_t *)p)[i] = rt_f32_to_f8e4m3((float)v); break;
  case RT_F8E5M2: ((uint8_t *)p)[i] = rt_f32_to_f8e5m2((float)v); break;
  case RT_I32: ((int32_t *)p)[i] = (int32_t)v; break;
  default: ((float *)p)[i] = (float)v; break;
  }
}

/* The outer index space: off[t] for every tensor, advanced odometer-style. */
typedef struct Walk {
  int64_t idx[RT_NN_DIMS];
  int64_t off[RT_NN_TENSORS];
  bool done;
} Walk;

static void walk_begin(Walk *w, int64_t nd, const int64_t *extent) {
  memset(w, 0, sizeof *w);
  for (int64_t d = 0; d < nd; d++)
    if (extent[d] <= 0) w->done = true;
}

static void walk_next(Walk *w, int64_t nd, const int64_t *extent, const int64_t (*stride)[RT_NN_DIMS]) {
  for (int64_t d = nd - 1; d >= 0; d--) {
    for (int t = 0; t < RT_NN_TENSORS; t++) w->off[t] += stride[t][d];
    if (++w->idx[d] < extent[d]) return;
    for (int t = 0; t < RT_NN_TENSORS; t++) w->off[t] -= stride[t][d] * extent[d];
    w->idx[d] = 0;
  }
  w->done = true;
}

#define ROWS(r, w) for (walk_begin(&w, (r)->nd, (r)->extent); !w.done; walk_next(&w, (r)->nd, (r)->extent, (r)->stride))
#define AT(r, t, p, j) ld(p, (r)->dtype[t], w.off[t] + (j) * (r)->row_stride[t])

void rt_nn_softmax(const RtRows *r, const void *x, void *y) {
  Walk w;
  ROWS(r, w) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < r->n; j++) {
      double v = AT(r, 0, x, j);
      if (v > m || isnan(v)) m = isnan(m) ? m : v;
    }
    for (int64_t j = 0; j < r->n; j++) s += exp(AT(r, 0, x, j) - m);
    for (int64_t j = 0; j < r->n; j++)
      st(y, r->dtype[1], w.off[1] + j * r->row_stride[1], m == -INFINITY ? 0 : exp(AT(r, 0, x, j) - m) / s);
  }
}

void rt_nn_norm(const RtRows *r, int layer, const void *x, const void *scale, const void *bias, void *y) {
  Walk w;
  double size = (double)r->size;
  ROWS(r, w) {
    double mu = 0, var = 0;
    if (layer) {
      for (int64_t j = 0; j < r->n; j++) mu += AT(r, 0, x, j);
      mu /= size;
    }
    for (int64_t j = 0; j < r->n; j++) {
      double c = AT(r, 0, x, j) - mu;
      var += c * c;
    }
    double inv = 1 / sqrt(var / size + NN_EPS);
    for (int64_t j = 0; j < r->n; j++) {
      double v = (AT(r, 0, x, j) - mu) * inv * AT(r, 1, scale, j);
      if (bias) v += AT(r, 2, bias, j);
      st(y, r->dtype[3], w.off[3] + j * r->row_stride[3], v);
    }
  }
}

void rt_nn_softmax_grad(const RtRows *r, const void *y, const void *dy, void *dx) {
  Walk w;
  ROWS(r, w) {
    double s = 0;
    for (int64_t j = 0; j < r->n; j++) s += AT(r, 1, dy, j) * AT(r, 0, y, j);
    for (int64_t j = 0; j < r->n; j++) st(dx, r->dtype[2], w.off[2] + j * r->row_stride[2], AT(r, 0, y, j) * (AT(r, 1, dy, j) - s));
  }
}

void rt_nn_norm_grad(const RtRows *r, int layer, const void *x, const void *scale, const void *dy, void *dx) {
  Walk w;
  double size = (double)r->size;
  ROWS(r, w) {
    double mu = 0, var = 0, me = 0, mex = 0;
    if (layer) {
      for (int64_t j = 0; j < r->n; j++) mu += AT(r, 0, x, j);
      mu /= size;
    }
    for (int64_t j = 0; j < r->n; j++) var += (AT(r, 0, x, j) - mu) * (AT(r, 0, x, j) - mu);
    double rs = 1 / sqrt(var / size + NN_EPS);
    for (int64_t j = 0; j < r->n; j++) {
      double e = AT(r, 2, dy, j) * AT(r, 1, scale, j);
      me += e;
      mex += e * (AT(r, 0, x, j) - mu) * rs;
    }
    me /= size, mex /= size;
    for (int64_t j = 0; j < r->n; j++) {
      double e = AT(r, 2, dy, j) * AT(r, 1, scale, j), xh = (AT(r, 0, x, j) - mu) * rs;
      st(dx, r->dtype[3], w.off[3] + j * r->row_stride[3], layer ? rs * (e - me - xh * mex) : rs * (e - xh * mex));
    }
  }
}

int rt_nn_cross_entropy(RtDevice *dev, const RtRows *r, int grad, const void *logits, const int32_t *labels,
                        const void *dl, void *out, int line) {
  Walk w;
  int t_out = grad ? 3 : 2;
  ROWS(r, w) {
    int32_t label = labels[w.off[1]];
    if (label < 0 || label >= r->n)
      return rt_fail(dev, "line %d: cross_entropy: label %d out of range [0, %lld)", line, label, (long long)r->n);
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < r->n; j++) {
      double v = AT(r, 0, logits, j);
      if (v > m || isnan(v)) m = isnan(m) ? m : v;
    }
    for (int64_t j = 0; j < r->n; j++) s += exp(AT(r, 0, logits, j) - m);
    double lse = m + log(s);
    if (!grad) {
      st(out, r->dtype[2], w.off[2], lse - AT(r, 0, logits, label));
      continue;
    }
    double g = ld(dl, r->dtype[2], w.off[2]);
    for (int64_t j = 0; j < r->n; j++)
      st(out, r->dtype[t_out], w.off[t_out] + j * r->row_stride[t_out], (exp(AT(r, 0, logits, j) - lse) - (j == label)) * g);
  }
  return RT_OK;
}

int rt_nn_take(RtDevice *dev, const RtRows *r, const int32_t *idx, const void *table, void *out, int64_t rows_local,
               int64_t row_offset, int64_t rows_global, int64_t row_elems, int line) {
  size_t esz = rt_dtype_size((RtDtype)r->dtype[1]);
  Walk w;
  ROWS(r, w) {
    int32_t v = idx[w.off[0]];
    if (v < 0 || v >= rows_global)
      return rt_fail(dev, "line %d: take: index %d out of range [0, %lld)", line, v, (long long)rows_global);
    int64_t local = v - row_offset;
    char *dst = (char *)out + (size_t)w.off[1] * esz;
    if (local < 0 || local >= rows_local) memset(dst, 0, (size_t)row_elems * esz);
    else memcpy(dst, (const char *)table + (size_t)(local * row_elems) * esz, (size_t)row_elems * esz);
  }
  return RT_OK;
}

int rt_nn_take_grad(RtDevice *dev, const RtRows *r, const int32_t *idx, const void *dy, void *out, int64_t rows_local,
                    int64_t row_offset, int64_t rows_global, int64_t row_elems, int line) {
  size_t n = (size_t)(rows_local * row_elems);
  float *acc = calloc(n ? n : 1, sizeof(float));
  if (!acc) return rt_fail(dev, "line %d: take_grad: out of host memory", line);
  Walk w;
  ROWS(r, w) {
    int32_t v = idx[w.off[0]];
    if (v < 0 || v >= rows_global) {
      free(acc);
      return rt_fail(dev, "line %d: take: index %d out of range [0, %lld)", line, v, (long long)rows_global);
    }
    int64_t local = v - row_offset;
    if (local < 0 || local >= rows_local) continue;
    for (int64_t j = 0; j < row_elems; j++) acc[local * row_elems + j] += (float)ld(dy, r->dtype[1], w.off[1] + j);
  }
  for (size_t i = 0; i < n; i++) st(out, r->dtype[2], (int64_t)i, acc[i]);
  free(acc);
  return RT_OK;
}

int rt_nn_onehot(RtDevice *dev, const RtRows *r, const int32_t *idx, void *out, int64_t row_offset, int line) {
  Walk w;
  ROWS(r, w) {
    int32_t v = idx[w.off[1]];
    if (v < 0 || v >= r->size) return rt_fail(dev, "line %d: onehot: index %d out of range [0, %lld)", line, v, (long long)r->size);
    for (int64_t j = 0; j < r->n; j++) st(out, r->dtype[0], w.off[0] + j * r->row_stride[0], v == row_offset + j ? 1.0 : 0.0);
  }
  return RT_OK;
}

int rt_nn_pick(RtDevice *dev, const RtRows *r, const void *x, const int32_t *idx, void *out, int64_t row_offset, int line) {
  Walk w;
  ROWS(r, w) {
    int32_t v = idx[w.off[1]];
    if (v < 0 || v >= r->size) return rt_fail(dev, "line %d: pick: index %d out of range [0, %lld)", line, v, (long long)r->size);
    int64_t j = v - row_offset;
    st(out, r->dtype[2], w.off[2], j >= 0 && j < r->n ? AT(r, 0, x, j) : 0.0);
  }
  return RT_OK;
}

void rt_nn_max_grad(const RtRows *r, const void *x, const void *y, const void *dy, void *dx) {
  Walk w;
  ROWS(r, w) {
    double m = ld(y, r->dtype[1], w.off[1]), g = ld(dy, r->dtype[2], w.off[2]);
    int64_t ties = 0;
    for (int64_t j = 0; j < r->n; j++) ties += AT(r, 0, x, j) == m;
    for (int64_t j = 0; j < r->n; j++)
      st(dx, r->dtype[3], w.off[3] + j * r->row_stride[3], AT(r, 0, x, j) == m ? g / (double)ties : 0.0);
  }
}

int rt_nn_route(RtDevice *dev, const RtRows *r, int k, int64_t E, int64_t T, int64_t C, int64_t le, int64_t lt, int64_t re,
                int64_t rtk, int64_t rc, const void *logits, float *out, int64_t out_elems, const int64_t *order) {
  memset(out, 0, sizeof(float) * (size_t)out_elems);
  int64_t *choice = malloc(sizeof(int64_t) * (size_t)(T * k > 0 ? T * k : 1)), *fill = calloc((size_t)(E > 0 ? E : 1), sizeof(int64_t));
  double *row = malloc(sizeof(double) * (size_t)(T * E > 0 ? T * E : 1)); /* the group's logits, for route_log.c */
  if (!choice || !fill || !row) {
    free(choice), free(fill), free(row);
    return rt_fail(dev, "route: out of host memory");
  }
  Walk w;
  ROWS(r, w) {
    /* row and choice in the tokens' logical order (token i at storage position order[i]), so that
     * route_log.c compares and follows the same tokens as the one-device run recorded */
    for (int64_t i = 0; i < T; i++)
      for (int64_t x = 0; x < E; x++) {
        double v = ld(logits, r->dtype[0], w.off[0] + (order ? order[i] : i) * lt + x * le);
        row[i * E + x] = isnan(v) ? -INFINITY : v;
      }
    for (int64_t j = 0; j < T; j++)
      for (int q = 0; q < k; q++) {
        int64_t best = -1;
        double bv = 0;
        for (int64_t x = 0; x < E; x++) {
          bool taken = false;
          for (int p = 0; p < q; p++) taken |= choice[j * k + p] == x;
          double v = row[j * E + x];
          if (!taken && (best < 0 || v > bv)) best = x, bv = v;
        }
        choice[j * k + q] = best;
      }
    rtroute_settle(dev, E, T, k, row, choice); /* recorded, or the one-device run's followed */
    memset(fill, 0, sizeof(int64_t) * (size_t)E);
    for (int q = 0; q < k; q++)
      for (int64_t i = 0; i < T; i++) {
        int64_t j = order ? order[i] : i;
        int64_t x = choice[i * k + q];
        if (x >= 0 && fill[x] < C) out[w.off[1] + j * rtk + x * re + fill[x]++ * rc] = 1;
      }
  }
  free(choice), free(fill), free(row);
  return RT_OK;
}

/* ---- attention ---- */

enum { AQ, AK, AV, AO, ADO };

/* Attention runs per position of the batch dims as GEMMs on f32 copies of that position's blocks
 * (OpenBLAS, one thread per device), over tiles of ATTN_TILE query rows so that the scores take
 * ATTN_TILE x nk floats whatever the sequence; the softmax and the sums the interpreter keeps in
 * double stay in double per row. */
#define ATTN_TILE 256

typedef struct AttnBuf {
  float *q, *k, *v, *o, *dout; /* [nq, nh], [nk, nh], [nk, nv], [nq, nv] (the forward's result, the
                                  backward's o), [nq, nv] */
  float *s, *dp;               /* [ATTN_TILE, nk]: scores, then probabilities; dout . v */
  float *tmp;                  /* [max(nq, nk), max(nh, nv)]: a gradient block before it is added */
} AttnBuf;

static void attn_buf_free(AttnBuf *b) {
  free(b->q), free(b->k), free(b->v), free(b->o), free(b->dout), free(b->s), free(b->dp), free(b->tmp);
}

static bool attn_buf_alloc(const RtAttn *a, AttnBuf *b, bool grad) {
  memset(b, 0, sizeof *b);
  int64_t nq = a->nq > 0 ? a->nq : 1, nk = a->nk > 0 ? a->nk : 1, nh = a->nh > 0 ? a->nh : 1, nv = a->nv > 0 ? a->nv : 1;
  int64_t tile = nq < ATTN_TILE ? nq : ATTN_TILE, rows = nq > nk ? nq : nk, cols = nh > nv ? nh : nv;
  b->q = malloc(sizeof(float) * (size_t)(nq * nh));
  b->k = malloc(sizeof(float) * (size_t)(nk * nh));
  b->v = malloc(sizeof(float) * (size_t)(nk * nv));
  b->s = malloc(sizeof(float) * (size_t)(tile * nk));
  b->o = malloc(sizeof(float) * (size_t)(nq * nv));
  bool ok = b->q && b->k && b->v && b->s && b->o;
  if (grad) {
    b->dout = malloc(sizeof(float) * (size_t)(nq * nv));
    b->dp = malloc(sizeof(float) * (size_t)(tile * nk));
    b->tmp = malloc(sizeof(float) * (size_t)(rows * cols));
    ok = ok && b->dout && b->dp && b->tmp;
  }
  if (!ok) attn_buf_free(b);
  return ok;
}

/* rows x cols of tensor t at base (row stride rs, column stride cs) into dst, row-major f32 */
static void attn_gather(float *dst, const void *src, int64_t dt, int64_t base, int64_t rows, int64_t rs, int64_t cols,
                        int64_t cs) {
  for (int64_t i = 0; i < rows; i++)
    for (int64_t c = 0; c < cols; c++) dst[i * cols + c] = (float)ld(src, dt, base + i * rs + c * cs);
}

/* The probabilities of query rows [i0, i0 + n) into b->s ([n, nk]): q.k scaled, masked where a
 * key comes after its query (logical positions k_off + j and q_off + i), softmax in double; a row
 * masked everywhere gives zeros. */
static void attn_probs(const RtAttn *a, AttnBuf *b, double scale, int64_t q_off, int64_t k_off, int64_t i0, int64_t n) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)a->nk, (int)a->nh, (float)scale, b->q + i0 * a->nh,
              (int)a->nh, b->k, (int)a->nh, 0.0f, b->s, (int)a->nk);
  for (int64_t r = 0; r < n; r++) {
    float *s = b->s + r * a->nk;
    int64_t visible = a->causal ? q_off + i0 + r - k_off + 1 : a->nk; /* keys j < visible */
    if (visible > a->nk) visible = a->nk;
    if (visible < 0) visible = 0;
    double m = -INFINITY, sum = 0;
    for (int64_t j = 0; j < visible; j++) m = s[j] > m ? s[j] : m;
    for (int64_t j = 0; j < visible; j++) {
      double e = exp((double)s[j] - m);
      s[j] = (float)e;
      sum += e;
    }
    for (int64_t j = 0; j < visible; j++) s[j] = (float)(s[j] / sum);
    for (int64_t j = visible; j < a->nk; j++) s[j] = 0;
  }
}

int rt_nn_attention(RtDevice *dev, const RtAttn *a, double scale, int64_t q_off, int64_t k_off, const void *q,
                    const void *k, const void *v, void *o) {
  AttnBuf b;
  if (!attn_buf_alloc(a, &b, false)) return rt_fail(dev, "attention: out of host memory");
  Walk w;
  for (walk_begin(&w, a->nb, a->extent); !w.done; walk_next(&w, a->nb, a->extent, a->stride)) {
    attn_gather(b.q, q, a->dtype[AQ], w.off[AQ], a->nq, a->sq[AQ], a->nh, a->sh[AQ]);
    attn_gather(b.k, k, a->dtype[AK], w.off[AK], a->nk, a->sk[AK], a->nh, a->sh[AK]);
    attn_gather(b.v, v, a->dtype[AV], w.off[AV], a->nk, a->sk[AV], a->nv, a->sv[AV]);
    for (int64_t i0 = 0; i0 < a->nq; i0 += ATTN_TILE) {
      int64_t n = a->nq - i0 < ATTN_TILE ? a->nq - i0 : ATTN_TILE;
      attn_probs(a, &b, scale, q_off, k_off, i0, n);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)a->nv, (int)a->nk, 1.0f, b.s, (int)a->nk, b.v,
                  (int)a->nv, 0.0f, b.o + i0 * a->nv, (int)a->nv);
    }
    for (int64_t i = 0; i < a->nq; i++)
      for (int64_t c = 0; c < a->nv; c++) st(o, a->dtype[AO], w.off[AO] + i * a->sq[AO] + c * a->sv[AO], b.o[i * a->nv + c]);
  }
  attn_buf_free(&b);
  return RT_OK;
}

/* Elements of a tensor: the largest offset it is indexed at, plus one. */
static int64_t attn_extent(const RtAttn *a, int t) {
  int64_t e = 0;
  for (int64_t d = 0; d < a->nb; d++) e += (a->extent[d] - 1) * a->stride[t][d];
  e += (a->nq - 1) * a->sq[t] + (a->nk - 1) * a->sk[t] + (a->nh - 1) * a->sh[t] + (a->nv - 1) * a->sv[t];
  return e + 1;
}

/* tmp ([rows, cols] row-major) added into the double gradient g at base (strides rs, cs) */
static void attn_add(double *g, int64_t base, const float *tmp, int64_t rows, int64_t rs, int64_t cols, int64_t cs) {
  for (int64_t i = 0; i < rows; i++)
    for (int64_t c = 0; c < cols; c++) g[base + i * rs + c * cs] += tmp[i * cols + c];
}

int rt_nn_attention_grad(RtDevice *dev, const RtAttn *a, double scale, int64_t q_off, int64_t k_off, const void *q,
                         const void *k, const void *v, const void *o, const void *dout, void *dq, void *dk, void *dv) {
  int64_t nq = attn_extent(a, AQ), nk = attn_extent(a, AK), nv = attn_extent(a, AV);
  double *gq = calloc((size_t)nq, sizeof(double)), *gk = calloc((size_t)nk, sizeof(double)), *gv = calloc((size_t)nv, sizeof(double));
  AttnBuf b;
  bool have = attn_buf_alloc(a, &b, true);
  if (!gq || !gk || !gv || !have) {
    free(gq), free(gk), free(gv);
    if (have) attn_buf_free(&b);
    return rt_fail(dev, "attention_grad: out of host memory");
  }
  int64_t NQ = a->nq, NK = a->nk, NH = a->nh, NV = a->nv;
  Walk w;
  for (walk_begin(&w, a->nb, a->extent); !w.done; walk_next(&w, a->nb, a->extent, a->stride)) {
    attn_gather(b.q, q, a->dtype[AQ], w.off[AQ], NQ, a->sq[AQ], NH, a->sh[AQ]);
    attn_gather(b.k, k, a->dtype[AK], w.off[AK], NK, a->sk[AK], NH, a->sh[AK]);
    attn_gather(b.v, v, a->dtype[AV], w.off[AV], NK, a->sk[AV], NV, a->sv[AV]);
    attn_gather(b.o, o, a->dtype[AO], w.off[AO], NQ, a->sq[AO], NV, a->sv[AO]);
    attn_gather(b.dout, dout, a->dtype[ADO], w.off[ADO], NQ, a->sq[ADO], NV, a->sv[ADO]);
    for (int64_t i0 = 0; i0 < NQ; i0 += ATTN_TILE) {
      int64_t n = NQ - i0 < ATTN_TILE ? NQ - i0 : ATTN_TILE;
      attn_probs(a, &b, scale, q_off, k_off, i0, n); /* b.s: p */
      /* dp = dout . v^T; ds = p (dp - D), D = dout . o per row (in double) */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)NK, (int)NV, 1.0f, b.dout + i0 * NV, (int)NV, b.v,
                  (int)NV, 0.0f, b.dp, (int)NK);
      for (int64_t r = 0; r < n; r++) {
        double D = 0;
        for (int64_t c = 0; c < NV; c++) D += (double)b.dout[(i0 + r) * NV + c] * b.o[(i0 + r) * NV + c];
        for (int64_t j = 0; j < NK; j++) b.dp[r * NK + j] = (float)(b.s[r * NK + j] * ((double)b.dp[r * NK + j] - D));
      }
      /* dq = scale ds . k, dk = scale ds^T . q, dv = p^T . dout */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)NH, (int)NK, (float)scale, b.dp, (int)NK, b.k,
                  (int)NH, 0.0f, b.tmp, (int)NH);
      attn_add(gq, w.off[AQ] + i0 * a->sq[AQ], b.tmp, n, a->sq[AQ], NH, a->sh[AQ]);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)NK, (int)NH, (int)n, (float)scale, b.dp, (int)NK,
                  b.q + i0 * NH, (int)NH, 0.0f, b.tmp, (int)NH);
      attn_add(gk, w.off[AK], b.tmp, NK, a->sk[AK], NH, a->sh[AK]);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)NK, (int)NV, (int)n, 1.0f, b.s, (int)NK,
                  b.dout + i0 * NV, (int)NV, 0.0f, b.tmp, (int)NV);
      attn_add(gv, w.off[AV], b.tmp, NK, a->sk[AV], NV, a->sv[AV]);
    }
  }
  for (int64_t i = 0; dq && i < nq; i++) st(dq, a->dtype[AQ], i, gq[i]);
  for (int64_t i = 0; dk && i < nk; i++) st(dk, a->dtype[AK], i, gk[i]);
  for (int64_t i = 0; dv && i < nv; i++) st(dv, a->dtype[AV], i, gv[i]);
  free(gq), free(gk), free(gv);
  attn_buf_free(&b);
  return RT_OK;
}
