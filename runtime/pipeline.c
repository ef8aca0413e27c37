/* pipeline.c: a pipeline stage on one device (rt_pipeline), and the AllReduce among the devices of
 * a subset of groups that a tied param's first and last stage need (rt_all_reduce_group);
 * shardrt.h. The stages, the peers and the rows of a chunk are the compiler's (RtPipe's stage
 * groups, each action's row0, which stages hold a result): nothing here works them out.
 *
 * rt_pipeline follows compiler/interp/interp_pipe.c, the semantic contract: the device runs its
 * stage's actions in the schedule's order. A region's inputs are bound from their slots (views into
 * the operands for a microbatch's row or a chunk's rows; the mailbox's activation, taken; the
 * store's residuals), the region function runs, and its outputs (new buffers it hands over) go to
 * the mailbox (an activation or gradient for the next region), the store (residuals, freed after
 * the chunk's backward), the accumulators (added in f64, rounded to the accumulator's dtype) or the
 * results. A send moves a mailbox entry to the device of the peer stage with the same coordinates
 * on every other axis; a receive waits for it. Under a send split each device of the split group
 * sends 1/n of the activation and the receivers all-gather it. */
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

int rt_all_reduce_group(RtDevice *dev, const RtGroups *G, RtDtype dt, RtReduceOp op, const void *in, void *out,
                        int64_t count) {
  RtGroup g;
  int rc = rtgroup_lookup(dev, G, "all_reduce among a group", &g);
  if (rc) return rc;
  size_t esz = rt_dtype_size(dt), bytes = (size_t)count * esz;
  int n = g.size, me = g.rank;
  if (!esz || count < 0 || n > 64) return rtrun_fail(dev, RT_E_ARG, "all_reduce among a group over %s: bad arguments", g.text);
  void *parts[64] = {0};
  for (int i = 0; i < n && rc == RT_OK; i++) /* send first: sends never block */
    if (i != me) rc = rt_send(dev, rtgroup_member(&g, i), RT_TAG_GROUP, in, bytes);
  for (int i = 0; i < n && rc == RT_OK; i++) {
    if (i == me) continue;
    rc = rt_alloc(dev, bytes ? bytes : 1, "all_reduce group part", &parts[i]);
    if (rc == RT_OK) rc = rt_recv(dev, rtgroup_member(&g, i), RT_TAG_GROUP, parts[i], bytes);
  }
  if (rc == RT_OK) {
    parts[me] = (void *)in;
    for (int64_t e = 0; e < count; e++) { /* every member sums in the same order */
      double v = rtk_get(parts[0], dt, e);
      for (int i = 1; i < n; i++) {
        double w = rtk_get(parts[i], dt, e);
        v = op == RT_MAX ? (w > v ? w : v) : v + w;
      }
      rtk_put(out, dt, e, v);
    }
    parts[me] = NULL;
    rtrun_count(dev, RT_COLL_ALL_REDUCE, g.mask, n > 0 ? 2.0 * (n - 1) / n * (double)bytes : 0);
  }
  for (int i = 0; i < n; i++)
    if (i != me) rt_free(dev, parts[i]);
  return rc;
}

/* ---- rt_pipeline ---- */

typedef struct Run {
  RtDevice *dev;
  const RtPipe *p;
  void *const *ops;
  void **res;
  int stage, G;
  RtGroup stages;       /* the device's group over the stage axes: its rank is the stage */
  void **mail;          /* [(dir (G + 1) + slot) N + mb] */
  void **saved;         /* [(mb G + g) nsave + k] */
} Run;

static int mail_index(const Run *R, int bwd, int slot, int mb) {
  return ((bwd ? R->G + 1 : 0) + slot) * R->p->microbatches + mb;
}

static int peer_device(const Run *R, int stage) { return stage >= 0 && stage < R->stages.size ? rtgroup_member(&R->stages, stage) : -1; }

