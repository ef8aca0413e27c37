/* run_host.c: run_host.h's functions: blocks in, the runtime's threads, blocks out. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "devprog.h"
#include "run_host.h"
#include "step.h"

/* One side of the comparison: a runtime, the module's view (mesh NULL: global), per device its
 * slots (inputs, params, outputs), and per slot how its value is placed on the devices (the device
 * program's description, which the runtime's block placement follows: shardrt.h's RtPlace). */
struct RunSide {
  const IrModule *m;
  const Mesh *mesh;
  Runtime *rt;
  int ndev;
  int nin, nparams, nout, nslots;
  void ***slots;
  const Value **pval;   /* per param: main's OP_PARAM value (its sharding), or NULL */
  RtPlace *place;       /* per slot */
  Arena arena;          /* the placements' arrays */
  RtEntry fn;
  double seconds;       /* summed over the steps' runs */
};

uint8_t run_value_place(const IrModule *m, const Value *v) {
  return m->dev && m->dev->mesh ? dev_value(m->dev, v)->place : PLACE_ALL;
}

/* Puts dev's block of slot k's value into a new buffer on dev: cut from the whole tensor g, or
 * generated (the runtime's block placement). */
static bool place(RunSide *s, int k, int dev, const Tensor *g, const RunGen *gen, uint64_t seed, void **out, const char *name) {
  const RtPlace *pl = &s->place[k];
  int64_t n = rt_place_elements(pl);
  if (rt_alloc(rt_device(s->rt, dev), (size_t)(n > 0 ? n : 1) * rt_dtype_size((RtDtype)pl->dtype), name, out) != RT_OK) return false;
  return rt_place_fill(pl, dev, *out, g ? g->data : NULL, seed, gen ? gen->key : 0, gen ? gen->lo : 0, gen ? gen->hi : 0) == RT_OK;
}

/* The whole value of output j from the devices' blocks (each block once, partial sums added: the
 * runtime's block placement, read back). */
static double *assemble(const RunSide *s, const Value *v, int slot) {
  int64_t n = tensor_type_elements(&v->type);
  bool root = rt_process_rank(s->rt) == 0; /* under MPI rank 0 assembles, the others send their blocks */
  double *g = root ? calloc((size_t)(n > 0 ? n : 1), sizeof *g) : NULL;
  if (!g && rt_process_count(s->rt) == 1) return NULL;
  const RtPlace *pl = &s->place[slot];
  size_t bytes = (size_t)rt_place_elements(pl) * rt_dtype_size((RtDtype)pl->dtype);
  for (int dev = 0; dev < s->ndev; dev++) {
    if (!rt_place_holds(pl, dev) || (pl->take && !pl->take[dev])) continue; /* every process skips the same */
    /* under MPI the block comes to rank 0 (every rank makes the same calls) */
    void *scratch = g && !rt_device_local(s->rt, dev) ? malloc(bytes ? bytes : 1) : NULL;
    if (g && !rt_device_local(s->rt, dev) && !scratch) free(g), g = NULL; /* rt_fetch_to_root drops what it cannot keep */
    const void *buf = rt_fetch_to_root(s->rt, dev, s->slots[dev][slot], bytes, scratch);
    if (buf && g) rt_place_gather(pl, dev, buf, g);
    free(scratch);
  }
  return g; /* NULL but on rank 0 */
}

