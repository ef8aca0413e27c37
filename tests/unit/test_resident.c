/* test_resident.c: `shardc check`'s memory as Megatron reports it: the resident state per device
 * (params, grads, adam's moments, master copies; ZeRO's sharding), figures derived here from the
 * shapes; the peak by class beside it, with the zero gradient explained; the largest buffers named
 * by tensor, dtype and per-device shape, at a path relative to the program or the stdlib. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "unit_test.h"
#include "cli_test.h"


static char *run(const char *args, int *rc) { return cli_shardc(rc, "check %s 2>/dev/null", args); }

/* Two bf16 weights of embed x hidden; hidden over model (4). */
static const char *MLP =
    "import \"targets\"\n"
    "mesh node = h100[data: 2, model: 4]\n"
    "dim batch = 64, seq = 128, embed = 256, hidden = 1024\n"
    "layout tp {\n"
    "  batch: data\n"
    "  hidden: model\n"
    "}\n"
    "model mlp2 {\n"
    "  param w_in: bf16[embed, hidden]\n"
    "  param w_out: bf16[hidden, embed]\n"
    "  fn forward(x: bf16[batch, seq, embed]) -> bf16[batch, seq, embed] {\n"
    "    let h = gelu(x @ w_in)\n"
    "    return h @ w_out\n"
    "  }\n"
    "}\n"
    "train mlp2.forward {\n"
    "  loss = mse\n"
    "  optimizer = adam\n"
    "  master = f32\n"
    "  zero = %d\n"
    "}\n";

static void write_mlp(int zero) {
  FILE *f = fopen("test_resident_mlp.shard", "w");
  if (!f) return;
  fprintf(f, MLP, zero);
  fclose(f);
}

static void test_resident(int zero) {
  char name[128];
  snprintf(name, sizeof name, "resident state by formula, zero = %d", zero);
  ut_begin(name);
  write_mlp(zero);
  int rc;
  char *out = run("test_resident_mlp.shard --format json", &rc);
  cJSON *j = out ? cJSON_Parse(out) : NULL;
  UT_CHECK(rc == 0 && j, "exit %d, JSON", rc);
  const cJSON *mem = j ? cJSON_GetObjectItem(j, "memory") : NULL;
  const cJSON *rs = mem ? cJSON_GetObjectItem(mem, "resident") : NULL;
  UT_CHECK(rs != NULL, "memory.resident");
  /* params: 2 x 256 x 1024 elements; hidden over model: a quarter on each device */
  double elems = 2.0 * 256 * 1024 / 4;
  double zdiv = zero >= 1 ? 2 : 1; /* ZeRO shards over the batch axis, data (2) */
  ut_near("params: elems x 2 B", cli_num(rs, "params"), elems * 2, 1e-12);
  /* grads: bf16, reduced to the param's sharding; zero = 2 reduce-scatters them over data */
  ut_near("grads", cli_num(rs, "grads"), elems * 2 / (zero >= 2 ? 2 : 1), 1e-12);
  ut_near("moments: m and v in f32", cli_num(rs, "moments"), 2 * elems * 4 / zdiv, 1e-12);
  ut_near("master: f32", cli_num(rs, "master"), elems * 4 / zdiv, 1e-12);
  ut_near("total", cli_num(rs, "total"), cli_num(rs, "params") + cli_num(rs, "grads") + cli_num(rs, "moments") + cli_num(rs, "master"), 1e-12);
  /* the peak's optimizer class holds the same moments and master copy */
  const cJSON *pd = mem ? cJSON_GetObjectItem(mem, "per_device") : NULL;
  ut_near("peak optimizer = moments + master", cli_num(pd, "optimizer"), cli_num(rs, "moments") + cli_num(rs, "master"), 1e-12);
  /* the largest buffers: named, typed, per-device shapes, relative paths */
  const cJSON *lg = j ? cJSON_GetObjectItem(j, "largest") : NULL, *b;
  UT_CHECK(cJSON_GetArraySize(lg) > 0, "largest buffers listed");
  cJSON_ArrayForEach(b, lg) {
    UT_CHECK(*cli_str(b, "tensor") && *cli_str(b, "dtype") && cli_str(b, "shape")[0] == '[', "tensor, dtype, shape: %s",
             cli_str(b, "what"));
    UT_CHECK(!strstr(cli_str(b, "what"), "'s result"), "never \"the op's result\": %s", cli_str(b, "what"));
    UT_CHECK(cli_str(b, "where")[0] != '/', "a relative path: %s", cli_str(b, "where"));
  }
  /* the first: [batch 32, seq 128, embed 256] in f32 = 32 x 128 x 256 x 4 = 4,194,304 B (the mse's
   * f32 difference, batch split over data) */
  const cJSON *b0 = cJSON_GetArrayItem(lg, 0);
  UT_CHECK(strcmp(cli_str(b0, "shape"), "[batch 32, seq 128, embed 256]") == 0 && strcmp(cli_str(b0, "dtype"), "f32") == 0,
           "largest: %s", cli_str(b0, "what"));
  ut_near("its bytes", cli_num(b0, "bytes"), 32.0 * 128 * 256 * 4, 1e-12);
  cJSON_Delete(j);
  free(out);

  /* text: both tables, and the zero gradient at the peak said why */
  out = run("test_resident_mlp.shard", &rc);
  UT_CHECK(out && strstr(out, "resident state per device (held between steps):"), "the resident table");
  UT_CHECK(out && strstr(out, "peak memory per device, by class"), "the peak table");
  UT_CHECK(out && strstr(out, "no gradient is live at the peak"), "grads 0 B explained");
  UT_CHECK(out && strstr(out, "f32 ") && strstr(out, "[batch 32, seq 128, embed 256] at test_resident_mlp.shard:"),
           "largest named with its shape and relative path");
  free(out);
  ut_end();
}

