/* rt_test.h: what the runtime's tests share: the unit-test harness (tests/unit/unit_test.h),
 * meshes, the test's own model of groups, and reference roundings.
 *
 * Expected values are computed here independently of the runtime: groups by brute force over
 * all devices (not the runtime's mixed-radix walk), bf16/f16 rounding from the value with
 * frexp/ldexp/nearbyint (not from the bits, as runtime/dtype.h does). */
#ifndef SHARDRT_TEST_H
#define SHARDRT_TEST_H

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shardrt.h"
#include "unit_test.h"

static const char *const test_axis_names[] = {"x", "y", "z", "w"};

/* Which devices' results this process checks: every one under threads; test_mpi.c, which runs
 * test_collectives.c's matrix over MPI, checks its rank's own. */
#ifndef RT_TEST_LOCAL
#define RT_TEST_LOCAL(dev) 1
#endif

static inline RtConfig test_mesh(int naxes, const int *sizes) {
  RtConfig c = {0};
  c.naxes = naxes;
  for (int a = 0; a < naxes; a++) {
    c.axis_size[a] = sizes[a];
    c.axis_name[a] = test_axis_names[a];
  }
  return c;
}

static inline int test_devices(const RtConfig *c) {
  int n = 1;
  for (int a = 0; a < c->naxes; a++) n *= c->axis_size[a];
  return n;
}

/* A device's coordinate on an axis: the last axis varies fastest. */
static inline int test_coord(const RtConfig *c, int dev, int axis) {
  int below = 1;
  for (int a = c->naxes - 1; a > axis; a--) below *= c->axis_size[a];
  return dev / below % c->axis_size[axis];
}

/* The group of dev over the tuple, by brute force: every device equal to dev off the tuple,
 * placed at its rank (coordinates on the tuple, first axis most significant). Returns n. */
static inline int test_group(const RtConfig *c, int dev, const int *tuple, int ntuple, int *members, int *my_rank) {
  int n = 1;
  for (int k = 0; k < ntuple; k++) n *= c->axis_size[tuple[k]];
  for (int e = 0; e < test_devices(c); e++) {
    int same = 1;
    for (int a = 0; a < c->naxes; a++) {
      int on_tuple = 0;
      for (int k = 0; k < ntuple; k++) on_tuple |= tuple[k] == a;
      if (!on_tuple && test_coord(c, e, a) != test_coord(c, dev, a)) same = 0;
    }
    if (!same) continue;
    int r = 0;
    for (int k = 0; k < ntuple; k++) r = r * c->axis_size[tuple[k]] + test_coord(c, e, tuple[k]);
    members[r] = e;
    if (e == dev) *my_rank = r;
  }
  return n;
}

/* Rounds x to p significant bits, exponents down to emin (below: the subnormal quantum), ties
 * to even; past fmax, infinity. */
static inline double ref_round(double x, int p, int emin, double fmax) {
  if (x != x || x == 0 || isinf(x)) return x;
  int e;
  frexp(fabs(x), &e); /* |x| in [2^(e-1), 2^e) */
  int lead = e - 1 < emin ? emin : e - 1;
  double q = ldexp(1.0, lead - (p - 1));
  double r = nearbyint(x / q) * q;
  return fabs(r) > fmax ? copysign(INFINITY, x) : r;
}

static inline double ref_round_bf16(double x) { return ref_round(x, 8, -126, 0x1.fep127); }
static inline double ref_round_f16(double x) { return ref_round(x, 11, -14, 65504.0); }

static inline uint32_t test_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static inline float test_float(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* The bf16 pattern of a value bf16 holds exactly: f32's top half. */
static inline uint16_t ref_bf16_bits(double v) {
  if (v != v) return 0x7fc0;
  return (uint16_t)(test_bits((float)v) >> 16);
}

static inline uint16_t ref_f16_bits(double v) {
  uint16_t s = signbit(v) ? 0x8000 : 0;
  v = fabs(v);
  if (v != v) return 0x7e00;
  if (isinf(v)) return (uint16_t)(s | 0x7c00);
  if (v < 0x1p-14) return (uint16_t)(s | (uint16_t)(v / 0x1p-24));
  int e;
  double m = frexp(v, &e); /* v = m 2^e, m in [0.5, 1) */
  return (uint16_t)(s | (e - 1 + 15) << 10 | (uint16_t)((m * 2 - 1) * 1024));
}

static inline double ref_bf16_value(uint16_t h) { return test_float((uint32_t)h << 16); }

static inline double ref_f16_value(uint16_t h) {
  int e = h >> 10 & 0x1f, m = h & 0x3ff;
  double s = h & 0x8000 ? -1 : 1;
  if (e == 31) return m ? NAN : s * INFINITY;
  if (e == 0) return s * m * 0x1p-24;
  return s * ldexp(1 + m / 1024.0, e - 15);
}

/* The test's own generator for input values (not the runtime's): 64-bit LCG, top bits. */
static inline uint64_t test_hash(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t z = a * 0x2545f4914f6cdd1dull + b * 0x9e3779b97f4a7c15ull + c * 0xd1b54a32d192ed03ull + 1;
  for (int i = 0; i < 3; i++) z = z * 6364136223846793005ull + 1442695040888963407ull, z ^= z >> 29;
  return z;
}

/* A value in [-1, 1) with every f32 mantissa bit used, so sums round. */
static inline float test_value(uint64_t a, uint64_t b, uint64_t c) {
  return (float)((double)(test_hash(a, b, c) >> 11) * 0x1p-52 - 1.0);
}

static inline void test_sleep_us(long us) {
  struct timespec ts = {us / 1000000, us % 1000000 * 1000};
  nanosleep(&ts, NULL);
}

static inline int contains(const char *s, const char *part) { return strstr(s, part) != NULL; }

#endif
