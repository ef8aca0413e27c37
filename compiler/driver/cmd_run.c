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
#include <errno.h>
#include <fcntl.h>
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
#include "outfile.h"
#include "run_host.h"
#include "run_mpi.h"
#include "run_verdict.h"
#include "sim.h"
#include "stages.h"
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

/* ---- --load and --save (docs/run.md: what they guarantee) ---- */

/* DIR/NAME.npy in buf; false (an error printed) when it does not fit. */
static bool npy_path(char *buf, size_t size, const char *dir, const char *name, const char *opt) {
  int len = dir ? snprintf(buf, size, "%s/%s.npy", dir, name) : snprintf(buf, size, "%s.npy", name);
  if (len >= 0 && (size_t)len < size) return true;
  diag_error((SrcLoc){0}, "run: %s: the file name for '%.64s...' is too long", opt, name);
  return false;
}

/* --load: DIR/name.npy (dirfd: DIR, locked shared) into *slot where the directory has that name:
 * the global array in the declared dim order, float32 for float tensors (rounded to the declared
 * dtype), int32 for integer ones. No such entry: true with *slot untouched (the tensor is
 * generated); an entry that cannot be read (a dangling symlink, a loop, no permission, not a regular file) or
 * does not match is an error naming it. The shape is checked before the data is allocated. */
