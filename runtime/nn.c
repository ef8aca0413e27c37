/* nn.c: the kernels generated code calls for the ops it does not open-code (shardrt.h: softmax,
 * the norms, cross entropy, take, attention and their gradients). Each walks an index space the
 * caller describes by strides (RtRows, RtAttn), computes in double as the reference interpreter does
 * (docs/interpreter.md), and rounds once when it stores at the tensor's dtype. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "shardrt.h"

#define NN_EPS 1e-5 /* rmsnorm and layernorm (the interpreter's NORM_EPS) */

static double ld(const void *p, int64_t dt, int64_t i) {
  switch (dt) {
  case RT_BF16: return rt_bf16_to_f32(((const uint16_t *)p)[i]);
  case RT_F16: return rt_f16_to_f32(((const uint16_t *)p)[i]);
  case RT_I32: return ((const int32_t *)p)[i];
  default: return ((const float *)p)[i];
  }
}

static void st(void *p, int64_t dt, int64_t i, double v) {
  switch (dt) {
  case RT_BF16: ((uint16_t *)p)[i] = rt_f32_to_bf16((float)v); break;
  case RT_F16: ((uint16_t *)p)[i] = rt_f32_to_f16((float)v); break;
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
                int64_t rtk, int64_t rc, const void *logits, float *out, int64_t out_elems) {
  memset(out, 0, sizeof(float) * (size_t)out_elems);
  int64_t *choice = malloc(sizeof(int64_t) * (size_t)(T * k > 0 ? T * k : 1)), *fill = calloc((size_t)(E > 0 ? E : 1), sizeof(int64_t));
  if (!choice || !fill) {
    free(choice), free(fill);
    return rt_fail(dev, "route: out of host memory");
  }
  Walk w;
  ROWS(r, w) {
    for (int64_t j = 0; j < T; j++)
      for (int q = 0; q < k; q++) {
        int64_t best = -1;
        double bv = 0;
        for (int64_t x = 0; x < E; x++) {
          bool taken = false;
          for (int p = 0; p < q; p++) taken |= choice[j * k + p] == x;
          double v = ld(logits, r->dtype[0], w.off[0] + j * lt + x * le);
          if (isnan(v)) v = -INFINITY;
          if (!taken && (best < 0 || v > bv)) best = x, bv = v;
        }
        choice[j * k + q] = best;
      }
    memset(fill, 0, sizeof(int64_t) * (size_t)E);
    for (int q = 0; q < k; q++)
      for (int64_t j = 0; j < T; j++) {
        int64_t x = choice[j * k + q];
        if (x >= 0 && fill[x] < C) out[w.off[1] + j * rtk + x * re + fill[x]++ * rc] = 1;
      }
  }
  free(choice), free(fill);
  return RT_OK;
}

/* ---- attention ---- */

enum { AQ, AK, AV, AO, ADO };

/* The scores of one query row into s[0..nk): scale q.k, masked; returns their max. */
static double attn_scores(const RtAttn *a, const Walk *w, int64_t i, double scale, int64_t q_off, int64_t k_off,
                          const void *q, const void *k, double *s) {
  double m = -INFINITY;
  for (int64_t j = 0; j < a->nk; j++) {
    if (a->causal && k_off + j > q_off + i) {
      s[j] = -INFINITY;
      continue;
    }
    double d = 0;
    for (int64_t h = 0; h < a->nh; h++)
      d += ld(q, a->dtype[AQ], w->off[AQ] + i * a->sq[AQ] + h * a->sh[AQ]) * ld(k, a->dtype[AK], w->off[AK] + j * a->sk[AK] + h * a->sh[AK]);
    s[j] = scale * d;
    if (s[j] > m) m = s[j];
  }
  return m;
}

/* softmax in place; a row masked everywhere gives zeros */
static void attn_softmax(double *s, int64_t n, double m) {
  double sum = 0;
  for (int64_t j = 0; j < n; j++) sum += s[j] = m == -INFINITY ? 0 : exp(s[j] - m);
  for (int64_t j = 0; j < n && sum > 0; j++) s[j] /= sum;
}

int rt_nn_attention(RtDevice *dev, const RtAttn *a, double scale, int64_t q_off, int64_t k_off, const void *q,
                    const void *k, const void *v, void *o) {
  double *p = malloc(sizeof(double) * (size_t)(a->nk > 0 ? a->nk : 1));
  if (!p) return rt_fail(dev, "attention: out of host memory");
  Walk w;
  for (walk_begin(&w, a->nb, a->extent); !w.done; walk_next(&w, a->nb, a->extent, a->stride))
    for (int64_t i = 0; i < a->nq; i++) {
      attn_softmax(p, a->nk, attn_scores(a, &w, i, scale, q_off, k_off, q, k, p));
      for (int64_t c = 0; c < a->nv; c++) {
        double acc = 0;
        for (int64_t j = 0; j < a->nk; j++) acc += p[j] * ld(v, a->dtype[AV], w.off[AV] + j * a->sk[AV] + c * a->sv[AV]);
        st(o, a->dtype[AO], w.off[AO] + i * a->sq[AO] + c * a->sv[AO], acc);
      }
    }
  free(p);
  return RT_OK;
}

/* Elements of a tensor: the largest offset it is indexed at, plus one. */
static int64_t attn_extent(const RtAttn *a, int t) {
  int64_t e = 0;
  for (int64_t d = 0; d < a->nb; d++) e += (a->extent[d] - 1) * a->stride[t][d];
  e += (a->nq - 1) * a->sq[t] + (a->nk - 1) * a->sk[t] + (a->nh - 1) * a->sh[t] + (a->nv - 1) * a->sv[t];
  return e + 1;
}

int rt_nn_attention_grad(RtDevice *dev, const RtAttn *a, double scale, int64_t q_off, int64_t k_off, const void *q,
                         const void *k, const void *v, const void *o, const void *dout, void *dq, void *dk, void *dv) {
  int64_t nq = attn_extent(a, AQ), nk = attn_extent(a, AK), nv = attn_extent(a, AV);
  double *gq = calloc((size_t)nq, sizeof(double)), *gk = calloc((size_t)nk, sizeof(double)), *gv = calloc((size_t)nv, sizeof(double));
  double *p = malloc(sizeof(double) * (size_t)(a->nk > 0 ? a->nk : 1)), *dp = malloc(sizeof(double) * (size_t)(a->nk > 0 ? a->nk : 1));
  if (!gq || !gk || !gv || !p || !dp) {
    free(gq), free(gk), free(gv), free(p), free(dp);
    return rt_fail(dev, "attention_grad: out of host memory");
  }
  Walk w;
  for (walk_begin(&w, a->nb, a->extent); !w.done; walk_next(&w, a->nb, a->extent, a->stride))
    for (int64_t i = 0; i < a->nq; i++) {
      attn_softmax(p, a->nk, attn_scores(a, &w, i, scale, q_off, k_off, q, k, p));
      double D = 0;
      for (int64_t c = 0; c < a->nv; c++)
        D += ld(dout, a->dtype[ADO], w.off[ADO] + i * a->sq[ADO] + c * a->sv[ADO]) * ld(o, a->dtype[AO], w.off[AO] + i * a->sq[AO] + c * a->sv[AO]);
      for (int64_t j = 0; j < a->nk; j++) {
        double s = 0;
        for (int64_t c = 0; c < a->nv; c++)
          s += ld(dout, a->dtype[ADO], w.off[ADO] + i * a->sq[ADO] + c * a->sv[ADO]) * ld(v, a->dtype[AV], w.off[AV] + j * a->sk[AV] + c * a->sv[AV]);
        dp[j] = p[j] * (s - D); /* ds */
      }
      for (int64_t j = 0; j < a->nk; j++) {
        if (p[j] == 0 && dp[j] == 0) continue;
        for (int64_t h = 0; h < a->nh; h++) {
          gq[w.off[AQ] + i * a->sq[AQ] + h * a->sh[AQ]] += scale * dp[j] * ld(k, a->dtype[AK], w.off[AK] + j * a->sk[AK] + h * a->sh[AK]);
          gk[w.off[AK] + j * a->sk[AK] + h * a->sh[AK]] += scale * dp[j] * ld(q, a->dtype[AQ], w.off[AQ] + i * a->sq[AQ] + h * a->sh[AQ]);
        }
        for (int64_t c = 0; c < a->nv; c++)
          gv[w.off[AV] + j * a->sk[AV] + c * a->sv[AV]] += p[j] * ld(dout, a->dtype[ADO], w.off[ADO] + i * a->sq[ADO] + c * a->sv[ADO]);
      }
    }
  for (int64_t i = 0; dq && i < nq; i++) st(dq, a->dtype[AQ], i, gq[i]);
  for (int64_t i = 0; dk && i < nk; i++) st(dk, a->dtype[AK], i, gk[i]);
  for (int64_t i = 0; dv && i < nv; i++) st(dv, a->dtype[AV], i, gv[i]);
  free(gq), free(gk), free(gv), free(p), free(dp);
  return RT_OK;
}