static void test_stdlib_path(void) {
  ut_begin("a stdlib model's buffers at models/NAME.shard:LINE, not an absolute path");
  int rc;
  char *out = run("'" SHARDC_SOURCE_DIR "/samples/llama3_8b.shard' -D layers=2", &rc);
  UT_CHECK(out && strstr(out, " at models/llama.shard:"), "models/llama.shard:LINE in:\n%s", out ? out : "");
  const char *lg = out ? strstr(out, "largest buffers per device at the peak:") : NULL;
  UT_CHECK(lg && !strstr(lg, " at /"), "no absolute path among the largest buffers");
  free(out);
  ut_end();
}

/* Under a pipeline each stage holds its own layers: samples/llama3_405b_pp.shard, 126 layers over 14
 * stages (9 each), heads, kv_heads, hidden and vocab over model (8), zero = 1 over data (128). Per
 * layer per device: bf16 matrices (2 E E + 2 E kv_dim + 3 E H) / 8 and two f32 norms of E; the first
 * stage adds the bf16 embedding V E / 8, the last the bf16 unembedding V E / 8 and the final f32 norm. */
static void test_pipeline_stages(void) {
  ut_begin("resident state per pipeline stage by formula (llama3_405b_pp)");
  int rc;
  char *out = run("'" SHARDC_SOURCE_DIR "/samples/llama3_405b_pp.shard' --format json", &rc);
  cJSON *j = out ? cJSON_Parse(out) : NULL;
  UT_CHECK(rc == 0 && j, "exit %d, JSON", rc);
  const cJSON *mem = j ? cJSON_GetObjectItem(j, "memory") : NULL, *st = mem ? cJSON_GetObjectItem(mem, "per_stage") : NULL;
  UT_CHECK(cJSON_GetArraySize(st) == 14, "14 stages, got %d", cJSON_GetArraySize(st));
  const double E = 16384, H = 53248, KV = 8 * 128, V = 128256, D = 128;
  const double mat = 9 * (2 * E * E + 2 * E * KV + 3 * E * H) / 8, norms = 9 * 2 * E; /* elements per device */
  double worst = 0;
  for (int s = 0; s < cJSON_GetArraySize(st); s++) {
    const cJSON *e = cJSON_GetArrayItem(st, s), *rs = cJSON_GetObjectItem(e, "resident");
    double m = mat + (s == 0 || s == 13 ? V * E / 8 : 0), f32 = norms + (s == 13 ? E : 0);
    char what[96];
    snprintf(what, sizeof what, "stage %d params: bf16 matrices + f32 norms", s);
    ut_near(what, cli_num(rs, "params"), m * 2 + f32 * 4, 1e-12);
    snprintf(what, sizeof what, "stage %d grads: reduced over data (128)", s);
    ut_near(what, cli_num(rs, "grads"), (m * 2 + f32 * 4) / D, 1e-12);
    snprintf(what, sizeof what, "stage %d moments: 2 x f32, sharded over data", s);
    ut_near(what, cli_num(rs, "moments"), 2 * 4 * (m + f32) / D, 1e-12);
    snprintf(what, sizeof what, "stage %d master: f32 of the bf16 params, over data", s);
    ut_near(what, cli_num(rs, "master"), 4 * m / D, 1e-12);
    /* the buffer plan's peak (walked independently) holds the same params and optimizer state */
    snprintf(what, sizeof what, "stage %d resident params = its peak's params", s);
    ut_near(what, cli_num(rs, "params"), cli_num(e, "params"), 1e-12);
    snprintf(what, sizeof what, "stage %d moments + master = its peak's optimizer", s);
    ut_near(what, cli_num(rs, "moments") + cli_num(rs, "master"), cli_num(e, "optimizer"), 1e-12);
    if (cli_num(rs, "total") > worst) worst = cli_num(rs, "total");
  }
  ut_near("the device's resident total: the largest stage's", cli_num(cJSON_GetObjectItem(mem, "resident"), "total"), worst, 1e-12);
  cJSON_Delete(j);
  free(out);
  out = run("'" SHARDC_SOURCE_DIR "/samples/llama3_405b_pp.shard'", &rc);
  UT_CHECK(out && strstr(out, "resident state per pipeline stage (each device of the stage, between steps):"),
           "the per-stage resident table in the text");
  free(out);
  ut_end();
}

