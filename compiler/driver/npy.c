/* npy.c: npy.h's reader and writer: the magic, a version 1.0 header (a Python dict literal with
 * 'descr', 'fortran_order' and 'shape'), then the data, little-endian, C order. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npy.h"

static bool fail(char *err, size_t n, const char *path, const char *why) {
  snprintf(err, n, "%s: %s", path, why);
  return false;
}

bool npy_read(const char *path, NpyArray *a, char *err, size_t n) {
  memset(a, 0, sizeof *a);
  FILE *f = fopen(path, "rb");
  if (!f) return fail(err, n, path, strerror(errno));
  unsigned char pre[10];
  char hdr[4096];
  bool ok = false;
  if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0) {
    fail(err, n, path, "not a .npy file");
    goto done;
  }
  if (pre[6] != 1) {
    fail(err, n, path, "only .npy format version 1.0 is read");
    goto done;
  }
  size_t hl = (size_t)pre[8] | (size_t)pre[9] << 8;
  if (hl >= sizeof hdr || fread(hdr, 1, hl, f) != hl) {
    fail(err, n, path, "truncated header");
    goto done;
  }
  hdr[hl] = 0;
  const char *d = strstr(hdr, "'descr':");
  const char *fo = strstr(hdr, "'fortran_order':");
  const char *sh = strstr(hdr, "'shape':");
  if (!d || !fo || !sh) {
    fail(err, n, path, "header without descr, fortran_order and shape");
    goto done;
  }
  d = strchr(d + 8, '\'');
  if (d && strncmp(d, "'<f4'", 5) == 0) a->is_int = false;
  else if (d && strncmp(d, "'<i4'", 5) == 0) a->is_int = true;
  else {
    char why[96];
    snprintf(why, sizeof why, "dtype %.8s (expected float32 '<f4' or int32 '<i4')", d ? d : "?");
    fail(err, n, path, why);
    goto done;
  }
  if (strstr(fo, "True") && strstr(fo, "True") < sh) {
    fail(err, n, path, "Fortran order (expected C order)");
    goto done;
  }
  const char *p = strchr(sh, '(');
  if (!p) {
    fail(err, n, path, "bad shape");
    goto done;
  }
  p++;
  a->n = 1;
  while (*p && *p != ')') {
    char *end;
    long long v = strtoll(p, &end, 10);
    if (end == p) {
      if (*p == ',' || *p == ' ') {
        p++;
        continue;
      }
      fail(err, n, path, "bad shape");
      goto done;
    }
    if (a->rank == NPY_MAX_RANK || v < 0) {
      fail(err, n, path, "shape of too many dims");
      goto done;
    }
    a->shape[a->rank++] = v;
    a->n *= v;
    p = end;
  }
  a->data = malloc(sizeof(double) * (size_t)(a->n > 0 ? a->n : 1));
  void *raw = malloc(4 * (size_t)(a->n > 0 ? a->n : 1));
  if (!a->data || !raw || fread(raw, 4, (size_t)a->n, f) != (size_t)a->n) {
    free(raw);
    fail(err, n, path, "truncated data");
    goto done;
  }
  for (int64_t i = 0; i < a->n; i++) a->data[i] = a->is_int ? ((int32_t *)raw)[i] : ((float *)raw)[i];
  free(raw);
  ok = true;
done:
  fclose(f);
  if (!ok) npy_free(a);
  return ok;
}

bool npy_write_f32(const char *path, const int64_t *shape, int rank, const double *data, char *err, size_t n) {
  char dict[512];
  int len = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
  int64_t count = 1;
  for (int i = 0; i < rank; i++) {
    len += snprintf(dict + len, sizeof dict - (size_t)len, "%lld,%s", (long long)shape[i], i + 1 < rank ? " " : "");
    count *= shape[i];
  }
  len += snprintf(dict + len, sizeof dict - (size_t)len, "), }");
  int total = 10 + len + 1, pad = (64 - total % 64) % 64;
  FILE *f = fopen(path, "wb");
  if (!f) return fail(err, n, path, strerror(errno));
  unsigned hl = (unsigned)(len + pad + 1);
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hl & 0xff), (unsigned char)(hl >> 8)};
  fwrite(pre, 1, 10, f);
  fwrite(dict, 1, (size_t)len, f);
  for (int i = 0; i < pad; i++) fputc(' ', f);
  fputc('\n', f);
  for (int64_t i = 0; i < count; i++) {
    float v = (float)data[i];
    fwrite(&v, 4, 1, f);
  }
  if (fclose(f) != 0) return fail(err, n, path, strerror(errno));
  return true;
}

void npy_free(NpyArray *a) {
  free(a->data);
  a->data = NULL;
}
