/* test_cost.c: the cost model (compiler/cost.h) against the worked examples of "How to Scale Your
 * Model" and the figures of hardware-and-costs.md.
 *
 * Every expectation is written as the book's formula over the table figures (or the book's printed
 * number with its stated rounding), never as a number copied from this program's output. Targets
 * and meshes are built by hand, with MeshAxis filled as program.h's comments define it, so the test
 * does not depend on mesh.c. Prints PASS/FAIL per case and "N passed, N failed"; exits 1 on any
 * failure. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cost.h"
#include "unit_test.h"

/* |got - want| <= tol x |want| (tol relative). Not ut_near: a want of 0 takes |got| <= tol, and a
 * failure shows the error and the allowance in percent. */
static void near(const char *what, double got, double want, double tol) {
  double err = want != 0 ? fabs(got - want) / fabs(want) : fabs(got);
  if (err <= tol) return;
  ut_fail("%s: got %.6g, want %.6g (error %.2f%%, allowed %.2f%%)", what, got, want, 100 * err,
          100 * tol);
}

/* ---- hand-made targets (hardware-and-costs.md's tables; efficiencies as stdlib/targets.shard) ---- */

static Target tpu(const char *name, double bf16, double i8, double hbm_bw, double ici, double dcn) {
  Target t;
  memset(&t, 0, sizeof t);
  t.name = name;
  t.kind = TARGET_TPU;
  t.flops[DT_BF16] = bf16;
  t.flops[DT_I8] = i8;
  t.hbm_bw = hbm_bw;
  t.matmul_efficiency = 0.95;
  t.ici_bw = ici;
  t.hop_latency = 1e-6;
  t.dcn_bw = dcn;
  t.coll_eff_max = 0.95;
  t.coll_eff_half_bytes = 2e5;
  /* calibrated compute as stdlib/targets.shard declares it (docs/cost-model.md "Compute") */
  t.matmul_tile[0] = 8, t.matmul_tile[1] = t.matmul_tile[2] = 128;
  t.matmul_fill[0] = 128;
  t.hbm_efficiency = 0.9;
  t.attention_efficiency = 0.6;
  t.op_overhead = 1e-6;
  t.net_eff_max = 0.9, t.net_eff_half_bytes = 1e6;
  t.fabric_oversubscription = 1;
  return t;
}

static Target gpu(const char *name, double bf16, double f8, double hbm_bw, double nvlink,
                  double network) {
  Target t;
  memset(&t, 0, sizeof t);
  t.name = name;
  t.kind = TARGET_GPU;
  t.flops[DT_BF16] = bf16;
  t.flops[DT_F8E4M3] = f8;
  t.hbm_bw = hbm_bw;
  t.matmul_efficiency = 0.82;
  t.nvlink_bw = nvlink;
  t.node_size = 8;
  t.network_bw = network;
  t.nvlink_latency = 1e-6;
  t.network_latency = 3e-6;
  t.coll_eff_max = 0.815;
  t.coll_eff_half_bytes = 8.4e7;
  t.coll_eff_small = 0.25;
  t.matmul_tile[0] = 128, t.matmul_tile[1] = 256, t.matmul_tile[2] = 64;
  t.matmul_units = 132;
  t.matmul_fill[2] = 128;
  t.hbm_efficiency = 0.9;
  t.attention_efficiency = 0.6;
  t.op_overhead = 2e-6;
  t.net_eff_max = 0.9, t.net_eff_half_bytes = 4e6, t.net_eff_small = 0.25;
  t.fabric_oversubscription = 1;
  return t;
}

static Target V4, V5E, V5P, H100;

/* ---- hand-made axes and meshes ---- */

/* An ICI axis over the given torus extents (1 where not spanned). */
static MeshAxis ici(const char *name, const Target *t, bool wrap, int e0, int e1, int e2) {
  MeshAxis a;
  memset(&a, 0, sizeof a);
  a.name = name;
  a.size = e0 * e1 * e2;
  a.link = LINK_ICI;
  a.wraparound = wrap;
  a.torus_extent[0] = e0, a.torus_extent[1] = e1, a.torus_extent[2] = e2;
  a.torus_dims = (e0 > 1) + (e1 > 1) + (e2 > 1);
  a.bw = t->ici_bw;
  a.latency = t->hop_latency;
  a.per_node = a.size;
  return a;
}

static MeshAxis dcn(const char *name, const Target *t, int size, double latency) {
  MeshAxis a;
  memset(&a, 0, sizeof a);
  a.name = name;
  a.size = size;
  a.link = LINK_DCN;
  a.bw = t->dcn_bw;
  a.latency = latency;
  a.per_node = 1;
  return a;
}

/* A GPU axis; mesh() fills per_node, link, bw and latency from the strides. */
static MeshAxis gax(const char *name, int size) {
  MeshAxis a;
  memset(&a, 0, sizeof a);
  a.name = name;
  a.size = size;
  a.wraparound = true;
  return a;
}

static Mesh mesh(const Target *t, int naxes, const MeshAxis *axes) {
  Mesh m;
  memset(&m, 0, sizeof m);
  m.name = "m";
  m.target = t;
  m.naxes = naxes;
  m.devices = 1;
  m.slices = 1;
  for (int i = naxes - 1; i >= 0; i--) {
    m.axes[i] = axes[i];
    m.axes[i].stride = m.devices;
    m.devices *= axes[i].size;
    if (axes[i].link == LINK_DCN) m.slices *= axes[i].size;
  }
  if (t->kind == TARGET_GPU) {
    for (int i = 0; i < naxes; i++) {
      MeshAxis *a = &m.axes[i];
      int64_t per = a->stride >= t->node_size ? 1 : t->node_size / a->stride;
      a->per_node = per > a->size ? a->size : (int)per;
      a->link = a->per_node == a->size ? LINK_NVLINK : LINK_NETWORK;
      a->bw = a->link == LINK_NVLINK ? t->nvlink_bw : t->network_bw;
      a->latency = a->link == LINK_NVLINK ? t->nvlink_latency : t->network_latency;
    }
  }
  return m;
}

#define AX(...) (const MeshAxis[]){__VA_ARGS__}
#define BIT(a) ((uint16_t)(1u << (a)))

static double ag(const Mesh *m, uint16_t mask, double v, bool ideal, CollCost *c) {
  return cost_collective(m, COLL_ALL_GATHER, mask, v, ideal, c);
}

/* ---- cases ---- */

static void test_kind_names(void) {
  ut_begin("collective kinds: one X-macro table, names as in explain's JSON");
  const char *want[] = {"all_gather", "reduce_scatter", "all_reduce", "all_to_all",
                        "collective_permute"};
  for (int k = 0; k < COLL__COUNT; k++) {
    CollKind back;
    ut_true(want[k], strcmp(coll_kind_name((CollKind)k), want[k]) == 0);
    ut_true("round trip", coll_kind_from_name(want[k], &back) && back == (CollKind)k);
  }
  ut_true("5 kinds", COLL__COUNT == 5);
  ut_true("out of range", strcmp(coll_kind_name(COLL__COUNT), "?") == 0);
  ut_true("unknown name", !coll_kind_from_name("all_sum", NULL));
  ut_true("link display names", strcmp(cost_link_name(LINK_NVLINK), "NVLink") == 0 &&
                                    strcmp(cost_link_name(LINK_DCN), "DCN") == 0);
  ut_end();
}

/* sharding.md: T = max(T_hop X/2, V / W_bi), W_bi = 2 x 4.5e10 on v5e. */
static void test_v5e_ring(void) {
  ut_begin("v5e AllGather of bf16[2048, 8192] over a 16-chip ring with wraparound: V / W_bi = 373 us");
  Mesh m = mesh(&V5E, 2, AX(ici("x", &V5E, true, 16, 1, 1), ici("y", &V5E, true, 1, 16, 1)));
  double v = 2048.0 * 8192 * 2; /* bf16[2048, 8192] */
  CollCost c;
  double t = ag(&m, BIT(0), v, true, &c);
  near("time", t, v / (2 * 4.5e10), 1e-9);
  near("bytes_per_device = 15/16 V", c.bytes_per_device, v * 15 / 16, 1e-12);
  near("collective bandwidth W_bi", c.coll_bw, 9e10, 1e-9);
  ut_true("n = 16", c.n == 16);
  ut_true("rides ICI", c.link == LINK_ICI && strcmp(c.link_name, "ICI") == 0);
  ut_true("bandwidth-bound", !c.latency_bound);
  near("latency term = 8 hops", c.latency_s, 8e-6, 1e-9);
  ut_end();
}

/* sharding.md Pop Quiz 2: v5e {X: 8, Y: 4}, AllGather_Y of bf16[2048, 8192]; Y = 4 has no
 * wraparound: 3 x 8.4e6 / 4.5e10 = 560 us (measured 680 us). */
