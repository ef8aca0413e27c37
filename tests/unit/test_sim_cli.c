/* test_sim_cli.c: `shardc sim` as a user runs it: the JSON report (language.md's fixed keys, valid
 * JSON, `errors` when the program is wrong, `fits: false` with a warning when it does not fit), the
 * Chrome trace (valid JSON, one track per stream of each simulated device, slices named after the
 * op and its source line, nested inside a pipeline region), and --tokens / --mfu (the book's
 * time-to-train arithmetic), and the one line sim and explain give when a plan the layout forbids
 * would be cheaper (language.md, Layouts: the time it would save and the rule that states it).
 * Runs the built shardc (SHARDC_BIN) on small programs written here and on
 * tests/unit/bind/newcomer_tp.shard. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "unit_test.h"
#include "cli_test.h"

#ifndef SHARDC_SOURCE_DIR
#define SHARDC_SOURCE_DIR "."
#endif

/* Runs `shardc sim FILE ARGS` (stderr discarded); returns its stdout parsed, *rc its exit code. */
static cJSON *sim_json(const char *file, const char *args, int *rc, char **raw) {
  char *out = cli_shardc(rc, "sim '%s' %s 2>/dev/null", file, args);
  cJSON *j = out ? cJSON_Parse(out) : NULL;
  if (raw) *raw = out;
  else free(out);
  return j;
}

static cJSON *read_json(const char *path) {
  char *s = cli_read(path);
  cJSON *j = s ? cJSON_Parse(s) : NULL;
  free(s);
  return j;
}

/* A small data + tensor parallel MLP (two layers) on 8 H100s. */
static const char *MLP =
    "import \"targets\"\n"
    "import \"layers\"\n"
    "mesh node = h100[data: 2, model: 4]\n"
    "dim batch = 64, seq = 512, embed = 2048, hidden = 8192, layers = 2\n"
    "layout dp_tp {\n"
    "  batch: data\n"
    "  hidden: model\n"
    "}\n"
    "model net {\n"
    "  param blocks: mlp[layers]\n"
    "  fn forward(x: bf16[batch, seq, embed]) -> bf16[batch, seq, embed] {\n"
    "    for b in blocks { x = b.forward(x) }\n"
    "    return x\n"
    "  }\n"
    "}\n"
    "train net.forward {\n"
    "  loss = mse\n"
    "  optimizer = adam\n"
    "}\n";

