/* plan_estimate.c: `shardc plan`'s closed-form estimate of a candidate (see plan_estimate.h). */
#include <math.h>

#include "plan_estimate.h"

enum { AX_STAGE, AX_DATA, AX_FSDP, AX_EP, AX_CTX, AX_MODEL }; /* plan_axis_names' order */

static double pos(double x, double fallback) { return x > 0 ? x : fallback; }

/* Bytes/s one device moves in a collective over axis k (and the axes inside it that the same
 * collective spans, `inner_too`): NVLink where the groups stay inside a node, else the network. */
static double axis_bw(const PlanModel *m, const PlanCand *c, int k) {
  const Target *T = m->target;
  if (T->kind != TARGET_GPU) return 2 * pos(T->ici_bw, 1e11) * pos(T->coll_eff_max, 0.8);
  int64_t span = c->size[k];
  for (int j = k + 1; j < PLAN_AXES; j++) span *= c->size[j];
  int node = T->node_size > 0 ? T->node_size : 8;
  if (span <= node) return pos(T->nvlink_bw, 3e11) * pos(T->coll_eff_max, 0.8);
  return pos(T->network_bw, 2.5e10) * pos(T->net_eff_max, pos(T->coll_eff_max, 0.8));
}

/* Time of an AllReduce of `bytes` per device over a group of n at bandwidth bw (ring). */
static double all_reduce(double bytes, int64_t n, double bw) { return n > 1 ? 2.0 * (double)(n - 1) / (double)n * bytes / bw : 0; }
/* An AllGather or a ReduceScatter whose whole (unsharded) side is `bytes`. */
static double gather(double bytes, int64_t n, double bw) { return n > 1 ? (double)(n - 1) / (double)n * bytes / bw : 0; }

