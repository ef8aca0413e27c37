/* timeline.c: the discrete-event scheduler behind timeline.h.
 *
 * In: devices, streams, tasks, dependencies and join groups. Out: start and end times, per-device
 * busy, exposed and idle times.
 *
 * Events are (time, kind, task), taken from a binary heap in time order: READY (a task's last
 * dependency ended, plus its lag) and DONE (a task ended: its stream is free, its successors count
 * down). All events of one instant are handled before any stream picks its next task, so that ties
 * go by program order (SIM_ORDER_PROGRAM streams take only their next task; SIM_ORDER_READY streams
 * keep a heap of ready tasks by (ready time, id)). A joined task that its stream picks holds the
 * stream until every member of its group has been picked, then all start at that instant.
 * Memory: about 100 bytes per task and 16 per dependency. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sim_int.h"

enum { ST_WAIT, ST_READY, ST_HELD, ST_STARTED, ST_DONE };

typedef struct Task {
  double dur, start, end, ready;
  double rem, rate, tlast; /* a compute task of a contended device: nominal work left, rate, when set */
  int ver;                 /* its DONE event's version (a retimed task's older events are stale) */
  const char *name;
  const Source *file;
  int line;
  int stream;
  int next;    /* next task of the same stream in program order, -1 */
  int npred;   /* dependencies not yet ended, during a run */
  int join;    /* union-find parent of the join group (itself when alone) */
  uint8_t state;
} Task;

typedef struct Stream {
  int device;
  SimStreamKind kind;
  SimOrder order;
  const char *name;
  int head, tail; /* program order */
  int cur;        /* next task to start (program order) */
  bool busy;
  bool dirty;     /* to be offered its next task at the end of this instant */
  int running;    /* the task it runs, -1 */
  int *heap;      /* SIM_ORDER_READY: ready tasks by (ready, id) */
  int nheap, capheap;
} Stream;

typedef struct Device {
  const char *name;
  int64_t represents;
  double contention; /* >= 1: compute runs this much slower while a collective runs (1: not at all) */
  int active_comm;   /* comm and p2p tasks running, during a run */
  SimDeviceStats stats;
} Device;

typedef struct Event {
  double t;
  int kind; /* 0 DONE before 1 READY at the same instant */
  int task;
  int ver;  /* DONE: the task's version when pushed */
} Event;

typedef struct Group { /* a join group during a run */
  int size, arrived;
  int first; /* members: first, then Task.next-like chain in gnext[] */
} Group;

struct SimGraph {
  Task *tasks;
  int ntasks, captasks;
  Stream *streams;
  int nstreams, capstreams;
  Device *devices;
  int ndevices, capdevices;
  int *dfrom, *dto; /* dependencies as added */
  double *dlag;
  int ndeps, capdeps;
  bool run, any_join;
  int unscheduled;
  double makespan;
  /* scratch of a run */
  int *soff, *sto; /* successors in CSR form */
  double *slag;
  Event *ev;
  int nev, capev;
  int *dirty, ndirty;
};

/* ---- growth ---- */

static void *grow(void *p, int *cap, int need, size_t elem) {
  if (need <= *cap) return p;
  int nc = *cap ? *cap : 16;
  while (nc < need) nc = nc > (1 << 29) ? need : nc * 2;
  void *q = mem_realloc(p, (size_t)nc * elem, "the simulated timeline");
  *cap = nc;
  return q;
}

static const char *const stream_kind_names[] = {
#define X(e, s) [e] = s,
  SIM_STREAM_KINDS(X)
#undef X
};

const char *sim_stream_kind_name(SimStreamKind k) {
  if ((int)k < 0 || k >= SIM_STREAM__COUNT) return "?";
  return stream_kind_names[k];
}

SimGraph *sim_graph_new(void) {
  SimGraph *g = mem_calloc(1, sizeof *g, "the simulated timeline");
  return g;
}

void sim_graph_free(SimGraph *g) {
  if (!g) return;
  for (int i = 0; i < g->nstreams; i++) free(g->streams[i].heap);
  free(g->tasks);
  free(g->streams);
  free(g->devices);
  free(g->dfrom);
  free(g->dto);
  free(g->dlag);
  free(g->soff);
  free(g->sto);
  free(g->slag);
  free(g->ev);
  free(g->dirty);
  free(g);
}

