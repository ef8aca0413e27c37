/* test_objcache.c: SHA-256 against FIPS 180-4's example digests, and the on-disk object cache
 * (compiler/base/objcache.c): an entry read back whole; a flipped byte, a truncation, a foreign
 * file and a symlink in place of an entry refused (and removed: a symlink's target untouched);
 * a directory that is a symlink, or that others may write, not used; eight processes writing the
 * same key at once leave one whole entry. Expected digests are the standard's, not this code's.
 * Prints PASS/FAIL per case; exits 1 on any failure. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "objcache.h"
#include "sha256.h"
#include "unit_test.h"

static char dir[] = "/tmp/test_objcache.XXXXXX";
static const char KEY[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

static void digest_of(const void *data, size_t n, size_t chunk, char hex[65]) {
  Sha256 s;
  unsigned char d[32];
  sha256_init(&s);
  for (size_t at = 0; at < n; at += chunk) sha256_update(&s, (const char *)data + at, n - at < chunk ? n - at : chunk);
  sha256_final(&s, d);
  sha256_hex(d, hex);
}

static void test_sha256(void) {
  ut_begin("SHA-256: FIPS 180-4's examples (one block, two blocks, a million a's), fed whole and in odd pieces");
  char hex[65];
  static const struct { const char *msg; const char *want; } v[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"}};
  for (size_t i = 0; i < sizeof v / sizeof *v; i++)
    for (size_t chunk = 1; chunk <= 64; chunk += 63) {
      digest_of(v[i].msg, strlen(v[i].msg), chunk, hex);
      UT_CHECK(strcmp(hex, v[i].want) == 0, "\"%s\" in pieces of %zu: %s", v[i].msg, chunk, hex);
    }
  char *a = malloc(1000000);
  memset(a, 'a', 1000000);
  digest_of(a, 1000000, 1000000, hex);
  UT_CHECK(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0, "a million a's: %s", hex);
  digest_of(a, 1000000, 777, hex);
  UT_CHECK(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0, "a million a's in 777s: %s", hex);
  free(a);
  ut_end();
}

static char entry[4400];

static bool open_cache(ObjCache *c, const char *sub, char *err, size_t n) {
  char p[4200];
  snprintf(p, sizeof p, "%s/%s", dir, sub);
  setenv("SHARDC_CACHE_DIR", p, 1);
  snprintf(entry, sizeof entry, "%s/%s.o", p, KEY);
  return objcache_open(c, err, n);
}

static void test_roundtrip(void) {
  ut_begin("an entry is read back whole; the directory is made 0700; a missing key is a miss");
  ObjCache c;
  char err[1400] = "";
  UT_CHECK(open_cache(&c, "a/b", err, sizeof err), "open: %s", err);
  struct stat st;
  char p[4200];
  snprintf(p, sizeof p, "%s/a/b", dir);
  UT_CHECK(stat(p, &st) == 0 && (st.st_mode & 0777) == 0700, "mode %o", (unsigned)(st.st_mode & 0777));
  void *data;
  size_t len;
  bool bad;
  UT_CHECK(!objcache_get(&c, KEY, &data, &len, &bad, err, sizeof err) && !bad, "an empty cache hit");
  char obj[5000];
  for (size_t i = 0; i < sizeof obj; i++) obj[i] = (char)(i * 7);
  UT_CHECK(objcache_put(&c, KEY, obj, sizeof obj, err, sizeof err), "put: %s", err);
  UT_CHECK(objcache_get(&c, KEY, &data, &len, &bad, err, sizeof err) && len == sizeof obj && memcmp(data, obj, len) == 0, "get: %s", err);
  if (len) free(data);
  UT_CHECK(!objcache_get(&c, "not a key", &data, &len, &bad, err, sizeof err), "a malformed key");
  objcache_close(&c);
  ut_end();
}

/* Damages the entry with fn, then expects a refusal naming why, and the entry gone. */
static void expect_refused(const char *name, void (*damage)(void), const char *why) {
  ut_begin(name);
  ObjCache c;
  char err[1400] = "";
  UT_CHECK(open_cache(&c, "a/b", err, sizeof err), "open: %s", err);
  char obj[3000];
  memset(obj, 'x', sizeof obj);
  UT_CHECK(objcache_put(&c, KEY, obj, sizeof obj, err, sizeof err), "put: %s", err);
  damage();
  void *data = NULL;
  size_t len;
  bool bad = false;
  err[0] = 0;
  UT_CHECK(!objcache_get(&c, KEY, &data, &len, &bad, err, sizeof err), "the damaged entry was used");
  UT_CHECK(bad && strstr(err, why), "bad %d, message: %s (want '%s')", bad, err, why);
  struct stat st;
  UT_CHECK(lstat(entry, &st) != 0, "the bad entry is still there");
  free(data);
  objcache_close(&c);
  ut_end();
}

