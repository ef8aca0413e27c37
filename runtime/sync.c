/* sync.c: waiting without stealing the cores. Device threads often outnumber the cores (8
 * devices on 2 here), and other processes share them, so a waiter that spins keeps the thread it
 * waits for off the core. Every wait in the runtime goes through rtsync_wait, in two steps:
 *   1. spin on the condition (a pause between reads), only when every device has a core of its
 *      own. How long is learnt per device, as glibc's adaptive mutexes do: a wait that ends
 *      while spinning doubles the budget (up to SPIN_MAX_S), one that has to sleep halves it
 *      (down to SPIN_MIN_S). Barrier-heavy code keeps its threads hot (a 2-thread barrier then
 *      costs well under a microsecond instead of a futex wake-up's several), while waits for a
 *      slower peer's long computation soon stop burning a core;
 *   2. sleep on a bell: a 32-bit word that wakers bump, a futex on Linux (a condition variable
 *      elsewhere). The members of a group sleep on the group's bell, so the arrival that
 *      completes a barrier wakes them all with one system call (one call per sleeper made
 *      8 threads on 2 cores twice as slow: each woken thread preempted the waker). A device
 *      waiting for a message sleeps on its own bell. Each device publishes the bell it sleeps
 *      on, so that a stop, or a peer returning, can ring it.
 * No sched_yield in between: with other processes runnable it gives the core away for a whole
 * time slice (measured: it made a 2-thread barrier 30x slower on a loaded machine).
 * The condition itself is always an atomic the waiter reads: a bell only says "look again".
 * Wakers change the condition, then bump the bell, then look whether anyone sleeps on it; a
 * sleeper publishes its bell, reads it, tests the condition, then sleeps while the bell still
 * reads the same. Either the sleeper sees the new condition or its futex sees the new bell (all
 * seq_cst), so no wake is lost; a spurious one costs a look.
 *
 * A wait that may be abandoned (a barrier's arrival, a recv) ends with RT_E_STOPPED once the
 * run stops and RT_E_TIMEOUT after RtConfig.timeout_s, so nothing hangs. Figures for these
 * machines (toolchain.md): a pthread barrier about 4 us with 2 threads and 20-40 us with 4 on 2
 * cores, a spinning one 0.2 us; a pause instruction about 50 ns. */
#define _GNU_SOURCE /* syscall(), sysconf(_SC_NPROCESSORS_ONLN) */
#include <limits.h>
#include <time.h>
#include <unistd.h>

#include "rt_internal.h"

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#define RT_HAVE_FUTEX 1
#else
#include <pthread.h>
#define RT_HAVE_FUTEX 0
/* One condition variable for the process stands in for the futexes. */
static pthread_mutex_t sleep_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sleep_cond = PTHREAD_COND_INITIALIZER;
#endif

/* Longest single sleep: a bound on how late a hopeless condition (a peer that returned) is
 * noticed should a wake ever be lost. */
#define SLEEP_SLICE_S 0.05
/* The range of a device's spin budget, in seconds (a futex wake-up costs about 5 us here). */
#define SPIN_MIN_S 1e-6
#define SPIN_MAX_S 100e-6

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

void rtsync_policy(Runtime *rt) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  rt->spin_s = rt->ndev <= cores ? SPIN_MAX_S : 0;
  for (int i = 0; i < rt->ndev; i++) rt->devices[i].spin_s = rt->spin_s;
}

/* Sleeps while *bell == seen, at most `seconds`. */
static void sleep_on(_Atomic uint32_t *bell, uint32_t seen, double seconds) {
  if (seconds <= 0) return;
  if (seconds > SLEEP_SLICE_S) seconds = SLEEP_SLICE_S;
  struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
#if RT_HAVE_FUTEX
  syscall(SYS_futex, (uint32_t *)bell, FUTEX_WAIT_PRIVATE, seen, &ts, NULL, 0);
#else
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += ts.tv_sec;
  until.tv_nsec += ts.tv_nsec;
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&sleep_lock);
  if (atomic_load(bell) == seen) pthread_cond_timedwait(&sleep_cond, &sleep_lock, &until);
  pthread_mutex_unlock(&sleep_lock);
#endif
}

static void wake_sleepers(_Atomic uint32_t *bell) {
#if RT_HAVE_FUTEX
  syscall(SYS_futex, (uint32_t *)bell, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
  (void)bell;
  pthread_mutex_lock(&sleep_lock);
  pthread_cond_broadcast(&sleep_cond);
  pthread_mutex_unlock(&sleep_lock);
#endif
}

void rtsync_ring(_Atomic uint32_t *bell, _Atomic uint32_t *sleepers) {
  atomic_fetch_add(bell, 1);
  if (atomic_load(sleepers)) wake_sleepers(bell);
}

/* Rings whatever dev sleeps on. A device not asleep yet has not tested its condition yet
 * either, and the caller changed the condition first. */
void rtsync_wake(RtDevice *dev) {
  _Atomic uint32_t *bell = atomic_load(&dev->sleep_bell);
  if (!bell) return;
  atomic_fetch_add(bell, 1);
  wake_sleepers(bell);
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

static int sleep_until_ready(RtDevice *dev, const RtWait *w) {
  Runtime *rt = dev->rt;
  _Atomic uint32_t *bell = w->bell ? w->bell : &dev->bell;
  _Atomic uint32_t *sleepers = w->bell ? w->sleepers : &dev->sleepers;
  double deadline = rt_seconds() + rt->timeout_s;
  atomic_store(&dev->sleep_bell, bell);
  int rc = RT_OK;
  for (;;) {
    uint32_t seen = atomic_load(bell);
    if (w->ready(w->ctx)) break;
    double now = rt_seconds();
    if (w->abandon && (rc = give_up(dev, w, deadline, now))) break;
    /* A wait that cannot be abandoned waits for peers already inside the collective: they do
     * bounded work and arrive, so it has no deadline. */
    atomic_fetch_add(sleepers, 1);
    sleep_on(bell, seen, w->abandon ? deadline - now : SLEEP_SLICE_S);
    atomic_fetch_sub(sleepers, 1);
  }
  atomic_store(&dev->sleep_bell, NULL);
  return rc;
}

int rtsync_wait(RtDevice *dev, const RtWait *w) {
  Runtime *rt = dev->rt;
  if (w->ready(w->ctx)) return RT_OK;
  if (rt->spin_s > 0) {
    double until = rt_seconds() + dev->spin_s;
    do {
      for (int i = 0; i < 16; i++) {
        cpu_relax();
        if (w->ready(w->ctx)) {
          dev->spin_s = dev->spin_s * 2 < rt->spin_s ? dev->spin_s * 2 : rt->spin_s;
          return RT_OK;
        }
      }
      if (w->abandon && rtrun_stopped(rt)) return RT_E_STOPPED;
    } while (rt_seconds() < until);
    dev->spin_s = dev->spin_s / 2 > SPIN_MIN_S ? dev->spin_s / 2 : SPIN_MIN_S;
  }
  return sleep_until_ready(dev, w);
}
