/* cost.h: the cost model: how long a collective or an op takes on a mesh's target.
 *
 * In: a Mesh (its axes placed on the hardware by mesh.c) or a Target, plus sizes in bytes and
 * FLOPs. Out: seconds, and the figures `explain` prints beside each collective. Two modes: ideal
 * (peak figures, no efficiency factors: the arithmetic of "How to Scale Your Model", reproduced
 * literally) and calibrated (the target's declared efficiencies). docs/cost-model.md derives every
 * formula, gives its source, and compares the model with the book's worked numbers.
 *
 * Units everywhere: bytes, bytes/s, FLOP/s, seconds.
 *
 * What the model reads from each MeshAxis (filled by mesh.c; see program.h):
 *   link        ICI / DCN (TPU), NVLink / network (GPU): the slowest link class the axis rides
 *   size        devices along the axis
 *   wraparound  TPU ICI: the ring closes, so both directions carry data (W_bi = 2 W)
 *   torus_dims  TPU ICI: torus dims the axis spans; its bandwidth-bound time is divided by this
 *   torus_extent  TPU ICI: extent per torus dim, for the hop count of the longest path
 *   bw          peak one-way bytes/s of ONE link of the axis's link class: one ICI link (not
 *               multiplied by torus_dims nor by 2 for wraparound), DCN per chip, NVLink per GPU,
 *               network per GPU. 0 means "take the target's figure".
 *   latency     seconds per hop (ICI, DCN) or per message step (NVLink, network); 0: the target's
 *   per_node    GPU: how many of the axis's devices share one NVLink domain (1..size)
 */
#ifndef SHARDC_COST_H
#define SHARDC_COST_H

#include "program.h"

/* ---- collective kinds: X(enum, name as in explain's JSON), in this order ---- */
#define COLL_KINDS(X)                        \
  X(COLL_ALL_GATHER, "all_gather")           \
  X(COLL_REDUCE_SCATTER, "reduce_scatter")   \
  X(COLL_ALL_REDUCE, "all_reduce")           \
  X(COLL_ALL_TO_ALL, "all_to_all")           \
  X(COLL_PERMUTE, "collective_permute")
typedef enum {
#define X(e, s) e,
  COLL_KINDS(X)
#undef X
  COLL__COUNT
} CollKind;

const char *coll_kind_name(CollKind k);                /* "all_gather", ...; "?" if out of range */
bool coll_kind_from_name(const char *s, CollKind *out); /* false if s names no kind */
/* The display name of a link class in explain's and check's text: "ICI", "DCN", "NVLink",
 * "network". */
const char *cost_link_name(LinkKind k);

/* What cost_collective computed, for explain and sim. */
typedef struct CollCost {
  double time_s;           /* the collective's time */
  double bytes_per_device; /* what each device sends (language.md's JSON definition, over n):
                              AllGather (n-1)/n x the gathered array; ReduceScatter (n-1)/n x its
                              input; AllReduce 2(n-1)/n x the array; AllToAll (n-1)/n x the local
                              shard; Permute the bytes sent */
  double array_bytes;      /* V of the book's formulas: the array the collective gathers /
                              reduces (AllToAll: the local shard x n; Permute: the bytes sent) */
  int64_t n;               /* devices in the group (product of the axes' sizes) */
  LinkKind link;           /* the slowest link class the group rides */
  const char *link_name;   /* cost_link_name(link): "ICI", "DCN", "NVLink", "network" */
  double link_bw;          /* one-way bytes/s per device of that link class, as used (peak in
                              ideal mode, peak x efficiency when calibrated) */
  double coll_bw;          /* array_bytes / bandwidth_s: the book's "collective bandwidth"
                              (e.g. W_bi = 9e10 for a v5e AllGather on a full ring); 0 if no data */
  double efficiency;       /* achieved / peak link bandwidth applied to the largest phase (1 ideal) */
  double latency_s;        /* the latency terms (hops x per-hop latency), summed over phases */
  double bandwidth_s;      /* the bandwidth terms, summed over phases */
  bool latency_bound;      /* latency_s exceeds bandwidth_s */
} CollCost;

