/* run_mpi.c: run_mpi.h's functions.
 *
 * The launcher. `shardc run FILE ... --backend mpi` outside mpirun starts
 *   mpirun -np N [--allow-run-as-root] [--oversubscribe | --hostfile F] $SHARDC_MPIRUN_ARGS
 *          -x SHARDC_MPI_STATUS /proc/self/exe run FILE ...
 * (N = the mesh's devices / --threads-per-rank; as root mpirun needs --allow-run-as-root; without a
 * hostfile the ranks share this machine, hence --oversubscribe), passes its standard output
 * through, and reads its standard error line by line: what the ranks print goes on, and Open MPI's
 * banners about a job it ended are replaced by one error of its own. Each rank on this host keeps
 * its state in a status file (runtime/mpi_host.c), so a rank that died (killed, crashed, or gone
 * without a word) is named with its devices and the op each was in. Ranks on other hosts cannot
 * write the file: then mpirun's "process rank N ... exited on signal S" is what names it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "run_mpi.h"
#include "shardrt.h"
#ifdef SHARDC_HAVE_MPI
#include "shardrt_mpi.h"
#endif

static bool started; /* this process started MPI (a rank) */

bool run_mpi_under_mpirun(void) {
#ifdef SHARDC_HAVE_MPI
  return rt_mpi_launched();
#else
  return false;
#endif
}

bool run_mpi_root(void) {
#ifdef SHARDC_HAVE_MPI
  return !started || rt_mpi_rank() == 0;
#else
  return true;
#endif
}

static int threads_per_rank(const Options *o) { return o->threads_per_rank > 0 ? o->threads_per_rank : 1; }

/* The mesh's devices over T: the ranks the job needs; 0 (with a diagnostic) when T does not divide them. */
static int ranks_needed(const Options *o, const Mesh *mesh) {
  int t = threads_per_rank(o);
  if (mesh->devices % t) {
    diag_error(mesh->loc, "run: --threads-per-rank %d does not divide the %lld devices of mesh '%s'", t, (long long)mesh->devices,
               mesh->name);
    return 0;
  }
  if (mesh->devices / t > RT_HARD_MAX_DEVICES) {
    diag_error(mesh->loc, "run: mesh '%s' needs %lld ranks, more than the runtime's %d devices", mesh->name,
               (long long)(mesh->devices / t), RT_HARD_MAX_DEVICES);
    return 0;
  }
  return (int)(mesh->devices / t);
}

#ifdef SHARDC_HAVE_MPI

/* mpirun: $SHARDC_MPIRUN, else the first on PATH. */
static bool find_mpirun(char *path, size_t n) {
  const char *env = getenv("SHARDC_MPIRUN");
  if (env && *env) {
    snprintf(path, n, "%s", env);
    return access(path, X_OK) == 0;
  }
  const char *p = getenv("PATH");
  if (!p) p = "/usr/local/bin:/usr/bin:/bin";
  while (*p) {
    const char *end = strchr(p, ':');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    snprintf(path, n, "%.*s/mpirun", (int)len, len ? p : ".");
    if (access(path, X_OK) == 0) return true;
    p += len + (end ? 1 : 0);
  }
  return false;
}

static RtConfig mesh_config(const Mesh *mesh) {
  RtConfig c = {.naxes = mesh->naxes};
  for (int a = 0; a < mesh->naxes; a++) c.axis_size[a] = mesh->axes[a].size, c.axis_name[a] = mesh->axes[a].name;
  return c;
}

/* mpirun's standard error, line by line: the ranks' lines pass, and the banners Open MPI prints
 * when it ends a job (between rules of dashes) are dropped when this launcher says the same in
 * its own words; "mpirun noticed that process rank N with PID P on node H exited on signal S (X)"
 * is kept for the report. */
typedef struct Filter {
  char block[8192];
  size_t len;
  bool in_block;
  char noticed[512];
} Filter;

static bool ours(const char *block) {
  return strstr(block, "Primary job  terminated normally") || strstr(block, "exited with non-zero status") ||
         strstr(block, "mpirun noticed that process rank") || strstr(block, "MPI_ABORT was invoked") ||
         strstr(block, "exiting improperly");
}