static void test_json_keys(void) {
  ut_begin("sim --format json: one valid object with the fixed keys, consistent with each other");
  cli_write("test_sim_cli_mlp.shard", MLP);
  int rc;
  cJSON *j = sim_json("test_sim_cli_mlp.shard", "--format json", &rc, NULL);
  UT_CHECK(rc == 0, "exit %d", rc);
  UT_CHECK(j != NULL, "the output is one JSON object");
  if (j) {
    static const char *const keys[] = {"step_time_s", "compute_s", "comm_s", "exposed_comm_s", "mfu", "tokens_per_s"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
      UT_CHECK(cli_num(j, keys[i]) >= 0, "key %s: a number >= 0", keys[i]);
    UT_CHECK(cJSON_IsBool(cJSON_GetObjectItem(j, "fits")), "fits: a boolean");
    UT_CHECK(cJSON_GetObjectItem(j, "errors") == NULL, "no errors key");
    double step = cli_num(j, "step_time_s");
    /* compute + exposed + bubble + idle = step; exposed <= comm; MFU from its own definition */
    ut_near("compute + exposed + bubble + idle = step",
            cli_num(j, "compute_s") + cli_num(j, "exposed_comm_s") + cli_num(j, "bubble_s") + cli_num(j, "idle_s"), step, 1e-9);
    UT_CHECK(cli_num(j, "exposed_comm_s") <= cli_num(j, "comm_s") + 1e-12, "exposed <= comm");
    ut_near("mfu = model FLOPs / (step x devices x peak)", cli_num(j, "mfu"),
            cli_num(j, "model_flops_per_step") / (step * 8 * 9.9e14), 1e-9);
    /* tokens: batch x seq = 32768 (mse labels have the output's type: every row is a token) */
    ut_near("tokens_per_s = batch x seq / step", cli_num(j, "tokens_per_s"), 64.0 * 512 / step, 1e-9);
  }
  cJSON_Delete(j);
  int rc2;
  cJSON *k = sim_json("test_sim_cli_mlp.shard", "--format json --ideal", &rc2, NULL);
  UT_CHECK(k && cJSON_IsTrue(cJSON_GetObjectItem(k, "ideal")), "--ideal says so");
  if (j && k) UT_CHECK(cli_num(k, "step_time_s") > 0, "an ideal step");
  cJSON_Delete(k);
  ut_end();
}

static void test_json_errors(void) {
  ut_begin("sim --format json on a wrong program: exit 1, one object with located errors and no figures");
  cli_write("test_sim_cli_err.shard",
             "import \"targets\"\n"
             "mesh one = h100[x: 1]\n"
             "dim a = 4, b = 8\n"
             "model m {\n"
             "  fn forward(x: bf16[a, b]) -> bf16[a, b] {\n"
             "    return x @ y\n"
             "  }\n"
             "}\n");
  int rc;
  cJSON *j = sim_json("test_sim_cli_err.shard", "--format json", &rc, NULL);
  UT_CHECK(rc == 1, "exit 1, got %d", rc);
  const cJSON *errs = j ? cJSON_GetObjectItem(j, "errors") : NULL;
  UT_CHECK(cJSON_IsArray(errs) && cJSON_GetArraySize(errs) >= 1, "an errors array");
  const cJSON *e = errs ? cJSON_GetArrayItem(errs, 0) : NULL;
  if (e) {
    UT_CHECK(cli_num(e, "line") == 6, "the error's line 6, got %g", cli_num(e, "line"));
    UT_CHECK(cli_num(e, "col") > 0, "a column");
    const cJSON *f = cJSON_GetObjectItem(e, "file"), *m = cJSON_GetObjectItem(e, "message");
    UT_CHECK(cJSON_IsString(f) && strstr(f->valuestring, "test_sim_cli_err.shard"), "its file");
    UT_CHECK(cJSON_IsString(m) && m->valuestring[0], "a message");
  }
  UT_CHECK(j && !cJSON_GetObjectItem(j, "step_time_s"), "no figures");
  cJSON_Delete(j);
  /* a usage error (an unknown mesh) is one object too, exit 2 */
  cJSON *u = sim_json("test_sim_cli_err.shard", "--format json --mesh nope", &rc, NULL);
  UT_CHECK(rc == 2, "an unknown mesh: exit 2, got %d", rc);
  UT_CHECK(u && cJSON_IsArray(cJSON_GetObjectItem(u, "errors")), "an unknown mesh: an errors array");
  cJSON_Delete(u);
  ut_end();
}

static void test_no_fit(void) {
  ut_begin("a program that does not fit is simulated: fits false, a warning, exit 0");
  /* 4 x 2^30 bf16 params of 8 GB each, adam: 16 bytes per param = 68.7 GB on one device, plus
   * activations; a v5e has 16 GB */
  cli_write("test_sim_cli_big.shard",
             "import \"targets\"\n"
             "mesh one = tpu_v5e[x: 1]\n"
             "dim batch = 8, embed = 32768, e2 = embed, layers = 4\n"
             "model lin {\n"
             "  param w: bf16[embed, e2]\n"
             "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] {\n"
             "    return (x @ w)[e2 -> embed]\n"
             "  }\n"
             "}\n"
             "model net {\n"
             "  param blocks: lin[layers]\n"
             "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] {\n"
             "    for b in blocks { x = b.forward(x) }\n"
             "    return x\n"
             "  }\n"
             "}\n"
             "train net.forward {\n"
             "  loss = mse\n"
             "  optimizer = adam\n"
             "}\n");
  int rc;
  cJSON *j = sim_json("test_sim_cli_big.shard", "--format json", &rc, NULL);
  UT_CHECK(rc == 0, "exit 0, got %d", rc);
  UT_CHECK(j && cJSON_IsFalse(cJSON_GetObjectItem(j, "fits")), "fits: false");
  UT_CHECK(j && cli_num(j, "step_time_s") > 0, "a step time");
  const cJSON *w = j ? cJSON_GetObjectItem(j, "warnings") : NULL, *x;
  bool said = false;
  cJSON_ArrayForEach(x, w) {
    const cJSON *m = cJSON_GetObjectItem(x, "message");
    said |= cJSON_IsString(m) && strstr(m->valuestring, "does not fit") != NULL;
  }
  UT_CHECK(said, "a 'does not fit' warning among the warnings");
  cJSON_Delete(j);
  ut_end();
}

/* The trace of a pipelined program: 2 stages, each a process with compute and p2p threads; the
 * regions on compute, the sends on p2p, the first microbatch's ops nested inside its regions. */
static const char *PIPE =
    "import \"targets\"\n"
    "import \"layers\"\n"
    "mesh pod = tpu_v5e[stage: 2]\n"
    "dim batch = 16, seq = 128, embed = 512, hidden = 2048, layers = 4\n"
    "layout pp {\n"
    "  layers: stage\n"
    "}\n"
    "model net {\n"
    "  param blocks: mlp[layers]\n"
    "  fn forward(x: bf16[batch, seq, embed]) -> bf16[batch, seq, embed] {\n"
    "    for b in blocks { x = b.forward(x) }\n"
    "    return x\n"
    "  }\n"
    "}\n"
    "train net.forward {\n"
    "  loss = mse\n"
    "  optimizer = sgd\n"
    "  microbatches = 4\n"
    "}\n";

static void test_trace(void) {
  ut_begin("sim --trace: valid Chrome trace JSON, a track per stream, named slices nested in regions");
  cli_write("test_sim_cli_pipe.shard", PIPE);
  remove("test_sim_cli_trace.json");
  int rc;
  char *raw = NULL;
  cJSON *j = sim_json("test_sim_cli_pipe.shard", "--format json --trace test_sim_cli_trace.json", &rc, &raw);
  UT_CHECK(rc == 0, "exit %d", rc);
  double step = j ? cli_num(j, "step_time_s") : NAN;
  cJSON_Delete(j);
  free(raw);
  cJSON *t = read_json("test_sim_cli_trace.json");
  UT_CHECK(t != NULL, "the trace is valid JSON");
  const cJSON *ev = t ? cJSON_GetObjectItem(t, "traceEvents") : NULL, *e;
  UT_CHECK(cJSON_IsArray(ev), "traceEvents");
  int procs = 0, compute = 0, p2p = 0, regions = 0, sends = 0, nested = 0, located = 0;
  double last_end = 0;
  cJSON_ArrayForEach(e, ev) {
    const char *ph = cJSON_GetObjectItem(e, "ph")->valuestring, *name = cJSON_GetObjectItem(e, "name")->valuestring;
    if (strcmp(ph, "M") == 0) {
      const cJSON *a = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "name");
      if (strcmp(name, "process_name") == 0) procs++;
      if (strcmp(name, "thread_name") == 0 && a) {
        compute += strcmp(a->valuestring, "compute") == 0;
        p2p += strcmp(a->valuestring, "p2p") == 0;
      }
      continue;
    }
    if (strcmp(ph, "C") == 0) continue; /* the memory counters (test_trace_memory) */
    UT_CHECK(strcmp(ph, "X") == 0, "complete events only (and counters)");
    double ts = cli_num(e, "ts"), dur = cli_num(e, "dur");
    UT_CHECK(ts >= 0 && dur >= 0, "%s: ts %g, dur %g", name, ts, dur);
    if (ts + dur > last_end) last_end = ts + dur;
    regions += strstr(name, "forward chunk") != NULL || strstr(name, "backward chunk") != NULL;
    sends += strncmp(name, "send ", 5) == 0;
    nested += strncmp(name, "contract", 8) == 0;
    located += strstr(name, "(test_sim_cli_pipe.shard:") != NULL || strstr(name, "(layers.shard:") != NULL;
  }
  UT_CHECK(procs == 2, "two processes (stages), got %d", procs);
  UT_CHECK(compute == 2 && p2p == 2, "a compute and a p2p thread per stage, got %d and %d", compute, p2p);
  /* 4 microbatches x (forward + backward) x 2 stages; 4 activations sent forward and 4
   * gradients back */
  UT_CHECK(regions == 16, "16 chunk regions, got %d", regions);
  UT_CHECK(sends == 8, "8 sends, got %d", sends);
  /* the first microbatch's regions on each stage: 2 contractions forward, 4 backward per layer,
   * 2 layers per stage: (2 + 4) x 2 x 2 stages = 24 at least */
  UT_CHECK(nested >= 24, "the first microbatch's contractions nested in their regions, got %d", nested);
  UT_CHECK(located > 0, "slices named with their source line");
  ut_near("the trace ends at the step time", last_end * 1e-6, step, 1e-6);
  cJSON_Delete(t);
  ut_end();
}