/* Ring attention's communication (language.md, Context parallelism): over the ring's axes (n
 * devices), n - 1 CollectivePermute steps, each moving the device's K and V blocks (k_bytes +
 * v_bytes), and in the backward their gradients too (twice that). Returns the steps (n - 1, 0 off
 * a ring); *step (may be NULL) is one step's cost (cost_collective of the step's bytes). The one
 * formula of the ring's cost: partitioning charges it, the device program records it (DevRing),
 * explain lists it, the simulator overlaps it with the attention, the textbook rows count it. */
int cost_ring(const Mesh *m, uint16_t axes, double k_bytes, double v_bytes, bool backward, bool ideal, CollCost *step);

/* The time of one collective of `kind` over the mesh axes in `axes_mask` (bit a = m->axes[a]; bits
 * beyond m->naxes and axes of size 1 are ignored), which language.md makes ONE collective whatever
 * the number of axes. `bytes` is per device, after any sharding over axes outside the group:
 *   COLL_ALL_GATHER      the gathered result each device holds afterwards       (= V)
 *   COLL_REDUCE_SCATTER  each device's input, the unreduced array               (= V)
 *   COLL_ALL_REDUCE      the array, the same size before and after              (= V)
 *   COLL_ALL_TO_ALL      each device's local shard, the same size before and after (V = n x bytes)
 *   COLL_PERMUTE         the bytes each device sends to its neighbour           (= V)
 * With these, the book's formulas (V = the whole array) apply literally: an array already sharded
 * over another axis Y is simply a smaller `bytes` (the book's V / Y).
 * ideal: peak figures, each phase max(latency, bytes / bandwidth) (the book's arithmetic, which
 * explain and plan choice use). Calibrated: latency + bytes / (bandwidth x efficiency), the
 * efficiency max(small, max x V / (V + half_bytes)) of collective_efficiency (ICI, NVLink) or
 * network_efficiency (DCN, GPU network) at the phase's array; GPU groups across nodes run
 * hierarchically (the network stage on the 1/p shard per NIC), an AllReduce across nodes takes the
 * cheaper of ring and tree latency, and an oversubscribed fabric tier may slow the network stage
 * (docs/cost-model.md, "Calibrated collectives"). Returns time_s (0 for an empty group, bytes <= 0, or a NULL mesh/target) and fills *out if
 * out != NULL. */
double cost_collective(const Mesh *m, CollKind kind, uint16_t axes_mask, double bytes, bool ideal,
                       CollCost *out);
/* The same among a group of `ngroup` devices spread along the one axis in axes_mask (a tied param's
 * first and last pipeline stage): priced as a ring of ngroup on that axis, open, its members far
 * apart (one per node on a GPU axis that crosses nodes). ngroup <= 1: cost_collective itself. */
double cost_collective_group(const Mesh *m, CollKind kind, uint16_t axes_mask, int ngroup, double bytes,
                             bool ideal, CollCost *out);

/* ---- rooflines ---- */

/* Dense matmul FLOP/s of the target for dtype dt: t->flops[dt], or the bf16 figure where the
 * target gives 0 for dt (or dt is DT_NONE); times matmul_efficiency unless ideal (a target that
 * declares no efficiency runs at peak). */
double cost_peak_flops(const Target *t, DType dt, bool ideal);

/* An op's time: max(flops / cost_peak_flops(t, dt, ideal), bytes_moved / hbm_bw). HBM runs at its
 * peak in both modes. 0 for a NULL target. */
double cost_op_time(const Target *t, DType dt, double flops, double bytes_moved, bool ideal);

/* The critical arithmetic intensity peak_bf16 / hbm_bw (FLOPs per byte of HBM traffic above which
 * an op is compute-bound): v5e about 243, H100 about 296. */
double cost_arithmetic_intensity_threshold(const Target *t);