/* The mailbox slot a region's activation input reads, or its activation output fills. */
static int act_slot(const Run *R, int r, int g, bool out) {
  if (out) return r == RT_PR_FIRST ? 0 : r == RT_PR_CHUNK_FWD ? g + 1 : r == RT_PR_LAST ? R->G : g;
  return r == RT_PR_LAST ? R->G : r == RT_PR_FIRST_BWD ? 0 : r == RT_PR_CHUNK_BWD ? g + 1 : g;
}

static int run_region(Run *R, int r, int mb, int g, int64_t row0) {
  const RtPipe *p = R->p;
  RtDevice *dev = R->dev;
  if (!p->region[r]) return rtrun_fail(dev, RT_E_ARG, "%s: the schedule runs a region the pipeline lacks", p->where);
  int nin = p->nin[r], nout = p->nout[r];
  void **in = calloc((size_t)nin + 1, sizeof *in), **out = calloc((size_t)nout + 1, sizeof *out);
  void **taken = calloc((size_t)nin + 1, sizeof *taken); /* mailbox entries this region consumes */
  if (!in || !out || !taken) {
    free(in), free(out), free(taken);
    return rtrun_fail(dev, RT_E_NOMEM, "%s: out of host memory", p->where);
  }
  int rc = RT_OK;
  bool bwd = r == RT_PR_CHUNK_BWD || r == RT_PR_FIRST_BWD;
  for (int i = 0; i < nin && rc == RT_OK; i++) {
    const RtPipeSlot *sl = &p->in[r][i];
    switch (sl->kind) {
    case RT_PIN_ENV: {
      char *x = R->ops[sl->index];
      in[i] = x && sl->index < p->nslices ? x + (int64_t)mb * p->row_bytes[sl->index] : x;
      break;
    }
    case RT_PIN_CHUNK: {
      char *x = R->ops[sl->index];
      in[i] = x ? x + row0 * p->row_bytes[sl->index] : NULL;
      break;
    }
    case RT_PIN_ACT: {
      void **box = &R->mail[mail_index(R, bwd, act_slot(R, r, g, false), mb)];
      in[i] = taken[i] = *box;
      *box = NULL;
      break;
    }
    case RT_PIN_SAVED: in[i] = R->saved[((int64_t)mb * R->G + g) * p->nsave + sl->index]; break;
    }
    if (!in[i])
      rc = rtrun_fail(dev, RT_E_ARG, "%s: stage %d, microbatch %d, chunk %d: region input %d has no value", p->where, R->stage, mb, g, i);
  }
  if (rc == RT_OK) rc = p->region[r](dev, in, out);
  for (int j = 0; j < nout && rc == RT_OK; j++) {
    const RtPipeSlot *sl = &p->out[r][j];
    switch (sl->kind) {
    case RT_POUT_ACT: {
      void **box = &R->mail[mail_index(R, r != RT_PR_FIRST && r != RT_PR_CHUNK_FWD, act_slot(R, r, g, true), mb)];
      rt_free(dev, *box);
      *box = out[j];
      out[j] = NULL;
      break;
    }
    case RT_POUT_SAVE: {
      void **slot = &R->saved[((int64_t)mb * R->G + g) * p->nsave + sl->index];
      rt_free(dev, *slot);
      *slot = out[j];
      out[j] = NULL;
      break;
    }
    case RT_POUT_ACC: {
      void *a = R->res[sl->index];
      if (!a) {
        rc = rtrun_fail(dev, RT_E_ARG, "%s: accumulator %d has no value on stage %d", p->where, sl->index, R->stage);
        break;
      }
      RtDtype adt = (RtDtype)p->acc_dtype[sl->index];
      int64_t off = 0;
      if (r == RT_PR_CHUNK_BWD) { /* into the chunk's rows */
        int64_t row_elems = p->row_bytes[p->nslices + sl->index] / (int64_t)rt_dtype_size(adt);
        off = row0 * row_elems;
      }
      if (off + sl->count > p->acc_count[sl->index]) {
        rc = rtrun_fail(dev, RT_E_ARG, "%s: a gradient of %lld elements past accumulator %d's %lld", p->where,
                        (long long)sl->count, sl->index, (long long)p->acc_count[sl->index]);
        break;
      }
      for (int64_t e = 0; e < sl->count; e++)
        rtk_put(a, adt, off + e, rtk_get(a, adt, off + e) + rtk_get(out[j], (RtDtype)sl->dtype, e));
      break;
    }
    case RT_POUT_RESULT:
      rt_free(dev, R->res[sl->index]);
      R->res[sl->index] = out[j];
      out[j] = NULL;
      break;
    }
  }
  for (int j = 0; j < nout; j++) rt_free(dev, out[j]);
  for (int i = 0; i < nin; i++) rt_free(dev, taken[i]);
  if (rc == RT_OK && r == RT_PR_CHUNK_BWD) /* the chunk's residuals are read once */
    for (int k = 0; k < p->nsave; k++) {
      void **slot = &R->saved[((int64_t)mb * R->G + g) * p->nsave + k];
      rt_free(dev, *slot);
      *slot = NULL;
    }
  free(in), free(out), free(taken);
  return rc;
}