static bool load_one(int dirfd, const char *dir, const char *name, const TensorType *type, Tensor **slot) {
  char file[4096], path[4096], err[700];
  if (!npy_path(file, sizeof file, NULL, name, "--load") || !npy_path(path, sizeof path, dir, name, "--load")) return false;
  struct stat st;
  if (fstatat(dirfd, file, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return true;
    diag_error((SrcLoc){0}, "run: --load: %s: %s", path, strerror(errno));
    return false;
  }
  NpyFile f;
  NpyArray a;
  bool ok = npy_open_at(dirfd, file, path, &f, &a, err, sizeof err);
  if (!ok) diag_error((SrcLoc){0}, "run: --load: %s", err);
  bool match = a.rank == type->rank && a.is_int == dtype_is_int(type->dtype);
  for (int d = 0; match && d < a.rank; d++) match = a.shape[d] == type->dims[d]->size;
  if (ok && !match) {
    char want[256];
    int wl = snprintf(want, sizeof want, "%s[", dtype_name(type->dtype));
    for (int d = 0; d < type->rank; d++)
      wl += snprintf(want + wl, sizeof want - (size_t)wl, "%s%s=%lld", d ? ", " : "", type->dims[d]->name, (long long)type->dims[d]->size);
    snprintf(want + wl, sizeof want - (size_t)wl, "]");
    char got[256];
    int len = snprintf(got, sizeof got, "%s[", a.is_int ? "int32" : "float32");
    for (int d = 0; d < a.rank; d++) len += snprintf(got + len, sizeof got - (size_t)len, "%s%lld", d ? ", " : "", (long long)a.shape[d]);
    snprintf(got + len, sizeof got - (size_t)len, "]");
    diag_error((SrcLoc){0}, "run: --load: %s holds %s, but '%s' is %s (%s for its dtype, the global shape in the declared dim order)",
               path, got, name, want, dtype_is_int(type->dtype) ? "int32" : "float32");
    ok = false;
  }
  Tensor *t = ok ? tensor_new(type) : NULL;
  if (ok && !t) {
    diag_error((SrcLoc){0}, "run: --load: %s: out of memory for '%s'", path, name);
    ok = false;
  }
  if (ok && !npy_read_data(&f, &a, err, sizeof err)) {
    diag_error((SrcLoc){0}, "run: --load: %s", err);
    ok = false;
  }
  npy_close(&f);
  if (ok) {
    for (int64_t i = 0; i < a.n; i++) t->data[i] = interp_round_value(INTERP_DTYPE, t->type.dtype, a.data[i]);
    *slot = t;
  } else {
    tensor_free(t);
  }
  npy_free(&a);
  return ok;
}

/* --load DIR: a directory that exists (else an error naming it), read under a shared lock so that a
 * concurrent --save into it is never seen half done. */
static bool load_all(const Options *o, const IrModule *m, Tensor **inputs, Tensor **params) {
  char err[700];
  int dirfd = outfile_dir_open(o->load, false, err, sizeof err);
  if (dirfd < 0) {
    diag_error((SrcLoc){0}, "run: --load: %s", err);
    return false;
  }
  bool ok = true;
  for (int i = 0; i < m->nparams && ok; i++) ok = load_one(dirfd, o->load, m->params[i].path, &m->params[i].type, &params[i]);
  const StepInfo *si = m->step;
  for (int i = 0; i < m->main->ninputs && ok; i++) {
    const Value *v = m->main->inputs[i];
    if (si && i >= si->nargs && i != si->in_labels) continue; /* optimizer state: never loaded */
    const char *name = si && i == si->in_labels ? "labels" : v->name;
    if (name) ok = load_one(dirfd, o->load, name, &v->type, &inputs[i]);
  }
  close(dirfd);
  return ok;
}

/* What --save writes: a function's result as "output", or a train step's params (their paths;
 * from output j of main) and "loss". Calls fn(ctx, name, j) for each, j -1 for the losses; stops at
 * the first false. */
static bool save_each(const IrModule *m, bool (*fn)(void *, const char *, int), void *ctx) {
  const StepInfo *si = m->step;
  if (!si) return fn(ctx, "output", 0);
  for (int k = 0; k < si->nparams; k++) {
    const StepParam *sp = &si->params[k];
    if (sp->out_param >= 0 && sp->param >= 0 && !fn(ctx, m->params[sp->param].path, sp->out_param)) return false;
  }
  return fn(ctx, "loss", -1);
}

/* Before the run: no file --save would write may be an input (the program, a file --load reads). */
static bool save_check_one(void *ctx, const char *name, int j) {
  const Options *o = ctx;
  char path[4096], err[700];
  if (!npy_path(path, sizeof path, o->save, name, "--save")) return false;
  if (outfile_check(path, err, sizeof err)) return true;
  diag_error((SrcLoc){0}, "run: --save: %s", err);
  (void)j;
  return false;
}

typedef struct SaveCtx {
  OutSet *set;
  RunSide *shd;
  const double *loss;
  int steps;
  bool root;     /* under MPI the other ranks only send rank 0 their blocks */
  char err[700];
} SaveCtx;

static bool save_one(void *ctx, const char *name, int j) {
  SaveCtx *c = ctx;
  if (!c->root) {
    if (j >= 0) tensor_free(run_side_output(c->shd, j)); /* NULL here: the blocks go to rank 0 */
    return true;
  }
  char file[4096];
  if (!npy_path(file, sizeof file, NULL, name, "--save")) return false;
  Dim steps_dim = {.name = "step", .size = c->steps};
  Tensor lt = {.type = {.dtype = DT_F32, .rank = 1, .dims = {&steps_dim}}, .n = c->steps, .data = (double *)c->loss};
  Tensor *t = j >= 0 ? run_side_output(c->shd, j) : &lt;
  if (!t) {
    snprintf(c->err, sizeof c->err, "out of memory for '%s'", name);
    return false;
  }
  FILE *f = outfile_set_add(c->set, file, c->err, sizeof c->err);
  int64_t shape[MAX_RANK];
  for (int d = 0; d < t->type.rank; d++) shape[d] = t->type.dims[d]->size;
  bool ok = f && npy_write_f32(f, shape, t->type.rank, t->data);
  if (f && !ok) snprintf(c->err, sizeof c->err, "'%s' has more dims than a .npy header holds here", name);
  if (t != &lt) tensor_free(t);
  return ok;
}

/* --save DIR, after the report: every file of the set written and synced, then renamed into place
 * together with DIR locked (outfile.h); on any failure no file of DIR has changed. */
static bool save_all(const Options *o, const IrModule *m, RunSide *shd, const double *loss, int steps) {
  SaveCtx c = {.shd = shd, .loss = loss, .steps = steps, .root = run_mpi_root()};
  if (!c.root) return save_each(m, save_one, &c);
  c.set = outfile_set_open(o->save, c.err, sizeof c.err);
  bool ok = c.set && save_each(m, save_one, &c);
  if (ok) ok = outfile_set_commit(c.set, c.err, sizeof c.err);
  else outfile_set_discard(c.set);
  if (!ok) diag_error((SrcLoc){0}, "run: --save: %s (the files already in '%s' are unchanged)", c.err, o->save);
  return ok;
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
  char oerr[700];
  if (build && !outfile_check(o->output, oerr, sizeof oerr)) { /* before the work: -o is not an input */
    diag_error((SrcLoc){0}, "build: -o %s", oerr);
    return EXIT_PROGRAM_ERROR;
  }
  Program *p = cp.prog;
  IrModule *m = cp.ir;
  const Mesh *mesh = p->mesh;
  /* --backend mpi: outside mpirun, start it (each rank runs this command again); under it, check
   * the job's size before any work (run_mpi.c) */
  bool mpi = o->backend && strcmp(o->backend, "mpi") == 0;
  if (mpi && !build && !o->emit_llvm) {
    if (!run_mpi_under_mpirun()) return run_mpi_launch(o, mesh);
    if (!run_mpi_rank_begin(o, mesh)) return EXIT_PROGRAM_ERROR;
  }
  bool root = run_mpi_root(); /* rank 0 under MPI: it runs the reference, compares, prints, saves */
  int limit = RT_DEFAULT_MAX_DEVICES;
  if (!mpi && mesh->devices > limit) {
    diag_error(mesh->loc,
               "run: mesh '%s' has %lld devices, more than the %d device threads `run` starts; run it on a small mesh "
               "given inline (--mesh 'h100[data: 2, model: 2]'), shrink dims with -D, or predict it with `shardc sim`",
               mesh->name, (long long)mesh->devices, limit);
    return EXIT_PROGRAM_ERROR;
  }

  double need = host_bytes(m), have = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  bool reference = !o->no_reference || build; /* a built program decides when it runs */
  if (!run_mpi_agree(!(reference && root) || need <= have / 2)) { /* rank 0 runs the one-device program */
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
  /* the one-device program: the module before partitioning (every value whole); under MPI rank 0
   * alone runs it */
  bool lower_ref = reference && (root || build || o->emit_llvm);
  /* run: compiled in parts, through the on-disk object cache unless --no-cache; build and
   * --emit-llvm want the optimised module itself. First the objects stored under what this run
   * read (lower_input_key): found, nothing is lowered or compiled (early). */
  bool cached = !build && !o->emit_llvm && !o->no_cache, hit = false, early = false;
  int parts = 1, tier = 2;
  char warn[1400] = "", ikey[65];
  bool have_ikey = cached && lower_input_key(o->argc, o->argv, lower_ref ? 2 : 1, ikey);
  if (have_ikey) early = hit = lower_cache_load(lw, ikey, &tier, &parts, &cached, warn, sizeof warn);
  have_ikey = have_ikey && cached;
  if (warn[0]) fprintf(stderr, "shardc: warning: %s\n", warn), warn[0] = 0;
  bool ok = !lower_ref || early || lower_function(lw, m, NULL, "shard_reference");
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
  struct stat sst;
  if (ok && o->save && !build && stat(o->save, &sst) == 0 && !S_ISDIR(sst.st_mode)) {
    diag_error((SrcLoc){0}, "run: --save: '%s' is not a directory", o->save);
    ok = false;
  }
  if (ok && o->save && !build && root && !save_each(m, save_check_one, (void *)o)) ok = false;
  bool everywhere = run_mpi_agree(ok); /* under MPI every rank read the files; rank 0 checked --save */
  if (ok && !everywhere) diag_error((SrcLoc){0}, "run: --load failed on another rank");
  ok = everywhere;
  int nflat = 0; /* zero over the flattened params: modelled by check, explain and sim only (issue 19) */
  for (int k = 0; si && k < si->nparams; k++) nflat += si->params[k].flat > 1;
  if (nflat && root)
    fprintf(stderr,
            "shardc: note: zero = %d over the flattened, padded params (%d param%s whose dims the batch axes divide "
            "not): run holds their optimizer state whole on every device and all-reduces their gradients (the same "
            "update: it is elementwise); check's memory counts the flat shards\n",
            si->step->zero, nflat, nflat == 1 ? "" : "s");
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
  if (ok && !stages_require_list(m, p, build ? "build" : "run")) ok = false; /* a schedule too long to list */
  /* the simulated clock: each op the devices run adds the time `shardc sim` gives it on the mesh's
   * target, so the run reports what it executed in simulated time (compared with sim below) */
  SimCosts costs;
  if (ok && !early) {
    sim_costs_build(arena, m, mesh, false, &costs);
    sim_costs_apply_step(&costs, m, p->step);
    lower_set_clock(lw, &costs);
  }
  if (ok && !early) ok = lower_function(lw, m, mesh, "shard_device");
  /* compile time: from here back to t0 (the cache's key and look-up, the passes after checking,
   * lowering), then optimisation, code generation and the JIT; not the simulation between */
  double lower_s = rt_seconds() - t0;
  SimReport sim = {0};
  SimOptions sim_opts = {0};
  bool simulated = ok && sim_program(p, m, &sim_opts, &sim);
  char err[512];
  double t_lower = rt_seconds();
  bool compiled = ok && !build && !o->emit_llvm;
  if (ok && !early) tier = lower_tier(lw, o->steps > 0 ? o->steps : 1);
  const char *names[2] = {"shard_reference", "shard_device"};
  if (ok && !early &&
      !(compiled ? lower_compile(lw, lower_ref ? names : names + 1, lower_ref ? 2 : 1, tier, cached, have_ikey ? ikey : NULL, &hit,
                                 &parts, warn, sizeof warn, err, sizeof err)
                 : lower_finish(lw, err, sizeof err))) {
    diag_error((SrcLoc){0}, "run: %s", err);
    ok = false;
  }
  if (cached && warn[0]) fprintf(stderr, "shardc: warning: %s\n", warn);
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
  if (ok && !lower_jit(lw, lower_ref ? names : names + 1, lower_ref ? 2 : 1, lower_ref ? fns : fns + 1, err, sizeof err)) {
    diag_error((SrcLoc){0}, "run: %s", err);
    ok = false;
  }
  double compile_s = lower_s + (rt_seconds() - t_lower);
  if (getenv("SHARDC_RUN_TIMING")) { /* where compile time goes: lowering, optimisation + code generation, JIT */
    int nests;
    double accesses;
    lower_work(lw, &nests, &accesses);
    fprintf(stderr, "run: %d loop nests, %.3g element accesses a step\n", nests, accesses);
    fprintf(stderr, "run: passes and lowering %.1f ms, optimisation + code generation (tier %d, %d part%s) %.1f ms, JIT %.1f ms%s\n",
            lower_s * 1e3, tier, parts, parts == 1 ? "" : "s, a thread each", (t_o2 - t_lower) * 1e3, (rt_seconds() - t_o2) * 1e3,
            !cached ? "" : early ? " (objects from the cache, found by the inputs: nothing lowered)" : hit ? " (objects from the cache)" : " (objects cached)");
  }
  if (!ok) {
    sim_report_free(&sim);
    lower_free(lw);
    interp_free_tensors(inputs, nin);
    interp_free_tensors(params, m->nparams);
    free(gin), free(gpar);
    return EXIT_PROGRAM_ERROR;
  }

  RtConfig cfg = {.timeout_s = o->timeout, .mem_cap = (size_t)o->hbm}, cfg_shd = cfg;
  if (mpi) cfg_shd.backend = RT_BACKEND_MPI, cfg_shd.threads_per_rank = o->threads_per_rank;
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
   * alone (shardrt.h, RtRouteLog; under MPI rank 0's decisions are handed to every rank) */
  RtRouteLog *routes = rt_route_log_new();
  RtConfig cfg_ref = cfg;
  cfg_ref.route_log = cfg_shd.route_log = routes;
  cfg_ref.route_mode = RT_ROUTE_RECORD, cfg_shd.route_mode = RT_ROUTE_FOLLOW;
  if (getenv("SHARDC_ROUTE_OWN")) cfg_shd.route_mode = RT_ROUTE_OWN; /* tests: each run routes by its own logits */
  /* Under MPI every rank runs the sharded program (its own devices) and rank 0 alone the one-device
   * program, so each step's outcome is agreed on (run_mpi_agree) before the ranks go on together. */
  bool has_ref = reference && root;
  RunSide *ref = NULL, *shd = NULL;
  snprintf(err, sizeof err, "out of host memory for the losses of %d steps", steps);
  bool ok_ref = loss_ref && loss_shd && got && want && before && data && routes &&
                (!has_ref || ((ref = run_side_open(m, NULL, (RtEntry)fns[0], &cfg_ref, err, sizeof err)) &&
                              run_side_fill(ref, inputs, params, gin, gpar, o->seed, err, sizeof err)));
  if (!ok_ref) diag_error((SrcLoc){0}, "run: %s", err);
  if (!run_mpi_agree(ok_ref)) goto done;
  shd = run_side_open(m, mesh, (RtEntry)fns[1], &cfg_shd, err, sizeof err);
  if (!shd || !run_side_fill(shd, inputs, params, gin, gpar, o->seed, err, sizeof err)) {
    diag_error((SrcLoc){0}, "run: %s", err);
    goto done;
  }
  const char *perturb = getenv("SHARDC_RUN_PERTURB"); /* tests: one device's result is made wrong */
  /* Lockstep: every step of both runs starts from the same state (the one-device run's), so each
   * step is compared from the same point and rounding differences do not compound (docs/run.md,
   * "How run decides PASS"). A train step compares every output after every step; a forward, which
   * runs `steps` times on the same inputs, its last output. */
  for (int s = 0; s < steps; s++) {
    bool ok_step = true;
    for (int j = 0; has_ref && si && j < nout && ok_step; j++) /* the state before the step, for the updates' comparison */
      if (cmp[j].before >= 0 && !(before[j] = run_side_input(ref, cmp[j].before))) {
        diag_error((SrcLoc){0}, "run: out of host memory");
        ok_step = false;
      }
    rt_route_log_clear(routes);
    if (ok_step && has_ref && !run_side_step(ref, err, sizeof err)) {
      diag_error((SrcLoc){0}, "run: the one-device program failed: %s", err);
      ok_step = false;
    }
    if (!run_mpi_agree(ok_step)) goto done;
    if (reference && !run_side_share_routes(shd, routes)) {
      if (root) diag_error((SrcLoc){0}, "run: out of host memory for the routing decisions");
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
      bool ok_out = true;
      for (int j = 0; j < nout; j++) { /* every rank takes part; rank 0 gets the whole values */
        got[j] = run_side_output(shd, j);
        want[j] = has_ref ? run_side_output(ref, j) : NULL;
        if (root && (!got[j] || (has_ref && !want[j]))) ok_out = false;
      }
      if (!ok_out) diag_error((SrcLoc){0}, "run: out of host memory");
      if (!run_mpi_agree(ok_out)) goto done;
      V.t = s + 1;
      for (int j = 0; has_ref && j < nout; j++) {
        const RtCmpDesc *d = &cmp[j];
        data[j] = (RtCmpData){.n = got[j]->n, .shd = got[j]->data, .ref = want[j]->data, .before = before[j] ? before[j]->data : NULL,
                              .m = d->m >= 0 ? got[d->m]->data : NULL, .v = d->v >= 0 ? got[d->v]->data : NULL};
      }
      if (has_ref) rt_verdict_step(&V, cmp, data, nout);
      if (root && si) loss_shd[s] = got[0]->data[0], loss_ref[s] = want[0] ? want[0]->data[0] : NAN;
      for (int j = 0; j < nout; j++) {
        tensor_free(got[j]), tensor_free(want[j]), tensor_free(before[j]);
        got[j] = want[j] = before[j] = NULL;
      }
    }
    if (si && s < steps - 1) {
      if (!reference) {
        run_side_carry(shd);
        continue;
      }
      if (has_ref) run_side_carry(ref);
      if (!run_side_restate(shd, ref, err, sizeof err)) {
        if (root) diag_error((SrcLoc){0}, "run: %s", err);
        goto done;
      }
    }
  }
  size_t peak = run_side_peak(shd);
  double clock_compute, clock_comm;
  run_side_clock(shd, &clock_compute, &clock_comm);

  int ndev = run_side_devices(shd), ranks = run_side_processes(shd);
  int64_t routed, followed;
  rt_route_log_counts(routes, &routed, &followed);
  double step_s = run_side_seconds(shd) / steps, ref_s = ref ? run_side_seconds(ref) / steps : 0;
  /* With --format json the one object says whether --save wrote its set ("saved"), so the save runs
   * before it; the text report comes first and the save after (a failed save still shows the
   * verdict). Either way a failed save exits 1. */
  bool json_save = o->save && o->format == FORMAT_JSON, saved = true;
  if (json_save) saved = run_mpi_agree(save_all(o, m, shd, loss_shd, steps));
  if (!root) {
    rc = EXIT_OK; /* rank 0's verdict is everyone's (run_mpi_rank_end) */
  } else if (o->format == FORMAT_JSON) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "devices", ndev);
    cJSON_AddNumberToObject(j, "steps", steps);
    if (reference) cJSON_AddBoolToObject(j, "pass", V.pass);
    else cJSON_AddNullToObject(j, "pass"); /* --no-reference: nothing was compared */
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
    if (nex < 0)
      cJSON_AddStringToObject(j, "executed_error", mpi && ranks > 1 ? "a device of record runs in another MPI rank (each rank counts its own devices)"
                                                                    : "the runtime lost count (out of host memory)");
    free(ex);
    cJSON_AddStringToObject(j, "backend", mpi ? "mpi" : "threads");
    if (mpi) {
      cJSON_AddNumberToObject(j, "ranks", ranks);
      cJSON_AddNumberToObject(j, "threads_per_rank", ndev / (ranks > 0 ? ranks : 1));
    }
    cJSON_AddBoolToObject(j, "reference", reference);
    cJSON *c = cJSON_AddObjectToObject(j, "simulated");
    cJSON_AddStringToObject(c, "target", mesh->target->name);
    cJSON_AddNumberToObject(c, "compute_s", clock_compute);
    cJSON_AddNumberToObject(c, "comm_s", clock_comm);
    if (simulated) {
      cJSON_AddNumberToObject(c, "sim_compute_s", sim.compute_s);
      cJSON_AddNumberToObject(c, "sim_comm_s", sim.comm_s);
      cJSON_AddNumberToObject(c, "sim_step_time_s", sim.step_s);
    }
    if (o->save) cJSON_AddBoolToObject(j, "saved", saved);
    report_json(j);
  } else {
    char b[32], where[96];
    if (mpi) snprintf(where, sizeof where, "%d device%s in %d MPI rank%s", ndev, ndev == 1 ? "" : "s", ranks, ranks == 1 ? "" : "s");
    else snprintf(where, sizeof where, "%d device thread%s", ndev, ndev == 1 ? "" : "s");
    if (reference) {
      printf("%s: %s on %s (mesh %s) vs one device\n", V.pass ? "PASS" : "FAIL", o->input, where, mesh->name);
      rt_verdict_print(&V, stdout);
      if (followed)
        printf("  routing        %lld of %lld top-k decisions (tokens x routing calls)%s differed by rounding alone (near-equal "
               "logits); the sharded run followed the one-device run's there\n", (long long)followed, (long long)routed,
               mpi && ranks > 1 ? " on rank 0's devices" : "");
    } else {
      printf("RAN: %s on %s (mesh %s); not compared (--no-reference)\n", o->input, where, mesh->name);
    }
    for (int s = 0; m->step && s < steps; s++)
      if (reference) printf("  loss step %-4d %.6g (one device: %.6g)\n", s + 1, loss_shd[s], loss_ref[s]);
      else printf("  loss step %-4d %.6g\n", s + 1, loss_shd[s]);
    if (reference)
      printf("  step time      %.3f ms sharded, %.3f ms on one device%s\n", step_s * 1e3, ref_s * 1e3,
             steps > 1 ? arena_printf(arena, " (mean of %d steps)", steps) : "");
    else
      printf("  step time      %.3f ms sharded%s\n", step_s * 1e3, steps > 1 ? arena_printf(arena, " (mean of %d steps)", steps) : "");
    printf("  compile time   %.1f ms (lowering, optimisation and code generation at tier %d, JIT)\n", compile_s * 1e3, tier);
    printf("  peak memory    %s per device\n", fmt_bytes(b, sizeof b, (double)peak));
    printf("  simulated      on %s: the ops each device ran take %s of compute and %s of collectives", mesh->target->name,
           report_seconds(arena, clock_compute), report_seconds(arena, clock_comm));
    if (simulated)
      printf(" (shardc sim: %s and %s; a step of %s with overlap)", report_seconds(arena, sim.compute_s),
             report_seconds(arena, sim.comm_s), report_seconds(arena, sim.step_s));
    printf("\n");
  }
  if (root) rc = V.pass ? EXIT_OK : EXIT_PROGRAM_ERROR;
  fflush(stdout); /* the verdict is out before a save that may fail */
  if (o->save && !json_save && !run_mpi_agree(save_all(o, m, shd, loss_shd, steps))) rc = EXIT_PROGRAM_ERROR;
  if (!saved) rc = EXIT_PROGRAM_ERROR;
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
  return run_mpi_rank_end(rc); /* under mpirun: rank 0's status for every rank, MPI ended */
}

/* ---- build: an object from the module, a description of the slots, linked with the runtime ----
 *
 * Nothing the user typed reaches a shell or the generated source unescaped: the C compiler is
 * started with an argument vector (outfile_spawn_wait: no shell), every string written into the
 * generated C goes through c_string, and the intermediate files live in a private directory made
 * by mkdtemp in $TMPDIR (default /tmp), removed on every exit path and by SIGINT, SIGTERM and SIGHUP
 * (outfile.h), so `-o keep` never touches keep.o. The executable is linked there too, then written
 * to -o as every output is (outfile_open: beside it, then renamed). */

/* s as a C string literal: quotes, backslashes, '?' (trigraphs: gcc's -std=c11 has them) and every
 * byte outside printable ASCII escaped (three-digit octal, so a following digit cannot join). */
static void c_string(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\' || *p == '?') fprintf(f, "\\%c", *p);
    else if (*p >= 0x20 && *p < 0x7f) fputc(*p, f);
    else fprintf(f, "\\%03o", *p);
  }
  fputc('"', f);
}

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

