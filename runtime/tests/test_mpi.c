/* test_mpi.c: the runtime over MPI, run by ctest under mpirun (-np 2: the hybrid, several device
 * threads per rank; -np 4, 6, 8: one device per rank). Each rank checks the results of its own
 * devices; every rank prints its cases and mpirun fails if any rank does.
 *
 *   matrix    test_collectives.c's matrix (every collective on meshes [4], [2, 3], [2, 2, 2] over
 *             every ordered axis tuple, in f32 and bf16, against serial sums, bitwise), on the
 *             meshes whose devices the ranks divide (threads per rank = devices / ranks)
 *   misc      the same bits as the threads backend (run in this process too) for the reductions,
 *             AllGather and AllToAll, over 10 runs; send/recv by tag; rt_pipeline by hand; an
 *             AllReduce among some ranks of a group; ring shifts over two axes; non-blocking
 *             permutes; rt_fetch_to_root and rt_processes_agree; a wrong -np refused
 *   failures  a device that fails stops the others on every rank, promptly, with its message;
 *             timeouts name the missing device and what it was doing; a peer that returned; a
 *             mismatch names both calls; recvs; and after each failed run the same runtime runs
 *             again correctly (the channels were drained) */
#include <pthread.h>
#include <unistd.h>

static int W = 1, ME = 0;        /* the job's ranks, this rank */
static int mpi_lo = 0, mpi_hi = 0; /* the devices of the runtime opened last */
#define RT_TEST_LOCAL(d) ((d) >= mpi_lo && (d) < mpi_hi)

#include "rt_test.h"
#include "shardrt_mpi.h"

/* rt_open on the MPI backend, threads per rank = devices / ranks. */
static int mpi_open(const RtConfig *cfg, Runtime **out) {
  RtConfig c = *cfg;
  c.backend = RT_BACKEND_MPI;
  c.threads_per_rank = test_devices(cfg) / W;
  int rc = rt_open(&c, out);
  mpi_lo = ME * c.threads_per_rank, mpi_hi = mpi_lo + c.threads_per_rank;
  return rc;
}

/* test_collectives.c's cases, opening their runtimes over MPI */
#define rt_open(cfg, out) mpi_open(cfg, out)
#define main collectives_main
#include "test_collectives.c"
#undef main
#undef rt_open

/* The threads tests' meshes but [3, 1, 2], in f32 and bf16 (4- and 2-byte elements: what the
 * transport sees; the sums themselves are rtk_reduce's, which test_collectives.c covers in every
 * dtype): 23 axis tuples each. */
static void test_matrix_mpi(void) {
  static const int meshes[][4] = {{1, 4}, {2, 2, 3}, {3, 2, 2, 2}};
  static const RtDtype dtypes[] = {RT_F32, RT_BF16};
  for (size_t m = 0; m < sizeof meshes / sizeof *meshes; m++) {
    RtConfig cfg = test_mesh(meshes[m][0], meshes[m] + 1);
    if (test_devices(&cfg) % W) continue;
    for (size_t t = 0; t < sizeof dtypes / sizeof *dtypes; t++) {
      int tuple[RT_MAX_AXES];
      each_tuple(&cfg, tuple, 0, dtypes[t]);
    }
  }
}

/* ---- the same bits as the threads backend ---- */

enum { BW_BIG = 50001, BW_SMALL = 301, BW_AG = 7 };

typedef struct Bits {
  float *in[8], *big[8], *small[8], *ag[8], *a2a[8];
  uint16_t *in16[8], *rs16[8];
  int jitter_run;
} Bits;

