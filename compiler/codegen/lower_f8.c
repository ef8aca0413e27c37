/* lower_f8.c: FP8 storage in LLVM IR: f32 to an f8e4m3 or f8e5m2 byte and back, straight-line
 * (selects and bit operations, no branches or calls) so that the loops storing and loading them
 * vectorise. The same steps as runtime/dtype.h's rtd_to_f8e4m3 / rtd_to_f8e5m2 (round to nearest
 * even; e4m3 saturates at +-448, infinity too, e5m2 overflows to infinity; a NaN stays NaN with
 * its sign), except that the subnormal range is rounded in floating point: |x| times 2^9 (e4m3)
 * or 2^16 (e5m2) is exact, and llvm.roundeven rounds it to the code. The conversions of every
 * code and of the halfway points are tested through `run` (tests/run/f8_*) against the runtime's,
 * which tests/unit's test_f8 checks against a table computed independently. */
#include "lower_int.h"

static LLVMValueRef c32(Lower *L, uint32_t v) { return LLVMConstInt(L->i32, v, 0); }

typedef struct F8Format {
  uint32_t nan_code, over_code; /* the code of a NaN, of what lies beyond the largest finite */
  uint32_t over_bits;           /* |x|'s f32 bits from which over_code applies */
  uint32_t normal_bits;         /* the smallest normal's f32 bits */
  int mant;                     /* mantissa bits */
  uint32_t rebias;              /* (127 - bias) << mant */
  double sub_scale;             /* 1 / the subnormal step */
  int bias;
} F8Format;

static const F8Format E4M3 = {0x7f, 0x7e, 0x43e00000u, 0x3c800000u, 3, 120u << 3, 512.0, 7};
static const F8Format E5M2 = {0x7e, 0x7c, 0x47700000u, 0x38800000u, 2, 112u << 2, 65536.0, 15};

static const F8Format *format_of(DType dt) { return dt == DT_F8E5M2 ? &E5M2 : &E4M3; }

LLVMValueRef lower_f8_encode(Lower *L, LLVMValueRef x, DType dt) {
  const F8Format *f = format_of(dt);
  LLVMBuilderRef B = L->B;
  int drop = 23 - f->mant;
  LLVMValueRef u = LLVMBuildBitCast(B, x, L->i32, "");
  LLVMValueRef sign = LLVMBuildAnd(B, LLVMBuildLShr(B, u, c32(L, 24), ""), c32(L, 0x80), "");
  LLVMValueRef a = LLVMBuildAnd(B, u, c32(L, 0x7fffffffu), "");
  /* normal: round the dropped bits to even, rebias */
  LLVMValueRef lsb = LLVMBuildAnd(B, LLVMBuildLShr(B, a, c32(L, (uint32_t)drop), ""), c32(L, 1), "");
  LLVMValueRef r = LLVMBuildAdd(B, a, LLVMBuildAdd(B, lsb, c32(L, (1u << (drop - 1)) - 1), ""), "");
  LLVMValueRef normal = LLVMBuildSub(B, LLVMBuildLShr(B, r, c32(L, (uint32_t)drop), ""), c32(L, f->rebias), "");
  /* subnormal (and zero): |x| in units of the subnormal step, rounded to even */
  LLVMValueRef ax = LLVMBuildBitCast(B, a, L->f32, "");
  LLVMValueRef scaled = LLVMBuildFMul(B, ax, LLVMConstReal(L->f32, f->sub_scale), "");
  LLVMValueRef q = lower_intrinsic(L, "llvm.roundeven", &scaled, 1);
  LLVMValueRef sub = LLVMBuildFPToUI(B, q, L->i32, "");
  LLVMValueRef is_sub = LLVMBuildICmp(B, LLVMIntULT, a, c32(L, f->normal_bits), "");
  LLVMValueRef code = LLVMBuildSelect(B, is_sub, sub, normal, "");
  LLVMValueRef over = LLVMBuildICmp(B, LLVMIntUGE, a, c32(L, f->over_bits), "");
  code = LLVMBuildSelect(B, over, c32(L, f->over_code), code, "");
  LLVMValueRef nan = LLVMBuildICmp(B, LLVMIntUGT, a, c32(L, 0x7f800000u), "");
  code = LLVMBuildSelect(B, nan, c32(L, f->nan_code), code, "");
  return LLVMBuildTrunc(B, LLVMBuildOr(B, code, sign, ""), L->i8, "");
}

LLVMValueRef lower_f8_decode(Lower *L, LLVMValueRef c8, DType dt) {
  const F8Format *f = format_of(dt);
  LLVMBuilderRef B = L->B;
  LLVMValueRef c = LLVMBuildZExt(B, c8, L->i32, "");
  LLVMValueRef sign = LLVMBuildShl(B, LLVMBuildAnd(B, c, c32(L, 0x80), ""), c32(L, 24), "");
  LLVMValueRef mag = LLVMBuildAnd(B, c, c32(L, 0x7f), "");
  LLVMValueRef e = LLVMBuildLShr(B, mag, c32(L, (uint32_t)f->mant), "");
  LLVMValueRef m = LLVMBuildAnd(B, mag, c32(L, (1u << f->mant) - 1), "");
  /* normal: the exponent rebiased into f32's, the mantissa at the top of f32's */
  LLVMValueRef bits = LLVMBuildOr(B, LLVMBuildShl(B, LLVMBuildAdd(B, e, c32(L, (uint32_t)(127 - f->bias)), ""), c32(L, 23), ""),
                                  LLVMBuildShl(B, m, c32(L, (uint32_t)(23 - f->mant)), ""), "");
  /* subnormal: m steps */
  LLVMValueRef sub = LLVMBuildFMul(B, LLVMBuildUIToFP(B, m, L->f32, ""), LLVMConstReal(L->f32, 1.0 / f->sub_scale), "");
  LLVMValueRef subbits = LLVMBuildBitCast(B, sub, L->i32, "");
  LLVMValueRef is_sub = LLVMBuildICmp(B, LLVMIntEQ, e, c32(L, 0), "");
  LLVMValueRef v = LLVMBuildSelect(B, is_sub, subbits, bits, "");
  if (dt == DT_F8E5M2) { /* exponent 31: infinity (m = 0) or NaN */
    LLVMValueRef special = LLVMBuildICmp(B, LLVMIntEQ, e, c32(L, 31), "");
    LLVMValueRef inf = LLVMBuildOr(B, c32(L, 0x7f800000u), LLVMBuildShl(B, m, c32(L, 21), ""), "");
    v = LLVMBuildSelect(B, special, inf, v, "");
  } else { /* 0x7f: NaN */
    LLVMValueRef isnan = LLVMBuildICmp(B, LLVMIntEQ, mag, c32(L, 0x7f), "");
    v = LLVMBuildSelect(B, isnan, c32(L, 0x7fc00000u), v, "");
  }
  return LLVMBuildBitCast(B, LLVMBuildOr(B, v, sign, ""), L->f32, "");
}
