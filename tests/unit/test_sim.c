/* test_sim.c: the simulator's timeline engine (compiler/sim/timeline.h), its Chrome trace, and
 * the pipeline schedules (compiler/sim/schedule.h).
 *
 * Every expected time is derived by hand in the comment above its check (or from the closed forms
 * of Narayanan et al. 2021 and Korthikanti et al. 2022, written out as formulas), never copied from
 * the engine's output. Prints PASS/FAIL per case and "N passed, N failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "pipesim.h"
#include "timeline.h"
#include "unit_test.h"

static const SrcLoc NOLOC = {0};

static void near(const char *what, double got, double want) {
  if (fabs(got - want) <= 1e-9 * (fabs(want) > 1 ? fabs(want) : 1)) return;
  ut_fail("%s: got %.9g, want %.9g", what, got, want);
}

/* A device with one compute and one comm stream. */
static int dev2(SimGraph *g, const char *name, int *cs, int *ms) {
  int d = sim_device_add(g, name, 1);
  *cs = sim_stream_add(g, d, SIM_STREAM_COMPUTE, NULL);
  *ms = sim_stream_add(g, d, SIM_STREAM_COMM, NULL);
  return d;
}

/* Tasks on one stream run back to back in the order added: ends 1, 3, 6. */
static void test_chain(void) {
  ut_begin("a chain on one stream: back to back, in program order");
  SimGraph *g = sim_graph_new();
  int cs, ms;
  int d = dev2(g, "d", &cs, &ms);
  int a = sim_task_add(g, cs, 1, "a", NOLOC), b = sim_task_add(g, cs, 2, "b", NOLOC),
      c = sim_task_add(g, cs, 3, "c", NOLOC);
  ut_true("runs", sim_run(g));
  near("a starts at 0", sim_task_start(g, a), 0);
  near("b after a", sim_task_start(g, b), 1);
  near("c ends at 6", sim_task_end(g, c), 6);
  near("makespan", sim_makespan(g), 6);
  SimDeviceStats st;
  ut_true("stats", sim_device_stats(g, d, &st));
  near("compute busy 6", st.compute_s, 6);
  near("no comm", st.comm_s, 0);
  near("no idle", st.idle_s, 0);
  ut_true("3 tasks", st.tasks == 3);
  sim_graph_free(g);
  ut_end();
}

/* Compute 3 x 1 s; a 2 s collective with no dependency on it runs beside: step 3, comm 2, none
 * exposed. Make the third compute task need the collective (which waits for the first): the
 * collective runs [1, 3], the third task [3, 4]: step 4, exposed 0 (compute runs [1, 2] beside
 * the collective, then [2, 3] is exposed: 1 s). */
static void test_overlap_and_exposed(void) {
  ut_begin("asynchronous collectives overlap compute; the part compute waits for is exposed");
  SimGraph *g = sim_graph_new();
  int cs, ms;
  int d = dev2(g, "d", &cs, &ms);
  for (int i = 0; i < 3; i++) sim_task_add(g, cs, 1, "mm", NOLOC);
  sim_task_add(g, ms, 2, "all_reduce", NOLOC);
  ut_true("runs", sim_run(g));
  SimDeviceStats st;
  sim_device_stats(g, d, &st);
  near("step 3", st.step_s, 3);
  near("comm 2", st.comm_s, 2);
  near("fully overlapped", st.exposed_comm_s, 0);
  sim_graph_free(g);

  g = sim_graph_new();
  d = dev2(g, "d", &cs, &ms);
  int m0 = sim_task_add(g, cs, 1, "mm0", NOLOC);
  sim_task_add(g, cs, 1, "mm1", NOLOC);
  int m2 = sim_task_add(g, cs, 1, "mm2", NOLOC);
  int ar = sim_task_add(g, ms, 2, "all_reduce", NOLOC);
  sim_dep_add(g, m0, ar, 0);
  sim_dep_add(g, ar, m2, 0);
  ut_true("runs", sim_run(g));
  sim_device_stats(g, d, &st);
  near("collective starts after mm0", sim_task_start(g, ar), 1);
  near("mm2 waits for it", sim_task_start(g, m2), 3);
  near("step 4", st.step_s, 4);
  near("compute 3", st.compute_s, 3);
  near("comm 2", st.comm_s, 2);
  near("exposed 1 ([2, 3])", st.exposed_comm_s, 1);
  near("idle 0", st.idle_s, 0);
  sim_graph_free(g);
  ut_end();
}

