/* bench_frontend.c: how fast the front end turns .shard text into an AST.
 *
 * In: a .shard file (bench/gen_program writes a large one) and a repetition count. Out: the best
 * of N timings (CLOCK_MONOTONIC) of
 *   read+scan  reading the file from the page cache and touching every byte once (counting lines):
 *              the floor any front end pays, printed as the reference
 *   parse      parse_source into a fresh arena: lexing, parsing, building the AST, interning
 *              names; the arena, the interner and the diagnostic counts are reset between runs
 * with lines/s, MB/s and parse's cost as a multiple of read+scan. Exit 1 if the file does not parse
 * cleanly (the benchmark's input must be valid) or parses below --min-lines-per-s, if given. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ast.h"
#include "common.h"
#include "diag.h"
#include "parse.h"

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Reads the whole file into buf (grown as needed); returns its size, or -1. */
static long read_whole(const char *path, char **buf, size_t *cap) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  size_t len = 0, n;
  for (;;) {
    if (len + 65536 > *cap) {
      *cap = (*cap + 65536) * 2;
      char *nb = realloc(*buf, *cap);
      if (!nb) {
        fclose(f);
        return -1;
      }
      *buf = nb;
    }
    n = fread(*buf + len, 1, 65536, f);
    len += n;
    if (n < 65536) break;
  }
  bool bad = ferror(f);
  fclose(f);
  return bad ? -1 : (long)len;
}

/* The reference: read the file and look at every byte once. */
static double time_read_scan(const char *path, long *lines_out) {
  static char *buf;
  static size_t cap;
  double t0 = now_seconds();
  long len = read_whole(path, &buf, &cap);
  if (len < 0) return -1;
  long lines = 0;
  for (long i = 0; i < len; i++) lines += buf[i] == '\n';
  double t = now_seconds() - t0;
  *lines_out = lines;
  return t;
}

/* One parse of src into a fresh arena; everything is freed and reset afterwards. */
static double time_parse(const Source *src, int *errors, size_t *arena_bytes) {
  Arena arena;
  arena_init(&arena);
  double t0 = now_seconds();
  Ast *ast = parse_source(&arena, src);
  double t = now_seconds() - t0;
  *errors = diag_error_count() + (ast ? 0 : 1);
  *arena_bytes = arena.bytes;
  arena_free(&arena);
  intern_reset();
  diag_reset();
  return t;
}

static void print_row(const char *what, int reps, double t, long lines, size_t bytes) {
  printf("  %-10s best of %d: %9.4f s  %8.3f M lines/s  %8.1f MB/s\n", what, reps, t,
         (double)lines / t / 1e6, (double)bytes / t / 1e6);
}

int main(int argc, char **argv) {
  const char *path = NULL;
  int reps = 5;
  double min_lines_per_s = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--min-lines-per-s") == 0 && i + 1 < argc) min_lines_per_s = atof(argv[++i]);
    else if (argv[i][0] != '-' && !path) path = argv[i];
    else path = NULL, reps = 0, i = argc;
  }
  if (!path || reps < 1) {
    fprintf(stderr, "usage: bench_frontend FILE.shard [--reps N] [--min-lines-per-s R]\n");
    return 2;
  }
  diag_configure(stderr, DIAG_TEXT, false);
  diag_set_error_limit(10);

  long lines = 0;
  double best_scan = 1e30;
  for (int r = 0; r < reps; r++) {
    double t = time_read_scan(path, &lines);
    if (t < 0) {
      fprintf(stderr, "bench_frontend: cannot read %s: %s\n", path, strerror(errno));
      return 1;
    }
    if (t < best_scan) best_scan = t;
  }

  Source *src = source_load(path);
  if (!src) {
    fprintf(stderr, "bench_frontend: cannot load %s: %s\n", path, strerror(errno));
    return 1;
  }
  double best_parse = 1e30;
  size_t arena_bytes = 0;
  for (int r = 0; r < reps; r++) {
    int errors;
    double t = time_parse(src, &errors, &arena_bytes);
    if (errors) {
      fprintf(stderr, "bench_frontend: %s does not parse cleanly (%d errors)\n", path, errors);
      return 1;
    }
    if (t < best_parse) best_parse = t;
  }

  printf("bench_frontend: %s: %ld lines, %.1f MB, AST arena %.1f MB\n", path, lines,
         (double)src->len / 1e6, (double)arena_bytes / 1e6);
  print_row("read+scan", reps, best_scan, lines, src->len);
  print_row("parse", reps, best_parse, lines, src->len);
  printf("  parse costs %.1fx read+scan\n", best_parse / best_scan);
  double rate = (double)lines / best_parse;
  source_free_all();
  if (min_lines_per_s > 0 && rate < min_lines_per_s) {
    fprintf(stderr, "bench_frontend: %.0f lines/s is below the required %.0f\n", rate, min_lines_per_s);
    return 1;
  }
  return 0;
}