RunSide *run_side_open(const IrModule *m, const Mesh *mesh, RtEntry fn, const RtConfig *cfg, char *err, size_t n) {
  RunSide *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, n, "out of host memory");
    return NULL;
  }
  s->m = m, s->mesh = mesh, s->fn = fn;
  RtConfig c = *cfg;
  c.naxes = mesh ? mesh->naxes : 0;
  for (int a = 0; a < c.naxes; a++) c.axis_size[a] = mesh->axes[a].size, c.axis_name[a] = mesh->axes[a].name;
  if (rt_open(&c, &s->rt) != RT_OK) {
    snprintf(err, n, "%s", s->rt ? rt_errmsg(s->rt) : "out of memory");
    run_side_close(s);
    return NULL;
  }
  s->ndev = rt_device_count(s->rt);
  s->nin = m->main->ninputs;
  s->nparams = m->nparams;
  s->nout = m->main->noutputs;
  s->nslots = s->nin + s->nparams + s->nout;
  s->slots = calloc((size_t)s->ndev, sizeof *s->slots);
  for (int d = 0; s->slots && d < s->ndev; d++)
    if (!(s->slots[d] = calloc((size_t)s->nslots + 1, sizeof(void *)))) break;
  s->pval = calloc((size_t)s->nparams + 1, sizeof *s->pval);
  bool ok = s->slots && s->pval;
  for (int d = 0; ok && d < s->ndev; d++) ok = s->slots[d] != NULL;
  if (!ok) {
    snprintf(err, n, "out of host memory for the devices' slot tables");
    run_side_close(s);
    return NULL;
  }
  for (const Op *op = m->main->first; op; op = op->next)
    if (op->kind == OP_PARAM && op->index >= 0 && op->index < s->nparams) s->pval[op->index] = op->results[0];
  arena_init(&s->arena);
  s->place = ARENA_ARRAY(&s->arena, RtPlace, s->nslots + 1);
  DevModule *dm = mesh ? m->dev : NULL;
  if (mesh && (!dm || dm->mesh != mesh)) {
    snprintf(err, n, "the program has no device program for mesh %s", mesh->name ? mesh->name : "?");
    run_side_close(s);
    return NULL;
  }
  for (int i = 0; i < s->nin; i++) { /* by slot: the OP_INPUT's index */
    const Value *v = m->main->inputs[i];
    int slot = v->def && v->def->kind == OP_INPUT ? v->def->index : i;
    if (slot >= 0 && slot < s->nin) devprog_place(dm, &s->arena, v, &s->place[slot]);
  }
  for (int p = 0; p < s->nparams; p++)
    if (s->pval[p]) devprog_place(dm, &s->arena, s->pval[p], &s->place[s->nin + p]);
  for (int j = 0; j < s->nout; j++) devprog_place(dm, &s->arena, m->main->outputs[j], &s->place[s->nin + s->nparams + j]);
  return s;
}

void run_side_close(RunSide *s) {
  if (!s) return;
  if (s->rt) rt_close(s->rt);
  for (int d = 0; s->slots && d < s->ndev; d++) free(s->slots[d]);
  free(s->slots);
  free(s->pval);
  if (s->place) arena_free(&s->arena);
  free(s);
}

static bool run_side_fill_local(RunSide *s, Tensor *const *inputs, Tensor *const *params, const RunGen *gin,
                                const RunGen *gpar, uint64_t seed);

bool run_side_fill(RunSide *s, Tensor *const *inputs, Tensor *const *params, const RunGen *gin, const RunGen *gpar,
                   uint64_t seed, char *err, size_t n) {
  bool ok = run_side_fill_local(s, inputs, params, gin, gpar, seed);
  snprintf(err, n, "%s", ok ? "" : rt_errmsg(s->rt));
  return rt_processes_agree(s->rt, ok, err, n); /* under MPI: every rank placed its blocks */
}

/* This process's devices only (under MPI, a rank makes its own blocks alone). */
static bool run_side_fill_local(RunSide *s, Tensor *const *inputs, Tensor *const *params, const RunGen *gin,
                                const RunGen *gpar, uint64_t seed) {
  for (int dev = 0; dev < s->ndev; dev++) {
    if (!rt_device_local(s->rt, dev)) continue;
    for (int i = 0; i < s->nin; i++) {
      const Value *v = s->m->main->inputs[i];
      int slot = v->def && v->def->kind == OP_INPUT ? v->def->index : i;
      if (rt_place_holds(&s->place[slot], dev) &&
          !place(s, slot, dev, inputs[i], gin ? &gin[i] : NULL, seed, &s->slots[dev][slot], v->name ? v->name : "input"))
        return false;
    }
    for (int p = 0; p < s->nparams; p++)
      if (s->pval[p] && rt_place_holds(&s->place[s->nin + p], dev) &&
          !place(s, s->nin + p, dev, params[p], gpar ? &gpar[p] : NULL, seed, &s->slots[dev][s->nin + p], s->m->params[p].path))
        return false;
  }
  return true;
}

void run_side_carry(RunSide *s) {
  const StepInfo *si = s->m->step;
  for (int dev = 0; dev < s->ndev; dev++) {
    RtDevice *d = rt_device(s->rt, dev);
    void **sl = s->slots[dev];
    bool *kept = mem_calloc((size_t)s->nout + 1, sizeof(bool), "the step's carried outputs");
    for (int k = 0; si && k < si->nparams; k++) {
      const StepParam *sp = &si->params[k];
      int pairs[4][2] = {{sp->param >= 0 ? s->nin + sp->param : -1, sp->out_param}, {sp->in_master, sp->out_master}, {sp->in_m, sp->out_m}, {sp->in_v, sp->out_v}};
      for (int j = 0; j < 4; j++) {
        int in = pairs[j][0], out = pairs[j][1];
        if (out < 0 || in < 0) continue;
        if (sl[in] != sl[s->nin + s->nparams + out]) rt_free(d, sl[in]); /* else updated in place */
        sl[in] = sl[s->nin + s->nparams + out];
        sl[s->nin + s->nparams + out] = NULL;
        kept[out] = true;
      }
    }
    if (si && si->in_t >= 0) {
      float *t = sl[si->in_t];
      if (t) t[0] += 1;
    }
    for (int j = 0; j < s->nout; j++) {
      if (!kept[j]) rt_free(d, sl[s->nin + s->nparams + j]);
      sl[s->nin + s->nparams + j] = NULL;
    }
    free(kept);
  }
}

