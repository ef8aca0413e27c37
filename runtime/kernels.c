/* kernels.c: the loops that move and combine elements, shared by every backend: reductions in
 * a fixed order (the source of bitwise determinism: whoever computes an element adds the
 * group's blocks in rank order, in f32, and rounds once), strided box copies (gathers,
 * all-to-all blocks), and the dtype conversions shardrt.h exports. */
#include <string.h>

#include "dtype.h"
#include "rt_internal.h"

#define TILE 1024 /* elements accumulated at a time: 4 KiB of f32 on the stack */

uint16_t rt_f32_to_bf16(float x) { return rtd_to_bf16(x); }
float rt_bf16_to_f32(uint16_t h) { return rtd_from_bf16(h); }
uint16_t rt_f32_to_f16(float x) { return rtd_to_f16(x); }
float rt_f16_to_f32(uint16_t h) { return rtd_from_f16(h); }
uint8_t rt_f32_to_f8e4m3(float x) { return rtd_to_f8e4m3(x); }
float rt_f8e4m3_to_f32(uint8_t c) { return rtd_from_f8e4m3(c); }
uint8_t rt_f32_to_f8e5m2(float x) { return rtd_to_f8e5m2(x); }
float rt_f8e5m2_to_f32(uint8_t c) { return rtd_from_f8e5m2(c); }

RT_VECTOR void rtk_bf16_to_f32(float *restrict dst, const uint16_t *restrict src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = rtd_from_bf16(src[i]);
}

RT_VECTOR void rtk_f32_to_bf16(uint16_t *restrict dst, const float *restrict src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = rtd_to_bf16(src[i]);
}

/* ---- f32 tiles ---- */

static void load_tile(float *acc, const void *src, size_t m, RtDtype dt) {
  if (dt == RT_F32) {
    memcpy(acc, src, m * sizeof *acc);
  } else if (dt == RT_BF16) {
    rtk_bf16_to_f32(acc, src, m);
  } else if (dt == RT_F8E4M3) {
    const uint8_t *s = src;
    for (size_t i = 0; i < m; i++) acc[i] = rtd_from_f8e4m3(s[i]);
  } else if (dt == RT_F8E5M2) {
    const uint8_t *s = src;
    for (size_t i = 0; i < m; i++) acc[i] = rtd_from_f8e5m2(s[i]);
  } else {
    const uint16_t *s = src;
    for (size_t i = 0; i < m; i++) acc[i] = rtd_from_f16(s[i]);
  }
}

static void store_tile(void *dst, const float *acc, size_t m, RtDtype dt) {
  if (dt == RT_F32) {
    memcpy(dst, acc, m * sizeof *acc);
  } else if (dt == RT_BF16) {
    rtk_f32_to_bf16(dst, acc, m);
  } else if (dt == RT_F8E4M3) {
    uint8_t *d = dst;
    for (size_t i = 0; i < m; i++) d[i] = rtd_to_f8e4m3(acc[i]);
  } else if (dt == RT_F8E5M2) {
    uint8_t *d = dst;
    for (size_t i = 0; i < m; i++) d[i] = rtd_to_f8e5m2(acc[i]);
  } else {
    uint16_t *d = dst;
    for (size_t i = 0; i < m; i++) d[i] = rtd_to_f16(acc[i]);
  }
}

/* max keeps a NaN: a NaN anywhere in the group is a NaN in the result, whatever its rank. */
static inline float max_nan(float acc, float v) { return v > acc || v != v ? v : acc; }

static void combine_tile(float *acc, const void *src, size_t m, RtDtype dt, RtReduceOp op) {
  float tmp[TILE];
  const float *s = src;
  if (dt != RT_F32) {
    load_tile(tmp, src, m, dt);
    s = tmp;
  }
  if (op == RT_SUM)
    for (size_t i = 0; i < m; i++) acc[i] += s[i];
  else
    for (size_t i = 0; i < m; i++) acc[i] = max_nan(acc[i], s[i]);
}

/* i32 adds wrap around (as the interpreter's integer ops do), computed unsigned. */
static void reduce_i32(RtReduceOp op, int32_t *dst, const void *const *srcs, int n, size_t count) {
  for (size_t i = 0; i < count; i++) {
    int32_t acc = ((const int32_t *)srcs[0])[i];
    for (int j = 1; j < n; j++) {
      int32_t v = ((const int32_t *)srcs[j])[i];
      acc = op == RT_SUM ? (int32_t)((uint32_t)acc + (uint32_t)v) : (v > acc ? v : acc);
    }
    dst[i] = acc;
  }
}

