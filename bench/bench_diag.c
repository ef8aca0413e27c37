/* bench_diag.c: diagnostics stay linear in the input.
 *
 * For N = 1,000, 10,000 and 100,000 it generates programs that make N diagnostics of one kind and
 * times (best of --reps runs, CLOCK_MONOTONIC) the whole check in one process, diagnostics printed
 * in text form (source line and caret) to /dev/null:
 *   warnings   N layout rules for undeclared dims (a warning each, in sema), default limit (50)
 *   undefined  N lets of undefined names in one body (an error each, in the IR builder), default
 *              limit: the rest are counted, deduplicated and dropped (no did-you-mean search)
 *   lines      N lines, then a warning at each line, last line first, no limit: every one is
 *              formatted with its source line (the line index)
 * and prints the time per diagnostic and the ratio of 10x the diagnostics to 1x: a linear cost
 * gives ~10, the old scan of the file from its start per diagnostic gave ~100. Exit 1 if a ratio
 * exceeds --max-ratio (default 50: caches make 100k dearer per diagnostic than 1k; a quadratic
 * cost gives 100).
 * Not a timed test: bench/run.sh reports its numbers; ctest runs it once, small (--smoke). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "diag.h"
#include "ir.h"
#include "parse.h"

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef enum { K_WARNINGS, K_UNDEFINED, K_LINES } Kind;
static const char *const kind_names[] = {"warnings", "undefined", "lines"};

static char *generate(Kind k, int n, size_t *len) {
  size_t cap = (size_t)n * 48 + 512, used = 0;
  char *s = malloc(cap);
  if (!s) abort();
#define OUT(...) used += (size_t)snprintf(s + used, cap - used, __VA_ARGS__)
  OUT("target t { kind = gpu  flops = { bf16 = 1e15 }  hbm = 80e9  hbm_bw = 3e12  nvlink_bw = 4.5e11\n"
      "  node_size = 8  network_bw = 5e10  nvlink_latency = 1e-6  network_latency = 3e-6 }\n"
      "mesh pod = t[data: 4]\ndim batch = 8\n");
  if (k == K_WARNINGS) {
    OUT("layout l {\n");
    for (int i = 0; i < n; i++) OUT("  zz%d: data\n", i);
    OUT("}\n");
  } else if (k == K_UNDEFINED) {
    OUT("model m {\n  fn forward(x: f32[batch]) -> f32[batch] {\n");
    for (int i = 0; i < n; i++) OUT("    let y%d = q%d\n", i, i);
    OUT("    return x\n  }\n}\n");
  } else {
    for (int i = 0; i < n; i++) OUT("# line %d\n", i);
  }
#undef OUT
  *len = used;
  return s;
}

/* One whole check of the text; the diagnostics it printed (counted) in *ndiags. */
static double run_once(Kind k, const char *text, size_t len, int n, int *ndiags) {
  Arena a;
  arena_init(&a);
  diag_reset();
  diag_set_error_limit(k == K_LINES ? 0 : 50);
  double t0 = now_seconds();
  Source *src = source_from_memory("bench.shard", text, len);
  if (k == K_LINES) {
    for (int line = n; line >= 1; line--) diag_warning((SrcLoc){src, line, 3, 4}, "warning at line %d", line);
  } else {
    ParsedProgram *pp = parse_program_source(&a, src, NULL);
    SemaOptions so = {0};
    Program *p = sema_program(&a, pp, &so);
    if (diag_error_count() == 0 || k == K_UNDEFINED) ir_build(&a, p);
  }
  double t = now_seconds() - t0;
  *ndiags = diag_error_count() + diag_warning_count();
  arena_free(&a);
  source_free_all();
  intern_reset();
  return t;
}

int main(int argc, char **argv) {
  int reps = 3;
  double max_ratio = 50;
  bool smoke = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--max-ratio") == 0 && i + 1 < argc) max_ratio = atof(argv[++i]);
    else if (strcmp(argv[i], "--smoke") == 0) smoke = true;
    else {
      fprintf(stderr, "usage: bench_diag [--reps N] [--max-ratio R] [--smoke]\n");
      return 2;
    }
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  FILE *sink = fopen("/dev/null", "w");
  diag_configure(sink, DIAG_TEXT, false);
  static const int sizes[] = {1000, 10000, 100000};
  int nsizes = smoke ? 2 : 3;
  bool ok = true;
  for (int k = 0; k < 3; k++) {
    double best[3] = {0};
    for (int si = 0; si < nsizes; si++) {
      int n = smoke ? sizes[si] / 10 : sizes[si], got = 0;
      size_t len;
      char *text = generate((Kind)k, n, &len);
      for (int r = 0; r < reps; r++) {
        double t = run_once((Kind)k, text, len, n, &got);
        if (r == 0 || t < best[si]) best[si] = t;
      }
      free(text);
      printf("%-10s %7d diagnostics  %8.4f s  %6.2f us each", kind_names[k], got, best[si],
             best[si] / (got ? got : 1) * 1e6);
      if (si > 0) {
        double ratio = best[si] / (best[si - 1] > 0 ? best[si - 1] : 1e-9);
        printf("  x10 input: x%.1f time", ratio);
        if (!smoke && ratio > max_ratio) ok = false;
      }
      printf("\n");
      if (got < n) {
        printf("bench_diag: expected at least %d diagnostics, got %d\n", n, got);
        ok = false;
      }
    }
  }
  fclose(sink);
  return ok ? 0 : 1;
}
