/* run_host.c: run_host.h's functions: blocks in, the runtime's threads, blocks out. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "localize.h"
#include "run_host.h"
#include "stages.h"
#include "step.h"

static void put_elem(void *buf, DType dt, int64_t i, double v) {
  switch (dt) {
  case DT_BF16: ((uint16_t *)buf)[i] = rt_f32_to_bf16((float)v); break;
  case DT_F16: ((uint16_t *)buf)[i] = rt_f32_to_f16((float)v); break;
  case DT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
  default: ((float *)buf)[i] = (float)v; break;
  }
}

static double get_elem(const void *buf, DType dt, int64_t i) {
  switch (dt) {
  case DT_BF16: return rt_bf16_to_f32(((const uint16_t *)buf)[i]);
  case DT_F16: return rt_f16_to_f32(((const uint16_t *)buf)[i]);
  case DT_I32: return ((const int32_t *)buf)[i];
  default: return ((const float *)buf)[i];
  }
}

/* One side of the comparison: a runtime, the module's view (mesh NULL: global), per device its
 * slots (inputs, params, outputs). */
struct RunSide {
  const IrModule *m;
  const Mesh *mesh;
  Runtime *rt;
  int ndev;
  int nin, nparams, nout, nslots;
  void ***slots;
  const Value **pval;   /* per param: main's OP_PARAM value (its sharding), or NULL */
  RtEntry fn;
  double seconds;       /* summed over the steps' runs */
};

/* Under a pipeline a value of main is held only on the stages its op runs on (Op.place; a
 * pipeline result: PipeInfo.result_place); the stage of a device is its coordinates on the stage
 * axes, mixed radix. */
static const PipeInfo *pipe_of(const RunSide *s) {
  return s->mesh && s->m->pipeline ? s->m->pipeline->pipe : NULL;
}

static int stage_of(const RunSide *s, int dev) {
  const PipeInfo *pi = pipe_of(s);
  int st = 0;
  for (int k = 0; pi && k < pi->nstage_axes; k++)
    st = st * s->mesh->axes[pi->stage_axes[k]].size + rt_device_coord(rt_device(s->rt, dev), pi->stage_axes[k]);
  return st;
}

uint8_t run_value_place(const IrModule *m, const Value *v) {
  const PipeInfo *pi = m->pipeline ? m->pipeline->pipe : NULL;
  const Op *d = v->def;
  if (!pi || !d) return PLACE_ALL;
  if (d->kind == OP_PIPELINE) {
    for (int k = 0; k < d->nresults; k++)
      if (d->results[k] == v) return pi->result_place ? pi->result_place[k] : PLACE_ALL;
    return PLACE_ALL;
  }
  return d->place;
}

static uint8_t place_of(const RunSide *s, const Value *v) { return pipe_of(s) ? run_value_place(s->m, v) : PLACE_ALL; }

static bool holds(const RunSide *s, const Value *v, int dev) {
  const PipeInfo *pi = pipe_of(s);
  return !pi || stages_runs_on(place_of(s, v), stage_of(s, dev), pi->stages);
}

/* Under interleaved(V > 1) a stacked dim is held in storage order (stage-major: stage s's rows are
 * its chunks c = 0..V-1, the model's layer chunks c p + s; ir.h): the model's row of each storage
 * row of v, or NULL when v's rows are in model order. The caller frees it. */
static int64_t *storage_rows(const RunSide *s, const Value *v) {
  const PipeInfo *pi = pipe_of(s);
  if (!pi || pi->chunks <= 1 || v->type.rank < 1 || v->type.dims[0] != pi->stack_dim) return NULL;
  int64_t n = v->type.dims[0]->size, Lc = pi->chunk_layers, V = pi->chunks, p = pi->stages;
  /* not NULL on failure: NULL means model order, which would place the rows wrongly */
  int64_t *rows = mem_calloc((size_t)(n > 0 ? n : 1), sizeof *rows, "a stacked value's storage order");
  for (int64_t st = 0; st < n; st++) {
    int64_t g = st / Lc, j = st % Lc, stage = g / V, c = g % V;
    rows[st] = (c * p + stage) * Lc + j;
  }
  return rows;
}