/* The book: LLaMA-3 70B on 15T tokens is 6 N D = 6.3e24 FLOPs, about 44 days on 8960 v5p at 40%
 * MFU. sim's days are the program's model FLOPs per token x N / (devices x peak x MFU): with
 * --mfu 0.4 the same arithmetic with the program's own count (6 N plus attention's 12 L H Q T,
 * which the book's 6 N D leaves out). */
static void test_tokens(void) {
  ut_begin("--tokens N --mfu R: days = model FLOPs per token x N / (devices x peak x R)");
  cli_write("test_sim_cli_mlp.shard", MLP);
  int rc;
  cJSON *j = sim_json("test_sim_cli_mlp.shard", "--format json --tokens 1.5e13 --mfu 0.4", &rc, NULL);
  const cJSON *tr = j ? cJSON_GetObjectItem(j, "train") : NULL;
  UT_CHECK(tr != NULL, "a train object");
  if (tr) {
    double per_token = cli_num(j, "model_flops_per_step") / cli_num(j, "tokens_per_step");
    ut_near("days", cli_num(tr, "days"), per_token * 1.5e13 / (8 * 9.9e14 * 0.4) / 86400, 1e-9);
  }
  cJSON_Delete(j);
  /* without --mfu: tokens / tokens_per_s */
  j = sim_json("test_sim_cli_mlp.shard", "--format json --tokens 1e9", &rc, NULL);
  tr = j ? cJSON_GetObjectItem(j, "train") : NULL;
  if (tr) ut_near("days at the simulated rate", cli_num(tr, "days"), 1e9 / cli_num(j, "tokens_per_s") / 86400, 1e-9);
  else ut_fail("a train object without --mfu");
  cJSON_Delete(j);
  ut_end();
}

/* sim's per-phase breakdown (sim.h's sim_phases) on MLP: per device, the forward is 2 layers x 2
 * contractions x 2 x batch x seq x embed x hidden / 8 devices FLOPs, the backward twice that (the
 * language's count); the phases' times add up to compute + exposed communication. */