static void flip(void) {
  int fd = open(entry, O_RDWR);
  unsigned char b;
  pread(fd, &b, 1, 2000), b ^= 1, pwrite(fd, &b, 1, 2000);
  close(fd);
}
static void chop(void) { truncate(entry, 1000); }
static void foreign(void) {
  FILE *f = fopen(entry, "w");
  fputs("#!/bin/sh\necho not an object, but long enough to hold a header of 48 bytes\n", f);
  fclose(f);
}
static char target[4200];
static void symlinked(void) {
  snprintf(target, sizeof target, "%s/target", dir);
  rename(entry, target); /* a whole, valid entry elsewhere: still refused through a symlink */
  symlink(target, entry);
}

static void test_dirs(void) {
  ut_begin("a cache directory that is a symlink, or that others may write, is not used");
  char p[4200], q[4200], err[1400] = "";
  snprintf(p, sizeof p, "%s/real", dir);
  snprintf(q, sizeof q, "%s/link", dir);
  mkdir(p, 0700);
  symlink(p, q);
  ObjCache c;
  UT_CHECK(!open_cache(&c, "link", err, sizeof err) && strstr(err, "symlink"), "a symlinked directory: %s", err);
  snprintf(p, sizeof p, "%s/open", dir);
  mkdir(p, 0700);
  chmod(p, 0777);
  err[0] = 0;
  UT_CHECK(!open_cache(&c, "open", err, sizeof err) && strstr(err, "writable by it alone"), "a 0777 directory: %s", err);
  chmod(p, 0720);
  err[0] = 0;
  UT_CHECK(!open_cache(&c, "open", err, sizeof err), "a group-writable directory was used");
  ut_end();
}

static void test_concurrent(void) {
  ut_begin("eight processes writing the same key at once leave one whole entry and no temporary files");
  char obj[200000];
  for (size_t i = 0; i < sizeof obj; i++) obj[i] = (char)(i * 13 + 5);
  pid_t kids[8];
  for (int k = 0; k < 8; k++)
    if ((kids[k] = fork()) == 0) {
      ObjCache c;
      char err[1400];
      int ok = open_cache(&c, "race", err, sizeof err);
      for (int r = 0; r < 20 && ok; r++) ok = objcache_put(&c, KEY, obj, sizeof obj, err, sizeof err);
      _exit(ok ? 0 : 1);
    }
  int fails = 0;
  for (int k = 0; k < 8; k++) {
    int status;
    waitpid(kids[k], &status, 0);
    fails += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  }
  UT_CHECK(fails == 0, "%d writers failed", fails);
  ObjCache c;
  char err[1400] = "";
  void *data = NULL;
  size_t len = 0;
  bool bad;
  UT_CHECK(open_cache(&c, "race", err, sizeof err), "open: %s", err);
  UT_CHECK(objcache_get(&c, KEY, &data, &len, &bad, err, sizeof err) && len == sizeof obj && memcmp(data, obj, len) == 0, "get: %s", err);
  free(data);
  objcache_close(&c);
  char cmd[4300];
  snprintf(cmd, sizeof cmd, "test $(ls -A %s/race | wc -l) -eq 1", dir);
  UT_CHECK(system(cmd) == 0, "files other than the entry are left in the directory");
  ut_end();
}

static bool present(const char *sub, const char *key) {
  char p[4400];
  snprintf(p, sizeof p, "%s/%s/%s.o", dir, sub, key);
  return access(p, F_OK) == 0;
}

static void pause_ms(long ms) { /* mtimes come from the kernel's coarse clock: a few ms apart */
  struct timespec t = {0, ms * 1000000L};
  nanosleep(&t, NULL);
}

/* The size bound. Entries of a 5000-byte object are 5048 bytes (8 magic + 8 length + 32 hash), so
 * under SHARDC_CACHE_MAX=20K (20480) four fit (20192) and a fifth (25240) evicts the least recently
 * used: k1, since k0 was read (a hit makes it the newest) after k1 and k2 were stored. */
