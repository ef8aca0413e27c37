/* checked.h: int64 arithmetic on sizes that cannot overflow.
 *
 * Sizes in shardc (a dim, a tensor's element count, a byte count, a mesh's device count) are
 * int64. Every product or sum of them goes through one of these helpers, never a bare `*` or `+`:
 *   - ckd_add / ckd_mul compute into *out and return true when the exact result does not fit
 *     (C23's <stdckdint.h> contract), for code that reports the overflow;
 *   - sat_add / sat_mul clamp to INT64_MAX / INT64_MIN instead, for figures that are only compared
 *     against a limit afterwards (a saturated total still reads "too big").
 * SIZE_LIMIT is the largest dim, element count or byte count a program may have (language.md,
 * "Limits"): 2^62, so that the sum of two sizes and the bytes of an f32 element count stay
 * representable and later stages can add a few of them without overflow checks of their own.
 * Everything here is inline and free of undefined behaviour under UBSan. */
#ifndef SHARDC_CHECKED_H
#define SHARDC_CHECKED_H

#include <stdbool.h>
#include <stdint.h>

#define SIZE_LIMIT ((int64_t)1 << 62)

static inline bool ckd_add(int64_t *out, int64_t a, int64_t b) { return __builtin_add_overflow(a, b, out); }
static inline bool ckd_sub(int64_t *out, int64_t a, int64_t b) { return __builtin_sub_overflow(a, b, out); }
static inline bool ckd_mul(int64_t *out, int64_t a, int64_t b) { return __builtin_mul_overflow(a, b, out); }

/* a + b, clamped to [INT64_MIN, INT64_MAX]. */
static inline int64_t sat_add(int64_t a, int64_t b) {
  int64_t r;
  if (!__builtin_add_overflow(a, b, &r)) return r;
  return b > 0 ? INT64_MAX : INT64_MIN;
}

/* a * b, clamped to [INT64_MIN, INT64_MAX]. */
static inline int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r;
  if (!__builtin_mul_overflow(a, b, &r)) return r;
  return (a < 0) != (b < 0) ? INT64_MIN : INT64_MAX;
}

/* Is n a size shardc accepts (1 ..= SIZE_LIMIT)? */
static inline bool size_ok(int64_t n) { return n >= 1 && n <= SIZE_LIMIT; }

#endif
