/* npy.c: npy.h's reader and writer.
 *
 * The header is parsed as the Python dict literal it is (NumPy reads it with ast.literal_eval):
 *   header := "{" ws (entry ws "," ws)* (entry ws ","?)? ws "}" ws
 *   entry  := string ws ":" ws value      string := '...' | "..." (printable ASCII, no escapes)
 *   value  := string | "True" | "False" | "(" ws (int ws "," ws)* (int ws ","?)? ws ")"
 * with the keys 'descr', 'fortran_order' and 'shape' once each and no other; a one-dim shape needs
 * its comma ((5,): (5) is an int in Python), ints are decimal without leading zeros. Whatever the
 * header says, nothing is allocated before the element count is known to fit (checked.h) and to
 * need exactly the bytes the file holds after the header. */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checked.h"
#include "npy.h"
#include "outfile.h"

#define NPY_MAX_HEADER 65536 /* NumPy's own reader refuses headers over 10,000 bytes */

__attribute__((format(printf, 4, 5))) static bool fail(char *err, size_t n, const char *path, const char *fmt, ...) {
  char why[300];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  snprintf(err, n, "%s: %s", path, why);
  return false;
}

/* s[0..len) for a message: printable ASCII as is, anything else as \xNN, cut after 24 bytes. */
static const char *shown(const char *s, size_t len, char *buf, size_t size) {
  size_t k = 0;
  for (size_t i = 0; i < len && k + 8 < size; i++) {
    unsigned char c = (unsigned char)s[i];
    if (i == 24) {
      k += (size_t)snprintf(buf + k, size - k, "...");
      break;
    }
    if (c >= 0x20 && c < 0x7f) buf[k++] = (char)c;
    else k += (size_t)snprintf(buf + k, size - k, "\\x%02x", c);
  }
  buf[k] = 0;
  return buf;
}

/* ---- the header's dict ---- */

typedef struct Cursor {
  const char *p, *end;
  const char *path;
  char *err;
  size_t n;
} Cursor;

static void skip_ws(Cursor *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r' || *c->p == '\f' || *c->p == '\v'))
    c->p++;
}

static bool at(Cursor *c, char ch) { return c->p < c->end && *c->p == ch; }

/* What the header has at the cursor, for a message. */
static const char *here(const Cursor *c, char *buf, size_t size) {
  if (c->p >= c->end) return "the end of the header";
  char s[80];
  snprintf(buf, size, "'%s'", shown(c->p, (size_t)(c->end - c->p), s, sizeof s));
  return buf;
}

static bool expected(Cursor *c, const char *what) {
  char buf[100];
  return fail(c->err, c->n, c->path, "bad header: expected %s, found %s", what, here(c, buf, sizeof buf));
}

/* string := '...' | "...": its text in [*s, *s + *len). */
static bool parse_string(Cursor *c, const char **s, size_t *len) {
  if (!at(c, '\'') && !at(c, '"')) return expected(c, "a quoted string");
  char q = *c->p++;
  const char *start = c->p;
  while (c->p < c->end && *c->p != q) {
    unsigned char ch = (unsigned char)*c->p;
    if (ch == '\\') return fail(c->err, c->n, c->path, "bad header: a backslash in a string (NumPy writes none)");
    if (ch < 0x20 || ch >= 0x7f) return fail(c->err, c->n, c->path, "bad header: a string that is not printable ASCII");
    c->p++;
  }
  if (c->p >= c->end) return fail(c->err, c->n, c->path, "bad header: an unterminated string");
  *s = start, *len = (size_t)(c->p - start);
  c->p++;
  return true;
}

static bool is_word_char(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
}

static bool parse_bool(Cursor *c, bool *v) {
  const char *w = c->p;
  while (c->p < c->end && is_word_char(*c->p)) c->p++;
  size_t len = (size_t)(c->p - w);
  if (len == 4 && memcmp(w, "True", 4) == 0) return *v = true, true;
  if (len == 5 && memcmp(w, "False", 5) == 0) return *v = false, true;
  c->p = w;
  return expected(c, "True or False for 'fortran_order'");
}

