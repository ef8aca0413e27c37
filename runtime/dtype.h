/* dtype.h: bf16, f16, f8e4m3 and f8e5m2 <-> f32, round to nearest even, as inline functions for the runtime's
 * loops (kernels.c, gemm.c, random.c); shardrt.h exports the same as rt_f32_to_bf16 and the
 * others. Integer arithmetic on the bits, so results do not depend on the compiler's or the
 * CPU's half-precision support. */
#ifndef SHARDRT_DTYPE_H
#define SHARDRT_DTYPE_H

#include <stdint.h>
#include <string.h>

static inline uint32_t rtd_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static inline float rtd_float(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* bf16 is f32's top half: round the low 16 bits away (to even), a carry moving into the
 * exponent as it should (the largest values round to infinity). A NaN stays a quiet NaN. */
static inline uint16_t rtd_to_bf16(float x) { /* branch-free, so that loops of it vectorise */
  uint32_t u = rtd_bits(x);
  uint32_t rounded = (u + 0x7fffu + (u >> 16 & 1u)) >> 16, quiet = u >> 16 | 0x0040u;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

static inline float rtd_from_bf16(uint16_t h) { return rtd_float((uint32_t)h << 16); }

/* f16: 5 exponent bits (bias 15), 10 mantissa bits; largest finite 65504; subnormals below
 * 2^-14 in steps of 2^-24. */
static inline uint16_t rtd_to_f16(float x) {
  uint32_t u = rtd_bits(x);
  uint16_t sign = (uint16_t)(u >> 16 & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | (u >> 13 & 0x3ffu)); /* NaN, quiet */
  if (u >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 (a tie that rounds up), inf */
  if (u < 0x38800000u) {                                   /* below 2^-14: subnormal or zero */
    if (u <= 0x33000000u) return sign;                      /* <= 2^-25: rounds to zero (2^-25 is a tie) */
    uint32_t e = u >> 23, m = (u & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;                               /* m x 2^(e-150) in units of 2^-24 */
    uint32_t q = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) q++;     /* may carry into the smallest normal: right */
    return (uint16_t)(sign | q);
  }
  u += 0xfffu + (u >> 13 & 1u);                             /* round the 13 dropped bits to even */
  return (uint16_t)(sign | ((u - (112u << 23)) >> 13));     /* rebias 127 -> 15 */
}

static inline float rtd_from_f16(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = h >> 10 & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return rtd_float(sign | 0x7f800000u | m << 13);
  if (e == 0) {
    if (!m) return rtd_float(sign);
    e = 113; /* normalise a subnormal: m x 2^-24 */
    while (!(m & 0x400u)) m <<= 1, e--;
    return rtd_float(sign | e << 23 | (m & 0x3ffu) << 13);
  }
  return rtd_float(sign | (e + 112) << 23 | m << 13);
}

/* f8e4m3 (OCP E4M3FN): 4 exponent bits (bias 7), 3 mantissa bits, no infinity; largest finite
 * 448 (0x7e); NaN is 0x7f / 0xff; subnormals below 2^-6 in steps of 2^-9. Conversion rounds to
 * nearest even and SATURATES: every finite value or infinity beyond 448 becomes +-448 (as
 * Transformer Engine's casts do); a NaN becomes 0x7f with its sign. */
static inline uint8_t rtd_to_f8e4m3(float x) {
  uint32_t u = rtd_bits(x);
  uint8_t sign = (uint8_t)(u >> 24 & 0x80u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return (uint8_t)(sign | 0x7fu); /* NaN */
  if (u >= 0x43e00000u) return (uint8_t)(sign | 0x7eu); /* >= 448 or infinity: saturate */
  if (u < 0x3c800000u) {                                 /* below 2^-6: subnormal or zero */
    if (u <= 0x3a800000u) return sign;                   /* <= 2^-10 rounds to zero (2^-10 is a tie) */
    uint32_t e = u >> 23, m = (u & 0x7fffffu) | 0x800000u;
    uint32_t shift = 141 - e; /* m x 2^(e-150) in units of 2^-9 */
    uint32_t q = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) q++; /* may carry into the smallest normal: right */
    return (uint8_t)(sign | q);
  }
  u += 0x7ffffu + (u >> 20 & 1u);                     /* round the 20 dropped bits to even */
  return (uint8_t)(sign | ((u >> 20) - (120u << 3))); /* rebias 127 -> 7 */
}

static inline float rtd_from_f8e4m3(uint8_t c) {
  uint32_t sign = (uint32_t)(c & 0x80u) << 24, e = c >> 3 & 0xfu, m = c & 7u;
  if ((c & 0x7fu) == 0x7fu) return rtd_float(sign | 0x7fc00000u);
  if (e == 0) return (sign ? -1.0f : 1.0f) * (float)m * 0x1p-9f;
  return rtd_float(sign | (e + 120) << 23 | m << 20);
}

/* f8e5m2 (OCP E5M2): 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like: infinities 0x7c /
 * 0xfc, NaNs above them; largest finite 57344; subnormals below 2^-14 in steps of 2^-16 (it is
 * f16's upper byte). Conversion rounds to nearest even; beyond 57344 it overflows to infinity as
 * IEEE does (61440, the tie, and up); a NaN becomes 0x7e with its sign. */
static inline uint8_t rtd_to_f8e5m2(float x) {
  uint32_t u = rtd_bits(x);
  uint8_t sign = (uint8_t)(u >> 24 & 0x80u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return (uint8_t)(sign | 0x7eu); /* NaN, quiet */
  if (u >= 0x47700000u) return (uint8_t)(sign | 0x7cu); /* >= 61440 (a tie that rounds up): inf */
  if (u < 0x38800000u) {                                 /* below 2^-14: subnormal or zero */
    if (u <= 0x37000000u) return sign;                   /* <= 2^-17 rounds to zero (2^-17 is a tie) */
    uint32_t e = u >> 23, m = (u & 0x7fffffu) | 0x800000u;
    uint32_t shift = 134 - e; /* m x 2^(e-150) in units of 2^-16 */
    uint32_t q = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) q++;
    return (uint8_t)(sign | q);
  }
  u += 0xfffffu + (u >> 21 & 1u);                     /* round the 21 dropped bits to even */
  return (uint8_t)(sign | ((u >> 21) - (112u << 2))); /* rebias 127 -> 15 */
}

static inline float rtd_from_f8e5m2(uint8_t c) {
  uint32_t sign = (uint32_t)(c & 0x80u) << 24, e = c >> 2 & 0x1fu, m = c & 3u;
  if (e == 0x1f) return rtd_float(sign | 0x7f800000u | m << 21);
  if (e == 0) return (sign ? -1.0f : 1.0f) * (float)m * 0x1p-16f;
  return rtd_float(sign | (e + 112) << 23 | m << 21);
}

#endif