static void filter_line(Filter *f, const char *line) {
  bool rule = strncmp(line, "-----------------------", 23) == 0;
  if (rule && !f->in_block) {
    f->in_block = true, f->len = 0;
    return;
  }
  if (rule) {
    f->in_block = false;
    f->block[f->len < sizeof f->block ? f->len : sizeof f->block - 1] = 0;
    const char *n = strstr(f->block, "mpirun noticed that process rank");
    if (n) {
      const char *e = strchr(n, '\n');
      snprintf(f->noticed, sizeof f->noticed, "%.*s", (int)(e ? e - n : (long)strlen(n)), n);
    }
    if (!ours(f->block)) fprintf(stderr, "--------------------------------------------------------------------------\n%s"
                                         "--------------------------------------------------------------------------\n",
                                 f->block);
    return;
  }
  if (f->in_block) {
    size_t k = strlen(line);
    if (f->len + k + 2 < sizeof f->block) {
      memcpy(f->block + f->len, line, k);
      f->len += k;
      f->block[f->len++] = '\n';
      f->block[f->len] = 0;
    }
    return;
  }
  /* Open MPI's own one-liners about the abort the ranks asked for */
  if (strstr(line, "ORTE_ERROR_LOG") || strstr(line, "[warn] Epoll")) return;
  fprintf(stderr, "%s\n", line);
}

int run_mpi_launch(const Options *o, const Mesh *mesh) {
  int np = ranks_needed(o, mesh);
  if (!np) return EXIT_PROGRAM_ERROR;
  char mpirun[4096];
  if (!find_mpirun(mpirun, sizeof mpirun)) {
    diag_error((SrcLoc){0},
               "run: --backend mpi starts its %d ranks with mpirun, which is %s: install Open MPI (apt-get install "
               "openmpi-bin), set SHARDC_MPIRUN to it, or start the ranks yourself: mpirun -np %d shardc run ...",
               np, getenv("SHARDC_MPIRUN") && *getenv("SHARDC_MPIRUN") ? "not executable at $SHARDC_MPIRUN" : "not on PATH", np);
    return EXIT_PROGRAM_ERROR;
  }
  if (o->hostfile && access(o->hostfile, R_OK) != 0) {
    diag_error((SrcLoc){0}, "run: --hostfile %s: %s", o->hostfile, strerror(errno));
    return EXIT_PROGRAM_ERROR;
  }
  char self[4096];
  ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
  if (k <= 0) snprintf(self, sizeof self, "%s", o->argv0);
  else self[k] = 0;
  char status[4096];
  bool have_status = rt_mpi_status_create((int)mesh->devices, np, threads_per_rank(o), status, sizeof status) == RT_OK;
  if (have_status) setenv("SHARDC_MPI_STATUS", status, 1);

  /* the command line */
  char npbuf[16];
  snprintf(npbuf, sizeof npbuf, "%d", np);
  char *extra = strdup(getenv("SHARDC_MPIRUN_ARGS") ? getenv("SHARDC_MPIRUN_ARGS") : "");
  size_t cap = (size_t)o->argc + 32 + (extra ? strlen(extra) : 0);
  char **argv = calloc(cap, sizeof *argv);
  int n = 0;
  argv[n++] = mpirun, argv[n++] = "-np", argv[n++] = npbuf;
  if (geteuid() == 0) argv[n++] = "--allow-run-as-root";
  if (o->hostfile) argv[n++] = "--hostfile", argv[n++] = (char *)o->hostfile;
  else argv[n++] = "--oversubscribe";
  for (char *t = extra ? strtok(extra, " \t") : NULL; t; t = strtok(NULL, " \t")) argv[n++] = t;
  if (have_status) argv[n++] = "-x", argv[n++] = "SHARDC_MPI_STATUS";
  argv[n++] = self;
  for (int i = 1; i < o->argc; i++) argv[n++] = o->argv[i];
  argv[n] = NULL;

  fflush(stdout);
  fflush(stderr);
  int err_pipe[2];
  if (pipe(err_pipe) != 0) {
    diag_error((SrcLoc){0}, "run: cannot start mpirun: %s", strerror(errno));
    free(argv), free(extra);
    return EXIT_PROGRAM_ERROR;
  }
  pid_t pid = fork();
  if (pid == 0) {
    dup2(err_pipe[1], STDERR_FILENO);
    close(err_pipe[0]), close(err_pipe[1]);
    execv(mpirun, argv);
    fprintf(stderr, "error: run: cannot start %s: %s\n", mpirun, strerror(errno));
    _exit(127);
  }
  close(err_pipe[1]);
  int rc = EXIT_PROGRAM_ERROR;
  if (pid < 0) {
    diag_error((SrcLoc){0}, "run: cannot start mpirun: %s", strerror(errno));
    close(err_pipe[0]);
  } else {
    /* Ctrl-C reaches mpirun too (same process group), which ends the ranks: wait for it */
    signal(SIGINT, SIG_IGN);
    FILE *err = fdopen(err_pipe[0], "r");
    Filter *f = calloc(1, sizeof *f);
    char line[8192];
    while (err && f && fgets(line, sizeof line, err)) {
      line[strcspn(line, "\n")] = 0;
      filter_line(f, line);
    }
    if (err) fclose(err);
    int wst = 0;
    while (waitpid(pid, &wst, 0) < 0 && errno == EINTR) {
    }
    signal(SIGINT, SIG_DFL);
    int code = WIFEXITED(wst) ? WEXITSTATUS(wst) : 128 + (WIFSIGNALED(wst) ? WTERMSIG(wst) : 0);
    char report[4096] = "";
    RtConfig cfg = mesh_config(mesh);
    int dead = have_status ? rt_mpi_status_report(status, &cfg, report, sizeof report) : -1;
    if (code == 0) {
      rc = EXIT_OK;
    } else if (dead > 0) {
      diag_error((SrcLoc){0}, "run: %s%s%s%s; mpirun stopped the other ranks", report, f && f->noticed[0] ? " (" : "",
                 f && f->noticed[0] ? f->noticed : "", f && f->noticed[0] ? ")" : "");
      rc = EXIT_PROGRAM_ERROR;
    } else if (f && f->noticed[0]) { /* a rank on another host */
      diag_error((SrcLoc){0}, "run: %s (with %d device%s per rank, rank r runs devices r x %d and on); mpirun stopped the other ranks",
                 f->noticed, threads_per_rank(o), threads_per_rank(o) == 1 ? "" : "s", threads_per_rank(o));
      rc = EXIT_PROGRAM_ERROR;
    } else if (code == EXIT_PROGRAM_ERROR || code == EXIT_USAGE) {
      rc = code; /* the ranks said why (rank 0 printed it) */
    } else {
      diag_error((SrcLoc){0}, "run: mpirun ended with status %d", code);
      rc = EXIT_PROGRAM_ERROR;
    }
    free(f);
  }
  if (have_status) unlink(status);
  free(argv), free(extra);
  return rc;
}

