/* alloc.c: the one allocator of per-device buffers (Lua's and Wren's single allocator, here
 * per device). Every buffer carries a header: its size, its name, its owner, and links in the
 * owner's list of live buffers. So each device's bytes are counted (current and peak), capped at
 * RtConfig.mem_cap (the target's HBM, or a test's figure), failures can be injected (the Nth
 * allocation), a bad free is caught, and what a run leaves allocated is freed by rt_close.
 *
 * Going over the cap is a failure of the device, like rt_fail: it stops the run, and the
 * message names the device, the buffer and the sizes.
 *
 * A freed buffer of RT_SPARE_MIN bytes or more is kept (up to RT_SPARE_SLOTS of them, and no
 * more bytes than the device's peak) and handed to the next allocation of the same rounded size,
 * as accelerator runtimes cache device memory: a step that allocates its large buffers afresh
 * would otherwise pay the system's page faults and zeroing for every one of them, every step. A
 * kept buffer counts as free (the device's `current` and `peak` are what the program holds);
 * rt_close returns them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

#define BUF_MAGIC 0x5348524442554631ull /* "SHRDBUF1" */
#define BUF_ALIGN 64                    /* a cache line; AVX-512 loads */

typedef struct RtBufHeader {
  uint64_t magic;                   /* BUF_MAGIC while live, 0 once freed */
  size_t bytes;                     /* as asked */
  struct RtBufHeader *prev, *next;  /* the owner's live buffers */
  int owner;                        /* device index */
  char name[88];
} RtBufHeader;

/* The header keeps the data after it aligned. */
_Static_assert(sizeof(RtBufHeader) % BUF_ALIGN == 0, "buffer header breaks the alignment");

void rtmem_init(RtAccount *a) {
  memset(a, 0, sizeof *a);
  pthread_mutex_init(&a->lock, NULL);
}

/* "12582912 bytes (12.0 MiB)" */
static const char *bytes_text(size_t b, char *buf, size_t n) {
  static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)b;
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, u++;
  if (u == 0) snprintf(buf, n, "%zu bytes", b);
  else snprintf(buf, n, "%zu bytes (%.1f %s)", b, v, units[u]);
  return buf;
}

/* The bytes after a header: what was asked, rounded up to the alignment. */
static size_t body_of(const RtBufHeader *h) { return (h->bytes + BUF_ALIGN - 1) / BUF_ALIGN * BUF_ALIGN; }

/* Keeps a freed buffer for reuse where there is a slot and it stays within the peak (a's lock
 * held); false: free it. */
static bool keep_spare(RtAccount *a, RtBufHeader *h) {
  size_t body = body_of(h);
  if (body < RT_SPARE_MIN || a->spare_bytes + body > a->peak) return false;
  for (int i = 0; i < RT_SPARE_SLOTS; i++)
    if (!a->spare[i]) {
      a->spare[i] = h;
      a->spare_bytes += body;
      return true;
    }
  return false;
}

