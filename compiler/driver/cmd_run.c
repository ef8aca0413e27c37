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
#include "interp.h"
#include "localize.h"
#include "report.h"
#include "shardrt.h"
#include "npy.h"
#include "run_host.h"
#include "run_verdict.h"
#include "sim.h"
#include "step.h"

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

static const char *fmt_bytes(char *buf, size_t n, double b) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) b /= 1024, i++;
  snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
  return buf;
}

static bool build_executable(const Options *o, Lowered *lw, const IrModule *m, const Mesh *mesh, const RunGen *gin,
                             const RunGen *gpar, const RtCmpDesc *cmp, const SimReport *sim);

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
  /* how each output is compared (runtime/verdict.h), from the module before partitioning */
  const RtCmpDesc *cmp = run_verdict_descs(arena, m);
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
    else ok = build_executable(o, lw, m, mesh, gin, gpar, cmp, simulated ? &sim : NULL);
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
  RtVerdict V;
  rt_verdict_init(&V, o->allow_nonfinite);
  if (getenv("SHARDC_VERDICT_TRACE")) V.trace = stderr; /* every tensor's comparison, one line each */
  V.lr = si ? si->step->lr : 0;
  int nout = m->main->noutputs;
  Tensor **got = calloc((size_t)nout + 1, sizeof *got), **want = calloc((size_t)nout + 1, sizeof *want);
  Tensor **before = calloc((size_t)nout + 1, sizeof *before);
  RtCmpData *data = calloc((size_t)nout + 1, sizeof *data);
  rc = EXIT_PROGRAM_ERROR;
  /* routing decisions: the sharded run follows the one-device run's where they differ by rounding
   * alone (shardrt.h, RtRouteLog) */
  RtRouteLog *routes = rt_route_log_new();
  RtConfig cfg_ref = cfg, cfg_shd = cfg;
  cfg_ref.route_log = cfg_shd.route_log = routes;
  cfg_ref.route_mode = RT_ROUTE_RECORD, cfg_shd.route_mode = RT_ROUTE_FOLLOW;
  if (getenv("SHARDC_ROUTE_OWN")) cfg_shd.route_mode = RT_ROUTE_OWN; /* tests: each run routes by its own logits */
  RunSide *ref = routes ? run_side_open(m, NULL, (RtEntry)fns[0], &cfg_ref, err, sizeof err) : NULL, *shd = NULL;
  if (ref) shd = run_side_open(m, mesh, (RtEntry)fns[1], &cfg_shd, err, sizeof err);
  if (!got || !want || !before || !data || !ref || !shd || !run_side_fill(ref, inputs, params, gin, gpar, o->seed, err, sizeof err) ||
      !run_side_fill(shd, inputs, params, gin, gpar, o->seed, err, sizeof err)) {
    diag_error((SrcLoc){0}, "run: %s", err[0] ? err : "out of host memory");
    goto done;
  }
  const char *perturb = getenv("SHARDC_RUN_PERTURB"); /* tests: one device's result is made wrong */
  /* Lockstep: every step of both runs starts from the same state (the one-device run's), so each
   * step is compared from the same point and rounding differences do not compound (docs/run.md,
   * "How run decides PASS"). A train step compares every output after every step; a forward, which
   * runs `steps` times on the same inputs, its last output. */
  for (int s = 0; s < steps; s++) {
    for (int j = 0; si && j < nout; j++) /* the state before the step, for the updates' comparison */
      if (cmp[j].before >= 0 && !(before[j] = run_side_input(ref, cmp[j].before))) {
        diag_error((SrcLoc){0}, "run: out of host memory");
        goto done;
      }
    rt_route_log_clear(routes);
    if (!run_side_step(ref, err, sizeof err)) {
      diag_error((SrcLoc){0}, "run: the one-device program failed: %s", err);
      goto done;
    }
    if (!run_side_step(shd, err, sizeof err)) {
      diag_error((SrcLoc){0}, "run: the sharded program failed: %s", err);
      goto done;
    }
    if (perturb && *perturb && s == steps - 1) { /* D, or D@NAME: output NAME's (run_verdict.h's names) */
      const char *at = strchr(perturb, '@');
      int j = 0;
      while (at && j < nout && strcmp(cmp[j].name, at + 1)) j++;
      if (j < nout) run_side_perturb(shd, j, atof(perturb));
    }
    if (si || s == steps - 1) {
      for (int j = 0; j < nout; j++)
        if (!(got[j] = run_side_output(shd, j)) || !(want[j] = run_side_output(ref, j))) {
          diag_error((SrcLoc){0}, "run: out of host memory");
          goto done;
        }
      V.t = s + 1;
      for (int j = 0; j < nout; j++) {
        const RtCmpDesc *d = &cmp[j];
        data[j] = (RtCmpData){.n = got[j]->n, .shd = got[j]->data, .ref = want[j]->data, .before = before[j] ? before[j]->data : NULL,
                              .m = d->m >= 0 ? got[d->m]->data : NULL, .v = d->v >= 0 ? got[d->v]->data : NULL};
      }
      rt_verdict_step(&V, cmp, data, nout);
      if (si) loss_shd[s] = got[0]->data[0], loss_ref[s] = want[0]->data[0];
      for (int j = 0; j < nout; j++) {
        tensor_free(got[j]), tensor_free(want[j]), tensor_free(before[j]);
        got[j] = want[j] = before[j] = NULL;
      }
    }
    if (si && s < steps - 1) {
      run_side_carry(ref);
      if (!run_side_restate(shd, ref, err, sizeof err)) {
        diag_error((SrcLoc){0}, "run: %s", err);
        goto done;
      }
    }
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
  int64_t routed, followed;
  rt_route_log_counts(routes, &routed, &followed);
  double step_s = run_side_seconds(shd) / steps, ref_s = run_side_seconds(ref) / steps;
  if (o->format == FORMAT_JSON) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "devices", ndev);
    cJSON_AddNumberToObject(j, "steps", steps);
    cJSON_AddBoolToObject(j, "pass", V.pass);
    cJSON_AddNumberToObject(j, "max_abs_err", V.worst_abs);
    cJSON_AddNumberToObject(j, "max_rel_err", V.worst_rel);
    cJSON *l = cJSON_AddArrayToObject(j, "loss");
    for (int s = 0; m->step && s < steps; s++) cJSON_AddItemToArray(l, cJSON_CreateNumber(loss_shd[s]));
    cJSON_AddNumberToObject(j, "step_time_s", step_s);
    cJSON_AddNumberToObject(j, "compile_s", compile_s);
    cJSON_AddNumberToObject(j, "peak_bytes_per_device", (double)peak);
    cJSON_AddNumberToObject(j, "reference_step_time_s", ref_s);
    cJSON_AddStringToObject(j, "worst_tensor", V.worst);
    cJSON_AddNumberToObject(j, "tolerance_rel", V.worst_tol_rel);
    if (routed) {
      cJSON_AddNumberToObject(j, "routed_tokens", (double)routed);
      cJSON_AddNumberToObject(j, "routing_followed", (double)followed);
    }
    if (V.pass) cJSON_AddNullToObject(j, "failure");
    else cJSON_AddStringToObject(j, "failure", V.why);
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
    printf("%s: %s on %d device thread%s (mesh %s) vs one device\n", V.pass ? "PASS" : "FAIL", o->input, ndev,
           ndev == 1 ? "" : "s", mesh->name);
    rt_verdict_print(&V, stdout);
    if (followed)
      printf("  routing        %lld of %lld top-k decisions (tokens x routing calls) differed by rounding alone (near-equal "
             "logits); the sharded run followed the one-device run's there\n", (long long)followed, (long long)routed);
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
  rc = V.pass ? EXIT_OK : EXIT_PROGRAM_ERROR;