static int bits_device(RtDevice *dev, void *arg) {
  Bits *b = arg;
  int d = rt_device_index(dev), rc;
  static const int zx[2] = {2, 0}, y[1] = {1}, xy[2] = {0, 1};
  if (b->jitter_run) test_sleep_us((long)(test_hash((uint64_t)b->jitter_run, (uint64_t)d, 0) % 400));
  if ((rc = rt_all_reduce(dev, zx, 2, RT_F32, RT_SUM, b->in[d], b->big[d], BW_BIG))) return rc;
  if (b->jitter_run) test_sleep_us((long)(test_hash((uint64_t)b->jitter_run, (uint64_t)d, 1) % 400));
  if ((rc = rt_all_reduce(dev, zx, 2, RT_F32, RT_MAX, b->in[d], b->small[d], BW_SMALL))) return rc;
  if ((rc = rt_reduce_scatter(dev, zx, 2, RT_BF16, RT_SUM, b->in16[d], b->rs16[d], 3, BW_SMALL, 1))) return rc;
  if ((rc = rt_all_gather(dev, y, 1, RT_F32, b->in[d], b->ag[d], 3, BW_AG, 2))) return rc;
  int64_t shape[3] = {4, 8, 5};
  return rt_all_to_all(dev, xy, 2, RT_F32, b->in[d], b->a2a[d], 3, shape, 1, 2);
}

static void bits_alloc(Bits *b) {
  for (int d = 0; d < 8; d++) {
    b->in[d] = malloc(BW_BIG * sizeof(float));
    b->big[d] = calloc(BW_BIG, sizeof(float));
    b->small[d] = calloc(BW_SMALL, sizeof(float));
    b->ag[d] = calloc(2 * 3 * BW_AG * 2, sizeof(float));
    b->a2a[d] = calloc(4 * 8 * 5, sizeof(float));
    b->in16[d] = malloc(4 * 3 * BW_SMALL * sizeof(uint16_t));
    b->rs16[d] = calloc(3 * BW_SMALL, sizeof(uint16_t));
    /* mixed magnitudes: the order of the additions shows in the bits */
    for (int i = 0; i < BW_BIG; i++) b->in[d][i] = test_value((uint64_t)d, 1, (uint64_t)i) * (float)(1 << (i % 20));
    for (int i = 0; i < 4 * 3 * BW_SMALL; i++) b->in16[d][i] = rt_f32_to_bf16(test_value((uint64_t)d, 2, (uint64_t)i) * 100);
  }
}

static void bits_free(Bits *b) {
  for (int d = 0; d < 8; d++)
    free(b->in[d]), free(b->big[d]), free(b->small[d]), free(b->ag[d]), free(b->a2a[d]), free(b->in16[d]), free(b->rs16[d]);
}

static int bits_differ(const Bits *a, const Bits *b, int d) {
  return memcmp(a->big[d], b->big[d], BW_BIG * sizeof(float)) || memcmp(a->small[d], b->small[d], BW_SMALL * sizeof(float)) ||
         memcmp(a->rs16[d], b->rs16[d], 3 * BW_SMALL * sizeof(uint16_t)) ||
         memcmp(a->ag[d], b->ag[d], 2 * 3 * BW_AG * 2 * sizeof(float)) || memcmp(a->a2a[d], b->a2a[d], 4 * 8 * 5 * sizeof(float));
}

static void test_same_bits(void) {
  if (8 % W) return;
  ut_begin("mpi: all_reduce (chunked and direct), reduce_scatter bf16, all_gather, all_to_all on [2,2,2] give the threads backend's bits, over 10 jittered runs");
  RtConfig cfg = test_mesh(3, (int[]){2, 2, 2});
  Bits ref = {0}, got = {0};
  bits_alloc(&ref);
  bits_alloc(&got);
  Runtime *rt;
  int rc = rt_open(&cfg, &rt); /* threads, in this process: all 8 devices */
  UT_CHECK(rc == RT_OK, "threads: %s", rt_errmsg(rt));
  rc = rt_run(rt, bits_device, &ref);
  UT_CHECK(rc == RT_OK, "threads: %s", rt_errmsg(rt));
  rt_close(rt);
  rc = mpi_open(&cfg, &rt);
  UT_CHECK(rc == RT_OK, "mpi: %s", rt_errmsg(rt));
  for (int run = 0; run < 10 && rc == RT_OK; run++) {
    got.jitter_run = run;
    for (int d = mpi_lo; d < mpi_hi; d++) memset(got.big[d], 0, BW_BIG * sizeof(float));
    rc = rt_run(rt, bits_device, &got);
    UT_CHECK(rc == RT_OK, "mpi run %d: %s", run, rt_errmsg(rt));
    for (int d = mpi_lo; d < mpi_hi && rc == RT_OK; d++) UT_CHECK(!bits_differ(&ref, &got, d), "run %d, device %d: other bits", run, d);
  }
  /* and the rank-order sum is what both hold (not some other order) */
  int members[8], rank;
  int n = test_group(&cfg, mpi_lo, (int[]){2, 0}, 2, members, &rank);
  for (int i = 0; i < BW_BIG && ut_ok(); i++) {
    float s = got.in[members[0]][i];
    for (int j = 1; j < n; j++) s += got.in[members[j]][i];
    UT_CHECK(test_bits(got.big[mpi_lo][i]) == test_bits(s), "element %d: not the rank-order sum", i);
  }
  rt_close(rt);
  bits_free(&ref);
  bits_free(&got);
  ut_end();
}

