/* cost.c: the cost model: collective times on a mesh, op rooflines, compute/comm thresholds.
 *
 * In: a Mesh whose axes mesh.c has placed on the hardware (link class, wraparound, torus dims,
 * nodes), sizes in bytes and FLOPs. Out: seconds (and CollCost's breakdown for explain). The
 * formulas are those of hardware-and-costs.md, i.e. of "How to Scale Your Model"; in ideal mode
 * they are the book's arithmetic exactly. docs/cost-model.md derives each one.
 *
 * A collective is evaluated as a sum of phases. Ideal: each phase costs max(latency, bandwidth
 * term) (the book's T = max(T_hop x hops, V / W)), except a permute, which is one hop: bytes / W +
 * T_hop. Calibrated: latency + bandwidth / efficiency (the alpha-beta model: a ring step cannot
 * forward what has not arrived), the efficiency a function of the phase's array and link class.
 *   TPU: the ICI axes of the group form one phase (their links work at once, so their bandwidths
 *        add); DCN axes form a second, slower phase, normally run on the smallest array
 *        (hierarchical: ReduceScatter over ICI, DCN on the 1/n_ici shard, AllGather over ICI).
 *   GPU: the group's devices sit p per NVLink domain across M nodes; hierarchically, a
 *        ReduceScatter within the node, the network stage on the 1/p shard (one ring per local
 *        rank, p NICs per node), an AllGather within the node. The stages pipeline, so the
 *        bandwidth term is the slower of the two (the book's max over levels). Calibrated, the
 *        network stage runs at network_efficiency of its own (smaller) array, an AllReduce across
 *        nodes takes the cheaper of ring and tree latency (2(M-1) or 2 ceil(log2 M) steps), and
 *        a group that spans more than a full-bisection fabric domain may be slowed by the
 *        oversubscribed tier above it (fabric_factor).
 */
#include <math.h>
#include <string.h>

#include "cost.h"

/* ---- names ---- */

static const char *const coll_names[] = {
#define X(e, s) [e] = s,
  COLL_KINDS(X)
#undef X
};

const char *coll_kind_name(CollKind k) {
  if ((int)k < 0 || k >= COLL__COUNT) return "?";
  return coll_names[k];
}

bool coll_kind_from_name(const char *s, CollKind *out) {
  if (!s) return false;
  for (int k = 0; k < COLL__COUNT; k++)
    if (strcmp(s, coll_names[k]) == 0) {
      if (out) *out = (CollKind)k;
      return true;
    }
  return false;
}

const char *cost_link_name(LinkKind k) {
  switch (k) {
  case LINK_ICI: return "ICI";
  case LINK_DCN: return "DCN";
  case LINK_NVLINK: return "NVLink";
  case LINK_NETWORK: return "network";
  }
  return "?";
}

/* ---- small helpers ---- */

/* a / b, where an unknown (zero) bandwidth or rate makes the term vanish rather than divide by
 * zero: sema checks targets, and a link the target leaves undeclared costs only its latency. */
static double div0(double a, double b) { return b > 0 ? a / b : 0; }

/* Calibrated collective efficiency: achieved / peak = max x V^k / (V^k + half_bytes^k), V the
 * array of the phase (the "size" column of nccl-tests), k the curve's shape (1 where the target
 * declares none: the affine alpha-beta time), but never below `small`, what a low-latency
 * protocol reaches on messages too small to fill the bandwidth protocol's pipeline (NCCL's LL:
 * flag words beside data words, no chunk pipeline to ramp up). A collective library picks the
 * faster protocol per size; the faster one is the higher efficiency. A target that declares none
 * runs at peak. docs/targets.md gives the fits to nccl-tests' curves. */
static double eff_curve(double mx, double half, double small, double shape, double v) {
  if (!(mx > 0)) mx = 1;
  if (!(half > 0)) half = 0;
  double e;
  if (!(v > 0)) e = mx;
  else if (!(shape > 0) || shape == 1) e = mx * v / (v + half);
  else e = mx / (1 + pow(half / v, shape));
  return small > e ? small : e;
}