void sim_graph_reserve(SimGraph *g, int tasks, int deps) {
  if (!g) return;
  if (tasks > 0) g->tasks = grow(g->tasks, &g->captasks, tasks, sizeof *g->tasks);
  if (deps > 0) {
    int c1 = g->capdeps, c2 = g->capdeps;
    g->dfrom = grow(g->dfrom, &c1, deps, sizeof *g->dfrom);
    g->dto = grow(g->dto, &c2, deps, sizeof *g->dto);
    g->dlag = grow(g->dlag, &g->capdeps, deps, sizeof *g->dlag);
  }
}

int sim_device_add(SimGraph *g, const char *name, int64_t represents) {
  if (!g) return -1;
  g->devices = grow(g->devices, &g->capdevices, g->ndevices + 1, sizeof *g->devices);
  Device *d = &g->devices[g->ndevices];
  memset(d, 0, sizeof *d);
  d->name = name;
  d->represents = represents > 0 ? represents : 1;
  d->contention = 1;
  return g->ndevices++;
}

void sim_device_set_contention(SimGraph *g, int device, double factor) {
  if (!g || device < 0 || device >= g->ndevices) return;
  g->devices[device].contention = factor >= 1 && isfinite(factor) ? factor : 1;
}

int sim_stream_add(SimGraph *g, int device, SimStreamKind kind, const char *name) {
  if (!g || device < 0 || device >= g->ndevices || (int)kind < 0 || kind >= SIM_STREAM__COUNT) return -1;
  g->streams = grow(g->streams, &g->capstreams, g->nstreams + 1, sizeof *g->streams);
  Stream *s = &g->streams[g->nstreams];
  memset(s, 0, sizeof *s);
  s->device = device;
  s->kind = kind;
  s->order = SIM_ORDER_PROGRAM;
  s->name = name ? name : sim_stream_kind_name(kind);
  s->head = s->tail = s->cur = -1;
  return g->nstreams++;
}

void sim_stream_set_order(SimGraph *g, int stream, SimOrder order) {
  if (g && stream >= 0 && stream < g->nstreams) g->streams[stream].order = order;
}

int sim_task_add(SimGraph *g, int stream, double duration_s, const char *name, SrcLoc loc) {
  if (!g || stream < 0 || stream >= g->nstreams) return -1;
  g->tasks = grow(g->tasks, &g->captasks, g->ntasks + 1, sizeof *g->tasks);
  int id = g->ntasks++;
  Task *t = &g->tasks[id];
  t->dur = duration_s > 0 && isfinite(duration_s) ? duration_s : 0;
  t->start = t->end = NAN;
  t->ready = 0;
  t->name = name ? name : "";
  t->file = loc.file;
  t->line = loc.line;
  t->stream = stream;
  t->next = -1;
  t->npred = 0;
  t->join = id;
  t->state = ST_WAIT;
  Stream *s = &g->streams[stream];
  if (s->tail >= 0) g->tasks[s->tail].next = id;
  else s->head = id;
  s->tail = id;
  g->run = false;
  return id;
}

bool sim_dep_add(SimGraph *g, int before, int after, double lag_s) {
  if (!g || before < 0 || after < 0 || before >= g->ntasks || after >= g->ntasks || before == after) return false;
  if (g->ndeps == g->capdeps) {
    int c1 = g->capdeps, c2 = g->capdeps;
    g->dfrom = grow(g->dfrom, &c1, g->ndeps + 1, sizeof *g->dfrom);
    g->dto = grow(g->dto, &c2, g->ndeps + 1, sizeof *g->dto);
    g->dlag = grow(g->dlag, &g->capdeps, g->ndeps + 1, sizeof *g->dlag);
  }
  g->dfrom[g->ndeps] = before;
  g->dto[g->ndeps] = after;
  g->dlag[g->ndeps] = lag_s > 0 && isfinite(lag_s) ? lag_s : 0;
  g->ndeps++;
  g->run = false;
  return true;
}

static int find_root(Task *t, int x) {
  while (t[x].join != x) {
    t[x].join = t[t[x].join].join;
    x = t[x].join;
  }
  return x;
}

