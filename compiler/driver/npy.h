/* npy.h: NumPy .npy files, as `run --load/--save` reads and writes them (language.md: float32 for
 * float tensors, int32 for integer ones).
 *
 * Reading takes what NumPy writes for those dtypes and nothing else: format version 1.0 (or 2.0,
 * the same with a 4-byte header length), a header that is a Python dict literal with exactly the
 * keys 'descr' ('<f4' or '<i4'), 'fortran_order' (True or False: Fortran order is read and
 * reordered into C order) and 'shape' (a tuple of non-negative ints), either quote, any whitespace,
 * a trailing comma; then exactly the data the shape needs, little-endian. Every dim and the element
 * count are checked (base/checked.h: at most SIZE_LIMIT) and the data's size must equal what the
 * file holds, before anything is allocated. Only a regular file is read: a FIFO, a device or a
 * directory is refused without blocking. */
#ifndef SHARDC_NPY_H
#define SHARDC_NPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define NPY_MAX_RANK 8

typedef struct NpyArray {
  int rank;
  int64_t shape[NPY_MAX_RANK];
  int64_t n;        /* elements (1 for shape ()) */
  bool is_int;      /* '<i4' (else '<f4') */
  bool fortran;     /* the file's order; data is always C order */
  double *data;     /* n values, C order (malloc'd); NULL until read */
} NpyArray;

/* An open .npy file between its header and its data. */
typedef struct NpyFile {
  int fd;
  const char *path; /* for messages */
} NpyFile;

/* Opens name in the directory dirfd (AT_FDCWD: the working directory), shown in messages as path,
 * and reads its header into a (a->data NULL). False with "path: reason" in err ("not a regular
 * file", "dtype '<f8' (expected float32 '<f4' or int32 '<i4')", "shape (...) needs 32 bytes of
 * data, the file has 28", ...). The file is noted as an input (outfile.h). */
bool npy_open_at(int dirfd, const char *name, const char *path, NpyFile *f, NpyArray *a, char *err, size_t n);
/* Reads the data of a file npy_open_at opened into a->data. False with the reason in err. */
bool npy_read_data(NpyFile *f, NpyArray *a, char *err, size_t n);
/* After npy_open_at, whatever it returned. */
void npy_close(NpyFile *f);
/* The three together. */
bool npy_read(const char *path, NpyArray *a, char *err, size_t n);
/* The same checks on a whole file in memory (the fuzzer's entry); path for messages. */
bool npy_decode(const unsigned char *bytes, size_t len, const char *path, NpyArray *a, char *err, size_t n);

/* The .npy file (version 1.0, float32, C order) of values, written into the stream f. False if
 * the header cannot be made (a write error shows in ferror(f)). */
bool npy_write_f32(FILE *f, const int64_t *shape, int rank, const double *data);
void npy_free(NpyArray *a);
#endif