/* ---- calibrated compute (compute.c) ----
 * An op's time on a target from what it computes and what it moves. Ideal mode is the roofline
 * max(FLOPs / peak, bytes / HBM bandwidth) with peak figures, nothing else (cost_op_time's
 * arithmetic). Calibrated mode adds what real chips do, each from a target key with a physical
 * reason (docs/cost-model.md "Compute"): padding to the MXU / tensor-core tile (`matmul_tile`),
 * wave quantization over the GPU's SMs (`matmul_units`), pipeline fill/drain along the streamed dim
 * (`matmul_fill`), the large-matmul ceiling (`matmul_efficiency`), achieved HBM bandwidth
 * (`hbm_efficiency`), the fused attention kernel's rate (`attention_efficiency`) and a fixed cost
 * per kernel (`op_overhead`). */

/* A contraction as the hardware sees it: batch independent [m, k] x [k, n] products. m is the
 * product of the result dims taken from the first operand (rows), n of those from the second,
 * k of the contracted dims, batch of the dims both operands and the result share. */
typedef struct MatmulShape {
  double m, n, k;
  double batch; /* <= 0 means 1 */
} MatmulShape;

/* What an op's time on a target was made of (its FLOPs and bytes: analysis/opcost.h). */
typedef struct OpTime {
  double time_s;     /* max(compute_s, memory_s) + overhead_s */
  double compute_s;  /* exec_flops at the achieved FLOP/s */
  double memory_s;   /* bytes at the achieved HBM bandwidth */
  double overhead_s; /* op_overhead (calibrated only) */
  double flops;      /* FLOPs as language.md counts them (no padding, no causal discount; the
                        attention backward 2x its forward, recomputed scores excluded) */
  double exec_flops; /* FLOPs the hardware executes: padded to the tile, causal blocks skipped,
                        the attention backward's recomputed scores included (= flops when ideal) */
  double bytes;      /* HBM bytes moved */
  double efficiency; /* flops / (compute_s x peak): the useful fraction of peak (1 when ideal);
                        for attention exec_flops / (compute_s x peak), the kernel's rate, since a
                        causal mask executes fewer FLOPs than language.md counts */
  bool memory_bound; /* memory_s > compute_s */
} OpTime;

/* Achieved / peak FLOP/s of a contraction of shape s (before the roofline's memory side):
 * 1 when ideal; else matmul_efficiency x padding x waves x fill, each in (0, 1]:
 *   padding  m n k / (M N K), M N K rounded up to matmul_tile
 *   waves    T / (ceil(T / U) U), T = batch ceil(m / tile_m) ceil(n / tile_n) output tiles over
 *            U = matmul_units SMs (1 when the target declares none)
 *   fill     prod_d (M_d / (M_d + matmul_fill_d)) over d = m, n, k */
double cost_matmul_efficiency(const Target *t, MatmulShape s, bool ideal);

/* HBM bytes a contraction moves when each operand is read and the result written once:
 * batch (m k + k n + m n) x the dtype's bytes. */
double cost_matmul_bytes(DType dt, MatmulShape s);

/* A contraction's time: FLOPs 2 batch m n k at cost_peak_flops(t, dt, true) x its efficiency,
 * against `bytes` of HBM traffic (cost_matmul_bytes when the caller has nothing better), plus
 * op_overhead when calibrated. Ideal: exactly cost_op_time(t, dt, 2 batch m n k, bytes, true). */
double cost_matmul(const Target *t, DType dt, MatmulShape s, double bytes, bool ideal, OpTime *out);

/* Achieved HBM bandwidth: hbm_bw, x hbm_efficiency when calibrated. */
double cost_hbm_bandwidth(const Target *t, bool ideal);

/* An op that only moves memory (elementwise, reduction, copy, gather): bytes / achieved HBM
 * bandwidth, plus op_overhead when calibrated. */
double cost_memory_op(const Target *t, double bytes, bool ideal, OpTime *out);

/* A chain of nops elementwise ops fused into one kernel, as XLA and torch.compile fuse them: only
 * its external bytes (inputs read from HBM, outputs written back) move; intermediates stay in
 * registers. One op_overhead for the kernel. Unfused, the same chain costs the sum of each op's
 * own cost_memory_op. */
