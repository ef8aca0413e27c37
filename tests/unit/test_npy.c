/* test_npy.c: the .npy reader (compiler/driver/npy.c) on files written here byte by byte: what
 * NumPy writes is read exactly (both quotes, any spacing, version 2.0, scalars, int32's extremes,
 * Fortran order reordered), and everything else -- the shapes of issue 17 whose products overflow,
 * keys found inside other keys' strings, Python ints where tuples belong, truncated or padded data,
 * FIFOs and devices -- is refused with the message a user should see, without crashing, blocking or
 * allocating what the header claims. Expected values come from the bytes written here (and, for
 * Fortran order, from the index formula), never from the reader. Each file is also decoded from
 * memory (npy_decode, the fuzzer's entry) and must give the same answer.
 * Prints PASS/FAIL per case; exits 1 on any failure. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "npy.h"
#include "unit_test.h"

static char dir[] = "/tmp/test_npy.XXXXXX";
static char path[4200];
static unsigned char bytes[1 << 20]; /* the last file written */
static size_t nbytes;

/* A .npy file: magic, version, the header padded with spaces to a multiple of 64 and ended by a
 * newline (as NumPy pads it), then data. ver 1 or 2; header_len_override >= 0 writes that length. */
static const char *npy_file(const char *name, const char *header, int ver, const void *data, size_t len) {
  size_t pre = ver == 2 ? 12 : 10, hl = strlen(header), total = pre + hl + 1;
  size_t pad = (64 - total % 64) % 64;
  nbytes = 0;
  memcpy(bytes, "\x93NUMPY", 6);
  bytes[6] = (unsigned char)ver, bytes[7] = 0;
  size_t h = hl + pad + 1;
  bytes[8] = (unsigned char)h, bytes[9] = (unsigned char)(h >> 8);
  if (ver == 2) bytes[10] = (unsigned char)(h >> 16), bytes[11] = (unsigned char)(h >> 24);
  nbytes = pre;
  memcpy(bytes + nbytes, header, hl), nbytes += hl;
  memset(bytes + nbytes, ' ', pad), nbytes += pad;
  bytes[nbytes++] = '\n';
  if (len) memcpy(bytes + nbytes, data, len);
  nbytes += len;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(bytes, 1, nbytes, f) != nbytes || fclose(f) != 0) {
    printf("cannot write %s\n", path);
    exit(2);
  }
  return path;
}

static const char *raw_file(const char *name, const void *data, size_t len) {
  memcpy(bytes, data, len);
  nbytes = len;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) exit(2);
  return path;
}

/* An existing file (written by NumPy): its bytes for npy_decode. */
static const char *seed_file(const char *name) {
  snprintf(path, sizeof path, "%s/%s", NPY_SEEDS, name);
  FILE *f = fopen(path, "rb");
  nbytes = f ? fread(bytes, 1, sizeof bytes, f) : 0;
  if (f) fclose(f);
  return path;
}

/* npy_read of p must fail with a message containing want (and npy_decode of the same bytes too). */
static void expect_refused(const char *p, const char *want) {
  NpyArray a;
  char err[600] = "";
  bool ok = npy_read(p, &a, err, sizeof err);
  UT_CHECK(!ok, "%s was read (rank %d, n %lld); expected an error containing \"%s\"", p, a.rank, (long long)a.n, want);
  UT_CHECK(ok || strstr(err, want), "error \"%s\" does not contain \"%s\"", err, want);
  if (ok) npy_free(&a);
  char err2[600] = "";
  bool ok2 = npy_decode(bytes, nbytes, p, &a, err2, sizeof err2);
  UT_CHECK(!ok2 && strcmp(err, err2) == 0, "from memory: \"%s\" (the file: \"%s\")", ok2 ? "read" : err2, err);
  if (ok2) npy_free(&a);
}