/* The C file holding the program's RtProgram and main(). */
static void write_main_c(FILE *f, const Options *o, const IrModule *m, const Mesh *mesh, const RunGen *gin, const RunGen *gpar,
                         const RtCmpDesc *cmp, const SimReport *sim, const Value **pval) {
  const IrFunc *mf = m->main;
  fprintf(f, "/* generated by shardc build: the slots of a lowered program (shardrt.h, RtProgram); its source is\n"
             "   program.name below */\n");
  bool mpi = o->backend && strcmp(o->backend, "mpi") == 0; /* main: rt_mpi_main (shardrt_mpi.h), for mpirun */
  fprintf(f, "#include <stddef.h>\n#include \"%s\"\n#include \"verdict.h\"\nint shard_reference(RtDevice *, void *);\nint shard_device(RtDevice *, void *);\n",
          mpi ? "shardrt_mpi.h" : "shardrt.h");
  Arena arena; /* the slots' descriptions (the device program's RtPlace, devprog_place) */
  arena_init(&arena);
  int nslots = mf->ninputs + m->nparams + mf->noutputs;
  const char **init = ARENA_ARRAY(&arena, const char *, nslots + 1);
  for (int i = 0; i < mf->ninputs; i++) slot_desc(f, &arena, i, mf->inputs[i], &mf->inputs[i]->type, m, &gin[i], init);
  for (int i = 0; i < m->nparams; i++) slot_desc(f, &arena, mf->ninputs + i, pval[i], &m->params[i].type, m, &gpar[i], init);
  for (int j = 0; j < mf->noutputs; j++)
    slot_desc(f, &arena, mf->ninputs + m->nparams + j, mf->outputs[j], &mf->outputs[j]->type, m, NULL, init);
  fprintf(f, "static const RtSlotDesc slots[] = {\n");
  for (int k = 0; k < nslots; k++) fputs(init[k], f);
  arena_free(&arena);
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
  fprintf(f, "static const RtCmpDesc cmp[] = {\n"); /* run_verdict.h: how each output is compared */
  for (int j = 0; j < mf->noutputs; j++) {
    fprintf(f, "  {.name = ");
    c_string(f, cmp[j].name);
    fprintf(f, ", .kind = %d, .dtype = %d, .noise = %.17g, .before = %d, .m = %d, .v = %d, .group = %d, .floor = %.17g},\n",
            cmp[j].kind, cmp[j].dtype, cmp[j].noise, cmp[j].before, cmp[j].m, cmp[j].v, cmp[j].group, cmp[j].floor);
  }
  fprintf(f, "};\n");
  fprintf(f, "static const RtProgram program = {.name = ");
  c_string(f, o->input);
  fprintf(f, ", .mesh = ");
  c_string(f, mesh->name);
  fprintf(f, ", .naxes = %d, .axis_size = {", mesh->naxes);
  for (int a = 0; a < mesh->naxes; a++) fprintf(f, "%d, ", mesh->axes[a].size);
  fprintf(f, "}, .axis_name = {");
  for (int a = 0; a < mesh->naxes; a++) {
    c_string(f, mesh->axes[a].name);
    fprintf(f, ", ");
  }
  fprintf(f, "}, .reference = shard_reference, .device = shard_device, .nin = %d, .nparams = %d, .nout = %d, .slots = slots,\n"
             "  .step = %d, .nt = %d, .ncarry = %d, .carry = carry, .cmp = cmp, .lr = %.17g, .seed = %lluull,\n  .target = ",
          mf->ninputs, m->nparams, mf->noutputs, si != NULL, si ? si->in_t : -1, ncarry, si ? si->step->lr : 0.0,
          (unsigned long long)o->seed);
  c_string(f, mesh->target->name);
  fprintf(f, ", .sim_compute_s = %.17g, .sim_comm_s = %.17g, .sim_step_s = %.17g,\n"
             "  .nexecuted = (int)(sizeof executed / sizeof executed[0]), .executed = executed};\n",
          sim ? sim->compute_s : -1, sim ? sim->comm_s : -1, sim ? sim->step_s : -1);
  fprintf(f, "int main(int argc, char **argv) { return %s(argc, argv, &program); }\n", mpi ? "rt_mpi_main" : "rt_launch_main");
}

