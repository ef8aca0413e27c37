/* source.c: source files in memory.
 *
 * A Source holds a whole file as one NUL-terminated buffer (the lexer relies on the terminator and
 * diagnoses a NUL inside). Every Source stays alive, at a fixed address, until source_free_all, so
 * SrcLocs can point at it from anywhere in the compiler.
 *
 * Input is read up to source_max_bytes() (64 MiB unless $SHARDC_MAX_INPUT says otherwise) and
 * refused past it, reading no more than one byte beyond: `shardc check /dev/zero` stops at once.
 * Pipes and other streams are read to their end, so `shardc check <(generate)` works.
 *
 * Diagnostics find a line by its number (source_line): the starts of a source's lines are indexed
 * the first time one is asked for, in one pass over the text, so printing N diagnostics costs
 * O(size + N), not O(size x N). */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "outfile.h"

/* The default input limit, and the most $SHARDC_MAX_INPUT may raise it to: columns and lengths in
 * SrcLoc are ints. */
#define SOURCE_DEFAULT_MAX ((size_t)64 << 20)
#define SOURCE_HARD_MAX ((size_t)1 << 30)

typedef struct SourceNode {
  struct SourceNode *next;
  size_t *line_starts;  /* byte offset of each line's first byte; NULL until source_line needs it */
  int nlines;
  Source src;
} SourceNode;

static SourceNode *all_sources;
static size_t indexed_bytes; /* bytes scanned by source_line's indexing, over all sources */

static Source *source_new(const char *path, char *text, size_t len) {
  SourceNode *n = calloc(1, sizeof *n);
  char *p = strdup(path);
  if (!n || !p) abort();
  n->src = (Source){p, text, len};
  n->next = all_sources;
  all_sources = n;
  return &n->src;
}

size_t source_max_bytes(void) {
  const char *env = getenv("SHARDC_MAX_INPUT");
  if (!env || !*env) return SOURCE_DEFAULT_MAX;
  char *end;
  unsigned long long v = strtoull(env, &end, 10);
  if (*end != '\0' || v == 0) return SOURCE_DEFAULT_MAX;
  return v > SOURCE_HARD_MAX ? SOURCE_HARD_MAX : (size_t)v;
}

Source *source_load(const char *path) { return source_load_named(path, path); }

Source *source_load_named(const char *path, const char *name) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return NULL;
  struct stat st;
  if (fstat(fd, &st) != 0) goto fail;
  if (S_ISDIR(st.st_mode)) {
    errno = EISDIR;
    goto fail;
  }
  outfile_note_input(fd, name); /* an output may not replace it */
  /* Read until EOF rather than trusting st_size, so pipes and /proc files work too; but never
   * more than max + 1 bytes (the one past the limit tells a file of exactly max bytes from a
   * longer one). */
  size_t max = source_max_bytes();
  if (S_ISREG(st.st_mode) && (uintmax_t)st.st_size > (uintmax_t)max) {
    errno = EFBIG;
    goto fail;
  }
  size_t cap = S_ISREG(st.st_mode) && st.st_size > 0 ? (size_t)st.st_size + 2 : 4096, len = 0;
  char *buf = malloc(cap);
  if (!buf) abort();
  for (;;) {
    if (len > max) {
      free(buf);
      errno = EFBIG;
      goto fail;
    }
    if (len + 1 >= cap) {
      cap = cap > max / 2 ? max + 2 : cap * 2;
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
  return source_new(name, buf, len);

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

void source_each(void (*fn)(void *ctx, const char *name, const char *text, size_t len), void *ctx) {
  for (const SourceNode *n = all_sources; n; n = n->next) fn(ctx, n->src.path, n->src.text, n->src.len);
}

/* Every Source is the `src` of a SourceNode (source_new makes them all). */
static SourceNode *source_node(const Source *src) {
  return (SourceNode *)(void *)((char *)src - offsetof(SourceNode, src));
}

/* A line ends at "\n", "\r\n" or a lone "\r" (old Mac files), as the lexer counts lines. The
 * byte after the end of the line at p (whose terminator starts at p), or NULL at the end. */
static const char *next_line(const char *p, const char *end) {
  for (; p < end; p++) {
    if (*p == '\n') return p + 1;
    if (*p == '\r') return p + 1 < end && p[1] == '\n' ? p + 2 : p + 1;
  }
  return NULL;
}

bool source_line(const Source *src, int line, const char **start, size_t *len) {
  if (!src || line < 1) return false;
  SourceNode *n = source_node(src);
  if (!n->line_starts) {
    const char *p = src->text, *end = src->text + src->len;
    int count = 1;
    for (const char *q = p; (q = next_line(q, end)); ) count++;
    n->line_starts = malloc(sizeof(size_t) * (size_t)count);
    if (!n->line_starts) abort();
    n->line_starts[0] = 0;
    int k = 1;
    for (const char *q = p; (q = next_line(q, end)); ) n->line_starts[k++] = (size_t)(q - p);
    n->nlines = count;
    indexed_bytes += 2 * src->len; /* two passes */
  }
  if (line > n->nlines) return false;
  size_t s = n->line_starts[line - 1];
  size_t e = line < n->nlines ? n->line_starts[line] : src->len;
  if (line < n->nlines) { /* less the terminator: "\n", "\r\n" or "\r" */
    if (src->text[e - 1] == '\n') e--;
    if (e > s && src->text[e - 1] == '\r') e--;
  }
  *start = src->text + s;
  *len = e - s;
  return true;
}

size_t source_indexed_bytes(void) { return indexed_bytes; }

void source_free_all(void) {
  while (all_sources) {
    SourceNode *n = all_sources;
    all_sources = n->next;
    free((char *)n->src.path);
    free((char *)n->src.text);
    free(n->line_starts);
    free(n);
  }
}
