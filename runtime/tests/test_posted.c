/* test_posted.c: posted permutes (rt_permute_shift_start, rt_wait) under the threads backend.
 * Expected blocks come from a formula (rank r's block holds r x 1e5 + i; after j ring steps of
 * shift s, rank r holds rank r - j s's), never from the runtime. Cases:
 *   - rings of n - 1 posted steps (as the collective matmul runs them) over 2, 3, 4 and 8 devices,
 *     shifts +1, -1, +2, with work between post and wait and random delays;
 *   - a device posting two permutes before waiting, waiting in either order;
 *   - a post followed by another collective before the wait, in different orders on different
 *     devices (a design where only the receiver copies would deadlock here);
 *   - a slow sender (device 0 sleeps before every post);
 *   - _start does not wait for the peers: a device posts while its peer is held back until
 *     that post has returned (a start with a rendezvous would never return);
 *   - failures: a changed send buffer (debug and sanitizer builds), a device that returns
 *     without waiting, a peer that never posts, calls that differ, too many posts, a timeout.
 * CI runs this under TSan (`ctest -R runtime`) and ASan. */
#include "rt_test.h"

#include "rt_internal.h" /* RT_POST_CHECKS: whether this build checks the ownership rules */

static const int X[1] = {0};


static float value(int rank, int64_t i) { return (float)(rank * 100000 + (int)(i % 50000)); }

/* Work between post and wait: reads the send buffer (allowed) and burns a little time. */
static double busy(const float *in, int64_t count, int rounds) {
  double s = 0;
  for (int r = 0; r < rounds; r++)
    for (int64_t i = 0; i < count; i++) s += in[i] * 1e-9;
  return s;
}

static uint64_t rng(uint64_t *s) {
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  return *s;
}

/* ---- rings ---- */

typedef struct Ring {
  int n, shift;
  int64_t count;
  int slow; /* device 0 sleeps this many us before each post */
  bool jitter;
  _Atomic int bad; /* first wrong element, as device x 1e6 + step */
  char why[256];
} Ring;

static int ring_device(RtDevice *dev, void *arg) {
  Ring *k = arg;
  int d = rt_device_index(dev), n = k->n;
  float *a = malloc(sizeof(float) * (size_t)k->count), *b = malloc(sizeof(float) * (size_t)k->count);
  for (int64_t i = 0; i < k->count; i++) a[i] = value(d, i);
  float *cur = a, *next = b;
  uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(d + 1);
  int rc = RT_OK;
  double sink = 0;
  for (int j = 0; j < n - 1 && !rc; j++) {
    if (k->slow && d == 0) test_sleep_us(k->slow);
    RtRequest *req;
    if ((rc = rt_permute_shift_start(dev, TG(X, 1), RT_F32, cur, next, k->count, k->shift, &req))) break;
    sink += busy(cur, k->count, 1 + (int)(rng(&seed) % 3));
    if (k->jitter) test_sleep_us((int)(rng(&seed) % 300));
    if ((rc = rt_wait(dev, req))) break;
    int from = (int)((((d - (int64_t)(j + 1) * k->shift) % n) + n) % n);
    for (int64_t i = 0; i < k->count; i++)
      if (next[i] != value(from, i)) {
        int expect = 0;
        if (atomic_compare_exchange_strong(&k->bad, &expect, d * 1000000 + j + 1))
          snprintf(k->why, sizeof k->why, "device %d step %d element %lld: got %g, want %g (rank %d's)", d, j,
                   (long long)i, next[i], value(from, i), from);
        break;
      }
    float *t = cur;
    cur = next, next = t;
  }
  free(a);
  free(b);
  return rc + (sink < 0); /* sink keeps busy() */
}