bool sim_task_join(SimGraph *g, int a, int b) {
  if (!g || a < 0 || b < 0 || a >= g->ntasks || b >= g->ntasks) return false;
  int ra = find_root(g->tasks, a), rb = find_root(g->tasks, b);
  if (ra != rb) g->tasks[ra > rb ? ra : rb].join = ra < rb ? ra : rb;
  g->any_join = true;
  g->run = false;
  return true;
}

int sim_dep_count(const SimGraph *g) { return g ? g->ndeps : 0; }

bool sim_dep_get(const SimGraph *g, int e, int *before, int *after) {
  if (!g || e < 0 || e >= g->ndeps) return false;
  *before = g->dfrom[e], *after = g->dto[e];
  return true;
}

int sim_task_join_group(const SimGraph *g, int task) {
  if (!g || task < 0 || task >= g->ntasks) return -1;
  int x = task;
  while (g->tasks[x].join != x) x = g->tasks[x].join;
  return x;
}

/* ---- the event heap ---- */

static bool ev_less(const Event *a, const Event *b) {
  if (a->t != b->t) return a->t < b->t;
  if (a->kind != b->kind) return a->kind < b->kind;
  return a->task < b->task;
}

static void ev_push(SimGraph *g, double t, int kind, int task) {
  g->ev = grow(g->ev, &g->capev, g->nev + 1, sizeof *g->ev);
  int i = g->nev++;
  Event e = {t, kind, task, kind == 0 ? g->tasks[task].ver : 0};
  while (i > 0) {
    int p = (i - 1) / 2;
    if (!ev_less(&e, &g->ev[p])) break;
    g->ev[i] = g->ev[p];
    i = p;
  }
  g->ev[i] = e;
}

static Event ev_pop(SimGraph *g) {
  Event top = g->ev[0], last = g->ev[--g->nev];
  int i = 0, n = g->nev;
  for (;;) {
    int c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && ev_less(&g->ev[c + 1], &g->ev[c])) c++;
    if (!ev_less(&g->ev[c], &last)) break;
    g->ev[i] = g->ev[c];
    i = c;
  }
  if (n > 0) g->ev[i] = last;
  return top;
}

/* Ready heap of a SIM_ORDER_READY stream, by (ready time, id). */
static bool rq_less(const Task *t, int a, int b) {
  if (t[a].ready != t[b].ready) return t[a].ready < t[b].ready;
  return a < b;
}

static void rq_push(SimGraph *g, Stream *s, int task) {
  s->heap = grow(s->heap, &s->capheap, s->nheap + 1, sizeof *s->heap);
  int i = s->nheap++;
  while (i > 0) {
    int p = (i - 1) / 2;
    if (!rq_less(g->tasks, task, s->heap[p])) break;
    s->heap[i] = s->heap[p];
    i = p;
  }
  s->heap[i] = task;
}

static int rq_pop(SimGraph *g, Stream *s) {
  int top = s->heap[0], last = s->heap[--s->nheap], i = 0, n = s->nheap;
  for (;;) {
    int c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && rq_less(g->tasks, s->heap[c + 1], s->heap[c])) c++;
    if (!rq_less(g->tasks, s->heap[c], last)) break;
    s->heap[i] = s->heap[c];
    i = c;
  }
  if (n > 0) s->heap[i] = last;
  return top;
}

/* ---- the run ---- */

static void mark_dirty(SimGraph *g, int stream) {
  Stream *s = &g->streams[stream];
  if (s->dirty) return;
  s->dirty = true;
  g->dirty[g->ndirty++] = stream;
}

static bool is_comm(const Stream *s) { return s->kind != SIM_STREAM_COMPUTE; }

/* A running compute task's rate changes at `now`: the work done since tlast at the old rate is
 * taken off, the rest runs at the new one, and a DONE event of a new version replaces the old. */
static void retime(SimGraph *g, int x, double now, double rate) {
  Task *t = &g->tasks[x];
  t->rem -= (now - t->tlast) * t->rate;
  if (t->rem < 0) t->rem = 0;
  t->tlast = now;
  t->rate = rate;
  t->end = now + t->rem / rate;
  t->ver++;
  ev_push(g, t->end, 0, x);
}

