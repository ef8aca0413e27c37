/* dtype.c: the element types of tensors (the DTYPES table of program.h): names, sizes, kinds. */
#include <string.h>

#include "program.h"

static const char *const dtype_names[] = {
#define X(e, s, b) [e] = s,
  DTYPES(X)
#undef X
};

static const int dtype_sizes[] = {
#define X(e, s, b) [e] = b,
  DTYPES(X)
#undef X
};

const char *dtype_name(DType t) {
  if (t < 0 || t >= DT__COUNT) return "none";
  return dtype_names[t];
}

int dtype_bytes(DType t) {
  if (t < 0 || t >= DT__COUNT) return 0;
  return dtype_sizes[t];
}

bool dtype_is_int(DType t) { return t == DT_I32 || t == DT_I8; }

bool dtype_is_f8(DType t) { return t == DT_F8E4M3 || t == DT_F8E5M2; }

DType dtype_rate(DType t) { return dtype_is_f8(t) ? DT_F8E4M3 : t; }

DType dtype_contract_result(DType operands) { return dtype_is_f8(operands) ? DT_BF16 : operands; }

/* Dtype names are ordinary identifiers (language.md), so this compares text, not keywords. */
DType dtype_from_name(Name n) {
  if (!n) return DT_NONE;
  if (strcmp(n, "f8") == 0) return DT_F8E4M3; /* the short spelling */
  for (int t = 0; t < DT__COUNT; t++)
    if (strcmp(n, dtype_names[t]) == 0) return (DType)t;
  return DT_NONE;
}
