/* random.c: counter-based random numbers. A value is a pure function of (seed, tensor id,
 * global element index), so a device generates exactly the elements of its shard, in any
 * order, and a run on 1 device and a run on 64 see the same numbers (the "values are
 * generated per global index"). The hash is splitmix64's finaliser:
 *
 *   mix(z)  = z ^= z >> 30, z *= 0xbf58476d1ce4e5b9, z ^= z >> 27, z *= 0x94d049bb133111eb, z ^ z >> 31
 *   key     = mix(seed ^ mix(tensor + G))          G = 0x9e3779b97f4a7c15
 *   bits(i) = mix(key + (i + 1) * G)               (splitmix64's i-th output from state key)
 *
 * Generated code may compute the same inline; docs/runtime.md states it for that reason. */
#include <math.h>

#include "dtype.h"
#include "rt_internal.h"

#define GOLDEN 0x9e3779b97f4a7c15ull

static inline uint64_t mix(uint64_t z) {
  z = (z ^ z >> 30) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ z >> 27) * 0x94d049bb133111ebull;
  return z ^ z >> 31;
}

static inline uint64_t key_of(uint64_t seed, uint64_t tensor) { return mix(seed ^ mix(tensor + GOLDEN)); }
static inline uint64_t bits_at(uint64_t key, uint64_t index) { return mix(key + (index + 1) * GOLDEN); }

/* The top 24 bits, so that u is exact in a float: [0, 1) in steps of 2^-24. */
static inline float uniform(uint64_t bits, float lo, float hi) {
  double u = (double)(bits >> 40) * 0x1p-24;
  float x = (float)((double)lo + ((double)hi - (double)lo) * u);
  return x >= hi && hi > lo ? nextafterf(hi, lo) : x; /* rounding to f32 may reach hi */
}

static inline int32_t integer(uint64_t bits, int32_t lo, int32_t hi) {
  if (hi <= lo) return lo;
  uint64_t range = (uint64_t)((int64_t)hi - lo);
  return (int32_t)(lo + (int64_t)(((bits >> 32) * range) >> 32));
}

uint64_t rt_random_bits(uint64_t seed, uint64_t tensor, uint64_t index) {
  return bits_at(key_of(seed, tensor), index);
}

float rt_random_float(uint64_t seed, uint64_t tensor, uint64_t index, float lo, float hi) {
  return uniform(rt_random_bits(seed, tensor, index), lo, hi);
}

int32_t rt_random_int(uint64_t seed, uint64_t tensor, uint64_t index, int32_t lo, int32_t hi) {
  return integer(rt_random_bits(seed, tensor, index), lo, hi);
}

int rt_random_fill(void *out, RtDtype dt, const RtBlock *b, uint64_t seed, uint64_t tensor, double lo, double hi) {
  if (!b || b->ndims < 0 || b->ndims > RT_MAX_RANK || !rt_dtype_size(dt)) return RT_E_ARG;
  bool integral = lo == floor(lo) && hi == floor(hi) && lo >= INT32_MIN && hi <= (double)INT32_MAX + 1 && hi > lo;
  if (dt == RT_I32 && !integral) return RT_E_ARG;
  int64_t count = 1, s = 1, gstride[RT_MAX_RANK] = {0};
  for (int i = b->ndims - 1; i >= 0; i--) {
    if (b->start[i] < 0 || b->shape[i] < 0 || b->start[i] + b->shape[i] > b->global[i]) return RT_E_ARG;
    gstride[i] = s;
    s *= b->global[i];
    count *= b->shape[i];
  }
  if (!count) return RT_OK;
  if (!out) return RT_E_ARG;
  uint64_t key = key_of(seed, tensor);
  int nd = b->ndims;
  int64_t inner = nd ? b->shape[nd - 1] : 1;
  int64_t idx[RT_MAX_RANK] = {0};
  /* hi as an int32 may be 2^31 (exclusive): keep the range in 64 bits. */
  int32_t ilo = dt == RT_I32 ? (int32_t)lo : 0;
  int64_t ihi = dt == RT_I32 ? (int64_t)hi : 0;
  for (size_t at = 0; at < (size_t)count; at += (size_t)inner) {
    uint64_t g = 0;
    for (int i = 0; i < nd; i++) g += (uint64_t)((b->start[i] + idx[i]) * gstride[i]);
    for (int64_t j = 0; j < inner; j++) {
      uint64_t bits = bits_at(key, g + (uint64_t)j);
      size_t k = at + (size_t)j;
      switch (dt) {
      case RT_F32: ((float *)out)[k] = uniform(bits, (float)lo, (float)hi); break;
      case RT_BF16: ((uint16_t *)out)[k] = rtd_to_bf16(uniform(bits, (float)lo, (float)hi)); break;
      case RT_F16: ((uint16_t *)out)[k] = rtd_to_f16(uniform(bits, (float)lo, (float)hi)); break;
      case RT_F8E4M3: ((uint8_t *)out)[k] = rtd_to_f8e4m3(uniform(bits, (float)lo, (float)hi)); break;
      case RT_F8E5M2: ((uint8_t *)out)[k] = rtd_to_f8e5m2(uniform(bits, (float)lo, (float)hi)); break;
      default:
        ((int32_t *)out)[k] = (int32_t)(ilo + (int64_t)(((bits >> 32) * (uint64_t)(ihi - ilo)) >> 32));
        break;
      }
    }
    for (int i = nd - 2; i >= 0 && ++idx[i] == b->shape[i]; i--) idx[i] = 0;
  }
  return RT_OK;
}