/* ---- point to point ---- */

/* p2p_device: test_collectives.c's (every device sends first, then receives out of tag order) */

static void test_send_recv_mpi(void) {
  if (4 % W) return;
  ut_begin("mpi: send/recv by source and tag, FIFO per tag, empty messages, twice on one runtime");
  RtConfig cfg = test_mesh(1, (int[]){4});
  Runtime *rt;
  int rc = mpi_open(&cfg, &rt);
  UT_CHECK(rc == RT_OK, "%s", rt_errmsg(rt));
  for (int run = 0; run < 2 && rc == RT_OK; run++) {
    P2P p = {.ndev = 4};
    rc = rt_run(rt, p2p_device, &p);
    UT_CHECK(rc == RT_OK, "run %d: %s", run, rt_errmsg(rt));
    for (int d = mpi_lo; d < mpi_hi; d++) UT_CHECK(!p.bad[d], "device %d received wrong data (%d)", d, p.bad[d]);
  }
  for (int d = 0; d < 4; d++) { /* every device's figures, this rank's and the others' */
    RtStats s;
    rt_stats(rt, d, &s);
    UT_CHECK(s.mem_current == 0, "device %d still holds %zu bytes of messages", d, s.mem_current);
    UT_CHECK(s.collectives == 8, "device %d: %llu calls in the last run, want 8", d, (unsigned long long)s.collectives);
  }
  rt_close(rt);
  ut_end();
}

/* ---- rt_pipeline by hand: 2 stages x 2 devices, a send split over y, 3 microbatches ---- */

static void test_rt_pipeline_mpi(void) {
  if (4 % W) return;
  ut_begin("mpi: rt_pipeline, 2 stages x 2 devices (send split over y), 3 microbatches");
  RtConfig cfg = test_mesh(2, (int[]){2, 2});
  Runtime *rt;
  int rc = mpi_open(&cfg, &rt);
  UT_CHECK(rc == RT_OK, "%s", rt_errmsg(rt));
  PipeRun r;
  memset(&r, 0, sizeof r);
  rc = rt_run(rt, pipeline_device, &r); /* test_collectives.c's */
  UT_CHECK(rc == RT_OK, "rt_run: %s", rt_errmsg(rt));
  for (int d = mpi_lo; d < mpi_hi; d++) {
    bool last = d >= 2;
    UT_CHECK(r.has[d] == last, "device %d: result %s", d, r.has[d] ? "held off the last stage" : "missing");
    for (int i = 0; last && i < 4; i++) {
      float want = (float)((0 + 10 + 20) + 3 * i + 3 * (100 + i) + 3 * (200 + i));
      UT_CHECK(r.result[d][i] == want, "device %d element %d: %g, want %g", d, i, r.result[d][i], want);
    }
  }
  rt_close(rt);
  ut_end();
}