void plan_estimate(const PlanModel *m, PlanCand *c) {
  const Target *T = m->target;
  const int *z = c->size;
  int64_t p = z[AX_STAGE], t = z[AX_MODEL], cx = z[AX_CTX], e = z[AX_EP];
  int64_t rows_axes = (int64_t)z[AX_DATA] * z[AX_FSDP] * e; /* what the batch splits over */
  int64_t mb = c->microbatches > 1 ? c->microbatches : 1;
  int V = c->interleave > 1 ? c->interleave : 1;
  double N = (double)m->devices;
  double E = (double)pos((double)m->embed, 1), F = (double)pos((double)m->hidden, 4 * E);
  double L = (double)pos((double)m->layers, 1), Lp = L / (double)p;
  double tokens = (double)pos((double)m->batch, 1) * (double)pos((double)m->seq, 1);
  double tok_dev = tokens / (double)(rows_axes * cx); /* a device's tokens a step (TP replicates them) */

  /* compute */
  double peak = T->flops[DT_BF16];
  for (int d = 0; d < DT__COUNT; d++)
    if (!(peak > 0)) peak = T->flops[d];
  double eff = pos(T->matmul_efficiency, 0.8);
  static const double recompute[] = {1.0, 4.0 / 3.0, 1.15, 1.03}; /* none, full, dots, selective */
  double compute = m->model_flops * recompute[c->remat & 3] / (N * pos(peak, 1e14) * eff);
  /* small GEMMs run below the large ones' efficiency: a factor d / (d + ROWS0) for the rows a
   * microbatch gives a device and for the MLP's and the embedding's width a device holds; the
   * elementwise work (about 8% of a step) is replicated over `model` without sequence parallelism */
  const double ROWS0 = 600;
  double rows = tok_dev / (double)mb, width = F / (double)t, emb = E;
  compute /= rows / (rows + ROWS0) * width / (width + ROWS0) * emb / (emb + ROWS0);
  if (t > 1 && !c->sp) compute *= 1 + 0.08 * (double)(t - 1);

  /* tensor parallelism: 2 AllReduces a layer forward, 2 backward (SP: ReduceScatter + AllGather,
   * the same bytes), 2 more when full remat recomputes the forward */
  double tp = 0;
  if (t > 1) {
    double n = c->remat == 1 ? 6 : 4;
    tp = Lp * n * all_reduce(tok_dev * E * 2, t, axis_bw(m, c, AX_MODEL));
    tp *= c->tp_off ? 1.0 : 0.25;
  }

  /* the pipeline's bubble: (p - 1) / (m V) of the busy time */
  double busy = compute + tp;
  double bubble = p > 1 ? busy * (double)(p - 1) / (double)mb * (1.0 / V + (1.0 - 1.0 / V) * 0.5) : 0;

  /* gradients and parameters: per device, the params its stage and model shard hold */
  double grad_bytes = m->state_bytes / 2 / (double)(p * t * (e > 1 ? e : 1));
  double dp = 0, window = 0;
  if (c->fsdp) {
    int ax = z[AX_FSDP] > 1 ? AX_FSDP : AX_DATA;
    int64_t f = z[ax];
    double g = gather(grad_bytes, f, axis_bw(m, c, ax));
    double gathers = 2 + (c->remat == 1 ? 1 : 0); /* the simulator gathers once a step, not a microbatch */
    dp = g * (gathers + 1);
    if (ax == AX_FSDP && z[AX_DATA] > 1) dp += all_reduce(grad_bytes / (double)f, z[AX_DATA], axis_bw(m, c, AX_DATA));
    window = busy;
  } else if (rows_axes > 1) {
    int ax = z[AX_DATA] > 1 ? AX_DATA : AX_EP;
    dp = all_reduce(grad_bytes, rows_axes, axis_bw(m, c, ax));
    window = busy / (double)mb * 2.0 / 3.0; /* the last microbatch's backward */
  }
  double dp_exposed = fmax(dp / Lp, dp - window);

  /* context parallelism: K and V around the ring, forward and twice backward, mostly hidden */
  double cp = 0;
  if (cx > 1) {
    double kv = m->heads > 0 && m->kv_heads > 0 ? E * (double)m->kv_heads / (double)m->heads : E;
    cp = 0.2 * Lp * 3 * (double)(cx - 1) * (2 * tok_dev * kv * 2 / (double)t) / axis_bw(m, c, AX_CTX);
  }
  /* expert parallelism: dispatch and combine forward and backward, two slots a token */
  double ep = 0;
  if (e > 1) ep = Lp * 4 * gather(2 * tok_dev * E * 2 / (double)t, e, axis_bw(m, c, AX_EP));

  c->estimate_s = compute + tp + bubble + dp_exposed + cp + ep;

  /* memory: resident state over its sharding, activations in flight */
  int64_t fs = z[AX_FSDP] > 1 ? z[AX_FSDP] : z[AX_DATA];
  double deg = (double)(t * p * e * (c->fsdp ? fs : 1));
  double opt_deg = c->fsdp ? deg : deg * (c->zero ? (double)z[AX_DATA] : 1);
  double state = m->state_bytes / deg + m->opt_bytes / opt_deg;
  double sp = c->sp ? (double)t : 1;
  double per_tok_layer = 2 * (6 * E / sp + 3 * F / (double)t); /* bf16: qkv, out, norms, residuals; the MLP */
  static const double kept[] = {1.0, 0.0, 0.6, 0.9};
  double tok_mb = tok_dev / (double)mb;
  double inflight = p > 1 ? (double)p * (1 + (double)(p - 1) / (double)(p * V)) : 1;
  if (inflight > (double)mb * V && p > 1) inflight = (double)mb * V;
  double act = tok_mb * inflight * Lp * per_tok_layer * kept[c->remat & 3];
  if (c->remat == 1) act += tok_mb * inflight * Lp * 2 * E / sp + tok_mb * per_tok_layer;
  double logits = m->vocab > 0 ? tok_mb * (double)m->vocab / (double)t * 4 * 2 : 0;
  c->estimate_memory = state + act + logits;
  c->estimate_fits = c->estimate_memory <= T->hbm;
}
