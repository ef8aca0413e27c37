/* test_waste.c: the warnings about setups that waste the machine (compiler/driver/waste.h), as
 * `check` and `sim` report them: JSON `waste` figures derived here by hand, the fix each offers, the
 * located warning on stderr, and silence on setups that use every axis. Runs the built shardc. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "unit_test.h"
#include "cli_test.h"


/* `shardc CMD FILE ARGS`: stdout returned, stderr in *err (both malloc'd), *rc the exit code. */
static char *shardc(const char *cmd, const char *file, const char *args, int *rc, char **err) {
  char *out = cli_shardc(rc, "%s '%s' %s 2>test_waste.err", cmd, file, args);
  *err = cli_read("test_waste.err");
  return out;
}

static cJSON *waste_of(const char *cmd, const char *file, const char *args, cJSON **whole) {
  char a[512];
  snprintf(a, sizeof a, "--format json %s", args);
  int rc;
  char *err = NULL, *out = shardc(cmd, file, a, &rc, &err);
  cJSON *j = out ? cJSON_Parse(out) : NULL;
  free(out);
  free(err);
  UT_CHECK(rc == 0, "%s %s %s: exit %d", cmd, file, args, rc);
  *whole = j;
  cJSON *w = j ? cJSON_GetObjectItem(j, "waste") : NULL;
  UT_CHECK(cJSON_IsArray(w), "%s: a `waste` array in the JSON", cmd);
  return cJSON_IsArray(w) ? w : NULL;
}

/* One contraction, [batch, seq, embed] x [embed, hidden]: 2 x 64 x 128 x 256 x 1024 FLOPs. With
 * `batch: data` alone, each device computes a half of it, the same on all 4 devices of `model`. */
static const char *LIN =
    "import \"targets\"\n"
    "mesh node = h100[data: 2, model: 4]\n"
    "dim batch = 64, seq = 128, embed = 256, hidden = 1024\n"
    "layout dp {\n"
    "  batch: data\n"
    "}\n"
    "layout dp_all {\n"
    "  batch: (data, model)\n"
    "}\n"
    "model lin {\n"
    "  param w: bf16[embed, hidden]\n"
    "  fn forward(x: bf16[batch, seq, embed]) -> bf16[batch, seq, hidden] {\n"
    "    return x @ w\n"
    "  }\n"
    "}\n";