static void test_all_reduce_group_mpi(void) {
  if (8 % W) return;
  ut_begin("mpi: all_reduce among ranks 0 and 3 of (y) on [x: 2, y: 4], the same bits on both");
  RtConfig cfg = test_mesh(2, (int[]){2, 4});
  Runtime *rt;
  int rc = mpi_open(&cfg, &rt);
  UT_CHECK(rc == RT_OK, "%s", rt_errmsg(rt));
  GroupAR g;
  memset(&g, 0, sizeof g);
  rc = rt_run(rt, group_device, &g); /* test_collectives.c's */
  UT_CHECK(rc == RT_OK, "rt_run: %s", rt_errmsg(rt));
  for (int d = mpi_lo; d < mpi_hi; d++) {
    if (d % 4 != 0 && d % 4 != 3) continue;
    int a = d / 4 * 4, b = a + 3;
    for (int i = 0; i < 5; i++) {
      double want = (a * 10 + i) + 0.25 + (b * 10 + i) + 0.25;
      UT_CHECK(g.out[d][i] == (float)want, "device %d element %d: %g, want %g", d, i, g.out[d][i], want);
      double bw = ref_round_bf16(ref_bf16_value(rt_f32_to_bf16((float)(a + i) * 0.1f)) + ref_bf16_value(rt_f32_to_bf16((float)(b + i) * 0.1f)));
      UT_CHECK(ref_bf16_value(g.bout[d][i]) == bw, "bf16 element %d on %d: %g, want %g", i, d, ref_bf16_value(g.bout[d][i]), bw);
    }
  }
  rt_close(rt);
  ut_end();
}

static void test_rings_mpi(void) {
  if (6 % W) return;
  static const int shifts[] = {1, -1, 7};
  static const int dev_of_rank[6] = {0, 3, 1, 4, 2, 5}; /* over (y, x) on [x: 2, y: 3] */
  for (int s = 0; s < 3; s++) {
    char name[96];
    snprintf(name, sizeof name, "mpi: a ring shift by %+d over (y, x) on [x: 2, y: 3]", shifts[s]);
    ut_begin(name);
    RtConfig cfg = test_mesh(2, (int[]){2, 3});
    Runtime *rt;
    int rc = mpi_open(&cfg, &rt);
    UT_CHECK(rc == RT_OK, "%s", rt_errmsg(rt));
    Ring r = {.shift = shifts[s]};
    rc = rt_run(rt, ring_device, &r);
    UT_CHECK(rc == RT_OK, "rt_run: %s", rt_errmsg(rt));
    for (int rank = 0; rank < 6; rank++) {
      int d = dev_of_rank[rank], from = dev_of_rank[((rank - shifts[s]) % 6 + 6) % 6];
      if (RT_TEST_LOCAL(d)) UT_CHECK(r.got[d] == from, "rank %d (device %d) got %d, want %d", rank, d, r.got[d], from);
    }
    rt_close(rt);
    ut_end();
  }
}

/* ---- non-blocking permutes: two in flight, waited for in the other order ---- */

typedef struct Overlap {
  int32_t got1[8], got2[8];
  double work[8];
} Overlap;

static int overlap_device(RtDevice *dev, void *arg) {
  Overlap *o = arg;
  int d = rt_device_index(dev), rc;
  static const int x[1] = {0};
  int32_t a = d, b = 100 + d;
  RtRequest *r1, *r2;
  if ((rc = rt_permute_shift_start(dev, x, 1, RT_I32, &a, &o->got1[d], 1, 1, &r1))) return rc;
  if ((rc = rt_permute_shift_start(dev, x, 1, RT_I32, &b, &o->got2[d], 1, -1, &r2))) return rc;
  double s = 0; /* computation while the blocks travel */
  for (int i = 1; i < 200000; i++) s += 1.0 / i;
  o->work[d] = s;
  if ((rc = rt_wait(dev, r2))) return rc;
  return rt_wait(dev, r1);
}