/* ICI and NVLink phases: collective_efficiency. */
static double coll_efficiency(const Target *t, double v, bool ideal) {
  if (ideal) return 1;
  return eff_curve(t->coll_eff_max, t->coll_eff_half_bytes, t->coll_eff_small, t->coll_eff_shape, v);
}

/* An AllReduce's NVLink phases: all_reduce_efficiency where the target declares it (NVLS),
 * else collective_efficiency. */
static double ar_efficiency(const Target *t, double v, bool ideal) {
  if (ideal) return 1;
  if (t->ar_eff_max > 0) return eff_curve(t->ar_eff_max, t->ar_eff_half_bytes, t->ar_eff_small, t->ar_eff_shape, v);
  return coll_efficiency(t, v, ideal);
}

/* DCN and GPU network phases: network_efficiency, or collective_efficiency where the target
 * declares none. */
static double net_efficiency(const Target *t, double v, bool ideal) {
  if (ideal) return 1;
  if (t->net_eff_max > 0) return eff_curve(t->net_eff_max, t->net_eff_half_bytes, t->net_eff_small, t->net_eff_shape, v);
  return coll_efficiency(t, v, ideal);
}

/* The axis's peak one-way bandwidth of one link, or the target's figure when mesh.c left 0. */
static double axis_bw(const Target *t, const MeshAxis *a) {
  if (a->bw > 0) return a->bw;
  switch (a->link) {
  case LINK_ICI: return t->ici_bw;
  case LINK_DCN: return t->dcn_bw;
  case LINK_NVLINK: return t->nvlink_bw;
  case LINK_NETWORK: return t->network_bw;
  }
  return 0;
}

/* Seconds per hop (TPU) or per message step (GPU); the target's figure when mesh.c left 0. The
 * targets declare no DCN latency, so a DCN axis without one falls back to the ICI hop latency. */
static double axis_latency(const Target *t, const MeshAxis *a) {
  if (a->latency > 0) return a->latency;
  switch (a->link) {
  case LINK_ICI:
  case LINK_DCN: return t->hop_latency;
  case LINK_NVLINK: return t->nvlink_latency;
  case LINK_NETWORK: return t->network_latency;
  }
  return 0;
}

/* ---- the group and the sum of phases ---- */

typedef struct Group {
  const Target *t;
  const MeshAxis *ax[MAX_MESH_AXES]; /* the axes of the mask with size > 1, major to minor */
  int nax;
  double n;                          /* devices in the group */
} Group;

static void group_init(Group *g, const Mesh *m, uint16_t mask) {
  memset(g, 0, sizeof *g);
  g->t = m->target;
  g->n = 1;
  int naxes = m->naxes < MAX_MESH_AXES ? m->naxes : MAX_MESH_AXES;
  for (int a = 0; a < naxes; a++) {
    if (!(mask & (1u << a)) || m->axes[a].size <= 1) continue;
    g->ax[g->nax++] = &m->axes[a];
    g->n *= m->axes[a].size;
  }
}

typedef struct Sum {
  double time, lat, bw;   /* total, and the latency and bandwidth terms summed over phases */
  double big_phase;       /* time of the costliest phase so far */
  double eff;             /* its efficiency */
  double link_bw;         /* its per-device one-way link bandwidth, as used */
  LinkKind link;          /* the slowest link class the group rides */
} Sum;

/* One phase costing max(lat, bw) (or lat + bw for a single hop, `additive`), run at efficiency
 * eff on links of one-way bandwidth link_bw. */
static void phase(Sum *s, double lat, double bw, bool additive, double eff, double link_bw) {
  double t = additive ? lat + bw : (lat > bw ? lat : bw);
  s->time += t;
  s->lat += lat;
  s->bw += bw;
  if (t >= s->big_phase) {
    s->big_phase = t;
    s->eff = eff;
    s->link_bw = link_bw * eff;
  }
}

