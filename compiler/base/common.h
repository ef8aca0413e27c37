/* common.h: the small pieces every stage of shardc shares.
 *
 * Arenas (the compiler allocates from them and frees them whole), interned names (compared by
 * pointer), source files and locations. Nothing here knows about the language. */
#ifndef SHARDC_COMMON_H
#define SHARDC_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- arenas ---- */
typedef struct ArenaBlock ArenaBlock;
typedef struct Arena {
  ArenaBlock *head;  /* newest block first */
  size_t bytes;      /* total bytes handed out, for statistics */
} Arena;

void arena_init(Arena *a);
void *arena_alloc(Arena *a, size_t size);          /* zeroed, 16-byte aligned; mem_oom on failure */
char *arena_strndup(Arena *a, const char *s, size_t n);
char *arena_printf(Arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void arena_free(Arena *a);
#define ARENA_NEW(a, T) ((T *)arena_alloc((a), sizeof(T)))
#define ARENA_ARRAY(a, T, n) ((T *)arena_alloc((a), sizeof(T) * (size_t)(n)))

/* ---- out of memory ----
 * An allocation that fails prints what shardc was building and exits 1 (never a bare abort):
 *   shardc: out of memory while simulating the step: building the timeline's tasks (allocating 48 bytes)
 * mem_activity names the stage a command is in (the arenas' failures name it); the mem_ allocators
 * name the structure. mem_activity returns the previous activity, for the caller to restore. */
const char *mem_activity(const char *what);
_Noreturn void mem_oom(const char *what, size_t bytes);
void *mem_alloc(size_t n, const char *what);                /* malloc; n == 0 allocates 1 byte */
void *mem_calloc(size_t n, size_t size, const char *what);  /* zeroed; n * size checked */
void *mem_realloc(void *p, size_t n, const char *what);

/* Growable array whose storage comes from an arena (old storage is simply abandoned). */
#define VEC(T) struct { T *data; int len, cap; }
#define VEC_PUSH(arena, v, x)                                                           \
  do {                                                                                  \
    if ((v).len == (v).cap) {                                                           \
      int ncap_ = (v).cap ? (v).cap * 2 : 8;                                            \
      void *nd_ = arena_alloc((arena), sizeof(*(v).data) * (size_t)ncap_);              \
      if ((v).len) memcpy(nd_, (v).data, sizeof(*(v).data) * (size_t)(v).len);          \
      (v).data = nd_;                                                                   \
      (v).cap = ncap_;                                                                  \
    }                                                                                   \
    (v).data[(v).len++] = (x);                                                          \
  } while (0)

/* ---- interned names ----
 * A Name is a NUL-terminated string owned by the interner; equal names are the same pointer. */
typedef const char *Name;
Name intern(const char *s, size_t len);
Name intern_cstr(const char *s);
void intern_reset(void); /* frees every name; only between whole compilations (tests, fuzzer) */

/* ---- sources and locations ---- */
typedef struct Source {
  const char *path;  /* as given on the command line or resolved by import */
  const char *text;  /* whole file, NUL-terminated (a NUL inside is diagnosed by the lexer) */
  size_t len;        /* bytes, not counting the terminating NUL */
} Source;

typedef struct SrcLoc {
  const Source *file; /* NULL for compiler-made things with no place in the source */
  int line, col;      /* 1-based; col counts bytes */
  int len;            /* bytes the culprit spans on its line (at least 1 when file is set) */
} SrcLoc;

static inline SrcLoc srcloc_span(SrcLoc a, SrcLoc b) {
  /* From the start of a to the end of b when both are on one line; else just a. */
  if (a.file == b.file && a.line == b.line && b.col + b.len >= a.col) a.len = b.col + b.len - a.col;
  return a;
}

/* NULL if unreadable (errno set; EFBIG: larger than source_max_bytes()). */
Source *source_load(const char *path);
/* The same, the Source named `name` (the path as diagnostics show it) rather than `path`. */
Source *source_load_named(const char *path, const char *name);
Source *source_from_memory(const char *path, const char *text, size_t len);
void source_free_all(void);
/* Calls fn on every source loaded so far (its name, text and length), the latest first. */
void source_each(void (*fn)(void *ctx, const char *name, const char *text, size_t len), void *ctx);
/* The most bytes an input may have: 64 MiB, or $SHARDC_MAX_INPUT (bytes, at most 1 GiB). */
size_t source_max_bytes(void);
/* Line `line` (1-based) of src: its first byte and its length without the newline. False when
 * src has fewer lines. The first call for a source indexes its lines (one pass); later calls are
 * O(1). */
bool source_line(const Source *src, int line, const char **start, size_t *len);
/* Bytes scanned so far to index lines, over every source (tests: linear, whatever the number of
 * diagnostics). */
size_t source_indexed_bytes(void);

#endif
