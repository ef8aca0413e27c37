/* sync.c: waiting without stealing the cores. Device threads often outnumber the cores (8
 * devices on 2 here), so a waiter that spins keeps the thread it waits for off the core. Every
 * wait in the runtime goes through rtsync_wait, in three steps:
 *   1. spin on the condition (a pause between reads): cheapest when each device has a core;
 *   2. sched_yield: lets a runnable peer on this core reach the barrier;
 *   3. sleep on the device's own wake word (a futex on Linux, a condition variable elsewhere),
 *      until a waker bumps it: whoever completes a barrier, sends a message, stops the run or
 *      returns from its entry function wakes the devices that may be waiting on it.
 * The condition itself is always an atomic the waiter reads: the wake word only says "look
 * again", so a missed or spurious wake costs time, never correctness.
 *
 * A wait that may be abandoned (a barrier's arrival, a recv) ends with RT_E_STOPPED once the
 * run stops and RT_E_TIMEOUT after RtConfig.timeout_s, so nothing hangs. Toolchain figures for
 * these machines: a pthread barrier about 4 us with 2 threads and 20-40 us with 4 on 2 cores, a
 * spinning one 0.2 us. */
#define _GNU_SOURCE /* syscall(), sysconf(_SC_NPROCESSORS_ONLN) */
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "rt_internal.h"

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#define RT_HAVE_FUTEX 1
#else
#define RT_HAVE_FUTEX 0
#endif

/* Longest single sleep: a bound on how late a hopeless condition (a peer that returned) is
 * noticed should a wake ever be lost. */
#define SLEEP_SLICE_S 0.05

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

void rtsync_policy(Runtime *rt) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores < 1) cores = 1;
  if (rt->ndev <= cores) {
    rt->spin = 4000; /* about 20-40 us of pause: a peer on its own core arrives within that */
    rt->yields = 20;
  } else {
    rt->spin = 64;   /* the peer most likely needs this core: give it up early */
    rt->yields = 8;
  }
}

#if !RT_HAVE_FUTEX
#include <pthread.h>
/* One condition variable for the process stands in for the futexes: wakes are rare enough. */
static pthread_mutex_t sleep_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sleep_cond = PTHREAD_COND_INITIALIZER;
#endif

/* Sleeps until dev->wake differs from `seen`, or `seconds` pass. */
static void sleep_on(RtDevice *dev, uint32_t seen, double seconds) {
  if (seconds <= 0) return;
  if (seconds > SLEEP_SLICE_S) seconds = SLEEP_SLICE_S;
  struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  atomic_store(&dev->sleeping, 1);
#if RT_HAVE_FUTEX
  syscall(SYS_futex, (uint32_t *)&dev->wake, FUTEX_WAIT_PRIVATE, seen, &ts, NULL, 0);
#else
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += ts.tv_sec;
  until.tv_nsec += ts.tv_nsec;
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&sleep_lock);
  if (atomic_load(&dev->wake) == seen) pthread_cond_timedwait(&sleep_cond, &sleep_lock, &until);
  pthread_mutex_unlock(&sleep_lock);
#endif
  atomic_store(&dev->sleeping, 0);
}

/* The waker changes the condition first, then bumps the word, then looks whether to make the
 * system call; the sleeper reads the word before testing the condition. Either the sleeper sees
 * the new condition, or its futex sees the new word and does not sleep (all seq_cst). */
void rtsync_wake(RtDevice *dev) {
  atomic_fetch_add(&dev->wake, 1);
  if (atomic_load(&dev->sleeping)) {
#if RT_HAVE_FUTEX
    syscall(SYS_futex, (uint32_t *)&dev->wake, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
    pthread_mutex_lock(&sleep_lock);
    pthread_cond_broadcast(&sleep_cond);
    pthread_mutex_unlock(&sleep_lock);
#endif
  }
}

void rtsync_wake_all(Runtime *rt) {
  for (int i = 0; i < rt->ndev; i++) rtsync_wake(&rt->devices[i]);
}

/* Why the wait ended, when it did not end ready: the run stopped, a peer cannot come, or the
 * timeout. Only asked of waits that may be abandoned. */
static int give_up(RtDevice *dev, const RtWait *w, double deadline, double now) {
  if (rtrun_stopped(dev->rt)) return RT_E_STOPPED;
  if (w->hopeless) {
    int rc = w->hopeless(w->ctx);
    if (rc) return rc;
  }
  return now >= deadline ? RT_E_TIMEOUT : RT_OK;
}

int rtsync_wait(RtDevice *dev, const RtWait *w) {
  Runtime *rt = dev->rt;
  for (int i = 0; i < rt->spin; i++) {
    if (w->ready(w->ctx)) return RT_OK;
    if (w->abandon && (i & 63) == 63 && rtrun_stopped(rt)) return RT_E_STOPPED;
    cpu_relax();
  }
  double deadline = rt_seconds() + rt->timeout_s;
  for (int i = 0; i < rt->yields; i++) {
    if (w->ready(w->ctx)) return RT_OK;
    if (w->abandon) {
      int rc = give_up(dev, w, deadline, rt_seconds());
      if (rc) return rc;
    }
    sched_yield();
  }
  for (;;) {
    uint32_t seen = atomic_load(&dev->wake);
    if (w->ready(w->ctx)) return RT_OK;
    double now = rt_seconds();
    if (w->abandon) {
      int rc = give_up(dev, w, deadline, now);
      if (rc) return rc;
    }
    /* A wait that cannot be abandoned waits for peers already inside the collective: they do
     * bounded work and arrive, so it has no deadline. */
    sleep_on(dev, seen, w->abandon ? deadline - now : SLEEP_SLICE_S);
  }
}