/* ---- TPU: ICI rings and tori, DCN between slices ---- */

static bool tpu_axis_is_dcn(const MeshAxis *a) {
  return a->link == LINK_DCN || a->link == LINK_NETWORK;
}

static int axis_torus_dims(const MeshAxis *a) { return a->torus_dims > 1 ? a->torus_dims : 1; }

/* Hops on the longest path of an AllGather along the axis: X/2 on a closed ring, X - 1 on an open
 * one (hardware-and-costs.md); an axis spanning several torus dims walks each of them, the book's
 * sum_i |X_i| / 2. */
static double ici_hops(const MeshAxis *a) {
  int64_t prod = 1;
  double hops = 0;
  int spanned = 0;
  for (int d = 0; d < MAX_TORUS_DIMS; d++) {
    int e = a->torus_extent[d];
    if (e <= 1) continue;
    prod *= e;
    hops += a->wraparound ? e / 2.0 : e - 1;
    spanned++;
  }
  if (spanned == 0 || prod != a->size) return a->wraparound ? a->size / 2.0 : a->size - 1;
  return hops;
}

/* Bytes/s at which an AllGather along the axis assembles its array when bandwidth-bound:
 * T = V / rate. Closed ring: W_bi = 2W; open ring: W X / (X - 1) (T = V/W (X-1)/X); an axis over k
 * torus dims has k times the links. */
static double ici_gather_rate(const Target *t, const MeshAxis *a) {
  double w = axis_bw(t, a), x = a->size;
  double r = a->wraparound ? 2 * w : w * x / (x - 1);
  return r * axis_torus_dims(a);
}

/* The same for an AllToAll: V / (4 W_bi) on a closed ring, half an AllGather on an open one. */
static double ici_all_to_all_rate(const Target *t, const MeshAxis *a) {
  double w = axis_bw(t, a), x = a->size;
  double r = a->wraparound ? 8 * w : 2 * w * x / (x - 1);
  return r * axis_torus_dims(a);
}

/* AllGather (or ReduceScatter) of a v-byte array over all the ICI axes at once: the book's
 * multi-axis rule T = max(T_hop sum_i hops_i, V / (sum of the axes' rates)). */
static void ici_gather_phase(const Group *g, const MeshAxis *const *ici, int nici, double v,
                             bool ideal, Sum *s) {
  if (nici == 0) return;
  double eff = coll_efficiency(g->t, v, ideal);
  double lat = 0, rate = 0, wmin = 0;
  for (int i = 0; i < nici; i++) {
    double w = axis_bw(g->t, ici[i]);
    lat += ici_hops(ici[i]) * axis_latency(g->t, ici[i]);
    rate += ici_gather_rate(g->t, ici[i]);
    if (i == 0 || w < wmin) wmin = w;
  }
  phase(s, lat, div0(v, rate * eff), !ideal, eff, wmin);
}

/* AllGather (or ReduceScatter) of a v-byte array over the DCN axes: one open ring of n_d chips at
 * the slowest per-chip DCN bandwidth (a chip's DCN share is one NIC whatever the number of axes),
 * T = max(T_hop sum_a (X_a - 1), V/W (n_d - 1)/n_d). */
static void dcn_gather_phase(const Group *g, const MeshAxis *const *dcn, int ndcn, double v,
                             bool ideal, Sum *s) {
  if (ndcn == 0) return;
  double eff = net_efficiency(g->t, v, ideal);
  double lat = 0, wmin = 0, nd = 1;
  for (int i = 0; i < ndcn; i++) {
    double w = axis_bw(g->t, dcn[i]);
    lat += (dcn[i]->size - 1) * axis_latency(g->t, dcn[i]);
    nd *= dcn[i]->size;
    if (i == 0 || w < wmin) wmin = w;
  }
  phase(s, lat, div0(v * (nd - 1) / nd, wmin * eff), !ideal, eff, wmin);
}