static void test_v5e_open_ring(void) {
  ut_begin("v5e AllGather over a 4-chip axis without wraparound: V/W (X-1)/X = 560 us (Pop Quiz 2)");
  Mesh m = mesh(&V5E, 2, AX(ici("X", &V5E, false, 8, 1, 1), ici("Y", &V5E, false, 1, 4, 1)));
  double v = 2048.0 * 8192 * 2;
  CollCost c;
  double t = ag(&m, BIT(1), v, true, &c);
  near("formula V/W (X-1)/X", t, v / 4.5e10 * 3 / 4, 1e-9);
  near("the book's 560 us", t, 560e-6, 0.01);
  Mesh w = mesh(&V5E, 2, AX(ici("x", &V5E, true, 16, 1, 1), ici("y", &V5E, true, 1, 16, 1)));
  double t16 = ag(&w, BIT(0), v, true, NULL);
  near("open 4-ring / closed 16-ring = 2 x 3/4", t / t16, 1.5, 1e-9);
  ut_end();
}

/* Pop Quiz 2b: bf16[256, 256] over the same axis: 3 hops x 1 us = 3 us, latency-bound. */
static void test_latency_bound(void) {
  ut_begin("latency-bound regime: 3 us on an open 4-ring (Pop Quiz 2b), 2 us on a v4 4-ring (Q3)");
  Mesh m = mesh(&V5E, 2, AX(ici("X", &V5E, false, 8, 1, 1), ici("Y", &V5E, false, 1, 4, 1)));
  double v = 256.0 * 256 * 2;
  CollCost c;
  double t = ag(&m, BIT(1), v, true, &c);
  near("3 hops x T_hop", t, 3e-6, 1e-9);
  ut_true("latency-bound", c.latency_bound);
  near("bandwidth term", c.bandwidth_s, v / 4.5e10 * 3 / 4, 1e-9);
  /* Question 3: v4 4x4x4, AllGather_X of bf16[128] with wraparound: 2 hops = 2 us. */
  Mesh q = mesh(&V4, 3, AX(ici("X", &V4, true, 4, 1, 1), ici("Y", &V4, true, 1, 4, 1),
                           ici("Z", &V4, true, 1, 1, 4)));
  t = ag(&q, BIT(0), 128 * 2, true, &c);
  near("v4 bf16[128]: X/2 hops", t, 2e-6, 1e-9);
  ut_true("v4 latency-bound", c.latency_bound);
  ut_end();
}

/* sharding.md Question 2 on a v4 4x4x4 (W_bi = 9e10), B = 1024, D = 4096, bf16. */
static void test_v4_question2(void) {
  ut_begin("v4 4x4x4 AllGathers of sharding.md Question 2: 23 us, 46 us over two axes, 5.8 us");
  Mesh m = mesh(&V4, 3, AX(ici("X", &V4, true, 4, 1, 1), ici("Y", &V4, true, 1, 4, 1),
                           ici("Z", &V4, true, 1, 1, 4)));
  double b = 1024, d = 4096;
  CollCost c;
  double t1 = ag(&m, BIT(0), 2 * b * d / 4, true, NULL); /* AllGather_X([B_X, D_Y]) */
  near("AllGather_X = 2BD / (Y W_bi)", t1, 2 * b * d / (9e10 * 4), 1e-9);
  near("the book's 23 us", t1, 23e-6, 0.02);
  double t3 = ag(&m, BIT(0) | BIT(1), 2 * b * d, true, &c); /* AllGather_XY */
  near("AllGather_XY = 2BD / (2 W_bi)", t3, 2 * b * d / (2 * 9e10), 1e-9);
  near("the book's 46 us", t3, 46e-6, 0.02);
  near("longest path 4 hops", c.latency_s, 4e-6, 1e-9);
  double t4 = ag(&m, BIT(2), 2 * b * d / 16, true, NULL); /* AllGather_Z([B_X, D_Y]) */
  near("AllGather_Z = 2BD / (16 W_bi)", t4, 2 * b * d / (16 * 9e10), 1e-9);
  near("the book's 5.8 us", t4, 5.8e-6, 0.01);
  ut_end();
}

static void test_allreduce_twice(void) {
  ut_begin("AllReduce = ReduceScatter + AllGather = 2 x AllGather (open and closed rings, both regimes)");
  Mesh m = mesh(&V5E, 2, AX(ici("X", &V5E, false, 4, 1, 1), ici("Y", &V5E, true, 1, 16, 1)));
  double sizes[] = {64, 4e4, 3.4e7, 1e9};
  for (int i = 0; i < 4; i++)
    for (int a = 0; a < 2; a++)
      for (int ideal = 0; ideal < 2; ideal++) {
        double g = ag(&m, BIT(a), sizes[i], ideal, NULL);
        double r = cost_collective(&m, COLL_ALL_REDUCE, BIT(a), sizes[i], ideal, NULL);
        double s = cost_collective(&m, COLL_REDUCE_SCATTER, BIT(a), sizes[i], ideal, NULL);
        near("AllReduce = 2 AllGather", r, 2 * g, 1e-12);
        near("ReduceScatter = AllGather", s, g, 1e-12);
      }
  CollCost c;
  cost_collective(&m, COLL_ALL_REDUCE, BIT(1), 1e9, true, &c);
  near("AllReduce = 2 V / W_bi", c.time_s, 2e9 / 9e10, 1e-9);
  near("AllReduce bytes_per_device = 2 (n-1)/n V", c.bytes_per_device, 2e9 * 15 / 16, 1e-12);
  ut_end();
}

/* sharding.md: an AllToAll is 1/4 of an AllGather on a bidirectional ring, 1/2 on a one-way one. */
static void test_all_to_all_tpu(void) {
  ut_begin("AllToAll: V / (4 W_bi) on a full ring, half an AllGather on an open one");
  Mesh m = mesh(&V5E, 2, AX(ici("X", &V5E, false, 4, 1, 1), ici("Y", &V5E, true, 1, 16, 1)));
  double v = 1e9; /* the whole array; each device holds v / n before and after */
  CollCost c;
  cost_collective(&m, COLL_ALL_TO_ALL, BIT(1), v / 16, true, &c);
  near("closed ring: V / (4 W_bi)", c.time_s, v / (4 * 9e10), 1e-9);
  near("= AllGather / 4", c.time_s, ag(&m, BIT(1), v, true, NULL) / 4, 1e-9);
  near("bytes_per_device = (n-1)/n local shard", c.bytes_per_device, v / 16 * 15 / 16, 1e-12);
  near("array_bytes = n x shard", c.array_bytes, v, 1e-12);
  cost_collective(&m, COLL_ALL_TO_ALL, BIT(0), v / 4, true, &c);
  near("open ring: half an AllGather", c.time_s, v / 4.5e10 * 3 / 4 / 2, 1e-9);
  ut_end();
}

/* hardware-and-costs.md: an axis spanning several torus dims: bandwidth-bound time / dims. */
static void test_two_torus_dims(void) {
  ut_begin("an axis spanning 2 torus dims halves the bandwidth-bound time");
  Mesh one = mesh(&V5E, 2, AX(ici("x", &V5E, true, 16, 1, 1), ici("y", &V5E, true, 1, 16, 1)));
  Mesh both = mesh(&V5E, 1, AX(ici("all", &V5E, true, 16, 16, 1)));
  double v = 1e9;
  CollCost c;
  double t2 = ag(&both, BIT(0), v, true, &c);
  double t1 = ag(&one, BIT(0), v, true, NULL);
  near("half the time", t2, t1 / 2, 1e-9);
  near("V / (2 W_bi)", t2, v / (2 * 9e10), 1e-9);
  near("16 hops on the longest path", c.latency_s, 16e-6, 1e-9);
  near("= AllGather over both axes of the 16x16 mesh", t2, ag(&one, BIT(0) | BIT(1), v, true, NULL),
       1e-9);
  /* An open axis over two dims (a v5e 4x4 slice): V/W (X-1)/X / 2. */
  Mesh open = mesh(&V5E, 1, AX(ici("all", &V5E, false, 4, 4, 1)));
  near("open 4x4 axis", ag(&open, BIT(0), v, true, NULL), v / 4.5e10 * 15 / 16 / 2, 1e-9);
  ut_end();
}