/* One dim: decimal digits, no sign, no leading zero (Python's rule), at most SIZE_LIMIT. */
static bool parse_dim(Cursor *c, int64_t *v) {
  const char *s = c->p;
  while (c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++;
  size_t len = (size_t)(c->p - s);
  char buf[80];
  if (len == 0) {
    c->p = s;
    return expected(c, "a dim (a non-negative integer)");
  }
  if (c->p < c->end && is_word_char(*c->p)) {
    c->p = s;
    return expected(c, "a dim (a non-negative integer)");
  }
  if (len > 1 && s[0] == '0') return fail(c->err, c->n, c->path, "bad header: dim %s has a leading zero", shown(s, len, buf, sizeof buf));
  int64_t x = 0;
  for (size_t i = 0; i < len; i++)
    if (ckd_mul(&x, x, 10) || ckd_add(&x, x, s[i] - '0') || x > SIZE_LIMIT)
      return fail(c->err, c->n, c->path, "dim %s is too large (the limit is 2^62)", shown(s, len, buf, sizeof buf));
  *v = x;
  return true;
}

/* shape := "(" (dim ",")* (dim ","?)? ")", a one-dim tuple with its comma. */
static bool parse_shape(Cursor *c, NpyArray *a) {
  if (!at(c, '(')) return expected(c, "a tuple for 'shape', such as (4, 8) or (5,)");
  c->p++;
  skip_ws(c);
  bool comma = false;
  a->rank = 0;
  while (!at(c, ')')) {
    int64_t d = 0;
    if (!parse_dim(c, &d)) return false;
    if (a->rank == NPY_MAX_RANK) return fail(c->err, c->n, c->path, "shape of more than 8 dims");
    a->shape[a->rank++] = d;
    skip_ws(c);
    comma = at(c, ',');
    if (comma) {
      c->p++;
      skip_ws(c);
    } else if (!at(c, ')')) {
      return expected(c, "',' or ')' in 'shape'");
    }
  }
  c->p++;
  if (a->rank == 1 && !comma) return fail(c->err, c->n, c->path, "bad header: 'shape' is an int, not a tuple (a one-dim shape is written (5,))");
  a->n = 1;
  for (int d = 0; d < a->rank; d++)
    if (ckd_mul(&a->n, a->n, a->shape[d]) || a->n > SIZE_LIMIT)
      return fail(c->err, c->n, c->path, "shape of more than 2^62 elements");
  return true;
}

static bool parse_descr(Cursor *c, NpyArray *a) {
  if (!at(c, '\'') && !at(c, '"')) return expected(c, "a dtype string for 'descr' ('<f4' or '<i4')");
  const char *s;
  size_t len;
  if (!parse_string(c, &s, &len)) return false;
  if (len == 3 && memcmp(s, "<f4", 3) == 0) a->is_int = false;
  else if (len == 3 && memcmp(s, "<i4", 3) == 0) a->is_int = true;
  else {
    char buf[120];
    return fail(c->err, c->n, c->path, "dtype '%s' (expected float32 '<f4' or int32 '<i4')", shown(s, len, buf, sizeof buf));
  }
  return true;
}

static bool parse_header(const char *h, size_t len, const char *path, NpyArray *a, char *err, size_t n) {
  Cursor c = {h, h + len, path, err, n};
  enum { K_DESCR, K_FORTRAN, K_SHAPE, K_COUNT };
  static const char *const keys[K_COUNT] = {"descr", "fortran_order", "shape"};
  bool seen[K_COUNT] = {false};
  if (!at(&c, '{')) return expected(&c, "'{' (the header is a Python dict)");
  c.p++;
  skip_ws(&c);
  while (!at(&c, '}')) {
    const char *k;
    size_t klen;
    if (!parse_string(&c, &k, &klen)) return false;
    int key = -1;
    for (int i = 0; i < K_COUNT; i++)
      if (strlen(keys[i]) == klen && memcmp(keys[i], k, klen) == 0) key = i;
    char buf[120];
    if (key < 0) return fail(err, n, path, "bad header: unexpected key '%s' (NumPy writes 'descr', 'fortran_order' and 'shape')", shown(k, klen, buf, sizeof buf));
    if (seen[key]) return fail(err, n, path, "bad header: key '%s' given twice", keys[key]);
    seen[key] = true;
    skip_ws(&c);
    if (!at(&c, ':')) return expected(&c, "':' after a key");
    c.p++;
    skip_ws(&c);
    bool ok = key == K_DESCR ? parse_descr(&c, a) : key == K_FORTRAN ? parse_bool(&c, &a->fortran) : parse_shape(&c, a);
    if (!ok) return false;
    skip_ws(&c);
    if (at(&c, ',')) {
      c.p++;
      skip_ws(&c);
    } else if (!at(&c, '}')) {
      return expected(&c, "',' or '}'");
    }
  }
  c.p++;
  skip_ws(&c);
  if (c.p != c.end) return expected(&c, "nothing after the dict but spaces and a newline");
  for (int i = 0; i < K_COUNT; i++)
    if (!seen[i]) return fail(err, n, path, "bad header: no '%s'", keys[i]);
  return true;
}

/* The preamble: magic, version, header length. Its size (10 or 12) and the header's length. */
static bool parse_preamble(const unsigned char *p, size_t len, const char *path, size_t *pre, size_t *hl, char *err, size_t n) {
  if (len < 10 || memcmp(p, "\x93NUMPY", 6) != 0) return fail(err, n, path, "not a .npy file (it does not start with \\x93NUMPY)");
  if ((p[6] != 1 && p[6] != 2) || p[7] != 0) {
    return fail(err, n, path, ".npy format version %u.%u (NumPy writes 1.0 for float32 and int32 arrays; 1.0 and 2.0 are read)", p[6], p[7]);
  }
  if (p[6] == 1) {
    *pre = 10;
    *hl = (size_t)p[8] | (size_t)p[9] << 8;
  } else {
    if (len < 12) return fail(err, n, path, "truncated header");
    *pre = 12;
    *hl = (size_t)p[8] | (size_t)p[9] << 8 | (size_t)p[10] << 16 | (size_t)p[11] << 24;
  }
  if (*hl > NPY_MAX_HEADER) return fail(err, n, path, "a header of %zu bytes (shardc reads at most %d)", *hl, NPY_MAX_HEADER);
  return true;
}

/* The data's size against what the file has after the header. */
static bool check_size(const NpyArray *a, int64_t have, const char *path, char *err, size_t n) {
  int64_t need;
  if (ckd_mul(&need, a->n, 4)) need = INT64_MAX;
  if (need == have) return true;
  if (need > have)
    return fail(err, n, path, "truncated data: the shape needs %lld bytes, the file has %lld after its header", (long long)need,
                (long long)have);
  return fail(err, n, path, "%lld bytes after the data (the shape needs %lld; NumPy writes nothing after it)",
              (long long)(have - need), (long long)need);
}

/* n values, 4 bytes each, little-endian, from raw into out[first..]. */
static void convert(const unsigned char *raw, int64_t count, bool is_int, double *out) {
  for (int64_t i = 0; i < count; i++) {
    const unsigned char *b = raw + 4 * i;
    uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    if (is_int) {
      int32_t v;
      memcpy(&v, &u, 4);
      out[i] = v; /* exactly: an int32 through a float would round 2147483647 up */
    } else {
      float v;
      memcpy(&v, &u, 4);
      out[i] = v;
    }
  }
}

/* Fortran order (first dim fastest) into C order (last dim fastest). */
static bool reorder(NpyArray *a) {
  if (!a->fortran || a->rank < 2 || a->n == 0) return true;
  double *c = malloc(sizeof *c * (size_t)a->n);
  if (!c) return false;
  int64_t fstride[NPY_MAX_RANK], idx[NPY_MAX_RANK] = {0}, f = 0;
  fstride[0] = 1;
  for (int d = 1; d < a->rank; d++) fstride[d] = fstride[d - 1] * a->shape[d - 1];
  for (int64_t i = 0; i < a->n; i++) {
    c[i] = a->data[f];
    for (int d = a->rank - 1; d >= 0; d--) {
      if (++idx[d] < a->shape[d]) {
        f += fstride[d];
        break;
      }
      idx[d] = 0;
      f -= (a->shape[d] - 1) * fstride[d];
    }
  }
  free(a->data);
  a->data = c;
  return true;
}

static bool alloc_data(NpyArray *a, const char *path, char *err, size_t n) {
  a->data = malloc(sizeof(double) * (size_t)(a->n > 0 ? a->n : 1));
  if (!a->data) return fail(err, n, path, "out of memory for %s", a->is_int ? "its int32 values" : "its float32 values");
  return true;
}

bool npy_decode(const unsigned char *bytes, size_t len, const char *path, NpyArray *a, char *err, size_t n) {
  memset(a, 0, sizeof *a);
  size_t pre, hl;
  if (!parse_preamble(bytes, len, path, &pre, &hl, err, n)) return false;
  if (len - pre < hl) return fail(err, n, path, "truncated header");
  if (!parse_header((const char *)bytes + pre, hl, path, a, err, n)) return false;
  if (!check_size(a, (int64_t)(len - pre - hl), path, err, n)) return false;
  if (!alloc_data(a, path, err, n)) return false;
  convert(bytes + pre + hl, a->n, a->is_int, a->data);
  if (!reorder(a)) {
    npy_free(a);
    return fail(err, n, path, "out of memory for its Fortran-order values");
  }
  return true;
}

/* ---- files ---- */

/* Reads exactly len bytes (false at the end of the file or on an error, errno set; 0 at the end). */
static bool read_all(int fd, void *buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    ssize_t r = read(fd, (char *)buf + got, len - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (r == 0) errno = 0;
      return false;
    }
    got += (size_t)r;
  }
  return true;
}