/* Adds the phases of `from` to `into`. */
static void sum_merge(Sum *into, const Sum *from) {
  into->time += from->time;
  into->lat += from->lat;
  into->bw += from->bw;
  if (from->big_phase >= into->big_phase) {
    into->big_phase = from->big_phase;
    into->eff = from->eff;
    into->link_bw = from->link_bw;
  }
}

/* AllGather (and, in reverse, ReduceScatter: the same cost) over ICI and DCN axes together, in two
 * phases. Gathering over DCN first, while the array is still sharded over ICI, puts the slow link on
 * the smallest array (V / n_ici); but when the DCN phase is latency-bound the other order (ICI on
 * V / n_dcn, then DCN on V) can be cheaper, as with calibrated efficiencies on small arrays. The
 * cheaper order is taken, as a collective library would. */
static void tpu_gather(const Group *g, const MeshAxis *const *ici, int nici,
                       const MeshAxis *const *dcn, int ndcn, double v, bool ideal, Sum *s) {
  double ni = 1, nd = 1;
  for (int i = 0; i < nici; i++) ni *= ici[i]->size;
  for (int i = 0; i < ndcn; i++) nd *= dcn[i]->size;
  Sum a, b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  dcn_gather_phase(g, dcn, ndcn, v / ni, ideal, &a);
  ici_gather_phase(g, ici, nici, v, ideal, &a);
  if (nici > 0 && ndcn > 0) {
    ici_gather_phase(g, ici, nici, v / nd, ideal, &b);
    dcn_gather_phase(g, dcn, ndcn, v, ideal, &b);
  }
  sum_merge(s, (nici > 0 && ndcn > 0 && b.time < a.time) ? &b : &a);
}

static void tpu_collective(const Group *g, CollKind kind, double v, double bytes, bool ideal,
                           Sum *s) {
  const MeshAxis *ici[MAX_MESH_AXES], *dcn[MAX_MESH_AXES];
  int nici = 0, ndcn = 0;
  s->link = LINK_ICI;
  for (int i = 0; i < g->nax; i++) {
    if (tpu_axis_is_dcn(g->ax[i])) {
      dcn[ndcn++] = g->ax[i];
      s->link = LINK_DCN;
    } else {
      ici[nici++] = g->ax[i];
    }
  }
  switch (kind) {
  case COLL_ALL_GATHER:
  case COLL_REDUCE_SCATTER:
    tpu_gather(g, ici, nici, dcn, ndcn, v, ideal, s);
    break;
  case COLL_ALL_REDUCE:   /* ReduceScatter + AllGather (over DCN: the 1/n_ici shard is all-reduced) */
    tpu_gather(g, ici, nici, dcn, ndcn, v, ideal, s);
    tpu_gather(g, ici, nici, dcn, ndcn, v, ideal, s);
    break;
  case COLL_ALL_TO_ALL: {
    /* Dimension by dimension: over axis a the traffic is that of an AllToAll of the array the
     * group's X_a-device sub-rings hold, V X_a / n. ICI stages use disjoint links and run at once
     * (the slowest bounds the phase); DCN stages share each chip's NIC and run one after another. */
    if (nici > 0) {
      double lat = 0, bw = 0, eff = 1, wmin = 0;
      for (int i = 0; i < nici; i++) {
        double va = v * ici[i]->size / g->n, e = coll_efficiency(g->t, va, ideal);
        double b = div0(va, ici_all_to_all_rate(g->t, ici[i]) * e);
        double w = axis_bw(g->t, ici[i]);
        lat += ici_hops(ici[i]) * axis_latency(g->t, ici[i]);
        if (b >= bw) {
          bw = b;
          eff = e;
        }
        if (i == 0 || w < wmin) wmin = w;
      }
      phase(s, lat, bw, !ideal, eff, wmin);
    }
    for (int i = 0; i < ndcn; i++) {
      double x = dcn[i]->size, va = v * x / g->n, e = net_efficiency(g->t, va, ideal);
      double w = axis_bw(g->t, dcn[i]);
      phase(s, (x - 1) * axis_latency(g->t, dcn[i]), div0(va * (x - 1) / x, 2 * w * e), !ideal, e, w);
    }
    break;
  }
  case COLL_PERMUTE: {
    /* One hop over one link of the slowest axis. */
    double wmin = 0, lat = 0;
    bool any_dcn = ndcn > 0;
    for (int i = 0; i < g->nax; i++) {
      if (any_dcn && !tpu_axis_is_dcn(g->ax[i])) continue;
      double w = axis_bw(g->t, g->ax[i]), l = axis_latency(g->t, g->ax[i]);
      if (wmin == 0 || w < wmin) wmin = w;
      if (l > lat) lat = l;
    }
    double e = any_dcn ? net_efficiency(g->t, bytes, ideal) : coll_efficiency(g->t, bytes, ideal);
    phase(s, lat, div0(bytes, wmin * e), true, e, wmin);
    break;
  }
  case COLL__COUNT: break;
  }
}

