/* test_collectives.c: every collective against a direct serial computation, on 1-, 2- and
 * 3-axis meshes (one with an axis of size 1), over every ordered axis tuple (in mesh order and
 * not, the empty one included), in each dtype, with odd sizes and buffers large enough to take
 * AllReduce's chunked path; bitwise equality throughout, since reductions run in rank order.
 * Then: determinism over 20 runs with jittered timing, point-to-point messages, rings, a NaN
 * in a max, and groups that call different collectives. */
#include "rt_test.h"

/* ---- the matrix: one run per (mesh, tuple, dtype) does every operation below ---- */

enum {
  OP_AG,          /* all_gather [3, 5, 7] */
  OP_RS_SUM,      /* reduce_scatter [3, 5n, 7] */
  OP_RS_MAX,
  OP_AR_SUM,      /* all_reduce, 37 elements: every rank reduces the whole buffer */
  OP_AR_MAX,
  OP_AR_BIG,      /* 40000: the chunked path */
  OP_AR_INPLACE,  /* 40001, in == out */
  OP_A2A,         /* all_to_all, 9 of them: every (split, concat) of a rank-3 shape */
  OP_PERM = OP_A2A + 9, /* ring shift +1 */
  OP_PERM_BACK,   /* ring shift -2 */
  OP_PAIRS,       /* neighbours swap; an odd one out receives zeros */
  NOPS
};

enum { AG_OUTER = 3, AG_EXTENT = 5, AG_INNER = 7, AR_SMALL = 37, AR_BIG = 40000, PERM_COUNT = 29 };
static const int64_t a2a_base[3] = {3, 2, 5};

typedef struct Case {
  RtConfig cfg;
  int tuple[RT_MAX_AXES], ntuple;
  RtDtype dt;
  int ndev, n;                   /* devices; group size */
  void *in[NOPS][64], *out[NOPS][64];
  int64_t in_count[NOPS], out_count[NOPS];
  int pairs[2 * 64], npairs;
} Case;

static void a2a_shapes(int which, int n, int64_t *shape, int *split, int *concat) {
  *split = which / 3;
  *concat = which % 3;
  memcpy(shape, a2a_base, sizeof a2a_base);
  shape[*split] *= n;
}

static void sizes(Case *k) {
  int n = k->n;
  for (int op = 0; op < NOPS; op++) {
    int64_t in = 0, out = 0;
    if (op == OP_AG) in = AG_OUTER * AG_EXTENT * AG_INNER, out = in * n;
    else if (op == OP_RS_SUM || op == OP_RS_MAX) out = AG_OUTER * AG_EXTENT * AG_INNER, in = out * n;
    else if (op == OP_AR_SUM || op == OP_AR_MAX) in = out = AR_SMALL;
    else if (op == OP_AR_BIG) in = out = AR_BIG;
    else if (op == OP_AR_INPLACE) in = out = AR_BIG + 1;
    else if (op >= OP_A2A && op < OP_A2A + 9) in = out = a2a_base[0] * a2a_base[1] * a2a_base[2] * n;
    else in = out = PERM_COUNT;
    k->in_count[op] = in;
    k->out_count[op] = out;
  }
}

/* ---- elements ---- */

static double get(const void *buf, RtDtype dt, int64_t i) {
  switch (dt) {
  case RT_F32: return ((const float *)buf)[i];
  case RT_BF16: return ref_bf16_value(((const uint16_t *)buf)[i]);
  case RT_F16: return ref_f16_value(((const uint16_t *)buf)[i]);
  default: return ((const int32_t *)buf)[i];
  }
}

static uint32_t raw(const void *buf, RtDtype dt, int64_t i) {
  return rt_dtype_size(dt) == 2 ? ((const uint16_t *)buf)[i] : ((const uint32_t *)buf)[i];
}

/* The pattern of a float after rounding to dt. */
static uint32_t encode(float v, RtDtype dt) {
  switch (dt) {
  case RT_F32: return test_bits(v);
  case RT_BF16: return ref_bf16_bits(ref_round_bf16(v));
  default: return ref_f16_bits(ref_round_f16(v));
  }
}

static void fill(Case *k, int op, int dev) {
  void *b = k->in[op][dev];
  for (int64_t i = 0; i < k->in_count[op]; i++) {
    if (k->dt == RT_I32) {
      ((int32_t *)b)[i] = (int32_t)(test_hash((uint64_t)dev, (uint64_t)op, (uint64_t)i) >> 33) - (1 << 30);
    } else {
      uint32_t e = encode(test_value((uint64_t)dev, (uint64_t)op, (uint64_t)i), k->dt);
      if (k->dt == RT_F32) ((uint32_t *)b)[i] = e;
      else ((uint16_t *)b)[i] = (uint16_t)e;
    }
  }
}

/* The reduction of element i over the members' buffers, in rank order, as the pattern the
 * output must hold: floats add (or max) in f32 and round once; i32 wraps. */
static uint32_t reduce_ref(Case *k, int op, RtReduceOp rop, const int *members, int64_t i) {
  if (k->dt == RT_I32) {
    int32_t acc = ((int32_t *)k->in[op][members[0]])[i];
    for (int r = 1; r < k->n; r++) {
      int32_t v = ((int32_t *)k->in[op][members[r]])[i];
      acc = rop == RT_SUM ? (int32_t)((uint32_t)acc + (uint32_t)v) : (v > acc ? v : acc);
    }
    return (uint32_t)acc;
  }
  float acc = (float)get(k->in[op][members[0]], k->dt, i);
  for (int r = 1; r < k->n; r++) {
    float v = (float)get(k->in[op][members[r]], k->dt, i);
    acc = rop == RT_SUM ? acc + v : (v > acc || v != v ? v : acc);
  }
  return encode(acc, k->dt);
}

/* ---- the device side ---- */