done:
  for (int j = 0; got && want && before && j < nout; j++) tensor_free(got[j]), tensor_free(want[j]), tensor_free(before[j]);
  free(got), free(want), free(before), free(data);
  sim_report_free(&sim);
  run_side_close(ref);
  run_side_close(shd);
  rt_route_log_free(routes);
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

static void slot_desc(FILE *f, const Value *v, const Mesh *mesh, const RunGen *g, const IrModule *m) {
  fprintf(f, "  {.dtype = %d, .rank = %d, .global = {", v->type.dtype == DT_BF16 ? 1 : v->type.dtype == DT_F16 ? 2 : v->type.dtype == DT_I32 ? 3 : 0,
          v->type.rank);
  for (int d = 0; d < v->type.rank; d++) fprintf(f, "%lld, ", (long long)v->type.dims[d]->size);
  fprintf(f, "}, .local = {");
  for (int d = 0; d < v->type.rank; d++) fprintf(f, "%lld, ", (long long)(v->local[d] ? v->local[d] : v->type.dims[d]->size));
  fprintf(f, "}, .axes = {");
  for (int d = 0; d < v->type.rank; d++) {
    fprintf(f, "{");
    for (int k = 0; k < v->sharding.naxes[d]; k++) fprintf(f, "%d, ", v->sharding.axes[d][k]);
    fprintf(f, "}, ");
  }
  fprintf(f, "}, .naxes = {");
  for (int d = 0; d < v->type.rank; d++) fprintf(f, "%d, ", v->sharding.naxes[d]);
  fprintf(f, "}, .partial = %uu", (unsigned)v->sharding.partial);
  if (g) fprintf(f, ", .key = %lluull, .lo = %.17g, .hi = %.17g", (unsigned long long)g->key, g->lo, g->hi);
  const PipeInfo *pi = m->pipeline ? m->pipeline->pipe : NULL; /* the stages holding it; storage order */
  if (pi) fprintf(f, ", .place = %uu, .stacked = %d", (unsigned)run_value_place(m, v), v->type.rank > 0 && v->type.dims[0] == pi->stack_dim);
  fprintf(f, "},\n");
  (void)mesh;
}