/* ---- GPU: NVLink domains joined by a per-GPU network ---- */

/* How many of the axis's devices share one NVLink domain, from mesh.c's per_node (or, if it left
 * 0, from the link class alone). */
static int axis_per_node(const MeshAxis *a) {
  int p = a->per_node;
  if (p <= 0) p = a->link == LINK_NVLINK ? a->size : 1;
  if (p > a->size) p = a->size;
  return p;
}

/* Calibrated only: the factor (<= 1) by which an oversubscribed network tier slows the network
 * stage of a group spanning more than one full-bisection domain (fabric_domain GPUs, bandwidth
 * divided by fabric_oversubscription above it). All copies of a collective (one per index of the
 * mesh's other axes) run at once, so a domain of D GPUs hosts D / r groups with r members each.
 *   Ring stages (AllGather, ReduceScatter, AllReduce, Permute): each of the p parallel rings of a
 *     group enters and leaves a domain once, so a domain's uplinks carry D / r ring edges per
 *     local rank ... in all D / (r / p) edges at the ring's per-NIC rate R, against D W / o of
 *     capacity: R <= W (r / p) / o. Rings are almost never slowed: r / p is the group's nodes per
 *     domain (32 in a 256-GPU domain), more than any real oversubscription ratio.
 *   AllToAll: a GPU sends to every peer; the fraction f = (n - r) / (n - p) of its network traffic
 *     leaves the domain, so R <= W / (o f).
 * r = prod_a min(X_a, D / stride_a) (an axis whose stride reaches D has one device per domain). */
static double fabric_factor(const Group *g, CollKind kind, double p) {
  const Target *t = g->t;
  double o = t->fabric_oversubscription, dom = t->fabric_domain;
  if (!(o > 1) || !(dom > 0)) return 1;
  double r = 1;
  for (int i = 0; i < g->nax; i++) {
    double stride = g->ax[i]->stride > 0 ? (double)g->ax[i]->stride : 1, x = g->ax[i]->size;
    r *= stride >= dom ? 1 : fmin(x, fmax(1, floor(dom / stride)));
  }
  if (r >= g->n) return 1; /* the group lies within one domain */
  if (kind == COLL_ALL_TO_ALL) {
    double f = (g->n - r) / (g->n - p);
    return f > 0 ? fmin(1, 1 / (o * f)) : 1;
  }
  return fmin(1, (r / p) / o);
}