/* DCN: W = dcn_bw per chip, no wraparound (v5e 3.125e9). */
static void test_dcn(void) {
  ut_begin("DCN: AllReduce across 2 v5e slices, and the hierarchical DCN + ICI AllReduce");
  Mesh m = mesh(&V5E, 3, AX(dcn("slice", &V5E, 2, 10e-6), ici("x", &V5E, true, 16, 1, 1),
                           ici("y", &V5E, true, 1, 16, 1)));
  double v = 1e8;
  CollCost c;
  double t = cost_collective(&m, COLL_ALL_REDUCE, BIT(0), v, true, &c);
  near("AllReduce over 2 slices = 2 V/W (X-1)/X", t, 2 * v / 3.125e9 / 2, 1e-9);
  ut_true("rides DCN", c.link == LINK_DCN && strcmp(c.link_name, "DCN") == 0);
  near("link bandwidth", c.link_bw, 3.125e9, 1e-9);
  /* Hierarchical: ReduceScatter over ICI, AllReduce of the 1/256 shard over DCN, AllGather. */
  t = cost_collective(&m, COLL_ALL_REDUCE, BIT(0) | BIT(1) | BIT(2), v, true, &c);
  double ici_phase = v / (2 * 4.5e10 * 2);         /* both ICI rings: W_bi + W_bi */
  double dcn_phase = (v / 256) / 3.125e9 / 2;      /* open 2-ring on the shard */
  near("hierarchical AllReduce", t, 2 * ici_phase + 2 * dcn_phase, 1e-9);
  ut_true("slowest link DCN", c.link == LINK_DCN);
  double seq = cost_collective(&m, COLL_ALL_REDUCE, BIT(0), v, true, NULL) +
               cost_collective(&m, COLL_ALL_REDUCE, BIT(1) | BIT(2), v, true, NULL);
  ut_true("faster than AllReduce over DCN then over ICI", t < seq);
  ut_end();
}

/* hardware-and-costs.md / gpus.md: an AllGather of bf16[4096, 65536] in an H100 node: 1.04 ms at
 * peak, about 1.5 ms measured. */
static void test_h100_node_allgather(void) {
  ut_begin("H100 node AllGather of bf16[4096, 65536]: 1.04 ms ideal, ~1.5 ms calibrated");
  Mesh m = mesh(&H100, 1, AX(gax("tp", 8)));
  double v = 4096.0 * 65536 * 2;
  CollCost c;
  double t = ag(&m, BIT(0), v, true, &c);
  near("V (N-1) / (N W)", t, v * 7 / (8 * 4.5e11), 1e-9);
  near("the doc's 1.04 ms", t, 1.04e-3, 0.005);
  ut_true("rides NVLink", c.link == LINK_NVLINK && strcmp(c.link_name, "NVLink") == 0);
  double tc = ag(&m, BIT(0), v, false, &c);
  near("calibrated vs measured 1.5 ms", tc, 1.5e-3, 0.10);
  ut_true("calibrated slower than ideal", tc > t);
  ut_end();
}

/* gpus.md: a 58 MB AllReduce (LLaMA-3 70B's MLP, 8-way: bf16[8192, 3584]) in an H100 node reaches
 * about 150 GB/s of bus bandwidth (2 V (N-1) / (N T)) against 450 GB/s peak. */
static void test_h100_allreduce_58mb(void) {
  ut_begin("H100 node AllReduce of 58 MB calibrated: ~150 GB/s effective (370 GB/s at 10 GB)");
  Mesh m = mesh(&H100, 1, AX(gax("tp", 8)));
  double v = 8192.0 * 3584 * 2;
  double ti = cost_collective(&m, COLL_ALL_REDUCE, BIT(0), v, true, NULL);
  near("ideal 2 V (N-1) / (N W)", ti, 2 * v * 7 / (8 * 4.5e11), 1e-9);
  double tc = cost_collective(&m, COLL_ALL_REDUCE, BIT(0), v, false, NULL);
  near("calibrated bus bandwidth ~150 GB/s", 2 * v * 7 / 8 / tc, 150e9, 0.10);
  /* "close to 370 GB/s ... only around 10 GB" */
  double big = 10e9, tb = cost_collective(&m, COLL_ALL_REDUCE, BIT(0), big, false, NULL);
  near("bus bandwidth at 10 GB ~370 GB/s", 2 * big * 7 / 8 / tb, 370e9, 0.10);
  ut_end();
}

/* gpus.md Pop Quiz 1: AllGather(bf16[B_X, F]) in an 8xH100 node, B = 1024, F = 16384: 65 us; and the
 * in-node AllToAll B (N-1) / (N^2 W). */
static void test_h100_quiz1_and_alltoall(void) {
  ut_begin("H100 node: AllGather 65 us (Pop Quiz 1); AllToAll B (N-1) / (N^2 W)");
  Mesh m = mesh(&H100, 1, AX(gax("x", 8)));
  double v = 2.0 * 1024 * 16384;
  near("Pop Quiz 1: 65 us", ag(&m, BIT(0), v, true, NULL), 65e-6, 0.01);
  CollCost c;
  cost_collective(&m, COLL_ALL_TO_ALL, BIT(0), v / 8, true, &c);
  near("AllToAll B (N-1) / (N^2 W)", c.time_s, v * 7 / (64 * 4.5e11), 1e-9);
  near("bytes_per_device (n-1)/n shard", c.bytes_per_device, v / 8 * 7 / 8, 1e-12);
  ut_end();
}

/* gpus.md Quiz 4 Q5: AllGather of B bytes over exactly 2 nodes: B 7/(8 x 450e9) = B / 514e9 in the
 * node vs B (2-1)/(2 x 400e9) = B / 800e9 across: bounded by the node level. */
static void test_h100_two_nodes(void) {
  ut_begin("H100 AllGather over 2 full nodes: NVLink-bound B / 514e9 (Quiz 4 Q5); AllToAll B(M-1)/(M^2 W_node)");
  Mesh m = mesh(&H100, 1, AX(gax("dp", 16)));
  double v = 1e9;
  CollCost c;
  double t = ag(&m, BIT(0), v, true, &c);
  near("max(B/514e9, B/800e9)", t, v * 7 / (8 * 4.5e11), 1e-9);
  near("the book's B / 514e9", t, v / 514e9, 0.001);
  ut_true("crosses nodes: network", c.link == LINK_NETWORK);
  /* gpus.md cross-node AllToAll over 2 full nodes: B (M-1) / (M^2 W_node), W_node = 8 x 50e9. */
  cost_collective(&m, COLL_ALL_TO_ALL, BIT(0), v / 16, true, &c);
  near("AllToAll over 2 nodes", c.time_s, v * 1 / (4 * 8 * 5e10), 1e-9);
  ut_end();
}

/* An axis whose devices are one per node (stride >= node size) rides one NIC per GPU; one whose
 * devices share nodes (per_node > 1) gets per_node NICs per node. gpus.md Pop Quiz 3: AllGather_X of
 * bf16[D_X, F_Y] over an SU (256 GPUs, 32 nodes), Y inner: Y <= 8: 2DF (32-1)/(32 x 400e9) whatever
 * Y; Y > 8: about 2DF / (Y x 50e9). */
static void test_h100_one_per_node(void) {
  ut_begin("H100: axes one GPU per node vs straddling nodes (gpus.md Pop Quiz 3)");
  double d = 8192, f = 32768;
  Mesh m = mesh(&H100, 2, AX(gax("dp", 4), gax("tp", 8)));
  ut_true("dp one per node", m.axes[0].per_node == 1 && m.axes[0].link == LINK_NETWORK);
  double v = 1e9;
  near("dp AllGather V (M-1)/(M network_bw)", ag(&m, BIT(0), v, true, NULL), v * 3 / (4 * 5e10),
       1e-9);
  for (int y = 2; y <= 8; y *= 2) {
    Mesh su = mesh(&H100, 2, AX(gax("X", 256 / y), gax("Y", y)));
    double t = ag(&su, BIT(0), 2 * d * f / y, true, NULL);
    near("Y <= 8: 2DF 31 / (32 x 400e9)", t, 2 * d * f * 31 / (32 * 400e9), 1e-9);
  }
  Mesh su16 = mesh(&H100, 2, AX(gax("X", 16), gax("Y", 16)));
  double t16 = ag(&su16, BIT(0), 2 * d * f / 16, true, NULL);
  near("Y = 16: exact (M-1)/M form", t16, 2 * d * f / 16 * 15 / (16 * 5e10), 1e-9);
  near("Y = 16: the book's 2DF / (Y 50e9)", t16, 2 * d * f / (16 * 5e10), 1.0 / 16 + 1e-9);
  ut_end();
}

static void test_permute(void) {
  ut_begin("collective_permute: one hop, bytes / W + latency");
  Mesh m = mesh(&V5E, 2, AX(ici("x", &V5E, true, 16, 1, 1), ici("y", &V5E, true, 1, 16, 1)));
  CollCost c;
  double b = 1e7;
  cost_collective(&m, COLL_PERMUTE, BIT(0), b, true, &c);
  near("one hop: bytes / W + T_hop", c.time_s, b / 4.5e10 + 1e-6, 1e-9);
  near("bytes_per_device = bytes", c.bytes_per_device, b, 1e-12);
  Mesh g = mesh(&H100, 2, AX(gax("stage", 4), gax("tp", 8)));
  cost_collective(&g, COLL_PERMUTE, BIT(0), b, true, &c);
  near("across nodes: bytes / network_bw + alpha", c.time_s, b / 5e10 + 3e-6, 1e-9);
  ut_end();
}