/* The private directory of build's intermediate files and their paths. */
typedef struct BuildDir {
  char dir[4096], obj[4200], csrc[4200], exe[4200];
} BuildDir;

static bool build_dir_make(BuildDir *b, char *err, size_t n) {
  const char *tmp = getenv("TMPDIR");
  if (!tmp || !*tmp) tmp = "/tmp";
  int len = snprintf(b->dir, sizeof b->dir, "%s/shardc-build.XXXXXX", tmp);
  if (len < 0 || (size_t)len >= sizeof b->dir) {
    snprintf(err, n, "$TMPDIR is too long");
    return false;
  }
  if (!mkdtemp(b->dir)) {
    snprintf(err, n, "cannot make a directory in '%s' ($TMPDIR): %s", tmp, strerror(errno));
    return false;
  }
  outfile_track(b->dir, true);
  snprintf(b->obj, sizeof b->obj, "%s/program.o", b->dir);
  snprintf(b->csrc, sizeof b->csrc, "%s/main.c", b->dir);
  snprintf(b->exe, sizeof b->exe, "%s/program", b->dir);
  outfile_track(b->obj, false);
  outfile_track(b->csrc, false);
  outfile_track(b->exe, false);
  return true;
}

static void build_dir_remove(BuildDir *b) {
  const char *files[] = {b->obj, b->csrc, b->exe};
  for (size_t i = 0; i < ARRAY_LEN(files); i++) {
    unlink(files[i]);
    outfile_untrack(files[i]);
  }
  rmdir(b->dir);
  outfile_untrack(b->dir);
}

