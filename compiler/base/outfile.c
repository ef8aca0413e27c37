/* outfile.c: outfile.h's functions: inputs noted by identity, outputs written beside their place
 * and renamed over it, sets renamed together under a directory lock, and the cleanup a signal
 * runs (the signal handler below is the only code here that may run on another thread; it and the
 * main thread share the cleanup registry under a spin lock taken with the signals held back). */
#define _DEFAULT_SOURCE /* flock */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "outfile.h"

extern char **environ;

/* ---- inputs ---- */

typedef struct InputId {
  dev_t dev;
  ino_t ino;
  char *path;
} InputId;

static InputId *inputs;
static int ninputs, cap_inputs;

void outfile_note_input(int fd, const char *path) {
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
  for (int i = 0; i < ninputs; i++)
    if (inputs[i].dev == st.st_dev && inputs[i].ino == st.st_ino) return;
  if (ninputs == cap_inputs) {
    int cap = cap_inputs ? 2 * cap_inputs : 16;
    InputId *n = realloc(inputs, sizeof *n * (size_t)cap);
    if (!n) return; /* out of memory: the check is lost, the run goes on */
    inputs = n, cap_inputs = cap;
  }
  char *p = strdup(path);
  if (!p) return;
  inputs[ninputs++] = (InputId){st.st_dev, st.st_ino, p};
}

const char *outfile_input_at(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) return NULL;
  for (int i = 0; i < ninputs; i++)
    if (inputs[i].dev == st.st_dev && inputs[i].ino == st.st_ino) return inputs[i].path;
  return NULL;
}

bool outfile_check(const char *path, char *err, size_t n) {
  const char *in = outfile_input_at(path);
  if (in) {
    if (strcmp(in, path) == 0) snprintf(err, n, "'%s' is an input of this command: refusing to overwrite it", path);
    else snprintf(err, n, "'%s' is the input '%s' (the same file): refusing to overwrite it", path, in);
    return false;
  }
  struct stat st;
  size_t len = strlen(path);
  if (len == 0 || path[len - 1] == '/' || (stat(path, &st) == 0 && S_ISDIR(st.st_mode))) {
    snprintf(err, n, "'%s' is a directory", path);
    return false;
  }
  return true;
}

/* ---- cleanup on signals ---- */

typedef struct Tracked {
  char *path;
  bool is_dir;
} Tracked;

static Tracked *tracked;
static int ntracked, cap_tracked;
static pid_t child; /* a running child, leader of its own process group; 0: none */
static atomic_flag registry_lock = ATOMIC_FLAG_INIT;
static const int caught[] = {SIGINT, SIGTERM, SIGHUP};
static bool installed;

static void on_signal(int sig) {
  while (atomic_flag_test_and_set_explicit(&registry_lock, memory_order_acquire)) {
  } /* another thread holds it for a few instructions; the process ends with it held */
  if (child > 0) {
    kill(-child, SIGKILL);
    while (waitpid(child, NULL, 0) < 0 && errno == EINTR) {
    }
  }
  for (int i = ntracked - 1; i >= 0; i--)
    if (!tracked[i].is_dir) unlink(tracked[i].path);
  for (int i = ntracked - 1; i >= 0; i--)
    if (tracked[i].is_dir) rmdir(tracked[i].path);
  struct sigaction dfl = {0};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, NULL);
  raise(sig); /* delivered when the handler returns: the process ends by this signal */
}

/* Catches the signals whose default ends the process (one left ignored, as by nohup, stays so). */
static void install(void) {
  if (installed) return;
  installed = true;
  for (size_t k = 0; k < sizeof caught / sizeof caught[0]; k++) {
    struct sigaction cur;
    if (sigaction(caught[k], NULL, &cur) != 0 || cur.sa_handler != SIG_DFL || (cur.sa_flags & SA_SIGINFO)) continue;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (size_t j = 0; j < sizeof caught / sizeof caught[0]; j++) sigaddset(&sa.sa_mask, caught[j]);
    sigaction(caught[k], &sa, NULL);
  }
}

/* The registry is changed with the signals held back on this thread and the lock held. */
static void hold(sigset_t *old) {
  sigset_t s;
  sigemptyset(&s);
  for (size_t k = 0; k < sizeof caught / sizeof caught[0]; k++) sigaddset(&s, caught[k]);
  pthread_sigmask(SIG_BLOCK, &s, old);
  while (atomic_flag_test_and_set_explicit(&registry_lock, memory_order_acquire)) {
  }
}