void rtk_reduce(RtDtype dt, RtReduceOp op, void *dst, const void *const *srcs, int n, size_t count) {
  if (dt == RT_I32) {
    reduce_i32(op, dst, srcs, n, count);
    return;
  }
  size_t es = rt_dtype_size(dt);
  float acc[TILE];
  for (size_t at = 0; at < count; at += TILE) {
    size_t m = count - at < TILE ? count - at : TILE;
    load_tile(acc, (const char *)srcs[0] + at * es, m, dt);
    for (int j = 1; j < n; j++) combine_tile(acc, (const char *)srcs[j] + at * es, m, dt, op);
    store_tile((char *)dst + at * es, acc, m, dt);
  }
}

/* ---- boxes ---- */

void rtk_row_major_strides(const int64_t *shape, int nd, int64_t *stride) {
  int64_t s = 1;
  for (int i = nd - 1; i >= 0; i--) {
    stride[i] = s;
    s *= shape[i];
  }
}

/* The innermost dims that are contiguous in both arrays become one memcpy; the rest are walked
 * as an odometer. */
void rtk_copy_box(void *dst, const int64_t *dst_stride, const void *src, const int64_t *src_stride,
                  const int64_t *shape, int nd, size_t elem) {
  for (int i = 0; i < nd; i++)
    if (shape[i] <= 0) return;
  int64_t run = 1;
  int outer = nd;
  while (outer > 0 && src_stride[outer - 1] == run && dst_stride[outer - 1] == run) run *= shape[--outer];
  size_t run_bytes = (size_t)run * elem;
  int64_t idx[RT_MAX_RANK] = {0};
  for (;;) {
    int64_t so = 0, d_o = 0;
    for (int i = 0; i < outer; i++) so += idx[i] * src_stride[i], d_o += idx[i] * dst_stride[i];
    memcpy((char *)dst + (size_t)d_o * elem, (const char *)src + (size_t)so * elem, run_bytes);
    int i = outer - 1;
    while (i >= 0 && ++idx[i] == shape[i]) idx[i--] = 0;
    if (i < 0) return;
  }
}

/* ---- conversions ---- */

int rt_convert(void *dst, RtDtype dst_type, const void *src, RtDtype src_type, size_t count) {
  if (!rt_dtype_size(dst_type) || !rt_dtype_size(src_type) || (count && (!dst || !src))) return RT_E_ARG;
  if ((dst_type == RT_I32) != (src_type == RT_I32)) return RT_E_ARG;
  if (dst_type == src_type) {
    memmove(dst, src, count * rt_dtype_size(dst_type));
    return RT_OK;
  }
  if (dst_type == RT_F32 && src_type == RT_BF16) { /* the buffers do not overlap (shardrt.h) */
    rtk_bf16_to_f32(dst, src, count);
    return RT_OK;
  }
  if (dst_type == RT_BF16 && src_type == RT_F32) {
    rtk_f32_to_bf16(dst, src, count);
    return RT_OK;
  }
  float acc[TILE];
  size_t ds = rt_dtype_size(dst_type), ss = rt_dtype_size(src_type);
  for (size_t at = 0; at < count; at += TILE) {
    size_t m = count - at < TILE ? count - at : TILE;
    load_tile(acc, (const char *)src + at * ss, m, src_type);
    store_tile((char *)dst + at * ds, acc, m, dst_type);
  }
  return RT_OK;
}

double rtk_get(const void *buf, RtDtype dt, int64_t i) {
  switch (dt) {
  case RT_BF16: return rtd_from_bf16(((const uint16_t *)buf)[i]);
  case RT_F16: return rtd_from_f16(((const uint16_t *)buf)[i]);
  case RT_F8E4M3: return rtd_from_f8e4m3(((const uint8_t *)buf)[i]);
  case RT_F8E5M2: return rtd_from_f8e5m2(((const uint8_t *)buf)[i]);
  case RT_I32: return ((const int32_t *)buf)[i];
  default: return ((const float *)buf)[i];
  }
}

void rtk_put(void *buf, RtDtype dt, int64_t i, double v) {
  switch (dt) {
  case RT_BF16: ((uint16_t *)buf)[i] = rtd_to_bf16((float)v); break;
  case RT_F16: ((uint16_t *)buf)[i] = rtd_to_f16((float)v); break;
  case RT_F8E4M3: ((uint8_t *)buf)[i] = rtd_to_f8e4m3((float)v); break;
  case RT_F8E5M2: ((uint8_t *)buf)[i] = rtd_to_f8e5m2((float)v); break;
  case RT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
  default: ((float *)buf)[i] = (float)v; break;
  }
}