static int device_ops(RtDevice *dev, void *arg) {
  Case *k = arg;
  int d = rt_device_index(dev), rc;
  const int *t = k->tuple, nt = k->ntuple;
  RtDtype dt = k->dt;
  if ((rc = rt_all_gather(dev, t, nt, dt, k->in[OP_AG][d], k->out[OP_AG][d], AG_OUTER, AG_EXTENT, AG_INNER))) return rc;
  if ((rc = rt_reduce_scatter(dev, t, nt, dt, RT_SUM, k->in[OP_RS_SUM][d], k->out[OP_RS_SUM][d], AG_OUTER, AG_EXTENT, AG_INNER))) return rc;
  if ((rc = rt_reduce_scatter(dev, t, nt, dt, RT_MAX, k->in[OP_RS_MAX][d], k->out[OP_RS_MAX][d], AG_OUTER, AG_EXTENT, AG_INNER))) return rc;
  if ((rc = rt_all_reduce(dev, t, nt, dt, RT_SUM, k->in[OP_AR_SUM][d], k->out[OP_AR_SUM][d], AR_SMALL))) return rc;
  if ((rc = rt_all_reduce(dev, t, nt, dt, RT_MAX, k->in[OP_AR_MAX][d], k->out[OP_AR_MAX][d], AR_SMALL))) return rc;
  if ((rc = rt_all_reduce(dev, t, nt, dt, RT_SUM, k->in[OP_AR_BIG][d], k->out[OP_AR_BIG][d], AR_BIG))) return rc;
  /* in place: the output buffer holds a copy of the input */
  memcpy(k->out[OP_AR_INPLACE][d], k->in[OP_AR_INPLACE][d], (size_t)(AR_BIG + 1) * rt_dtype_size(dt));
  if ((rc = rt_all_reduce(dev, t, nt, dt, RT_SUM, k->out[OP_AR_INPLACE][d], k->out[OP_AR_INPLACE][d], AR_BIG + 1))) return rc;
  for (int w = 0; w < 9; w++) {
    int64_t shape[3];
    int split, concat;
    a2a_shapes(w, k->n, shape, &split, &concat);
    if ((rc = rt_all_to_all(dev, t, nt, dt, k->in[OP_A2A + w][d], k->out[OP_A2A + w][d], 3, shape, split, concat))) return rc;
  }
  if ((rc = rt_permute_shift(dev, t, nt, dt, k->in[OP_PERM][d], k->out[OP_PERM][d], PERM_COUNT, 1))) return rc;
  if ((rc = rt_permute_shift(dev, t, nt, dt, k->in[OP_PERM_BACK][d], k->out[OP_PERM_BACK][d], PERM_COUNT, -2))) return rc;
  return rt_permute_pairs(dev, t, nt, dt, k->in[OP_PAIRS][d], k->out[OP_PAIRS][d], PERM_COUNT, k->pairs, k->npairs);
}

/* ---- checking ---- */

/* First mismatch of one op on one device, reported once. */
static int check_elem(Case *k, int op, int dev, int64_t i, uint32_t want, const char *what) {
  uint32_t got = raw(k->out[op][dev], k->dt, i);
  if (got == want) return 1;
  ut_fail("%s: device %d element %lld: got 0x%x, want 0x%x", what, dev, (long long)i, got, want);
  return 0;
}

static void check_case(Case *k) {
  int members[64], rank = 0;
  for (int d = 0; d < k->ndev; d++) {
    if (!RT_TEST_LOCAL(d)) continue;
    int n = test_group(&k->cfg, d, k->tuple, k->ntuple, members, &rank);
    UT_CHECK(n == k->n, "group size %d, want %d", n, k->n);
    /* all_gather: block r of the middle dim comes from rank r */
    for (int64_t o = 0; o < AG_OUTER; o++)
      for (int r = 0; r < n; r++)
        for (int64_t x = 0; x < AG_EXTENT * AG_INNER; x++) {
          int64_t at = (o * n + r) * AG_EXTENT * AG_INNER + x;
          if (!check_elem(k, OP_AG, d, at, raw(k->in[OP_AG][members[r]], k->dt, o * AG_EXTENT * AG_INNER + x), "all_gather"))
            goto rs;
        }
  rs:
    for (int op = OP_RS_SUM; op <= OP_RS_MAX; op++)
      for (int64_t o = 0; o < AG_OUTER; o++)
        for (int64_t x = 0; x < AG_EXTENT * AG_INNER; x++) {
          int64_t src = (o * n + rank) * AG_EXTENT * AG_INNER + x;
          if (!check_elem(k, op, d, o * AG_EXTENT * AG_INNER + x,
                          reduce_ref(k, op, op == OP_RS_SUM ? RT_SUM : RT_MAX, members, src), "reduce_scatter"))
            break;
        }
    for (int op = OP_AR_SUM; op <= OP_AR_INPLACE; op++)
      for (int64_t i = 0; i < k->out_count[op]; i++)
        if (!check_elem(k, op, d, i, reduce_ref(k, op, op == OP_AR_MAX ? RT_MAX : RT_SUM, members, i), "all_reduce"))
          break;
    for (int w = 0; w < 9; w++) {
      int64_t shape[3], box[3], out_shape[3];
      int a, c;
      a2a_shapes(w, n, shape, &a, &c);
      memcpy(box, shape, sizeof box);
      box[a] /= n;
      memcpy(out_shape, box, sizeof box);
      out_shape[c] *= n;
      int bad = 0;
      for (int64_t i0 = 0; i0 < out_shape[0] && !bad; i0++)
        for (int64_t i1 = 0; i1 < out_shape[1] && !bad; i1++)
          for (int64_t i2 = 0; i2 < out_shape[2] && !bad; i2++) {
            int64_t idx[3] = {i0, i1, i2}, src[3] = {i0, i1, i2};
            int j = (int)(idx[c] / box[c]);
            src[c] = idx[c] % box[c];
            src[a] += rank * box[a];
            int64_t at = (i0 * out_shape[1] + i1) * out_shape[2] + i2;
            int64_t from = (src[0] * shape[1] + src[1]) * shape[2] + src[2];
            char what[64];
            snprintf(what, sizeof what, "all_to_all split %d concat %d", a, c);
            bad = !check_elem(k, OP_A2A + w, d, at, raw(k->in[OP_A2A + w][members[j]], k->dt, from), what);
          }
    }
    int shifts[2] = {1, -2};
    for (int s = 0; s < 2; s++) {
      int from = members[((rank - shifts[s]) % n + n) % n];
      for (int64_t i = 0; i < PERM_COUNT; i++)
        if (!check_elem(k, OP_PERM + s, d, i, raw(k->in[OP_PERM + s][from], k->dt, i), "permute shift")) break;
    }
    int src = -1;
    for (int p = 0; p < k->npairs; p++)
      if (k->pairs[2 * p + 1] == rank) src = k->pairs[2 * p];
    for (int64_t i = 0; i < PERM_COUNT; i++)
      if (!check_elem(k, OP_PAIRS, d, i, src < 0 ? 0 : raw(k->in[OP_PAIRS][members[src]], k->dt, i), "permute pairs"))
        break;
  }
}

