/* objcache.h: the on-disk cache of compiled objects (`shardc run`; docs/run.md, "Compile time").
 * Entries are named by a key (SHA-256 of what determines the object: the module's bitcode, the
 * CPU and its features, LLVM's version, the pipeline; or of what the compiler read, lower.h's
 * lower_input_key) and hold the object with its own SHA-256,
 * checked before use. The directory: $SHARDC_CACHE_DIR, else $XDG_CACHE_HOME/shardc, else
 * $HOME/.cache/shardc; made 0700 if missing, and used only if it is a real directory (not a
 * symlink) owned by the user and writable by no one else. Entries are opened without following
 * symlinks, must be regular files owned by the user, and are written to a temporary name and
 * renamed into place, so concurrent runs each see a whole entry or none.
 * Size bound: the entries' total is kept under $SHARDC_CACHE_MAX bytes (a number with an optional
 * K, M or G suffix, powers of 1024; default OBJCACHE_DEFAULT_MAX, 0: no bound). A hit sets its
 * entry's mtime to now, and after each store the least recently used entries (oldest mtime) are
 * removed until the rest fit: an LRU by mtime. Concurrent runs may trim at once: an entry removed
 * under a reader that has it open is still read whole (the reader holds its inode); one removed
 * before it is opened is a miss, and that run compiles. Temporary files older than an hour (a
 * writer that died) go too. */
#ifndef SHARDC_OBJCACHE_H
#define SHARDC_OBJCACHE_H

#include <stdbool.h>
#include <stddef.h>

#define OBJCACHE_DEFAULT_MAX (1024LL * 1024 * 1024) /* 1 GiB */

typedef struct ObjCache {
  int dirfd;           /* -1: no cache */
  char path[1024];     /* the directory */
  long long max_bytes; /* the entries' bound; 0: none */
} ObjCache;

/* Opens the cache directory. false with why in err (the caller says so and compiles without it),
 * also when $SHARDC_CACHE_MAX is not a size. */
bool objcache_open(ObjCache *c, char *err, size_t n);
void objcache_close(ObjCache *c);
/* The entry of key (64 hex digits): its bytes (malloc'd) into *data, *len. false when there is no
 * entry; *bad set (and the entry removed) when there was one that failed its checks, why in err. */
bool objcache_get(ObjCache *c, const char *key, void **data, size_t *len, bool *bad, char *err, size_t n);
/* Stores data as the entry of key. false with why in err. */
bool objcache_put(ObjCache *c, const char *key, const void *data, size_t len, char *err, size_t n);
/* Removes the least recently used entries (oldest mtime first; keep, a key or NULL, never) until
 * the entries' total is at most c->max_bytes; returns how many it removed. put calls it. */
int objcache_trim(ObjCache *c, const char *keep);

/* The running executable's GNU build ID (the linker's hash of its contents) into out: its length,
 * 0 when it has none (or it is longer than cap). What keys entries by the compiler's inputs rather
 * than by its output (lower_input_key) needs the compiler's own identity. */
size_t objcache_build_id(unsigned char *out, size_t cap);

#endif