static void test_nonblocking(void) {
  if (4 % W) return;
  ut_begin("mpi: two non-blocking ring shifts in flight during computation, waited for in the other order");
  RtConfig cfg = test_mesh(1, (int[]){4});
  Runtime *rt;
  int rc = mpi_open(&cfg, &rt);
  Overlap o;
  memset(&o, 0, sizeof o);
  if (rc == RT_OK) rc = rt_run(rt, overlap_device, &o);
  UT_CHECK(rc == RT_OK, "%s", rt_errmsg(rt));
  for (int d = mpi_lo; d < mpi_hi; d++) {
    UT_CHECK(o.got1[d] == (d + 3) % 4, "device %d: +1 shift brought %d", d, o.got1[d]);
    UT_CHECK(o.got2[d] == 100 + (d + 1) % 4, "device %d: -1 shift brought %d", d, o.got2[d]);
  }
  rt_close(rt);
  ut_end();
}

/* ---- the host's calls ---- */

static int fill_device(RtDevice *dev, void *arg) {
  float **bufs = arg;
  int d = rt_device_index(dev);
  if (d == 2) return RT_OK; /* holds nothing */
  int rc = rt_alloc(dev, 16 * sizeof(float), "block", (void **)&bufs[d]);
  for (int i = 0; !rc && i < 16; i++) bufs[d][i] = (float)(d * 100 + i);
  return rc;
}

static void test_host_calls(void) {
  if (4 % W) return;
  ut_begin("mpi: rt_fetch_to_root brings each device's buffer to rank 0; rt_processes_agree; rt_alloc refuses another rank's device");
  RtConfig cfg = test_mesh(1, (int[]){4});
  Runtime *rt;
  int rc = mpi_open(&cfg, &rt);
  float *bufs[4] = {0};
  if (rc == RT_OK) rc = rt_run(rt, fill_device, bufs);
  UT_CHECK(rc == RT_OK, "%s", rt_errmsg(rt));
  UT_CHECK(rt_process_count(rt) == W && rt_process_rank(rt) == ME, "process %d of %d", rt_process_rank(rt), rt_process_count(rt));
  float scratch[16];
  for (int d = 0; d < 4; d++) {
    UT_CHECK(rt_device_local(rt, d) == RT_TEST_LOCAL(d), "device %d local: %d", d, rt_device_local(rt, d));
    const float *got = rt_fetch_to_root(rt, d, RT_TEST_LOCAL(d) ? bufs[d] : NULL, sizeof scratch, scratch);
    if (ME != 0) {
      UT_CHECK(!got, "rank %d got a buffer", ME);
    } else if (d == 2) {
      UT_CHECK(!got, "device 2 holds none, yet came back");
    } else {
      UT_CHECK(got != NULL, "device %d: nothing came", d);
      for (int i = 0; got && i < 16; i++) UT_CHECK(got[i] == (float)(d * 100 + i), "device %d element %d: %g", d, i, got[i]);
    }
  }
  char msg[64];
  snprintf(msg, sizeof msg, "rank %d says no", ME);
  int ok = rt_processes_agree(rt, W == 1 || ME != W - 1, msg, sizeof msg);
  UT_CHECK(ok == (W == 1), "agree: %d", ok);
  if (W > 1) {
    char want[64];
    snprintf(want, sizeof want, "rank %d says no", W - 1);
    UT_CHECK(!strcmp(msg, want), "agree's message: '%s', want '%s'", msg, want);
  }
  snprintf(msg, sizeof msg, "fine");
  UT_CHECK(rt_processes_agree(rt, 1, msg, sizeof msg) == 1, "all ok, yet not agreed");
  int other = (mpi_hi) % 4;
  if (W > 1) {
    void *p = NULL;
    int arc = rt_alloc(rt_device(rt, other), 8, "x", &p);
    UT_CHECK(arc == RT_E_ARG && contains(rt_errmsg(rt), "runs in another process"), "rt_alloc on device %d: %d, %s", other, arc,
             rt_errmsg(rt));
  }
  for (int d = mpi_lo; d < mpi_hi; d++) rt_free(rt_device(rt, d), bufs[d]);
  rt_close(rt);
  ut_end();
}