/* FSDP: each of L layers needs its weights gathered (g s) before its compute (c s); the gathers run
 * on the comm stream one layer ahead: the gather of layer l may start once layer l - 1 starts
 * (layer l - 2 has ended and freed its buffer). With g <= c only the first gather is exposed:
 * step g + L c. With g > c the gathers are the critical path: layer l starts at (l + 1) g, so the
 * step is L g + c and L g + c - L c of it is exposed. */
static void test_fsdp_prefetch(void) {
  ut_begin("FSDP prefetch one layer ahead: only the first gather is exposed while gathers are shorter");
  int layers = 8;
  double cases[][2] = {{0.5, 1.0}, {1.5, 1.0}};
  for (int k = 0; k < 2; k++) {
    double gt = cases[k][0], ct = cases[k][1];
    SimGraph *g = sim_graph_new();
    int cs, ms;
    int d = dev2(g, "d", &cs, &ms);
    int mm[8];
    for (int l = 0; l < layers; l++) {
      int ag = sim_task_add(g, ms, gt, "all_gather", NOLOC);
      mm[l] = sim_task_add(g, cs, ct, "layer", NOLOC);
      sim_dep_add(g, ag, mm[l], 0);
      if (l >= 2) sim_dep_add(g, mm[l - 2], ag, 0);
    }
    ut_true("runs", sim_run(g));
    SimDeviceStats st;
    sim_device_stats(g, d, &st);
    double step = gt <= ct ? gt + layers * ct : layers * gt + ct;
    near("step", st.step_s, step);
    near("exposed", st.exposed_comm_s, step - layers * ct);
    near("comm", st.comm_s, layers * gt);
    sim_graph_free(g);
  }
  ut_end();
}

/* A lag on a dependency: b may start 0.5 s after a ends (a transfer that occupies no stream). */
static void test_lag_and_devices(void) {
  ut_begin("dependency lags and cross-device dependencies; idle time of a waiting device");
  SimGraph *g = sim_graph_new();
  int c0, m0, c1, m1;
  int d0 = dev2(g, "stage 0", &c0, &m0), d1 = dev2(g, "stage 1", &c1, &m1);
  int a = sim_task_add(g, c0, 2, "fwd", NOLOC);
  int b = sim_task_add(g, c1, 3, "fwd", NOLOC);
  sim_dep_add(g, a, b, 0.5);
  ut_true("runs", sim_run(g));
  near("b at 2.5", sim_task_start(g, b), 2.5);
  near("makespan 5.5", sim_makespan(g), 5.5);
  SimDeviceStats s0, s1;
  sim_device_stats(g, d0, &s0);
  sim_device_stats(g, d1, &s1);
  near("stage 0 idle 3.5 after its work", s0.idle_s, 3.5);
  near("stage 1 idle 2.5 before", s1.idle_s, 2.5);
  near("stage 0 last end 2", s0.last_end_s, 2);
  ut_true("bad ids refused", !sim_dep_add(g, a, a, 0) && !sim_dep_add(g, a, 99, 0) && sim_task_add(g, 99, 1, "x", NOLOC) == -1);
  sim_graph_free(g);
  ut_end();
}

/* An in-order stream runs x (waiting on a 5 s task elsewhere) before y; a ready-order stream runs y
 * first: y [0, 1], x [5, 6]. */
static void test_stream_orders(void) {
  ut_begin("in-order streams keep program order; ready-order streams take whatever is ready");
  for (int ready = 0; ready < 2; ready++) {
    SimGraph *g = sim_graph_new();
    int cs, ms;
    dev2(g, "d", &cs, &ms);
    if (ready) sim_stream_set_order(g, ms, SIM_ORDER_READY);
    int slow = sim_task_add(g, cs, 5, "slow", NOLOC);
    int x = sim_task_add(g, ms, 1, "x", NOLOC), y = sim_task_add(g, ms, 1, "y", NOLOC);
    sim_dep_add(g, slow, x, 0);
    ut_true("runs", sim_run(g));
    if (ready) {
      near("ready order: y first", sim_task_start(g, y), 0);
      near("x after slow", sim_task_start(g, x), 5);
    } else {
      near("program order: x at 5", sim_task_start(g, x), 5);
      near("y after x", sim_task_start(g, y), 6);
    }
    sim_graph_free(g);
  }
  ut_end();
}