static void release(const sigset_t *old) {
  atomic_flag_clear_explicit(&registry_lock, memory_order_release);
  pthread_sigmask(SIG_SETMASK, old, NULL);
}

void outfile_track(const char *path, bool is_dir) {
  install();
  char *p = strdup(path);
  sigset_t old;
  hold(&old);
  if (p && ntracked == cap_tracked) {
    int cap = cap_tracked ? 2 * cap_tracked : 16;
    Tracked *n = realloc(tracked, sizeof *n * (size_t)cap);
    if (n) tracked = n, cap_tracked = cap;
  }
  if (p && ntracked < cap_tracked) tracked[ntracked++] = (Tracked){p, is_dir}, p = NULL;
  release(&old);
  free(p); /* not registered (out of memory): only a signal's cleanup misses it */
}

void outfile_untrack(const char *path) {
  char *gone = NULL;
  sigset_t old;
  hold(&old);
  for (int i = ntracked - 1; i >= 0; i--)
    if (strcmp(tracked[i].path, path) == 0) {
      gone = tracked[i].path;
      memmove(&tracked[i], &tracked[i + 1], sizeof *tracked * (size_t)(ntracked - i - 1));
      ntracked--;
      break;
    }
  if (ntracked == 0) {
    free(tracked);
    tracked = NULL, cap_tracked = 0;
  }
  release(&old);
  free(gone);
}

int outfile_spawn_wait(char *const argv[], char *err, size_t n) {
  install();
  posix_spawnattr_t at;
  if (posix_spawnattr_init(&at) != 0) {
    snprintf(err, n, "cannot run %s: out of memory", argv[0]);
    return -1;
  }
  sigset_t empty;
  sigemptyset(&empty);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&at, 0);
  posix_spawnattr_setsigmask(&at, &empty);
  sigset_t old;
  pid_t pid = 0;
  hold(&old); /* a signal between the start and the registration would orphan the child */
  int rc = posix_spawnp(&pid, argv[0], NULL, &at, argv, environ);
  if (rc == 0) child = pid;
  release(&old);
  posix_spawnattr_destroy(&at);
  if (rc != 0) {
    snprintf(err, n, "cannot run %s: %s", argv[0], strerror(rc));
    return -1;
  }
  int status = 0, w;
  while ((w = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  int e = errno;
  hold(&old);
  child = 0;
  release(&old);
  if (w < 0) {
    snprintf(err, n, "waiting for %s: %s", argv[0], strerror(e));
    return -1;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  snprintf(err, n, "%s was killed by signal %d", argv[0], WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return -1;
}

/* ---- one output ---- */

struct OutFile {
  FILE *f;
  char *path;
  char *tmp;  /* the temporary file's path; NULL when path is written directly (a device, a FIFO) */
  int dirfd;  /* path's directory (for the fsync after the rename), or -1 */
};

/* path's directory and last component (the caller frees *dir). */
static bool split_path(const char *path, char **dir, const char **base) {
  const char *slash = strrchr(path, '/');
  if (!slash) {
    *dir = strdup(".");
    *base = path;
  } else {
    size_t dl = slash == path ? 1 : (size_t)(slash - path);
    *dir = strndup(path, dl);
    *base = slash + 1;
  }
  return *dir != NULL;
}

static uint64_t temp_counter;

/* A new file in dirfd (the directory at dirpath) named after base, created with
 * O_CREAT|O_EXCL|O_NOFOLLOW and registered for cleanup; its fd, and its path in *tmp (malloc'd),
 * or -1 with the reason in err. */
static int create_temp(int dirfd, const char *dirpath, const char *base, int mode, char **tmp, char *err, size_t n) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  for (int attempt = 0; attempt < 100; attempt++) {
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32) ^ (++temp_counter * 0x9E3779B97F4A7C15ull);
    x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29; /* splitmix's finaliser */
    char name[160];
    snprintf(name, sizeof name, ".%.100s.%08llx.tmp", base, (unsigned long long)(x & 0xffffffffull));
    size_t len = strlen(dirpath) + strlen(name) + 2;
    char *full = malloc(len);
    if (!full) {
      snprintf(err, n, "out of memory");
      return -1;
    }
    snprintf(full, len, "%s/%s", dirpath, name);
    /* registered once created, with the signals held back between: a signal never removes a file
     * of that name that is not ours (at worst, on another thread, it misses ours) */
    sigset_t block, old;
    sigemptyset(&block);
    for (size_t k = 0; k < sizeof caught / sizeof caught[0]; k++) sigaddset(&block, caught[k]);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    int e = errno;
    if (fd >= 0) outfile_track(full, false);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (fd >= 0) {
      *tmp = full;
      return fd;
    }
    free(full);
    if (e != EEXIST) {
      snprintf(err, n, "cannot create a file in '%s': %s", dirpath, strerror(e));
      return -1;
    }
  }
  snprintf(err, n, "cannot create a file in '%s': too many names taken", dirpath);
  return -1;
}

OutFile *outfile_open(const char *path, int mode, char *err, size_t n) {
  if (!outfile_check(path, err, n)) return NULL;
  OutFile *o = calloc(1, sizeof *o);
  if (!o || !(o->path = strdup(path))) {
    free(o);
    snprintf(err, n, "'%s': out of memory", path);
    return NULL;
  }
  o->dirfd = -1;
  int fd = -1;
  struct stat st;
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
    /* a character device, a FIFO or a socket: written to, never replaced */
    fd = open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) snprintf(err, n, "cannot write '%s': %s", path, strerror(errno));
  } else {
    char *dir;
    const char *base;
    if (!split_path(path, &dir, &base)) {
      snprintf(err, n, "'%s': out of memory", path);
    } else {
      o->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (o->dirfd < 0) snprintf(err, n, "cannot write '%s': its directory '%s': %s", path, dir, strerror(errno));
      else fd = create_temp(o->dirfd, dir, base, mode, &o->tmp, err, n);
      free(dir);
    }
  }
  if (fd >= 0 && !(o->f = fdopen(fd, "w"))) {
    snprintf(err, n, "cannot write '%s': %s", path, strerror(errno));
    close(fd);
  }
  if (!o->f) {
    outfile_discard(o);
    return NULL;
  }
  return o;
}