bool run_mpi_rank_begin(const Options *o, const Mesh *mesh) {
  char err[256];
  if (rt_mpi_init(NULL, NULL, err, sizeof err) != RT_OK) {
    diag_error((SrcLoc){0}, "run: %s", err);
    return false;
  }
  started = true;
  if (rt_mpi_rank() != 0) { /* rank 0 prints for everyone; a crash still reaches stderr */
    FILE *null = fopen("/dev/null", "w");
    if (null) {
      diag_configure(null, o->diag_format, false);
      if (!freopen("/dev/null", "w", stdout)) fclose(stdout);
    }
  }
  int np = ranks_needed(o, mesh);
  if (!np) return false;
  if (np != rt_mpi_size()) {
    diag_error(mesh->loc,
               "run: mesh '%s' has %lld devices and the MPI backend runs %d per rank (--threads-per-rank), so the job "
               "needs %d ranks (mpirun -np %d); this one has %d",
               mesh->name, (long long)mesh->devices, threads_per_rank(o), np, np, rt_mpi_size());
    return false;
  }
  return true;
}

bool run_mpi_agree(bool ok) { return started ? rt_mpi_all(ok) != 0 : ok; }

int run_mpi_rank_end(int rc) {
  if (!started) return rc;
  rc = rt_mpi_bcast_int(rc);
  fflush(stdout);
  rt_mpi_finalize();
  started = false;
  return rc;
}

#else /* no MPI in this build: main.c refuses --backend mpi before any of these */

int run_mpi_launch(const Options *o, const Mesh *mesh) {
  (void)o;
  diag_error(mesh->loc, "run: this shardc was built without MPI");
  return EXIT_PROGRAM_ERROR;
}

bool run_mpi_rank_begin(const Options *o, const Mesh *mesh) { return run_mpi_launch(o, mesh) == EXIT_OK; }
bool run_mpi_agree(bool ok) { return ok; }
int run_mpi_rank_end(int rc) { return rc; }

#endif