/* Joined tasks (one collective seen from two simulated devices) start together when the later
 * could: device 0 is ready at 1, device 1 at 3: both start at 3. */
static void test_join(void) {
  ut_begin("joined tasks start together (a collective among simulated devices)");
  SimGraph *g = sim_graph_new();
  int c0, m0, c1, m1;
  dev2(g, "first", &c0, &m0);
  dev2(g, "last", &c1, &m1);
  int p0 = sim_task_add(g, c0, 1, "bwd", NOLOC), p1 = sim_task_add(g, c1, 3, "bwd", NOLOC);
  int a0 = sim_task_add(g, m0, 2, "all_reduce embedding", NOLOC);
  int a1 = sim_task_add(g, m1, 2, "all_reduce embedding", NOLOC);
  sim_dep_add(g, p0, a0, 0);
  sim_dep_add(g, p1, a1, 0);
  sim_task_join(g, a0, a1);
  ut_true("runs", sim_run(g));
  near("device 0 waits", sim_task_start(g, a0), 3);
  near("device 1 on time", sim_task_start(g, a1), 3);
  near("both end at 5", sim_task_end(g, a0), 5);
  sim_graph_free(g);
  ut_end();
}

static void test_cycles(void) {
  ut_begin("cycles and self-waiting stream orders are reported, not hung on");
  SimGraph *g = sim_graph_new();
  int cs, ms;
  dev2(g, "d", &cs, &ms);
  int a = sim_task_add(g, cs, 1, "a", NOLOC), b = sim_task_add(g, ms, 1, "b", NOLOC);
  sim_dep_add(g, a, b, 0);
  sim_dep_add(g, b, a, 0);
  ut_true("cycle: false", !sim_run(g));
  ut_true("2 unscheduled", sim_unscheduled(g) == 2);
  ut_true("start NaN", isnan(sim_task_start(g, a)));
  sim_graph_free(g);
  /* s1: [A, B], s2: [C, D]; A waits on D, C waits on B: each stream's head waits on the other's
   * second task. */
  g = sim_graph_new();
  dev2(g, "d", &cs, &ms);
  int A = sim_task_add(g, cs, 1, "A", NOLOC), B = sim_task_add(g, cs, 1, "B", NOLOC);
  int C = sim_task_add(g, ms, 1, "C", NOLOC), D = sim_task_add(g, ms, 1, "D", NOLOC);
  sim_dep_add(g, D, A, 0);
  sim_dep_add(g, B, C, 0);
  ut_true("stream-order deadlock: false", !sim_run(g));
  ut_true("4 unscheduled", sim_unscheduled(g) == 4);
  sim_graph_free(g);
  ut_end();
}

/* The trace: valid JSON; metadata naming every device and stream; one X event per task, named
 * after its op and source line, ts / dur in microseconds. */