/* The group's devices sit p per node (the product of its axes' per_node, a node being a block of
 * consecutive devices) across M = n / p nodes. With V the array (AllToAll: every shard):
 *   AllGather / ReduceScatter  max(V (p-1) / (p W_nvlink), V (M-1) / (M p W_net))
 *     in-node: the book's V (N-1) / (N W_nvlink); across nodes the p GPUs of the group in a node
 *     share p NICs: node egress W_node = p x network_bw, the book's max(V / W_nvlink, V / W_node)
 *     with its exact (D_i - 1) / D_i factor per level (gpus.md "Cross-node collectives").
 *     Hierarchically: the NVLink stage reduces or gathers V within the node, the network stage
 *     moves the 1/p shard V / p over p rings of M nodes, one per local rank.
 *   AllReduce  twice that.
 *   AllToAll   max(V (p-1) / (n^2 W_nvlink), V (n-p) / (n^2 W_net)): each GPU sends V / n^2 to each
 *     peer, p - 1 of them over NVLink and n - p through its NIC (the book's B (N-1) / (N^2 W) in a
 *     node, B (M-1) / (M^2 W_node) across full nodes).
 *   Permute    bytes / W + alpha over the slowest link a neighbour pair uses.
 * Latency: alpha per ring step, summed over the axes' rings: sum_a (p_a - 1) alpha_nvlink +
 * (X_a / p_a - 1) alpha_net; an AllToAll posts all its sends at once: one alpha per link class.
 * Calibrated: NVLink stages at collective_efficiency(V), network stages at network_efficiency of
 * the shard through each NIC (V / p) times fabric_factor; terms added (alpha-beta); an AllReduce
 * across nodes takes the cheaper of a ring (2 (M-1) steps) and a tree (NCCL's double binary tree
 * over nodes: 2 ceil(log2 M) steps) for its network latency. */
static void gpu_collective(const Group *g, CollKind kind, double v, double bytes, bool ideal,
                           Sum *s) {
  const Target *t = g->t;
  double w_nv = 0, w_net = 0, a_nv = 0, a_net = 0, steps_nv = 0, steps_net = 0, p = 1;
  for (int i = 0; i < g->nax; i++) {
    const MeshAxis *a = g->ax[i];
    int pa = axis_per_node(a);
    p *= pa;
    steps_nv += pa - 1;
    steps_net += (double)a->size / pa - 1;
    if (a->link == LINK_NETWORK || a->link == LINK_DCN) {
      double w = axis_bw(t, a), l = axis_latency(t, a);
      if (w > 0 && (w_net == 0 || w < w_net)) w_net = w;
      if (l > a_net) a_net = l;
    } else {
      double w = axis_bw(t, a), l = axis_latency(t, a);
      if (w > 0 && (w_nv == 0 || w < w_nv)) w_nv = w;
      if (l > a_nv) a_nv = l;
    }
  }
  /* The in-node part of axes that also cross nodes rides NVLink at the target's figure. */
  if (w_nv == 0) w_nv = t->nvlink_bw;
  if (w_net == 0) w_net = t->network_bw;
  if (a_nv == 0) a_nv = t->nvlink_latency;
  if (a_net == 0) a_net = t->network_latency;
  if (t->node_size > 0 && p > t->node_size) p = t->node_size;
  if (p > g->n) p = g->n;
  double n = g->n, nodes = n / p;
  bool cross = nodes > 1.0 + 1e-9;
  double wslow = cross ? w_net : w_nv;
  s->link = cross ? LINK_NETWORK : LINK_NVLINK;
  double fab = (!ideal && cross) ? fabric_factor(g, kind, p) : 1;

  switch (kind) {
  case COLL_ALL_GATHER:
  case COLL_REDUCE_SCATTER:
  case COLL_ALL_REDUCE: {
    double e_nv = kind == COLL_ALL_REDUCE ? ar_efficiency(t, v, ideal) : coll_efficiency(t, v, ideal);
    double e_net = cross ? net_efficiency(t, v / p, ideal) : 1;
    double nv = div0(v * (p - 1) / p, w_nv * e_nv);
    double net = cross ? div0(v * (nodes - 1) / (nodes * p), w_net * e_net * fab) : 0;
    double lat = steps_nv * a_nv + steps_net * a_net;
    double bw = nv > net ? nv : net, e = nv >= net ? e_nv : e_net * fab;
    if (kind != COLL_ALL_REDUCE) {
      phase(s, lat, bw, !ideal, e, wslow);
    } else if (ideal) {
      phase(s, lat, bw, false, e, wslow);
      phase(s, lat, bw, false, e, wslow);
    } else {
      double ring = 2 * steps_net, tree = cross ? 2 * ceil(log2(nodes) - 1e-9) : 0;
      phase(s, 2 * steps_nv * a_nv + (tree < ring ? tree : ring) * a_net, 2 * bw, true, e, wslow);
    }
    break;
  }
  case COLL_ALL_TO_ALL: {
    double e_nv = coll_efficiency(t, v, ideal), e_net = cross ? net_efficiency(t, v / p, ideal) : 1;
    double nv = div0(v * (p - 1) / (n * n), w_nv * e_nv);
    double net = cross ? div0(v * (n - p) / (n * n), w_net * e_net * fab) : 0;
    double lat = (p > 1 ? a_nv : 0) + (cross ? a_net : 0);
    phase(s, lat, nv > net ? nv : net, !ideal, nv >= net ? e_nv : e_net * fab, wslow);
    break;
  }
  case COLL_PERMUTE: {
    double e = cross ? net_efficiency(t, bytes, ideal) * fab : coll_efficiency(t, bytes, ideal);
    phase(s, cross ? a_net : a_nv, div0(bytes, wslow * e), true, e, wslow);
    break;
  }
  case COLL__COUNT: break;
  }
}