/* npy_read of p must give this rank, shape, dtype and values. */
static void expect_read(const char *p, int rank, const int64_t *shape, bool is_int, const double *want, int64_t n) {
  NpyArray a;
  char err[600] = "";
  if (!npy_read(p, &a, err, sizeof err)) {
    ut_fail("%s: %s", p, err);
    return;
  }
  UT_CHECK(a.rank == rank, "rank %d, want %d", a.rank, rank);
  for (int d = 0; d < rank && d < a.rank; d++) UT_CHECK(a.shape[d] == shape[d], "dim %d: %lld, want %lld", d, (long long)a.shape[d], (long long)shape[d]);
  UT_CHECK(a.n == n, "n %lld, want %lld", (long long)a.n, (long long)n);
  UT_CHECK(a.is_int == is_int, "is_int %d, want %d", a.is_int, is_int);
  for (int64_t i = 0; i < n && i < a.n; i++) UT_CHECK(a.data[i] == want[i], "value %lld: %.17g, want %.17g", (long long)i, a.data[i], want[i]);
  NpyArray b;
  bool ok2 = npy_decode(bytes, nbytes, p, &b, err, sizeof err);
  UT_CHECK(ok2, "from memory: %s", err);
  for (int64_t i = 0; ok2 && i < n && i < b.n; i++) UT_CHECK(b.data[i] == a.data[i], "from memory, value %lld differs", (long long)i);
  if (ok2) npy_free(&b);
  npy_free(&a);
}

static void put_i32(unsigned char *b, int32_t v) {
  uint32_t u = (uint32_t)v;
  b[0] = (unsigned char)u, b[1] = (unsigned char)(u >> 8), b[2] = (unsigned char)(u >> 16), b[3] = (unsigned char)(u >> 24);
}

static void put_f32(unsigned char *b, float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  put_i32(b, (int32_t)u);
}

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "FAIL the reader blocked (alarm after 10 s)\n";
  write(1, msg, sizeof msg - 1);
  _exit(1);
}