/* Calibrated: the alpha-beta form, latency + bandwidth / efficiency (docs/cost-model.md): the
 * book's profile of Pop Quiz 2 (an open 4-ring of v5e, bf16[256, 256]: ~8 us measured against
 * 3 us at the formula) is what the max() form misses. */
static void test_calibrated_tpu(void) {
  ut_begin("calibrated collectives: T_hop hops + V / (W peak x coll_eff_max x V / (V + half))");
  Mesh m = mesh(&V5E, 2, AX(ici("x", &V5E, true, 16, 1, 1), ici("y", &V5E, true, 1, 16, 1)));
  double v = 2048.0 * 8192 * 2;
  CollCost c;
  double t = ag(&m, BIT(0), v, false, &c);
  double eff = 0.95 * v / (v + 2e5);
  near("8 hops + V / (W_bi max V / (V + half))", t, 8e-6 + v / (2 * 4.5e10 * eff), 1e-9);
  near("efficiency reported", c.efficiency, eff, 1e-9);
  near("link bandwidth as used", c.link_bw, 4.5e10 * eff, 1e-9);
  ut_true("calibrated slower than ideal", t > ag(&m, BIT(0), v, true, NULL));
  /* Latency is not scaled by the efficiency; small arrays pay it in full plus their slow bytes. */
  double small = 64, es = 0.95 * small / (small + 2e5);
  near("latency-bound: hops + bytes", ag(&m, BIT(0), small, false, NULL), 8e-6 + small / (9e10 * es), 1e-9);
  /* Pop Quiz 2b measured ~8 us: 3 hops + 131 KB at the curve's 38% lands within 15% of it. */
  Mesh q = mesh(&V5E, 2, AX(ici("X", &V5E, false, 8, 1, 1), ici("Y", &V5E, false, 1, 4, 1)));
  double vq = 256.0 * 256 * 2, eq = 0.95 * vq / (vq + 2e5);
  double tq = ag(&q, BIT(1), vq, false, NULL);
  near("open 4-ring bf16[256,256]: 3 us + V/W 3/4 / eff", tq, 3e-6 + vq / 4.5e10 * 3 / 4 / eq, 1e-9);
  near("the book's measured ~8 us", tq, 8e-6, 0.15);
  ut_end();
}

static void test_bytes_per_device(void) {
  ut_begin("bytes_per_device as language.md defines it for explain's JSON");
  Mesh m = mesh(&V4, 3, AX(ici("X", &V4, true, 4, 1, 1), ici("Y", &V4, true, 1, 4, 1),
                           ici("Z", &V4, true, 1, 1, 4)));
  double v = 1e6;
  CollCost c;
  uint16_t xy = BIT(0) | BIT(1);
  cost_collective(&m, COLL_ALL_GATHER, xy, v, true, &c);
  near("AllGather (n-1)/n x gathered", c.bytes_per_device, v * 15 / 16, 1e-12);
  ut_true("n = 16", c.n == 16);
  cost_collective(&m, COLL_REDUCE_SCATTER, xy, v, true, &c);
  near("ReduceScatter (n-1)/n x input", c.bytes_per_device, v * 15 / 16, 1e-12);
  cost_collective(&m, COLL_ALL_REDUCE, xy, v, true, &c);
  near("AllReduce 2(n-1)/n x array", c.bytes_per_device, 2 * v * 15 / 16, 1e-12);
  cost_collective(&m, COLL_ALL_TO_ALL, xy, v, true, &c);
  near("AllToAll (n-1)/n x local shard", c.bytes_per_device, v * 15 / 16, 1e-12);
  ut_end();
}

static void test_bad_input(void) {
  ut_begin("bad inputs return 0 without crashing");
  Mesh m = mesh(&V5E, 2, AX(ici("x", &V5E, true, 16, 1, 1), ici("y", &V5E, true, 1, 16, 1)));
  CollCost c;
  ut_true("NULL mesh", cost_collective(NULL, COLL_ALL_GATHER, 1, 1e6, true, &c) == 0 && c.n == 1);
  ut_true("no bytes", cost_collective(&m, COLL_ALL_GATHER, 1, 0, true, &c) == 0);
  ut_true("negative bytes", cost_collective(&m, COLL_ALL_GATHER, 1, -5, true, &c) == 0);
  ut_true("NaN bytes", cost_collective(&m, COLL_ALL_GATHER, 1, (double)NAN, true, &c) == 0);
  ut_true("empty group", cost_collective(&m, COLL_ALL_REDUCE, 0, 1e6, true, &c) == 0 && c.n == 1);
  ut_true("bad kind", cost_collective(&m, (CollKind)99, 1, 1e6, true, &c) == 0);
  ut_true("bits beyond the mesh ignored",
          cost_collective(&m, COLL_ALL_GATHER, 0xfff1, 1e6, true, NULL) ==
              cost_collective(&m, COLL_ALL_GATHER, 1, 1e6, true, NULL));
  Mesh one = mesh(&V5E, 2, AX(ici("r", &V5E, false, 1, 1, 1), ici("x", &V5E, true, 16, 1, 1)));
  ut_true("size-1 axis is free", cost_collective(&one, COLL_ALL_GATHER, 1, 1e6, true, NULL) == 0);
  ut_true("NULL out accepted", cost_collective(&m, COLL_ALL_GATHER, 1, 1e6, true, NULL) > 0);
  ut_true("op time NULL target", cost_op_time(NULL, DT_BF16, 1, 1, true) == 0);
  ut_end();
}

/* ---- multi-axis never slower than the axes one after another ---- */

static double chain(const Mesh *m, CollKind kind, const int *order, int k, double bytes, bool ideal) {
  double t = 0;
  if (kind == COLL_ALL_GATHER) { /* stage i leaves the array still sharded over the later axes */
    for (int i = 0; i < k; i++) {
      double rest = 1;
      for (int j = i + 1; j < k; j++) rest *= m->axes[order[j]].size;
      t += cost_collective(m, kind, BIT(order[i]), bytes / rest, ideal, NULL);
    }
  } else if (kind == COLL_REDUCE_SCATTER) { /* stage i reduces what earlier stages left */
    double in = bytes;
    for (int i = 0; i < k; i++) {
      t += cost_collective(m, kind, BIT(order[i]), in, ideal, NULL);
      in /= m->axes[order[i]].size;
    }
  } else if (kind == COLL_ALL_TO_ALL) { /* the local shard keeps its size */
    for (int i = 0; i < k; i++) t += cost_collective(m, kind, BIT(order[i]), bytes, ideal, NULL);
  } else if (kind == COLL_ALL_REDUCE) { /* an AllReduce per axis, each on the whole array */
    for (int i = 0; i < k; i++) t += cost_collective(m, kind, BIT(order[i]), bytes, ideal, NULL);
  }
  return t;
}

static bool next_permutation(int *a, int n) {
  int i = n - 2;
  while (i >= 0 && a[i] >= a[i + 1]) i--;
  if (i < 0) return false;
  int j = n - 1;
  while (a[j] <= a[i]) j--;
  int tmp = a[i];
  a[i] = a[j], a[j] = tmp;
  for (int l = i + 1, r = n - 1; l < r; l++, r--) tmp = a[l], a[l] = a[r], a[r] = tmp;
  return true;
}

/* Compares every multi-axis collective of m with every sequential order; returns the number of
 * comparisons and records failures in the current case. */
static int never_slower(const Mesh *m) {
  int checked = 0;
  double sizes[] = {256, 6e4, 3e6, 2e8, 5e10};
  for (unsigned mask = 1; mask < (1u << m->naxes); mask++) {
    int order[MAX_MESH_AXES], k = 0;
    for (int a = 0; a < m->naxes; a++)
      if (mask & (1u << a)) order[k++] = a;
    if (k < 2) continue;
    for (int kind = COLL_ALL_GATHER; kind <= COLL_ALL_TO_ALL; kind++)
      for (int si = 0; si < 5; si++)
        for (int ideal = 0; ideal < 2; ideal++) {
          double b = sizes[si];
          double multi = cost_collective(m, (CollKind)kind, (uint16_t)mask, b, ideal, NULL);
          int perm[MAX_MESH_AXES];
          memcpy(perm, order, sizeof perm);
          do {
            double seq = chain(m, (CollKind)kind, perm, k, b, ideal);
            if (kind == COLL_ALL_REDUCE) { /* also ReduceScatter chain + AllGather chain back */
              int rev[MAX_MESH_AXES];
              for (int i = 0; i < k; i++) rev[i] = perm[k - 1 - i];
              double rsag = chain(m, COLL_REDUCE_SCATTER, perm, k, b, ideal) +
                            chain(m, COLL_ALL_GATHER, rev, k, b, ideal);
              if (rsag < seq) seq = rsag;
            }
            checked++;
            if (multi > seq * (1 + 1e-9)) {
              ut_fail("%s mask 0x%x bytes %g %s: multi %.6g > sequential %.6g",
                      coll_kind_name((CollKind)kind), mask, b, ideal ? "ideal" : "calibrated", multi,
                      seq);
            }
          } while (next_permutation(perm, k));
        }
  }
  return checked;
}