static void run_case(const RtConfig *cfg, const int *tuple, int ntuple, RtDtype dt) {
  Case *k = calloc(1, sizeof *k);
  k->cfg = *cfg;
  memcpy(k->tuple, tuple, (size_t)ntuple * sizeof *tuple);
  k->ntuple = ntuple;
  k->dt = dt;
  k->ndev = test_devices(cfg);
  k->n = 1;
  for (int i = 0; i < ntuple; i++) k->n *= cfg->axis_size[tuple[i]];
  for (int r = 0; r + 1 < k->n; r += 2) {
    k->pairs[2 * k->npairs] = r, k->pairs[2 * k->npairs + 1] = r + 1, k->npairs++;
    k->pairs[2 * k->npairs] = r + 1, k->pairs[2 * k->npairs + 1] = r, k->npairs++;
  }
  sizes(k);

  char name[128];
  size_t len = (size_t)snprintf(name, sizeof name, "collectives %s mesh [", rt_dtype_name(dt));
  for (int a = 0; a < cfg->naxes; a++) len += (size_t)snprintf(name + len, sizeof name - len, "%s%d", a ? "," : "", cfg->axis_size[a]);
  len += (size_t)snprintf(name + len, sizeof name - len, "] over (");
  for (int i = 0; i < ntuple; i++) len += (size_t)snprintf(name + len, sizeof name - len, "%s%s", i ? "," : "", test_axis_names[tuple[i]]);
  snprintf(name + len, sizeof name - len, ")");
  ut_begin(name);

  Runtime *rt;
  int rc = rt_open(cfg, &rt);
  UT_CHECK(rc == RT_OK, "rt_open: %s", rt_errmsg(rt));
  size_t es = rt_dtype_size(dt);
  for (int op = 0; op < NOPS; op++)
    for (int d = 0; d < k->ndev; d++) {
      k->in[op][d] = malloc((size_t)k->in_count[op] * es + 1);
      k->out[op][d] = malloc((size_t)k->out_count[op] * es + 1);
      memset(k->out[op][d], 0xa5, (size_t)k->out_count[op] * es); /* garbage where nothing was written */
      fill(k, op, d);
    }
  if (rc == RT_OK) {
    rc = rt_run(rt, device_ops, k);
    UT_CHECK(rc == RT_OK, "rt_run: %s: %s", rt_status_name(rc), rt_errmsg(rt));
    if (rc == RT_OK) check_case(k);
  }
  rt_close(rt);
  for (int op = 0; op < NOPS; op++)
    for (int d = 0; d < k->ndev; d++) free(k->in[op][d]), free(k->out[op][d]);
  free(k);
  ut_end();
}

/* Every ordered tuple of distinct axes (the empty one too): all orders of all subsets. */
static void each_tuple(const RtConfig *cfg, int *tuple, int len, RtDtype dt) {
  run_case(cfg, tuple, len, dt);
  for (int a = 0; a < cfg->naxes; a++) {
    int used = 0;
    for (int i = 0; i < len; i++) used |= tuple[i] == a;
    if (used) continue;
    tuple[len] = a;
    each_tuple(cfg, tuple, len + 1, dt);
  }
}

static void test_matrix(void) {
  static const int meshes[][4] = {{1, 4}, {2, 2, 3}, {3, 2, 2, 2}, {3, 3, 1, 2}};
  static const RtDtype dtypes[] = {RT_F32, RT_BF16, RT_F16, RT_I32};
  for (size_t m = 0; m < sizeof meshes / sizeof *meshes; m++) {
    RtConfig cfg = test_mesh(meshes[m][0], meshes[m] + 1);
    for (size_t t = 0; t < sizeof dtypes / sizeof *dtypes; t++) {
      int tuple[RT_MAX_AXES];
      each_tuple(&cfg, tuple, 0, dtypes[t]);
    }
  }
}

/* ---- determinism: the same bits whatever the threads' timing ---- */

enum { DET_RUNS = 20, DET_BIG = 50000, DET_SMALL = 300 };

typedef struct DetRun {
  int run;
  float *in[8], *big[8], *small[8];
  uint16_t *in16[8], *rs16[8];
} DetRun;

/* Each device sleeps a different, run-dependent time before each collective, so the order in
 * which threads arrive and compute changes from run to run. */
static void jitter(int run, int dev, int step) { test_sleep_us((long)(test_hash((uint64_t)run, (uint64_t)dev, (uint64_t)step) % 300)); }

