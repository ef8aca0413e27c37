/* cmd_run.c: `shardc run FILE`: lower the program through LLVM twice -- as the per-device program
 * of the mesh and as the same program on ONE device (the module before partitioning) -- JIT both,
 * run the first on one thread per device of the mesh (runtime/shardrt.h) and the second on one,
 * and compare their outputs (and a train step's losses, step by step). docs/run.md has the
 * tolerances and what lowers.
 *
 * Inputs and params are made whole on the host from --seed (interp_random_inputs/params: the same
 * values the interpreter's tests use, integer inputs within the range their take or cross entropy
 * reads) and each device receives its block; outputs are reassembled from the devices' blocks as
 * interp_run_spmd does. A train step starts fresh (moments zero, master copies equal to the
 * params, step count 1) and carries its updated params and state from step to step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "interp.h"
#include "localize.h"
#include "report.h"
#include "shardrt.h"
#include "step.h"

/* Tolerances by output dtype: |native - reference| <= atol + rtol |reference|, elementwise. */
static void tolerance(DType dt, double *atol, double *rtol) {
  switch (dt) {
  case DT_BF16: *atol = 2e-2, *rtol = 2e-2; break;
  case DT_F16: *atol = 2e-3, *rtol = 4e-3; break;
  case DT_I32: case DT_I8: *atol = 0, *rtol = 0; break;
  default: *atol = 1e-4, *rtol = 1e-3; break;
  }
}

/* One side of the comparison: a runtime, the module's view (mesh NULL: global), per device its
 * slots (inputs, params, outputs). */
typedef struct Side {
  const char *name;
  const IrModule *m;
  const Mesh *mesh;
  Runtime *rt;
  int ndev;
  int nin, nparams, nout, nslots;
  void ***slots;
  const Value **pval;   /* per param: main's OP_PARAM value (its sharding), or NULL */
  RtEntry fn;
  double seconds;       /* summed over the steps' runs */
} Side;

static int64_t local_extent(const Side *s, const Value *v, int d) { return s->mesh ? v->local[d] : v->type.dims[d]->size; }