static void check_never_slower(const char *name, const Mesh *m) {
  ut_begin(NULL);
  int checked = never_slower(m);
  ut_true("something checked", checked > 0);
  char full[256];
  snprintf(full, sizeof full, "multi-axis never slower than sequential: %s (%d comparisons)", name,
           checked);
  ut_end_as(full);
}

static void test_never_slower(void) {
  Mesh a = mesh(&V5E, 2, AX(ici("x", &V5E, true, 16, 1, 1), ici("y", &V5E, true, 1, 16, 1)));
  check_never_slower("v5e 16x16", &a);
  Mesh b = mesh(&V5E, 3, AX(dcn("slice", &V5E, 4, 10e-6), ici("x", &V5E, false, 4, 1, 1),
                           ici("y", &V5E, true, 1, 16, 1)));
  check_never_slower("v5e 4 slices x (open 4, ring 16)", &b);
  Mesh c = mesh(&V5P, 4, AX(dcn("pod", &V5P, 2, 10e-6), dcn("dc", &V5P, 3, 20e-6),
                           ici("fsdp", &V5P, true, 16, 16, 1), ici("tp", &V5P, false, 1, 1, 2)));
  check_never_slower("v5p 2x3 DCN x (2-dim ring, open 2)", &c);
  Mesh d = mesh(&H100, 3, AX(gax("dp", 8), gax("ep", 16), gax("tp", 4)));
  check_never_slower("H100 512 GPUs: dp one per node, ep straddling, tp in node", &d);
  Mesh e = mesh(&H100, 4, AX(gax("a", 4), gax("b", 2), gax("c", 2), gax("d", 2)));
  check_never_slower("H100 32 GPUs: 4 nodes x (2x2x2 in node)", &e);
}

static unsigned rng_state = 12345;
static int rnd(int n) { /* 0..n-1, a fixed LCG so the sweep is the same every run */
  rng_state = rng_state * 1103515245u + 12345u;
  return (int)((rng_state >> 16) % (unsigned)n);
}

/* 300 pseudo-random meshes: TPU axes over 1-3 torus dims, open or closed, mixed with DCN axes of
 * different latencies; GPU axes of power-of-two sizes inside, across and straddling nodes. */
static void test_never_slower_random(void) {
  ut_begin(NULL);
  int checked = 0;
  for (int trial = 0; trial < 300; trial++) {
    MeshAxis axes[4];
    int naxes = 2 + rnd(3);
    bool is_gpu = trial % 3 == 2;
    const Target *t = is_gpu ? &H100 : (trial % 3 ? &V5P : &V5E);
    for (int i = 0; i < naxes; i++) {
      if (is_gpu) {
        axes[i] = gax("g", 1 << (1 + rnd(4)));
      } else if (rnd(4) == 0) {
        axes[i] = dcn("d", t, 2 + rnd(3), 1e-6 * (1 + rnd(50)));
      } else {
        int e[3] = {1, 1, 1}, dims = 1 + rnd(3);
        for (int d = 0; d < dims; d++) e[d] = 1 << (1 + rnd(4));
        axes[i] = ici("i", t, rnd(2) == 0, e[0], e[1], e[2]);
      }
    }
    Mesh m = mesh(t, naxes, axes);
    checked += never_slower(&m);
  }
  ut_true("something checked", checked > 0);
  char full[160];
  snprintf(full, sizeof full, "multi-axis never slower than sequential: 300 random meshes (%d comparisons)",
           checked);
  ut_end_as(full);
}

/* ---- the contract with mesh.c ---- */

/* Forms `axes` (names and sizes only) with mesh.c's mesh_form. */
static bool formed(const Target *t, int naxes, const MeshAxis *axes, Mesh *out) {
  memset(out, 0, sizeof *out);
  out->name = "formed";
  out->target = t;
  out->naxes = naxes;
  for (int i = 0; i < naxes; i++) {
    out->axes[i].name = axes[i].name;
    out->axes[i].size = axes[i].size;
  }
  return mesh_form(out);
}

/* Every kind, mask, size and mode costs the same on the formed mesh as on the hand-built one. */
static void same_costs(const char *what, const Mesh *a, const Mesh *b) {
  double sizes[] = {512, 1e6, 1e9};
  for (unsigned mask = 1; mask < (1u << a->naxes); mask++)
    for (int kind = 0; kind < COLL__COUNT; kind++)
      for (int si = 0; si < 3; si++)
        for (int ideal = 0; ideal < 2; ideal++) {
          double ta = cost_collective(a, (CollKind)kind, (uint16_t)mask, sizes[si], ideal, NULL);
          double tb = cost_collective(b, (CollKind)kind, (uint16_t)mask, sizes[si], ideal, NULL);
          if (fabs(ta - tb) <= 1e-12 * fabs(tb)) continue;
          ut_fail("%s: %s mask 0x%x bytes %g: formed %.6g, hand-built %.6g", what,
                  coll_kind_name((CollKind)kind), mask, sizes[si], ta, tb);
          return;
        }
}

static void test_mesh_form_agrees(void) {
  ut_begin("mesh.c's mesh_form fills MeshAxis as this model reads it (same costs as hand-built axes)");
  Target v5e = V5E, h100 = H100;
  v5e.torus[0] = v5e.torus[1] = 16, v5e.ntorus = 2, v5e.wrap_multiple = 16;
  Mesh f, h;
  const MeshAxis *pod = AX(ici("x", &v5e, true, 1, 16, 1), ici("y", &v5e, true, 16, 1, 1));
  ut_true("v5e 16x16 forms", formed(&v5e, 2, pod, &f));
  h = mesh(&v5e, 2, pod);
  same_costs("v5e [x:16, y:16]", &f, &h);
  ut_true("ring closes", f.axes[0].wraparound && f.axes[1].wraparound && f.axes[0].torus_dims == 1);
  const MeshAxis *sub = AX(ici("data", &v5e, false, 4, 1, 1), ici("model", &v5e, false, 4, 1, 1));
  ut_true("v5e [data:4, model:4] forms", formed(&v5e, 2, sub, &f));
  h = mesh(&v5e, 2, sub);
  same_costs("v5e [data:4, model:4]", &f, &h);
  const MeshAxis *whole = AX(ici("all", &v5e, true, 16, 16, 1));
  ut_true("v5e [all:256] forms", formed(&v5e, 1, whole, &f) && f.axes[0].torus_dims == 2);
  h = mesh(&v5e, 1, whole);
  same_costs("v5e [all:256]", &f, &h);
  const MeshAxis *two = AX(dcn("slice", &v5e, 2, 1e-6), ici("x", &v5e, true, 1, 16, 1),
                           ici("y", &v5e, true, 16, 1, 1));
  ut_true("v5e 2 slices forms", formed(&v5e, 3, two, &f) && f.axes[0].link == LINK_DCN);
  h = mesh(&v5e, 3, two);
  same_costs("v5e [slice:2, x:16, y:16]", &f, &h);
  const MeshAxis *g1 = AX(gax("dp", 4), gax("tp", 8));
  ut_true("H100 [dp:4, tp:8] forms", formed(&h100, 2, g1, &f));
  h = mesh(&h100, 2, g1);
  same_costs("H100 [dp:4, tp:8]", &f, &h);
  const MeshAxis *g2 = AX(gax("dp", 2), gax("ep", 16), gax("tp", 4));
  ut_true("H100 [dp:2, ep:16, tp:4] forms", formed(&h100, 3, g2, &f) && f.axes[1].per_node == 2);
  h = mesh(&h100, 3, g2);
  same_costs("H100 [dp:2, ep:16, tp:4]", &f, &h);
  ut_end();
}

/* ---- rooflines and thresholds ---- */