static int det_device(RtDevice *dev, void *arg) {
  DetRun *r = arg;
  int d = rt_device_index(dev), rc;
  static const int tuple[2] = {2, 0}; /* (z, x): out of mesh order */
  jitter(r->run, d, 0);
  if ((rc = rt_all_reduce(dev, tuple, 2, RT_F32, RT_SUM, r->in[d], r->big[d], DET_BIG))) return rc;
  jitter(r->run, d, 1);
  if ((rc = rt_all_reduce(dev, tuple, 2, RT_F32, RT_SUM, r->in[d], r->small[d], DET_SMALL))) return rc;
  jitter(r->run, d, 2);
  return rt_reduce_scatter(dev, tuple, 2, RT_BF16, RT_SUM, r->in16[d], r->rs16[d], 1, DET_SMALL, 1);
}

static void test_determinism(void) {
  ut_begin("determinism: 20 runs of all_reduce and reduce_scatter on [2,2,2] over (z, x) give the same bits");
  RtConfig cfg = test_mesh(3, (int[]){2, 2, 2});
  Runtime *rt;
  rt_open(&cfg, &rt);
  DetRun r = {0};
  float *first_big[8], *first_small[8];
  uint16_t *first_rs[8];
  for (int d = 0; d < 8; d++) {
    r.in[d] = malloc(DET_BIG * sizeof(float));
    r.big[d] = malloc(DET_BIG * sizeof(float));
    r.small[d] = malloc(DET_SMALL * sizeof(float));
    r.in16[d] = malloc(4 * DET_SMALL * sizeof(uint16_t));
    r.rs16[d] = malloc(DET_SMALL * sizeof(uint16_t));
    first_big[d] = malloc(DET_BIG * sizeof(float));
    first_small[d] = malloc(DET_SMALL * sizeof(float));
    first_rs[d] = malloc(DET_SMALL * sizeof(uint16_t));
    /* values of mixed magnitudes, so that the order of the additions shows in the bits */
    for (int i = 0; i < DET_BIG; i++) r.in[d][i] = test_value((uint64_t)d, 1, (uint64_t)i) * (float)(1 << (i % 20));
    for (int i = 0; i < 4 * DET_SMALL; i++) r.in16[d][i] = rt_f32_to_bf16(test_value((uint64_t)d, 2, (uint64_t)i) * 100);
  }
  int differing = 0;
  for (int run = 0; run < DET_RUNS; run++) {
    r.run = run;
    int rc = rt_run(rt, det_device, &r);
    UT_CHECK(rc == RT_OK, "run %d: %s", run, rt_errmsg(rt));
    for (int d = 0; d < 8; d++) {
      if (run == 0) {
        memcpy(first_big[d], r.big[d], DET_BIG * sizeof(float));
        memcpy(first_small[d], r.small[d], DET_SMALL * sizeof(float));
        memcpy(first_rs[d], r.rs16[d], DET_SMALL * sizeof(uint16_t));
      } else {
        differing += memcmp(first_big[d], r.big[d], DET_BIG * sizeof(float)) != 0;
        differing += memcmp(first_small[d], r.small[d], DET_SMALL * sizeof(float)) != 0;
        differing += memcmp(first_rs[d], r.rs16[d], DET_SMALL * sizeof(uint16_t)) != 0;
      }
    }
  }
  UT_CHECK(differing == 0, "%d outputs differ from the first run's", differing);
  /* and every copy of an all_reduce is the same: the group (z, x) of device 0 is {0, 1, 4, 5} */
  UT_CHECK(!memcmp(r.big[0], r.big[5], DET_BIG * sizeof(float)), "devices 0 and 5 hold different all_reduce results");
  /* the order matters for these inputs: a sum in another order gives other bits somewhere */
  int members[8], rank;
  int n = test_group(&cfg, 0, (int[]){2, 0}, 2, members, &rank);
  int order_shows = 0;
  for (int i = 0; i < DET_BIG; i++) {
    float fwd = 0, back = 0;
    for (int j = 0; j < n; j++) fwd = j ? fwd + r.in[members[j]][i] : r.in[members[j]][i];
    for (int j = n - 1; j >= 0; j--) back = j < n - 1 ? back + r.in[members[j]][i] : r.in[members[j]][i];
    UT_CHECK(test_bits(r.big[0][i]) == test_bits(fwd), "element %d: not the rank-order sum", i);
    if (!ut_ok()) break;
    order_shows += test_bits(fwd) != test_bits(back);
  }
  UT_CHECK(order_shows > 0, "the inputs do not distinguish summation orders");
  for (int d = 0; d < 8; d++) {
    free(r.in[d]), free(r.big[d]), free(r.small[d]), free(r.in16[d]), free(r.rs16[d]);
    free(first_big[d]), free(first_small[d]), free(first_rs[d]);
  }
  rt_close(rt);
  ut_end();
}

/* ---- point to point ---- */

typedef struct P2P {
  int ndev;
  int bad[8]; /* per device: what went wrong, 0 if nothing */
} P2P;

/* Everyone sends first (three messages to the next device, two tags), then receives out of tag
 * order: buffered sends cannot deadlock, tags match, and one tag's messages keep their order. */
static int p2p_device(RtDevice *dev, void *arg) {
  P2P *p = arg;
  int d = rt_device_index(dev), n = p->ndev, next = (d + 1) % n, prev = (d + n - 1) % n, rc;
  float a[100], c[100];
  char b[37];
  for (int i = 0; i < 100; i++) a[i] = (float)(d * 1000 + i), c[i] = (float)(-d * 1000 - i);
  for (int i = 0; i < 37; i++) b[i] = (char)(d + i);
  if ((rc = rt_send(dev, next, 1, a, sizeof a))) return rc;
  if ((rc = rt_send(dev, next, 2, b, sizeof b))) return rc;
  if ((rc = rt_send(dev, next, 1, c, sizeof c))) return rc;
  if ((rc = rt_send(dev, next, 3, NULL, 0))) return rc;
  float ra[100], rc1[100];
  char rb[37];
  if ((rc = rt_recv(dev, prev, 2, rb, sizeof rb))) return rc;
  if ((rc = rt_recv(dev, prev, 3, NULL, 0))) return rc;
  if ((rc = rt_recv(dev, prev, 1, ra, sizeof ra))) return rc;
  if ((rc = rt_recv(dev, prev, 1, rc1, sizeof rc1))) return rc;
  for (int i = 0; i < 100; i++) {
    if (ra[i] != (float)(prev * 1000 + i)) p->bad[d] = 1;
    if (rc1[i] != (float)(-prev * 1000 - i)) p->bad[d] = 2;
  }
  for (int i = 0; i < 37; i++)
    if (rb[i] != (char)(prev + i)) p->bad[d] = 3;
  return RT_OK;
}

