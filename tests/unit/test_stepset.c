/* test_stepset.c: `--set key=value` as a user meets it. The figures of `sim` and `check` with a key
 * set on the command line equal those of the same program with the key edited in its train block
 * (a copy of the sample written here: the independent path), whether the key replaces a written
 * one or joins the block; a wrong value is a located error in the `--set` text (exit 1, also in
 * the JSON `errors`); what can be told without the program is a usage error (exit 2): no
 * KEY=VALUE, an unknown key (with a did-you-mean), a key given twice with different values, --set
 * with --entry, a program with no train step. Runs the built shardc. */
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

static const char *SAMPLE = SHARDC_SOURCE_DIR "/samples/llama2_13b.shard";

/* The sample with `from` replaced by `to` (once; it must occur), written to path. */
static bool edited_copy(const char *path, const char *from, const char *to) {
  char *s = cli_read(SAMPLE);
  char *at = s ? strstr(s, from) : NULL;
  UT_CHECK(at != NULL, "'%s' is in %s", from, SAMPLE);
  if (!at) {
    free(s);
    return false;
  }
  FILE *f = fopen(path, "w");
  if (!f) return false;
  fprintf(f, "%.*s%s%s", (int)(at - s), s, to, at + strlen(from));
  fclose(f);
  free(s);
  return true;
}

static cJSON *json_of(const char *cmd, const char *file, const char *args, int *rc) {
  char *out = cli_shardc(rc, "%s '%s' --format json %s 2>/dev/null", cmd, file, args);
  cJSON *j = out ? cJSON_Parse(out) : NULL;
  free(out);
  return j;
}

static const cJSON *at(const cJSON *o, const char *a, const char *b, const char *c) {
  const cJSON *x = o ? cJSON_GetObjectItem(o, a) : NULL;
  if (x && b) x = cJSON_GetObjectItem(x, b);
  if (x && c) x = cJSON_GetObjectItem(x, c);
  return x;
}

/* --set KEY=VALUE on the sample against the sample with `from` edited to `to`: sim's step time,
 * compute and MFU, check's memory per device, equal to the last bit. */
static void same_as_edited(const char *set, const char *from, const char *to) {
  char name[160];
  snprintf(name, sizeof name, "--set %s equals the key written in the train block", set);
  ut_begin(name);
  if (!edited_copy("test_stepset_edit.shard", from, to)) {
    ut_end();
    return;
  }
  char args[200];
  snprintf(args, sizeof args, "--set '%s'", set);
  int rc1, rc2, rc3, rc4;
  cJSON *a = json_of("sim", SAMPLE, args, &rc1), *b = json_of("sim", "test_stepset_edit.shard", "", &rc2);
  UT_CHECK(a && b && rc1 == rc2, "sim: both JSON, exits %d and %d", rc1, rc2);
  const char *keys[] = {"step_time_s", "compute_s", "exposed_comm_s", "mfu"};
  for (int i = 0; i < 4; i++) {
    double x = cli_num(a, keys[i]), y = cli_num(b, keys[i]);
    UT_CHECK(isfinite(x) && x == y, "sim %s: %.17g with --set, %.17g edited", keys[i], x, y);
  }
  cJSON *c = json_of("check", SAMPLE, args, &rc3), *d = json_of("check", "test_stepset_edit.shard", "", &rc4);
  UT_CHECK(rc3 == rc4, "check: exits %d and %d", rc3, rc4);
  const char *classes[] = {"params", "grads", "optimizer", "activations", "temporaries", "total"};
  for (int i = 0; i < 6; i++) {
    const cJSON *x = at(c, "memory", "per_device", classes[i]), *y = at(d, "memory", "per_device", classes[i]);
    UT_CHECK(cJSON_IsNumber(x) && cJSON_IsNumber(y) && x->valuedouble == y->valuedouble,
             "check memory.per_device.%s: %.17g with --set, %.17g edited", classes[i],
             cJSON_IsNumber(x) ? x->valuedouble : NAN, cJSON_IsNumber(y) ? y->valuedouble : NAN);
  }
  cJSON_Delete(a), cJSON_Delete(b), cJSON_Delete(c), cJSON_Delete(d);
  ut_end();
}

/* The set key changes the figures at all (else the comparisons above would hold of an ignored
 * --set): remat none keeps activations that full recomputes. */
