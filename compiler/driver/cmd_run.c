/* cmd_run.c: `shardc run FILE`: lower the program through LLVM twice -- as the per-device program
 * of the mesh and as the same program on ONE device (the module before partitioning) -- JIT both,
 * run the first on one thread per device of the mesh (runtime/shardrt.h) and the second on one,
 * and compare their outputs (and a train step's losses, step by step). docs/run.md has the
 * tolerances and what lowers.
 *
 * Inputs and params are generated per global index from --seed (counter-based: rt_random_fill,
 * keyed by tensor), each device making exactly its block, integer inputs within the range their take
 * or cross entropy reads; or loaded whole (--load) and cut into blocks. Outputs are reassembled from
 * the devices' blocks as interp_run_spmd does. A train step starts fresh (moments zero, master copies equal to the
 * params, step count 1) and carries its updated params and state from step to step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "devprog.h"
#include "interp.h"
#include "localize.h"
#include "report.h"
#include "shardrt.h"
#include "npy.h"
#include "run_host.h"
#include "sim.h"
#include "step.h"

/* Tolerances by dtype: |sharded - one device| <= atol + rtol |one device|, elementwise, by the
 * output's dtype, or by the narrowest float dtype the program stores a value at when that is
 * narrower (narrowest below). */
static void tolerance(DType dt, double *atol, double *rtol) {
  switch (dt) {
  case DT_BF16: *atol = 2e-2, *rtol = 2e-2; break;
  case DT_F16: *atol = 2e-3, *rtol = 4e-3; break;
  case DT_I32: case DT_I8: *atol = 0, *rtol = 0; break;
  default: *atol = 1e-4, *rtol = 1e-3; break;
  }
}

/* The narrowest float dtype any value of f (and its loops' bodies) is stored at: a sum split over
 * devices rounds its partial sums there, so an f32 output computed from bf16 values can differ by
 * bf16's rounding between the sharded and the one-device run. */
static DType narrowest(const IrFunc *f, DType worst) {
  for (const Op *op = f->first; op; op = op->next) {
    for (int k = 0; k < op->nresults; k++) {
      DType d = op->results[k]->type.dtype;
      if (d == DT_BF16 || (d == DT_F16 && worst != DT_BF16)) worst = d;
    }
    if (op->body) worst = narrowest(op->body, worst);
  }
  return worst;
}

/* Host bytes a run needs, roughly: every value of main at its global size for the one-device run
 * (an overestimate: buffers are freed after their last use), and the params. */
static double host_bytes(const IrModule *m) {
  double b = 0;
  for (int i = 0; i < m->nparams; i++) b += (double)tensor_type_bytes(&m->params[i].type);
  for (const Op *op = m->main->first; op; op = op->next)
    for (int k = 0; k < op->nresults; k++) b += (double)tensor_type_bytes(&op->results[k]->type);
  return b;
}

/* --load: DIR/name.npy into t where the file exists: the global array in the declared dim order,
 * float32 for float tensors (rounded to the declared dtype), int32 for integer ones. */