static void test_wrong_np(void) {
  ut_begin("mpi: a mesh the job's ranks do not fit is refused at rt_open, naming the -np it needs");
  RtConfig cfg = test_mesh(1, (int[]){W + 1});
  Runtime *rt;
  int rc = mpi_open(&cfg, &rt); /* W + 1 devices / W ranks: 1 thread per rank (W > 1), W + 1 ranks needed */
  char want[64];
  snprintf(want, sizeof want, "(mpirun -np %d); this one has %d", W + 1, W);
  UT_CHECK(rc == RT_E_ARG && contains(rt_errmsg(rt), want), "rc %d: %s", rc, rt_errmsg(rt));
  rt_close(rt);
  ut_end();
}

/* ---- failures ---- */

typedef struct Fail {
  int variant;
  int rc[8];
} Fail;

static int fail_device(RtDevice *dev, void *arg) {
  Fail *f = arg;
  int d = rt_device_index(dev), rc = RT_OK;
  static const int x[1] = {0};
  float in[64] = {0}, out[256];
  rt_at_line(dev, 10 + d);
  switch (f->variant) {
  case 0: /* device 2 fails in its own code while the others wait in an all_reduce */
    if (d == 2) {
      test_sleep_us(100000);
      rc = rt_fail(dev, "line 7: injected failure");
    } else {
      rc = rt_all_reduce(dev, x, 1, RT_F32, RT_SUM, in, out, 64);
    }
    break;
  case 1: /* device 3 is late: the others time out */
    if (d == 3) test_sleep_us(1500000);
    rc = rt_all_reduce(dev, x, 1, RT_F32, RT_SUM, in, out, 64);
    break;
  case 2: /* device 3 returns without calling */
    if (d != 3) rc = rt_all_reduce(dev, x, 1, RT_F32, RT_SUM, in, out, 64);
    break;
  case 3: /* device 1 calls another collective */
    if (d == 1) rc = rt_all_gather(dev, x, 1, RT_F32, in, out, 1, 16, 1);
    else rc = rt_all_reduce(dev, x, 1, RT_F32, RT_SUM, in, out, 64);
    break;
  case 4: /* device 0 waits for a message device 1 never sends */
    if (d == 0) rc = rt_recv(dev, 1, 5, in, 16);
    break;
  case 5: /* device 0 waits for a message device 1 sends late */
    if (d == 1) test_sleep_us(1500000);
    if (d == 0) rc = rt_recv(dev, 1, 5, in, 16);
    if (d == 1) rc = rt_send(dev, 0, 5, in, 16);
    break;
  case 6: /* device 2 fails while device 0 waits in a recv and 1, 3 at a barrier */
    if (d == 2) {
      test_sleep_us(100000);
      rc = rt_fail(dev, "line 9: failure during a recv");
    } else if (d == 0) {
      rc = rt_recv(dev, 2, 1, in, 4);
    } else {
      rc = rt_barrier(dev, (int[]){0}, 1);
    }
    break;
  case 7: /* a message of the wrong size */
    if (d == 1) rc = rt_send(dev, 0, 3, in, 12);
    if (d == 0) rc = rt_recv(dev, 1, 3, in, 16);
    break;
  }
  f->rc[d] = rc;
  return rc;
}

static int good_device(RtDevice *dev, void *arg) {
  int32_t *sum = arg, v = rt_device_index(dev) + 1;
  static const int x[1] = {0};
  int rc = rt_send(dev, (rt_device_index(dev) + 1) % 4, 5, &v, sizeof v);
  int32_t got = 0;
  if (!rc) rc = rt_recv(dev, (rt_device_index(dev) + 3) % 4, 5, &got, sizeof got);
  if (!rc) rc = rt_all_reduce(dev, x, 1, RT_I32, RT_SUM, &got, &sum[rt_device_index(dev)], 1);
  return rc;
}

