/* dropout.h: dropout's counter-based mask (ops.def's OP_DROPOUT), shared by the interpreter and
 * the lowering (which builds the same integer arithmetic in LLVM IR: codegen/lower.c).
 *
 * An element is kept iff the top 24 bits of splitmix64's finaliser of
 *     key + (global index + 1) * 0x9E3779B97F4A7C15
 * are >= threshold = round(p * 2^24), key = seed * 0xD1B54A32D192ED03 ^ step (seed: the call
 * site's, Op.index; step: 0, run executes one step). The global index is the element's row-major
 * index over the op's dims[] with their global sizes: it does not depend on the sharding, so a
 * sharded run draws exactly the unsharded program's mask. A kept element is x * scale,
 * scale = (float)(1 / (1 - p)), the product in f32; a dropped one is 0. */
#ifndef SHARDC_DROPOUT_H
#define SHARDC_DROPOUT_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#define DROPOUT_GOLDEN 0x9E3779B97F4A7C15ull
#define DROPOUT_MIX1 0xBF58476D1CE4E5B9ull
#define DROPOUT_MIX2 0x94D049BB133111EBull
#define DROPOUT_SEED_MUL 0xD1B54A32D192ED03ull
#define DROPOUT_BITS 24

static inline uint64_t dropout_key(uint64_t seed, uint64_t step) { return seed * DROPOUT_SEED_MUL ^ step; }

static inline uint64_t dropout_threshold(double p) { return (uint64_t)llround(p * (double)(1u << DROPOUT_BITS)); }

static inline float dropout_scale(double p) { return (float)(1.0 / (1.0 - p)); }

static inline bool dropout_keep(uint64_t key, uint64_t index, uint64_t threshold) {
  uint64_t z = key + (index + 1) * DROPOUT_GOLDEN;
  z = (z ^ (z >> 30)) * DROPOUT_MIX1;
  z = (z ^ (z >> 27)) * DROPOUT_MIX2;
  z ^= z >> 31;
  return (z >> (64 - DROPOUT_BITS)) >= threshold;
}

#endif
