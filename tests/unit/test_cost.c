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
  return t;
}

static Target gpu(const char *name, double bf16, double f8, double hbm_bw, double nvlink,
                  double network) {
  Target t;
  memset(&t, 0, sizeof t);
  t.name = name;
  t.kind = TARGET_GPU;
  t.flops[DT_BF16] = bf16;
  t.flops[DT_F8] = f8;
  t.hbm_bw = hbm_bw;
  t.matmul_efficiency = 0.82;
  t.nvlink_bw = nvlink;
  t.node_size = 8;
  t.network_bw = network;
  t.nvlink_latency = 1e-6;
  t.network_latency = 3e-6;
  t.coll_eff_max = 0.815;
  t.coll_eff_half_bytes = 8.4e7;
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

static void test_calibrated_tpu(void) {
  ut_begin("calibrated collectives: achieved = peak x coll_eff_max x V / (V + coll_eff_half_bytes)");
  Mesh m = mesh(&V5E, 2, AX(ici("x", &V5E, true, 16, 1, 1), ici("y", &V5E, true, 1, 16, 1)));
  double v = 2048.0 * 8192 * 2;
  CollCost c;
  double t = ag(&m, BIT(0), v, false, &c);
  double eff = 0.95 * v / (v + 2e5);
  near("peak x max x V / (V + half)", t, v / (2 * 4.5e10 * eff), 1e-9);
  near("efficiency reported", c.efficiency, eff, 1e-9);
  near("link bandwidth as used", c.link_bw, 4.5e10 * eff, 1e-9);
  /* Latency is not scaled by the efficiency. */
  double small = 64;
  near("latency-bound unchanged", ag(&m, BIT(0), small, false, NULL), 8e-6, 1e-9);
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
  near("f8 not given: falls back to bf16", cost_peak_flops(&V5E, DT_F8, true), 1.97e14, 1e-12);
  near("H100 f8 peak", cost_op_time(&H100, DT_F8, 1.98e15, 0, true), 1.0, 1e-12);
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

  return ut_summary();
}