FILE *outfile_stream(OutFile *o) { return o->f; }

/* Flushes f and closes it: false with errno's reason in err when any write failed (ferror is sticky
 * over every fprintf and fwrite before), the flush, the fsync (sync) or the close. */
static bool finish_stream(FILE *f, bool sync, const char *path, char *err, size_t n) {
  errno = 0;
  bool ok = fflush(f) == 0 && !ferror(f);
  int e = ok ? 0 : (errno ? errno : EIO);
  if (ok && sync && fsync(fileno(f)) != 0) ok = false, e = errno;
  if (fclose(f) != 0 && ok) ok = false, e = errno;
  if (!ok) snprintf(err, n, "cannot write '%s': %s", path, strerror(e));
  return ok;
}

bool outfile_commit(OutFile *o, char *err, size_t n) {
  FILE *f = o->f;
  o->f = NULL;
  bool ok = finish_stream(f, o->tmp != NULL, o->path, err, n);
  if (ok && o->tmp && rename(o->tmp, o->path) != 0) {
    snprintf(err, n, "cannot write '%s': %s", o->path, strerror(errno));
    ok = false;
  }
  if (ok && o->tmp) {
    outfile_untrack(o->tmp); /* renamed: nothing to remove */
    free(o->tmp);
    o->tmp = NULL;
    if (o->dirfd >= 0 && fsync(o->dirfd) != 0 && errno != EINVAL && errno != EROFS) {
      snprintf(err, n, "cannot write '%s': syncing its directory: %s", o->path, strerror(errno));
      ok = false;
    }
  }
  outfile_discard(o);
  return ok;
}

void outfile_discard(OutFile *o) {
  if (!o) return;
  if (o->f) fclose(o->f);
  if (o->tmp) {
    unlink(o->tmp);
    outfile_untrack(o->tmp);
    free(o->tmp);
  }
  if (o->dirfd >= 0) close(o->dirfd);
  free(o->path);
  free(o);
}

/* ---- sets ---- */

typedef struct Member {
  char *name;  /* in the directory */
  char *tmp;   /* the temporary file's path */
  FILE *f;     /* NULL once finished */
  bool renamed;
} Member;

struct OutSet {
  char *dir;
  int dirfd;   /* locked LOCK_EX */
  Member *m;
  int nm, cap;
};

