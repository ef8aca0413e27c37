/* test_stage_layers.c: uneven pipeline stages (`stage_layers`, language.md Steps; issue 19 item 4).
 *
 *   memory   check's resident state per stage against a formula written here: stage s holds
 *            L_s layers' weights (2 x embed x hidden bf16 each), their gradients and adam's moments,
 *            the first stage the embedding and the last the unembedding, each with its own.
 *   sim      the step of an uneven split against a 1f1b and a gpipe step built here by hand: each
 *            stage runs its schedule's list (gpipe: every forward, then every backward; 1f1b: p - s - 1
 *            forwards, then one forward one backward, then the backwards), a forward of stage s
 *            taking L_s f, a backward L_s b (the last stage's forward followed by the loss, l), a
 *            forward waiting for the previous stage's of the same microbatch and a backward for the
 *            next stage's, each transfer d. f, b, l and d are read off the EVEN split's trace (its
 *            forward chunk of 3 layers / 3, and so on), and what surrounds the pipeline (the optimizer,
 *            the accumulators' set-up) is the even split's step less its hand-built pipeline; the
 *            uneven splits' code is then checked against the hand-built schedule. A stage whose
 *            time did not follow its own layers (the region priced at the largest chunk everywhere,
 *            or the even count), or a schedule that waited on the wrong stage, misses by 10-20%.
 *            Each stage's compute also moves by the same amount per layer it gains or loses.
 *   explain  one line per stage with its layers.
 *   run      an uneven split is refused at the list with a located error (run does not execute
 *            uneven stages yet; check, explain and sim do). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "unit_test.h"
#include "cli_test.h"

/* ---- memory ---- */

static const char *LM =
    "import \"targets\"\n"
    "mesh pipe = tpu_v5e[data: 2, stage: 4]\n"
    "dim batch = 32, seq = 16, embed = 64, hidden = 256, vocab = 512, layers = 10\n"
    "layout pp {\n"
    "  layers: stage\n"
    "  batch: data\n"
    "}\n"
    "model block {\n"
    "  param w_in: bf16[embed, hidden]\n"
    "  param w_out: bf16[hidden, embed]\n"
    "  fn forward(x: bf16[batch, seq, embed]) -> bf16[batch, seq, embed] {\n"
    "    return x + gelu(x @ w_in) @ w_out\n"
    "  }\n"
    "}\n"
    "model lm {\n"
    "  param embedding: bf16[vocab, embed]\n"
    "  param blocks: block[layers]\n"
    "  param unembed: bf16[embed, vocab]\n"
    "  fn forward(tokens: i32[batch, seq]) -> f32[batch, seq, vocab] {\n"
    "    let x = take(embedding, tokens)\n"
    "    for b in blocks { x = b.forward(x) }\n"
    "    return f32(x @ unembed)\n"
    "  }\n"
    "}\n"
    "train lm.forward {\n"
    "  loss = cross_entropy\n"
    "  optimizer = adam\n"
    "  remat = full\n"
    "  microbatches = 8\n"
    "  schedule = %s\n"
    "  stage_layers = [%s]\n"
    "}\n";

static void write_lm(const char *path, const char *schedule, const char *layers) {
  char text[4096];
  snprintf(text, sizeof text, LM, schedule, layers);
  cli_write(path, text);
}

static void test_memory(const char *schedule, const int L[4]) {
  char name[160], list[64];
  snprintf(list, sizeof list, "%d, %d, %d, %d", L[0], L[1], L[2], L[3]);
  snprintf(name, sizeof name, "memory per stage by formula, stage_layers = [%s], %s", list, schedule);
  ut_begin(name);
  write_lm("test_stage_layers_lm.shard", schedule, list);
  int rc;
  char *out = cli_shardc(&rc, "check test_stage_layers_lm.shard --format json 2>&1");
  cJSON *j = out ? cJSON_Parse(out) : NULL;
  UT_CHECK(rc == 0 && j, "exit %d: %s", rc, out ? out : "");
  const cJSON *mem = j ? cJSON_GetObjectItem(j, "memory") : NULL;
  const cJSON *ps = mem ? cJSON_GetObjectItem(mem, "per_stage") : NULL;
  UT_CHECK(cJSON_GetArraySize(ps) == 4, "4 stages in memory.per_stage");
  /* per layer: w_in and w_out, embed x hidden each, bf16; the embedding and the unembedding:
   * vocab x embed, bf16, on the first and the last stage alone */
  const double layer = 2.0 * 64 * 256, table = 512.0 * 64;
  double worst = 0;
  for (int s = 0; s < 4 && cJSON_GetArraySize(ps) == 4; s++) {
    const cJSON *rs = cJSON_GetObjectItem(cJSON_GetArrayItem(ps, s), "resident");
    double elems = L[s] * layer + (s == 0 ? table : 0) + (s == 3 ? table : 0);
    char what[64];
    snprintf(what, sizeof what, "stage %d params: elements x 2 B", s);
    ut_near(what, cli_num(rs, "params"), elems * 2, 1e-12);
    snprintf(what, sizeof what, "stage %d grads: bf16", s);
    ut_near(what, cli_num(rs, "grads"), elems * 2, 1e-12);
    snprintf(what, sizeof what, "stage %d moments: m and v, f32", s);
    ut_near(what, cli_num(rs, "moments"), elems * 8, 1e-12);
    worst = fmax(worst, elems * 12);
  }
  /* the device's resident state is the largest stage's */
  ut_near("resident total: the largest stage's", cli_num(cJSON_GetObjectItem(mem, "resident"), "total"), worst, 1e-12);
  cJSON_Delete(j);
  free(out);
  ut_end();
}