static void test_rooflines(void) {
  ut_begin("rooflines: max(FLOPs / peak, bytes / HBM); critical intensity v5e ~240, H100 ~295");
  double n = 4096, flops = 2 * n * n * n, bytes = 3 * n * n * 2;
  near("compute-bound matmul on v5e", cost_op_time(&V5E, DT_BF16, flops, bytes, true),
       flops / 1.97e14, 1e-12);
  near("calibrated x matmul_efficiency", cost_op_time(&V5E, DT_BF16, flops, bytes, false),
       flops / (1.97e14 * 0.95), 1e-12);
  near("memory-bound op", cost_op_time(&V5E, DT_BF16, 1e6, 1e9, true), 1e9 / 8.1e11, 1e-12);
  near("memory-bound calibrated: HBM at peak", cost_op_time(&V5E, DT_BF16, 1e6, 1e9, false),
       1e9 / 8.1e11, 1e-12);
  near("int8 peak", cost_peak_flops(&V5E, DT_I8, true), 3.94e14, 1e-12);
  near("f8 not given: falls back to bf16", cost_peak_flops(&V5E, DT_F8E4M3, true), 1.97e14, 1e-12);
  near("H100 f8 peak", cost_op_time(&H100, DT_F8E4M3, 1.98e15, 0, true), 1.0, 1e-12);
  near("v5e critical intensity ~240", cost_arithmetic_intensity_threshold(&V5E), 240, 0.02);
  near("v5e = 1.97e14 / 8.1e11", cost_arithmetic_intensity_threshold(&V5E), 1.97e14 / 8.1e11, 1e-12);
  near("H100 critical intensity ~295", cost_arithmetic_intensity_threshold(&H100), 295, 0.01);
  ut_end();
}

/* training.md: DP/FSDP compute-bound when B/X > C/W: 2550 on v5p over one ICI axis, 850 over
 * three; TP when F/Y > 2550; mixed FSDP + TP down to 4 alpha^2 / (F M_X M_Y) = 2 x 2550^2 / F. */
static void test_tpu_thresholds(void) {
  ut_begin("TPU thresholds: DP 2550 / 850, TP F/Y > 2550, FSDP+TP 2 x 2550^2 / F, DCN ~75,000");
  Mesh one = mesh(&V5P, 1, AX(ici("data", &V5P, true, 16, 1, 1)));
  near("DP over one v5p axis: 2550", cost_dp_threshold(&one, BIT(0), true), 4.59e14 / 1.8e11, 1e-9);
  near("the book's 2550", cost_dp_threshold(&one, BIT(0), true), 2550, 0.001);
  Mesh three = mesh(&V5P, 1, AX(ici("data", &V5P, true, 16, 16, 16)));
  near("DP over three torus dims: 850", cost_dp_threshold(&three, BIT(0), true), 850, 0.001);
  near("TP threshold (F/Y > 2550)", cost_tp_threshold(&one, BIT(0), true), 2550, 0.001);
  /* LLaMA-3 70B, F ~ 30000: Y < F / 2550 ~ 11.8 on one axis */
  near("max TP degree for F = 30000", 30000 / cost_tp_threshold(&one, BIT(0), true), 30000 / 2550.0,
       0.001);
  Mesh mixed = mesh(&V5P, 2, AX(ici("fsdp", &V5P, true, 16, 16, 1), ici("tp", &V5P, true, 1, 1, 16)));
  double th = cost_fsdp_tp_threshold(&mixed, BIT(0), BIT(1), 30000, true);
  near("mixed FSDP + TP: 2 x 2550^2 / F", th, 2 * 2550.0 * 2550 / 30000, 0.001);
  near("the book's 432 for LLaMA-3 70B", th, 432, 0.01);
  /* DCN: 4.59e14 / 6.25e9 = 73,440 per pod as X grows (the book: ~75,000, 76,000) */
  Mesh pods = mesh(&V5P, 2, AX(dcn("pod", &V5P, 16, 10e-6), ici("data", &V5P, true, 16, 1, 1)));
  double tdcn = cost_dp_threshold(&pods, BIT(0), true);
  near("DCN DP over 16 pods: C/W (X-1)/X", tdcn, 4.59e14 / 6.25e9 * 15 / 16, 1e-9);
  near("the book's ~75,000 per pod", tdcn, 75000, 0.10);
  near("calibrated: x matmul_eff / coll_eff_max", cost_dp_threshold(&one, BIT(0), false),
       2550 * 0.95 / 0.95, 0.001);
  ut_true("empty group", cost_dp_threshold(&one, 0, true) == 0);
  ut_end();
}

/* gpus.md: DP needs B/X > C / W_collective: 990e12/450e9 = 2200 in a node (x 7/8 exactly), and
 * 990e12/413e9 = 2397 across a 32-node SU (the book's precise leaf-level bandwidth; 2475 rough). */
static void test_gpu_thresholds(void) {
  ut_begin("GPU thresholds: DP ~2200 in a node, ~2400 across nodes; TP F/Y > C/W");
  Mesh node = mesh(&H100, 1, AX(gax("dp", 8)));
  double in = cost_dp_threshold(&node, BIT(0), true);
  near("in a node: C/W x 7/8", in, 9.9e14 / 4.5e11 * 7 / 8, 1e-9);
  near("the book's 2200 (N -> inf)", in, 2200, 0.13);
  Mesh su = mesh(&H100, 1, AX(gax("dp", 256)));
  double across = cost_dp_threshold(&su, BIT(0), true);
  near("across 32 nodes: C / (W_node 32/31)", across, 9.9e14 / (4e11 * 32 / 31), 1e-9);
  near("the book's 990e12 / 413e9", across, 9.9e14 / 413e9, 0.002);
  near("the book's rough 2475", across, 2475, 0.04);
  /* DP across nodes with 8-way TP inside: the threshold is on each TP group's tokens; per GPU it is
   * the same 2397 (gpus.md: "Any form of model parallelism that spans multiple nodes ..."). */
  Mesh dptp = mesh(&H100, 2, AX(gax("dp", 32), gax("tp", 8)));
  near("DP x TP8: per TP group = 8 x per GPU", cost_dp_threshold(&dptp, BIT(0), true) / 8, across,
       1e-9);
  /* TP in a node: Y < F W / C (F / 2200 in the book; x 8/7 exactly). */
  near("TP threshold in node", cost_tp_threshold(&node, BIT(0), true), 9.9e14 / 4.5e11 * 7 / 8, 1e-9);
  ut_end();
}


/* ---- calibrated compute (compute.c) ---- */

/* Ideal mode is the roofline at peak and nothing else: cost_matmul = cost_op_time. */
static void test_matmul_ideal(void) {
  ut_begin("matmul ideal: 2 m n k / peak vs bytes / HBM, exactly cost_op_time's roofline");
  MatmulShape big = {8192, 8192, 8192, 1};
  OpTime c;
  double bytes = cost_matmul_bytes(DT_BF16, big);
  near("bytes = (mk + kn + mn) x 2", bytes, 3 * 8192.0 * 8192 * 2, 1e-12);
  double t = cost_matmul(&H100, DT_BF16, big, bytes, true, &c);
  near("2 m n k / 9.9e14", t, 2 * 8192.0 * 8192 * 8192 / 9.9e14, 1e-12);
  near("= cost_op_time", t, cost_op_time(&H100, DT_BF16, 2 * 8192.0 * 8192 * 8192, bytes, true), 1e-12);
  ut_true("efficiency 1, no overhead", c.efficiency == 1 && c.overhead_s == 0 && c.exec_flops == c.flops);
  /* decode-shaped: 8 rows against a 8192x8192 weight: memory-bound at peak HBM */
  MatmulShape skinny = {8, 8192, 8192, 1};
  double sb = cost_matmul_bytes(DT_BF16, skinny);
  t = cost_matmul(&V5E, DT_BF16, skinny, sb, true, &c);
  near("skinny: bytes / hbm_bw", t, sb / 8.1e11, 1e-12);
  ut_true("memory-bound", c.memory_bound);
  near("batched: batch x flops", cost_matmul(&V5E, DT_BF16, (MatmulShape){4096, 4096, 4096, 8}, 0, true, NULL),
       8 * 2 * 4096.0 * 4096 * 4096 / 1.97e14, 1e-12);
  ut_end();
}