static void test_failures_mpi(void) {
  if (4 % W) return;
  static const struct {
    int code;
    const char *want[3];
    double within;
  } cases[] = {
      {RT_E_FAILED, {"device 2 [x=2] on rank ", ": line 7: injected failure"}, 1.5},
      {RT_E_TIMEOUT, {": line 1", ": all_reduce over (x) timed out after 0.3 s waiting for device 3 [x=3] on rank ",
                      "(running its own code)"}, 3},
      {RT_E_MISMATCH, {"all_reduce over (x): device 3 [x=3] on rank ", " (returned from its entry function) without calling it"}, 1.5},
      {RT_E_MISMATCH, {"all_gather over (x) of f32 [1, 16, 1] at line 11", "all_reduce over (x) of 64 f32 at line 1"}, 1.5},
      {RT_E_MISMATCH, {"device 0 [x=0] on rank 0: line 10: recv from device 1 (tag 5): device 1 [x=1] on rank ",
                       " (returned from its entry function) without sending it"}, 1.5},
      {RT_E_TIMEOUT, {"device 0 [x=0] on rank 0: line 10: recv from device 1 (tag 5) timed out after 0.3 s waiting for device 1 [x=1]"}, 3},
      {RT_E_FAILED, {"device 2 [x=2] on rank ", ": line 9: failure during a recv"}, 1.5},
      {RT_E_MISMATCH, {"recv from device 1 (tag 3) of 16 bytes: the send has 12"}, 1.5},
  };
  for (int v = 0; v < (int)(sizeof cases / sizeof *cases); v++) {
    char name[128];
    snprintf(name, sizeof name, "mpi: failure %d stops every rank with one message, then the runtime runs again", v);
    ut_begin(name);
    RtConfig cfg = test_mesh(1, (int[]){4});
    cfg.timeout_s = 0.3;
    Runtime *rt;
    int rc = mpi_open(&cfg, &rt);
    UT_CHECK(rc == RT_OK, "%s", rt_errmsg(rt));
    Fail f = {.variant = v};
    double t0 = rt_seconds();
    rc = rt_run(rt, fail_device, &f);
    double took = rt_seconds() - t0;
    UT_CHECK(rc == cases[v].code, "rt_run returned %s, want %s: %s", rt_status_name(rc), rt_status_name(cases[v].code), rt_errmsg(rt));
    for (int k = 0; k < 3 && cases[v].want[k]; k++) UT_CHECK(contains(rt_errmsg(rt), cases[v].want[k]), "message: %s", rt_errmsg(rt));
    UT_CHECK(took < cases[v].within, "took %.2f s", took);
    if (getenv("RT_TEST_VERBOSE") && ME == 0) printf("    (%.2f s) %s\n", took, rt_errmsg(rt));
    /* every rank returns the same message */
    char mine[1024];
    snprintf(mine, sizeof mine, "%s", rt_errmsg(rt));
    UT_CHECK(rt_processes_agree(rt, 1, mine, sizeof mine), "agree");
    int32_t sum[4] = {0};
    rc = rt_run(rt, good_device, sum);
    UT_CHECK(rc == RT_OK, "the run after: %s", rt_errmsg(rt));
    for (int d = mpi_lo; d < mpi_hi; d++) UT_CHECK(sum[d] == 10, "the run after: device %d sum %d", d, sum[d]);
    rt_close(rt);
    ut_end();
  }
}

int main(int argc, char **argv) {
  char err[256];
  if (rt_mpi_init(&argc, &argv, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  W = rt_mpi_size(), ME = rt_mpi_rank();
  bool all = argc < 2;
  for (int i = 1; i < argc || all; i++) {
    const char *what = all ? "all" : argv[i];
    if (!strcmp(what, "matrix") || !strcmp(what, "all")) test_matrix_mpi();
    if (!strcmp(what, "misc") || !strcmp(what, "all")) {
      test_same_bits();
      test_send_recv_mpi();
      test_rt_pipeline_mpi();
      test_all_reduce_group_mpi();
      test_rings_mpi();
      test_nonblocking();
      test_host_calls();
      test_wrong_np();
    }
    if (!strcmp(what, "failures") || !strcmp(what, "all")) test_failures_mpi();
    if (all) break;
  }
  int rc = ut_summary();
  rt_mpi_finalize();
  return rc;
}