/* The slot (dtype, elements) of what a transfer carries: the receiving region's activation input. */
static const RtPipeSlot *transfer_slot(const Run *R, const RtPipeAction *a) {
  const RtPipe *p = R->p;
  int slot = a->backward ? a->chunk + 1 : a->chunk;
  int r = a->backward ? (slot == 0 ? RT_PR_FIRST_BWD : RT_PR_CHUNK_BWD) : (slot == R->G ? RT_PR_LAST : RT_PR_CHUNK_FWD);
  for (int i = 0; i < p->nin[r]; i++)
    if (p->in[r][i].kind == RT_PIN_ACT) return &p->in[r][i];
  return NULL;
}

static int transfer(Run *R, const RtPipeAction *a) {
  const RtPipe *p = R->p;
  RtDevice *dev = R->dev;
  int slot = a->backward ? a->chunk + 1 : a->chunk;
  int k = mail_index(R, a->backward, slot, a->mb);
  int peer = peer_device(R, a->peer);
  const RtPipeSlot *sl = transfer_slot(R, a);
  if (peer < 0 || !sl) return rtrun_fail(dev, RT_E_ARG, "%s: a transfer to stage %d the pipeline cannot make", p->where, a->peer);
  RtDtype dt = (RtDtype)sl->dtype;
  size_t esz = rt_dtype_size(dt), bytes = (size_t)sl->count * esz;
  int tag = k;
  /* the send split: rank r of the split group sends part r; the receivers all-gather the parts */
  RtGroup split = {.size = 1};
  if (p->split) {
    int rc = rtgroup_lookup(dev, p->split, "a pipeline's send split", &split);
    if (rc) return rc;
  }
  int n = split.size, rank = split.rank;
  if (n < 1 || sl->count % n) n = 1, rank = 0;
  size_t part = bytes / (size_t)n;
  if (a->kind == RT_PA_SEND) {
    void *x = R->mail[k];
    if (!x) return rtrun_fail(dev, RT_E_ARG, "%s: stage %d sends what it does not hold", p->where, R->stage);
    int rc = rt_send(dev, peer, tag, (char *)x + (size_t)rank * part, part);
    rt_free(dev, x);
    R->mail[k] = NULL;
    if (rc == RT_OK) rtrun_count(dev, RT_COLL_PERMUTE, R->stages.mask, (double)part); /* a transfer: a permute over the stages */
    return rc;
  }
  void *x = NULL, *tmp = NULL;
  int rc = rt_alloc(dev, bytes ? bytes : 1, a->backward ? "pipeline gradient" : "pipeline activation", &x);
  if (rc == RT_OK && n > 1) rc = rt_alloc(dev, part ? part : 1, "pipeline part", &tmp);
  if (rc == RT_OK) rc = rt_recv(dev, peer, tag, n > 1 ? tmp : x, part);
  if (rc == RT_OK && n > 1) rc = rt_all_gather(dev, p->split, dt, tmp, x, 1, sl->count / n, 1);
  rt_free(dev, tmp);
  if (rc != RT_OK) {
    rt_free(dev, x);
    return rc;
  }
  rt_free(dev, R->mail[k]);
  R->mail[k] = x;
  return RT_OK;
}