static void test_phases(void) {
  ut_begin("sim phases: forward/backward FLOPs by formula, times adding up to compute + exposed");
  cli_write("test_sim_cli_mlp.shard", MLP);
  int rc;
  char *raw = NULL;
  cJSON *j = sim_json("test_sim_cli_mlp.shard", "--format json", &rc, &raw);
  free(raw);
  const cJSON *ph = j ? cJSON_GetObjectItem(j, "phases") : NULL, *e;
  UT_CHECK(cJSON_GetArraySize(ph) == 5, "5 phases, got %d", cJSON_GetArraySize(ph));
  static const char *const names[] = {"forward", "backward", "optimizer", "gradient reduction", "pipeline transfers"};
  double t = 0, c = 0, comm = 0, ex = 0, fl = 0;
  int i = 0;
  cJSON_ArrayForEach(e, ph) {
    const cJSON *n = cJSON_GetObjectItem(e, "phase");
    UT_CHECK(i < 5 && cJSON_IsString(n) && strcmp(n->valuestring, names[i]) == 0, "phase %d: %s", i,
             cJSON_IsString(n) ? n->valuestring : "?");
    t += cli_num(e, "time_s"), c += cli_num(e, "compute_s"), comm += cli_num(e, "comm_s"), ex += cli_num(e, "exposed_comm_s");
    fl += cli_num(e, "flops");
    if (cli_num(e, "time_s") > 0) ut_near("flops_per_s = flops / time_s", cli_num(e, "flops_per_s"), cli_num(e, "flops") / cli_num(e, "time_s"), 1e-9);
    i++;
  }
  double fwd = 2.0 * 2 * 2 * 64 * 512 * 2048 * 8192 / 8;
  ut_near("forward FLOPs per device", cli_num(cJSON_GetArrayItem(ph, 0), "flops"), fwd, 1e-9);
  ut_near("backward FLOPs per device = 2 x forward", cli_num(cJSON_GetArrayItem(ph, 1), "flops"), 2 * fwd, 1e-9);
  UT_CHECK(cli_num(cJSON_GetArrayItem(ph, 2), "compute_s") > 0, "the optimizer takes time");
  UT_CHECK(cli_num(cJSON_GetArrayItem(ph, 3), "comm_s") > 0 && cli_num(cJSON_GetArrayItem(ph, 3), "compute_s") == 0,
           "gradient reduction: communication only (data-parallel gradients)");
  ut_near("phases' time = compute + exposed", t, cli_num(j, "compute_s") + cli_num(j, "exposed_comm_s"), 1e-9);
  ut_near("phases' compute = compute_s", c, cli_num(j, "compute_s"), 1e-9);
  ut_near("phases' comm = comm_s", comm, cli_num(j, "comm_s"), 1e-9);
  ut_near("phases' exposed = exposed_comm_s", ex, cli_num(j, "exposed_comm_s"), 1e-9);
  ut_near("phases' FLOPs x 8 devices = flops_per_step", fl * 8, cli_num(j, "flops_per_step"), 1e-9);
  cJSON_Delete(j);
  /* the text report prints the same table */
  FILE *p = popen("'" SHARDC_BIN "' sim test_sim_cli_mlp.shard 2>/dev/null", "r");
  char *out = p ? cli_slurp(p) : NULL;
  if (p) pclose(p);
  UT_CHECK(out && strstr(out, "per phase (per device") && strstr(out, "  gradient reduction "), "text: the per-phase table");
  free(out);
  ut_end();
}

/* The trace's collectives carry bytes, link class and axes; flow events go from a collective to the
 * compute task waiting for it. MLP: layer l's output all-reduce over model moves the partial
 * [batch/2, seq, embed] bf16 = 32 x 512 x 2048 x 2 bytes per device, over NVLink (one node). */
static void test_trace_args(void) {
  ut_begin("sim --trace: collectives' bytes, link and axes; flows from collective to waiting op");
  cli_write("test_sim_cli_mlp.shard", MLP);
  remove("test_sim_cli_trace.json");
  int rc;
  cJSON *j = sim_json("test_sim_cli_mlp.shard", "--format json --trace test_sim_cli_trace.json", &rc, NULL);
  cJSON_Delete(j);
  cJSON *t = read_json("test_sim_cli_trace.json");
  const cJSON *ev = t ? cJSON_GetObjectItem(t, "traceEvents") : NULL, *e;
  int ar = 0, with_args = 0, colls = 0, starts = 0, ends = 0, bad = 0;
  cJSON_ArrayForEach(e, ev) {
    const cJSON *ph = cJSON_GetObjectItem(e, "ph"), *args = cJSON_GetObjectItem(e, "args");
    if (!cJSON_IsString(ph)) continue;
    if (strcmp(ph->valuestring, "X") == 0 && strcmp(cJSON_GetObjectItem(e, "cat")->valuestring, "comm") == 0) {
      colls++;
      const cJSON *k = cJSON_GetObjectItem(args, "collective");
      if (cJSON_IsString(k) && cJSON_IsString(cJSON_GetObjectItem(args, "link")) &&
          cJSON_IsArray(cJSON_GetObjectItem(args, "axes")) && cli_num(args, "bytes") > 0)
        with_args++;
      const cJSON *ax = cJSON_GetObjectItem(args, "axes");
      if (cJSON_IsString(k) && strcmp(k->valuestring, "all_reduce") == 0 && cJSON_GetArraySize(ax) == 1 &&
          strcmp(cJSON_GetArrayItem(ax, 0)->valuestring, "model") == 0) {
        ar++;
        ut_near("all_reduce over model: bytes", cli_num(args, "bytes"), 32.0 * 512 * 2048 * 2, 1e-12);
        UT_CHECK(strcmp(cJSON_GetObjectItem(args, "link")->valuestring, "NVLink") == 0, "link %s",
                 cJSON_GetObjectItem(args, "link")->valuestring);
      }
    }
    if (strcmp(ph->valuestring, "s") == 0) starts++;
    if (strcmp(ph->valuestring, "f") == 0) {
      ends++;
      const cJSON *bp = cJSON_GetObjectItem(e, "bp");
      bad += !(cJSON_IsString(bp) && strcmp(bp->valuestring, "e") == 0);
    }
  }
  UT_CHECK(colls > 0 && with_args == colls, "%d of %d collectives with collective, bytes, link, axes", with_args, colls);
  UT_CHECK(ar >= 2, "the layers' all-reduces over model found (%d)", ar);
  UT_CHECK(starts > 0 && starts == ends && bad == 0, "flows: %d starts, %d ends (bound to the enclosing slice)", starts, ends);
  /* each flow ends no earlier than it starts */
  cJSON_ArrayForEach(e, ev) {
    const cJSON *ph = cJSON_GetObjectItem(e, "ph");
    if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "s") != 0) continue;
    const cJSON *f;
    cJSON_ArrayForEach(f, ev) {
      const cJSON *fp = cJSON_GetObjectItem(f, "ph");
      if (cJSON_IsString(fp) && strcmp(fp->valuestring, "f") == 0 && cli_num(f, "id") == cli_num(e, "id"))
        UT_CHECK(cli_num(f, "ts") >= cli_num(e, "ts"), "flow %g: ends at %g before it starts at %g", cli_num(e, "id"), cli_num(f, "ts"),
                 cli_num(e, "ts"));
    }
  }
  cJSON_Delete(t);
  ut_end();
}

