/* objcache.c: the on-disk cache of compiled objects (objcache.h). An entry's file: the magic
 * "SHARDCO1", the object's length (8 bytes, little-endian), its SHA-256 (32 bytes), the object. */
#include "objcache.h"

#include <dirent.h>
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

/* $SHARDC_CACHE_MAX: digits with an optional K, M or G (powers of 1024); -1 if it is not that */
static long long parse_size(const char *s) {
  if (!*s) return -1;
  long long v = 0;
  const char *p = s;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (v > (1LL << 50)) return -1;
    v = v * 10 + (*p - '0');
  }
  if (p == s) return -1;
  int shift = 0;
  if (*p == 'K' || *p == 'k') shift = 10, p++;
  else if (*p == 'M' || *p == 'm') shift = 20, p++;
  else if (*p == 'G' || *p == 'g') shift = 30, p++;
  if (*p || v > (1LL << 52) >> shift) return -1;
  return v << shift;
}

bool objcache_open(ObjCache *c, char *err, size_t n) {
  c->dirfd = -1;
  c->max_bytes = OBJCACHE_DEFAULT_MAX;
  const char *max = getenv("SHARDC_CACHE_MAX");
  if (max && (c->max_bytes = parse_size(max)) < 0) {
    snprintf(err, n, "SHARDC_CACHE_MAX=%s is not a size (bytes, or a number with K, M or G): the cache is not used", max);
    return false;
  }
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
  if (!why) futimens(fd, NULL); /* a hit: the entry is the most recently used (objcache_trim's LRU) */
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
  objcache_trim(c, key);
  return true;
}

typedef struct Entry {
  char name[80];
  long long size;
  struct timespec mtime;
} Entry;

static int older(const void *a, const void *b) {
  const Entry *x = a, *y = b;
  if (x->mtime.tv_sec != y->mtime.tv_sec) return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
  if (x->mtime.tv_nsec != y->mtime.tv_nsec) return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
  return strcmp(x->name, y->name);
}

int objcache_trim(ObjCache *c, const char *keep) {
  if (c->dirfd < 0) return 0;
  int fd = dup(c->dirfd);
  DIR *d = fd < 0 ? NULL : fdopendir(fd);
  if (!d) {
    if (fd >= 0) close(fd);
    return 0;
  }
  rewinddir(d); /* the dup shares c->dirfd's offset, which an earlier trim left at the end */
  Entry *es = NULL;
  size_t ne = 0, cap = 0;
  long long total = 0;
  time_t now = time(NULL);
  char keepname[80] = "";
  if (keep) snprintf(keepname, sizeof keepname, "%s.o", keep);
  for (struct dirent *de; (de = readdir(d));) {
    struct stat st;
    if (fstatat(c->dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid())
      continue;
    size_t l = strlen(de->d_name);
    if (strncmp(de->d_name, "tmp.", 4) == 0) { /* a writer's temporary: one an hour old is a dead writer's */
      if (st.st_mtime < now - 3600) unlinkat(c->dirfd, de->d_name, 0);
      continue;
    }
    if (l != 66 || strcmp(de->d_name + 64, ".o") != 0) continue; /* only entries: key.o */
    total += (long long)st.st_size;
    if (strcmp(de->d_name, keepname) == 0) continue;
    if (ne == cap) {
      Entry *g = realloc(es, (cap = cap ? 2 * cap : 64) * sizeof *es);
      if (!g) break;
      es = g;
    }
    memcpy(es[ne].name, de->d_name, 67); /* 66 characters (checked above) and the NUL */
    es[ne].size = (long long)st.st_size, es[ne].mtime = st.st_mtim;
    ne++;
  }
  closedir(d);
  int removed = 0;
  if (c->max_bytes > 0 && total > c->max_bytes) {
    qsort(es, ne, sizeof *es, older);
    for (size_t i = 0; i < ne && total > c->max_bytes; i++)
      if (unlinkat(c->dirfd, es[i].name, 0) == 0) total -= es[i].size, removed++;
      else if (errno == ENOENT) total -= es[i].size; /* a concurrent trim took it */
  }
  free(es);
  return removed;
}