/* A new intermediate file in the private directory (an error printed on failure). */
static FILE *build_file(const char *path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!f) {
    diag_error((SrcLoc){0}, "build: cannot write %s: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
  }
  return f;
}

/* Closes it, every write checked (an error printed). */
static bool build_file_close(FILE *f, const char *path) {
  errno = 0;
  bool ok = fflush(f) == 0 && !ferror(f);
  int e = errno ? errno : EIO;
  if (fclose(f) != 0 && ok) ok = false, e = errno;
  if (!ok) diag_error((SrcLoc){0}, "build: cannot write %s: %s", path, strerror(e));
  return ok;
}

/* The linked executable at from, copied to -o (outfile_open: beside it, then renamed). */
static bool copy_out(const char *from, const char *to, char *err, size_t n) {
  FILE *in = fopen(from, "rb");
  if (!in) {
    snprintf(err, n, "cannot read the linked executable: %s", strerror(errno));
    return false;
  }
  OutFile *out = outfile_open(to, OUTFILE_EXECUTABLE, err, n);
  if (!out) {
    fclose(in);
    return false;
  }
  char buf[65536];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, got, outfile_stream(out));
  bool ok = !ferror(in);
  fclose(in);
  if (!ok) {
    snprintf(err, n, "cannot read the linked executable");
    outfile_discard(out);
    return false;
  }
  return outfile_commit(out, err, n);
}