static void test_rings(void) {
  static const struct {
    int n, shift;
    int64_t count;
    int slow;
  } cases[] = {{2, 1, 1000, 0}, {3, 1, 777, 0}, {3, 2, 777, 0}, {4, -1, 4096, 0}, {4, 1, 100000, 0},
               {8, 1, 513, 0},  {8, -1, 2000, 0}, {4, 1, 3000, 20000}, {1, 1, 50, 0}};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    for (int jit = 0; jit < 2; jit++) {
      char name[160];
      snprintf(name, sizeof name, "posted ring: %d devices, shift %+d, %lld floats%s%s", cases[c].n, cases[c].shift,
               (long long)cases[c].count, cases[c].slow ? ", a slow sender" : "", jit ? ", random delays" : "");
      ut_begin(name);
      int sz[1] = {cases[c].n};
      RtConfig cfg = test_mesh(1, sz);
      Runtime *rt;
      int rc = rt_open(&cfg, &rt);
      UT_CHECK(rc == RT_OK, "rt_open: %s", rt_status_name(rc));
      Ring k = {.n = cases[c].n, .shift = cases[c].shift, .count = cases[c].count, .slow = cases[c].slow, .jitter = jit};
      for (int run = 0; run < (jit ? 5 : 1) && ut_ok(); run++) {
        rc = rt_run(rt, ring_device, &k);
        UT_CHECK(rc == RT_OK, "run %d: %s: %s", run, rt_status_name(rc), rt_errmsg(rt));
        UT_CHECK(!atomic_load(&k.bad), "run %d: %s", run, k.why);
      }
      rt_close(rt);
      ut_end();
    }
  }
}

/* ---- two posted at once, and a collective in between ---- */

typedef struct Two {
  int n;
  int64_t count;
  _Atomic int bad;
  char why[256];
} Two;

static void two_bad(Two *k, const char *fmt, int d, int64_t i, double got, double want) {
  int expect = 0;
  if (atomic_compare_exchange_strong(&k->bad, &expect, 1)) snprintf(k->why, sizeof k->why, fmt, d, (long long)i, got, want);
}

/* Posts +1 (a -> a2) and -1 (b -> b2), then waits: even devices in post order, odd ones reversed;
 * then posts +1 again and calls an all_reduce before (odd) or after (even) its wait. */
static int two_device(RtDevice *dev, void *arg) {
  Two *k = arg;
  int d = rt_device_index(dev), n = k->n, rc;
  size_t bytes = sizeof(float) * (size_t)k->count;
  float *a = malloc(bytes), *b = malloc(bytes), *a2 = malloc(bytes), *b2 = malloc(bytes);
  for (int64_t i = 0; i < k->count; i++) a[i] = value(d, i), b[i] = -value(d, i);
  RtRequest *ra, *rb;
  if ((rc = rt_permute_shift_start(dev, TG(X, 1), RT_F32, a, a2, k->count, 1, &ra))) goto out;
  if ((rc = rt_permute_shift_start(dev, TG(X, 1), RT_F32, b, b2, k->count, -1, &rb))) goto out;
  double sink = busy(a, k->count, 2) + busy(b, k->count, 1);
  if (d % 2) {
    if ((rc = rt_wait(dev, rb)) || (rc = rt_wait(dev, ra))) goto out;
  } else {
    if ((rc = rt_wait(dev, ra)) || (rc = rt_wait(dev, rb))) goto out;
  }
  int up = (d - 1 + n) % n, down = (d + 1) % n;
  for (int64_t i = 0; i < k->count; i++) {
    if (a2[i] != value(up, i)) two_bad(k, "device %d: +1 element %lld: got %g, want %g", d, i, a2[i], value(up, i));
    if (b2[i] != -value(down, i)) two_bad(k, "device %d: -1 element %lld: got %g, want %g", d, i, b2[i], -value(down, i));
  }
  /* a post, then an all_reduce (sum of d + 1 over the ring: n (n + 1) / 2) before or after the wait */
  RtRequest *rc2;
  float s = (float)(d + 1), total = 0;
  if ((rc = rt_permute_shift_start(dev, TG(X, 1), RT_F32, a, b2, k->count, 1, &rc2))) goto out;
  if (d % 2) {
    if ((rc = rt_all_reduce(dev, TG(X, 1), RT_F32, RT_SUM, &s, &total, 1)) || (rc = rt_wait(dev, rc2))) goto out;
  } else {
    if ((rc = rt_wait(dev, rc2)) || (rc = rt_all_reduce(dev, TG(X, 1), RT_F32, RT_SUM, &s, &total, 1))) goto out;
  }
  if (total != (float)(n * (n + 1) / 2)) two_bad(k, "device %d: all_reduce %lld: got %g, want %g", d, 0, total, n * (n + 1) / 2.0);
  for (int64_t i = 0; i < k->count; i++)
    if (b2[i] != value(up, i)) two_bad(k, "device %d: third permute element %lld: got %g, want %g", d, i, b2[i], value(up, i));
  rc = sink < 0;
out:
  free(a), free(b), free(a2), free(b2);
  return rc;
}