bool npy_open_at(int dirfd, const char *name, const char *path, NpyFile *f, NpyArray *a, char *err, size_t n) {
  memset(a, 0, sizeof *a);
  f->path = path;
  /* O_NONBLOCK: opening a FIFO must not wait for a writer; only a regular file is read */
  f->fd = openat(dirfd, name, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (f->fd < 0)
    return fail(err, n, path, "%s",
                errno == ELOOP ? "a symlink loop" : errno == ENOENT ? "no such file (or a symlink to none)" : strerror(errno));
  struct stat st;
  if (fstat(f->fd, &st) != 0) return fail(err, n, path, "%s", strerror(errno));
  if (!S_ISREG(st.st_mode))
    return fail(err, n, path, "not a regular file (%s)", S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "a socket or other special file");
  int fl = fcntl(f->fd, F_GETFL);
  if (fl < 0 || fcntl(f->fd, F_SETFL, fl & ~O_NONBLOCK) != 0) return fail(err, n, path, "%s", strerror(errno));
  outfile_note_input(f->fd, path);
  unsigned char pre[12];
  size_t plen = st.st_size < 12 ? (size_t)st.st_size : 12, pl, hl;
  if (!read_all(f->fd, pre, plen)) return fail(err, n, path, "%s", errno ? strerror(errno) : "truncated header");
  if (!parse_preamble(pre, plen, path, &pl, &hl, err, n)) return false;
  if (lseek(f->fd, (off_t)pl, SEEK_SET) < 0) return fail(err, n, path, "%s", strerror(errno));
  if ((uint64_t)st.st_size < pl + hl) return fail(err, n, path, "truncated header");
  char *h = malloc(hl + 1);
  if (!h) return fail(err, n, path, "out of memory");
  bool ok = read_all(f->fd, h, hl);
  if (!ok) fail(err, n, path, "%s", errno ? strerror(errno) : "truncated header");
  ok = ok && parse_header(h, hl, path, a, err, n);
  free(h);
  return ok && check_size(a, (int64_t)st.st_size - (int64_t)(pl + hl), path, err, n);
}

bool npy_read_data(NpyFile *f, NpyArray *a, char *err, size_t n) {
  if (!alloc_data(a, f->path, err, n)) return false;
  enum { CHUNK = 16384 }; /* values per read */
  unsigned char *raw = malloc(4 * CHUNK);
  if (!raw) {
    npy_free(a);
    return fail(err, n, f->path, "out of memory");
  }
  for (int64_t i = 0; i < a->n; i += CHUNK) {
    int64_t k = a->n - i < CHUNK ? a->n - i : CHUNK;
    if (!read_all(f->fd, raw, (size_t)(4 * k))) {
      free(raw);
      npy_free(a);
      return fail(err, n, f->path, "%s", errno ? strerror(errno) : "truncated data (the file shrank while read)");
    }
    convert(raw, k, a->is_int, a->data + i);
  }
  free(raw);
  if (!reorder(a)) {
    npy_free(a);
    return fail(err, n, f->path, "out of memory for its Fortran-order values");
  }
  return true;
}

void npy_close(NpyFile *f) {
  if (f->fd >= 0) close(f->fd);
  f->fd = -1;
}

bool npy_read(const char *path, NpyArray *a, char *err, size_t n) {
  NpyFile f;
  bool ok = npy_open_at(AT_FDCWD, path, path, &f, a, err, n) && npy_read_data(&f, a, err, n);
  npy_close(&f);
  return ok;
}

bool npy_write_f32(FILE *f, const int64_t *shape, int rank, const double *data) {
  char dict[512];
  int len = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
  int64_t count = 1;
  for (int i = 0; i < rank && i < NPY_MAX_RANK; i++) {
    len += snprintf(dict + len, sizeof dict - (size_t)len, "%lld,%s", (long long)shape[i], i + 1 < rank ? " " : "");
    count = sat_mul(count, shape[i]);
  }
  if (rank > NPY_MAX_RANK) return false;
  len += snprintf(dict + len, sizeof dict - (size_t)len, "), }");
  int total = 10 + len + 1, pad = (64 - total % 64) % 64;
  unsigned hl = (unsigned)(len + pad + 1);
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hl & 0xff), (unsigned char)(hl >> 8)};
  fwrite(pre, 1, 10, f);
  fwrite(dict, 1, (size_t)len, f);
  for (int i = 0; i < pad; i++) fputc(' ', f);
  fputc('\n', f);
  for (int64_t i = 0; i < count; i++) {
    float v = (float)data[i];
    unsigned char b[4];
    uint32_t u;
    memcpy(&u, &v, 4);
    b[0] = (unsigned char)u, b[1] = (unsigned char)(u >> 8), b[2] = (unsigned char)(u >> 16), b[3] = (unsigned char)(u >> 24);
    fwrite(b, 4, 1, f);
  }
  return true;
}

void npy_free(NpyArray *a) {
  free(a->data);
  a->data = NULL;
}