static void test_set_matters(void) {
  ut_begin("--set remat=none changes what remat = full gives");
  int rc1, rc2;
  cJSON *a = json_of("check", SAMPLE, "", &rc1), *b = json_of("check", SAMPLE, "--set remat=none", &rc2);
  const cJSON *x = at(a, "memory", "per_device", "activations"), *y = at(b, "memory", "per_device", "activations");
  UT_CHECK(cJSON_IsNumber(x) && cJSON_IsNumber(y) && y->valuedouble > x->valuedouble,
           "activations: %.17g written (full), %.17g with --set remat=none: more expected",
           cJSON_IsNumber(x) ? x->valuedouble : NAN, cJSON_IsNumber(y) ? y->valuedouble : NAN);
  cJSON_Delete(a), cJSON_Delete(b);
  ut_end();
}

/* `shardc sim SAMPLE ARGS`: the exit code and whether stderr holds `want`. */
static void expect(const char *what, const char *file, const char *args, int want_rc, const char *want) {
  ut_begin(what);
  int rc;
  char *out = cli_shardc(&rc, "sim '%s' %s 2>test_stepset.err >/dev/null", file, args);
  free(out);
  char *err = cli_read("test_stepset.err");
  UT_CHECK(rc == want_rc, "exit %d, want %d", rc, want_rc);
  UT_CHECK(err && strstr(err, want), "stderr holds '%s': %s", want, err ? err : "(none)");
  free(err);
  ut_end();
}

static void test_json_error(void) {
  ut_begin("a wrong --set value in the JSON errors, located in the --set text");
  int rc;
  cJSON *j = json_of("sim", SAMPLE, "--set remat=bogus", &rc);
  const cJSON *e = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "errors"), 0);
  UT_CHECK(rc == 1, "exit %d, want 1", rc);
  UT_CHECK(strcmp(cli_str(e, "file"), "--set") == 0, "file '%s', want '--set'", cli_str(e, "file"));
  UT_CHECK(cli_num(e, "line") == 1 && cli_num(e, "col") == 7, "at %g:%g, want 1:7 (the value after 'remat=')",
           cli_num(e, "line"), cli_num(e, "col"));
  UT_CHECK(cJSON_GetObjectItem(j, "step_time_s") == NULL, "no figures beside errors");
  cJSON_Delete(j);
  ut_end();
}

int main(void) {
  /* a key written in the block, replaced */
  same_as_edited("remat=none", "remat = full", "remat = none");
  same_as_edited("microbatches=4", "microbatches = 2", "microbatches = 4");
  /* a key the block does not hold, added (with spaces around '=' as a user may quote them) */
  same_as_edited("zero = 1", "lr = 3e-4", "lr = 3e-4\n  zero = 1");
  same_as_edited("tp_overlap=off", "lr = 3e-4", "lr = 3e-4\n  tp_overlap = off");
  test_set_matters();
  test_json_error();
  expect("a wrong value: exit 1, located at the value", SAMPLE, "--set remat=bogus", 1, "--set:1:7: error: 'remat' must be");
  expect("an unknown key: exit 2 with a did-you-mean", SAMPLE, "--set remt=full", 2, "did you mean 'remat'?");
  expect("no '=': exit 2", SAMPLE, "--set remat", 2, "expected KEY=VALUE");
  expect("a value that does not parse: exit 1, located", SAMPLE, "--set 'remat=('", 1, "--set:1:1: error");
  expect("a newline smuggling a second key in: exit 1, located", SAMPLE, "--set 'remat=full\nzero = 1'", 1, "--set:1:1: error");
  expect("a key twice with different values: exit 2", SAMPLE, "--set remat=full --set remat=none", 2, "given twice");
  expect("--set with --entry: exit 2", SAMPLE, "--set remat=full --entry llama.forward", 2, "--entry");
  cli_write("test_stepset_fwd.shard", "import \"targets\"\nmesh m = h100[data: 2]\ndim batch = 8, embed = 16, hidden = 32\n"
                                      "layout dp {\n  batch: data\n}\nmodel lin {\n  param w: f32[embed, hidden]\n"
                                      "  fn forward(x: f32[batch, embed]) -> f32[batch, hidden] {\n    return x @ w\n  }\n}\n");
  expect("a program with no train step: exit 2", "test_stepset_fwd.shard", "--set remat=full", 2, "no train step");
  return ut_summary();
}