static void test_bound(void) {
  ut_begin("SHARDC_CACHE_MAX: parsed (K/M/G, 0 none), a bad one refused; the bound kept by LRU over mtime, a hit refreshing it");
  ObjCache c;
  char err[1400] = "";
  setenv("SHARDC_CACHE_MAX", "12X", 1);
  UT_CHECK(!open_cache(&c, "bound", err, sizeof err) && strstr(err, "not a size"), "a bad SHARDC_CACHE_MAX accepted: %s", err);
  setenv("SHARDC_CACHE_MAX", "3M", 1);
  UT_CHECK(open_cache(&c, "bound", err, sizeof err) && c.max_bytes == 3LL * 1048576, "3M: %lld", c.max_bytes);
  objcache_close(&c);
  setenv("SHARDC_CACHE_MAX", "0", 1);
  UT_CHECK(open_cache(&c, "bound", err, sizeof err) && c.max_bytes == 0, "0: %lld", c.max_bytes);
  objcache_close(&c);
  unsetenv("SHARDC_CACHE_MAX");
  UT_CHECK(open_cache(&c, "bound", err, sizeof err) && c.max_bytes == OBJCACHE_DEFAULT_MAX, "default: %lld", c.max_bytes);
  objcache_close(&c);
  setenv("SHARDC_CACHE_MAX", "20K", 1);
  UT_CHECK(open_cache(&c, "bound", err, sizeof err) && c.max_bytes == 20480, "20K: %lld", c.max_bytes);
  char keys[6][65];
  for (int k = 0; k < 6; k++) snprintf(keys[k], sizeof keys[k], "%064d", k);
  char obj[5000];
  for (size_t i = 0; i < sizeof obj; i++) obj[i] = (char)(i * 3);
  void *data;
  size_t len;
  bool bad;
  for (int k = 0; k < 3; k++, pause_ms(20)) UT_CHECK(objcache_put(&c, keys[k], obj, sizeof obj, err, sizeof err), "put %d: %s", k, err);
  UT_CHECK(objcache_get(&c, keys[0], &data, &len, &bad, err, sizeof err), "get k0: %s", err);
  free(data);
  pause_ms(20);
  UT_CHECK(objcache_put(&c, keys[3], obj, sizeof obj, err, sizeof err), "put 3: %s", err);
  UT_CHECK(present("bound", keys[0]) && present("bound", keys[1]) && present("bound", keys[2]) && present("bound", keys[3]),
           "four entries (20192 bytes) fit in 20480, yet one was removed");
  pause_ms(20);
  UT_CHECK(objcache_put(&c, keys[4], obj, sizeof obj, err, sizeof err), "put 4: %s", err);
  UT_CHECK(!present("bound", keys[1]), "the least recently used (k1) kept past the bound");
  UT_CHECK(present("bound", keys[0]) && present("bound", keys[2]) && present("bound", keys[3]) && present("bound", keys[4]),
           "a more recently used entry removed (k0 was read after k1 was stored)");
  pause_ms(20);
  UT_CHECK(objcache_put(&c, keys[5], obj, sizeof obj, err, sizeof err), "put 5: %s", err);
  UT_CHECK(!present("bound", keys[2]) && present("bound", keys[0]) && present("bound", keys[5]), "the next oldest (k2) not the one removed");
  /* a writer's temporary: an hour old is a dead writer's and goes; a fresh one may be a live writer's */
  char p[4400];
  snprintf(p, sizeof p, "%s/bound/tmp.1.1.old", dir);
  FILE *f = fopen(p, "w");
  fputs("x", f), fclose(f);
  struct timespec old[2] = {{time(NULL) - 7200, 0}, {time(NULL) - 7200, 0}};
  utimensat(AT_FDCWD, p, old, 0);
  snprintf(p, sizeof p, "%s/bound/tmp.1.2.new", dir);
  f = fopen(p, "w");
  fputs("x", f), fclose(f);
  UT_CHECK(objcache_trim(&c, NULL) == 0, "a trim under the bound removed an entry");
  snprintf(p, sizeof p, "%s/bound/tmp.1.1.old", dir);
  UT_CHECK(access(p, F_OK) != 0, "a temporary two hours old was kept");
  snprintf(p, sizeof p, "%s/bound/tmp.1.2.new", dir);
  UT_CHECK(access(p, F_OK) == 0, "a fresh temporary (a live writer's) was removed");
  objcache_close(&c);
  unsetenv("SHARDC_CACHE_MAX");
  ut_end();
}

int main(void) {
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 2;
  }
  test_sha256();
  test_roundtrip();
  expect_refused("an entry with a byte flipped is refused and removed", flip, "does not match its hash");
  expect_refused("a truncated entry is refused and removed", chop, "truncated");
  expect_refused("a file that is not an entry is refused and removed", foreign, "not a shardc cache entry");
  expect_refused("a symlink in place of an entry is not followed, and removed", symlinked, "symlink");
  struct stat st;
  ut_begin("the symlink's target is untouched");
  UT_CHECK(stat(target, &st) == 0 && st.st_size > 3000, "the target was removed or changed");
  ut_end();
  test_dirs();
  test_concurrent();
  test_bound();
  char cmd[200];
  snprintf(cmd, sizeof cmd, "chmod -R u+w %s && rm -rf %s", dir, dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
  return ut_summary();
}