/* The device's collectives went from none running to some (or back): every compute task running
 * on it changes rate. */
static void contention_changed(SimGraph *g, int device, double now) {
  const Device *d = &g->devices[device];
  double rate = d->active_comm > 0 ? 1 / d->contention : 1;
  for (int i = 0; i < g->nstreams; i++) {
    const Stream *s = &g->streams[i];
    if (s->device == device && !is_comm(s) && s->running >= 0 && g->tasks[s->running].state == ST_STARTED)
      retime(g, s->running, now, rate);
  }
}

static void start_task(SimGraph *g, int x, double now) {
  Task *t = &g->tasks[x];
  Stream *s = &g->streams[t->stream];
  Device *d = &g->devices[s->device];
  t->state = ST_STARTED;
  t->start = now;
  s->running = x;
  t->rem = t->dur;
  t->tlast = now;
  t->rate = !is_comm(s) && d->active_comm > 0 ? 1 / d->contention : 1;
  t->end = now + t->dur / t->rate;
  ev_push(g, t->end, 0, x);
  if (is_comm(s) && d->contention > 1 && t->dur > 0 && d->active_comm++ == 0) contention_changed(g, s->device, now);
}

/* Offers the stream its next task at `now`. Joined tasks wait, holding their streams, until the
 * whole group is held; then all start. */
static void try_start(SimGraph *g, int stream, double now, Group *groups, const int *gnext) {
  Stream *s = &g->streams[stream];
  if (s->busy) return;
  int x = -1;
  if (s->order == SIM_ORDER_PROGRAM) {
    if (s->cur >= 0 && g->tasks[s->cur].state == ST_READY) {
      x = s->cur;
      s->cur = g->tasks[x].next;
    }
  } else if (s->nheap > 0) {
    x = rq_pop(g, s);
  }
  if (x < 0) return;
  s->busy = true;
  int root = g->any_join ? g->tasks[x].join : x;
  if (root == x && (!groups || groups[x].size <= 1)) {
    start_task(g, x, now);
    return;
  }
  g->tasks[x].state = ST_HELD;
  Group *gr = &groups[root];
  if (++gr->arrived < gr->size) return;
  for (int m = gr->first; m >= 0; m = gnext[m]) start_task(g, m, now);
}

/* Per-device busy/exposed/idle by a sweep over the start and end of every task. */
typedef struct Mark {
  double t;
  int device;
  int delta; /* +1 start, -1 end */
  int comm;  /* 0 compute, 1 comm or p2p */
} Mark;

static int mark_cmp(const void *pa, const void *pb) {
  const Mark *a = pa, *b = pb;
  if (a->device != b->device) return a->device < b->device ? -1 : 1;
  if (a->t != b->t) return a->t < b->t ? -1 : 1;
  return a->delta - b->delta; /* ends first */
}

static void device_stats(SimGraph *g) {
  for (int d = 0; d < g->ndevices; d++) {
    SimDeviceStats *st = &g->devices[d].stats;
    memset(st, 0, sizeof *st);
    st->represents = g->devices[d].represents;
    st->step_s = g->makespan;
  }
  int n = 0;
  for (int i = 0; i < g->ntasks; i++) {
    const Task *t = &g->tasks[i];
    int d = g->streams[t->stream].device;
    g->devices[d].stats.tasks++;
    if (t->state != ST_DONE) continue;
    if (t->end > g->devices[d].stats.last_end_s) g->devices[d].stats.last_end_s = t->end;
    if (t->dur > 0) n += 2;
  }
  Mark *m = mem_alloc(sizeof *m * (size_t)n, "the simulated devices' busy intervals");
  n = 0;
  for (int i = 0; i < g->ntasks; i++) {
    const Task *t = &g->tasks[i];
    if (t->state != ST_DONE || !(t->dur > 0)) continue;
    const Stream *s = &g->streams[t->stream];
    int comm = s->kind != SIM_STREAM_COMPUTE;
    m[n++] = (Mark){t->start, s->device, +1, comm};
    m[n++] = (Mark){t->end, s->device, -1, comm};
  }
  qsort(m, (size_t)n, sizeof *m, mark_cmp);
  int cnt[2] = {0, 0};
  for (int i = 0; i < n; i++) {
    SimDeviceStats *st = &g->devices[m[i].device].stats;
    if (i > 0 && m[i - 1].device == m[i].device) {
      double dt = m[i].t - m[i - 1].t;
      if (cnt[0] > 0) st->compute_s += dt;
      if (cnt[1] > 0) st->comm_s += dt;
      if (cnt[1] > 0 && cnt[0] == 0) st->exposed_comm_s += dt;
    } else {
      cnt[0] = cnt[1] = 0;
    }
    cnt[m[i].comm] += m[i].delta;
  }
  free(m);
  for (int d = 0; d < g->ndevices; d++) {
    SimDeviceStats *st = &g->devices[d].stats;
    st->idle_s = st->step_s - st->compute_s - st->exposed_comm_s;
    if (st->idle_s < 0) st->idle_s = 0;
  }
}