static void test_trace(void) {
  ut_begin("Chrome trace: valid JSON, a track per stream per device, slices named with their source line");
  SimGraph *g = sim_graph_new();
  Source src = {"/some/dir/llama.shard", "", 0};
  SrcLoc loc = {&src, 31, 5, 3};
  int c0, m0, c1, m1;
  dev2(g, "stage 0", &c0, &m0);
  int d1 = sim_device_add(g, "stage 1", 512);
  c1 = sim_stream_add(g, d1, SIM_STREAM_COMPUTE, NULL);
  m1 = sim_stream_add(g, d1, SIM_STREAM_P2P, "send");
  int t0 = sim_task_add(g, c0, 1.5e-3, "matmul", loc);
  int t1 = sim_task_add(g, m0, 2e-3, "all_gather", NOLOC);
  int t2 = sim_task_add(g, c1, 1e-3, "attention", loc);
  int t3 = sim_task_add(g, m1, 0.5e-3, "send activation", NOLOC);
  sim_dep_add(g, t0, t2, 0);
  sim_dep_add(g, t2, t3, 0);
  (void)t1;
  ut_true("not before a run", sim_trace_json(g) == NULL);
  ut_true("runs", sim_run(g));
  char *text = sim_trace_json(g);
  ut_true("json", text != NULL);
  cJSON *root = text ? cJSON_Parse(text) : NULL;
  ut_true("parses", root != NULL);
  cJSON *ev = root ? cJSON_GetObjectItem(root, "traceEvents") : NULL;
  ut_true("traceEvents array", cJSON_IsArray(ev));
  int slices = 0, pnames = 0, tnames = 0;
  bool named = false, times = false, represents = false, p2p = false;
  cJSON *e;
  cJSON_ArrayForEach(e, ev) {
    const char *ph = cJSON_GetStringValue(cJSON_GetObjectItem(e, "ph"));
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(e, "name"));
    if (!ph || !name) continue;
    if (strcmp(ph, "M") == 0) {
      if (strcmp(name, "process_name") == 0) pnames++;
      if (strcmp(name, "thread_name") == 0) {
        tnames++;
        const char *tn = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "name"));
        if (tn && strcmp(tn, "send") == 0) p2p = true;
      }
    } else if (strcmp(ph, "X") == 0) {
      slices++;
      if (strcmp(name, "matmul (llama.shard:31)") == 0) {
        named = true;
        /* matmul runs [0, 1.5 ms]: ts 0 us, dur 1500 us; pid 0, tid its stream */
        times = cJSON_GetObjectItem(e, "ts")->valuedouble == 0 &&
                fabs(cJSON_GetObjectItem(e, "dur")->valuedouble - 1500) < 1e-6 &&
                cJSON_GetObjectItem(e, "pid")->valueint == 0 && cJSON_GetObjectItem(e, "tid")->valueint == c0;
      }
      if (strncmp(name, "attention", 9) == 0) {
        cJSON *r = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "represents");
        represents = r && r->valuedouble == 512 && fabs(cJSON_GetObjectItem(e, "ts")->valuedouble - 1500) < 1e-6;
      }
    }
  }
  ut_true("one slice per task", slices == 4);
  ut_true("a process per device", pnames == 2);
  ut_true("a thread per stream", tnames == 4);
  ut_true("slice named 'matmul (llama.shard:31)'", named);
  ut_true("times in microseconds, pid/tid", times);
  ut_true("represents on a representative device", represents);
  ut_true("stream named 'send'", p2p);
  cJSON_Delete(root);
  free(text);
  const char *path = "test_sim_trace.json";
  ut_true("written", sim_trace_write(g, path));
  FILE *f = fopen(path, "r");
  char buf[64] = {0};
  ut_true("file starts with the object", f && fread(buf, 1, 15, f) == 15 && strncmp(buf, "{\"traceEvents\"", 14) == 0);
  if (f) fclose(f);
  remove(path);
  sim_graph_free(g);
  ut_end();
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* 1e6 tasks: 500,000 layers' compute on one stream and a collective each on another, the compute
 * of layer i waiting for the collective of layer i - 1 (gradient reduction during the backward).
 * Compute 1 us, collective 0.5 us: the collectives hide: step 500,000 us + 0.5 us. */