/* ---- sim ---- */

static const char *MLP =
    "import \"targets\"\n"
    "mesh pod = tpu_v5e[stage: 4]\n"
    "dim batch = 64, seq = 256, embed = 256, hidden = 32768, layers = 12\n"
    "layout pp {\n"
    "  layers: stage\n"
    "}\n"
    "model block {\n"
    "  param w: bf16[embed, hidden]\n"
    "  param v: bf16[hidden, embed]\n"
    "  fn forward(x: bf16[batch, seq, embed]) -> bf16[batch, seq, embed] {\n"
    "    return (x @ w) @ v\n"
    "  }\n"
    "}\n"
    "model net {\n"
    "  param blocks: block[layers]\n"
    "  fn forward(x: bf16[batch, seq, embed]) -> bf16[batch, seq, embed] {\n"
    "    for b in blocks { x = b.forward(x) }\n"
    "    return x\n"
    "  }\n"
    "}\n"
    "train net.forward {\n"
    "  loss = mse\n"
    "  optimizer = sgd\n"
    "  microbatches = 8\n"
    "}\n";

enum { P = 4, M = 8 };

/* per layer: forward, backward (per microbatch), before the pipeline and after it (per step: the
 * accumulators' set-up, the gradients' cast and the optimizer, on the stage's own rows); the loss;
 * a transfer (s) */
typedef struct Costs { double f, b, h, t, l, d; } Costs;

/* The pipeline's span, hand-built: each stage's list in order, each action waiting for its
 * predecessor on the stage and for its microbatch's action on the neighbouring stage. */
static double hand_pipeline(const int L[P], const Costs *c, bool gpipe) {
  double fend[P][M], bend[P][M];
  int nf[P] = {0}, nb[P] = {0};
  double clock[P];
  for (int s = 0; s < P; s++) clock[s] = L[s] * c->h;
  /* each stage's list: 'F' or 'B' in order */
  char list[P][2 * M];
  for (int s = 0; s < P; s++) {
    int k = 0, w = gpipe ? M : (P - s - 1 < M ? P - s - 1 : M), f = 0, b = 0;
    for (; f < w; f++) list[s][k++] = 'F';
    while (f < M || b < M) {
      if (f < M) list[s][k++] = 'F', f++;
      if (b < M && (!gpipe || f == M)) list[s][k++] = 'B', b++;
    }
  }
  /* round-robin until every stage has run its list (each action runs when its inputs are there) */
  int done = 0, pos[P] = {0};
  for (int guard = 0; done < P * 2 * M && guard < 100000; guard++)
    for (int s = 0; s < P; s++) {
      if (pos[s] == 2 * M) continue;
      if (list[s][pos[s]] == 'F') {
        int i = nf[s];
        if (s > 0 && nf[s - 1] <= i) continue;
        double ready = s > 0 ? fend[s - 1][i] + c->d : 0, t0 = fmax(clock[s], ready);
        fend[s][i] = clock[s] = t0 + L[s] * c->f + (s == P - 1 ? c->l : 0);
        nf[s]++;
      } else {
        int i = nb[s];
        if (s < P - 1 && nb[s + 1] <= i) continue;
        if (nf[s] <= i) continue;
        double ready = s < P - 1 ? bend[s + 1][i] + c->d : fend[s][i], t0 = fmax(clock[s], ready);
        bend[s][i] = clock[s] = t0 + L[s] * c->b;
        nb[s]++;
      }
      pos[s]++, done++;
    }
  double end = 0;
  for (int s = 0; s < P; s++) end = fmax(end, clock[s] + L[s] * c->t);
  return end;
}

static cJSON *sim_json(const char *schedule, const char *layers, const char *trace) {
  int rc;
  char *out = cli_shardc(&rc, "sim test_stage_layers_mlp.shard --ideal --format json --set schedule=%s "
                              "--set 'stage_layers=[%s]'%s%s 2>&1",
                         schedule, layers, trace ? " --trace " : "", trace ? trace : "");
  cJSON *j = out && rc == 0 ? cJSON_Parse(out) : NULL;
  if (!j) ut_fail("sim %s [%s]: exit %d: %s", schedule, layers, rc, out ? out : "");
  free(out);
  return j;
}