bool sim_run(SimGraph *g) {
  if (!g) return false;
  int n = g->ntasks;
  /* successors in CSR form */
  free(g->soff);
  free(g->sto);
  free(g->slag);
  g->soff = mem_calloc((size_t)n + 1, sizeof *g->soff, "the simulated timeline's dependencies");
  g->sto = mem_alloc(sizeof *g->sto * (size_t)g->ndeps, "the simulated timeline's dependencies");
  g->slag = mem_alloc(sizeof *g->slag * (size_t)g->ndeps, "the simulated timeline's dependencies");
  for (int i = 0; i < n; i++) {
    Task *t = &g->tasks[i];
    t->npred = 0;
    t->ready = 0;
    t->state = ST_WAIT;
    t->start = t->end = NAN;
    t->ver = 0;
  }
  for (int d = 0; d < g->ndevices; d++) g->devices[d].active_comm = 0;
  for (int e = 0; e < g->ndeps; e++) {
    g->soff[g->dfrom[e] + 1]++;
    g->tasks[g->dto[e]].npred++;
  }
  for (int i = 0; i < n; i++) g->soff[i + 1] += g->soff[i];
  int *fill = mem_alloc(sizeof *fill * (size_t)n, "the simulated timeline's dependencies");
  memcpy(fill, g->soff, sizeof *fill * (size_t)n);
  for (int e = 0; e < g->ndeps; e++) {
    int k = fill[g->dfrom[e]]++;
    g->sto[k] = g->dto[e];
    g->slag[k] = g->dlag[e];
  }
  free(fill);

  /* join groups: sizes and member chains */
  Group *groups = NULL;
  int *gnext = NULL;
  if (g->any_join) {
    groups = mem_calloc((size_t)n, sizeof *groups, "the simulated timeline's joined tasks");
    gnext = mem_alloc(sizeof *gnext * (size_t)n, "the simulated timeline's joined tasks");
    for (int i = 0; i < n; i++) groups[i].first = -1;
    for (int i = n - 1; i >= 0; i--) {
      int r = find_root(g->tasks, i);
      g->tasks[i].join = r;
      gnext[i] = groups[r].first;
      groups[r].first = i;
      groups[r].size++;
    }
  }

  for (int s = 0; s < g->nstreams; s++) {
    Stream *st = &g->streams[s];
    st->cur = st->head;
    st->busy = false;
    st->dirty = false;
    st->nheap = 0;
    st->running = -1;
  }
  free(g->dirty);
  g->dirty = mem_alloc(sizeof *g->dirty * (size_t)g->nstreams, "the simulated timeline's streams");
  g->ndirty = 0;
  g->nev = 0;
  for (int i = 0; i < n; i++)
    if (g->tasks[i].npred == 0) ev_push(g, 0, 1, i);

  int done = 0;
  double makespan = 0;
  while (g->nev > 0) {
    double now = g->ev[0].t;
    while (g->nev > 0 && g->ev[0].t == now) {
      Event e = ev_pop(g);
      Task *t = &g->tasks[e.task];
      if (e.kind == 1) { /* READY */
        t->state = ST_READY;
        Stream *s = &g->streams[t->stream];
        if (s->order == SIM_ORDER_READY) rq_push(g, s, e.task);
        mark_dirty(g, t->stream);
      } else { /* DONE */
        if (e.ver != t->ver || t->state != ST_STARTED) continue; /* retimed: a later event ends it */
        t->state = ST_DONE;
        {
          Stream *s = &g->streams[t->stream];
          Device *d = &g->devices[s->device];
          s->running = -1;
          if (is_comm(s) && d->contention > 1 && t->dur > 0 && --d->active_comm == 0) contention_changed(g, s->device, now);
        }
        done++;
        if (t->end > makespan) makespan = t->end;
        g->streams[t->stream].busy = false;
        mark_dirty(g, t->stream);
        for (int k = g->soff[e.task]; k < g->soff[e.task + 1]; k++) {
          Task *u = &g->tasks[g->sto[k]];
          double r = now + g->slag[k];
          if (r > u->ready) u->ready = r;
          if (--u->npred == 0) ev_push(g, u->ready, 1, g->sto[k]);
        }
      }
    }
    for (int i = 0; i < g->ndirty; i++) g->streams[g->dirty[i]].dirty = false;
    /* try_start may start zero-length tasks (DONE at `now`): the outer loop takes them next */
    int nd = g->ndirty;
    g->ndirty = 0;
    for (int i = 0; i < nd; i++) try_start(g, g->dirty[i], now, groups, gnext);
  }
  free(groups);
  free(gnext);
  g->unscheduled = n - done;
  g->makespan = makespan;
  g->run = true;
  device_stats(g);
  return done == n;
}

