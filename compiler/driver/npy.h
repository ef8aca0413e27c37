/* npy.h: NumPy .npy files (format version 1.0), as `run --load/--save` reads and writes them
 * (language.md: float32 for float tensors, int32 for integer ones, C order). */
#ifndef SHARDC_NPY_H
#define SHARDC_NPY_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

#define NPY_MAX_RANK 8

typedef struct NpyArray {
  int rank;
  int64_t shape[NPY_MAX_RANK];
  int64_t n;        /* elements */
  bool is_int;      /* '<i4' (else '<f4') */
  double *data;     /* n values (malloc'd) */
} NpyArray;

/* Reads path; false with the reason in err ("not a .npy file", "dtype '<f8' (expected float32 or
 * int32)", ...). */
bool npy_read(const char *path, NpyArray *out, char *err, size_t n);
/* Writes float32 values; false with the reason in err. */
bool npy_write_f32(const char *path, const int64_t *shape, int rank, const double *data, char *err, size_t n);
void npy_free(NpyArray *a);
#endif