int main(void) {
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 2;
  }
  signal(SIGALRM, on_alarm);
  alarm(10);
  unsigned char d32[32 * 4];
  double w32[32];
  for (int i = 0; i < 32; i++) put_f32(d32 + 4 * i, (float)i * 0.5f - 3), w32[i] = i * 0.5 - 3;
  int64_t s48[] = {4, 8};

  ut_begin("float32 as NumPy writes it");
  expect_read(npy_file("f.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 8), }", 1, d32, sizeof d32), 2, s48, false, w32, 32);
  ut_end();

  ut_begin("either quote, other spacing, no trailing comma, version 2.0");
  expect_read(npy_file("q.npy", "{\"descr\":\"<f4\",\"fortran_order\":False,\"shape\":(4,8)}", 1, d32, sizeof d32), 2, s48, false, w32, 32);
  expect_read(npy_file("q2.npy", "{ 'shape' : ( 4 ,\n 8 , ) ,\t'descr': \"<f4\", 'fortran_order': False }", 2, d32, sizeof d32), 2, s48,
              false, w32, 32);
  ut_end();

  ut_begin("a scalar, a one-dim shape, an empty array");
  {
    double one = w32[0];
    expect_read(npy_file("s.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 1, d32, 4), 0, NULL, false, &one, 1);
    int64_t s5[] = {5};
    expect_read(npy_file("v.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", 1, d32, 20), 1, s5, false, w32, 5);
    int64_t s0[] = {0, 3};
    expect_read(npy_file("e.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }", 1, NULL, 0), 2, s0, false, NULL, 0);
  }
  ut_end();

  ut_begin("int32 extremes read exactly (2147483647 is not -2147483648)");
  {
    int32_t vals[] = {2147483647, -2147483647 - 1, 2147483646, 16777217, -1, 0};
    unsigned char b[sizeof vals];
    double want[6];
    for (int i = 0; i < 6; i++) put_i32(b + 4 * i, vals[i]), want[i] = vals[i];
    int64_t s6[] = {6};
    expect_read(npy_file("i.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (6,), }", 1, b, sizeof b), 1, s6, true, want, 6);
  }
  ut_end();

  ut_begin("Fortran order is reordered into C order");
  {
    /* shape (2, 3, 4): element [i][j][k] holds 100 i + 10 j + k; Fortran order stores i fastest:
     * file position i + 2 j + 6 k */
    unsigned char b[24 * 4];
    double want[24];
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 3; j++)
        for (int k = 0; k < 4; k++) {
          put_i32(b + 4 * (i + 2 * j + 6 * k), 100 * i + 10 * j + k);
          want[(i * 3 + j) * 4 + k] = 100 * i + 10 * j + k;
        }
    int64_t s[] = {2, 3, 4};
    expect_read(npy_file("fo.npy", "{'descr': '<i4', 'shape': (2, 3, 4), 'fortran_order': True}", 1, b, sizeof b), 3, s, true, want, 24);
  }
  ut_end();

  ut_begin("files NumPy wrote (tests/fuzz/npy): float32, int32 extremes, Fortran order");
  {
    double f[32], i6[] = {2147483647, -2147483648.0, 0, 1, -1, 70}, c[24];
    for (int i = 0; i < 32; i++) f[i] = (i - 16) / 4.0; /* (np.arange(32) - 16) / 4 */
    for (int i = 0; i < 24; i++) c[i] = i;              /* np.arange(24).reshape(2, 3, 4), stored Fortran */
    int64_t s32[] = {32}, s6[] = {6}, s234[] = {2, 3, 4};
    expect_read(seed_file("f32_32.npy"), 1, s32, false, f, 32);
    expect_read(seed_file("i32_6.npy"), 1, s6, true, i6, 6);
    expect_read(seed_file("i32_fortran_2x3x4.npy"), 3, s234, true, c, 24);
    expect_refused(seed_file("f64_2x2.npy"), "dtype '<f8'");
  }
  ut_end();

  ut_begin("shapes whose product or dims overflow (issue 17)");
  expect_refused(npy_file("o1.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (3, 5, 17, 257, 641, 65537, 6700417), }", 1, d32, 64),
                 "shape of more than 2^62 elements");
  expect_refused(npy_file("o2.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (4611686018427387905,), }", 1, d32, 64),
                 "dim 4611686018427387905 is too large");
  expect_refused(npy_file("o3.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 1, d32, 64),
                 "dim 99999999999999999999 is too large");
  expect_refused(npy_file("o4.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904,), }", 1, d32, 64),
                 "truncated data: the shape needs");
  expect_refused(npy_file("o5.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (65536, 65536, 65536, 65536), }", 1, d32, 64),
                 "shape of more than 2^62 elements");
  expect_refused(npy_file("o6.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1), }", 1, d32, 4),
                 "shape of more than 8 dims");
  ut_end();

  ut_begin("the header is a dict, not text to search");
  expect_refused(npy_file("k1.npy", "{'fortran_order': False, 'shape': (4, 8), 'zz': \"'descr': '<i4'\", 'descr': '<f4'}", 1, d32, sizeof d32),
                 "unexpected key 'zz'");
  expect_refused(npy_file("k2.npy", "{'descr': '<f4', 'shape': (4, 8), 'descr': '<f4', 'fortran_order': False}", 1, d32, sizeof d32),
                 "key 'descr' given twice");
  expect_refused(npy_file("k3.npy", "{'descr': '<f4', 'shape': (4, 8)}", 1, d32, sizeof d32), "bad header: no 'fortran_order'");
  expect_refused(npy_file("k4.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (32), }", 1, d32, sizeof d32),
                 "'shape' is an int, not a tuple");
  expect_refused(npy_file("k5.npy", "{'descr': '<f4', 'fortran_order': false, 'shape': (4, 8), }", 1, d32, sizeof d32),
                 "expected True or False for 'fortran_order'");
  expect_refused(npy_file("k6.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (04, 8), }", 1, d32, sizeof d32), "leading zero");
  expect_refused(npy_file("k7.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, -8), }", 1, d32, sizeof d32),
                 "expected a dim (a non-negative integer), found '-8");
  expect_refused(npy_file("k8.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 8), } x", 1, d32, sizeof d32),
                 "expected nothing after the dict");
  expect_refused(npy_file("k9.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 8), # c\n}", 1, d32, sizeof d32),
                 "expected a quoted string, found '#");
  expect_refused(npy_file("k10.npy", "{'descr': '<f\\x34', 'fortran_order': False, 'shape': (4, 8)}", 1, d32, sizeof d32),
                 "a backslash in a string");
  expect_refused(npy_file("k11.npy", "{'descr': '<f4, 'fortran_order': False, 'shape': (4, 8)}", 1, d32, sizeof d32),
                 "dtype '<f4, '");
  expect_refused(npy_file("k12.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 8)", 1, d32, sizeof d32),
                 "expected ',' or '}', found the end of the header");
  ut_end();

  ut_begin("dtypes other than float32 and int32: clean messages");
  expect_refused(npy_file("d1.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (4, 8), }", 1, d32, sizeof d32),
                 ": dtype '<f8' (expected float32 '<f4' or int32 '<i4')");
  expect_refused(npy_file("d2.npy", "{'descr': '>f4', 'fortran_order': False, 'shape': (4, 8), }", 1, d32, sizeof d32), "dtype '>f4'");
  expect_refused(npy_file("d3.npy", "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (4, 8), }", 1, d32, sizeof d32),
                 "expected a dtype string for 'descr'");
  expect_refused(npy_file("d4.npy", "{'descr': '\xe9<f4', 'fortran_order': False, 'shape': (4, 8), }", 1, d32, sizeof d32),
                 "a string that is not printable ASCII");
  ut_end();

  ut_begin("the data must be exactly what the shape needs");
  expect_refused(npy_file("t1.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 8), }", 1, d32, sizeof d32 - 1),
                 "truncated data: the shape needs 128 bytes, the file has 127 after its header");
  expect_refused(npy_file("t2.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 8), }", 1, d32, 120), "the file has 120");
  {
    unsigned char more[140] = {0};
    expect_refused(npy_file("t3.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 8), }", 1, more, sizeof more),
                   "12 bytes after the data");
  }
  ut_end();

  ut_begin("not .npy files");
  expect_refused(raw_file("m1.npy", "", 0), "not a .npy file");
  expect_refused(raw_file("m2.npy", "PK\3\4 a zip", 11), "not a .npy file");
  expect_refused(raw_file("m3.npy", "\x93NUMPY\3\0\20\0{}", 12), ".npy format version 3.0");
  expect_refused(raw_file("m4.npy", "\x93NUMPY\1\0\377\377{'descr'", 18), "truncated header");
  expect_refused(raw_file("m5b.npy", "\x93NUMPY\2\0\1\0\1\0{}", 14), "a header of 65537 bytes");
  ut_end();

  ut_begin("only regular files: a FIFO, a directory and a device are refused without blocking");
  {
    snprintf(path, sizeof path, "%s/fifo.npy", dir);
    UT_CHECK(mkfifo(path, 0600) == 0, "mkfifo: %s", strerror(errno));
    NpyArray a;
    char err[600] = "";
    UT_CHECK(!npy_read(path, &a, err, sizeof err) && strstr(err, "not a regular file (a FIFO)"), "FIFO: %s", err);
    UT_CHECK(!npy_read(dir, &a, err, sizeof err) && strstr(err, "not a regular file (a directory)"), "directory: %s", err);
    UT_CHECK(!npy_read("/dev/zero", &a, err, sizeof err) && strstr(err, "not a regular file (a device)"), "/dev/zero: %s", err);
    snprintf(path, sizeof path, "%s/dangling.npy", dir);
    UT_CHECK(symlink("nowhere.npy", path) == 0, "symlink");
    UT_CHECK(!npy_read(path, &a, err, sizeof err) && strstr(err, "dangling.npy: no such file"), "dangling symlink: %s", err);
    snprintf(path, sizeof path, "%s/loop.npy", dir);
    UT_CHECK(symlink("loop.npy", path) == 0, "symlink");
    UT_CHECK(!npy_read(path, &a, err, sizeof err) && strstr(err, "loop.npy: a symlink loop"), "symlink loop: %s", err);
  }
  ut_end();

  DIR *dd = opendir(dir); /* the scratch directory holds files only */
  for (struct dirent *e; dd && (e = readdir(dd));)
    if (e->d_name[0] != '.' || (e->d_name[1] && strcmp(e->d_name, ".."))) unlinkat(dirfd(dd), e->d_name, 0);
  if (dd) closedir(dd);
  rmdir(dir);
  return ut_summary();
}