static void test_speed(void) {
  ut_begin(NULL);
  int n = 500000;
  double t0 = now_s();
  SimGraph *g = sim_graph_new();
  sim_graph_reserve(g, 2 * n, n);
  int cs, ms;
  int d = dev2(g, "d", &cs, &ms);
  int prev = -1;
  for (int i = 0; i < n; i++) {
    int c = sim_task_add(g, cs, 1e-6, "layer", NOLOC);
    int r = sim_task_add(g, ms, 0.5e-6, "reduce_scatter", NOLOC);
    sim_dep_add(g, c, r, 0);
    if (prev >= 0) sim_dep_add(g, prev, c, 0);
    prev = r;
  }
  bool ok = sim_run(g);
  double t1 = now_s();
  SimDeviceStats st;
  sim_device_stats(g, d, &st);
  ut_true("runs", ok);
  /* layer i waits for the reduce of i - 1, which ends 0.5 us after layer i - 1: each layer costs
   * 1.5 us on the critical path: step n x 1.5 us */
  near("step n x 1.5 us", st.step_s * 1e6, n * 1.5);
  near("exposed n x 0.5 us", st.exposed_comm_s * 1e6, n * 0.5);
  /* its time is printed, not asserted (a timed test flakes on a shared machine): the engine's speed
   * is measured by bench/bench_sim and reported in docs/benchmarks.md */
  sim_graph_free(g);
  char name[160];
  snprintf(name, sizeof name, "1e6 tasks and 1e6 dependencies built and run in %.3f s", t1 - t0);
  ut_end_as(name);
}

/* ---- schedules ---- */

static void expect_actions(ScheduleKind k, int p, int n, int v, int stage, const char *want) {
  SimPipeStep a[256];
  int cnt = sim_pipe_actions(k, p, n, v, stage, a, 256);
  char got[2048];
  size_t used = 0;
  got[0] = 0;
  for (int i = 0; i < cnt && i < 256; i++)
    used += (size_t)snprintf(got + used, sizeof got - used, "%s%c%d%s", i ? " " : "", a[i].backward ? 'B' : 'F',
                             a[i].microbatch, v > 1 ? (a[i].chunk ? "b" : "a") : "");
  UT_CHECK(strcmp(got, want) == 0, "%s p=%d n=%d v=%d stage %d:\n      got  %s\n      want %s", sim_pipe_name(k), p,
           n, v, stage, got, want);
}

