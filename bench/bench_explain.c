/* bench_explain.c: how long `shardc explain` takes on a big program, stage by stage.
 *
 * In: a .shard file (default: samples/llama3_405b.shard on its default mesh, h100_16k: 16,384
 * devices), optionally --mesh NAME and --layout NAME, and a repetition count. Out: the best of N
 * timings (CLOCK_MONOTONIC) of each stage explain runs, in one process, with a fresh arena each
 * time:
 *   front end    parse the file and its imports, check the declarations (parse_program,
 *                sema_program)
 *   lower        the entry to IR as explain builds it (check_build_ir: the whole train step,
 *                forward, loss, backward and update, where the entry is one)
 *   memory+prop  memory_estimate, which runs propagation (shard_assign -> propagate_module) and
 *                inserts the collectives (partition_module) to find the peak temporaries
 *   partition    explain's own partition_module call, which finds every op already partitioned
 *   total        the sum of the four (printing is not timed; `time shardc explain` adds process
 *                start and output)
 * Goal (the project's): under 100 ms in all. Exit 1 if the program does not compile cleanly or the
 * total exceeds --max-ms, if given. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "diag.h"
#include "ir.h"
#include "memory.h"
#include "partition.h"

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

enum { ST_FRONT, ST_LOWER, ST_PROP, ST_PART, ST__COUNT };
/* Collectives inserted anywhere in f, loop bodies included (each counted once, not per trip). */
static int count_collectives(const IrFunc *f) {
  int n = 0;
  for (const Op *op = f->first; op; op = op->next) {
    n += ir_op_is_collective(op->kind);
    if (op->kind == OP_LOOP && op->body) n += count_collectives(op->body);
  }
  return n;
}

static const char *const stage_name[] = {"front end", "lower", "memory+prop", "partition"};

/* One run of the stages; fills t[] (seconds). Returns false if the program does not compile. */
static bool run_once(const char *path, const char *stdlib, const char *mesh, const char *layout, double *t,
                     int *ncoll) {
  Arena a;
  arena_init(&a);
  diag_reset();
  bool ok = false;
  double t0 = now_seconds();
  ParsedProgram *pp = parse_program(&a, path, stdlib);
  Program *p = NULL;
  if (pp && pp->nfiles > 0 && diag_error_count() == 0) {
    SemaOptions so = {.mesh = mesh, .layout = layout};
    p = sema_program(&a, pp, &so);
  }
  double t1 = now_seconds();
  if (p && !p->usage_error && p->entry && p->mesh && diag_error_count() == 0) {
    IrModule *m = check_build_ir(&a, p);
    double t2 = now_seconds();
    if (m) {
      MemoryReport r;
      memory_estimate(p, m, &r);
      double t3 = now_seconds();
      ok = partition_module(m, p) && diag_error_count() == 0;
      double t4 = now_seconds();
      t[ST_FRONT] = t1 - t0, t[ST_LOWER] = t2 - t1, t[ST_PROP] = t3 - t2, t[ST_PART] = t4 - t3;
      *ncoll = count_collectives(m->main);
    }
  }
  arena_free(&a);
  return ok;
}

int main(int argc, char **argv) {
  const char *path = SHARDC_SOURCE_STDLIB "/../samples/llama3_405b.shard";
  const char *mesh = NULL, *layout = NULL;
  int reps = 5;
  double max_ms = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--mesh") == 0 && i + 1 < argc) mesh = argv[++i];
    else if (strcmp(argv[i], "--layout") == 0 && i + 1 < argc) layout = argv[++i];
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--max-ms") == 0 && i + 1 < argc) max_ms = atof(argv[++i]);
    else if (argv[i][0] != '-') path = argv[i];
    else {
      fprintf(stderr, "usage: bench_explain [FILE] [--mesh NAME] [--layout NAME] [--reps N] [--max-ms MS]\n");
      return 2;
    }
  }
  if (reps < 1) reps = 1;
  const char *stdlib = getenv("SHARDC_STDLIB") ? getenv("SHARDC_STDLIB") : SHARDC_SOURCE_STDLIB;
  FILE *devnull = fopen("/dev/null", "w");
  diag_configure(devnull ? devnull : stderr, DIAG_MACHINE, false);
  double best[ST__COUNT], total_best = 0;
  int ncoll = 0;
  for (int r = 0; r < reps; r++) {
    double t[ST__COUNT] = {0};
    if (!run_once(path, stdlib, mesh, layout, t, &ncoll)) {
      fprintf(stderr, "bench_explain: %s does not compile cleanly (run shardc explain on it)\n", path);
      return 1;
    }
    double total = 0;
    for (int s = 0; s < ST__COUNT; s++) total += t[s];
    if (r == 0 || total < total_best) {
      total_best = total;
      memcpy(best, t, sizeof best);
    }
  }
  if (devnull) fclose(devnull);
  printf("explain %s%s%s%s%s: best of %d, %d collectives inserted\n", path, mesh ? " --mesh " : "", mesh ? mesh : "",
         layout ? " --layout " : "", layout ? layout : "", reps, ncoll);
  for (int s = 0; s < ST__COUNT; s++) printf("  %-12s %8.2f ms\n", stage_name[s], best[s] * 1e3);
  printf("  %-12s %8.2f ms%s\n", "total", total_best * 1e3, max_ms > 0 && total_best * 1e3 > max_ms ? "  (over the limit)" : "");
  return max_ms > 0 && total_best * 1e3 > max_ms ? 1 : 0;
}