/* Tests (SHARDC_RUN_STALL=S): device 0 of the sharded run sleeps S seconds and returns without
 * running its program: the others wait in their first collective until --timeout (or, with S 0,
 * notice at once that it returned). */
static RtEntry stalled_fn;
static double stall_s;
static int stall_entry(RtDevice *dev, void *arg) {
  if (rt_device_index(dev) != 0) return stalled_fn(dev, arg);
  struct timespec t = {(time_t)stall_s, (long)((stall_s - (double)(time_t)stall_s) * 1e9)};
  nanosleep(&t, NULL);
  return RT_OK;
}

bool run_side_step(RunSide *s, char *err, size_t n) {
  for (int dev = 0; dev < s->ndev; dev++) /* outputs of an earlier run not carried */
    for (int j = 0; j < s->nout; j++) {
      void **p = &s->slots[dev][s->nin + s->nparams + j];
      if (*p) rt_free(rt_device(s->rt, dev), *p), *p = NULL;
    }
  RtEntry fn = s->fn;
  const char *stall = getenv("SHARDC_RUN_STALL");
  if (stall && *stall && s->mesh && s->ndev > 1) stalled_fn = s->fn, stall_s = atof(stall), fn = stall_entry;
  double t0 = rt_seconds();
  int rc = rt_run(s->rt, fn, s->slots);
  s->seconds += rt_seconds() - t0;
  if (rc != RT_OK) {
    snprintf(err, n, "%s", rt_errmsg(s->rt));
    return false;
  }
  return true;
}

Tensor *run_side_output(RunSide *s, int j) {
  const Value *v = s->m->main->outputs[j];
  double *g = assemble(s, v, s->nin + s->nparams + j);
  Tensor *t = g ? tensor_new(&v->type) : NULL;
  if (t) memcpy(t->data, g, sizeof(double) * (size_t)t->n);
  free(g);
  return t;
}

void run_side_perturb(RunSide *s, int j, double delta) {
  RtDtype dt = (RtDtype)s->place[s->nin + s->nparams + j].dtype;
  void *b = NULL; /* the first device holding it */
  for (int d = 0; d < s->ndev && !b; d++) b = s->slots[d][s->nin + s->nparams + j];
  if (!b) return;
  if (dt == RT_I32) {
    *(int32_t *)b += (int32_t)delta;
    return;
  }
  float x;
  rt_convert(&x, RT_F32, b, dt, 1);
  x = (float)(x + delta);
  rt_convert(b, dt, &x, RT_F32, 1);
}

double run_side_seconds(const RunSide *s) { return s->seconds; }
int run_side_devices(const RunSide *s) { return s->ndev; }
int run_side_processes(const RunSide *s) { return rt_process_count(s->rt); }

int run_side_executed(const RunSide *s, RunExecuted **out, int *devices, int *ndevices) {
  int32_t rec[64];
  int nrep = devprog_record_devices(s->mesh ? s->m->dev : NULL, rec, 64);
  for (int r = 0; r < nrep; r++) devices[r] = rec[r];
  *ndevices = nrep;
  RunExecuted *list = NULL;
  int n = 0;
  for (int r = 0; r < nrep; r++) {
    int k = rt_executed(s->rt, devices[r], NULL, 0);
    if (k < 0) {
      free(list);
      *out = NULL;
      return -1;
    }
    RtExecuted *ex = calloc((size_t)k + 1, sizeof *ex);
    rt_executed(s->rt, devices[r], ex, k);
    for (int i = 0; i < k; i++) {
      int j = 0;
      while (j < n && !(list[j].kind == ex[i].kind && list[j].axes == ex[i].axes && list[j].bytes_per_device == ex[i].bytes_per_device)) j++;
      if (j == n) {
        list = realloc(list, sizeof *list * (size_t)(n + 1));
        list[n++] = (RunExecuted){.kind = ex[i].kind, .axes = ex[i].axes, .bytes_per_device = ex[i].bytes_per_device};
      }
      list[j].count += (double)ex[i].count / nrep;
    }
    free(ex);
  }
  *out = list;
  return n;
}