static bool build_executable(const Options *o, Lowered *lw, const IrModule *m, const Mesh *mesh, const RunGen *gin,
                             const RunGen *gpar, const RtCmpDesc *cmp, const SimReport *sim) {
  char err[512], obj[4200], csrc[4200], cmd[16384];
  if (m->zigzag.axes) { /* launch.c places blocks in the sequence's logical order */
    const Op *ring = NULL;
    for (const Op *op = m->main->first; op && !ring; op = op->next)
      if (op->ring) ring = op;
    diag_error(ring ? ring->loc : (SrcLoc){0},
               "build: a causal ring's zigzag order (context parallelism) is not supported by built executables yet; "
               "`shardc run` runs it");
    return false;
  }
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
  fprintf(f, "#include \"shardrt.h\"\n#include \"verdict.h\"\nint shard_reference(RtDevice *, void *);\nint shard_device(RtDevice *, void *);\n");
  fprintf(f, "static const RtSlotDesc slots[] = {\n");
  for (int i = 0; i < mf->ninputs; i++) slot_desc(f, mf->inputs[i], mesh, &gin[i], m);
  for (int i = 0; i < m->nparams; i++) {
    if (pval[i]) slot_desc(f, pval[i], mesh, &gpar[i], m);
    else { /* a param main does not read: whole everywhere */
      Value v = {.type = m->params[i].type};
      slot_desc(f, &v, mesh, &gpar[i], m);
    }
  }
  for (int j = 0; j < mf->noutputs; j++) slot_desc(f, mf->outputs[j], mesh, NULL, m);
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
  fprintf(f, "static const RtCmpDesc cmp[] = {\n"); /* run_verdict.h: how each output is compared */
  for (int j = 0; j < mf->noutputs; j++)
    fprintf(f, "  {.name = \"%s\", .kind = %d, .dtype = %d, .noise = %.17g, .before = %d, .m = %d, .v = %d, .group = %d, .floor = %.17g},\n",
            cmp[j].name, cmp[j].kind, cmp[j].dtype, cmp[j].noise, cmp[j].before, cmp[j].m, cmp[j].v, cmp[j].group, cmp[j].floor);
  fprintf(f, "};\n");
  fprintf(f, "static const RtProgram program = {.name = \"%s\", .mesh = \"%s\", .naxes = %d, .axis_size = {", o->input, mesh->name, mesh->naxes);
  for (int a = 0; a < mesh->naxes; a++) fprintf(f, "%d, ", mesh->axes[a].size);
  fprintf(f, "}, .axis_name = {");
  for (int a = 0; a < mesh->naxes; a++) fprintf(f, "\"%s\", ", mesh->axes[a].name);
  fprintf(f, "}, .reference = shard_reference, .device = shard_device, .nin = %d, .nparams = %d, .nout = %d, .slots = slots,\n"
             "  .step = %d, .nt = %d, .ncarry = %d, .carry = carry, .cmp = cmp, .lr = %.17g, .seed = %lluull,\n"
             "  .target = \"%s\", .sim_compute_s = %.17g, .sim_comm_s = %.17g, .sim_step_s = %.17g};\n",
          mf->ninputs, m->nparams, mf->noutputs, si != NULL, si ? si->in_t : -1, ncarry, si ? si->step->lr : 0.0, (unsigned long long)o->seed,
          mesh->target->name, sim ? sim->compute_s : -1, sim ? sim->comm_s : -1, sim ? sim->step_s : -1);
  const PipeInfo *pi = m->pipeline ? m->pipeline->pipe : NULL;
  if (pi) { /* run_host.c's placement and storage order, for launch.c */
    fprintf(f, "/* a pipeline: %d stages */\n", pi->stages);
    fprintf(f, "static const RtProgram *pipelined(RtProgram *q) {\n  q->stages = %d, q->nstage_axes = %d, q->chunks = %d, q->chunk_layers = %lld;\n",
            pi->stages, pi->nstage_axes, pi->chunks, (long long)pi->chunk_layers);
    for (int k = 0; k < pi->nstage_axes; k++) fprintf(f, "  q->stage_axes[%d] = %d;\n", k, pi->stage_axes[k]);
    fprintf(f, "  return q;\n}\n");
    fprintf(f, "int main(int argc, char **argv) { RtProgram q = program; return rt_launch_main(argc, argv, pipelined(&q)); }\n");
  } else
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
