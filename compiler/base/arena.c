/* arena.c: bump allocation for the compiler's trees and tables.
 *
 * An Arena is a list of blocks; arena_alloc hands out 16-byte aligned, zeroed slices of the newest
 * block and starts a new block when it runs out. Nothing is freed on its own: arena_free drops every
 * block at once. Blocks come from calloc, and a slice is never handed out twice, so memory is zero
 * without a memset per allocation. A failed allocation names the activity (mem_activity) and exits 1.
 * The mem_ allocators (common.h) live here too: malloc's, with a message naming what they build. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

struct ArenaBlock {
  ArenaBlock *next; /* older block */
  size_t used, cap; /* bytes of data[] handed out / available */
  _Alignas(16) unsigned char data[];
};

enum { ARENA_MIN_BLOCK = 64 * 1024, ARENA_MAX_BLOCK = 4 * 1024 * 1024 };

void arena_init(Arena *a) {
  a->head = NULL;
  a->bytes = 0;
}

/* ---- out of memory (common.h) ---- */

static const char *activity = "compiling";

const char *mem_activity(const char *what) {
  const char *prev = activity;
  activity = what ? what : "compiling";
  return prev;
}

_Noreturn void mem_oom(const char *what, size_t bytes) {
  fflush(stdout);
  fprintf(stderr, "shardc: out of memory while %s%s%s (allocating %zu bytes)\n", activity, what ? ": building " : "",
          what ? what : "", bytes);
  exit(1);
}

void *mem_alloc(size_t n, const char *what) {
  void *p = malloc(n ? n : 1);
  if (!p) mem_oom(what, n);
  return p;
}

void *mem_calloc(size_t n, size_t size, const char *what) {
  if (size && n > SIZE_MAX / size) mem_oom(what, SIZE_MAX);
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) mem_oom(what, n * size);
  return p;
}

void *mem_realloc(void *p, size_t n, const char *what) {
  void *q = realloc(p, n ? n : 1);
  if (!q) mem_oom(what, n);
  return q;
}

/* ---- arenas ---- */

static void arena_oom(size_t size) { mem_oom(NULL, size); }

/* Blocks grow with the arena (double the last one, up to 4 MB) so a big program needs few blocks
 * and a small one wastes little; a request bigger than that gets a block of its own size. */
static ArenaBlock *arena_grow(Arena *a, size_t size) {
  size_t cap = a->head ? a->head->cap * 2 : ARENA_MIN_BLOCK;
  if (cap > ARENA_MAX_BLOCK) cap = ARENA_MAX_BLOCK;
  if (cap < size) cap = size;
  if (cap > SIZE_MAX - sizeof(ArenaBlock)) arena_oom(size);
  ArenaBlock *b = calloc(1, sizeof(ArenaBlock) + cap);
  if (!b) arena_oom(size);
  b->cap = cap;
  b->next = a->head;
  a->head = b;
  return b;
}

void *arena_alloc(Arena *a, size_t size) {
  if (size == 0) size = 1;
  if (size > SIZE_MAX - 15) arena_oom(size);
  size = (size + 15) & ~(size_t)15;
  ArenaBlock *b = a->head;
  if (!b || b->cap - b->used < size) b = arena_grow(a, size);
  void *p = b->data + b->used;
  b->used += size;
  a->bytes += size;
  return p;
}

char *arena_strndup(Arena *a, const char *s, size_t n) {
  char *q = arena_alloc(a, n + 1);
  memcpy(q, s, n);
  q[n] = '\0';
  return q;
}

char *arena_printf(Arena *a, const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  char *s = arena_alloc(a, (size_t)n + 1);
  vsnprintf(s, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  return s;
}

void arena_free(Arena *a) {
  ArenaBlock *b = a->head;
  while (b) {
    ArenaBlock *next = b->next;
    free(b);
    b = next;
  }
  a->head = NULL;
  a->bytes = 0;
}
