/* source.c: source files in memory.
 *
 * A Source holds a whole file as one NUL-terminated buffer (the lexer relies on the terminator and
 * diagnoses a NUL inside). Every Source stays alive, at a fixed address, until source_free_all, so
 * SrcLocs can point at it from anywhere in the compiler. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

/* Larger inputs are refused: columns and lengths in SrcLoc are ints. */
#define SOURCE_MAX_BYTES ((size_t)1 << 30)

typedef struct SourceNode {
  struct SourceNode *next;
  Source src;
} SourceNode;

static SourceNode *all_sources;

static Source *source_new(const char *path, char *text, size_t len) {
  SourceNode *n = malloc(sizeof *n);
  char *p = strdup(path);
  if (!n || !p) abort();
  n->src = (Source){p, text, len};
  n->next = all_sources;
  all_sources = n;
  return &n->src;
}

Source *source_load(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return NULL;
  struct stat st;
  if (fstat(fd, &st) != 0) goto fail;
  if (S_ISDIR(st.st_mode)) {
    errno = EISDIR;
    goto fail;
  }
  /* Read until EOF rather than trusting st_size, so pipes and /proc files work too. */
  size_t cap = S_ISREG(st.st_mode) && st.st_size > 0 ? (size_t)st.st_size + 1 : 4096, len = 0;
  if (cap > SOURCE_MAX_BYTES + 1) {
    errno = EFBIG;
    goto fail;
  }
  char *buf = malloc(cap);
  if (!buf) abort();
  for (;;) {
    if (len + 1 >= cap) {
      if (cap > SOURCE_MAX_BYTES) {
        free(buf);
        errno = EFBIG;
        goto fail;
      }
      cap *= 2;
      char *nb = realloc(buf, cap);
      if (!nb) abort();
      buf = nb;
    }
    ssize_t n = read(fd, buf + len, cap - 1 - len);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      free(buf);
      errno = e;
      goto fail;
    }
    if (n == 0) break;
    len += (size_t)n;
  }
  close(fd);
  buf[len] = '\0';
  return source_new(path, buf, len);

fail:;
  int e = errno;
  close(fd);
  errno = e;
  return NULL;
}

Source *source_from_memory(const char *path, const char *text, size_t len) {
  char *buf = malloc(len + 1);
  if (!buf) abort();
  if (len) memcpy(buf, text, len);
  buf[len] = '\0';
  return source_new(path, buf, len);
}

void source_free_all(void) {
  while (all_sources) {
    SourceNode *n = all_sources;
    all_sources = n->next;
    free((char *)n->src.path);
    free((char *)n->src.text);
    free(n);
  }
}