void run_side_clock(const RunSide *s, double *compute_s, double *comm_s) {
  double c = 0, k = 0;
  for (int d = 0; d < s->ndev; d++) {
    RtStats st;
    if (rt_stats(s->rt, d, &st) == RT_OK) c += st.sim_compute_s, k += st.sim_comm_s;
  }
  *compute_s = s->ndev ? c / s->ndev : 0;
  *comm_s = s->ndev ? k / s->ndev : 0;
}

size_t run_side_peak(const RunSide *s) {
  size_t peak = 0;
  for (int d = 0; d < s->ndev; d++) {
    RtStats st;
    if (rt_stats(s->rt, d, &st) == RT_OK && st.mem_peak > peak) peak = st.mem_peak;
  }
  return peak;
}

/* ---- lockstep (cmd_run.c): each step of both runs starts from the same state ---- */

/* The value of main held in slot `slot`: input `slot`, or param slot - nin; NULL for a param main
 * does not read. */
static const Value *slot_value(const RunSide *s, int slot) {
  if (slot < 0 || slot >= s->nin + s->nparams) return NULL;
  return slot < s->nin ? s->m->main->inputs[slot] : s->pval[slot - s->nin];
}

Tensor *run_side_input(RunSide *s, int slot) {
  const Value *v = slot_value(s, slot);
  if (!v) return NULL;
  double *g = assemble(s, v, slot);
  Tensor *t = g ? tensor_new(&v->type) : NULL;
  if (t) memcpy(t->data, g, sizeof(double) * (size_t)t->n);
  free(g);
  return t;
}

/* the input slots a train step carries to the next (params, masters, moments) and adam's count */
static int carried_slots(const RunSide *s, int *slots) {
  const StepInfo *si = s->m->step;
  int n = 0;
  for (int k = 0; si && k < si->nparams; k++) {
    const StepParam *sp = &si->params[k];
    int pairs[4][2] = {{sp->param >= 0 ? s->nin + sp->param : -1, sp->out_param}, {sp->in_master, sp->out_master}, {sp->in_m, sp->out_m}, {sp->in_v, sp->out_v}};
    for (int j = 0; j < 4; j++)
      if (pairs[j][0] >= 0 && pairs[j][1] >= 0) slots[n++] = pairs[j][0];
  }
  if (si && si->in_t >= 0) slots[n++] = si->in_t;
  return n;
}

bool run_side_restate(RunSide *s, RunSide *from, char *err, size_t n) {
  int *slots = malloc(sizeof(int) * (size_t)(4 * s->nparams + 2));
  if (!slots) {
    snprintf(err, n, "out of host memory");
    return false;
  }
  int ns = carried_slots(s, slots);
  /* the outputs go (some live in the buffers of the inputs they update: freed once, below) */
  for (int dev = 0; dev < s->ndev; dev++) {
    void **sl = s->slots[dev];
    for (int j = 0; j < s->nout; j++) {
      void **out = &sl[s->nin + s->nparams + j];
      bool alias = false;
      for (int k = 0; k < ns && *out; k++) alias |= sl[slots[k]] == *out;
      if (*out && !alias) rt_free(rt_device(s->rt, dev), *out);
      *out = NULL;
    }
  }
  bool ok = true, root = rt_process_rank(s->rt) == 0;
  for (int k = 0; k < ns && ok; k++) {
    const Value *v = slot_value(s, slots[k]);
    if (!v) continue; /* a param main does not read (on every rank) */
    /* under MPI `from` is rank 0's alone: rank 0 hands the whole value to every rank */
    Tensor *g = root ? run_side_input(from, slots[k]) : tensor_new(&v->type);
    char msg[256] = "out of host memory for the one-device run's state";
    if (!rt_processes_agree(s->rt, g != NULL, msg, sizeof msg)) {
      tensor_free(g);
      snprintf(err, n, "%s", msg);
      free(slots);
      return false;
    }
    rt_bcast_from_root(s->rt, g->data, sizeof(double) * (size_t)g->n);
    for (int dev = 0; dev < s->ndev && ok; dev++) {
      void **p = &s->slots[dev][slots[k]];
      if (!*p || !rt_device_local(s->rt, dev)) continue; /* not held here (a pipeline stage without it, another rank's) */
      rt_free(rt_device(s->rt, dev), *p), *p = NULL;
      ok = place(s, slots[k], dev, g, NULL, 0, p, v->name ? v->name : "state");
    }
    tensor_free(g);
    if (!ok) snprintf(err, n, "%s", rt_errmsg(s->rt));
    ok = rt_processes_agree(s->rt, ok, err, n); /* every rank placed its blocks */
  }
  free(slots);
  return ok;
}

bool run_side_share_routes(RunSide *s, RtRouteLog *log) { return rt_route_log_share(s->rt, log) != 0; }