/* The even split's trace: the duration (us -> s) of a task whose name starts with `prefix`; with
 * `first_start` the earliest start of such a task on stage 0, with `last_end` the latest end there. */
static double trace_at(const cJSON *tr, const char *prefix, int which) {
  const cJSON *ev = cJSON_IsArray(tr) ? tr : cJSON_GetObjectItem(tr, "traceEvents"), *e;
  double r = which == 1 ? INFINITY : which == 2 ? -INFINITY : NAN;
  cJSON_ArrayForEach(e, ev) {
    const char *n = cli_str(e, "name");
    if (strncmp(n, prefix, strlen(prefix)) != 0 || strcmp(cli_str(e, "ph"), "X")) continue;
    if (which == 0) return cli_num(e, "dur") * 1e-6;
    if (cli_num(e, "pid") != 0) continue;
    double t0 = cli_num(e, "ts") * 1e-6, t1 = t0 + cli_num(e, "dur") * 1e-6;
    r = which == 1 ? fmin(r, t0) : fmax(r, t1);
  }
  return r;
}
static double trace_dur(const cJSON *tr, const char *prefix) { return trace_at(tr, prefix, 0); }

static void test_sim(const char *schedule) {
  char name[128];
  snprintf(name, sizeof name, "sim: uneven stages against a hand-built %s step", schedule);
  ut_begin(name);
  cli_write("test_stage_layers_mlp.shard", MLP);
  cJSON *even = sim_json(schedule, "3, 3, 3, 3", "test_stage_layers_trace.json");
  char *tt = cli_read("test_stage_layers_trace.json");
  cJSON *tr = tt ? cJSON_Parse(tt) : NULL;
  UT_CHECK(even && tr, "the even split's sim and trace");
  if (!even || !tr) {
    cJSON_Delete(even), cJSON_Delete(tr), free(tt);
    ut_end();
    return;
  }
  /* stage 0 of the even split: before its first forward, after its last backward */
  double head = trace_at(tr, "forward chunk", 1), tail = cli_num(even, "step_time_s") - trace_at(tr, "backward chunk", 2);
  Costs c = {trace_dur(tr, "forward chunk") / 3, trace_dur(tr, "backward chunk") / 3, head / 3, tail / 3,
             trace_dur(tr, "last"), trace_dur(tr, "send activation")};
  UT_CHECK(c.f > 0 && c.b > 0 && c.l >= 0 && c.d >= 0, "f %g b %g l %g d %g from the trace", c.f, c.b, c.l, c.d);
  bool gpipe = !strcmp(schedule, "gpipe");
  const int E[P] = {3, 3, 3, 3};
  double around = cli_num(even, "step_time_s") - hand_pipeline(E, &c, gpipe);
  UT_CHECK(fabs(around) < 0.01 * cli_num(even, "step_time_s"), "the hand-built even step: %g s from sim's %g",
           around, cli_num(even, "step_time_s"));
  const cJSON *es = cJSON_GetObjectItem(even, "stages");
  static const int splits[][P] = {{2, 4, 4, 2}, {1, 5, 5, 1}, {6, 2, 2, 2}, {2, 3, 3, 4}};
  for (size_t k = 0; k < sizeof splits / sizeof *splits; k++) {
    const int *L = splits[k];
    char list[64], what[160];
    snprintf(list, sizeof list, "%d, %d, %d, %d", L[0], L[1], L[2], L[3]);
    cJSON *u = sim_json(schedule, list, NULL);
    if (!u) continue;
    double want = hand_pipeline(L, &c, gpipe) + around;
    snprintf(what, sizeof what, "[%s] step: the hand-built %s pipeline + the even split's rest", list, schedule);
    ut_near(what, cli_num(u, "step_time_s"), want, 0.002);
    /* each stage's compute moves by the same amount per layer (its regions, its accumulations and
     * its optimizer update all scale with its layers): the per-layer change is one figure */
    const cJSON *us = cJSON_GetObjectItem(u, "stages");
    double per = NAN;
    for (int s = 0; s < P; s++) {
      double d = cli_num(cJSON_GetArrayItem(us, s), "compute_s") - cli_num(cJSON_GetArrayItem(es, s), "compute_s");
      if (L[s] == 3) {
        snprintf(what, sizeof what, "[%s] stage %d keeps 3 layers: its compute unchanged", list, s);
        ut_near(what, d + 1, 1, 1e-9);
        continue;
      }
      if (isnan(per)) per = d / (L[s] - 3);
      snprintf(what, sizeof what, "[%s] stage %d: compute moves by (L_s - 3) x one layer's", list, s);
      ut_near(what, d, per * (L[s] - 3), 0.005);
    }
    /* one layer's: M microbatches x (f + b) at least (the regions alone) */
    snprintf(what, sizeof what, "[%s] one layer's compute %g s >= M (f + b) = %g s", list, per, M * (c.f + c.b));
    UT_CHECK(per >= M * (c.f + c.b) * 0.999 && per <= M * (c.f + c.b) * 1.2, "%s", what);
    cJSON_Delete(u);
  }
  cJSON_Delete(even), cJSON_Delete(tr), free(tt);
  remove("test_stage_layers_trace.json");
  ut_end();
}

