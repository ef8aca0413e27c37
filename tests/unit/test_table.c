/* test_table.c: `check`, `explain` and `sim` with several --layout and --mesh values. Each JSON row
 * must equal the same command run alone with that row's one layout and one mesh (a separate
 * process: the independent path), rows in the order layouts x meshes; a row whose combination is
 * wrong holds its errors and the others their figures; the exit code is the worst row's; --set
 * applies to every row; run and one-layout options (--trace) refuse several. The text table has a
 * line per row, the error in its row. Runs the built shardc on samples/llama3_70b.shard. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "unit_test.h"
#include "cli_test.h"

#ifndef SHARDC_SOURCE_DIR
#define SHARDC_SOURCE_DIR "."
#endif

static const char *SAMPLE = SHARDC_SOURCE_DIR "/samples/llama3_70b.shard";

static cJSON *json_of(int *rc, const char *fmt, const char *cmd, const char *args) {
  char *out = cli_shardc(rc, fmt, cmd, SAMPLE, args);
  cJSON *j = out ? cJSON_Parse(out) : NULL;
  free(out);
  return j;
}

static double path_num(const cJSON *o, const char *a, const char *b, const char *c) {
  const cJSON *x = o ? cJSON_GetObjectItem(o, a) : NULL;
  if (x && b) x = cJSON_GetObjectItem(x, b);
  if (x && c) x = cJSON_GetObjectItem(x, c);
  return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

/* The figure each command's rows are compared by (one number that changes with the layout). */
static double figure(const char *cmd, const cJSON *j) {
  if (strcmp(cmd, "sim") == 0) return cli_num(j, "step_time_s");
  if (strcmp(cmd, "check") == 0) return path_num(j, "memory", "per_device", "total");
  return cJSON_GetArraySize(cJSON_GetObjectItem(j, "collectives")) + path_num(j, "summary", "comm_s", NULL);
}

static const char *LAYOUTS[] = {"fsdp_tp_sp", "fsdp", "dp_tp"};
static const char *MESHES[] = {"h100_512", "h100[data: 32, model: 16]"};

static void test_rows_equal_alone(const char *cmd, const char *set) {
  char name[120];
  snprintf(name, sizeof name, "%s: each row equals %s alone on its layout and mesh%s%s", cmd, cmd, *set ? ", with " : "", set);
  ut_begin(name);
  int rc;
  char args[400];
  snprintf(args, sizeof args, "--layout %s --layout %s --layout %s --mesh %s --mesh '%s' %s", LAYOUTS[0], LAYOUTS[1],
           LAYOUTS[2], MESHES[0], MESHES[1], set);
  cJSON *t = json_of(&rc, "%s '%s' --format json %s 2>/dev/null", cmd, args);
  const cJSON *rows = cJSON_GetObjectItem(t, "rows");
  UT_CHECK(rc == 0 || (strcmp(cmd, "check") == 0 && rc == 1), "exit %d", rc);
  UT_CHECK(cJSON_GetArraySize(rows) == 6, "%d rows, want 3 layouts x 2 meshes", cJSON_GetArraySize(rows));
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 2; k++) {
      const cJSON *row = cJSON_GetArrayItem(rows, i * 2 + k);
      UT_CHECK(strcmp(cli_str(row, "layout"), LAYOUTS[i]) == 0 && strcmp(cli_str(row, "mesh"), MESHES[k]) == 0,
               "row %d is %s on %s, want %s on %s", i * 2 + k, cli_str(row, "layout"), cli_str(row, "mesh"), LAYOUTS[i], MESHES[k]);
      snprintf(args, sizeof args, "--layout %s --mesh '%s' %s", LAYOUTS[i], MESHES[k], set);
      int rc1;
      cJSON *one = json_of(&rc1, "%s '%s' --format json %s 2>/dev/null", cmd, args);
      double a = figure(cmd, row), b = figure(cmd, one);
      UT_CHECK(isfinite(a) && a == b, "%s on %s: %.17g in the table, %.17g alone", LAYOUTS[i], MESHES[k], a, b);
      cJSON_Delete(one);
    }
  if (*set) { /* each row says what --set gave it */
    const cJSON *s0 = cJSON_GetObjectItem(cJSON_GetArrayItem(rows, 0), "set");
    UT_CHECK(strcmp(cli_str(s0, "remat"), "selective") == 0 && strcmp(cli_str(s0, "tp_overlap"), "off") == 0,
             "row 0's set: remat '%s', tp_overlap '%s'", cli_str(s0, "remat"), cli_str(s0, "tp_overlap"));
  }
  /* the rows differ: the comparison above is not of one figure repeated */
  double f0 = figure(cmd, cJSON_GetArrayItem(rows, 0)), f2 = figure(cmd, cJSON_GetArrayItem(rows, 2));
  UT_CHECK(f0 != f2, "fsdp_tp_sp and fsdp give the same figure %.17g", f0);
  cJSON_Delete(t);
  ut_end();
}

