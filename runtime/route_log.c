/* route_log.c: routing decisions shared between two runs (shardrt.h, RtRouteLog). */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

typedef struct RouteGroup {
  int64_t E, T;
  int k;
  double *logits;   /* [T][E] */
  int64_t *choice;  /* [T][k] */
} RouteGroup;

struct RtRouteLog {
  pthread_mutex_t lock;
  RouteGroup *groups;
  int64_t n, cap;
  _Atomic int64_t tokens, followed;
};

RtRouteLog *rt_route_log_new(void) {
  RtRouteLog *log = calloc(1, sizeof *log);
  if (log) pthread_mutex_init(&log->lock, NULL);
  return log;
}

void rt_route_log_clear(RtRouteLog *log) {
  if (!log) return;
  for (int64_t i = 0; i < log->n; i++) free(log->groups[i].logits), free(log->groups[i].choice);
  log->n = 0;
}

void rt_route_log_free(RtRouteLog *log) {
  if (!log) return;
  rt_route_log_clear(log);
  free(log->groups);
  pthread_mutex_destroy(&log->lock);
  free(log);
}

void rt_route_log_counts(const RtRouteLog *log, int64_t *tokens, int64_t *followed) {
  *tokens = log ? log->tokens : 0;
  *followed = log ? log->followed : 0;
}

static void record(RtRouteLog *log, int64_t E, int64_t T, int k, const double *logits, const int64_t *choice) {
  RouteGroup g = {.E = E, .T = T, .k = k, .logits = malloc(sizeof(double) * (size_t)(T * E > 0 ? T * E : 1)),
                  .choice = malloc(sizeof(int64_t) * (size_t)(T * k > 0 ? T * k : 1))};
  if (!g.logits || !g.choice) { /* out of memory: this group is not followed later, nothing worse */
    free(g.logits), free(g.choice);
    return;
  }
  memcpy(g.logits, logits, sizeof(double) * (size_t)(T * E));
  memcpy(g.choice, choice, sizeof(int64_t) * (size_t)(T * k));
  pthread_mutex_lock(&log->lock);
  if (log->n == log->cap) {
    int64_t cap = log->cap ? 2 * log->cap : 64;
    RouteGroup *grown = realloc(log->groups, sizeof *grown * (size_t)cap);
    if (!grown) {
      pthread_mutex_unlock(&log->lock);
      free(g.logits), free(g.choice);
      return;
    }
    log->groups = grown, log->cap = cap;
  }
  log->groups[log->n++] = g;
  pthread_mutex_unlock(&log->lock);
}

/* The recorded group nearest to these logits (largest elementwise difference), if within 1/16 of
 * their largest magnitude; NULL otherwise. The log is read-only while a following run runs. */
static const RouteGroup *nearest(const RtRouteLog *log, int64_t E, int64_t T, int k, const double *logits) {
  double scale = 0;
  for (int64_t i = 0; i < T * E; i++) {
    if (!isfinite(logits[i])) return NULL;
    scale = fmax(scale, fabs(logits[i]));
  }
  const RouteGroup *best = NULL;
  double best_d = INFINITY;
  for (int64_t g = 0; g < log->n; g++) {
    const RouteGroup *r = &log->groups[g];
    if (r->E != E || r->T != T || r->k != k) continue;
    double d = 0;
    for (int64_t i = 0; i < T * E && d < best_d; i++) d = fmax(d, fabs(logits[i] - r->logits[i]));
    if (d < best_d) best_d = d, best = r;
  }
  return best && best_d <= scale / 16 ? best : NULL;
}

void rtroute_settle(RtDevice *dev, int64_t E, int64_t T, int k, const double *logits, int64_t *choice) {
  Runtime *rt = dev->rt;
  RtRouteLog *log = rt->route_log;
  if (!log || rt->route_mode == RT_ROUTE_OWN) return;
  if (rt->route_mode == RT_ROUTE_RECORD) {
    record(log, E, T, k, logits, choice);
    return;
  }
  log->tokens += T;
  const RouteGroup *r = nearest(log, E, T, k, logits);
  if (!r) return;
  for (int64_t j = 0; j < T; j++) {
    const int64_t *own = choice + j * k, *rec = r->choice + j * k;
    if (!memcmp(own, rec, sizeof(int64_t) * (size_t)k)) continue;
    const double *l = logits + j * E, *lr = r->logits + j * E;
    double d = 0; /* this token's logits: how far apart the two runs put them */
    for (int64_t x = 0; x < E; x++) d = fmax(d, fabs(l[x] - lr[x]));
    bool rounding = true; /* each recorded choice as good as its own, within 2 d */
    for (int q = 0; q < k && rounding; q++)
      rounding = rec[q] >= 0 && rec[q] < E && own[q] >= 0 && l[rec[q]] >= l[own[q]] - 2 * d;
    if (!rounding) continue;
    memcpy(choice + j * k, rec, sizeof(int64_t) * (size_t)k);
    log->followed++;
  }
}

/* rank 0's groups as one buffer: per group E, T, k, then its logits and its choices */
int rt_route_log_share(Runtime *rt, RtRouteLog *log) {
  if (rt_process_count(rt) <= 1 || !log) return 1;
  bool root = rt_process_rank(rt) == 0;
  int64_t head[2] = {log->n, 0}; /* groups, bytes */
  for (int64_t g = 0; root && g < log->n; g++) {
    const RouteGroup *r = &log->groups[g];
    head[1] += (int64_t)(3 * sizeof(int64_t) + sizeof(double) * (size_t)(r->T * r->E) + sizeof(int64_t) * (size_t)(r->T * r->k));
  }
  rt_bcast_from_root(rt, head, sizeof head);
  char *buf = head[1] ? malloc((size_t)head[1]) : NULL;
  char msg[64] = "out of host memory for the routing decisions";
  if (!rt_processes_agree(rt, head[1] == 0 || buf, msg, sizeof msg)) {
    free(buf);
    if (!root) rt_route_log_clear(log);
    return 0;
  }
  char *at = buf;
  for (int64_t g = 0; root && g < log->n; g++) {
    const RouteGroup *r = &log->groups[g];
    int64_t h[3] = {r->E, r->T, r->k};
    memcpy(at, h, sizeof h), at += sizeof h;
    memcpy(at, r->logits, sizeof(double) * (size_t)(r->T * r->E)), at += sizeof(double) * (size_t)(r->T * r->E);
    memcpy(at, r->choice, sizeof(int64_t) * (size_t)(r->T * r->k)), at += sizeof(int64_t) * (size_t)(r->T * r->k);
  }
  rt_bcast_from_root(rt, buf, (size_t)head[1]);
  if (!root) {
    rt_route_log_clear(log);
    at = buf;
    for (int64_t g = 0; g < head[0]; g++) {
      int64_t h[3];
      memcpy(h, at, sizeof h), at += sizeof h;
      const double *logits = (const double *)at;
      at += sizeof(double) * (size_t)(h[1] * h[0]);
      record(log, h[0], h[1], (int)h[2], logits, (const int64_t *)at);
      at += sizeof(int64_t) * (size_t)(h[1] * h[2]);
    }
  }
  free(buf);
  return 1;
}