static void test_send_recv(void) {
  ut_begin("send/recv: buffered sends, matching by source and tag, FIFO per tag, empty messages");
  RtConfig cfg = test_mesh(1, (int[]){4});
  Runtime *rt;
  rt_open(&cfg, &rt);
  P2P p = {.ndev = 4};
  int rc = rt_run(rt, p2p_device, &p);
  UT_CHECK(rc == RT_OK, "rt_run: %s", rt_errmsg(rt));
  for (int d = 0; d < 4; d++) UT_CHECK(!p.bad[d], "device %d received wrong data (%d)", d, p.bad[d]);
  /* received messages are freed on the sender's account */
  for (int d = 0; d < 4; d++) {
    RtStats s;
    rt_stats(rt, d, &s);
    UT_CHECK(s.mem_current == 0, "device %d still holds %zu bytes of messages", d, s.mem_current);
    UT_CHECK(s.mem_peak >= 2 * sizeof(float[100]) + 37, "device %d peak %zu: the queued messages were not counted", d,
             s.mem_peak);
  }
  rt_close(rt);
  ut_end();
}

/* A pipeline of 4 stages over 5 microbatches: stage s receives from s-1, adds s, sends on;
 * the last stage sends the results back to stage 0. */
typedef struct Pipe {
  float out[5][16];
} Pipe;

static int pipe_device(RtDevice *dev, void *arg) {
  Pipe *p = arg;
  int s = rt_device_index(dev), rc;
  for (int mb = 0; mb < 5; mb++) {
    float act[16];
    if (s == 0) {
      for (int i = 0; i < 16; i++) act[i] = (float)(mb * 100 + i);
    } else if ((rc = rt_recv(dev, s - 1, mb, act, sizeof act))) {
      return rc;
    }
    for (int i = 0; i < 16; i++) act[i] += (float)s;
    if ((rc = rt_send(dev, (s + 1) % 4, mb, act, sizeof act))) return rc;
  }
  if (s == 0)
    for (int mb = 4; mb >= 0; mb--)
      if ((rc = rt_recv(dev, 3, mb, p->out[mb], sizeof p->out[mb]))) return rc;
  return RT_OK;
}

static void test_pipeline(void) {
  ut_begin("send/recv: a 4-stage pipeline over 5 microbatches");
  RtConfig cfg = test_mesh(1, (int[]){4});
  Runtime *rt;
  rt_open(&cfg, &rt);
  Pipe p;
  memset(&p, 0, sizeof p);
  int rc = rt_run(rt, pipe_device, &p);
  UT_CHECK(rc == RT_OK, "rt_run: %s", rt_errmsg(rt));
  for (int mb = 0; mb < 5; mb++)
    for (int i = 0; i < 16; i++)
      UT_CHECK(p.out[mb][i] == (float)(mb * 100 + i + 0 + 1 + 2 + 3), "microbatch %d element %d: %g", mb, i,
               p.out[mb][i]);
  rt_close(rt);
  ut_end();
}


/* ---- an AllReduce among some devices of a group (a tied param's first and last stage) ---- */

typedef struct GroupAR {
  float out[8][5];
  uint16_t bout[8][5];
  int member[8];
  int rc_outside;
} GroupAR;

/* Mesh [x: 2, y: 4]: over y, ranks 0 and 3 reduce (devices 0, 3 and 4, 7); the others do not call
 * it, except device 1, which calls it and must fail alone... so it runs in a second run. */
static int group_device(RtDevice *dev, void *arg) {
  GroupAR *g = arg;
  int d = rt_device_index(dev), rc;
  static const int y[1] = {1}, grp[2] = {0, 3};
  g->member[d] = rt_group_member(dev, y, 1, 3);
  int r = rt_group_rank(dev, y, 1);
  if (r != 0 && r != 3) return RT_OK;
  float in[5];
  uint16_t bin[5];
  for (int i = 0; i < 5; i++) in[i] = (float)(d * 10 + i) + 0.25f, bin[i] = rt_f32_to_bf16((float)(d + i) * 0.1f);
  if ((rc = rt_all_reduce_group(dev, y, 1, RT_F32, RT_SUM, grp, 2, in, g->out[d], 5))) return rc;
  memcpy(g->bout[d], bin, sizeof bin);
  return rt_all_reduce_group(dev, y, 1, RT_BF16, RT_SUM, grp, 2, g->bout[d], g->bout[d], 5); /* in place */
}

static int group_outside(RtDevice *dev, void *arg) {
  GroupAR *g = arg;
  static const int y[1] = {1}, grp[2] = {0, 3};
  float x = 1;
  if (rt_device_index(dev) != 1) return RT_OK;
  g->rc_outside = rt_all_reduce_group(dev, y, 1, RT_F32, RT_SUM, grp, 2, &x, &x, 1);
  return g->rc_outside;
}