/* ---- the entry point ---- */

double cost_collective(const Mesh *m, CollKind kind, uint16_t axes_mask, double bytes, bool ideal,
                       CollCost *out) {
  CollCost c;
  memset(&c, 0, sizeof c);
  c.n = 1;
  c.efficiency = 1;
  c.link = m && m->target && m->target->kind == TARGET_GPU ? LINK_NVLINK : LINK_ICI;
  c.link_name = cost_link_name(c.link);
  if (out) *out = c;
  if (!m || !m->target || (int)kind < 0 || kind >= COLL__COUNT || !(bytes > 0) || !isfinite(bytes))
    return 0;
  Group g;
  group_init(&g, m, axes_mask);
  if (g.nax == 0) return 0;

  double n = g.n;
  double v = kind == COLL_ALL_TO_ALL ? bytes * n : bytes;
  bool gpu = m->target->kind == TARGET_GPU;
  for (int i = 0; i < g.nax; i++)
    if (g.ax[i]->link == LINK_NVLINK || g.ax[i]->link == LINK_NETWORK) gpu = true;

  Sum s;
  memset(&s, 0, sizeof s);
  if (gpu)
    gpu_collective(&g, kind, v, bytes, ideal, &s);
  else
    tpu_collective(&g, kind, v, bytes, ideal, &s);

  c.time_s = s.time;
  c.n = (int64_t)(n + 0.5);
  c.array_bytes = v;
  switch (kind) {
  case COLL_ALL_GATHER:
  case COLL_REDUCE_SCATTER: c.bytes_per_device = v * (n - 1) / n; break;
  case COLL_ALL_REDUCE: c.bytes_per_device = 2 * v * (n - 1) / n; break;
  case COLL_ALL_TO_ALL: c.bytes_per_device = bytes * (n - 1) / n; break;
  case COLL_PERMUTE: c.bytes_per_device = bytes; break;
  case COLL__COUNT: break;
  }
  c.link = s.link;
  c.link_name = cost_link_name(s.link);
  c.link_bw = s.link_bw;
  c.coll_bw = div0(v, s.bw);
  c.efficiency = s.big_phase > 0 ? s.eff : 1;
  c.latency_s = s.lat;
  c.bandwidth_s = s.bw;
  c.latency_bound = s.lat > s.bw;
  if (out) *out = c;
  return c.time_s;
}