static int64_t local_extent(const RunSide *s, const Value *v, int d) { return s->mesh ? v->local[d] : v->type.dims[d]->size; }

/* dev's block of v: start and shape per dim. */
static void block_of(const RunSide *s, const Value *v, int dev, int64_t *start, int64_t *shape) {
  for (int d = 0; d < v->type.rank; d++) {
    shape[d] = local_extent(s, v, d);
    start[d] = s->mesh ? shape[d] * localize_block_number(s->mesh, v->sharding.axes[d], v->sharding.naxes[d], dev) : 0;
  }
}

static int64_t block_elems(const TensorType *t, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < t->rank; d++) n *= shape[d];
  return n;
}

/* The logical index of storage position p along d: a causal ring's zigzag order (IrModule.zigzag)
 * on the sharded side, as the interpreter stores its blocks (interp_zigzag_permute); p itself on
 * one device. */
static int64_t logical(const RunSide *s, const Dim *d, int64_t p) { return s->mesh ? ir_zigzag_logical(s->m, d, p) : p; }

static bool zigzag_dim(const RunSide *s, const Dim *d) {
  const struct Zigzag *z = &s->m->zigzag;
  return s->mesh && z->axes && z->n >= 2 && (d == z->dims[0] || d == z->dims[1]);
}

/* Visits the elements of a block: gi the global row-major index (of the logical positions), li
 * the local one; rows (or NULL) maps a row of dim 0 to the global row it holds (storage_rows). */