static bool load_one(const char *dir, const char *name, const TensorType *type, Tensor **slot) {
  char path[4096], err[600];
  snprintf(path, sizeof path, "%s/%s.npy", dir, name);
  if (access(path, F_OK) != 0) return true;
  Tensor *t = tensor_new(type);
  if (!t) {
    diag_error((SrcLoc){0}, "run: --load: %s: out of memory", path);
    return false;
  }
  *slot = t;
  NpyArray a;
  if (!npy_read(path, &a, err, sizeof err)) {
    diag_error((SrcLoc){0}, "run: --load: %s", err);
    return false;
  }
  bool ok = a.rank == t->type.rank && a.is_int == dtype_is_int(t->type.dtype);
  for (int d = 0; ok && d < a.rank; d++) ok = a.shape[d] == t->type.dims[d]->size;
  if (!ok) {
    char want[256];
    int wl = snprintf(want, sizeof want, "%s[", dtype_name(t->type.dtype));
    for (int d = 0; d < t->type.rank; d++)
      wl += snprintf(want + wl, sizeof want - (size_t)wl, "%s%s=%lld", d ? ", " : "", t->type.dims[d]->name, (long long)t->type.dims[d]->size);
    snprintf(want + wl, sizeof want - (size_t)wl, "]");
    char got[128];
    int len = snprintf(got, sizeof got, "%s[", a.is_int ? "int32" : "float32");
    for (int d = 0; d < a.rank; d++) len += snprintf(got + len, sizeof got - (size_t)len, "%s%lld", d ? ", " : "", (long long)a.shape[d]);
    snprintf(got + len, sizeof got - (size_t)len, "]");
    diag_error((SrcLoc){0}, "run: --load: %s holds %s, but '%s' is %s (%s for its dtype, the global shape in the declared dim order)",
               path, got, name, want, dtype_is_int(t->type.dtype) ? "int32" : "float32");
    npy_free(&a);
    return false;
  }
  for (int64_t i = 0; i < a.n; i++) t->data[i] = interp_round_value(INTERP_DTYPE, t->type.dtype, a.data[i]);
  npy_free(&a);
  return true;
}

static bool load_all(const Options *o, const IrModule *m, Tensor **inputs, Tensor **params) {
  bool ok = true;
  for (int i = 0; i < m->nparams && ok; i++) ok = load_one(o->load, m->params[i].path, &m->params[i].type, &params[i]);
  const StepInfo *si = m->step;
  for (int i = 0; i < m->main->ninputs && ok; i++) {
    const Value *v = m->main->inputs[i];
    if (si && i >= si->nargs && i != si->in_labels) continue; /* optimizer state: never loaded */
    const char *name = si && i == si->in_labels ? "labels" : v->name;
    if (name) ok = load_one(o->load, name, &v->type, &inputs[i]);
  }
  return ok;
}

static bool save_one(const char *dir, const char *name, const Tensor *t) {
  char path[4096], err[600];
  int64_t shape[MAX_RANK];
  for (int d = 0; d < t->type.rank; d++) shape[d] = t->type.dims[d]->size;
  snprintf(path, sizeof path, "%s/%s.npy", dir, name);
  if (!npy_write_f32(path, shape, t->type.rank, t->data, err, sizeof err)) {
    diag_error((SrcLoc){0}, "run: --save: %s", err);
    return false;
  }
  return true;
}

typedef struct Diff {
  double max_abs, max_rel, worst_excess; /* worst_excess: largest |d| - tol (> 0: FAIL) */
  double atol, rtol;                     /* of the worst output */
  bool pass;
} Diff;