/* Orders written out by hand from the rules of schedule.h (chunk a = 0, b = 1). */
static void test_pipe_orders(void) {
  ut_begin("pipeline action orders per stage: gpipe, 1f1b, interleaved");
  expect_actions(SCHED_GPIPE, 4, 3, 1, 2, "F0 F1 F2 B0 B1 B2");
  /* 1f1b, p = 4, N = 6: stage 0 warms up with 3 forwards, stage 3 with none */
  expect_actions(SCHED_1F1B, 4, 6, 1, 0, "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  expect_actions(SCHED_1F1B, 4, 6, 1, 3, "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  expect_actions(SCHED_1F1B, 4, 2, 1, 0, "F0 F1 B0 B1"); /* fewer microbatches than stages */
  /* interleaved, p = 2, N = 4, V = 2. Forward k: chunk (k mod 4) / 2, microbatch (k / 4) 2 + k mod 2:
   * F0a F1a F0b F1b F2a F3a F2b F3b; backward k: chunk 1 - (k mod 4) / 2: B0b B1b B0a B1a B2b B3b
   * B2a B3a. Warm-up: stage 0 (2 - 0 - 1) 2 + (2 - 1) 2 = 4, stage 1 (0) 2 + 2 = 2. */
  expect_actions(SCHED_INTERLEAVED, 2, 4, 2, 0, "F0a F1a F0b F1b F2a B0b F3a B1b F2b B0a F3b B1a B2b B3b B2a B3a");
  expect_actions(SCHED_INTERLEAVED, 2, 4, 2, 1, "F0a F1a F0b B0b F1b B1b F2a B0a F3a B1a F2b B2b F3b B3b B2a B3a");
  /* N = p: all forwards first (Megatron-LM's special case) */
  expect_actions(SCHED_INTERLEAVED, 2, 2, 2, 1, "F0a F1a F0b F1b B0b B1b B0a B1a");
  /* interleaved(1) is 1f1b */
  expect_actions(SCHED_INTERLEAVED, 4, 6, 1, 0, "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  const char *why = NULL;
  ut_true("interleaved needs N a multiple of p", !sim_pipe_valid(SCHED_INTERLEAVED, 4, 6, 2, &why) && why);
  ut_true("gpipe takes one chunk", !sim_pipe_valid(SCHED_GPIPE, 4, 8, 2, NULL));
  ut_true("invalid gives -1", sim_pipe_actions(SCHED_INTERLEAVED, 4, 6, 2, 0, NULL, 0) == -1);
  ut_true("stage out of range", sim_pipe_actions(SCHED_1F1B, 4, 6, 1, 4, NULL, 0) == -1);
  ScheduleKind k;
  ut_true("names", sim_pipe_from_name("1f1b", &k) && k == SCHED_1F1B && strcmp(sim_pipe_name(SCHED_INTERLEAVED), "interleaved") == 0);
  /* every stage runs each (microbatch, chunk) once forward and once backward, forward first */
  int ps[] = {1, 2, 3, 4, 8}, ns[] = {1, 4, 8, 16, 24};
  for (int kind = 0; kind <= SCHED_INTERLEAVED; kind++)
    for (int i = 0; i < 5; i++)
      for (int j = 0; j < 5; j++)
        for (int v = 1; v <= 3; v++) {
          int p = ps[i], n = ns[j];
          if (!sim_pipe_valid((ScheduleKind)kind, p, n, v, NULL)) continue;
          for (int s = 0; s < p; s++) {
            SimPipeStep a[2 * 24 * 3];
            int cnt = sim_pipe_actions((ScheduleKind)kind, p, n, v, s, a, 2 * 24 * 3);
            int seen[24][3] = {{0}};
            bool ok = cnt == 2 * n * v;
            for (int q = 0; q < cnt && ok; q++) {
              int *c = &seen[a[q].microbatch][a[q].chunk];
              if (a[q].stage != s) ok = false;
              if (!a[q].backward) ok = ok && *c == 0, *c = 1;
              else ok = ok && *c == 1, *c = 2;
            }
            UT_CHECK(ok, "%s p=%d n=%d v=%d stage %d: not each forward then backward once", sim_pipe_name(kind), p, n, v, s);
          }
        }
  ut_end();
}

/* Closed forms (no transfer time), t_f = 1, t_b = 2 per microbatch through a whole stage (a chunk:
 * 1 / V and 2 / V): gpipe and 1f1b step (N + p - 1) 3, bubble fraction (p - 1) / (N + p - 1) of
 * the step; interleaved step 3 N + 3 (p - 1) / V, bubble (p - 1) / (V N) of the ideal 3 N. */
static void test_pipe_closed_forms(void) {
  ut_begin(NULL);
  int checked = 0;
  int ps[] = {1, 2, 3, 4, 8, 16}, ns[] = {1, 2, 4, 8, 16, 32, 64};
  double ratios[][2] = {{1, 2}, {1, 1}, {1, 3}};
  for (int kind = 0; kind <= SCHED_INTERLEAVED; kind++)
    for (int i = 0; i < 6; i++)
      for (int j = 0; j < 7; j++)
        for (int v = 1; v <= 4; v++)
          for (int r = 0; r < 3; r++) {
            int p = ps[i], n = ns[j];
            if (!sim_pipe_valid((ScheduleKind)kind, p, n, v, NULL)) continue;
            double tf = ratios[r][0], tb = ratios[r][1];
            PipeResult res;
            bool ok = sim_pipe_simulate((ScheduleKind)kind, p, n, v, tf / v, tb / v, 0, &res);
            UT_CHECK(ok, "%s p=%d n=%d v=%d did not schedule", sim_pipe_name(kind), p, n, v);
            if (!ok) continue;
            double ideal = n * (tf + tb);
            double bubble = (p - 1) * (tf + tb) / v;
            near("ideal", res.ideal_s, ideal);
            if (fabs(res.step_s - (ideal + bubble)) > 1e-9 * ideal)
              ut_fail("%s p=%d n=%d v=%d t_b/t_f=%g: step %.9g, closed form %.9g", sim_pipe_name(kind), p, n, v,
                      tb / tf, res.step_s, ideal + bubble);
            if (v == 1) near("bubble fraction (p-1)/(N+p-1)", res.bubble_fraction, (p - 1.0) / (n + p - 1));
            near("bubble / ideal = (p-1)/(V N)", res.bubble_over_ideal, (p - 1.0) / (v * n));
            checked++;
          }
  char name[160];
  snprintf(name, sizeof name, "pipeline step and bubble equal the closed forms (%d schedules simulated)", checked);
  ut_true("something checked", checked > 100);
  ut_end_as(name);
}

/* In flight at the peak (chunk activations): gpipe N; 1f1b min(p - s, N); interleaved on stage s
 * (V - 1) p + 2 (p - s) - 1, on the first stage p V + p - 1 = (1 + (p - 1) / (p V)) p V, i.e.
 * (1 + (p - 1) / (p V)) x p microbatches' worth (Korthikanti et al. 2022). */
static void test_pipe_in_flight(void) {
  ut_begin("microbatches in flight: gpipe N, 1f1b p - s, interleaved (1 + (p-1)/(pV)) p on the first stage");
  for (int p = 1; p <= 8; p++)
    for (int n = p; n <= 4 * p; n += p)
      for (int s = 0; s < p; s++) {
        UT_CHECK(sim_pipe_in_flight(SCHED_GPIPE, p, n, 1, s) == n, "gpipe p=%d n=%d s=%d", p, n, s);
        int want = p - s < n ? p - s : n;
        UT_CHECK(sim_pipe_in_flight(SCHED_1F1B, p, n, 1, s) == want, "1f1b p=%d n=%d s=%d: %d, want %d", p, n, s,
                 sim_pipe_in_flight(SCHED_1F1B, p, n, 1, s), want);
        for (int v = 2; v <= 4; v++) {
          int got = sim_pipe_in_flight(SCHED_INTERLEAVED, p, n, v, s);
          int w = n == p ? n * v : (v - 1) * p + 2 * (p - s) - 1;
          if (w > n * v) w = n * v;
          UT_CHECK(got == w, "interleaved p=%d n=%d v=%d s=%d: %d, want %d", p, n, v, s, got, w);
          if (s == 0 && n > p) {
            double sets = (double)got / v, korth = (1 + (p - 1.0) / (p * v)) * p;
            UT_CHECK(fabs(sets - korth) < 1e-12, "interleaved p=%d v=%d: %g chunk-sets, Korthikanti %g", p, v, sets, korth);
          }
        }
      }
  /* fewer microbatches than stages under 1f1b: N */
  ut_true("1f1b N < p", sim_pipe_in_flight(SCHED_1F1B, 8, 3, 1, 0) == 3);
  ut_end();
}

/* Transfers: gpipe's critical path crosses p - 1 transfers forward and p - 1 backward: step + 2 (p - 1) x.
 * Every schedule gets slower with transfers, by at least that. */
static void test_pipe_transfers(void) {
  ut_begin("point-to-point transfers lengthen the step (gpipe: exactly 2 (p - 1) x)");
  double x = 0.1;
  PipeResult a, b;
  sim_pipe_simulate(SCHED_GPIPE, 4, 8, 1, 1, 2, 0, &a);
  sim_pipe_simulate(SCHED_GPIPE, 4, 8, 1, 1, 2, x, &b);
  near("gpipe + 2 (p - 1) x", b.step_s, a.step_s + 2 * 3 * x);
  for (int kind = SCHED_1F1B; kind <= SCHED_INTERLEAVED; kind++) {
    int v = kind == SCHED_INTERLEAVED ? 2 : 1;
    sim_pipe_simulate((ScheduleKind)kind, 8, 32, v, 1.0 / v, 2.0 / v, 0, &a);
    sim_pipe_simulate((ScheduleKind)kind, 8, 32, v, 1.0 / v, 2.0 / v, x, &b);
    UT_CHECK(b.step_s >= a.step_s + 2 * 7 * x - 1e-9, "%s: %g with transfers, %g without", sim_pipe_name(kind),
             b.step_s, a.step_s);
  }
  /* through sim_pipe_build with lags instead of p2p streams: the same gpipe step */
  SimGraph *g = sim_graph_new();
  int cs[4];
  for (int s = 0; s < 4; s++) cs[s] = sim_stream_add(g, sim_device_add(g, "stage", 1), SIM_STREAM_COMPUTE, NULL);
  ut_true("build", sim_pipe_build(g, SCHED_GPIPE, 4, 8, 1, cs, NULL, NULL, NULL, NULL, NULL));
  ut_true("runs (zero durations)", sim_run(g));
  near("all zero", sim_makespan(g), 0);
  sim_graph_free(g);
  ut_end();
}

/* The book's --tokens arithmetic (hardware-and-costs.md, issue 11): LLaMA-3 70B on 15T tokens,
 * 6 x 70e9 x 15e12 = 6.3e24 FLOPs, on 8960 v5p (4.59e14) at 40% MFU: 6.3e24 / (8960 x 4.59e14 x 0.4)
 * = 3.83e6 s = 44.3 days. */
static void test_train_arithmetic(void) {
  ut_begin("time to train: LLaMA-3 70B, 15T tokens, 8960 v5p at 40% MFU is about 44 days");
  double flops = 6 * 70e9 * 15e12;
  near("6.3e24 FLOPs", flops, 6.3e24);
  double days = sim_train_seconds(flops, 8960, 4.59e14, 0.4) / 86400;
  near("days", days, 6.3e24 / (8960 * 4.59e14 * 0.4) / 86400);
  ut_near("the book's ~44 days", days, 44, 0.02);
  /* MFU of a step: 1 s for 8960 x 4.59e14 x 0.4 FLOPs is 40% */
  near("mfu", sim_mfu(8960 * 4.59e14 * 0.4, 1, 8960, 4.59e14), 0.4);
  ut_true("degenerate", sim_mfu(1, 0, 1, 1) == 0 && sim_train_seconds(1, 1, 1, 0) == 0);
  ut_end();
}

/* Collectives take SMs (sim_device_set_contention): with factor 1.25 (a collective holding 24 of 120
 * SMs: 120 / 96) compute progresses at 0.8 while a collective runs. mm0 (2 s), then an all_reduce
 * (4 s, after mm0) beside mm1 (10 s, after mm0): over [2, 6] mm1 does 4 x 0.8 = 3.2 s of its work,
 * the remaining 6.8 s at full speed: mm1 ends at 12.8 (12 without contention). A second collective
 * on another comm stream at the same time slows it no further (the factor is per device, not per
 * collective): the same 12.8. A collective on another device does not touch it. */
static void test_contention(void) {
  ut_begin("contention: compute runs 1/factor as fast while a collective of its device runs");
  for (int variant = 0; variant < 4; variant++) {
    SimGraph *g = sim_graph_new();
    int cs, ms;
    int d = dev2(g, "d", &cs, &ms);
    int other = sim_device_add(g, "other", 1);
    int os = sim_stream_add(g, other, SIM_STREAM_COMM, NULL);
    sim_device_set_contention(g, d, variant == 0 ? 1 : 1.25);
    int m0 = sim_task_add(g, cs, 2, "mm0", NOLOC);
    int m1 = sim_task_add(g, cs, 10, "mm1", NOLOC);
    int ar = sim_task_add(g, variant == 3 ? os : ms, 4, "all_reduce", NOLOC);
    sim_dep_add(g, m0, ar, 0);
    if (variant == 2) {
      int ms2 = sim_stream_add(g, d, SIM_STREAM_COMM, "comm 2");
      int ag = sim_task_add(g, ms2, 4, "all_gather", NOLOC);
      sim_dep_add(g, m0, ag, 0);
    }
    ut_true("runs", sim_run(g));
    double want = variant == 0 || variant == 3 ? 12 : 2 + 4 + (10 - 4 * 0.8);
    char what[96];
    snprintf(what, sizeof what, "variant %d: mm1 ends at %g", variant, want);
    near(what, sim_task_end(g, m1), want);
    near("mm1 starts at 2", sim_task_start(g, m1), 2);
    SimDeviceStats st;
    sim_device_stats(g, d, &st);
    near("compute busy = mm0 + mm1 as run", st.compute_s, want);
    sim_graph_free(g);
  }
  ut_end();
}

int main(void) {
  test_chain();
  test_overlap_and_exposed();
  test_contention();
  test_fsdp_prefetch();
  test_lag_and_devices();
  test_stream_orders();
  test_join();
  test_cycles();
  test_trace();
  test_speed();
  test_pipe_orders();
  test_pipe_closed_forms();
  test_pipe_in_flight();
  test_pipe_transfers();
  test_train_arithmetic();
  return ut_summary();
}