/* ---- explain ---- */

static void test_explain(void) {
  ut_begin("explain: one line per stage with its layers");
  write_lm("test_stage_layers_lm.shard", "1f1b", "2, 3, 4, 1");
  int rc;
  char *out = cli_shardc(&rc, "explain test_stage_layers_lm.shard 2>&1");
  UT_CHECK(rc == 0 && out, "exit %d", rc);
  /* stage s holds the layers from the earlier stages' sum on */
  static const char *const want[] = {"stage 0: 2 layers, 0-1", "stage 1: 3 layers, 2-4", "stage 2: 4 layers, 5-8",
                                     "stage 3: 1 layer, 9"};
  for (int s = 0; s < 4; s++) UT_CHECK(out && strstr(out, want[s]), "'%s' in explain", want[s]);
  UT_CHECK(out && strstr(out, "stage_layers = [2, 3, 4, 1]"), "the list in explain");
  free(out);
  /* interleaved(2): each stage's layers cut into 2 chunks as evenly as they go; chunk c of stage s is
   * the model's chunk c p + s: model chunks of 1, 2, 2, 1 | 1, 1, 2, 0 layers */
  write_lm("test_stage_layers_lm.shard", "interleaved(2)", "2, 3, 4, 1");
  out = cli_shardc(&rc, "explain test_stage_layers_lm.shard 2>&1");
  UT_CHECK(rc == 0 && out, "exit %d: %s", rc, out ? out : "");
  static const char *const il[] = {"stage 0: 2 layers, 0, 6", "stage 1: 3 layers, 1-2, 7", "stage 2: 4 layers, 3-4, 8-9",
                                   "stage 3: 1 layer, 5"};
  for (int s = 0; s < 4; s++) UT_CHECK(out && strstr(out, il[s]), "'%s' in explain: %s", il[s], out ? out : "");
  free(out);
  ut_end();
}

/* ---- run ---- */

static void test_run_refused(void) {
  ut_begin("run: an uneven split is refused at the list, located");
  write_lm("test_stage_layers_lm.shard", "1f1b", "2, 3, 4, 1");
  int rc;
  char *out = cli_shardc(&rc, "run test_stage_layers_lm.shard 2>&1");
  /* the list is on line 31 of the program, at column 3 (the key) */
  UT_CHECK(rc == 1, "exit %d (1: a located error)", rc);
  UT_CHECK(out && strstr(out, "test_stage_layers_lm.shard:31:3: error: run: uneven stages"), "located: %s",
           out ? out : "");
  free(out);
  /* build refuses it the same way */
  write_lm("test_stage_layers_lm.shard", "1f1b", "3, 3, 2, 2");
  out = cli_shardc(&rc, "build test_stage_layers_lm.shard -o test_stage_layers_lm.bin 2>&1");
  UT_CHECK(rc == 1 && out && strstr(out, ":31:3: error: build: uneven stages"), "build refused too: %s", out ? out : "");
  free(out);
  /* equal stages whose chunks are not: interleaved(2) cuts 3 layers as 2 + 1 (sema lets V not divide a
   * stated count); run would deal equal chunks, so it is refused too */
  write_lm("test_stage_layers_lm.shard", "interleaved(2)", "3, 3, 3, 3");
  out = cli_shardc(&rc, "run test_stage_layers_lm.shard -D layers=12 2>&1");
  UT_CHECK(rc == 1 && out && strstr(out, ":31:3: error: run: uneven stages ('stage_layers' deals 12 layers in chunks of 1 to 2"),
           "unequal chunks refused: %s", out ? out : "");
  free(out);
  ut_end();
}

int main(void) {
  static const int a[4] = {1, 3, 4, 2}, b[4] = {4, 2, 2, 2}, c[4] = {3, 2, 3, 2};
  test_memory("1f1b", a);
  test_memory("gpipe", b);
  test_memory("1f1b", c);
  test_sim("1f1b");
  test_sim("gpipe");
  test_explain();
  test_run_refused();
  remove("test_stage_layers_lm.shard");
  remove("test_stage_layers_mlp.shard");
  remove("test_stage_layers_lm.bin");
  return ut_summary();
}