static void test_all_reduce_group(void) {
  ut_begin("all_reduce among a group: ranks 0 and 3 of (y) on [x: 2, y: 4] sum, the same bits on both, others untouched");
  RtConfig cfg = test_mesh(2, (int[]){2, 4});
  Runtime *rt;
  rt_open(&cfg, &rt);
  GroupAR g;
  memset(&g, 0, sizeof g);
  int rc = rt_run(rt, group_device, &g);
  UT_CHECK(rc == RT_OK, "rt_run: %s", rt_errmsg(rt));
  int pairs[2][2] = {{0, 3}, {4, 7}};
  for (int k = 0; k < 2; k++) {
    int a = pairs[k][0], b = pairs[k][1];
    for (int i = 0; i < 5; i++) {
      double want = (a * 10 + i) + 0.25 + (b * 10 + i) + 0.25;
      UT_CHECK(g.out[a][i] == (float)want && g.out[b][i] == (float)want, "devices %d, %d element %d: %g %g, want %g", a, b, i,
               g.out[a][i], g.out[b][i], want);
      double bw = ref_round_bf16(ref_bf16_value(rt_f32_to_bf16((float)(a + i) * 0.1f)) + ref_bf16_value(rt_f32_to_bf16((float)(b + i) * 0.1f)));
      UT_CHECK(g.bout[a][i] == g.bout[b][i] && ref_bf16_value(g.bout[a][i]) == bw, "bf16 element %d on %d, %d: %g, want %g", i, a, b,
               ref_bf16_value(g.bout[a][i]), bw);
    }
  }
  for (int d = 0; d < 8; d++)
    UT_CHECK(g.member[d] == (d / 4) * 4 + 3, "device %d: rank 3 of its (y) group is device %d", d, g.member[d]);
  for (int d = 0; d < 8; d++)
    if (d % 4 == 1 || d % 4 == 2)
      for (int i = 0; i < 5; i++) UT_CHECK(g.out[d][i] == 0, "device %d (outside the group) was written", d);
  rt_close(rt);
  rt_open(&cfg, &rt);
  rc = rt_run(rt, group_outside, &g);
  UT_CHECK(rc == RT_E_ARG && contains(rt_errmsg(rt), "not in the group"), "a device outside the group: rc %d, %s", rc, rt_errmsg(rt));
  rt_close(rt);
  ut_end();
}


/* ---- rt_pipeline by hand: 2 stages x 2 (a send split over y), 3 microbatches ----
 * first: x = the microbatch's row; chunk_fwd: x + the stage's row of the stacked w; last: x added
 * into the accumulator. Stage 0 runs first, fwd, send; stage 1 recv, fwd, last. */
static int pr_first(RtDevice *dev, void **in, void **out) {
  int rc = rt_alloc(dev, 4 * sizeof(float), "x", &out[0]);
  if (!rc) memcpy(out[0], in[0], 4 * sizeof(float));
  return rc;
}

static int pr_fwd(RtDevice *dev, void **in, void **out) {
  int rc = rt_alloc(dev, 4 * sizeof(float), "x", &out[0]);
  for (int i = 0; !rc && i < 4; i++) ((float *)out[0])[i] = ((float *)in[0])[i] + ((float *)in[1])[i];
  return rc;
}

static int pr_last(RtDevice *dev, void **in, void **out) {
  int rc = rt_alloc(dev, 4 * sizeof(float), "g", &out[0]);
  if (!rc) memcpy(out[0], in[0], 4 * sizeof(float));
  return rc;
}

typedef struct PipeRun {
  float result[4][4];
  int has[4];
} PipeRun;

static int pipeline_device(RtDevice *dev, void *arg) {
  PipeRun *r = arg;
  static const RtPipeSlot in_first[] = {{RT_PIN_ENV, 0, RT_F32, 4}}, out_act[] = {{RT_POUT_ACT, 0, RT_F32, 4}};
  static const RtPipeSlot in_fwd[] = {{RT_PIN_CHUNK, 2, RT_F32, 4}, {RT_PIN_ACT, 0, RT_F32, 4}};
  static const RtPipeSlot in_last[] = {{RT_PIN_ACT, 0, RT_F32, 4}}, out_last[] = {{RT_POUT_ACC, 0, RT_F32, 4}};
  static const int64_t rows[3] = {16, 16, 16}, acc_count[1] = {4};
  static const int32_t acc_dtype[1] = {RT_F32}, first_action[3] = {0, 9, 18};
  static const uint8_t place[1] = {4};
  static const RtPipeAction acts[18] = {
      {RT_PA_FIRST, 0, 0, 0, 0}, {RT_PA_FWD, 0, 0, 0, 0}, {RT_PA_SEND, 0, 0, 1, 1},
      {RT_PA_FIRST, 0, 1, 0, 0}, {RT_PA_FWD, 0, 1, 0, 0}, {RT_PA_SEND, 0, 1, 1, 1},
      {RT_PA_FIRST, 0, 2, 0, 0}, {RT_PA_FWD, 0, 2, 0, 0}, {RT_PA_SEND, 0, 2, 1, 1},
      {RT_PA_RECV, 0, 0, 1, 0}, {RT_PA_FWD, 0, 0, 1, 0}, {RT_PA_LAST, 0, 0, 1, 0},
      {RT_PA_RECV, 0, 1, 1, 0}, {RT_PA_FWD, 0, 1, 1, 0}, {RT_PA_LAST, 0, 1, 1, 0},
      {RT_PA_RECV, 0, 2, 1, 0}, {RT_PA_FWD, 0, 2, 1, 0}, {RT_PA_LAST, 0, 2, 1, 0}};
  static const RtPipe P = {.stages = 2, .chunks = 1, .microbatches = 3, .chunk_layers = 1, .nstage_axes = 1, .stage_axes = {0},
                           .nsplit = 1, .split_axes = {1}, .nslices = 1, .ncarried = 1, .noperands = 3, .nresults = 1, .nsave = 1,
                           .row_bytes = rows, .acc_dtype = acc_dtype, .acc_count = acc_count, .result_place = place,
                           .region = {pr_first, pr_fwd, pr_last}, .nin = {1, 2, 1}, .nout = {1, 1, 1},
                           .in = {in_first, in_fwd, in_last}, .out = {out_act, out_act, out_last}, .actions = acts,
                           .first_action = first_action, .where = "test"};
  int d = rt_device_index(dev), s = rt_device_coord(dev, 0);
  float x[3][4], acc[4] = {0}, w[4];
  for (int mb = 0; mb < 3; mb++)
    for (int i = 0; i < 4; i++) x[mb][i] = (float)(mb * 10 + i);
  for (int i = 0; i < 4; i++) w[i] = (float)((s + 1) * 100 + i);
  void *ops[3] = {x, acc, w}, *res[1] = {NULL};
  int rc = rt_pipeline(dev, &P, ops, res);
  r->has[d] = res[0] != NULL;
  if (res[0]) memcpy(r->result[d], res[0], sizeof r->result[d]);
  rt_free(dev, res[0]);
  return rc;
}