static void diff_into(Diff *D, const double *a, const double *ref, int64_t n, DType dt, DType program) {
  double atol, rtol, scale = 0, worst = 0;
  tolerance(dt, &atol, &rtol);
  if (!dtype_is_int(dt) && program != DT_F32) tolerance(program, &atol, &rtol);
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

static bool build_executable(const Options *o, Arena *arena, Lowered *lw, const IrModule *m, const Mesh *mesh, const RunGen *gin,
                             const RunGen *gpar, DType program, const SimReport *sim);

/* build: `shardc build FILE -o EXE` stops after lowering and writes the executable instead. */
static int run(const Options *o, Arena *arena, bool build) {
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

  double need = host_bytes(m), have = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  if (need > have / 2) {
    char b1[32], b2[32];
    diag_error(p->step ? p->step->loc : p->entry->loc,
               "run: at these sizes the program needs about %s of this machine's memory (it has %s): shrink dims "
               "with -D (e.g. -D batch=8 -D seq=16), or predict the full size with `shardc sim`",
               fmt_bytes(b1, sizeof b1, need), fmt_bytes(b2, sizeof b2, have));
    return EXIT_PROGRAM_ERROR;
  }
  double t0 = rt_seconds();
  Lowered *lw = lower_new();
  /* the one-device program: the module before partitioning (every value whole) */
  bool ok = lower_function(lw, m, NULL, "shard_reference");
  /* Inputs and params: loaded (--load) or generated per global index (RunGen, run_host.h) */
  int nin = m->main->ninputs;
  Tensor **inputs = calloc((size_t)nin + 1, sizeof *inputs), **params = calloc((size_t)m->nparams + 1, sizeof *params);
  RunGen *gin = calloc((size_t)nin + 1, sizeof *gin), *gpar = calloc((size_t)m->nparams + 1, sizeof *gpar);
  int64_t *range = calloc((size_t)nin + 1, sizeof *range);
  interp_index_ranges(m, range);
  for (int i = 0; i < m->nparams; i++) { /* [-1, 1) / sqrt(fan-in); a norm's scale around 1 */
    const IrParam *pp = &m->params[i];
    int lead = pp->stack_depth, own = pp->type.rank - lead;
    double scale = 1 / sqrt(own > 0 ? (double)pp->type.dims[lead]->size : 1.0), center = own == 1 ? 1.0 : 0.0;
    gpar[i] = (RunGen){.key = 1000000 + (uint64_t)i, .lo = center - scale, .hi = center + scale};
  }
  const StepInfo *si = m->step;
  for (int i = 0; i < nin; i++) {
    bool is_int = dtype_is_int(m->main->inputs[i]->type.dtype);
    gin[i] = (RunGen){.key = (uint64_t)i, .lo = is_int ? 0 : -1, .hi = is_int ? (double)(range[i] > 0 ? range[i] : 8) : 1};
  }
  if (si && si->in_t >= 0) gin[si->in_t] = (RunGen){.lo = 1, .hi = 1}; /* adam's step count: the first step */
  if (o->load && !load_all(o, m, inputs, params)) ok = false;
  for (int k = 0; si && k < si->nparams; k++) { /* a fresh run: moments at zero; master copies = params */
    const StepParam *sp = &si->params[k];
    if (sp->in_m >= 0) gin[sp->in_m] = (RunGen){0};
    if (sp->in_v >= 0) gin[sp->in_v] = (RunGen){0};
    if (sp->in_master >= 0 && sp->param >= 0) {
      gin[sp->in_master] = gpar[sp->param];
      if (params[sp->param] && ok) {
        inputs[sp->in_master] = tensor_copy(params[sp->param]);
        if (inputs[sp->in_master]) inputs[sp->in_master]->type = m->main->inputs[sp->in_master]->type;
      }
    }
  }
  free(range);
  if (ok && (!pipeline_run(m, p) || diag_error_count() > 0)) ok = false;
  /* the simulated clock: each op the devices run adds the time `shardc sim` gives it on the mesh's
   * target, so the run reports what it executed in simulated time (compared with sim below) */
  SimCosts costs;
  if (ok) {
    sim_costs_build(arena, m, mesh, false, &costs);
    lower_set_clock(lw, &costs);
  }
  if (ok) ok = lower_function(lw, m, mesh, "shard_device");
  SimReport sim = {0};
  SimOptions sim_opts = {0};
  bool simulated = ok && sim_program(p, m, &sim_opts, &sim);
  char err[512];
  double t_lower = rt_seconds();
  if (ok && !lower_finish(lw, err, sizeof err)) {
    diag_error((SrcLoc){0}, "run: %s", err);
    ok = false;
  }
  if (ok && build) {
    if (o->load || o->save) diag_error((SrcLoc){0}, "build: --load and --save are options of `run` (a built executable generates its inputs)");
    else ok = build_executable(o, arena, lw, m, mesh, gin, gpar, narrowest(m->main, DT_F32), simulated ? &sim : NULL);
    sim_report_free(&sim);
    lower_free(lw);
    interp_free_tensors(inputs, nin);
    interp_free_tensors(params, m->nparams);
    free(gin), free(gpar);
    return ok && diag_error_count() == 0 ? EXIT_OK : EXIT_PROGRAM_ERROR;
  }
  if (ok && o->emit_llvm) {
    sim_report_free(&sim);
    lower_print(lw, stdout);
    lower_free(lw);
    interp_free_tensors(inputs, nin);
    interp_free_tensors(params, m->nparams);
    free(gin), free(gpar);
    return EXIT_OK;
  }
  double t_o2 = rt_seconds();
  void *fns[2] = {0};
  const char *names[2] = {"shard_reference", "shard_device"};
  if (ok && !lower_jit(lw, names, 2, fns, err, sizeof err)) {
    diag_error((SrcLoc){0}, "run: %s", err);
    ok = false;
  }
  double compile_s = rt_seconds() - t0;
  if (getenv("SHARDC_RUN_TIMING")) /* where compile time goes: lowering, verify + O2, JIT */
    fprintf(stderr, "run: lowering %.1f ms, O2 %.1f ms, JIT %.1f ms\n", (t_lower - t0) * 1e3, (t_o2 - t_lower) * 1e3,
            (rt_seconds() - t_o2) * 1e3);
  if (!ok) {
    sim_report_free(&sim);
    lower_free(lw);
    interp_free_tensors(inputs, nin);
    interp_free_tensors(params, m->nparams);
    free(gin), free(gpar);
    return EXIT_PROGRAM_ERROR;
  }

  RtConfig cfg = {.timeout_s = o->timeout, .mem_cap = (size_t)o->hbm};
  int steps = o->steps > 0 ? o->steps : 1; /* a forward runs `steps` times on the same inputs */
  double *loss_ref = calloc((size_t)steps, sizeof(double)), *loss_shd = calloc((size_t)steps, sizeof(double));
  Diff D = {.pass = true};
  DType program = narrowest(m->main, DT_F32);
  rc = EXIT_PROGRAM_ERROR;
  RunSide *ref = run_side_open(m, NULL, (RtEntry)fns[0], &cfg, err, sizeof err), *shd = NULL;
  if (ref) shd = run_side_open(m, mesh, (RtEntry)fns[1], &cfg, err, sizeof err);
  if (!ref || !shd || !run_side_fill(ref, inputs, params, gin, gpar, o->seed, err, sizeof err) ||
      !run_side_fill(shd, inputs, params, gin, gpar, o->seed, err, sizeof err)) {
    diag_error((SrcLoc){0}, "run: %s", err);
    goto done;
  }
  const char *perturb = getenv("SHARDC_RUN_PERTURB"); /* tests: one device's result is made wrong */
  for (int s = 0; s < steps; s++) {
    if (!run_side_step(ref, err, sizeof err)) {
      diag_error((SrcLoc){0}, "run: the one-device program failed: %s", err);
      goto done;
    }
    if (!run_side_step(shd, err, sizeof err)) {
      diag_error((SrcLoc){0}, "run: the sharded program failed: %s", err);
      goto done;
    }
    if (perturb && *perturb && s == steps - 1) run_side_perturb(shd, 0, atof(perturb));
    for (int j = 0; j < m->main->noutputs; j++) {
      if (j > 0 && s < steps - 1) break; /* params and state: compared after the last step */
      if (j == 0 && s < steps - 1 && !m->step) break;
      const Value *v = m->main->outputs[j];
      Tensor *a = run_side_output(shd, j), *r = run_side_output(ref, j);
      if (!a || !r) {
        tensor_free(a), tensor_free(r);
        goto done;
      }
      if (m->step && j == 0) loss_shd[s] = a->data[0], loss_ref[s] = r->data[0];
      diff_into(&D, a->data, r->data, a->n, m->step && j == 0 ? DT_F32 : v->type.dtype, program);
      tensor_free(a), tensor_free(r);
    }
    if (m->step && s < steps - 1) run_side_carry(ref), run_side_carry(shd);
  }
  if (o->save) {
    mkdir(o->save, 0777); /* an existing directory is fine; a failure shows when writing */
    bool saved = true;
    if (!m->step) {
      Tensor *t = run_side_output(shd, 0);
      saved = t && save_one(o->save, "output", t);
      tensor_free(t);
    } else {
      for (int k = 0; k < si->nparams && saved; k++) {
        const StepParam *sp = &si->params[k];
        if (sp->out_param < 0 || sp->param < 0) continue;
        Tensor *t = run_side_output(shd, sp->out_param);
        saved = t && save_one(o->save, m->params[sp->param].path, t);
        tensor_free(t);
      }
      Dim steps_dim = {.name = "step", .size = steps};
      Tensor lt = {.type = {.dtype = DT_F32, .rank = 1, .dims = {&steps_dim}}, .n = steps, .data = loss_shd};
      if (saved) saved = save_one(o->save, "loss", &lt);
    }
    if (!saved) goto done;
  }
  size_t peak = run_side_peak(shd);
  double clock_compute, clock_comm;
  run_side_clock(shd, &clock_compute, &clock_comm);

  int ndev = run_side_devices(shd);
  double step_s = run_side_seconds(shd) / steps, ref_s = run_side_seconds(ref) / steps;
  if (o->format == FORMAT_JSON) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "devices", ndev);
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
    /* what ran: the collectives (language.md's explain entries: kind, axes, bytes per device, count) */
    RunExecuted *ex = NULL;
    int exdev[64], nexdev = 0, nex = run_side_executed(shd, &ex, exdev, &nexdev);
    cJSON *e = cJSON_AddArrayToObject(j, "executed");
    static const char *const kinds[] = {"all_gather", "reduce_scatter", "all_reduce", "all_to_all", "collective_permute"};
    for (int i = 0; i < nex; i++) {
      cJSON *x = cJSON_CreateObject();
      cJSON_AddStringToObject(x, "kind", ex[i].kind >= 0 && ex[i].kind < 5 ? kinds[ex[i].kind] : "?");
      cJSON *ax = cJSON_AddArrayToObject(x, "axes");
      for (int a = 0; a < mesh->naxes; a++)
        if (ex[i].axes >> a & 1u) cJSON_AddItemToArray(ax, cJSON_CreateString(mesh->axes[a].name));
      cJSON_AddNumberToObject(x, "bytes_per_device", ex[i].bytes_per_device);
      cJSON_AddNumberToObject(x, "count", ex[i].count);
      cJSON_AddItemToArray(e, x);
    }
    cJSON *ma = cJSON_AddArrayToObject(j, "mesh_axes");
    for (int a = 0; a < mesh->naxes; a++) {
      cJSON *x = cJSON_CreateObject();
      cJSON_AddStringToObject(x, "name", mesh->axes[a].name);
      cJSON_AddNumberToObject(x, "size", mesh->axes[a].size);
      cJSON_AddItemToArray(ma, x);
    }
    cJSON *ed = cJSON_AddArrayToObject(j, "executed_devices");
    for (int i = 0; i < nexdev; i++) cJSON_AddItemToArray(ed, cJSON_CreateNumber(exdev[i]));
    if (nex < 0) cJSON_AddStringToObject(j, "executed_error", "the runtime lost count (out of host memory)");
    free(ex);
    cJSON *c = cJSON_AddObjectToObject(j, "simulated");
    cJSON_AddStringToObject(c, "target", mesh->target->name);
    cJSON_AddNumberToObject(c, "compute_s", clock_compute);
    cJSON_AddNumberToObject(c, "comm_s", clock_comm);
    if (simulated) {
      cJSON_AddNumberToObject(c, "sim_compute_s", sim.compute_s);
      cJSON_AddNumberToObject(c, "sim_comm_s", sim.comm_s);
      cJSON_AddNumberToObject(c, "sim_step_time_s", sim.step_s);
    }
    report_json(j);
  } else {
    char b[32];
    printf("%s: %s on %d device thread%s (mesh %s) vs one device\n", D.pass ? "PASS" : "FAIL", o->input, ndev,
           ndev == 1 ? "" : "s", mesh->name);
    printf("  worst error    %.3g abs, %.3g relative to the reference's largest value (tolerance %.0e + %.0e |ref|)\n", D.max_abs,
           D.max_rel, D.atol, D.rtol);
    for (int s = 0; m->step && s < steps; s++) printf("  loss step %-4d %.6g (one device: %.6g)\n", s + 1, loss_shd[s], loss_ref[s]);
    printf("  step time      %.3f ms sharded, %.3f ms on one device%s\n", step_s * 1e3, ref_s * 1e3,
           steps > 1 ? arena_printf(arena, " (mean of %d steps)", steps) : "");
    printf("  compile time   %.1f ms (lowering, O2, JIT)\n", compile_s * 1e3);
    printf("  peak memory    %s per device\n", fmt_bytes(b, sizeof b, (double)peak));
    printf("  simulated      on %s: the ops each device ran take %s of compute and %s of collectives", mesh->target->name,
           report_seconds(arena, clock_compute), report_seconds(arena, clock_comm));
    if (simulated)
      printf(" (shardc sim: %s and %s; a step of %s with overlap)", report_seconds(arena, sim.compute_s),
             report_seconds(arena, sim.comm_s), report_seconds(arena, sim.step_s));
    printf("\n");
  }
  rc = D.pass ? EXIT_OK : EXIT_PROGRAM_ERROR;
