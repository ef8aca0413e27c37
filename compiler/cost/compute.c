/* compute.c: the compute side of the cost model: how long an op runs on one device.
 *
 * In: a Target and what an op does (a contraction's shape, bytes moved, a fused chain's external
 * bytes, a fused attention's shape). Out: seconds, and an OpTime saying what they are made of.
 * Ideal mode is the book's roofline, max(FLOPs / peak, bytes / HBM bandwidth), at peak figures
 * and nothing else. Calibrated mode models what real kernels do, each effect from a target key
 * with a physical reason (docs/cost-model.md, "Compute"; docs/targets.md lists the figures):
 *
 *   matmul_tile        a contraction runs in whole tiles (the MXU's 128x128 or 256x256 weight
 *                      block; a GPU thread block's output tile): dims are padded up to it
 *   matmul_units       GPU output tiles run in waves over the SMs; a last partial wave idles
 *                      the SMs it does not fill
 *   matmul_fill        each tile pays a fill/drain along the dim it streams (a systolic array's
 *                      rows on a TPU, the K loop's prologue and epilogue on a GPU)
 *   matmul_efficiency  the ceiling large matmuls reach (instruction issue, power, clocks)
 *   hbm_efficiency     the fraction of peak HBM bandwidth a streaming kernel achieves
 *   attention_efficiency  the rate of the fused attention kernel's matmuls (softmax in between)
 *   op_overhead        the fixed cost of one kernel (launch and the dependency gap)
 */
#include <math.h>

#include "cost.h"

/* Key/value/query block of flash attention kernels (FlashAttention-2's Br = Bc = 128 on A100 and
 * H100; TPU Pallas kernels use 128 as well): a causal mask skips whole blocks above the diagonal. */
enum { ATTN_BLOCK = 128 };

static double div0(double a, double b) { return b > 0 ? a / b : 0; }
static double at_least1(double x) { return x > 0 ? x : 1; }

/* x rounded up to a multiple of q (q >= 1). */
static double round_up(double x, double q) {
  if (!(q > 1)) return x;
  return ceil(x / q - 1e-9) * q;
}

double cost_matmul_efficiency(const Target *t, MatmulShape s, bool ideal) {
  if (!t) return 0;
  if (ideal) return 1;
  double d[3] = {s.m, s.n, s.k}, b = at_least1(s.batch);
  if (!(d[0] > 0 && d[1] > 0 && d[2] > 0)) return 0;
  double eff = t->matmul_efficiency > 0 ? t->matmul_efficiency : 1;
  double pad[3];
  for (int i = 0; i < 3; i++) {
    pad[i] = round_up(d[i], t->matmul_tile[i]);
    eff *= d[i] / pad[i];
    if (t->matmul_fill[i] > 0) eff *= pad[i] / (pad[i] + t->matmul_fill[i]);
  }
  if (t->matmul_units > 0) {
    double tm = t->matmul_tile[0] > 1 ? t->matmul_tile[0] : 1;
    double tn = t->matmul_tile[1] > 1 ? t->matmul_tile[1] : 1;
    double tiles = b * (pad[0] / tm) * (pad[1] / tn), u = t->matmul_units;
    double waves = ceil(tiles / u - 1e-9);
    if (waves >= 1) eff *= tiles / (waves * u);
  }
  return eff;
}

double cost_matmul_bytes(DType dt, MatmulShape s) {
  int eb = dtype_bytes(dt);
  if (eb <= 0) eb = 2;
  return at_least1(s.batch) * (s.m * s.k + s.k * s.n + s.m * s.n) * eb;
}

double cost_hbm_bandwidth(const Target *t, bool ideal) {
  if (!t) return 0;
  double e = (!ideal && t->hbm_efficiency > 0) ? t->hbm_efficiency : 1;
  return t->hbm_bw * e;
}

/* Fills *out from its parts: time = max(compute, memory) + overhead. */
static double finish(OpTime *c, OpTime *out) {
  c->time_s = (c->compute_s > c->memory_s ? c->compute_s : c->memory_s) + c->overhead_s;
  c->memory_bound = c->memory_s > c->compute_s;
  if (out) *out = *c;
  return c->time_s;
}

static OpTime opcost_zero(void) { return (OpTime){.efficiency = 1}; }

