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

/* Dtype names are ordinary identifiers (language.md), so this compares text, not keywords. */
DType dtype_from_name(Name n) {
  if (!n) return DT_NONE;
  for (int t = 0; t < DT__COUNT; t++)
    if (strcmp(n, dtype_names[t]) == 0) return (DType)t;
  return DT_NONE;
}