done:
  sim_report_free(&sim);
  run_side_close(ref);
  run_side_close(shd);
  free(loss_ref);
  free(loss_shd);
  interp_free_tensors(inputs, nin);
  interp_free_tensors(params, m->nparams);
  free(gin), free(gpar);
  lower_free(lw);
  return rc;
}

int cmd_run(const Options *o) {
  Arena arena;
  arena_init(&arena);
  int rc = run(o, &arena, false);
  arena_free(&arena);
  return rc;
}

/* ---- build: an object from the module, a description of the slots, linked with the runtime ---- */

/* An RtPlace as C: its arrays (NAME_start, NAME_holds, NAME_take) printed first; its initializer. */
static const char *place_c(FILE *f, Arena *a, const char *name, const RtPlace *pl) {
  const char *start = "NULL", *holds = "NULL", *take = "NULL";
  if (pl->start && pl->rank > 0) {
    fprintf(f, "static const int64_t %s_start[] = {", name);
    for (int64_t i = 0; i < (int64_t)pl->ndev * pl->rank; i++) fprintf(f, "%lld,", (long long)pl->start[i]);
    fprintf(f, "};\n");
    start = arena_printf(a, "%s_start", name);
  }
  const uint8_t *arr[2] = {pl->holds, pl->take};
  const char **out[2] = {&holds, &take};
  for (int k = 0; k < 2; k++) {
    if (!arr[k]) continue;
    fprintf(f, "static const uint8_t %s_%s[] = {", name, k ? "take" : "holds");
    for (int i = 0; i < pl->ndev; i++) fprintf(f, "%d,", arr[k][i]);
    fprintf(f, "};\n");
    *out[k] = arena_printf(a, "%s_%s", name, k ? "take" : "holds");
  }
  const char *t = arena_printf(a, "{.dtype = %d, .rank = %d, .ndev = %d, .partial = %d, .global = {", pl->dtype, pl->rank, pl->ndev, pl->partial);
  for (int d = 0; d < pl->rank; d++) t = arena_printf(a, "%s%lld,", t, (long long)pl->global[d]);
  t = arena_printf(a, "%s}, .local = {", t);
  for (int d = 0; d < pl->rank; d++) t = arena_printf(a, "%s%lld,", t, (long long)pl->local[d]);
  t = arena_printf(a, "%s}, .order = {", t);
  for (int d = 0; d < pl->rank; d++)
    t = arena_printf(a, "%s{%lld, %lld, %lld, %lld},", t, (long long)pl->order[d].kind, (long long)pl->order[d].n, (long long)pl->order[d].v,
                     (long long)pl->order[d].chunk);
  return arena_printf(a, "%s}, .start = %s, .holds = %s, .take = %s}", t, start, holds, take);
}