double cost_matmul(const Target *t, DType dt, MatmulShape s, double bytes, bool ideal, OpTime *out) {
  OpTime c = opcost_zero();
  if (!t || !(s.m > 0 && s.n > 0 && s.k > 0)) {
    if (out) *out = c;
    return 0;
  }
  double b = at_least1(s.batch);
  double peak = cost_peak_flops(t, dt, true);
  c.flops = 2 * b * s.m * s.n * s.k;
  c.bytes = bytes > 0 ? bytes : 0;
  c.memory_s = div0(c.bytes, cost_hbm_bandwidth(t, ideal));
  if (ideal) {
    c.exec_flops = c.flops;
    c.compute_s = div0(c.flops, peak);
  } else {
    c.exec_flops = 2 * b * round_up(s.m, t->matmul_tile[0]) * round_up(s.n, t->matmul_tile[1]) *
                   round_up(s.k, t->matmul_tile[2]);
    c.efficiency = cost_matmul_efficiency(t, s, false);
    c.compute_s = div0(c.flops, peak * c.efficiency);
    c.overhead_s = t->op_overhead;
  }
  return finish(&c, out);
}

double cost_memory_op(const Target *t, double bytes, bool ideal, OpTime *out) {
  OpTime c = opcost_zero();
  if (!t) {
    if (out) *out = c;
    return 0;
  }
  c.bytes = bytes > 0 ? bytes : 0;
  c.memory_s = div0(c.bytes, cost_hbm_bandwidth(t, ideal));
  if (!ideal) c.overhead_s = t->op_overhead;
  return finish(&c, out);
}

double cost_fused_chain(const Target *t, double external_bytes, int nops, bool ideal, OpTime *out) {
  OpTime c = opcost_zero();
  if (!t || nops <= 0) {
    if (out) *out = c;
    return 0;
  }
  return cost_memory_op(t, external_bytes, ideal, out);
}

/* The fused attention op as libraries before flash attention ran it (`attention = materialized`):
 * Megatron-LM 2021's batched matmul, fused scale-mask-softmax kernel and second batched matmul; XLA
 * on TPUs before Pallas kernels the same. The scores S = Q K^T go to HBM and come back: forward,
 * S = Q K^T (one batched matmul per head, writing S), a softmax kernel (reads S, writes P), O = P V
 * (reads P); backward, dP = dO V^T (writes dP), the softmax's gradient (reads P and dP, writes dS),
 * dQ = dS K, dK = dS^T Q, dV = P^T dO. Each is a kernel of its own, priced by cost_matmul (its
 * tile, waves and fill) or cost_memory_op; the whole score matrix is computed, the mask applied
 * in the softmax (no blocks skipped). The FLOPs counted are flash attention's (language.md's). */
static double attention_materialized(const Target *t, DType dt, AttentionShape a, bool backward, bool ideal,
                                     OpTime *out) {
  OpTime c = opcost_zero();
  double bh = at_least1(a.batch) * a.heads, bk = at_least1(a.batch) * (a.kv_heads > 0 ? a.kv_heads : a.heads);
  double sq = a.q_len, sk = a.kv_len, d = a.head_dim, dv = a.v_dim > 0 ? a.v_dim : a.head_dim;
  int eb = dtype_bytes(dt);
  if (eb <= 0) eb = 2;
  double q = bh * sq * d * eb, k = bk * sk * d * eb, v = bk * sk * dv * eb, o = bh * sq * dv * eb;
  double sc = bh * sq * sk * eb; /* the score (or probability, or gradient) matrix */
  typedef struct { MatmulShape s; double bytes; } Piece;
  Piece mm[4];
  int nmm = 0;
  double mem[2];
  int nmem = 0;
  if (!backward) {
    mm[nmm++] = (Piece){{sq, sk, d, bh}, q + k + sc};  /* S = Q K^T */
    mem[nmem++] = 2 * sc;                                      /* softmax: S in, P out */
    mm[nmm++] = (Piece){{sq, dv, sk, bh}, sc + v + o}; /* O = P V */
  } else {
    mm[nmm++] = (Piece){{sq, sk, dv, bh}, o + v + sc}; /* dP = dO V^T */
    mem[nmem++] = 3 * sc;                                      /* dS from P and dP */
    mm[nmm++] = (Piece){{sq, d, sk, bh}, sc + k + q};  /* dQ = dS K */
    mm[nmm++] = (Piece){{sk, d, sq, bh}, sc + q + k};  /* dK = dS^T Q */
    mm[nmm++] = (Piece){{sk, dv, sq, bh}, sc + o + v}; /* dV = P^T dO */
  }
  for (int i = 0; i < nmm + nmem; i++) {
    OpTime p;
    if (i < nmm) cost_matmul(t, dt, mm[i].s, mm[i].bytes, ideal, &p);
    else cost_memory_op(t, mem[i - nmm], ideal, &p);
    c.time_s += p.time_s;
    c.compute_s += p.compute_s;
    c.memory_s += p.memory_s;
    c.overhead_s += p.overhead_s;
    c.exec_flops += p.exec_flops;
    c.bytes += p.bytes;
  }
  double fwd = 2 * bh * sq * sk * (d + dv);
  c.flops = backward ? 2 * fwd : fwd;
  double peak = cost_peak_flops(t, dt, true);
  c.efficiency = c.compute_s > 0 && peak > 0 ? c.flops / (c.compute_s * peak) : 1;
  c.memory_bound = c.memory_s > c.compute_s;
  if (out) *out = c;
  return c.time_s;
}