/* The trace's memory counter tracks ("ph": "C", name "memory", one series per class) against
 * `check --format json`, which walks the same buffer plan for its figures: per simulated device
 * (pid = pipeline stage), the largest total over the track is check's peak for that stage
 * (per_stage[pid].total, per_device.total without a pipeline), the params series never exceeds
 * the stage's resident params (test_resident derives those by formula) and reaches them, every
 * class is a series, and times never go back. */
static void trace_memory_against_check(const char *file) {
  remove("test_sim_cli_mem.json");
  int rc;
  char args[256];
  snprintf(args, sizeof args, "--format json --trace test_sim_cli_mem.json");
  cJSON *j = sim_json(file, args, &rc, NULL);
  UT_CHECK(rc == 0, "sim %s: exit %d", file, rc);
  cJSON_Delete(j);
  char *out = cli_shardc(&rc, "check '%s' --format json 2>/dev/null", file);
  cJSON *c = out ? cJSON_Parse(out) : NULL;
  free(out);
  cJSON *t = read_json("test_sim_cli_mem.json");
  const cJSON *mem = c ? cJSON_GetObjectItem(c, "memory") : NULL, *stages = mem ? cJSON_GetObjectItem(mem, "per_stage") : NULL;
  int nst = cJSON_GetArraySize(stages) > 0 ? cJSON_GetArraySize(stages) : 1;
  enum { MAXD = 64 };
  double peak[MAXD] = {0}, params[MAXD] = {0}, last_ts[MAXD];
  int count[MAXD] = {0}, back = 0, missing = 0;
  for (int d = 0; d < MAXD; d++) last_ts[d] = -1;
  const cJSON *e, *events = t ? cJSON_GetObjectItem(t, "traceEvents") : NULL;
  cJSON_ArrayForEach(e, events) {
    const cJSON *ph = cJSON_GetObjectItem(e, "ph");
    if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "C") != 0) continue;
    int d = (int)cli_num(e, "pid");
    UT_CHECK(d >= 0 && d < nst && d < MAXD, "counter on pid %d of %d stages", d, nst);
    if (d < 0 || d >= nst || d >= MAXD) continue;
    const cJSON *a = cJSON_GetObjectItem(e, "args");
    static const char *const cls[] = {"params", "grads", "optimizer", "activations", "temporaries"};
    double tot = 0;
    for (int k = 0; k < 5; k++) {
      missing += !cJSON_IsNumber(cJSON_GetObjectItem(a, cls[k]));
      tot += cli_num(a, cls[k]);
    }
    if (tot > peak[d]) peak[d] = tot;
    if (cli_num(a, "params") > params[d]) params[d] = cli_num(a, "params");
    back += cli_num(e, "ts") < last_ts[d];
    last_ts[d] = cli_num(e, "ts");
    count[d]++;
  }
  UT_CHECK(missing == 0 && back == 0, "%s: %d series missing, %d steps back in time", file, missing, back);
  for (int d = 0; d < nst && d < MAXD; d++) {
    const cJSON *st = cJSON_GetArraySize(stages) > 0 ? cJSON_GetArrayItem(stages, d) : mem;
    const cJSON *want = st == mem ? cJSON_GetObjectItem(mem, "per_device") : st;
    const cJSON *rs = cJSON_GetObjectItem(st, "resident");
    char what[160];
    UT_CHECK(count[d] >= 2, "%s device %d: %d counter events", file, d, count[d]);
    snprintf(what, sizeof what, "%s device %d: the track's largest total = check's peak", file, d);
    ut_near(what, peak[d], cli_num(want, "total"), 1e-12);
    snprintf(what, sizeof what, "%s device %d: params series reaches the resident params", file, d);
    ut_near(what, params[d], cli_num(rs, "params"), 1e-12);
  }
  cJSON_Delete(c);
  cJSON_Delete(t);
  remove("test_sim_cli_mem.json");
}