static void test_replicated_axis(void) {
  ut_begin("replicated axis: share 1, MFU bound 1/|model| = 0.25, fix adds model to the batch rule");
  cli_write("test_waste_lin.shard", LIN);
  cJSON *j;
  cJSON *w = waste_of("check", "test_waste_lin.shard", "--layout dp", &j);
  UT_CHECK(w && cJSON_GetArraySize(w) == 1, "one finding, got %d", w ? cJSON_GetArraySize(w) : -1);
  const cJSON *f = w ? cJSON_GetArrayItem(w, 0) : NULL;
  UT_CHECK(strcmp(cli_str(f, "kind"), "replicated_axis") == 0, "kind %s", cli_str(f, "kind"));
  UT_CHECK(strcmp(cli_str(f, "axis"), "model") == 0, "axis %s", cli_str(f, "axis"));
  /* F = 2*64*128*256*1024 model FLOPs; each device F/2 (data splits batch): bound F / (8 * F/2) */
  ut_near("replicated share", cli_num(f, "replicated_share"), 1.0, 1e-12);
  ut_near("MFU bound = F / (8 devices x F/2)", cli_num(f, "mfu_bound"), 0.25, 1e-12);
  UT_CHECK(strstr(cli_str(f, "fix"), "batch: (data, model)") != NULL, "fix: %s", cli_str(f, "fix"));
  /* the fix checked: each device F/8, nothing replicated, bound F / (8 x F/8) = 1 */
  UT_CHECK(cli_num(f, "fixed_replicated_share") == 0, "fixed share %g", cli_num(f, "fixed_replicated_share"));
  ut_near("fixed MFU bound", cli_num(f, "fixed_mfu_bound"), 1.0, 1e-12);
  ut_near("flops_per_step (the test's F)", cli_num(j, "flops_per_step"), 2.0 * 64 * 128 * 256 * 1024, 1e-12);
  /* the warning in JSON `warnings` too */
  const cJSON *ws = j ? cJSON_GetObjectItem(j, "warnings") : NULL, *e;
  int hits = 0;
  cJSON_ArrayForEach(e, ws) hits += strstr(cli_str(e, "message"), "mesh axis 'model' (4 devices) shards no compute") != NULL;
  UT_CHECK(hits == 1, "one such entry in JSON warnings, got %d", hits);
  cJSON_Delete(j);

  /* text: the summary's warnings section, and a located warning (line 2: the mesh) on stderr */
  int rc;
  char *err = NULL, *out = shardc("check", "test_waste_lin.shard", "--layout dp", &rc, &err);
  UT_CHECK(out && strstr(out, "warnings (setups that waste the machine):") && strstr(out, "MFU cannot exceed 25.0%"),
           "the text summary lists it with its bound");
  UT_CHECK(err && strstr(err, "test_waste_lin.shard:2:") && strstr(err, "shards no compute"),
           "a warning at the mesh's line on stderr: %s", err ? err : "(none)");
  free(out);
  free(err);

  /* sim reports it as well */
  w = waste_of("sim", "test_waste_lin.shard", "--layout dp", &j);
  UT_CHECK(w && cJSON_GetArraySize(w) == 1, "sim: one finding");
  ut_near("sim: MFU bound", cli_num(cJSON_GetArrayItem(w, 0), "mfu_bound"), 0.25, 1e-12);
  cJSON_Delete(j);
  ut_end();
}

static void test_quiet_when_used(void) {
  ut_begin("no finding when every axis splits the work (batch over both; Megatron TP over a node)");
  cJSON *j;
  cJSON *w = waste_of("check", "test_waste_lin.shard", "--layout dp_all", &j);
  UT_CHECK(w && cJSON_GetArraySize(w) == 0, "dp over both axes: no finding, got %d", w ? cJSON_GetArraySize(w) : -1);
  cJSON_Delete(j);
  int rc;
  char *err = NULL, *out = shardc("check", "test_waste_lin.shard", "--layout dp_all", &rc, &err);
  UT_CHECK(out && !strstr(out, "waste the machine"), "no warnings section");
  UT_CHECK(err && !strstr(err, "shards no compute"), "no warning on stderr");
  free(out);
  free(err);
  ut_end();
}

static void test_skipped_rule(void) {
  ut_begin("a skipped batch rule (-D batch=12 on 8 devices): both axes replicated, fix -D batch=16");
  cJSON *j;
  cJSON *w = waste_of("check", "test_waste_lin.shard", "--layout dp_all -D batch=12", &j);
  UT_CHECK(w && cJSON_GetArraySize(w) == 2, "two findings, got %d", w ? cJSON_GetArraySize(w) : -1);
  const cJSON *f;
  cJSON_ArrayForEach(f, w) {
    /* 12 % 8 = 4: the rule is skipped, each device computes all of F: bound F / (8 F) */
    ut_near("replicated share", cli_num(f, "replicated_share"), 1.0, 1e-12);
    ut_near("MFU bound 1/8", cli_num(f, "mfu_bound"), 0.125, 1e-12);
    /* the smallest multiple of 8 above 12 */
    UT_CHECK(strstr(cli_str(f, "fix"), "-D batch=16") != NULL, "fix: %s", cli_str(f, "fix"));
    ut_near("fixed MFU bound", cli_num(f, "fixed_mfu_bound"), 1.0, 1e-12);
  }
  cJSON_Delete(j);
  ut_end();
}

/* Megatron TP (hidden over model) on a mesh whose `model` axis is major: its 2 devices sit in two
 * nodes, 8 apart. Each of the 3 layers all-reduces its [batch/8, seq, embed] bf16 output. */