/* Calibrated: ceiling x padding x waves x fill, derived by hand per target. */
static void test_matmul_calibrated(void) {
  ut_begin("matmul calibrated: ceiling x padding to the tile x wave quantization x fill");
  /* H100, 8192^3: tiles 64 x 32 = 2048 over 132 SMs = 16 waves (2112 slots): 2048 / 2112;
   * fill along K: 8192 / (8192 + 128). */
  double want = 0.82 * (2048.0 / 2112) * (8192.0 / 8320);
  MatmulShape big = {8192, 8192, 8192, 1};
  near("H100 8192^3 efficiency", cost_matmul_efficiency(&H100, big, false), want, 1e-12);
  ut_true("within the book's 80-85% ceiling, above 0.7", want < 0.82 && want > 0.7);
  OpTime c;
  double bytes = cost_matmul_bytes(DT_BF16, big);
  double t = cost_matmul(&H100, DT_BF16, big, bytes, false, &c);
  near("time = flops / (peak eff) + 2 us", t, 2 * 8192.0 * 8192 * 8192 / (9.9e14 * want) + 2e-6, 1e-12);
  /* TPU v5e: N = 129 pads to 256 (MXU blocks of 128): efficiency x 129 / 256 */
  MatmulShape a = {4096, 128, 4096, 1}, b = {4096, 129, 4096, 1};
  near("v5e N 129 -> 256", cost_matmul_efficiency(&V5E, b, false) / cost_matmul_efficiency(&V5E, a, false),
       129.0 / 256, 1e-12);
  ut_true("N = 129 takes the time of N = 256",
          fabs(cost_matmul(&V5E, DT_BF16, b, 0, false, NULL) -
               cost_matmul(&V5E, DT_BF16, (MatmulShape){4096, 256, 4096, 1}, 0, false, NULL)) < 1e-15);
  /* v5e rows stream through the systolic array: fill 128 rows per weight block */
  near("v5e M fill", cost_matmul_efficiency(&V5E, (MatmulShape){256, 4096, 4096, 1}, false),
       0.95 * 256.0 / (256 + 128), 1e-12);
  /* v6e-like: a 256x256 MXU pads N = 128 to 256 (half idle), where v5e's 128x128 does not */
  Target v6e = V5E;
  v6e.matmul_tile[1] = v6e.matmul_tile[2] = 256;
  near("256x256 MXU: N 128 at half", cost_matmul_efficiency(&v6e, a, false),
       cost_matmul_efficiency(&V5E, a, false) / 2, 1e-12);
  /* small matmuls far below peak: 256^3 on H100 is 2 tiles on 132 SMs */
  double small = cost_matmul_efficiency(&H100, (MatmulShape){256, 256, 256, 1}, false);
  near("256^3: 2 of 132 SMs", small, 0.82 * 2.0 / 132 * 256 / 384, 1e-12);
  ut_true("far below peak (< 2%)", small < 0.02);
  /* efficiency never falls as a square matmul doubles (waves fill, fill amortises) */
  double prev = 0;
  for (double n = 128; n <= 32768; n *= 2) {
    double e = cost_matmul_efficiency(&H100, (MatmulShape){n, n, n, 1}, false);
    UT_CHECK(e >= prev - 1e-15, "H100 efficiency fell from %g to %g at n = %g", prev, e, n);
    prev = e;
  }
  prev = 0;
  for (double n = 128; n <= 32768; n *= 2) {
    double e = cost_matmul_efficiency(&V5P, (MatmulShape){n, n, n, 1}, false);
    UT_CHECK(e >= prev - 1e-15, "v5p efficiency fell from %g to %g at n = %g", prev, e, n);
    prev = e;
  }
  ut_true("v5p ceiling approached", prev > 0.94 && prev <= 0.95);
  /* a target without the keys runs at its ceiling (the old calibrated mode) */
  Target bare = H100;
  for (int d = 0; d < 3; d++) bare.matmul_tile[d] = 1, bare.matmul_fill[d] = 0;
  bare.matmul_units = 0;
  near("no keys: matmul_efficiency", cost_matmul_efficiency(&bare, (MatmulShape){100, 100, 100, 1}, false), 0.82, 1e-12);
  ut_end();
}

static void test_memory_ops_and_fusion(void) {
  ut_begin("memory-bound ops at hbm_efficiency; a fused chain moves only its external bytes");
  double x = 2.0 * 8 * 2048 * 4096; /* bf16[8, 2048, 4096] */
  OpTime c;
  near("ideal: bytes / hbm_bw", cost_memory_op(&H100, 2 * x, true, &c), 2 * x / 3.35e12, 1e-12);
  near("calibrated: bytes / (0.9 hbm_bw) + 2 us", cost_memory_op(&H100, 2 * x, false, &c),
       2 * x / (0.9 * 3.35e12) + 2e-6, 1e-12);
  ut_true("memory-bound", c.memory_bound);
  near("achieved HBM", cost_hbm_bandwidth(&H100, false), 0.9 * 3.35e12, 1e-12);
  /* gelu(x * a + b) as three ops: each reads its operands and writes its result (x-sized): add
   * and mul read two x-sized arrays when a, b broadcast from tiny vectors only one: 2x each. */
  double unfused = 0;
  for (int i = 0; i < 3; i++) unfused += cost_memory_op(&H100, 2 * x, false, NULL);
  double fused = cost_fused_chain(&H100, 2 * x, 3, false, &c);
  near("fused: x in, x out, one kernel", fused, 2 * x / (0.9 * 3.35e12) + 2e-6, 1e-12);
  near("unfused: three round trips, three kernels", unfused, 3 * (2 * x / (0.9 * 3.35e12) + 2e-6), 1e-12);
  ut_true("fusion saves 2/3", fused < unfused / 2.9);
  ut_true("empty chain", cost_fused_chain(&H100, 1e9, 0, false, NULL) == 0);
  ut_end();
}

/* Flash attention: FLOPs of the two contractions, HBM traffic of q, k, v, o only. */
static void test_attention(void) {
  ut_begin("fused attention as flash attention: no score matrix; backward 2x + recomputed scores");
  double b = 4, h = 32, s = 4096, d = 128;
  AttentionShape a = {b, h, 0, s, s, d, 0, true};
  OpTime c;
  double t = cost_attention(&H100, DT_BF16, a, false, true, &c);
  double fwd = 4 * b * h * s * s * d;
  near("forward FLOPs 4 B H S^2 D", c.flops, fwd, 1e-12);
  near("bytes: q k v o + f32 stats", c.bytes, 4 * b * s * h * d * 2 + b * h * s * 4, 1e-12);
  near("ideal: FLOPs / peak (no causal discount)", t, fwd / 9.9e14, 1e-12);
  double materialised = b * h * s * s * 2; /* one bf16 score matrix */
  ut_true("bytes far below one score matrix", c.bytes < materialised / 4);
  cost_attention(&H100, DT_BF16, a, true, true, &c);
  near("backward counts 2x forward", c.flops, 2 * fwd, 1e-12);
  near("backward bytes: q k v o dO stats dQ dK dV", c.bytes, 8 * b * s * h * d * 2 + b * h * s * 4, 1e-12);
  /* calibrated causal: 32 blocks of 128: 32 x 33 / 2 of 32^2 run */
  double run = 32.0 * 33 / 2 / (32 * 32);
  t = cost_attention(&H100, DT_BF16, a, false, false, &c);
  near("causal executed fraction", c.exec_flops, fwd * run, 1e-12);
  near("calibrated fwd: exec / (peak 0.6) + 2 us", t, fwd * run / (9.9e14 * 0.6) + 2e-6, 1e-12);
  near("kernel efficiency reported", c.efficiency, 0.6, 1e-12);
  double tb = cost_attention(&H100, DT_BF16, a, true, false, &c);
  near("backward executes 2.5x forward (recomputed QK^T)", c.exec_flops, 2.5 * fwd * run, 1e-12);
  near("calibrated bwd", tb, 2.5 * fwd * run / (9.9e14 * 0.6) + 2e-6, 1e-12);
  /* multi-query (PaLM): one K/V head: less HBM traffic, the same FLOPs */
  AttentionShape mq = a;
  mq.kv_heads = 1;
  cost_attention(&H100, DT_BF16, mq, false, true, &c);
  near("MQA bytes: q o full, k v one head", c.bytes, (2 * b * s * h * d + 2 * b * s * d) * 2 + b * h * s * 4, 1e-12);
  near("MQA flops unchanged", c.flops, fwd, 1e-12);
  /* not causal: every block */
  a.causal = false;
  cost_attention(&H100, DT_BF16, a, false, false, &c);
  near("non-causal runs all blocks", c.exec_flops, fwd, 1e-12);
  ut_end();
}

/* ---- calibrated communication: latency, hierarchy, group size, fabric ---- */