/* ---- queries ---- */

int sim_unscheduled(const SimGraph *g) { return g ? g->unscheduled : 0; }
int sim_task_count(const SimGraph *g) { return g ? g->ntasks : 0; }
int sim_device_count(const SimGraph *g) { return g ? g->ndevices : 0; }
int sim_stream_count(const SimGraph *g) { return g ? g->nstreams : 0; }

static bool task_ok(const SimGraph *g, int task) { return g && g->run && task >= 0 && task < g->ntasks; }

double sim_task_start(const SimGraph *g, int task) { return task_ok(g, task) ? g->tasks[task].start : NAN; }
double sim_task_end(const SimGraph *g, int task) { return task_ok(g, task) ? g->tasks[task].end : NAN; }
int sim_task_stream(const SimGraph *g, int task) {
  return g && task >= 0 && task < g->ntasks ? g->tasks[task].stream : -1;
}
int sim_stream_device(const SimGraph *g, int stream) {
  return g && stream >= 0 && stream < g->nstreams ? g->streams[stream].device : -1;
}
SimStreamKind sim_stream_kind(const SimGraph *g, int stream) {
  return g && stream >= 0 && stream < g->nstreams ? g->streams[stream].kind : SIM_STREAM__COUNT;
}
double sim_makespan(const SimGraph *g) { return g && g->run ? g->makespan : 0; }

bool sim_device_stats(const SimGraph *g, int device, SimDeviceStats *out) {
  if (!g || !g->run || device < 0 || device >= g->ndevices) return false;
  if (out) *out = g->devices[device].stats;
  return true;
}

/* ---- for trace.c ---- */

const char *sim__device_name(const SimGraph *g, int device) { return g->devices[device].name; }
int64_t sim__device_represents(const SimGraph *g, int device) { return g->devices[device].represents; }
const char *sim__stream_name(const SimGraph *g, int stream) { return g->streams[stream].name; }
const char *sim__task_name(const SimGraph *g, int task, const char **file, int *line) {
  const Task *t = &g->tasks[task];
  *file = t->file ? t->file->path : NULL;
  *line = t->line;
  return t->name;
}
bool sim__ran(const SimGraph *g) { return g && g->run; }

/* ---- step-level arithmetic ---- */

double sim_mfu(double model_flops_per_step, double step_s, double devices, double peak_flops) {
  double denom = step_s * devices * peak_flops;
  return denom > 0 ? model_flops_per_step / denom : 0;
}

double sim_train_seconds(double total_flops, double devices, double peak_flops, double mfu) {
  double rate = devices * peak_flops * mfu;
  return rate > 0 ? total_flops / rate : 0;
}