static void test_trace_memory(void) {
  ut_begin("sim --trace: memory counter tracks per device and class, their peak check's");
  cli_write("test_sim_cli_mlp.shard", MLP);
  trace_memory_against_check("test_sim_cli_mlp.shard");
  trace_memory_against_check(SHARDC_SOURCE_DIR "/samples/llama3_405b_pp.shard"); /* 14 stages, each its own peak */
  ut_end();
}

/* Runs `shardc CMD FILE ARGS` (stderr discarded) and returns its stdout (malloc'd), *rc its exit. */
static char *run_text(const char *cmd_name, const char *file, const char *args, int *rc) {
  return cli_shardc(rc, "%s '%s' %s 2>/dev/null", cmd_name, file, args);
}

/* The lines of text that start with prefix: how many, and the first (into buf). */
static int lines_starting(const char *text, const char *prefix, char *buf, size_t size) {
  int n = 0;
  buf[0] = 0;
  for (const char *l = text; l && *l;) {
    const char *e = strchr(l, '\n');
    size_t len = e ? (size_t)(e - l) : strlen(l);
    if (strncmp(l, prefix, strlen(prefix)) == 0 && n++ == 0)
      snprintf(buf, size, "%.*s", (int)len, l);
    l = e ? e + 1 : NULL;
  }
  return n;
}

/* The line (1-based) of the source whose text, leading blanks skipped, is `rule` (then a blank,
 * a comment or the end), or -1: found here from the file, not from shardc's report. */
static int rule_line(const char *path, const char *rule) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[512];
  int n = 0, found = -1;
  while (fgets(line, sizeof line, f)) {
    n++;
    const char *s = line + strspn(line, " \t");
    size_t k = strlen(rule);
    if (strncmp(s, rule, k) == 0 && (s[k] == '\n' || s[k] == ' ' || s[k] == '#' || !s[k]) && found < 0) found = n;
  }
  fclose(f);
  return found;
}

/* "62.5 ms": layout_weigh_text's form of a time (3 significant digits). */
static void seconds_form(double s, char *buf, size_t size) {
  if (s >= 1) snprintf(buf, size, "%.3g s", s);
  else if (s >= 1e-3) snprintf(buf, size, "%.3g ms", s * 1e3);
  else snprintf(buf, size, "%.3g us", s * 1e6);
}

/* newcomer_tp.shard (issue 18's newcomer: Megatron TP+SP over `model`) is bound by its layout to a
 * plan that moves more than propagation would choose without the binding (test_bind checks the
 * weighing itself). sim and explain must each say so in exactly one line, with the time saved and
 * the rule, and agree with each other; the JSON must hold saves_s = bound - unbound > 0 and the
 * rule's own line in the file. A program whose layout is not beaten (the MLP above) gets no line
 * and a null. It fails if either command drops the line, prints it twice, names a rule at the
 * wrong line, or reports a saving that is not the difference of its own figures. */
static void test_forbidden_cheaper(void) {
  ut_begin("a plan the layout forbids would be cheaper: sim and explain say so in one line, time and rule");
  const char *path = SHARDC_SOURCE_DIR "/tests/unit/bind/newcomer_tp.shard";
  int rc;
  cJSON *sj = sim_json(path, "--format json", &rc, NULL);
  UT_CHECK(sj && rc == 0, "sim --format json: exit %d", rc);
  char *ej_text = run_text("explain", path, "--format json", &rc);
  cJSON *ej = ej_text ? cJSON_Parse(ej_text) : NULL;
  free(ej_text);
  UT_CHECK(ej && rc == 0, "explain --format json: exit %d", rc);
  const cJSON *sf = sj ? cJSON_GetObjectItem(sj, "forbidden_cheaper") : NULL;
  const cJSON *ef = ej ? cJSON_GetObjectItem(ej, "forbidden_cheaper") : NULL;
  UT_CHECK(cJSON_IsObject(sf) && cJSON_IsObject(ef), "forbidden_cheaper: sim %s, explain %s",
           sf ? (cJSON_IsNull(sf) ? "null" : "not an object") : "missing",
           ef ? (cJSON_IsNull(ef) ? "null" : "not an object") : "missing");
  if (cJSON_IsObject(sf) && cJSON_IsObject(ef)) {
    double saves = cli_num(sf, "saves_s"), bound = cli_num(sf, "bound_comm_s"), unbound = cli_num(sf, "unbound_comm_s");
    UT_CHECK(saves > 0 && unbound > 0 && unbound < bound, "saves %g s: bound %g s, unbound %g s", saves, bound, unbound);
    ut_near("saves_s = bound_comm_s - unbound_comm_s", saves, bound - unbound, 1e-12);
    ut_near("explain's saving is sim's", cli_num(ef, "saves_s"), saves, 1e-12);
    const cJSON *rule = cJSON_GetObjectItem(sf, "rule"), *erule = cJSON_GetObjectItem(ef, "rule");
    UT_CHECK(cJSON_IsString(rule) && cJSON_IsString(erule) && strcmp(rule->valuestring, erule->valuestring) == 0,
             "rules: sim %s, explain %s", cJSON_IsString(rule) ? rule->valuestring : "-",
             cJSON_IsString(erule) ? erule->valuestring : "-");
    if (cJSON_IsString(rule)) {
      int want = rule_line(path, rule->valuestring);
      UT_CHECK(want > 0, "rule `%s` is not a line of the layout", rule->valuestring);
      UT_CHECK((int)cli_num(sf, "line") == want && (int)cli_num(ef, "line") == want, "the rule's line: sim %g, explain %g, file %d",
               cli_num(sf, "line"), cli_num(ef, "line"), want);
      /* the text lines: one each, naming the rule and the time saved as the JSON has it */
      char save[64], want_rule[256], line[4096];
      seconds_form(saves, save, sizeof save);
      snprintf(want_rule, sizeof want_rule, "layout rule `%s` (line %d)", rule->valuestring, want);
      char *st = run_text("sim", path, "", &rc);
      int n = st ? lines_starting(st, "layout ", line, sizeof line) : 0;
      UT_CHECK(rc == 0 && n == 1, "sim: %d lines starting `layout ` (exit %d)", n, rc);
      UT_CHECK(strstr(line, want_rule) && strstr(line, "would save ") && strstr(line, save),
               "sim's line lacks `%s` or `would save %s`: %s", want_rule, save, line);
      free(st);
      char *et = run_text("explain", path, "", &rc);
      n = et ? lines_starting(et, "  layout: ", line, sizeof line) : 0;
      UT_CHECK(rc == 0 && n == 1, "explain: %d lines starting `  layout: ` (exit %d)", n, rc);
      UT_CHECK(strstr(line, want_rule) && strstr(line, "would save ") && strstr(line, save),
               "explain's line lacks `%s` or `would save %s`: %s", want_rule, save, line);
      free(et);
    }
  }
  cJSON_Delete(sj);
  cJSON_Delete(ej);

  /* the layout's plan is propagation's own here: no line, a null */
  cli_write("test_sim_cli_mlp.shard", MLP);
  sj = sim_json("test_sim_cli_mlp.shard", "--format json", &rc, NULL);
  sf = sj ? cJSON_GetObjectItem(sj, "forbidden_cheaper") : NULL;
  UT_CHECK(cJSON_IsNull(sf), "the MLP: forbidden_cheaper is %s", sf ? "not null" : "missing");
  cJSON_Delete(sj);
  char *st = run_text("sim", "test_sim_cli_mlp.shard", "", &rc);
  char line[4096];
  UT_CHECK(st && lines_starting(st, "layout ", line, sizeof line) == 0, "the MLP: sim says %s", line);
  free(st);
  ut_end();
}

