/* objcache.c: the on-disk cache of compiled objects (objcache.h). An entry's file: the magic
 * "SHARDCO1", the object's length (8 bytes, little-endian), its SHA-256 (32 bytes), the object. */
#include "objcache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sha256.h"

static const char MAGIC[8] = {'S', 'H', 'A', 'R', 'D', 'C', 'O', '1'};
enum { HEADER = 8 + 8 + 32 };

/* mkdir -p with mode 0700 for what it makes (existing parents are left as they are) */
static void make_dirs(const char *path) {
  char p[1024];
  snprintf(p, sizeof p, "%s", path);
  for (char *s = p + 1; *s; s++)
    if (*s == '/') {
      *s = 0;
      mkdir(p, 0700);
      *s = '/';
    }
  mkdir(p, 0700);
}

bool objcache_open(ObjCache *c, char *err, size_t n) {
  c->dirfd = -1;
  const char *env = getenv("SHARDC_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  if (env && *env) snprintf(c->path, sizeof c->path, "%s", env);
  else if (xdg && *xdg == '/') snprintf(c->path, sizeof c->path, "%s/shardc", xdg);
  else if (home && *home == '/') snprintf(c->path, sizeof c->path, "%s/.cache/shardc", home);
  else {
    snprintf(err, n, "no cache directory: set SHARDC_CACHE_DIR, XDG_CACHE_HOME or HOME");
    return false;
  }
  make_dirs(c->path);
  struct stat ls;
  if (lstat(c->path, &ls) == 0 && S_ISLNK(ls.st_mode)) {
    snprintf(err, n, "cache directory %s is a symlink: not followed, not used", c->path);
    return false;
  }
  int fd = open(c->path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    snprintf(err, n, "cache directory %s: %s", c->path, strerror(errno));
    return false;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022)) {
    snprintf(err, n, "cache directory %s is not a directory owned by this user and writable by it alone (mode %03o): not used",
             c->path, (unsigned)(st.st_mode & 0777));
    close(fd);
    return false;
  }
  c->dirfd = fd;
  return true;
}

void objcache_close(ObjCache *c) {
  if (c->dirfd >= 0) close(c->dirfd);
  c->dirfd = -1;
}

static bool key_ok(const char *key) {
  size_t i = 0;
  for (; key[i]; i++)
    if (!((key[i] >= '0' && key[i] <= '9') || (key[i] >= 'a' && key[i] <= 'f'))) return false;
  return i == 64;
}

bool objcache_get(ObjCache *c, const char *key, void **data, size_t *len, bool *bad, char *err, size_t n) {
  *bad = false, *data = NULL, *len = 0;
  if (c->dirfd < 0 || !key_ok(key)) return false;
  char name[80];
  snprintf(name, sizeof name, "%s.o", key);
  int fd = openat(c->dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return false;
    int e = errno;
    *bad = true;
    snprintf(err, n, "cache entry %s/%s: %s", c->path, name, e == ELOOP ? "a symlink: not followed (removed)" : strerror(e));
    if (e == ELOOP) unlinkat(c->dirfd, name, 0); /* the link itself, never its target */
    return false;
  }
  struct stat st;
  unsigned char *buf = NULL;
  const char *why = NULL;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) why = "not a regular file";
  else if (st.st_uid != geteuid()) why = "owned by another user";
  else if (st.st_size < HEADER) why = "shorter than its header";
  else if (!(buf = malloc((size_t)st.st_size))) why = "out of memory";
  size_t got = 0;
  while (!why && got < (size_t)st.st_size) {
    ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
    if (r <= 0) why = "read failed";
    else got += (size_t)r;
  }
  close(fd);
  uint64_t olen = 0;
  if (!why) {
    for (int i = 0; i < 8; i++) olen |= (uint64_t)buf[8 + i] << (8 * i);
    if (memcmp(buf, MAGIC, 8) != 0) why = "not a shardc cache entry";
    else if (olen != (uint64_t)st.st_size - HEADER) why = "truncated or overlong";
  }
  if (!why) {
    unsigned char digest[32];
    Sha256 s;
    sha256_init(&s);
    sha256_update(&s, buf + HEADER, (size_t)olen);
    sha256_final(&s, digest);
    if (memcmp(digest, buf + 16, 32) != 0) why = "its content does not match its hash";
  }
  if (why) {
    free(buf);
    *bad = true;
    snprintf(err, n, "cache entry %s/%s: %s (removed; compiling again)", c->path, name, why);
    unlinkat(c->dirfd, name, 0);
    return false;
  }
  memmove(buf, buf + HEADER, (size_t)olen);
  *data = buf, *len = (size_t)olen;
  return true;
}

bool objcache_put(ObjCache *c, const char *key, const void *data, size_t len, char *err, size_t n) {
  if (c->dirfd < 0 || !key_ok(key)) {
    snprintf(err, n, "no cache");
    return false;
  }
  unsigned char head[HEADER];
  memcpy(head, MAGIC, 8);
  for (int i = 0; i < 8; i++) head[8 + i] = (unsigned char)((uint64_t)len >> (8 * i));
  Sha256 s;
  sha256_init(&s);
  sha256_update(&s, data, len);
  sha256_final(&s, head + 16);
  char tmp[128], name[80];
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  snprintf(tmp, sizeof tmp, "tmp.%ld.%ld.%s", (long)getpid(), (long)ts.tv_nsec, key);
  snprintf(name, sizeof name, "%s.o", key);
  int fd = openat(c->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    snprintf(err, n, "cache %s: cannot create %s: %s", c->path, tmp, strerror(errno));
    return false;
  }
  bool ok = true;
  const unsigned char *parts[2] = {head, data};
  size_t lens[2] = {HEADER, len};
  for (int p = 0; p < 2 && ok; p++)
    for (size_t at = 0; at < lens[p] && ok;) {
      ssize_t w = write(fd, parts[p] + at, lens[p] - at);
      if (w <= 0) ok = false;
      else at += (size_t)w;
    }
  if (close(fd) != 0) ok = false;
  if (!ok || renameat(c->dirfd, tmp, c->dirfd, name) != 0) { /* rename: atomic, a concurrent reader sees all or nothing */
    snprintf(err, n, "cache %s: writing %s: %s", c->path, name, strerror(errno));
    unlinkat(c->dirfd, tmp, 0);
    return false;
  }
  return true;
}