static void test_gpu_latency_bound(void) {
  ut_begin("GPU small messages are latency-bound: alpha x ring steps; AllReduce across nodes takes a tree");
  Mesh m = mesh(&H100, 2, AX(gax("dp", 64), gax("tp", 8)));
  CollCost c;
  double tiny = 1024;
  cost_collective(&m, COLL_ALL_REDUCE, BIT(0), tiny, true, &c);
  near("ideal: 2 x (64 - 1) ring steps x 3 us", c.latency_s, 2 * 63 * 3e-6, 1e-9);
  ut_true("ideal latency-bound", c.latency_bound);
  cost_collective(&m, COLL_ALL_REDUCE, BIT(0), tiny, false, &c);
  near("calibrated: tree over 64 nodes, 2 log2 64 steps x 3 us", c.latency_s, 2 * 6 * 3e-6, 1e-9);
  ut_true("calibrated latency-bound", c.latency_bound);
  /* whole mesh: in-node ring 2 x 7 x 1 us + tree across 64 nodes */
  cost_collective(&m, COLL_ALL_REDUCE, BIT(0) | BIT(1), tiny, false, &c);
  near("in-node ring + cross-node tree", c.latency_s, 2 * 7 * 1e-6 + 2 * 6 * 3e-6, 1e-9);
  /* AllGather keeps the ring: (64 - 1) steps */
  cost_collective(&m, COLL_ALL_GATHER, BIT(0), tiny, false, &c);
  near("AllGather ring steps", c.latency_s, 63 * 3e-6, 1e-9);
  /* calibrated = latency + bytes / achieved (alpha-beta), never the max; a tiny message goes at
   * the low-latency protocol's 25% */
  near("alpha-beta sum", c.time_s, 63 * 3e-6 + tiny * 63 / 64 / (5e10 * 0.25), 1e-9);
  /* the protocols cross where 0.815 V / (V + 8.4e7) = 0.25 (V = 37 MB): below, NVLink runs at 25% */
  Mesh node = mesh(&H100, 1, AX(gax("tp", 8)));
  double v1 = 1e6, v2 = 1e8;
  near("in-node 1 MB AllReduce at 25%: 14 us + 1.75 MB / 112.5 GB/s",
       cost_collective(&node, COLL_ALL_REDUCE, BIT(0), v1, false, NULL), 14e-6 + 2 * v1 * 7 / 8 / (4.5e11 * 0.25), 1e-9);
  near("in-node 100 MB AllReduce on the curve",
       cost_collective(&node, COLL_ALL_REDUCE, BIT(0), v2, false, NULL),
       14e-6 + 2 * v2 * 7 / 8 / (4.5e11 * 0.815 * v2 / (v2 + 8.4e7)), 1e-9);
  ut_end();
}

static void test_gpu_hierarchy(void) {
  ut_begin("GPU hierarchical collectives: cross-node slower than in-node; efficiency rises with size");
  Mesh node = mesh(&H100, 1, AX(gax("tp", 8)));
  Mesh spread = mesh(&H100, 2, AX(gax("dp", 8), gax("tp", 8))); /* dp: one GPU per node */
  Mesh two = mesh(&H100, 1, AX(gax("dp", 16)));                  /* 2 full nodes */
  double sizes[] = {1e4, 1e6, 1e8, 1e10};
  for (int i = 0; i < 4; i++)
    for (int ideal = 0; ideal < 2; ideal++) {
      double in = ag(&node, BIT(0), sizes[i], ideal, NULL);
      double across = ag(&spread, BIT(0), sizes[i], ideal, NULL);
      double both = ag(&two, BIT(0), sizes[i], ideal, NULL);
      UT_CHECK(across > in, "%s %g: 8 GPUs one per node (%g) not slower than one node (%g)",
               ideal ? "ideal" : "calibrated", sizes[i], across, in);
      UT_CHECK(both >= in, "%s %g: 2 nodes (%g) faster than 1 node (%g)", ideal ? "ideal" : "calibrated",
               sizes[i], both, in);
    }
  /* hierarchical stages, calibrated: NVLink at the book's curve on V, network on the V / 8 shard
   * through each NIC at its own curve: 2 nodes of 8, AllGather V = 1 GB */
  double v = 1e9;
  CollCost c;
  ag(&two, BIT(0), v, false, &c);
  double nv = v * 7 / 8 / (4.5e11 * 0.815 * v / (v + 8.4e7));
  double net = v / 2 / 8 / (5e10 * 0.9 * (v / 8) / (v / 8 + 4e6));
  near("max(NVLink stage, network stage on V/8) + latency", c.time_s, (nv > net ? nv : net) + 7e-6 + 3e-6, 1e-9);
  /* effective bandwidth rises with message size, in a node and across nodes */
  double prev_in = 0, prev_net = 0;
  for (double sz = 1e3; sz <= 1e11; sz *= 10) {
    double bw_in = sz / ag(&node, BIT(0), sz, false, NULL), bw_net = sz / ag(&spread, BIT(0), sz, false, NULL);
    UT_CHECK(bw_in > prev_in && bw_net > prev_net, "bandwidth not rising at %g: %g %g", sz, bw_in, bw_net);
    prev_in = bw_in, prev_net = bw_net;
  }
  /* latency-bound groups: for a fixed small array, more nodes cost more (ring steps) */
  double prev = 0;
  for (int nodes = 2; nodes <= 256; nodes *= 2) {
    Mesh g = mesh(&H100, 2, AX(gax("dp", nodes), gax("tp", 8)));
    double t = ag(&g, BIT(0), 4096, false, NULL);
    UT_CHECK(t > prev, "AllGather over %d nodes (%g) not slower than over %d (%g)", nodes, t, nodes / 2, prev);
    prev = t;
  }
  /* the book's W_node: a 16-GPU axis split 2 per node gets 2 NICs per node, not 8 */
  Mesh straddle = mesh(&H100, 2, AX(gax("ep", 16), gax("tp", 4)));
  ut_true("ep straddles nodes 2 per node", straddle.axes[0].per_node == 2);
  near("ideal: V (M-1) / (M 2 W_net)", ag(&straddle, BIT(0), v, true, NULL), v * 7 / (8 * 2 * 5e10), 1e-9);
  ut_end();
}

/* A fabric of full-bisection domains with an oversubscribed tier above (fabric_domain,
 * fabric_oversubscription): rings barely notice, AllToAlls do. */
static void test_fabric_contention(void) {
  ut_begin("fabric oversubscription: AllToAll across domains slowed, rings not (calibrated only)");
  Target fat = H100;
  fat.fabric_domain = 256;
  fat.fabric_oversubscription = 7;
  Mesh m = mesh(&fat, 3, AX(gax("dp", 4), gax("ep", 64), gax("tp", 8))); /* 2048 GPUs, 8 domains */
  Mesh flat = mesh(&H100, 3, AX(gax("dp", 4), gax("ep", 64), gax("tp", 8)));
  double v = 1e9;
  /* ep: 64 GPUs one per node (stride 8), 32 of them per domain: 32 nodes per domain >= 7: no
   * slowdown for rings */
  near("ring AllGather over ep unchanged", ag(&m, BIT(1), v, false, NULL), ag(&flat, BIT(1), v, false, NULL), 1e-12);
  /* AllToAll over ep: of its 63 network peers 32 lie outside the domain: f = 32 / 63,
   * factor 1 / (7 f) */
  double f = (64.0 - 32) / (64 - 1);
  CollCost a, b;
  cost_collective(&m, COLL_ALL_TO_ALL, BIT(1), v / 64, false, &a);
  cost_collective(&flat, COLL_ALL_TO_ALL, BIT(1), v / 64, false, &b);
  near("AllToAll bandwidth term / (1 / (7 f))", a.bandwidth_s, b.bandwidth_s * 7 * f, 1e-9);
  near("ideal ignores the fabric", cost_collective(&m, COLL_ALL_TO_ALL, BIT(1), v / 64, true, NULL),
       cost_collective(&flat, COLL_ALL_TO_ALL, BIT(1), v / 64, true, NULL), 1e-12);
  /* dp: stride 512 >= 256: one member per domain, 1 node per domain < 7: ring slowed 1/7 */
  CollCost d1, d2;
  ag(&m, BIT(0), v, false, &d1);
  ag(&flat, BIT(0), v, false, &d2);
  near("dp ring over 4 domains: 1 node per domain: / 7", d1.bandwidth_s, d2.bandwidth_s * 7, 1e-9);
  /* within one domain nothing changes */
  near("tp in node unchanged", ag(&m, BIT(2), v, false, NULL), ag(&flat, BIT(2), v, false, NULL), 1e-12);
  ut_end();
}

int main(void) {
  V4 = tpu("tpu_v4", 2.75e14, 2.75e14, 1.2e12, 4.5e10, 6.25e9);
  V5E = tpu("tpu_v5e", 1.97e14, 3.94e14, 8.1e11, 4.5e10, 3.125e9);
  V5P = tpu("tpu_v5p", 4.59e14, 9.18e14, 2.8e12, 9.0e10, 6.25e9);
  H100 = gpu("h100", 9.9e14, 1.98e15, 3.35e12, 4.5e11, 5.0e10);

  test_kind_names();
  test_v5e_ring();
  test_v5e_open_ring();
  test_latency_bound();
  test_v4_question2();
  test_allreduce_twice();
  test_all_to_all_tpu();
  test_two_torus_dims();
  test_dcn();
  test_h100_node_allgather();
  test_h100_allreduce_58mb();
  test_h100_quiz1_and_alltoall();
  test_h100_two_nodes();
  test_h100_one_per_node();
  test_permute();
  test_calibrated_tpu();
  test_bytes_per_device();
  test_bad_input();
  test_never_slower();
  test_never_slower_random();
  test_mesh_form_agrees();
  test_rooflines();
  test_tpu_thresholds();
  test_gpu_thresholds();
  test_matmul_ideal();
  test_matmul_calibrated();
  test_memory_ops_and_fusion();
  test_attention();
  test_gpu_latency_bound();
  test_gpu_hierarchy();
  test_fabric_contention();

  return ut_summary();
}