static void test_rt_pipeline(void) {
  ut_begin("rt_pipeline: 2 stages x 2 devices (send split over y), 3 microbatches, the accumulator on the last stage only");
  RtConfig cfg = test_mesh(2, (int[]){2, 2});
  Runtime *rt;
  rt_open(&cfg, &rt);
  PipeRun r;
  memset(&r, 0, sizeof r);
  int rc = rt_run(rt, pipeline_device, &r);
  UT_CHECK(rc == RT_OK, "rt_run: %s", rt_errmsg(rt));
  for (int d = 0; d < 4; d++) {
    bool last = d >= 2; /* x is the stage axis, major */
    UT_CHECK(r.has[d] == last, "device %d: result %s", d, r.has[d] ? "held off the last stage" : "missing");
    for (int i = 0; last && i < 4; i++) {
      float want = (float)((0 + 10 + 20) + 3 * i + 3 * (100 + i) + 3 * (200 + i));
      UT_CHECK(r.result[d][i] == want, "device %d element %d: %g, want %g", d, i, r.result[d][i], want);
    }
  }
  for (int d = 0; d < 4; d++) {
    RtStats st;
    rt_stats(rt, d, &st);
    UT_CHECK(st.mem_current == 0, "device %d still holds %zu bytes", d, st.mem_current);
  }
  rt_close(rt);
  ut_end();
}

/* ---- rings over several axes, by hand ---- */

typedef struct Ring {
  int shift;
  int got[6];
} Ring;

static int ring_device(RtDevice *dev, void *arg) {
  Ring *r = arg;
  int d = rt_device_index(dev);
  int32_t mine = d, got = -1;
  static const int yx[2] = {1, 0};
  int rc = rt_permute_shift(dev, yx, 2, RT_I32, &mine, &got, 1, r->shift);
  r->got[d] = got;
  return rc;
}

static void test_rings(void) {
  /* mesh [x: 2, y: 3]; over (y, x) rank = y * 2 + x: device (x, y) = 3x + y. */
  static const int shifts[] = {1, -1, 7};
  for (int s = 0; s < 3; s++) {
    char name[96];
    snprintf(name, sizeof name, "permute: a ring shift by %+d over (y, x) on [x: 2, y: 3], worked by hand", shifts[s]);
    ut_begin(name);
    RtConfig cfg = test_mesh(2, (int[]){2, 3});
    Runtime *rt;
    rt_open(&cfg, &rt);
    Ring r = {.shift = shifts[s]};
    int rc = rt_run(rt, ring_device, &r);
    UT_CHECK(rc == RT_OK, "rt_run: %s", rt_errmsg(rt));
    /* rank -> device: 0->0, 1->3, 2->1, 3->4, 4->2, 5->5 */
    static const int dev_of_rank[6] = {0, 3, 1, 4, 2, 5};
    for (int rank = 0; rank < 6; rank++) {
      int from = dev_of_rank[((rank - shifts[s]) % 6 + 6) % 6];
      UT_CHECK(r.got[dev_of_rank[rank]] == from, "rank %d (device %d) got %d, want %d", rank, dev_of_rank[rank],
               r.got[dev_of_rank[rank]], from);
    }
    rt_close(rt);
    ut_end();
  }
}

/* ---- NaN in a max, empty buffers ---- */

static int nan_device(RtDevice *dev, void *arg) {
  float *out = arg;
  int d = rt_device_index(dev);
  float in[3] = {(float)d, d == 2 ? NAN : (float)-d, 1};
  static const int x[1] = {0};
  int rc = rt_all_reduce(dev, x, 1, RT_F32, RT_MAX, in, out + 3 * d, 3);
  if (!rc) rc = rt_all_reduce(dev, x, 1, RT_F32, RT_SUM, in, in, 0);
  if (!rc) rc = rt_all_gather(dev, x, 1, RT_F32, in, out, 3, 0, 2);
  return rc;
}

static void test_nan_and_empty(void) {
  ut_begin("all_reduce max keeps a NaN from any rank; empty collectives are fine");
  RtConfig cfg = test_mesh(1, (int[]){4});
  Runtime *rt;
  rt_open(&cfg, &rt);
  float out[12];
  int rc = rt_run(rt, nan_device, out);
  UT_CHECK(rc == RT_OK, "rt_run: %s", rt_errmsg(rt));
  for (int d = 0; d < 4; d++) {
    UT_CHECK(out[3 * d] == 3, "device %d: max %g, want 3", d, out[3 * d]);
    UT_CHECK(isnan(out[3 * d + 1]), "device %d: max with a NaN is %g", d, out[3 * d + 1]);
  }
  rt_close(rt);
  ut_end();
}

/* ---- a group that makes different calls ---- */

typedef struct Mismatch {
  int variant;
} Mismatch;