static bool build_executable(const Options *o, Lowered *lw, const IrModule *m, const Mesh *mesh, const RunGen *gin,
                             const RunGen *gpar, const RtCmpDesc *cmp, const SimReport *sim) {
  char err[700];
  BuildDir b;
  if (!build_dir_make(&b, err, sizeof err)) {
    diag_error((SrcLoc){0}, "build: %s", err);
    return false;
  }
  FILE *f = build_file(b.obj);
  bool ok = f && lower_emit_object(lw, f, err, sizeof err);
  if (f && !ok) diag_error((SrcLoc){0}, "build: %s", err);
  if (f && !build_file_close(f, b.obj)) ok = false;
  f = ok ? build_file(b.csrc) : NULL;
  if (f) {
    const Value **pval = calloc((size_t)m->nparams + 1, sizeof *pval);
    for (const Op *op = m->main->first; pval && op; op = op->next)
      if (op->kind == OP_PARAM && op->index >= 0 && op->index < m->nparams) pval[op->index] = op->results[0];
    if (pval) write_main_c(f, o, m, mesh, gin, gpar, cmp, sim, pval);
    else diag_error((SrcLoc){0}, "build: out of memory");
    if (!build_file_close(f, b.csrc) || !pval) ok = false;
    free(pval);
  } else {
    ok = false;
  }
  if (ok) { /* no shell: each argument is one string, whatever it holds */
    char *argv[32] = {"cc", "-O1", "-std=c11", "-I", SHARDC_RUNTIME_INCLUDE, "-o", b.exe, b.csrc, b.obj};
    int n = 9;
#ifdef SHARDC_HAVE_MPI
    char mpi_libs[] = SHARDC_MPI_LINK; /* --backend mpi: the backend, then MPI's libraries, "|" between */
    if (o->backend && strcmp(o->backend, "mpi") == 0) {
      argv[n++] = SHARDC_RUNTIME_MPI_LIB;
      for (char *t = strtok(mpi_libs, "|"); t && n < 24; t = strtok(NULL, "|")) argv[n++] = t;
    }
#endif
    argv[n++] = SHARDC_RUNTIME_LIB, argv[n++] = SHARDC_OPENBLAS_LIB, argv[n++] = SHARDC_DNNL_LIB;
    if (*SHARDC_DNNL_THREADING_LIB) argv[n++] = SHARDC_DNNL_THREADING_LIB; /* oneDNN's OpenMP runtime (libgomp) */
    argv[n++] = "-lpthread", argv[n++] = "-lm";
    if (*SHARDC_RUNTIME_SANITIZE) argv[n++] = SHARDC_RUNTIME_SANITIZE;
    argv[n] = NULL;
    int status = outfile_spawn_wait(argv, err, sizeof err);
    if (status != 0) {
      if (status > 0) diag_error((SrcLoc){0}, "build: linking failed: cc exited with status %d (its messages are above)", status);
      else diag_error((SrcLoc){0}, "build: linking failed: %s", err);
      ok = false;
    }
  }
  if (ok && !copy_out(b.exe, o->output, err, sizeof err)) {
    diag_error((SrcLoc){0}, "build: %s", err);
    ok = false;
  }
  build_dir_remove(&b);
  return ok;
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