static void test_two_and_between(void) {
  static const int ns[] = {2, 3, 4, 8};
  for (size_t c = 0; c < sizeof ns / sizeof *ns; c++) {
    char name[160];
    snprintf(name, sizeof name, "posted: two permutes before the waits, then one across an all_reduce, %d devices", ns[c]);
    ut_begin(name);
    int sz[1] = {ns[c]};
    RtConfig cfg = test_mesh(1, sz);
    cfg.timeout_s = 20;
    Runtime *rt;
    int rc = rt_open(&cfg, &rt);
    UT_CHECK(rc == RT_OK, "rt_open: %s", rt_status_name(rc));
    Two k = {.n = ns[c], .count = 5000};
    for (int run = 0; run < 10 && ut_ok(); run++) {
      rc = rt_run(rt, two_device, &k);
      UT_CHECK(rc == RT_OK, "run %d: %s: %s", run, rt_status_name(rc), rt_errmsg(rt));
      UT_CHECK(!atomic_load(&k.bad), "run %d: %s", run, k.why);
    }
    rt_close(rt);
    ut_end();
  }
}

/* ---- _start returns without its peers ---- */

typedef struct Ahead {
  _Atomic int posted; /* device 1 returned from its _start */
  int waited_ms;      /* how long device 0 waited for that */
  float got[2][16];
} Ahead;

static int ahead_device(RtDevice *dev, void *arg) {
  Ahead *k = arg;
  int d = rt_device_index(dev), rc;
  float in[16];
  for (int i = 0; i < 16; i++) in[i] = value(d, i);
  RtRequest *req;
  if (d == 0) { /* held back until device 1's post returned: at most 20 s */
    int ms = 0;
    while (!atomic_load(&k->posted) && ms < 20000) test_sleep_us(1000), ms++;
    k->waited_ms = ms;
  }
  if ((rc = rt_permute_shift_start(dev, TG(X, 1), RT_F32, in, k->got[d], 16, 1, &req))) return rc;
  if (d == 1) atomic_store(&k->posted, 1);
  return rt_wait(dev, req);
}

static void test_start_does_not_wait(void) {
  ut_begin("posted: _start returns before the peer has posted (device 0 posts only after device 1's _start returned)");
  int sz[1] = {2};
  RtConfig cfg = test_mesh(1, sz);
  cfg.timeout_s = 60;
  Runtime *rt;
  int rc = rt_open(&cfg, &rt);
  UT_CHECK(rc == RT_OK, "rt_open: %s", rt_status_name(rc));
  Ahead k = {0};
  rc = rt_run(rt, ahead_device, &k);
  UT_CHECK(rc == RT_OK, "%s: %s", rt_status_name(rc), rt_errmsg(rt));
  UT_CHECK(atomic_load(&k.posted) && k.waited_ms < 20000, "device 1's _start did not return before device 0 posted");
  for (int i = 0; i < 16; i++) {
    UT_CHECK(k.got[0][i] == value(1, i), "device 0 element %d: got %g, want %g", i, k.got[0][i], value(1, i));
    UT_CHECK(k.got[1][i] == value(0, i), "device 1 element %d: got %g, want %g", i, k.got[1][i], value(0, i));
  }
  rt_close(rt);
  ut_end();
}

/* ---- failures ---- */

enum { F_WRITE_IN, F_NO_WAIT, F_NO_POST, F_COUNTS, F_TOO_MANY, F_TIMEOUT, F_COUNT };

/* The request device 1 never waits for (F_NO_WAIT): the program's leak, freed by the test after
 * the run (a request is the front end's calloc, rt_internal.h). */
static RtRequest *never_waited;

