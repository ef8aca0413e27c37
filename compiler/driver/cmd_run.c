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
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "interp.h"
#include "localize.h"
#include "report.h"
#include "shardrt.h"
#include "npy.h"
#include "run_host.h"
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

/* Host bytes a run needs, roughly: the whole inputs and params made on the host (in double), and
 * every value of main at its global size for the one-device run (an overestimate: buffers are
 * freed after their last use). */
static double host_bytes(const IrModule *m) {
  double b = 0;
  for (int i = 0; i < m->main->ninputs; i++) b += 8.0 * (double)tensor_type_elements(&m->main->inputs[i]->type);
  for (int i = 0; i < m->nparams; i++) b += 8.0 * (double)tensor_type_elements(&m->params[i].type);
  for (const Op *op = m->main->first; op; op = op->next)
    for (int k = 0; k < op->nresults; k++) b += (double)tensor_type_bytes(&op->results[k]->type);
  return b;
}

/* --load: DIR/name.npy into t where the file exists: the global array in the declared dim order,
 * float32 for float tensors (rounded to the declared dtype), int32 for integer ones. */
static bool load_one(const char *dir, const char *name, Tensor *t, bool *loaded) {
  char path[4096], err[600];
  snprintf(path, sizeof path, "%s/%s.npy", dir, name);
  *loaded = false;
  if (access(path, F_OK) != 0) return true;
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
  *loaded = true;
  return true;
}

static bool load_all(const Options *o, const IrModule *m, Tensor **inputs, Tensor **params) {
  bool ok = true, l;
  for (int i = 0; i < m->nparams && ok; i++) ok = load_one(o->load, m->params[i].path, params[i], &l);
  const StepInfo *si = m->step;
  for (int i = 0; i < m->main->ninputs && ok; i++) {
    const Value *v = m->main->inputs[i];
    if (si && i >= si->nargs && i != si->in_labels) continue; /* optimizer state: never loaded */
    const char *name = si && i == si->in_labels ? "labels" : v->name;
    if (name) ok = load_one(o->load, name, inputs[i], &l);
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

static int run(const Options *o, Arena *arena) {
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
  Tensor **inputs = interp_random_inputs(m, o->seed);
  Tensor **params = interp_random_params(m, o->seed);
  const StepInfo *si = m->step;
  if (o->load && !load_all(o, m, inputs, params)) ok = false;
  for (int k = 0; si && k < si->nparams; k++) { /* a fresh run: moments at zero; master copies = params */
    const StepParam *sp = &si->params[k];
    if (sp->in_master >= 0 && sp->param >= 0)
      for (int64_t e = 0; e < inputs[sp->in_master]->n; e++) inputs[sp->in_master]->data[e] = params[sp->param]->data[e];
  }
  for (int k = 0; si && k < si->nparams; k++) { /* a fresh run: moments at zero */
    const StepParam *sp = &si->params[k];
    if (sp->in_m >= 0) memset(inputs[sp->in_m]->data, 0, sizeof(double) * (size_t)inputs[sp->in_m]->n);
    if (sp->in_v >= 0) memset(inputs[sp->in_v]->data, 0, sizeof(double) * (size_t)inputs[sp->in_v]->n);
  }
  if (ok && (!pipeline_run(m, p) || diag_error_count() > 0)) ok = false;
  if (ok) ok = lower_function(lw, m, mesh, "shard_device");
  char err[512];
  double t_lower = rt_seconds();
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
    lower_free(lw);
    interp_free_tensors(inputs, interp_ninputs(m));
    interp_free_tensors(params, m->nparams);
    return EXIT_PROGRAM_ERROR;
  }

  RtConfig cfg = {.timeout_s = o->timeout, .mem_cap = (size_t)o->hbm};
  int steps = m->step && o->steps > 0 ? o->steps : 1;
  double *loss_ref = calloc((size_t)steps, sizeof(double)), *loss_shd = calloc((size_t)steps, sizeof(double));
  Diff D = {.pass = true};
  DType program = narrowest(m->main, DT_F32);
  rc = EXIT_PROGRAM_ERROR;
  RunSide *ref = run_side_open(m, NULL, (RtEntry)fns[0], &cfg, err, sizeof err), *shd = NULL;
  if (ref) shd = run_side_open(m, mesh, (RtEntry)fns[1], &cfg, err, sizeof err);
  if (!ref || !shd || !run_side_fill(ref, inputs, params, err, sizeof err) || !run_side_fill(shd, inputs, params, err, sizeof err)) {
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
  }
  rc = D.pass ? EXIT_OK : EXIT_PROGRAM_ERROR;
done:
  run_side_close(ref);
  run_side_close(shd);
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