double cost_collective_group(const Mesh *m, CollKind kind, uint16_t axes_mask, int ngroup, double bytes,
                             bool ideal, CollCost *out) {
  if (!m || ngroup <= 1) return cost_collective(m, kind, axes_mask, bytes, ideal, out);
  Mesh g = *m;
  for (int a = 0; a < g.naxes; a++) {
    if (!((axes_mask >> a) & 1)) continue;
    MeshAxis *x = &g.axes[a];
    x->size = ngroup;
    x->wraparound = false;
    if (x->per_node > 1 && x->link == LINK_NETWORK) x->per_node = 1;
    if (x->per_node > ngroup) x->per_node = ngroup;
    for (int d = 0; d < MAX_TORUS_DIMS; d++) x->torus_extent[d] = d == 0 ? ngroup : 1;
    x->torus_dims = 1;
    break; /* a group names one axis */
  }
  return cost_collective(&g, kind, axes_mask, bytes, ideal, out);
}

/* ---- rooflines ---- */

double cost_peak_flops(const Target *t, DType dt, bool ideal) {
  if (!t) return 0;
  double f = (dt >= 0 && dt < DT__COUNT) ? t->flops[dtype_rate(dt)] : 0;
  if (!(f > 0)) f = t->flops[DT_BF16];
  if (!ideal && t->matmul_efficiency > 0) f *= t->matmul_efficiency;
  return f;
}

double cost_op_time(const Target *t, DType dt, double flops, double bytes_moved, bool ideal) {
  if (!t) return 0;
  double compute = flops > 0 ? div0(flops, cost_peak_flops(t, dt, ideal)) : 0;
  double memory = bytes_moved > 0 ? div0(bytes_moved, t->hbm_bw) : 0;
  return compute > memory ? compute : memory;
}

double cost_arithmetic_intensity_threshold(const Target *t) {
  return t ? div0(t->flops[DT_BF16], t->hbm_bw) : 0;
}

/* ---- compute vs communication thresholds ---- */

/* alpha = C / W: C FLOP/s, W = V / T_bandwidth(V) of an AllGather over the axes, taken at a size
 * where latency and the calibrated efficiency's size dependence have vanished. */
double cost_comm_intensity(const Mesh *m, uint16_t axes, bool ideal) {
  if (!m || !m->target) return 0;
  CollCost c;
  cost_collective(m, COLL_ALL_GATHER, axes, 1e15, ideal, &c);
  if (c.n <= 1 || !(c.bandwidth_s > 0)) return 0;
  return cost_peak_flops(m->target, DT_BF16, ideal) * c.bandwidth_s / c.array_bytes;
}

double cost_dp_threshold(const Mesh *m, uint16_t dp_axes, bool ideal) {
  return cost_comm_intensity(m, dp_axes, ideal);
}

double cost_tp_threshold(const Mesh *m, uint16_t tp_axes, bool ideal) {
  return cost_comm_intensity(m, tp_axes, ideal);
}

/* From training.md: T_fsdp = 4DF / (Y W_X), T_tp = 4BD / (X W_Y), T_math = 4BDF / (N C) with
 * N = XY. Compute hides both iff alpha_X F X^2 - B F X + alpha_Y B N <= 0 has a root X, i.e. the
 * discriminant B^2 F^2 - 4 alpha_X alpha_Y F B N >= 0: B / N >= 4 alpha_X alpha_Y / F. */
double cost_fsdp_tp_threshold(const Mesh *m, uint16_t fsdp_axes, uint16_t tp_axes, double ffw,
                              bool ideal) {
  if (!(ffw > 0)) return 0;
  double ax = cost_comm_intensity(m, fsdp_axes, ideal), ay = cost_comm_intensity(m, tp_axes, ideal);
  return 4 * ax * ay / ffw;
}

int cost_ring(const Mesh *m, uint16_t axes, double k_bytes, double v_bytes, bool backward, bool ideal, CollCost *step) {
  int n = 1;
  for (int a = 0; m && a < m->naxes; a++)
    if (axes >> a & 1) n *= m->axes[a].size;
  double bytes = (k_bytes + v_bytes) * (backward ? 2 : 1);
  cost_collective(m, COLL_PERMUTE, axes, bytes, ideal, step);
  if (step && n < 2) memset(step, 0, sizeof *step);
  return n > 1 ? n - 1 : 0;
}