static int fail_device(RtDevice *dev, void *arg) {
  int what = *(int *)arg, d = rt_device_index(dev), rc;
  static float in[2][64], out[2][64];
  RtRequest *req[RT_MAX_POSTED + 1];
  for (int i = 0; i < 64; i++) in[d][i] = value(d, i);
  switch (what) {
  case F_WRITE_IN:
    if ((rc = rt_permute_shift_start(dev, TG(X, 1), RT_F32, in[d], out[d], 64, 1, &req[0]))) return rc;
    if (d == 0) in[0][5] += 1; /* breaks the rule */
    return rt_wait(dev, req[0]);
  case F_NO_WAIT:
    if ((rc = rt_permute_shift_start(dev, TG(X, 1), RT_F32, in[d], out[d], 64, 1, &req[0]))) return rc;
    if (d == 1) never_waited = req[0];
    return d == 1 ? RT_OK : rt_wait(dev, req[0]);
  case F_NO_POST:
    if (d == 1) return RT_OK;
    if ((rc = rt_permute_shift_start(dev, TG(X, 1), RT_F32, in[d], out[d], 64, 1, &req[0]))) return rc;
    return rt_wait(dev, req[0]);
  case F_COUNTS:
    if ((rc = rt_permute_shift_start(dev, TG(X, 1), RT_F32, in[d], out[d], 32 + d, 1, &req[0]))) return rc;
    return rt_wait(dev, req[0]);
  case F_TOO_MANY:
    for (int i = 0; i <= RT_MAX_POSTED; i++)
      if ((rc = rt_permute_shift_start(dev, TG(X, 1), RT_F32, in[d] + i, out[d] + i, 1, 1, &req[i]))) {
        for (int k = 0; k < i; k++) rt_wait(dev, req[k]); /* the run stopped: each ends at once */
        return rc;
      }
    return RT_OK;
  default: /* F_TIMEOUT: device 1 posts long after device 0's timeout */
    if (d == 1) test_sleep_us(1500000);
    if ((rc = rt_permute_shift_start(dev, TG(X, 1), RT_F32, in[d], out[d], 64, 1, &req[0]))) return rc;
    return rt_wait(dev, req[0]);
  }
}

static void test_failures(void) {
  static const char *names[F_COUNT] = {"a sender writes its send buffer before its wait", "a device returns without waiting",
                                       "a peer never posts", "peers post different counts", "a device posts too many",
                                       "a wait times out"};
  for (int what = 0; what < F_COUNT; what++) {
    char name[160];
    snprintf(name, sizeof name, "posted failure: %s", names[what]);
    if (what == F_WRITE_IN && !RT_POST_CHECKS) {
      printf("SKIP %s (this build does not check the ownership rules: NDEBUG without a sanitizer)\n", name);
      continue;
    }
    ut_begin(name);
    int sz[1] = {what == F_TOO_MANY ? 1 : 2};
    RtConfig cfg = test_mesh(1, sz);
    cfg.timeout_s = what == F_TIMEOUT ? 0.3 : 20;
    Runtime *rt;
    int rc = rt_open(&cfg, &rt);
    UT_CHECK(rc == RT_OK, "rt_open: %s", rt_status_name(rc));
    double t0 = rt_seconds();
    rc = rt_run(rt, fail_device, &what);
    double took = rt_seconds() - t0;
    free(never_waited);
    never_waited = NULL;
    const char *msg = rt_errmsg(rt);
    switch (what) {
    case F_WRITE_IN:
      UT_CHECK(rc == RT_E_ARG && contains(msg, "device 0 [x=0]") && contains(msg, "send buffer changed"), "%s: %s",
               rt_status_name(rc), msg);
      break;
    case F_NO_WAIT: /* device 1's own message, or device 0 finding it gone */
      UT_CHECK(rc != RT_OK && (contains(msg, "device 1 [x=1]: returned with 1 posted permute it never waited for") ||
                               contains(msg, "without posting it")),
               "%s: %s", rt_status_name(rc), msg);
      break;
    case F_NO_POST:
      UT_CHECK(rc == RT_E_MISMATCH && contains(msg, "device 0 [x=0]: wait for collective_permute over (x): device 1 [x=1]") &&
                   contains(msg, "without posting it"),
               "%s: %s", rt_status_name(rc), msg);
      UT_CHECK(took < 10, "noticed after %.1f s", took);
      break;
    case F_COUNTS:
      UT_CHECK(rc == RT_E_MISMATCH && contains(msg, "posted collective_permute over (x) of 3") && contains(msg, "f32"),
               "%s: %s", rt_status_name(rc), msg);
      break;
    case F_TOO_MANY:
      UT_CHECK(rc == RT_E_LIMIT && contains(msg, "17 permutes posted and not waited for: the most a device may hold is 16"),
               "%s: %s", rt_status_name(rc), msg);
      break;
    default:
      UT_CHECK(rc == RT_E_TIMEOUT && contains(msg, "device 0 [x=0]: wait for collective_permute over (x) timed out after 0.3 s") &&
                   contains(msg, "device 1 [x=1]"),
               "%s: %s", rt_status_name(rc), msg);
      break;
    }
    for (int d = 0; d < sz[0]; d++) {
      RtStats s;
      rt_stats(rt, d, &s);
      UT_CHECK(s.mem_current == 0, "device %d leaks %zu bytes", d, s.mem_current);
    }
    rt_close(rt);
    ut_end();
  }
}

int main(void) {
  test_rings();
  test_two_and_between();
  test_start_does_not_wait();
  test_failures();
  return ut_summary();
}
