/* bench_sim.c: how long `shardc sim` takes, stage by stage, on every sample and validation program.
 *
 * In: .shard files (default: every .shard of samples/ and of bench/validation/ that has an entry,
 * each on its default mesh), --reps N, optionally --mesh NAME (applies to every file given). Out,
 * per program, the best of N timings (CLOCK_MONOTONIC) in one process with a fresh arena each time:
 *   front     parse, check the declarations, lower the entry (the whole train step), the pass
 *             pipeline (propagate, partition, localise, stages) and the memory fit, as sim runs them
 *   sim       sim_program: the kernels priced, the timeline built and run, the figures, the items
 *   total     the two (printing is not timed; `time shardc sim` adds process start and output)
 * and the tasks simulated, the time per task, the simulated devices and the time per simulated
 * device and per real device. Goal (issue 11): LLaMA 3 405B on 16,384 devices well under a second
 * as a whole process. Exit 1 if a program does not compile or simulate. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "diag.h"
#include "memory.h"
#include "sim.h"

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct Timing {
  double front, sim;
  int64_t tasks, devices;
  int simulated;
  double step_s;
} Timing;

/* One run; false if the program does not compile (or has no entry). */
static bool run_once(const char *path, const char *stdlib, const char *mesh, Timing *out) {
  Arena a;
  arena_init(&a);
  diag_reset();
  diag_push_quiet();
  bool ok = false;
  double t0 = now_seconds();
  ParsedProgram *pp = parse_program(&a, path, stdlib);
  CheckedProgram cp;
  SemaOptions so = {.mesh = mesh};
  if (pp && pp->nfiles > 0 && diag_error_count() == 0 && check_program(&a, pp, &so, &cp) == EXIT_OK && cp.ir &&
      pipeline_run(cp.ir, cp.prog)) {
    MemoryReport mem;
    memory_estimate(cp.prog, cp.ir, &mem);
    double t1 = now_seconds();
    SimOptions o = {0};
    SimReport r;
    ok = sim_program(cp.prog, cp.ir, &o, &r);
    double t2 = now_seconds();
    out->front = t1 - t0, out->sim = t2 - t1;
    out->tasks = r.tasks, out->devices = r.devices, out->simulated = r.nstages, out->step_s = r.step_s;
    sim_report_free(&r);
  }
  diag_pop_quiet();
  arena_free(&a);
  source_free_all();
  intern_reset();
  return ok;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Every .shard of dir with an entry (a function to simulate), sorted. */
static int list_dir(const char *dir, char **out, int max) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) && n < max) {
    size_t l = strlen(e->d_name);
    if (l < 7 || strcmp(e->d_name + l - 6, ".shard") != 0) continue;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    char line[512];
    bool entry = false;
    while (fgets(line, sizeof line, f)) entry |= strncmp(line, "train ", 6) == 0 || strncmp(line, "model ", 6) == 0;
    fclose(f);
    if (entry && strcmp(e->d_name, "palm.shard") != 0) out[n++] = strdup(path);
  }
  closedir(d);
  qsort(out, (size_t)n, sizeof *out, cmp_str);
  return n;
}

int main(int argc, char **argv) {
  int reps = 5;
  const char *mesh = NULL, *stdlib = SHARDC_SOURCE_STDLIB;
  char *files[256];
  int nfiles = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--mesh") == 0 && i + 1 < argc) mesh = argv[++i];
    else if (argv[i][0] != '-' && nfiles < 256) files[nfiles++] = strdup(argv[i]);
    else {
      fprintf(stderr, "usage: bench_sim [FILE.shard ...] [--mesh NAME] [--reps N]   (from the repository's root)\n");
      return 2;
    }
  }
  if (nfiles == 0) {
    nfiles = list_dir("samples", files, 128);
    nfiles += list_dir("bench/validation", files + nfiles, 128);
  }
  if (reps < 1) reps = 1;
  printf("bench_sim: best of %d, in one process; front = parse, check, lower, passes, memory fit; sim = sim_program\n",
         reps);
  printf("  %-44s %9s %9s %9s %9s %8s %10s %12s %12s\n", "program", "devices", "simulated", "tasks", "front ms", "sim ms",
         "us/task", "us/sim dev", "ns/device");
  int bad = 0;
  for (int k = 0; k < nfiles; k++) {
    Timing best = {0};
    bool ok = true;
    for (int r = 0; r < reps && ok; r++) {
      Timing t;
      ok = run_once(files[k], stdlib, mesh, &t);
      if (ok && (r == 0 || t.front + t.sim < best.front + best.sim)) best = t;
    }
    if (!ok) {
      printf("  %-44s does not compile or simulate\n", files[k]);
      bad++;
      free(files[k]);
      continue;
    }
    printf("  %-44s %9lld %9d %9lld %9.2f %8.2f %10.3f %12.1f %12.2f\n", files[k], (long long)best.devices, best.simulated,
           (long long)best.tasks, best.front * 1e3, best.sim * 1e3, best.tasks ? best.sim * 1e6 / (double)best.tasks : 0,
           best.sim * 1e6 / best.simulated, best.sim * 1e9 / (double)best.devices);
    free(files[k]);
  }
  return bad ? 1 : 0;
}
