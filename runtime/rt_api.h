/* rt_api.h: the vocabulary of rt_api.def, the one definition of the boundary between the code
 * shardc generates and the runtime (docs/runtime.md, "The interface"). Each type name of the table
 * has its C type (RTC_name) and the kind of LLVM value it lowers to (RTK_name); RT_MAP maps a
 * macro over a parameter list. Included by the runtime's static check (rt_api_check.c, built into
 * shardrt: a drift between the table and shardrt.h fails the build) and by the lowering
 * (compiler/codegen/lower_rt.c: the functions' LLVM types and the structs' layouts). */
#ifndef SHARDRT_API_H
#define SHARDRT_API_H

#include "shardrt.h"

/* LLVM value kinds */
enum { RT_KIND_VOID, RT_KIND_I8, RT_KIND_I16, RT_KIND_I32, RT_KIND_I64, RT_KIND_F32, RT_KIND_F64, RT_KIND_PTR, RT_KIND_STRUCT };

/* X(name, C type, kind) */
#define RT_API_TYPES(X)                          \
  X(void, void, RT_KIND_VOID)                    \
  X(int, int, RT_KIND_I32)                       \
  X(i32, int32_t, RT_KIND_I32)                   \
  X(u8, uint8_t, RT_KIND_I8)                     \
  X(i64, int64_t, RT_KIND_I64)                   \
  X(u64, uint64_t, RT_KIND_I64)                  \
  X(f32, float, RT_KIND_F32)                     \
  X(f64, double, RT_KIND_F64)                    \
  X(size, size_t, RT_KIND_I64)                   \
  X(dtype, RtDtype, RT_KIND_I32)                 \
  X(ptr, void *, RT_KIND_PTR)                    \
  X(cptr, const void *, RT_KIND_PTR)             \
  X(pptr, void **, RT_KIND_PTR)                  \
  X(outs, void *const *, RT_KIND_PTR)            \
  X(ins, const void *const *, RT_KIND_PTR)       \
  X(cstr, const char *, RT_KIND_PTR)             \
  X(dev, RtDevice *, RT_KIND_PTR)                \
  X(cdev, const RtDevice *, RT_KIND_PTR)         \
  X(ci32p, const int32_t *, RT_KIND_PTR)         \
  X(ci64p, const int64_t *, RT_KIND_PTR)         \
  X(cu8p, const uint8_t *, RT_KIND_PTR)          \
  X(f32p, float *, RT_KIND_PTR)                  \
  X(gemm, const RtGemm *, RT_KIND_PTR)           \
  X(rows, const RtRows *, RT_KIND_PTR)           \
  X(attn, const RtAttn *, RT_KIND_PTR)           \
  X(ring, const RtRing *, RT_KIND_PTR)           \
  X(pipe, const RtPipe *, RT_KIND_PTR)           \
  X(coll, const RtColl *, RT_KIND_PTR)           \
  X(groups, const RtGroups *, RT_KIND_PTR)       \
  X(req, RtRequest *, RT_KIND_PTR)               \
  X(preq, RtRequest **, RT_KIND_PTR)             \
  X(slots, const RtPipeSlot *, RT_KIND_PTR)      \
  X(actions, const RtPipeAction *, RT_KIND_PTR)  \
  X(members, const RtCollMember *, RT_KIND_PTR)  \
  X(region, RtRegionFn, RT_KIND_PTR)             \
  X(prog, const RtProgram *, RT_KIND_PTR)        \
  X(argv, char **, RT_KIND_PTR)

#define RT_X(name, ctype, kind) typedef ctype RTC_##name;
RT_API_TYPES(RT_X)
#undef RT_X
enum {
#define RT_X(name, ctype, kind) RTK_##name = kind,
  RT_API_TYPES(RT_X)
#undef RT_X
};

/* RT_MAP(m, a, b, ...) -> m(a), m(b), ... (1 to 16 arguments) */
#define RT_MAP_N(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, N, ...) RT_MAP_##N
#define RT_MAP(m, ...) RT_MAP_N(__VA_ARGS__, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1)(m, __VA_ARGS__)
#define RT_MAP_1(m, a) m(a)
#define RT_MAP_2(m, a, ...) m(a), RT_MAP_1(m, __VA_ARGS__)
#define RT_MAP_3(m, a, ...) m(a), RT_MAP_2(m, __VA_ARGS__)
#define RT_MAP_4(m, a, ...) m(a), RT_MAP_3(m, __VA_ARGS__)
#define RT_MAP_5(m, a, ...) m(a), RT_MAP_4(m, __VA_ARGS__)
#define RT_MAP_6(m, a, ...) m(a), RT_MAP_5(m, __VA_ARGS__)
#define RT_MAP_7(m, a, ...) m(a), RT_MAP_6(m, __VA_ARGS__)
#define RT_MAP_8(m, a, ...) m(a), RT_MAP_7(m, __VA_ARGS__)
#define RT_MAP_9(m, a, ...) m(a), RT_MAP_8(m, __VA_ARGS__)
#define RT_MAP_10(m, a, ...) m(a), RT_MAP_9(m, __VA_ARGS__)
#define RT_MAP_11(m, a, ...) m(a), RT_MAP_10(m, __VA_ARGS__)
#define RT_MAP_12(m, a, ...) m(a), RT_MAP_11(m, __VA_ARGS__)
#define RT_MAP_13(m, a, ...) m(a), RT_MAP_12(m, __VA_ARGS__)
#define RT_MAP_14(m, a, ...) m(a), RT_MAP_13(m, __VA_ARGS__)
#define RT_MAP_15(m, a, ...) m(a), RT_MAP_14(m, __VA_ARGS__)
#define RT_MAP_16(m, a, ...) m(a), RT_MAP_15(m, __VA_ARGS__)

#define RT_CTYPE(t) RTC_##t
#define RT_KIND(t) RTK_##t
#endif