/* Ring attention (context parallelism, samples/llama3_8b_long.shard: seq over ctx 16): each device's
 * query block meets all 16 key blocks, so its attention kernels cost what a flash attention of the
 * whole key length does, split over the ring's steps. Checked as ratios that hold without a ring:
 * with remat none the backward's FLOPs are twice the forward's (a contraction's backward is two
 * contractions; cost_attention's backward, 2x its forward), and MFU and HFU stay below 1. (Before
 * the fix the kernels priced one key block: backward 316 TFLOP against a 686 TFLOP forward, MFU 91%
 * at remat none, 168% with tensor parallelism 2.) */
static void test_ring_attention(void) {
  ut_begin("ring attention: the simulated backward is twice the forward, MFU and HFU below 1");
  const char *remats[] = {"none", "full"};
  for (int i = 0; i < 2; i++) {
    char args[200];
    snprintf(args, sizeof args, "--format json --set remat=%s", remats[i]);
    int rc;
    cJSON *j = sim_json(SHARDC_SOURCE_DIR "/samples/llama3_8b_long.shard", args, &rc, NULL);
    double fwd = NAN, bwd = NAN;
    const cJSON *ph;
    cJSON_ArrayForEach(ph, cJSON_GetObjectItem(j, "phases")) {
      const cJSON *n = cJSON_GetObjectItem(ph, "phase");
      if (cJSON_IsString(n) && strcmp(n->valuestring, "forward") == 0) fwd = cli_num(ph, "flops");
      if (cJSON_IsString(n) && strcmp(n->valuestring, "backward") == 0) bwd = cli_num(ph, "flops");
    }
    UT_CHECK(rc == 0, "remat %s: exit %d", remats[i], rc);
    if (i == 0) UT_CHECK(fabs(bwd / fwd - 2) < 0.02, "remat none: backward %.4g FLOP, forward %.4g: ratio %.3f, want 2", bwd, fwd, bwd / fwd);
    else UT_CHECK(fabs(bwd / fwd - 3) < 0.02, "remat full: backward %.4g FLOP (recomputation included), forward %.4g: ratio %.3f, want 3", bwd, fwd, bwd / fwd);
    UT_CHECK(cli_num(j, "mfu") < 1 && cli_num(j, "hfu") < 1, "remat %s: MFU %.3f, HFU %.3f", remats[i], cli_num(j, "mfu"), cli_num(j, "hfu"));
    cJSON_Delete(j);
  }
  ut_end();
}

/* The optimizer's memory-bound update (issue 19, item 5) against Adam written out by hand: the
 * phase "optimizer" of a one-device step with master = f32. Per element of a parameter (language.md,
 * Steps: bf16 params and gradients, f32 moments, f32 master copy):
 *   m = b1 m + (1 - b1) g       reads m (4) and g (2), writes m (4): 10 bytes
 *   v = b2 v + (1 - b2) g^2     the same: 10 bytes
 *   master -= lr mh / (...)     reads master, m, v (12), writes master (4): 16 bytes, and the step
 *                               count t once (a rank-0 f32: 4 bytes per tensor)
 *   param = bf16(master)        reads 4, writes 2: 6 bytes
 * 42 bytes per element, each line its own kernel at the streaming rate (hbm_efficiency x hbm_bw =
 * 0.9 x 3.35e12 on the H100) plus one launch (op_overhead, 2 us): 4 kernels per parameter tensor. */