static void test_error_row(void) {
  ut_begin("a row with an unknown layout holds its error; the others their figures; exit 2");
  int rc;
  cJSON *t = json_of(&rc, "%s '%s' --format json %s 2>/dev/null", "sim", "--layout fsdp --layout nosuch");
  const cJSON *rows = cJSON_GetObjectItem(t, "rows");
  UT_CHECK(rc == 2, "exit %d, want 2 (a usage error in a row)", rc);
  UT_CHECK(isfinite(cli_num(cJSON_GetArrayItem(rows, 0), "step_time_s")), "row 0 (fsdp) has its step time");
  const cJSON *e = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(rows, 1), "errors"), 0);
  UT_CHECK(strstr(cli_str(e, "message"), "nosuch") != NULL, "row 1's error names the layout: '%s'", cli_str(e, "message"));
  cJSON_Delete(t);
  char *out = cli_shardc(&rc, "sim '%s' --layout fsdp --layout nosuch 2>/dev/null", SAMPLE);
  int lines = 0;
  for (const char *p = out; p && *p; p++) lines += *p == '\n';
  UT_CHECK(lines == 4, "text: %d lines, want a title, a header and 2 rows:\n%s", lines, out ? out : "");
  UT_CHECK(out && strstr(out, "nosuch") && strstr(out, "error:"), "text: the error in its row:\n%s", out ? out : "");
  free(out);
  ut_end();
}

static void test_not_fitting_row(void) {
  ut_begin("check: a row that does not fit makes the exit 1");
  int rc;
  cJSON *t = json_of(&rc, "%s '%s' --format json %s 2>/dev/null", "check", "--layout fsdp --layout dp");
  const cJSON *rows = cJSON_GetObjectItem(t, "rows");
  const cJSON *f0 = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(rows, 0), "memory"), "fits");
  const cJSON *f1 = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(rows, 1), "memory"), "fits");
  UT_CHECK(cJSON_IsTrue(f0) && cJSON_IsFalse(f1), "fsdp fits and dp does not (70B x 16 bytes of adam state per device)");
  UT_CHECK(rc == 1, "exit %d, want 1", rc);
  cJSON_Delete(t);
  ut_end();
}

static void expect_usage(const char *what, const char *cmd, const char *args) {
  ut_begin(what);
  int rc;
  char *out = cli_shardc(&rc, "%s '%s' %s >/dev/null 2>test_table.err", cmd, SAMPLE, args);
  free(out);
  char *err = cli_read("test_table.err");
  UT_CHECK(rc == 2, "exit %d, want 2", rc);
  UT_CHECK(err && strstr(err, "one"), "stderr says why: %s", err ? err : "");
  free(err);
  ut_end();
}

int main(void) {
  test_rows_equal_alone("sim", "");
  test_rows_equal_alone("check", "");
  test_rows_equal_alone("explain", "");
  test_rows_equal_alone("sim", "--set remat=selective --set tp_overlap=off");
  test_error_row();
  test_not_fitting_row();
  expect_usage("run takes one --layout", "run", "--layout fsdp --layout dp");
  expect_usage("--trace with several layouts", "sim", "--layout fsdp --layout dp --trace test_table.json");
  return ut_summary();
}