int outfile_dir_open(const char *dir, bool exclusive, char *err, size_t n) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    snprintf(err, n, "'%s': %s", dir,
             e == ENOENT ? "no such directory" : e == ENOTDIR ? "not a directory" : strerror(e));
    return -1;
  }
  while (flock(fd, exclusive ? LOCK_EX : LOCK_SH) != 0) {
    if (errno == EINTR) continue;
    snprintf(err, n, "'%s': cannot lock it: %s", dir, strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

OutSet *outfile_set_open(const char *dir, char *err, size_t n) {
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
    snprintf(err, n, "cannot create the directory '%s': %s", dir, strerror(errno));
    return NULL;
  }
  OutSet *s = calloc(1, sizeof *s);
  if (!s || !(s->dir = strdup(dir))) {
    free(s);
    snprintf(err, n, "'%s': out of memory", dir);
    return NULL;
  }
  s->dirfd = outfile_dir_open(dir, true, err, n);
  if (s->dirfd < 0) {
    free(s->dir);
    free(s);
    return NULL;
  }
  return s;
}

FILE *outfile_set_add(OutSet *s, const char *name, char *err, size_t n) {
  size_t len = strlen(s->dir) + strlen(name) + 2;
  char *path = malloc(len);
  if (!path) {
    snprintf(err, n, "out of memory");
    return NULL;
  }
  snprintf(path, len, "%s/%s", s->dir, name);
  bool ok = outfile_check(path, err, n);
  free(path);
  if (!ok) return NULL;
  if (s->nm == s->cap) {
    int cap = s->cap ? 2 * s->cap : 16;
    Member *m = realloc(s->m, sizeof *m * (size_t)cap);
    if (!m) {
      snprintf(err, n, "out of memory");
      return NULL;
    }
    s->m = m, s->cap = cap;
  }
  Member *m = &s->m[s->nm];
  *m = (Member){0};
  if (!(m->name = strdup(name))) {
    snprintf(err, n, "out of memory");
    return NULL;
  }
  int fd = create_temp(s->dirfd, s->dir, name, OUTFILE_DATA, &m->tmp, err, n);
  if (fd >= 0 && !(m->f = fdopen(fd, "w"))) {
    snprintf(err, n, "cannot write in '%s': %s", s->dir, strerror(errno));
    close(fd);
  }
  s->nm++; /* even when failed: set_discard removes what was made */
  return m->f;
}

bool outfile_set_commit(OutSet *s, char *err, size_t n) {
  bool ok = true;
  char scratch[8];
  for (int i = 0; i < s->nm; i++) { /* every member whole and on disk before any rename */
    Member *m = &s->m[i];
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", s->dir, m->name);
    FILE *f = m->f;
    m->f = NULL;
    if (!f) {
      if (ok) snprintf(err, n, "cannot write '%s'", path);
      ok = false;
    } else if (!finish_stream(f, true, path, ok ? err : scratch, ok ? n : sizeof scratch)) {
      ok = false;
    }
    struct stat st; /* a directory in the way would stop the renames half-way: refused first */
    if (ok && fstatat(s->dirfd, m->name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
      snprintf(err, n, "cannot write '%s': it is a directory", path);
      ok = false;
    }
  }
  if (ok) {
    sigset_t old, block;
    sigemptyset(&block);
    for (size_t k = 0; k < sizeof caught / sizeof caught[0]; k++) sigaddset(&block, caught[k]);
    pthread_sigmask(SIG_BLOCK, &block, &old); /* no signal between the first rename and the last */
    for (int i = 0; i < s->nm && ok; i++) {
      const char *tmpbase = strrchr(s->m[i].tmp, '/') + 1;
      if (renameat(s->dirfd, tmpbase, s->dirfd, s->m[i].name) != 0) {
        snprintf(err, n, "cannot write '%s/%s': %s", s->dir, s->m[i].name, strerror(errno));
        ok = false;
      } else {
        s->m[i].renamed = true;
      }
    }
    for (int i = 0; i < s->nm; i++)
      if (s->m[i].renamed) { /* nothing left to remove */
        outfile_untrack(s->m[i].tmp);
        free(s->m[i].tmp);
        s->m[i].tmp = NULL;
      }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (ok && fsync(s->dirfd) != 0 && errno != EINVAL && errno != EROFS) {
      snprintf(err, n, "cannot write in '%s': syncing it: %s", s->dir, strerror(errno));
      ok = false;
    }
  }
  outfile_set_discard(s);
  return ok;
}

void outfile_set_discard(OutSet *s) {
  if (!s) return;
  for (int i = 0; i < s->nm; i++) {
    Member *m = &s->m[i];
    if (m->f) fclose(m->f);
    if (m->tmp) {
      unlink(m->tmp);
      outfile_untrack(m->tmp);
      free(m->tmp);
    }
    free(m->name);
  }
  free(s->m);
  close(s->dirfd); /* unlocks */
  free(s->dir);
  free(s);
}
