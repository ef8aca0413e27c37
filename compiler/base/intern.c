/* intern.c: the name table.
 *
 * intern(s, len) returns the one NUL-terminated copy of that byte string, so later stages compare
 * names by pointer (as Lua does with its strings). The table is open addressing with linear probing,
 * kept at most half full, and stores each entry's hash and length so a probe rarely touches the
 * string itself. The copies live in an arena owned by this file until intern_reset. */
#include <stdlib.h>
#include <string.h>

#include "common.h"

typedef struct InternSlot {
  const char *s;  /* NULL: empty slot */
  uint32_t hash;
  uint32_t len;
} InternSlot;

static struct {
  InternSlot *slots;
  uint32_t cap;   /* power of two, or 0 before the first name */
  uint32_t count;
  Arena strings;
} names;

/* A fast hash over 8-byte words (multiply and fold); names are short, so the loop runs once or
 * twice. Quality matters only enough to spread identifiers over the table. */
static uint32_t intern_hash(const char *s, size_t len) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)len;
  while (len >= 8) {
    uint64_t w;
    memcpy(&w, s, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
    s += 8;
    len -= 8;
  }
  if (len) {
    uint64_t w = 0;
    memcpy(&w, s, len);
    h = (h ^ w) * 0x94D049BB133111EBull;
  }
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return (uint32_t)h;
}

static void intern_grow(void) {
  uint32_t ncap = names.cap ? names.cap * 2 : 1024;
  InternSlot *ns = calloc(ncap, sizeof(InternSlot));
  if (!ns) abort();
  for (uint32_t i = 0; i < names.cap; i++) {
    InternSlot e = names.slots[i];
    if (!e.s) continue;
    uint32_t j = e.hash & (ncap - 1);
    while (ns[j].s) j = (j + 1) & (ncap - 1);
    ns[j] = e;
  }
  free(names.slots);
  names.slots = ns;
  names.cap = ncap;
}

Name intern(const char *s, size_t len) {
  if (len > UINT32_MAX) len = UINT32_MAX; /* the lexer caps names far below this */
  if ((names.count + 1) * 2 > names.cap) intern_grow();
  uint32_t h = intern_hash(s, len);
  uint32_t i = h & (names.cap - 1);
  for (;;) {
    InternSlot *e = &names.slots[i];
    if (!e->s) break;
    if (e->hash == h && e->len == len && memcmp(e->s, s, len) == 0) return e->s;
    i = (i + 1) & (names.cap - 1);
  }
  const char *copy = arena_strndup(&names.strings, s, len);
  names.slots[i] = (InternSlot){copy, h, (uint32_t)len};
  names.count++;
  return copy;
}

Name intern_cstr(const char *s) { return intern(s, strlen(s)); }

void intern_reset(void) {
  free(names.slots);
  names.slots = NULL;
  names.cap = names.count = 0;
  arena_free(&names.strings);
}
