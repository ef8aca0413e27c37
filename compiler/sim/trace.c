/* trace.c: the Chrome trace of a simulated timeline (timeline.h's sim_trace_json / _write).
 *
 * In: a SimGraph after sim_run. Out: the Trace Event Format's JSON object, which Perfetto
 * (ui.perfetto.dev) and chrome://tracing open: {"traceEvents": [...], "displayTimeUnit": "ms",
 * "otherData": {...}}. Each simulated device is a process (pid = device id, named by a
 * "process_name" metadata event), each stream a thread of it (tid = stream id, "thread_name" and
 * "thread_sort_index"), each task a complete event ("ph": "X") with ts and dur in microseconds,
 * named after its op or collective and its source line. Built with cJSON. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "outfile.h"
#include "sim_int.h"

/* The last path component: traces name files as the user sees them in diagnostics' short form. */
static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

static cJSON *meta(const char *what, int pid, int tid, const char *key, cJSON *value) {
  cJSON *e = cJSON_CreateObject(), *args = cJSON_CreateObject();
  cJSON_AddStringToObject(e, "name", what);
  cJSON_AddStringToObject(e, "ph", "M");
  cJSON_AddNumberToObject(e, "pid", pid);
  if (tid >= 0) cJSON_AddNumberToObject(e, "tid", tid);
  cJSON_AddItemToObject(args, key, value);
  cJSON_AddItemToObject(e, "args", args);
  return e;
}

static cJSON *trace_build(const SimGraph *g) {
  cJSON *root = cJSON_CreateObject(), *events = cJSON_CreateArray();
  if (!root || !events) return NULL;
  cJSON_AddItemToObject(root, "traceEvents", events);
  cJSON_AddStringToObject(root, "displayTimeUnit", "ms");
  for (int d = 0; d < sim_device_count(g); d++) {
    char buf[64];
    const char *name = sim__device_name(g, d);
    if (!name) snprintf(buf, sizeof buf, "device %d", d), name = buf;
    cJSON_AddItemToArray(events, meta("process_name", d, -1, "name", cJSON_CreateString(name)));
    cJSON_AddItemToArray(events, meta("process_sort_index", d, -1, "sort_index", cJSON_CreateNumber(d)));
  }
  for (int s = 0; s < sim_stream_count(g); s++) {
    int d = sim_stream_device(g, s);
    cJSON_AddItemToArray(events, meta("thread_name", d, s, "name", cJSON_CreateString(sim__stream_name(g, s))));
    cJSON_AddItemToArray(events, meta("thread_sort_index", d, s, "sort_index", cJSON_CreateNumber(s)));
  }
  for (int i = 0; i < sim_task_count(g); i++) {
    double t0 = sim_task_start(g, i), t1 = sim_task_end(g, i);
    if (!(t0 == t0)) continue; /* unscheduled */
    const char *file;
    int line;
    const char *name = sim__task_name(g, i, &file, &line);
    int s = sim_task_stream(g, i), d = sim_stream_device(g, s);
    char label[512], where[320];
    where[0] = 0;
    if (file && line > 0) snprintf(where, sizeof where, "%s:%d", base_name(file), line);
    if (where[0]) snprintf(label, sizeof label, "%s (%s)", name, where);
    else snprintf(label, sizeof label, "%s", name);
    cJSON *e = cJSON_CreateObject(), *args = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", label);
    cJSON_AddStringToObject(e, "cat", sim_stream_kind_name(sim_stream_kind(g, s)));
    cJSON_AddStringToObject(e, "ph", "X");
    cJSON_AddNumberToObject(e, "ts", t0 * 1e6);
    cJSON_AddNumberToObject(e, "dur", (t1 - t0) * 1e6);
    cJSON_AddNumberToObject(e, "pid", d);
    cJSON_AddNumberToObject(e, "tid", s);
    if (where[0]) cJSON_AddStringToObject(args, "loc", where);
    if (sim__device_represents(g, d) > 1)
      cJSON_AddNumberToObject(args, "represents", (double)sim__device_represents(g, d));
    cJSON_AddItemToObject(e, "args", args);
    cJSON_AddItemToArray(events, e);
  }
  cJSON *other = cJSON_CreateObject();
  cJSON_AddStringToObject(other, "generator", "shardc sim");
  cJSON_AddNumberToObject(other, "step_time_s", sim_makespan(g));
  cJSON_AddItemToObject(root, "otherData", other);
  return root;
}

char *sim_trace_json(const SimGraph *g) {
  if (!sim__ran(g)) return NULL;
  cJSON *root = trace_build(g);
  if (!root) return NULL;
  char *text = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  return text;
}

bool sim_trace_write(const SimGraph *g, const char *path) {
  if (!path) return false;
  char *text = sim_trace_json(g), err[512];
  OutFile *f = text ? outfile_open(path, OUTFILE_DATA, err, sizeof err) : NULL;
  if (f) fprintf(outfile_stream(f), "%s\n", text);
  free(text);
  return f && outfile_commit(f, err, sizeof err);
}