double cost_attention(const Target *t, DType dt, AttentionShape a, bool backward, bool ideal,
                      OpTime *out) {
  if (t && t->attention_materialized && a.heads > 0 && a.q_len > 0 && a.kv_len > 0 && a.head_dim > 0)
    return attention_materialized(t, dt, a, backward, ideal, out);
  OpTime c = opcost_zero();
  double b = at_least1(a.batch), h = a.heads, hk = a.kv_heads > 0 ? a.kv_heads : a.heads;
  double sq = a.q_len, sk = a.kv_len, d = a.head_dim, dv = a.v_dim > 0 ? a.v_dim : a.head_dim;
  if (!t || !(h > 0 && sq > 0 && sk > 0 && d > 0)) {
    if (out) *out = c;
    return 0;
  }
  int eb = dtype_bytes(dt);
  if (eb <= 0) eb = 2;
  double scores = b * h * sq * sk;              /* score elements, never stored */
  double fwd = 2 * scores * d + 2 * scores * dv; /* QK^T and PV */
  double q = b * sq * h * d, k = b * sk * hk * d, v = b * sk * hk * dv, o = b * sq * h * dv;
  double stats = b * h * sq * 4;                /* f32 log-sum-exp per query row */
  if (!backward) {
    c.flops = fwd;
    c.bytes = (q + k + v + o) * eb + stats;
  } else {
    c.flops = 2 * fwd;                          /* dV, dP, dQ, dK */
    c.bytes = (q + k + v + 2 * o) * eb + stats + (q + k + v) * eb; /* q k v o dO, stats; dQ dK dV */
  }
  double peak = cost_peak_flops(t, dt, true);
  if (ideal) {
    c.exec_flops = c.flops;
    c.compute_s = div0(c.flops, peak);
  } else {
    double run = 1;
    if (a.causal) {
      /* Query block i (of nq) sees key blocks up to its diagonal: of nq x nk blocks, those at
       * or left of the diagonal run (with sq == sk: nb (nb + 1) / 2 of nb^2). */
      double nq = ceil(sq / ATTN_BLOCK), nk = ceil(sk / ATTN_BLOCK), ran = 0;
      double ratio = nk / nq; /* key blocks per query block when the lengths differ */
      if (nq <= 4096) {
        for (double i = 0; i < nq; i++) ran += fmin(nk, ceil((i + 1) * ratio - 1e-9));
      } else { /* the same sum in closed form, ceil taken as +1/2 on average */
        ran = ratio * nq * (nq + 1) / 2 + (ratio == floor(ratio) ? 0 : nq / 2);
      }
      run = fmin(1, ran / (nq * nk));
    }
    c.exec_flops = (backward ? c.flops + 2 * scores * d : c.flops) * run;
    double e = t->attention_efficiency > 0 ? t->attention_efficiency
               : (t->matmul_efficiency > 0 ? t->matmul_efficiency : 1);
    c.compute_s = div0(c.exec_flops, peak * e);
    c.efficiency = e; /* of the FLOPs it executes: under a causal mask it executes fewer than counted */
    c.overhead_s = t->op_overhead;
  }
  c.memory_s = div0(c.bytes, cost_hbm_bandwidth(t, ideal));
  return finish(&c, out);
}