double cost_fused_chain(const Target *t, double external_bytes, int nops, bool ideal, OpTime *out);

/* The fused attention op (language.md's pattern) costed as flash attention: the scores never
 * touch HBM. kv_heads <= 0 means heads (multi-head); v_dim <= 0 means head_dim. */
typedef struct AttentionShape {
  double batch, heads, kv_heads, q_len, kv_len, head_dim, v_dim;
  bool causal;
} AttentionShape;

/* Forward: FLOPs of its two contractions, 2 B H Sq Skv (D + Dv); HBM traffic q, k, v and o, plus
 * one f32 softmax statistic per query row. Backward (backward = true): 2x the forward's FLOPs
 * counted; executed also the recomputed scores (2 B H Sq Skv D); HBM traffic q, k, v, o, dO and
 * the statistics read, dQ, dK, dV written. Calibrated: at peak x attention_efficiency, and under
 * a causal mask only the key blocks at or before each query block run (blocks of 128). */
double cost_attention(const Target *t, DType dt, AttentionShape a, bool backward, bool ideal,
                      OpTime *out);

/* ---- compute vs communication thresholds (the book's rooflines for sharded training) ----
 * All are built on the collective intensity alpha = C / W: C = bf16 FLOP/s (x matmul_efficiency
 * when calibrated), W = V / T_bandwidth(V) for an AllGather over the axes (the bandwidth-bound
 * limit of cost_collective: W_bi = 2W on a full ICI ring, x torus dims spanned, x(n/(n-1)) on an
 * open ring or a GPU switch; calibrated: x coll_eff_max). 0 when the group is empty. */

/* FLOPs a device must do per byte it AllGathers over `axes` for compute to hide the collective.
 * (sharding.md, training.md "C / W_ici = 2550" on v5p; gpus.md "C / W_collective".) */
double cost_comm_intensity(const Mesh *m, uint16_t axes, bool ideal);

/* Data parallelism or FSDP (ZeRO-1/2/3) over dp_axes is compute-bound when the tokens each device
 * processes per step, B / |dp axes| (global tokens over the product of the dp axes' sizes; with
 * tensor parallelism every device of a TP group processes its replica's tokens), exceed the value
 * returned (= alpha of dp_axes). Book: training.md "B / X > C / W" (2550 on v5p over one ICI axis,
 * 850 over three, ~75,000 per pod over DCN); gpus.md "Data Parallelism" (2200 in an H100 node,
 * 2475 across nodes; the model keeps the exact (n-1)/n factor the book drops). */
double cost_dp_threshold(const Mesh *m, uint16_t dp_axes, bool ideal);

/* Tensor (Megatron) parallelism over tp_axes, AllGather of the activations before W_in and
 * ReduceScatter after W_out, is compute-bound when F / Y, the feed-forward columns per device
 * (F the MLP hidden size, Y the product of the tp axes' sizes), exceeds the value returned
 * (= alpha of tp_axes); i.e. the largest TP degree is F / value. Book: training.md "Tensor
 * Parallelism", F > Y C / W_ici; gpus.md "Tensor Parallelism", Y < F W / C. */
double cost_tp_threshold(const Mesh *m, uint16_t tp_axes, bool ideal);

/* Mixed FSDP (over fsdp_axes) + tensor parallelism (over tp_axes) with MLP hidden size `ffw`:
 * the smallest tokens per device, B / N over all N devices of both groups, at which the best
 * split is still compute-bound: 4 alpha_X alpha_Y / F. Book: training.md "Mixed FSDP and Tensor
 * Parallelism", B / N > 4 alpha^2 / (F M_X M_Y) (alpha_X = alpha / M_X: M_X torus dims for FSDP);
 * 2 x 2550^2 / F on v5p with two axes of FSDP and one of TP. */
double cost_fsdp_tp_threshold(const Mesh *m, uint16_t fsdp_axes, uint16_t tp_axes, double ffw,
                              bool ideal);

#endif
