/* unit_test.h: the harness every unit test under tests/unit/ shares. Header-only (each test is one
 * program), so everything here is static.
 *
 * A case is ut_begin(name), its checks, ut_end(). The first failed check prints `FAIL name`, then
 * every failed check its reason on a line indented by four spaces; ut_end() prints `PASS name` when
 * nothing failed. At the end, `return ut_summary();` prints `N passed, N failed` and returns the exit
 * code: 1 on any failure.
 *
 *   ut_fail(fmt, ...)              the case fails, for this reason
 *   UT_CHECK(cond, fmt, ...)       ut_fail(fmt, ...) unless cond
 *   ut_true(what, ok)              ut_fail("what: false") unless ok
 *   ut_near(what, got, want, rel)  got within rel (a fraction) of want
 *   ut_ok()                        nothing has failed in this case so far
 *   ut_expect_fail(reason)         after ut_begin: the case is a known gap of another stage (the
 *                                  test's known_gaps table; NULL: it is not). While it fails it prints
 *                                  `XFAIL name (known gap: reason)` and does not count as failed; once
 *                                  it passes it prints XPASS, asking for its line to be removed.
 *   ut_begin(NULL) ... ut_end_as(name)
 *                                  a case whose name reports what it counted: its reasons wait
 *                                  until the name is known, then print under it.
 *   ut_each_shard(path, fn)        fn(file) for path if it is a .shard file, else for every .shard
 *                                  below the directory path, in name order; false if path cannot
 *                                  be read. */
#ifndef SHARDC_UNIT_TEST_H
#define SHARDC_UNIT_TEST_H

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int ut_passed, ut_failed, ut_xfailed;
static bool ut_case_ok;
static const char *ut_case_name; /* NULL: named at ut_end_as */
static const char *ut_xfail_reason;
static char ut_held[4096]; /* the reasons of a case not named yet */

static inline void ut_begin(const char *name) {
  ut_case_name = name;
  ut_case_ok = true;
  ut_held[0] = 0;
}

static inline bool ut_ok(void) { return ut_case_ok; }

static inline void ut_expect_fail(const char *reason) { ut_xfail_reason = reason; }

static inline void ut_fail_header(void) {
  if (ut_xfail_reason) printf("XFAIL %s (known gap: %s)\n", ut_case_name, ut_xfail_reason);
  else printf("FAIL %s\n", ut_case_name);
}

__attribute__((format(printf, 1, 2))) static inline void ut_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (!ut_case_name) { /* held for ut_end_as; reasons that no longer fit are dropped */
    char reason[1024];
    vsnprintf(reason, sizeof reason, fmt, ap);
    size_t len = strlen(ut_held);
    if (len + strlen(reason) + 6 <= sizeof ut_held)
      snprintf(ut_held + len, sizeof ut_held - len, "    %s\n", reason);
  } else {
    if (ut_case_ok) ut_fail_header();
    printf("    ");
    vprintf(fmt, ap);
    printf("\n");
  }
  ut_case_ok = false;
  va_end(ap);
}

#define UT_CHECK(cond, ...)            \
  do {                                 \
    if (!(cond)) ut_fail(__VA_ARGS__); \
  } while (0)

static inline void ut_true(const char *what, bool ok) {
  if (!ok) ut_fail("%s: false", what);
}

/* |got - want| <= rel x |want| */
static inline void ut_near(const char *what, double got, double want, double rel) {
  if (!(fabs(got - want) <= rel * fabs(want)))
    ut_fail("%s: got %.4g, want %.4g (within %.0f%%)", what, got, want, rel * 100);
}

static inline void ut_end(void) {
  if (ut_case_ok && ut_xfail_reason) {
    printf("PASS %s (XPASS: remove it from known_gaps)\n", ut_case_name);
    ut_passed++;
  } else if (ut_case_ok) {
    printf("PASS %s\n", ut_case_name);
    ut_passed++;
  } else if (ut_xfail_reason) {
    ut_xfailed++;
  } else {
    ut_failed++;
  }
  ut_xfail_reason = NULL;
}

/* Ends a case begun as ut_begin(NULL): names it, then prints its reasons under the name. */
static inline void ut_end_as(const char *name) {
  ut_case_name = name;
  if (!ut_case_ok) {
    ut_fail_header();
    fputs(ut_held, stdout);
  }
  ut_end();
}

/* Prints the totals; returns the exit code. */
static inline int ut_summary(void) {
  if (ut_xfailed) printf("(%d known gaps of other stages failed as expected: XFAIL above)\n", ut_xfailed);
  printf("%d passed, %d failed\n", ut_passed, ut_failed);
  return ut_failed ? 1 : 0;
}

static inline int ut_cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static inline bool ut_each_shard(const char *path, void (*fn)(const char *file)) {
  struct stat st;
  if (stat(path, &st) != 0) return false;
  if (!S_ISDIR(st.st_mode)) {
    size_t n = strlen(path);
    if (n > 6 && strcmp(path + n - 6, ".shard") == 0) fn(path);
    return true;
  }
  DIR *d = opendir(path);
  if (!d) return false;
  char *names[1024];
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) && n < 1024)
    if (e->d_name[0] != '.') names[n++] = strdup(e->d_name);
  closedir(d);
  qsort(names, (size_t)n, sizeof names[0], ut_cmp_name);
  bool ok = true;
  for (int i = 0; i < n; i++) {
    char full[4096];
    int len = snprintf(full, sizeof full, "%s/%s", path, names[i]);
    ok &= len > 0 && (size_t)len < sizeof full && ut_each_shard(full, fn);
    free(names[i]);
  }
  return ok;
}

#endif
