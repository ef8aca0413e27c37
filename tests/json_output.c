/* json_output.c: every command prints one JSON object with --format json, whatever happens
 * (language.md, Machine-readable output), and every "line" in it comes with its "file".
 *
 *   json_output --shardc PATH DIR...
 *
 * Runs `shardc CMD FILE --format json` from FILE's directory for CMD = parse, check, explain and
 * sim over every .shard below each DIR (test inputs with errors, programs that do not fit,
 * libraries with no entry among them), and `run`, `build`, `import` (of a .shard: not JSON) and an
 * unknown command once: stdout
 * must parse (cJSON) as exactly one object, nothing after it, and any object holding "line" must
 * hold "file" too. The exit status must be 0, 1 or 2 (a crash fails). Prints each failure and
 * `N passed, N failed`; exits 1 on any failure. Two commands run at a time. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { TIMEOUT_S = 60, JOBS = 2 };

static char **files;
static int nfiles, capfiles;

static int collect(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
  (void)sb, (void)ftw;
  size_t n = strlen(path);
  if (type != FTW_F || n < 6 || strcmp(path + n - 6, ".shard") != 0) return 0;
  if (nfiles == capfiles) {
    capfiles = capfiles ? 2 * capfiles : 256;
    files = realloc(files, sizeof *files * (size_t)capfiles);
    if (!files) abort();
  }
  files[nfiles++] = strdup(path);
  return 0;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Any object with "line" and no "file" (its path in `where`). */
static const char *line_without_file(const cJSON *j) {
  if (cJSON_IsObject(j) && cJSON_GetObjectItemCaseSensitive(j, "line") && !cJSON_GetObjectItemCaseSensitive(j, "file"))
    return j->string ? j->string : "(an object)";
  for (const cJSON *c = j ? j->child : NULL; c; c = c->next) {
    const char *w = line_without_file(c);
    if (w) return w;
  }
  return NULL;
}

typedef struct Job {
  pid_t pid;
  int fd;
  char *out;
  size_t len, cap;
  const char *cmd, *file;
} Job;

static int passed, failed;

static void job_start(Job *j, const char *shardc, const char *cmd, const char *file) {
  int p[2];
  memset(j, 0, sizeof *j);
  j->cmd = cmd, j->file = file;
  if (pipe(p) != 0) abort();
  j->pid = fork();
  if (j->pid == 0) {
    close(p[0]);
    dup2(p[1], 1);
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) dup2(null, 2), dup2(null, 0);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", file);
    char *slash = strrchr(dir, '/');
    const char *base = file;
    if (slash) {
      *slash = 0;
      base = file + (slash - dir) + 1;
      if (chdir(dir) != 0) _exit(127);
    }
    alarm(TIMEOUT_S);
    execl(shardc, shardc, cmd, base, "--format", "json", (char *)NULL);
    _exit(127);
  }
  close(p[1]);
  j->fd = p[0];
}

static void job_finish(Job *j) {
  char buf[65536];
  ssize_t n;
  while ((n = read(j->fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
    if (n <= 0) continue;
    if (j->len + (size_t)n + 1 > j->cap) {
      j->cap = (j->len + (size_t)n + 1) * 2;
      j->out = realloc(j->out, j->cap);
      if (!j->out) abort();
    }
    memcpy(j->out + j->len, buf, (size_t)n);
    j->len += (size_t)n;
  }
  close(j->fd);
  int st = 0;
  waitpid(j->pid, &st, 0);
  if (!j->out) j->out = calloc(1, 1);
  j->out[j->len] = 0;
  const char *why = NULL;
  if (!WIFEXITED(st)) why = WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM ? "timed out" : "crashed";
  else if (WEXITSTATUS(st) > 2) why = "exit status above 2";
  const char *end = NULL;
  cJSON *json = why ? NULL : cJSON_ParseWithOpts(j->out, &end, false);
  if (!why && !json) why = "stdout is not JSON";
  if (!why) {
    while (*end == ' ' || *end == '\n' || *end == '\t' || *end == '\r') end++;
    if (*end) why = "more after the first JSON value (two objects?)";
    else if (!cJSON_IsObject(json)) why = "the JSON value is not an object";
  }
  const char *w = json && !why ? line_without_file(json) : NULL;
  if (!why && w) why = "a \"line\" without its \"file\"";
  if (why) {
    failed++;
    printf("FAIL shardc %s %s --format json: %s%s%s\n", j->cmd, j->file, why, w ? " in " : "", w ? w : "");
  } else {
    passed++;
  }
  cJSON_Delete(json);
  free(j->out);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* each failure printed as found, even if this aborts */
  char *shardc = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--shardc") == 0 && i + 1 < argc) shardc = realpath(argv[++i], NULL); /* run from elsewhere */
    else nftw(argv[i], collect, 16, FTW_PHYS);
  }
  if (!shardc || nfiles == 0) {
    fprintf(stderr, "usage: json_output --shardc PATH DIR...\n");
    return 2;
  }
  qsort(files, (size_t)nfiles, sizeof *files, by_name);
  static const char *const every[] = {"parse", "check", "explain", "sim"};
  static const char *const once[] = {"run", "build", "import", "no_such_command"};
  int total = nfiles * (int)(sizeof every / sizeof *every) + (int)(sizeof once / sizeof *once);
  Job jobs[JOBS];
  int running = 0, next = 0;
  while (next < total || running > 0) {
    while (running < JOBS && next < total) {
      int k = next++;
      int nev = nfiles * (int)(sizeof every / sizeof *every);
      const char *cmd = k < nev ? every[k % 4] : once[k - nev];
      const char *file = k < nev ? files[k / 4] : files[0];
      job_start(&jobs[running++], shardc, cmd, file);
    }
    /* finish the oldest (its output is read to the end, so a full pipe never blocks it) */
    job_finish(&jobs[0]);
    memmove(&jobs[0], &jobs[1], sizeof(Job) * (size_t)(--running));
  }
  printf("%d passed, %d failed\n", passed, failed);
  for (int i = 0; i < nfiles; i++) free(files[i]);
  free(files);
  free(shardc);
  return failed ? 1 : 0;
}