int rt_pipeline(RtDevice *dev, const RtPipe *p, void *const *operands, void **results) {
  Run R = {.dev = dev, .p = p, .ops = operands, .res = results, .G = p->stages * p->chunks};
  int rc0 = rtgroup_lookup(dev, p->stage_groups, p->where, &R.stages);
  if (rc0) return rc0;
  R.stage = R.stages.rank;
  if (R.stage >= p->stages || R.stages.size != p->stages) return rtrun_fail(dev, RT_E_ARG, "%s: no stage for this device", p->where);
  int64_t nmail = 2 * (int64_t)(R.G + 1) * p->microbatches, nsaved = (int64_t)p->microbatches * R.G * (p->nsave > 0 ? p->nsave : 1);
  R.mail = calloc((size_t)nmail, sizeof(void *));
  R.saved = calloc((size_t)nsaved, sizeof(void *));
  int rc = R.mail && R.saved ? RT_OK : rtrun_fail(dev, RT_E_NOMEM, "%s: out of host memory", p->where);
  for (int k = 0; k < p->nresults; k++) results[k] = NULL;
  /* accumulators start as the carried operands (zeros) */
  for (int k = 0; rc == RT_OK && k < p->ncarried; k++) {
    const void *x = operands[p->nslices + k];
    if (!x) continue;
    size_t bytes = (size_t)p->acc_count[k] * rt_dtype_size((RtDtype)p->acc_dtype[k]);
    rc = rt_alloc(dev, bytes ? bytes : 1, "pipeline accumulator", &results[k]);
    if (rc == RT_OK) memcpy(results[k], x, bytes);
  }
  static const int region_of[] = {[RT_PA_FIRST] = RT_PR_FIRST, [RT_PA_FWD] = RT_PR_CHUNK_FWD, [RT_PA_LAST] = RT_PR_LAST,
                                   [RT_PA_BWD] = RT_PR_CHUNK_BWD, [RT_PA_FIRST_BWD] = RT_PR_FIRST_BWD};
  int last_region = -1;
  for (int i = p->first_action[R.stage]; rc == RT_OK && i < p->first_action[R.stage + 1]; i++) {
    const RtPipeAction *a = &p->actions[i];
    switch (a->kind) {
    case RT_PA_FIRST: case RT_PA_FWD: case RT_PA_LAST: case RT_PA_BWD: case RT_PA_FIRST_BWD:
      last_region = region_of[a->kind];
      rc = run_region(&R, last_region, a->mb, a->chunk, a->row0);
      rt_clock_add(dev, RT_CLOCK_COMPUTE, p->clock_acc[last_region]);
      break;
    case RT_PA_SEND:
      rt_clock_add(dev, RT_CLOCK_COMM, p->clock_send[last_region >= 0 ? last_region : a->backward ? RT_PR_LAST : RT_PR_FIRST]);
      rc = transfer(&R, a);
      break;
    case RT_PA_RECV: rc = transfer(&R, a); break;
    default: rc = rtrun_fail(dev, RT_E_ARG, "%s: an unknown pipeline action", p->where);
    }
  }
  for (int64_t i = 0; R.mail && i < nmail; i++) rt_free(dev, R.mail[i]);
  for (int64_t i = 0; R.saved && i < nsaved; i++) rt_free(dev, R.saved[i]);
  free(R.mail);
  free(R.saved);
  /* results only on the stages that hold them */
  for (int k = 0; k < p->nresults; k++)
    if (rc != RT_OK || (p->result_on && !p->result_on[(int64_t)k * p->stages + R.stage])) {
      rt_free(dev, results[k]);
      results[k] = NULL;
    }
  return rc;
}