static void test_optimizer_phase(void) {
  ut_begin("sim: the optimizer phase is Adam's 42 bytes per element at 0.9 x HBM bandwidth + 2 us per kernel");
  cli_write("test_sim_cli_opt.shard",
            "import \"targets\"\n"
            "import \"layers\"\n"
            "mesh one = h100[data: 1]\n"
            "dim batch = 8, seq = 128, embed = 1024, hidden = 4096, layers = 2\n"
            "layout dp {\n  batch: data\n}\n"
            "model net {\n"
            "  param blocks: mlp[layers]\n"
            "  fn forward(x: bf16[batch, seq, embed]) -> bf16[batch, seq, embed] {\n"
            "    for b in blocks { x = b.forward(x) }\n"
            "    return x\n"
            "  }\n"
            "}\n"
            "train net.forward {\n  loss = mse\n  optimizer = adam\n  master = f32\n}\n");
  int rc;
  cJSON *j = sim_json("test_sim_cli_opt.shard", "--format json", &rc, NULL);
  UT_CHECK(rc == 0 && j, "sim runs (rc %d)", rc);
  const cJSON *ph = j ? cJSON_GetArrayItem(cJSON_GetObjectItem(j, "phases"), 2) : NULL;
  double elems = 2.0 * 1024 * 4096; /* w_in and w_out each stack 2 layers of 1024 x 4096 */
  double per_tensor = ((10 + 10 + 16 + 6) * elems + 4) / (0.9 * 3.35e12) + 4 * 2e-6;
  ut_near("optimizer phase = 2 tensors x ((42 B x elems + 4) / (0.9 x 3.35e12) + 4 x 2 us)", cli_num(ph, "compute_s"),
          2 * per_tensor, 1e-9);
  UT_CHECK(cli_num(ph, "comm_s") == 0, "one device: no communication in the optimizer");
  cJSON_Delete(j);
  ut_end();
}

/* collective_sms (cost-model.md, "Collectives take SMs"): the MLP on a target that states 24 of the
 * H100's 132 SMs held by a running collective. Compute slows by 132 / 108 only while a collective
 * runs, so the step grows, by at most (132/108 - 1) x the communication the stdlib target hides
 * (hidden = comm_s - exposed_comm_s); the ideal mode ignores it. */
static void test_collective_sms(void) {
  ut_begin("collective_sms: the step grows by at most (132/108 - 1) x the hidden communication; ideal unchanged");
  const char *at = strstr(MLP, "mesh node = h100[");
  char src[4096];
  snprintf(src, sizeof src, "%.*starget h100c {\n  base = h100\n  collective_sms = 24\n}\nmesh node = h100c[%s",
           (int)(at - MLP), MLP, at + strlen("mesh node = h100["));
  cli_write("test_sim_cli_sms.shard", src);
  cli_write("test_sim_cli_mlp.shard", MLP);
  int rc1, rc2, rc3, rc4;
  cJSON *a = sim_json("test_sim_cli_mlp.shard", "--format json", &rc1, NULL);
  cJSON *b = sim_json("test_sim_cli_sms.shard", "--format json", &rc2, NULL);
  cJSON *ai = sim_json("test_sim_cli_mlp.shard", "--format json --ideal", &rc3, NULL);
  cJSON *bi = sim_json("test_sim_cli_sms.shard", "--format json --ideal", &rc4, NULL);
  UT_CHECK(a && b && ai && bi && rc1 == 0 && rc2 == 0, "sim runs (rc %d %d %d %d)", rc1, rc2, rc3, rc4);
  double s0 = cli_num(a, "step_time_s"), s1 = cli_num(b, "step_time_s");
  double hidden = cli_num(a, "comm_s") - cli_num(a, "exposed_comm_s");
  UT_CHECK(hidden > 0, "the MLP hides some communication (%g s)", hidden);
  UT_CHECK(s1 > s0, "slower with collective_sms: %g against %g", s1, s0);
  UT_CHECK(s1 <= s0 + hidden * (132.0 / 108 - 1) * (1 + 1e-9), "at most %g + %g x %g: got %g", s0, hidden,
           132.0 / 108 - 1, s1);
  ut_near("ideal: the same step", cli_num(bi, "step_time_s"), cli_num(ai, "step_time_s"), 1e-12);
  cJSON_Delete(a);
  cJSON_Delete(b);
  cJSON_Delete(ai);
  cJSON_Delete(bi);
  ut_end();
}

int main(void) {
  test_json_keys();
  test_trace_args();
  test_trace_memory();
  test_phases();
  test_json_errors();
  test_no_fit();
  test_trace();
  test_tokens();
  test_forbidden_cheaper();
  test_ring_attention();
  test_optimizer_phase();
  test_collective_sms();
  remove("test_sim_cli_mlp.shard");
  remove("test_sim_cli_err.shard");
  remove("test_sim_cli_big.shard");
  remove("test_sim_cli_pipe.shard");
  remove("test_sim_cli_opt.shard");
  remove("test_sim_cli_sms.shard");
  remove("test_sim_cli_trace.json");
  return ut_summary();
}