/* zero over the flattened, padded params (issue 19): data (3) divides neither embed (256) nor
 * hidden (1024), so each device keeps ceil(n / 3) of its block's n elements of state (Megatron's
 * distributed optimizer pads the flat buffer to a multiple of 3); the MLP of MLP on 3 x 4. */
static void test_flat_zero(int zero) {
  char name[128];
  snprintf(name, sizeof name, "resident state by formula, zero = %d over the flattened, padded params", zero);
  ut_begin(name);
  FILE *f = fopen("test_resident_flat.shard", "w");
  if (f) {
    char *src = malloc(strlen(MLP) + 64);
    if (src) {
      snprintf(src, strlen(MLP) + 64, MLP, zero);
      char *d = strstr(src, "data: 2"), *b = strstr(src, "batch = 64");
      if (d) d[6] = '3';
      if (b) memcpy(b, "batch = 48", 10);
      fputs(src, f);
      free(src);
    }
    fclose(f);
  }
  int rc;
  char *out = run("test_resident_flat.shard --format json", &rc);
  cJSON *j = out ? cJSON_Parse(out) : NULL;
  UT_CHECK(rc == 0 && j, "exit %d, JSON", rc);
  const cJSON *mem = j ? cJSON_GetObjectItem(j, "memory") : NULL;
  const cJSON *rs = mem ? cJSON_GetObjectItem(mem, "resident") : NULL;
  UT_CHECK(rs != NULL, "memory.resident");
  /* each weight's block: 256 x 1024 / 4 = 65536 elements; ceil(65536 / 3) = 21846 (65538 padded) */
  double block = 256.0 * 1024 / 4, shard = 21846;
  ut_near("params: whole blocks, bf16", cli_num(rs, "params"), 2 * block * 2, 1e-12);
  ut_near("grads: bf16, zero = 2 the flat shard", cli_num(rs, "grads"), 2 * (zero >= 2 ? shard : block) * 2, 1e-12);
  ut_near("moments: 2 x f32 per flat element", cli_num(rs, "moments"), 2 * shard * 8, 1e-12);
  ut_near("master: f32 per flat element", cli_num(rs, "master"), 2 * shard * 4, 1e-12);
  const cJSON *pd = mem ? cJSON_GetObjectItem(mem, "per_device") : NULL;
  ut_near("peak optimizer = moments + master", cli_num(pd, "optimizer"), cli_num(rs, "moments") + cli_num(rs, "master"), 1e-12);
  cJSON_Delete(j);
  free(out);
  /* explain says which params, why and how many elements, and what the IR does instead */
  out = cli_shardc(&rc, "explain test_resident_flat.shard 2>/dev/null");
  UT_CHECK(out && strstr(out, "over the flattened, padded params") && strstr(out, "65536 -> 21846, padded by 2") &&
               strstr(out, "divide no dim of 2 params"),
           "explain's line:\n%s", out ? out : "");
  free(out);
  remove("test_resident_flat.shard");
  ut_end();
}

