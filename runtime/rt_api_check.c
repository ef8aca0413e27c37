/* rt_api_check.c: rt_api.def against shardrt.h, at compile time (built into shardrt, so a drift
 * fails the build): every entry point has the table's type, every struct the table's fields in its
 * order with their types, at the offsets a struct made from the table alone has, and its size (so
 * no field is missing, extra or moved). The lowering builds its declarations and struct types from
 * the same table (compiler/codegen/lower_rt.c). Nothing here runs. */
#include <stddef.h>

#include "rt_api.h"

/* functions: the declared type against the table's */
#define RT_FN(name, ret, ...)                                                                           \
  _Static_assert(__builtin_types_compatible_p(__typeof__(name), RTC_##ret(RT_MAP(RT_CTYPE, __VA_ARGS__))), \
                 "rt_api.def: " #name " is not shardrt.h's");
#include "rt_api.def"

/* structs: a mirror made from the table alone */
#define RT_STRUCT(S) typedef struct RtDef_##S {
#define RT_END(S) } RtDef_##S;
#define RT_FIELD(S, f, t) RTC_##t f;
#define RT_ARRAY(S, f, t, n) RTC_##t f[n];
#define RT_ARRAY2(S, f, t, n, m) RTC_##t f[n][m];
#define RT_NEST(S, f, T) T f;
#define RT_NESTS(S, f, T, n) T f[n];
#include "rt_api.def"

/* ... against shardrt.h's: each field's type and offset, each struct's size */
#define RT_END(S) _Static_assert(sizeof(S) == sizeof(RtDef_##S), "rt_api.def: " #S " has fields the table lacks");
#define RT_FIELD(S, f, t)                                                                                 \
  _Static_assert(__builtin_types_compatible_p(__typeof__(((S *)0)->f), RTC_##t), "rt_api.def: " #S "." #f "'s type"); \
  _Static_assert(offsetof(S, f) == offsetof(RtDef_##S, f), "rt_api.def: " #S "." #f "'s place");
#define RT_ARRAY(S, f, t, n)                                                                                  \
  _Static_assert(__builtin_types_compatible_p(__typeof__(((S *)0)->f), RTC_##t[n]), "rt_api.def: " #S "." #f "'s type"); \
  _Static_assert(offsetof(S, f) == offsetof(RtDef_##S, f), "rt_api.def: " #S "." #f "'s place");
#define RT_ARRAY2(S, f, t, n, m)                                                                                 \
  _Static_assert(__builtin_types_compatible_p(__typeof__(((S *)0)->f), RTC_##t[n][m]), "rt_api.def: " #S "." #f "'s type"); \
  _Static_assert(offsetof(S, f) == offsetof(RtDef_##S, f), "rt_api.def: " #S "." #f "'s place");
#define RT_NEST(S, f, T)                                                                                   \
  _Static_assert(__builtin_types_compatible_p(__typeof__(((S *)0)->f), T), "rt_api.def: " #S "." #f "'s type"); \
  _Static_assert(offsetof(S, f) == offsetof(RtDef_##S, f), "rt_api.def: " #S "." #f "'s place");
#define RT_NESTS(S, f, T, n)                                                                                  \
  _Static_assert(__builtin_types_compatible_p(__typeof__(((S *)0)->f), T[n]), "rt_api.def: " #S "." #f "'s type"); \
  _Static_assert(offsetof(S, f) == offsetof(RtDef_##S, f), "rt_api.def: " #S "." #f "'s place");
#include "rt_api.def"