static void for_block_rows(const RunSide *s, const TensorType *t, const int64_t *start, const int64_t *shape, const int64_t *rows,
                           void (*fn)(void *, int64_t, int64_t), void *ctx) {
  int64_t n = block_elems(t, shape);
  int64_t idx[MAX_RANK] = {0};
  for (int64_t li = 0; li < n; li++) {
    int64_t gi = 0;
    for (int d = 0; d < t->rank; d++)
      gi = gi * t->dims[d]->size + (d == 0 && rows ? rows[start[0] + idx[0]] : logical(s, t->dims[d], start[d] + idx[d]));
    fn(ctx, gi, li);
    for (int d = t->rank - 1; d >= 0; d--) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

typedef struct CopyCtx {
  void *buf;
  DType dt;
  double *global;
  bool add;
} CopyCtx;

static void scatter_elem(void *vc, int64_t gi, int64_t li) {
  CopyCtx *c = vc;
  put_elem(c->buf, c->dt, li, c->global[gi]);
}

static void gather_elem(void *vc, int64_t gi, int64_t li) {
  CopyCtx *c = vc;
  double v = get_elem(c->buf, c->dt, li);
  c->global[gi] = c->add ? c->global[gi] + v : v;
}

static RtDtype rt_dt(DType dt) {
  switch (dt) {
  case DT_BF16: return RT_BF16;
  case DT_F16: return RT_F16;
  case DT_I32: return RT_I32;
  default: return RT_F32;
  }
}

/* A generated block under the zigzag order: the values of the logical positions its storage
 * positions hold, made one storage row at a time along the zigzag dims (each a block of one logical
 * row for rt_random_fill) and copied into place. */
static bool place_zigzag(const RunSide *s, const Value *v, const int64_t *start, const int64_t *shape, const RunGen *gen,
                         uint64_t seed, void *out) {
  const TensorType *t = &v->type;
  size_t eb = (size_t)dtype_bytes(t->dtype);
  int64_t lstride[MAX_RANK], sub[MAX_RANK], zi[MAX_RANK] = {0}, n = 1;
  bool zdim[MAX_RANK];
  for (int d = t->rank - 1; d >= 0; d--) {
    lstride[d] = n;
    n *= shape[d];
    zdim[d] = zigzag_dim(s, t->dims[d]);
    sub[d] = zdim[d] ? 1 : shape[d];
  }
  int64_t subn = block_elems(t, sub);
  char *tmp = malloc((size_t)(subn > 0 ? subn : 1) * eb);
  if (!tmp) return false;
  bool ok = true;
  for (bool done = n <= 0; ok && !done;) { /* zi: the storage row along each zigzag dim */
    RtBlock b = {.ndims = t->rank};
    for (int d = 0; d < t->rank; d++) {
      b.global[d] = t->dims[d]->size, b.shape[d] = sub[d];
      b.start[d] = zdim[d] ? logical(s, t->dims[d], start[d] + zi[d]) : start[d];
    }
    ok = rt_random_fill(tmp, rt_dt(t->dtype), &b, seed, gen->key, gen->lo, gen->hi) == RT_OK;
    int64_t idx[MAX_RANK] = {0};
    for (int64_t e = 0; ok && e < subn; e++) {
      int64_t li = 0;
      for (int d = 0; d < t->rank; d++) li += (zdim[d] ? zi[d] : idx[d]) * lstride[d];
      memcpy((char *)out + (size_t)li * eb, tmp + (size_t)e * eb, eb);
      for (int d = t->rank - 1; d >= 0; d--) {
        if (++idx[d] < sub[d]) break;
        idx[d] = 0;
      }
    }
    done = true;
    for (int d = t->rank - 1; d >= 0; d--) {
      if (!zdim[d]) continue;
      if (++zi[d] < shape[d]) {
        done = false;
        break;
      }
      zi[d] = 0;
    }
  }
  free(tmp);
  return ok;
}

/* Puts dev's block of v into a new buffer on dev: cut from the whole tensor g, or generated. */
static bool place(RunSide *s, const Value *v, int dev, const Tensor *g, const RunGen *gen, uint64_t seed, void **out,
                  const char *name) {
  int64_t start[MAX_RANK], shape[MAX_RANK];
  block_of(s, v, dev, start, shape);
  int64_t n = block_elems(&v->type, shape);
  if (rt_alloc(rt_device(s->rt, dev), (size_t)(n > 0 ? n : 1) * (size_t)dtype_bytes(v->type.dtype), name, out) != RT_OK) return false;
  int64_t *rows = storage_rows(s, v);
  if (g) {
    CopyCtx c = {.buf = *out, .dt = v->type.dtype, .global = g->data};
    for_block_rows(s, &v->type, start, shape, rows, scatter_elem, &c);
    free(rows);
    return true;
  }
  if (gen->lo == gen->hi) { /* a constant */
    for (int64_t i = 0; i < n; i++) put_elem(*out, v->type.dtype, i, gen->lo);
    free(rows);
    return true;
  }
  bool zz = false;
  for (int d = 0; d < v->type.rank; d++) zz |= zigzag_dim(s, v->type.dims[d]);
  if (zz) {
    free(rows);
    return place_zigzag(s, v, start, shape, gen, seed, *out);
  }
  RtBlock b = {.ndims = v->type.rank};
  for (int d = 0; d < v->type.rank; d++) b.global[d] = v->type.dims[d]->size, b.start[d] = start[d], b.shape[d] = shape[d];
  if (!rows) return rt_random_fill(*out, rt_dt(v->type.dtype), &b, seed, gen->key, gen->lo, gen->hi) == RT_OK;
  /* storage order: each local row made as the model's row it holds */
  int64_t row = shape[0] > 0 ? n / shape[0] : 0;
  bool ok = true;
  for (int64_t r = 0; ok && r < shape[0]; r++) {
    b.start[0] = rows[start[0] + r], b.shape[0] = 1;
    char *dst = (char *)*out + (size_t)(r * row) * (size_t)dtype_bytes(v->type.dtype);
    ok = rt_random_fill(dst, rt_dt(v->type.dtype), &b, seed, gen->key, gen->lo, gen->hi) == RT_OK;
  }
  free(rows);
  return ok;
}

/* The whole value of output v from the devices' blocks: each block position once (from the devices
 * at coordinate 0 on the axes v is replicated over), partial sums added. */
static double *assemble(const RunSide *s, const Value *v, int slot) {
  int64_t n = tensor_type_elements(&v->type);
  bool root = rt_process_rank(s->rt) == 0; /* under MPI rank 0 assembles, the others send their blocks */
  double *g = root ? calloc((size_t)(n > 0 ? n : 1), sizeof *g) : NULL;
  if (!g && rt_process_count(s->rt) == 1) return NULL;
  uint16_t used = v->sharding.partial;
  for (int d = 0; s->mesh && d < v->type.rank; d++)
    for (int k = 0; k < v->sharding.naxes[d]; k++) used |= (uint16_t)(1u << v->sharding.axes[d][k]);
  const PipeInfo *pi = pipe_of(s);
  uint16_t stage_mask = 0;
  for (int k = 0; pi && k < pi->nstage_axes; k++) stage_mask |= (uint16_t)(1u << pi->stage_axes[k]);
  int first = -1; /* a value replicated over the stages: from the first stage holding it */
  for (int st = 0; pi && st < pi->stages && first < 0; st++)
    if (stages_runs_on(place_of(s, v), st, pi->stages)) first = st;
  bool by_stage = pi && !(used & stage_mask);
  int64_t *rows = storage_rows(s, v);
  for (int dev = 0; dev < s->ndev; dev++) {
    if (s->mesh) {
      bool skip = false;
      for (int a = 0; a < s->mesh->naxes; a++)
        if (!(used >> a & 1) && !(by_stage && (stage_mask >> a & 1)) && rt_device_coord(rt_device(s->rt, dev), a) != 0) skip = true;
      if (by_stage && stage_of(s, dev) != first) skip = true;
      if (!holds(s, v, dev)) skip = true;
      if (skip) continue;
    }
    int64_t start[MAX_RANK], shape[MAX_RANK];
    block_of(s, v, dev, start, shape);
    /* under MPI the block comes to rank 0 (every rank makes the same calls) */
    size_t bytes = (size_t)block_elems(&v->type, shape) * (size_t)dtype_bytes(v->type.dtype);
    void *scratch = g && !rt_device_local(s->rt, dev) ? malloc(bytes ? bytes : 1) : NULL;
    if (g && !rt_device_local(s->rt, dev) && !scratch) free(g), g = NULL; /* rt_fetch_to_root drops what it cannot keep */
    const void *buf = rt_fetch_to_root(s->rt, dev, s->slots[dev][slot], bytes, scratch);
    CopyCtx c = {.buf = (void *)buf, .dt = v->type.dtype, .global = g, .add = s->mesh && v->sharding.partial};
    if (buf && g) for_block_rows(s, &v->type, start, shape, rows, gather_elem, &c);
    free(scratch);
  }
  free(rows);
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
  return s;
}

void run_side_close(RunSide *s) {
  if (!s) return;
  if (s->rt) rt_close(s->rt);
  for (int d = 0; s->slots && d < s->ndev; d++) free(s->slots[d]);
  free(s->slots);
  free(s->pval);
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
      if (holds(s, v, dev) && !place(s, v, dev, inputs[i], gin ? &gin[i] : NULL, seed, &s->slots[dev][slot], v->name ? v->name : "input")) return false;
    }
    for (int p = 0; p < s->nparams; p++)
      if (s->pval[p] && holds(s, s->pval[p], dev) && !place(s, s->pval[p], dev, params[p], gpar ? &gpar[p] : NULL, seed, &s->slots[dev][s->nin + p], s->m->params[p].path))
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
  const Value *v = s->m->main->outputs[j];
  void *b = NULL; /* the first device holding it */
  for (int d = 0; d < s->ndev && !b; d++) b = s->slots[d][s->nin + s->nparams + j];
  if (b) put_elem(b, v->type.dtype, 0, get_elem(b, v->type.dtype, 0) + delta);
}

double run_side_seconds(const RunSide *s) { return s->seconds; }
int run_side_devices(const RunSide *s) { return s->ndev; }
int run_side_processes(const RunSide *s) { return rt_process_count(s->rt); }

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
      ok = place(s, v, dev, g, NULL, 0, p, v->name ? v->name : "state");
    }
    tensor_free(g);
    if (!ok) snprintf(err, n, "%s", rt_errmsg(s->rt));
    ok = rt_processes_agree(s->rt, ok, err, n); /* every rank placed its blocks */
  }
  free(slots);
  return ok;
}

bool run_side_share_routes(RunSide *s, RtRouteLog *log) { return rt_route_log_share(s->rt, log) != 0; }


