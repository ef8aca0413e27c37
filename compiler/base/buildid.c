/* buildid.c: the running executable's GNU build ID (objcache.h, objcache_build_id). */
#define _GNU_SOURCE /* dl_iterate_phdr */
#include <link.h>
#include <stddef.h>
#include <string.h>

#include "objcache.h"

typedef struct BuildId {
  unsigned char *out;
  size_t cap, len;
} BuildId;

/* The first object dl_iterate_phdr reports is the executable: its PT_NOTE segments searched for
 * the note named "GNU" of type NT_GNU_BUILD_ID (3). Notes are 4-byte aligned in executables. */
static int find_build_id(struct dl_phdr_info *info, size_t size, void *ctx) {
  (void)size;
  BuildId *b = ctx;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_NOTE) continue;
    const unsigned char *p = (const unsigned char *)(info->dlpi_addr + ph->p_vaddr), *end = p + ph->p_memsz;
    while (end - p >= (ptrdiff_t)sizeof(ElfW(Nhdr))) {
      const ElfW(Nhdr) *nh = (const ElfW(Nhdr) *)(const void *)p;
      size_t name = (nh->n_namesz + 3u) & ~3u, desc = (nh->n_descsz + 3u) & ~3u;
      const unsigned char *nm = p + sizeof *nh, *d = nm + name;
      if ((size_t)(end - nm) < name || (size_t)(end - d) < desc) break;
      if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && memcmp(nm, "GNU", 4) == 0 && nh->n_descsz > 0 &&
          nh->n_descsz <= b->cap) {
        memcpy(b->out, d, nh->n_descsz);
        b->len = nh->n_descsz;
        return 1;
      }
      p = d + desc;
    }
  }
  return 1; /* the executable only */
}

size_t objcache_build_id(unsigned char *out, size_t cap) {
  BuildId b = {out, cap, 0};
  dl_iterate_phdr(find_build_id, &b);
  return b.len;
}