static int mismatch_device(RtDevice *dev, void *arg) {
  Mismatch *m = arg;
  int d = rt_device_index(dev);
  float in[24] = {0}, out[96];
  static const int x[1] = {0};
  if (d != 1) return rt_all_reduce(dev, x, 1, RT_F32, RT_SUM, in, out, 24);
  switch (m->variant) {
  case 0: return rt_all_gather(dev, x, 1, RT_F32, in, out, 1, 24, 1);
  case 1: return rt_all_reduce(dev, x, 1, RT_F32, RT_SUM, in, out, 23);
  case 2: return rt_all_reduce(dev, x, 1, RT_BF16, RT_SUM, in, out, 24);
  case 3: return rt_all_reduce(dev, x, 1, RT_F32, RT_MAX, in, out, 24);
  default: return rt_barrier(dev, x, 1); /* one round: it may leave before the others look */
  }
}

/* The other way round: everyone at a barrier but device 1, in an all_reduce. */
static int mismatch_at_barrier(RtDevice *dev, void *arg) {
  float in[4] = {0}, out[4];
  static const int x[1] = {0};
  if (rt_device_index(dev) == 1) return rt_all_reduce(dev, x, 1, RT_F32, RT_SUM, in, out, 4);
  return rt_barrier(dev, x, 1);
}

static void test_mismatch(void) {
  static const char *const want[] = {"all_gather over (x) of f32 [1, 24, 1]", "all_reduce over (x) of 23 f32",
                                     "all_reduce over (x) of 24 bf16", "all_reduce", "barrier over (x)",
                                     "all_reduce over (x) of 4 f32"};
  for (int v = 0; v < 6; v++) {
    char name[96];
    snprintf(name, sizeof name, "a group that calls different collectives fails, naming both calls (%d)", v);
    ut_begin(name);
    RtConfig cfg = test_mesh(1, (int[]){4});
    Runtime *rt;
    rt_open(&cfg, &rt);
    Mismatch m = {v};
    double t0 = rt_seconds();
    int rc = rt_run(rt, v == 5 ? mismatch_at_barrier : mismatch_device, &m);
    UT_CHECK(rc == RT_E_MISMATCH, "rt_run returned %s: %s", rt_status_name(rc), rt_errmsg(rt));
    UT_CHECK(contains(rt_errmsg(rt), want[v]), "message: %s", rt_errmsg(rt));
    UT_CHECK(contains(rt_errmsg(rt), "device 1 [x=1]"), "message: %s", rt_errmsg(rt));
    UT_CHECK(rt_seconds() - t0 < 1.0, "took %.2f s", rt_seconds() - t0);
    rt_close(rt);
    ut_end();
  }
}

/* ---- barriers between collectives ---- */

/* One-round barriers interleaved with two-round collectives on the same group and on others:
 * every result still right, 50 times over. */
static int interleave_device(RtDevice *dev, void *arg) {
  int *bad = arg, d = rt_device_index(dev), rc = RT_OK;
  static const int x[1] = {0}, y[1] = {1}, xy[2] = {0, 1};
  for (int it = 0; it < 50 && !rc; it++) {
    int32_t v = d * 100 + it, sum = -1, gathered[2] = {-1, -1};
    if ((rc = rt_barrier(dev, x, 1))) break;
    if ((rc = rt_all_reduce(dev, x, 1, RT_I32, RT_SUM, &v, &sum, 1))) break;
    if ((rc = rt_barrier(dev, xy, 2)) || (rc = rt_barrier(dev, x, 1))) break;
    if ((rc = rt_all_gather(dev, y, 1, RT_I32, &v, gathered, 1, 1, 1))) break;
    if ((rc = rt_barrier(dev, y, 1))) break;
    /* mesh [x: 3, y: 2]: device = 2x + y */
    int y0 = d % 2, want_sum = 0;
    for (int xx = 0; xx < 3; xx++) want_sum += (2 * xx + y0) * 100 + it;
    if (sum != want_sum || gathered[0] != (d - y0) * 100 + it || gathered[1] != (d - y0 + 1) * 100 + it) bad[d]++;
  }
  return rc;
}

static void test_barriers_interleaved(void) {
  ut_begin("barriers interleaved with collectives on the same and other groups, 50 rounds");
  RtConfig cfg = test_mesh(2, (int[]){3, 2});
  Runtime *rt;
  rt_open(&cfg, &rt);
  int bad[6] = {0};
  int rc = rt_run(rt, interleave_device, bad);
  UT_CHECK(rc == RT_OK, "rt_run: %s", rt_errmsg(rt));
  for (int d = 0; d < 6; d++) UT_CHECK(!bad[d], "device %d: %d wrong rounds", d, bad[d]);
  rt_close(rt);
  ut_end();
}

/* ---- group queries ---- */

static int rank_device(RtDevice *dev, void *arg) {
  int *ranks = arg;
  static const int zx[2] = {2, 0};
  int d = rt_device_index(dev);
  ranks[2 * d] = rt_group_rank(dev, zx, 2);
  ranks[2 * d + 1] = rt_group_size(dev, zx, 2);
  return RT_OK;
}

static void test_group_rank(void) {
  ut_begin("rt_group_rank and rt_group_size agree with the brute-force groups");
  RtConfig cfg = test_mesh(3, (int[]){2, 3, 2});
  Runtime *rt;
  rt_open(&cfg, &rt);
  int ranks[24];
  rt_run(rt, rank_device, ranks);
  for (int d = 0; d < 12; d++) {
    int members[12], rank = -1;
    int n = test_group(&cfg, d, (int[]){2, 0}, 2, members, &rank);
    UT_CHECK(ranks[2 * d] == rank && ranks[2 * d + 1] == n, "device %d: rank %d of %d, want %d of %d", d,
             ranks[2 * d], ranks[2 * d + 1], rank, n);
  }
  rt_close(rt);
  ut_end();
}

int main(void) {
  test_matrix();
  test_determinism();
  test_send_recv();
  test_pipeline();
  test_all_reduce_group();
  test_rt_pipeline();
  test_rings();
  test_nan_and_empty();
  test_mismatch();
  test_barriers_interleaved();
  test_group_rank();
  return ut_summary();
}