/* dev's block of v: start and shape per dim. */
static void block_of(const Side *s, const Value *v, int dev, int64_t *start, int64_t *shape) {
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

/* Visits the elements of a block: gi the global row-major index, li the local one. */
static void for_block(const TensorType *t, const int64_t *start, const int64_t *shape, void (*fn)(void *, int64_t, int64_t), void *ctx) {
  int64_t n = block_elems(t, shape);
  int64_t idx[MAX_RANK] = {0};
  for (int64_t li = 0; li < n; li++) {
    int64_t gi = 0;
    for (int d = 0; d < t->rank; d++) gi = gi * t->dims[d]->size + start[d] + idx[d];
    fn(ctx, gi, li);
    for (int d = t->rank - 1; d >= 0; d--) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

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

/* Puts dev's block of the whole tensor g (values of v) into a new buffer on dev. */
static bool place(Side *s, const Value *v, int dev, const Tensor *g, void **out, const char *name) {
  int64_t start[MAX_RANK], shape[MAX_RANK];
  block_of(s, v, dev, start, shape);
  int64_t n = block_elems(&v->type, shape);
  if (rt_alloc(rt_device(s->rt, dev), (size_t)(n > 0 ? n : 1) * (size_t)dtype_bytes(v->type.dtype), name, out) != RT_OK) return false;
  CopyCtx c = {.buf = *out, .dt = v->type.dtype, .global = g->data};
  for_block(&v->type, start, shape, scatter_elem, &c);
  return true;
}

/* The whole value of output v from the devices' blocks: each block position once (from the devices
 * at coordinate 0 on the axes v is replicated over), partial sums added. */
static double *assemble(const Side *s, const Value *v, int slot) {
  int64_t n = tensor_type_elements(&v->type);
  double *g = calloc((size_t)(n > 0 ? n : 1), sizeof *g);
  if (!g) return NULL;
  uint16_t used = v->sharding.partial;
  for (int d = 0; s->mesh && d < v->type.rank; d++)
    for (int k = 0; k < v->sharding.naxes[d]; k++) used |= (uint16_t)(1u << v->sharding.axes[d][k]);
  for (int dev = 0; dev < s->ndev; dev++) {
    if (s->mesh) {
      bool skip = false;
      for (int a = 0; a < s->mesh->naxes; a++)
        if (!(used >> a & 1) && rt_device_coord(rt_device(s->rt, dev), a) != 0) skip = true;
      if (skip) continue;
    }
    int64_t start[MAX_RANK], shape[MAX_RANK];
    block_of(s, v, dev, start, shape);
    CopyCtx c = {.buf = s->slots[dev][slot], .dt = v->type.dtype, .global = g, .add = s->mesh && v->sharding.partial};
    for_block(&v->type, start, shape, gather_elem, &c);
  }
  return g;
}

static bool side_open(Side *s, const RtConfig *cfg, const Options *o) {
  if (rt_open(cfg, &s->rt) != RT_OK) {
    fprintf(stderr, "shardc: run: %s\n", s->rt ? rt_errmsg(s->rt) : "out of memory");
    return false;
  }
  s->ndev = rt_device_count(s->rt);
  s->nin = s->m->main->ninputs;
  s->nparams = s->m->nparams;
  s->nout = s->m->main->noutputs;
  s->nslots = s->nin + s->nparams + s->nout;
  s->slots = calloc((size_t)s->ndev, sizeof *s->slots);
  for (int d = 0; d < s->ndev; d++) s->slots[d] = calloc((size_t)s->nslots + 1, sizeof(void *));
  s->pval = calloc((size_t)s->nparams + 1, sizeof *s->pval);
  for (const Op *op = s->m->main->first; op; op = op->next)
    if (op->kind == OP_PARAM && op->index >= 0 && op->index < s->nparams) s->pval[op->index] = op->results[0];
  return true;
}

static void side_close(Side *s) {
  if (s->rt) rt_close(s->rt);
  for (int d = 0; s->slots && d < s->ndev; d++) free(s->slots[d]);
  free(s->slots);
  free(s->pval);
}

/* Every input and param placed on every device. */
static bool side_fill(Side *s, Tensor *const *inputs, Tensor *const *params) {
  for (int dev = 0; dev < s->ndev; dev++) {
    for (int i = 0; i < s->nin; i++) {
      const Value *v = s->m->main->inputs[i];
      int slot = v->def && v->def->kind == OP_INPUT ? v->def->index : i;
      if (!place(s, v, dev, inputs[i], &s->slots[dev][slot], v->name ? v->name : "input")) return false;
    }
    for (int p = 0; p < s->nparams; p++)
      if (s->pval[p] && !place(s, s->pval[p], dev, params[p], &s->slots[dev][s->nin + p], s->m->params[p].path)) return false;
  }
  return true;
}

/* After a train step: the updated params and optimizer state become the next step's, adam's step
 * count goes up by one; the other outputs are freed. */
static void side_carry(Side *s) {
  const StepInfo *si = s->m->step;
  for (int dev = 0; dev < s->ndev; dev++) {
    RtDevice *d = rt_device(s->rt, dev);
    void **sl = s->slots[dev];
    bool *kept = calloc((size_t)s->nout + 1, sizeof(bool));
    for (int k = 0; si && k < si->nparams; k++) {
      const StepParam *sp = &si->params[k];
      int pairs[4][2] = {{s->nin + sp->param, sp->out_param}, {sp->in_master, sp->out_master}, {sp->in_m, sp->out_m}, {sp->in_v, sp->out_v}};
      for (int j = 0; j < 4; j++) {
        int in = pairs[j][0], out = pairs[j][1];
        if (out < 0 || in < 0 || (j == 0 && sp->param < 0)) continue;
        rt_free(d, sl[in]);
        sl[in] = sl[s->nin + s->nparams + out];
        sl[s->nin + s->nparams + out] = NULL;
        kept[out] = true;
      }
    }
    if (si && si->in_t >= 0) {
      float *t = sl[si->in_t];
      t[0] += 1;
    }
    for (int j = 0; j < s->nout; j++) {
      if (!kept[j]) rt_free(d, sl[s->nin + s->nparams + j]);
      sl[s->nin + s->nparams + j] = NULL;
    }
    free(kept);
  }
}

static bool side_step(Side *s) {
  double t0 = rt_seconds();
  int rc = rt_run(s->rt, s->fn, s->slots);
  s->seconds += rt_seconds() - t0;
  if (rc != RT_OK) {
    fprintf(stderr, "shardc: run: the %s program failed: %s\n", s->name, rt_errmsg(s->rt));
    return false;
  }
  return true;
}

typedef struct Diff {
  double max_abs, max_rel, worst_excess; /* worst_excess: largest |d| - tol (> 0: FAIL) */
  double atol, rtol;                     /* of the worst output */
  bool pass;
} Diff;

static void diff_into(Diff *D, const double *a, const double *ref, int64_t n, DType dt) {
  double atol, rtol, scale = 0, worst = 0;
  tolerance(dt, &atol, &rtol);
  for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
  for (int64_t i = 0; i < n; i++) {
    double d = fabs(a[i] - ref[i]);
    if (isnan(a[i]) != isnan(ref[i]) || (!isnan(a[i]) && isinf(a[i]) && a[i] != ref[i])) d = INFINITY;
    else if (isnan(a[i]) || (isinf(ref[i]) && a[i] == ref[i])) d = 0;
    worst = fmax(worst, d);
    double excess = d - (atol + rtol * fabs(ref[i]));
    if (excess > 0) D->pass = false;
    if (excess > D->worst_excess || D->atol == 0) D->worst_excess = fmax(D->worst_excess, excess);
  }
  if (worst >= D->max_abs) D->atol = atol, D->rtol = rtol;
  D->max_abs = fmax(D->max_abs, worst);
  D->max_rel = fmax(D->max_rel, scale > 0 ? worst / scale : worst);
}

static const char *fmt_bytes(char *buf, size_t n, double b) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) b /= 1024, i++;
  snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
  return buf;
}

static int run(const Options *o, Arena *arena) {
  if (o->load || o->save) {
    diag_error((SrcLoc){0}, "run: --load and --save are not implemented yet (docs/run.md)");
    return EXIT_PROGRAM_ERROR;
  }
  CheckedProgram cp;
  int rc = check_load(o, arena, &cp);
  if (rc != EXIT_OK) return rc;
  if (!cp.ir) {
    diag_error((SrcLoc){0}, "%s declares no function to run (a model with a function, or a train step)", o->input);
    return EXIT_PROGRAM_ERROR;
  }
  Program *p = cp.prog;
  IrModule *m = cp.ir;
  const Mesh *mesh = p->mesh;
  int limit = RT_DEFAULT_MAX_DEVICES;
  if (mesh->devices > limit) {
    diag_error(mesh->loc,
               "run: mesh '%s' has %lld devices, more than the %d device threads `run` starts; run it on a small mesh "
               "given inline (--mesh 'h100[data: 2, model: 2]'), shrink dims with -D, or predict it with `shardc sim`",
               mesh->name, (long long)mesh->devices, limit);
    return EXIT_PROGRAM_ERROR;
  }

  double t0 = rt_seconds();
  Lowered *lw = lower_new();
  /* the one-device program: the module before partitioning (every value whole) */
  bool ok = lower_function(lw, m, NULL, "shard_reference");
  Tensor **inputs = interp_random_inputs(m, o->seed);
  Tensor **params = interp_random_params(m, o->seed);
  const StepInfo *si = m->step;
  for (int k = 0; si && k < si->nparams; k++) { /* a fresh run: moments at zero */
    const StepParam *sp = &si->params[k];
    if (sp->in_m >= 0) memset(inputs[sp->in_m]->data, 0, sizeof(double) * (size_t)inputs[sp->in_m]->n);
    if (sp->in_v >= 0) memset(inputs[sp->in_v]->data, 0, sizeof(double) * (size_t)inputs[sp->in_v]->n);
  }
  if (ok && (!pipeline_run(m, p) || diag_error_count() > 0)) ok = false;
  if (ok) ok = lower_function(lw, m, mesh, "shard_device");
  char err[512];
  if (ok && !lower_finish(lw, err, sizeof err)) {
    diag_error((SrcLoc){0}, "run: %s", err);
    ok = false;
  }
  if (ok && o->emit_llvm) {
    lower_print(lw, stdout);
    lower_free(lw);
    interp_free_tensors(inputs, interp_ninputs(m));
    interp_free_tensors(params, m->nparams);
    return EXIT_OK;
  }
  void *fns[2] = {0};
  const char *names[2] = {"shard_reference", "shard_device"};
  if (ok && !lower_jit(lw, names, 2, fns, err, sizeof err)) {
    diag_error((SrcLoc){0}, "run: %s", err);
    ok = false;
  }
  double compile_s = rt_seconds() - t0;
  if (!ok) {
    lower_free(lw);
    interp_free_tensors(inputs, interp_ninputs(m));
    interp_free_tensors(params, m->nparams);
    return EXIT_PROGRAM_ERROR;
  }

  Side ref = {.name = "one-device", .m = m, .mesh = NULL, .fn = (RtEntry)fns[0]};
  Side shd = {.name = "sharded", .m = m, .mesh = mesh, .fn = (RtEntry)fns[1]};
  RtConfig rc1 = {.timeout_s = o->timeout, .mem_cap = (size_t)o->hbm};
  RtConfig rcn = rc1;
  rcn.naxes = mesh->naxes;
  for (int a = 0; a < mesh->naxes; a++) rcn.axis_size[a] = mesh->axes[a].size, rcn.axis_name[a] = mesh->axes[a].name;
  int steps = m->step && o->steps > 0 ? o->steps : 1;
  double *loss_ref = calloc((size_t)steps, sizeof(double)), *loss_shd = calloc((size_t)steps, sizeof(double));
  Diff D = {.pass = true};
  rc = EXIT_PROGRAM_ERROR;
  if (!side_open(&ref, &rc1, o) || !side_open(&shd, &rcn, o)) goto done;
  if (!side_fill(&ref, inputs, params) || !side_fill(&shd, inputs, params)) {
    fprintf(stderr, "shardc: run: %s\n", rt_errmsg(ref.rt)[0] ? rt_errmsg(ref.rt) : rt_errmsg(shd.rt));
    goto done;
  }
  const char *perturb = getenv("SHARDC_RUN_PERTURB"); /* tests: one device's result is made wrong */
  for (int s = 0; s < steps; s++) {
    if (!side_step(&ref) || !side_step(&shd)) goto done;
    int base = ref.nin + ref.nparams;
    if (perturb && *perturb && s == steps - 1) {
      const Value *v = m->main->outputs[0];
      void *b = shd.slots[0][base];
      put_elem(b, v->type.dtype, 0, get_elem(b, v->type.dtype, 0) + atof(perturb));
    }
    if (m->step) {
      double *a = assemble(&shd, m->main->outputs[0], base), *r = assemble(&ref, m->main->outputs[0], base);
      loss_shd[s] = a[0], loss_ref[s] = r[0];
      diff_into(&D, a, r, 1, DT_F32);
      free(a), free(r);
    }
    if (s == steps - 1)
      for (int j = m->step ? 1 : 0; j < m->main->noutputs; j++) {
        const Value *v = m->main->outputs[j];
        double *a = assemble(&shd, v, base + j), *r = assemble(&ref, v, base + j);
        if (!a || !r) goto done;
        diff_into(&D, a, r, tensor_type_elements(&v->type), v->type.dtype);
        free(a), free(r);
      }
    if (m->step && s < steps - 1) side_carry(&ref), side_carry(&shd);
  }
  size_t peak = 0;
  for (int d = 0; d < shd.ndev; d++) {
    RtStats st;
    if (rt_stats(shd.rt, d, &st) == RT_OK && st.mem_peak > peak) peak = st.mem_peak;
  }
  double step_s = shd.seconds / steps, ref_s = ref.seconds / steps;
  if (o->format == FORMAT_JSON) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "devices", shd.ndev);
    cJSON_AddNumberToObject(j, "steps", steps);
    cJSON_AddBoolToObject(j, "pass", D.pass);
    cJSON_AddNumberToObject(j, "max_abs_err", D.max_abs);
    cJSON_AddNumberToObject(j, "max_rel_err", D.max_rel);
    cJSON *l = cJSON_AddArrayToObject(j, "loss");
    for (int s = 0; m->step && s < steps; s++) cJSON_AddItemToArray(l, cJSON_CreateNumber(loss_shd[s]));
    cJSON_AddNumberToObject(j, "step_time_s", step_s);
    cJSON_AddNumberToObject(j, "compile_s", compile_s);
    cJSON_AddNumberToObject(j, "peak_bytes_per_device", (double)peak);
    cJSON_AddNumberToObject(j, "reference_step_time_s", ref_s);
    cJSON_AddNumberToObject(j, "atol", D.atol);
    cJSON_AddNumberToObject(j, "rtol", D.rtol);
    report_json(j);
  } else {
    char b[32];
    printf("%s: %s on %d device thread%s (mesh %s) vs one device\n", D.pass ? "PASS" : "FAIL", o->input, shd.ndev,
           shd.ndev == 1 ? "" : "s", mesh->name);
    printf("  worst error    %.3g abs, %.3g relative to the reference's largest value (tolerance %.0e + %.0e |ref|)\n", D.max_abs,
           D.max_rel, D.atol, D.rtol);
    for (int s = 0; m->step && s < steps; s++) printf("  loss step %-4d %.6g (one device: %.6g)\n", s + 1, loss_shd[s], loss_ref[s]);
    printf("  step time      %.3f ms sharded, %.3f ms on one device%s\n", step_s * 1e3, ref_s * 1e3,
           steps > 1 ? arena_printf(arena, " (mean of %d steps)", steps) : "");
    printf("  compile time   %.1f ms (lowering, O2, JIT)\n", compile_s * 1e3);
    printf("  peak memory    %s per device\n", fmt_bytes(b, sizeof b, (double)peak));
  }
  rc = D.pass ? EXIT_OK : EXIT_PROGRAM_ERROR;
done:
  side_close(&ref);
  side_close(&shd);
  free(loss_ref);
  free(loss_shd);
  interp_free_tensors(inputs, interp_ninputs(m));
  interp_free_tensors(params, m->nparams);
  lower_free(lw);
  return rc;
}

int cmd_run(const Options *o) {
  Arena arena;
  arena_init(&arena);
  int rc = run(o, &arena);
  arena_free(&arena);
  return rc;
}