int rt_alloc(RtDevice *dev, size_t bytes, const char *name, void **out) {
  if (!dev || !out) return RT_E_ARG;
  *out = NULL;
  Runtime *rt = dev->rt;
  RtAccount *a = &dev->mem;
  if (!name) name = "(unnamed)";
  char need[48], used[48], cap[48];
  if (!rtrun_local(rt, dev->index)) /* mpi: another process's device */
    return rtrun_fail(dev, RT_E_ARG, "cannot allocate buffer '%s': this device runs in another process (rank %d)", name,
                      dev->index / rt->threads_per_rank);

  pthread_mutex_lock(&a->lock);
  uint64_t nth = ++a->allocs;
  size_t current = a->current;
  pthread_mutex_unlock(&a->lock);

  if (rt->fail_alloc_nth > 0 && nth == (uint64_t)rt->fail_alloc_nth &&
      (rt->fail_alloc_device < 0 || rt->fail_alloc_device == dev->index))
    return rtrun_fail(dev, RT_E_NOMEM, "cannot allocate buffer '%s' of %s: injected failure of allocation #%llu",
                      name, bytes_text(bytes, need, sizeof need), (unsigned long long)nth);
  /* The cap is checked against what this device holds; only this thread allocates on its
   * account (a receiver only frees), so `current` can only have shrunk since. */
  if (rt->mem_cap && (bytes > rt->mem_cap || current > rt->mem_cap - bytes))
    return rtrun_fail(dev, RT_E_NOMEM,
                      "out of memory for buffer '%s': it needs %s with %s in use, over the cap of %s per device", name, bytes_text(bytes, need, sizeof need), bytes_text(current, used, sizeof used),
                      bytes_text(rt->mem_cap, cap, sizeof cap));

  size_t body = (bytes + BUF_ALIGN - 1) / BUF_ALIGN * BUF_ALIGN;
  RtBufHeader *h = NULL;
  if (body >= RT_SPARE_MIN && body >= bytes) {
    pthread_mutex_lock(&a->lock);
    for (int i = 0; i < RT_SPARE_SLOTS && !h; i++)
      if (a->spare[i] && body_of(a->spare[i]) == body) {
        h = a->spare[i];
        a->spare[i] = NULL;
        a->spare_bytes -= body;
      }
    pthread_mutex_unlock(&a->lock);
  }
  if (!h) h = body >= bytes && body <= SIZE_MAX - sizeof *h ? aligned_alloc(BUF_ALIGN, sizeof *h + body) : NULL;
  if (!h)
    return rtrun_fail(dev, RT_E_NOMEM, "out of memory for buffer '%s': the system refused %s",
                      name, bytes_text(bytes, need, sizeof need));
  h->magic = BUF_MAGIC;
  h->bytes = bytes;
  h->owner = dev->index;
  snprintf(h->name, sizeof h->name, "%s", name);
  h->prev = NULL;

  pthread_mutex_lock(&a->lock);
  h->next = a->live;
  if (a->live) a->live->prev = h;
  a->live = h;
  a->current += bytes;
  if (a->current > a->peak) a->peak = a->current;
  pthread_mutex_unlock(&a->lock);
  *out = h + 1;
  return RT_OK;
}

static void unlink_buffer(RtAccount *a, RtBufHeader *h) {
  if (h->prev) h->prev->next = h->next;
  else a->live = h->next;
  if (h->next) h->next->prev = h->prev;
  a->current -= h->bytes;
  h->magic = 0;
}

/* The header, not `dev`, says whose account the buffer is on: a device may free what another
 * sent it. */
int rt_free(RtDevice *dev, void *p) {
  if (!p) return RT_OK;
  if (!dev) return RT_E_ARG;
  RtBufHeader *h = (RtBufHeader *)p - 1;
  Runtime *rt = dev->rt;
  if (h->magic != BUF_MAGIC || h->owner < 0 || h->owner >= rt->ndev)
    return rtrun_fail(dev, RT_E_ARG, "rt_free(%p): not a live buffer (freed twice, or not from rt_alloc)", p);
  RtAccount *a = &rt->devices[h->owner].mem;
  pthread_mutex_lock(&a->lock);
  unlink_buffer(a, h);
  bool kept = keep_spare(a, h);
  pthread_mutex_unlock(&a->lock);
  if (!kept) free(h);
  return RT_OK;
}

void rtmem_release_all(RtDevice *dev) {
  RtAccount *a = &dev->mem;
  pthread_mutex_lock(&a->lock);
  while (a->live) {
    RtBufHeader *h = a->live;
    unlink_buffer(a, h);
    free(h);
  }
  for (int i = 0; i < RT_SPARE_SLOTS; i++) free(a->spare[i]), a->spare[i] = NULL;
  a->spare_bytes = 0;
  pthread_mutex_unlock(&a->lock);
}