/* zero = 2 under a pipeline (issue 19): two stacked bf16 blocks of embed x hidden per stage (layers 4
 * over stage 2), hidden over model (2); each stage reduce-scatters its gradients over data (2)
 * after the last microbatch, and its moments and master copies are sharded over data too. */
static const char *PIPE_MLP =
    "import \"targets\"\n"
    "mesh node = h100[stage: 2, data: 2, model: 2]\n"
    "dim batch = 64, seq = 128, embed = 256, hidden = 1024, layers = 4\n"
    "layout pp {\n"
    "  layers: stage\n"
    "  batch: data\n"
    "  hidden: model\n"
    "}\n"
    "model blk {\n"
    "  param w_in: bf16[embed, hidden]\n"
    "  param w_out: bf16[hidden, embed]\n"
    "  fn forward(x: bf16[batch, seq, embed]) -> bf16[batch, seq, embed] {\n"
    "    return gelu(x @ w_in) @ w_out\n"
    "  }\n"
    "}\n"
    "model net {\n"
    "  param blocks: blk[layers]\n"
    "  fn forward(x: bf16[batch, seq, embed]) -> bf16[batch, seq, embed] {\n"
    "    for b in blocks { x = b.forward(x) }\n"
    "    return x\n"
    "  }\n"
    "}\n"
    "train net.forward {\n"
    "  loss = mse\n"
    "  optimizer = adam\n"
    "  master = f32\n"
    "  microbatches = 2\n"
    "  zero = 2\n"
    "}\n";

static void test_pipeline_zero2(void) {
  ut_begin("resident state by formula, zero = 2 under a pipeline");
  FILE *f = fopen("test_resident_pipe.shard", "w");
  if (f) fputs(PIPE_MLP, f), fclose(f);
  int rc;
  char *out = run("test_resident_pipe.shard --format json", &rc);
  cJSON *j = out ? cJSON_Parse(out) : NULL;
  UT_CHECK(rc == 0 && j, "exit %d, JSON", rc);
  const cJSON *mem = j ? cJSON_GetObjectItem(j, "memory") : NULL;
  const cJSON *rs = mem ? cJSON_GetObjectItem(mem, "resident") : NULL;
  UT_CHECK(rs != NULL, "memory.resident");
  /* per device: 2 layers x 2 weights x 256 x 1024 elements, a half of each over model */
  double elems = 2.0 * 2 * 256 * 1024 / 2, dp = 2;
  ut_near("params: elems x 2 B", cli_num(rs, "params"), elems * 2, 1e-12);
  ut_near("grads: bf16, reduce-scattered over data", cli_num(rs, "grads"), elems * 2 / dp, 1e-12);
  ut_near("moments: 8 B per element over data", cli_num(rs, "moments"), elems * 8 / dp, 1e-12);
  ut_near("master: 4 B per element over data", cli_num(rs, "master"), elems * 4 / dp, 1e-12);
  cJSON_Delete(j);
  free(out);
  remove("test_resident_pipe.shard");
  ut_end();
}

int main(void) {
  for (int z = 0; z <= 2; z += 2) test_resident(z);
  test_pipeline_stages();
  test_pipeline_zero2();
  for (int z = 1; z <= 2; z++) test_flat_zero(z);
  test_stdlib_path();
  remove("test_resident_mlp.shard");
  return ut_summary();
}