/* Slot k's description: its placements in both programs (the device program's, devprog_place) and
 * how its values are made; the arrays printed, the initializer into init[k]. v NULL: a param main
 * does not read (whole on every device). */
static void slot_desc(FILE *f, Arena *a, int k, const Value *v, const TensorType *t, const IrModule *m, const RunGen *g,
                      const char **init) {
  RtPlace sharded, whole;
  Value tmp = {.type = *t};
  devprog_place(v ? m->dev : NULL, a, v ? v : &tmp, &sharded);
  if (!v) sharded.ndev = m->dev ? m->dev->ndev : 1;
  devprog_place(NULL, a, v ? v : &tmp, &whole);
  const char *ps = place_c(f, a, arena_printf(a, "slot%d", k), &sharded), *pw = place_c(f, a, arena_printf(a, "slot%dw", k), &whole);
  init[k] = arena_printf(a, "  {.sharded = %s,\n   .whole = %s", ps, pw);
  if (g) init[k] = arena_printf(a, "%s, .key = %lluull, .lo = %.17g, .hi = %.17g", init[k], (unsigned long long)g->key, g->lo, g->hi);
  init[k] = arena_printf(a, "%s},\n", init[k]);
}

static bool build_executable(const Options *o, Arena *arena, Lowered *lw, const IrModule *m, const Mesh *mesh, const RunGen *gin,
                             const RunGen *gpar, DType program, const SimReport *sim) {
  char err[512], obj[4200], csrc[4200], cmd[16384];
  snprintf(obj, sizeof obj, "%s.o", o->output);
  snprintf(csrc, sizeof csrc, "%s.main.c", o->output);
  if (!lower_emit_object(lw, obj, err, sizeof err)) {
    diag_error((SrcLoc){0}, "build: %s", err);
    return false;
  }
  FILE *f = fopen(csrc, "w");
  if (!f) {
    diag_error((SrcLoc){0}, "build: cannot write %s", csrc);
    return false;
  }
  const IrFunc *mf = m->main;
  const Value **pval = calloc((size_t)m->nparams + 1, sizeof *pval);
  for (const Op *op = mf->first; op; op = op->next)
    if (op->kind == OP_PARAM && op->index >= 0 && op->index < m->nparams) pval[op->index] = op->results[0];
  fprintf(f, "/* generated by shardc build from %s: the slots of its lowered program (shardrt.h, RtProgram) */\n", o->input);
  fprintf(f, "#include <stddef.h>\n#include \"shardrt.h\"\nint shard_reference(RtDevice *, void *);\nint shard_device(RtDevice *, void *);\n");
  int nslots = mf->ninputs + m->nparams + mf->noutputs;
  const char **init = ARENA_ARRAY(arena, const char *, nslots + 1);
  for (int i = 0; i < mf->ninputs; i++) slot_desc(f, arena, i, mf->inputs[i], &mf->inputs[i]->type, m, &gin[i], init);
  for (int i = 0; i < m->nparams; i++) slot_desc(f, arena, mf->ninputs + i, pval[i], &m->params[i].type, m, &gpar[i], init);
  for (int j = 0; j < mf->noutputs; j++)
    slot_desc(f, arena, mf->ninputs + m->nparams + j, mf->outputs[j], &mf->outputs[j]->type, m, NULL, init);
  fprintf(f, "static const RtSlotDesc slots[] = {\n");
  for (int k = 0; k < nslots; k++) fputs(init[k], f);
  fprintf(f, "};\nstatic const int carry[] = {");
  int ncarry = 0;
  const StepInfo *si = m->step;
  for (int k = 0; si && k < si->nparams; k++) {
    const StepParam *sp = &si->params[k];
    int pairs[4][2] = {{sp->param >= 0 ? mf->ninputs + sp->param : -1, sp->out_param}, {sp->in_master, sp->out_master}, {sp->in_m, sp->out_m}, {sp->in_v, sp->out_v}};
    for (int j = 0; j < 4; j++)
      if (pairs[j][0] >= 0 && pairs[j][1] >= 0) fprintf(f, "%d, %d, ", pairs[j][0], pairs[j][1]), ncarry++;
  }
  fprintf(f, "-1};\n");
  int32_t rec[64]; /* the devices of record for what ran: one per stage, or device 0 */
  int nrec = devprog_record_devices(m->dev, rec, 64);
  fprintf(f, "static const int32_t executed[] = {");
  for (int r = 0; r < nrec; r++) fprintf(f, "%d, ", rec[r]);
  fprintf(f, "};\n");
  double atol, rtol;
  tolerance(program != DT_F32 ? program : DT_F32, &atol, &rtol);
  fprintf(f, "static const RtProgram program = {.name = \"%s\", .mesh = \"%s\", .naxes = %d, .axis_size = {", o->input, mesh->name, mesh->naxes);
  for (int a = 0; a < mesh->naxes; a++) fprintf(f, "%d, ", mesh->axes[a].size);
  fprintf(f, "}, .axis_name = {");
  for (int a = 0; a < mesh->naxes; a++) fprintf(f, "\"%s\", ", mesh->axes[a].name);
  fprintf(f, "}, .reference = shard_reference, .device = shard_device, .nin = %d, .nparams = %d, .nout = %d, .slots = slots,\n"
             "  .step = %d, .nt = %d, .ncarry = %d, .carry = carry, .atol = %.17g, .rtol = %.17g, .seed = %lluull,\n"
             "  .target = \"%s\", .sim_compute_s = %.17g, .sim_comm_s = %.17g, .sim_step_s = %.17g,\n"
             "  .nexecuted = (int)(sizeof executed / sizeof executed[0]), .executed = executed};\n",
          mf->ninputs, m->nparams, mf->noutputs, si != NULL, si ? si->in_t : -1, ncarry, atol, rtol, (unsigned long long)o->seed,
          mesh->target->name, sim ? sim->compute_s : -1, sim ? sim->comm_s : -1, sim ? sim->step_s : -1);
  fprintf(f, "int main(int argc, char **argv) { return rt_launch_main(argc, argv, &program); }\n");
  free(pval);
  if (fclose(f) != 0) {
    diag_error((SrcLoc){0}, "build: cannot write %s", csrc);
    return false;
  }
  snprintf(cmd, sizeof cmd, "cc -O1 -std=c11 -I'%s' -o '%s' '%s' '%s' '%s' %s -lpthread -lm", SHARDC_RUNTIME_INCLUDE, o->output, csrc, obj,
           SHARDC_RUNTIME_LIB, SHARDC_RUNTIME_LINK);
  int rc = system(cmd);
  remove(obj);
  remove(csrc);
  if (rc != 0) {
    diag_error((SrcLoc){0}, "build: linking failed: %s", cmd);
    return false;
  }
  return true;
}

int cmd_build(const Options *o) {
  if (!o->output) {
    fprintf(stderr, "shardc: build needs -o EXE (see 'shardc --help')\n");
    return EXIT_USAGE;
  }
  Arena arena;
  arena_init(&arena);
  int rc = run(o, &arena, true);
  arena_free(&arena);
  return rc;
}