static const char *TP =
    "import \"targets\"\n"
    "mesh %s\n"
    "dim batch = 64, seq = 128, embed = 256, hidden = 1024, layers = 3\n"
    "layout tp {\n"
    "  batch: data\n"
    "  hidden: model\n"
    "}\n"
    "model lin2 {\n"
    "  param w_in: bf16[embed, hidden]\n"
    "  param w_out: bf16[hidden, embed]\n"
    "  fn forward(x: bf16[batch, seq, embed]) -> bf16[batch, seq, embed] {\n"
    "    return (x @ w_in) @ w_out\n"
    "  }\n"
    "}\n"
    "model net {\n"
    "  param blocks: lin2[layers]\n"
    "  fn forward(x: bf16[batch, seq, embed]) -> bf16[batch, seq, embed] {\n"
    "    for b in blocks { x = b.forward(x) }\n"
    "    return x\n"
    "  }\n"
    "}\n";

static void test_slow_tp(void) {
  ut_begin("tensor parallelism across nodes: 3 all-reduces on the network, fix: the axis made minor");
  char text[2048];
  snprintf(text, sizeof text, TP, "cross = h100[model: 2, data: 8]");
  cli_write("test_waste_tp.shard", text);
  cJSON *j;
  cJSON *w = waste_of("check", "test_waste_tp.shard", "", &j);
  UT_CHECK(w && cJSON_GetArraySize(w) == 1, "one finding, got %d", w ? cJSON_GetArraySize(w) : -1);
  const cJSON *f = w ? cJSON_GetArrayItem(w, 0) : NULL;
  UT_CHECK(strcmp(cli_str(f, "kind"), "slow_tensor_parallelism") == 0, "kind %s", cli_str(f, "kind"));
  UT_CHECK(strcmp(cli_str(f, "axis"), "model") == 0, "axis %s", cli_str(f, "axis"));
  UT_CHECK(cli_num(f, "collectives") == 3, "3 collectives, got %g", cli_num(f, "collectives"));
  /* v = 64/8 x 128 x 256 x 2 bytes. An ideal all-reduce is two phases (reduce-scatter, all-gather),
   * each the larger of its latency and its bytes over bandwidth. Over the network (2 nodes, one
   * device each): v x (2-1)/2 / 50 GB/s = 5.24 us > 3 us latency. */
  double v = 64.0 / 8 * 128 * 256 * 2;
  ut_near("comm_s = 3 x 2 x v/2 / network_bw", cli_num(f, "comm_s"), 3 * 2 * (v / 2 / 5.0e10), 1e-9);
  UT_CHECK(strstr(cli_str(f, "fix"), "--mesh 'h100[data: 8, model: 2]'") != NULL, "fix: %s", cli_str(f, "fix"));
  /* over NVLink: v/2 / 450 GB/s = 0.58 us < 1 us latency: each phase 1 us */
  double ph = fmax(1e-6, v / 2 / 4.5e11);
  ut_near("fixed_comm_s = 3 x 2 x max(latency, v/2 / nvlink_bw)", cli_num(f, "fixed_comm_s"), 3 * 2 * ph, 1e-9);
  cJSON_Delete(j);

  /* the same program on the fixed mesh: no finding */
  snprintf(text, sizeof text, TP, "node = h100[data: 8, model: 2]");
  cli_write("test_waste_tp.shard", text);
  w = waste_of("check", "test_waste_tp.shard", "", &j);
  UT_CHECK(w && cJSON_GetArraySize(w) == 0, "model minor: no finding, got %d", w ? cJSON_GetArraySize(w) : -1);
  cJSON_Delete(j);
  ut_end();
}

int main(void) {
  test_replicated_axis();
  test_quiet_when_used();
  test_skipped_rule();
  test_slow_tp();
  remove("test_waste_lin.shard");
  remove("test_waste_tp.shard");
  remove("test_waste.err");
  return ut_summary();
}
