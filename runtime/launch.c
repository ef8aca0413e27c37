/* launch.c: rt_launch_main, the host side of a `shardc build` executable. It does what `shardc run`
 * does (compiler/driver/run_host.c, cmd_run.c) from the RtProgram description alone: each device's
 * blocks of the inputs and params generated per global index (the block placement, place.c, by the
 * RtPlace the compiler made from its device program), the per-device
 * program run on one thread per device and the one-device program on one, a train step's state
 * carried from step to step (lockstep: the sharded run restarts each step from the one-device
 * run's state), the outputs reassembled from the blocks and compared by verdict.h's rules (the
 * same code as `shardc run`'s), and the same report, text or JSON.
 *
 * Its options are parsed as shardc parses them (args.c: the whole value, in range, or exit 2), and
 * every host allocation is checked: a failure is an error naming what was being allocated (exit 1),
 * never a crash. SHARDC_FAIL_HOST_ALLOC=N (tests) makes the Nth host allocation fail.
 *
 * Under MPI (an executable built with --backend mpi, main rt_mpi_main: shardrt_mpi.h) every rank
 * runs this with its own devices: it places their blocks only, rank 0 alone runs the one-device
 * program, gets the outputs' blocks from the others (rt_fetch_to_root), compares and prints, and
 * the ranks agree after each step that can fail on one of them (rt_processes_agree). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shardrt.h"
#include "verdict.h"

/* ---- host allocations ---- */

static long host_allocs, host_fail_at = -1; /* SHARDC_FAIL_HOST_ALLOC: the Nth fails (tests) */

/* calloc(n, size), or an error naming `what` and NULL. */
static void *host_calloc(size_t n, size_t size, const char *what) {
  host_allocs++;
  void *p = host_allocs == host_fail_at ? NULL : calloc(n ? n : 1, size);
  if (!p) fprintf(stderr, "error: out of host memory for %s (%zu x %zu bytes)\n", what, n, size);
  return p;
}

typedef struct Side {
  const RtProgram *p;
  bool sharded;
  Runtime *rt;
  int ndev;
  void ***slots;
  double seconds;
} Side;

/* A slot's placement on this side: its blocks in the per-device program, or the whole tensor. */
static const RtPlace *placement(const Side *s, int slot) {
  const RtSlotDesc *sd = &s->p->slots[slot];
  return s->sharded ? &sd->sharded : &sd->whole;
}

static int side_open(Side *s, const RtProgram *p, bool sharded, const RtConfig *base) {
  RtConfig c = *base;
  s->p = p, s->sharded = sharded;
  c.naxes = sharded ? p->naxes : 0;
  for (int a = 0; a < c.naxes; a++) c.axis_size[a] = p->axis_size[a], c.axis_name[a] = p->axis_name[a];
  int rc = rt_open(&c, &s->rt);
  if (rc != RT_OK) {
    if (rt_process_rank(s->rt) == 0) fprintf(stderr, "error: %s\n", s->rt ? rt_errmsg(s->rt) : "out of memory");
    return rc;
  }
  s->ndev = rt_device_count(s->rt);
  int nslots = p->nin + p->nparams + p->nout;
  if (!(s->slots = host_calloc((size_t)s->ndev, sizeof *s->slots, "the devices' slot tables"))) return RT_E_NOMEM;
  for (int d = 0; d < s->ndev; d++)
    if (!(s->slots[d] = host_calloc((size_t)nslots + 1, sizeof(void *), "a device's slot table"))) return RT_E_NOMEM;
  /* inputs and params, generated per global index (the runtime's block placement), each process its
   * own devices' (under MPI) */
  bool placed = true;
  char msg[1024] = ""; /* every process placed its blocks, or all stop with the first one's message */
  for (int d = 0; d < s->ndev && placed; d++)
    for (int i = 0; i < p->nin + p->nparams && placed; i++) {
      const RtSlotDesc *sd = &p->slots[i];
      const RtPlace *pl = placement(s, i);
      if (!rt_place_holds(pl, d) || !rt_device_local(s->rt, d)) continue;
      int64_t n = rt_place_elements(pl);
      void *buf;
      if (rt_alloc(rt_device(s->rt, d), (size_t)(n > 0 ? n : 1) * rt_dtype_size((RtDtype)pl->dtype), "input", &buf) != RT_OK) {
        placed = false;
        snprintf(msg, sizeof msg, "%s", rt_errmsg(s->rt));
        break;
      }
      s->slots[d][i] = buf;
      int frc = rt_place_fill(pl, d, buf, NULL, p->seed, sd->key, sd->lo, sd->hi);
      if (frc != RT_OK) {
        placed = false;
        snprintf(msg, sizeof msg, "making input slot %d: %s", i, rt_status_name(frc));
      }
    }
  if (!rt_processes_agree(s->rt, placed, msg, sizeof msg)) {
    if (rt_process_rank(s->rt) == 0) fprintf(stderr, "error: %s\n", msg);
    return RT_E_NOMEM;
  }
  return RT_OK;
}

static void side_close(Side *s) {
  if (s->rt) rt_close(s->rt);
  for (int d = 0; s->slots && d < s->ndev; d++) free(s->slots[d]);
  free(s->slots);
}

static int side_step(Side *s) {
  const RtProgram *p = s->p;
  int base = p->nin + p->nparams;
  for (int d = 0; d < s->ndev; d++)
    for (int j = 0; j < p->nout; j++)
      if (s->slots[d][base + j]) rt_free(rt_device(s->rt, d), s->slots[d][base + j]), s->slots[d][base + j] = NULL;
  double t0 = rt_seconds();
  int rc = rt_run(s->rt, s->sharded ? p->device : p->reference, s->slots);
  s->seconds += rt_seconds() - t0;
  if (rc != RT_OK && rt_process_rank(s->rt) == 0)
    fprintf(stderr, "error: the %s program failed: %s\n", s->sharded ? "sharded" : "one-device", rt_errmsg(s->rt));
  return rc;
}

static void side_carry(Side *s) {
  const RtProgram *p = s->p;
  int base = p->nin + p->nparams;
  for (int d = 0; d < s->ndev; d++) {
    void **sl = s->slots[d];
    for (int k = 0; k < p->ncarry; k++) {
      int in = p->carry[2 * k], out = base + p->carry[2 * k + 1];
      if (sl[in] != sl[out]) rt_free(rt_device(s->rt, d), sl[in]); /* else updated in place */
      sl[in] = sl[out];
      sl[out] = NULL;
    }
    if (p->nt >= 0 && sl[p->nt]) ((float *)sl[p->nt])[0] += 1;
  }
}

/* Slot `slot` (an input, a param or an output), whole: each block once, partial sums added (the
 * runtime's block placement, read back). Under MPI on rank 0 (the others take part, and get NULL). */
static double *assemble(const Side *s, int slot) {
  const RtPlace *pl = placement(s, slot);
  int64_t n = 1;
  for (int i = 0; i < pl->rank; i++) n *= pl->global[i];
  double *g = rt_process_rank(s->rt) != 0 ? NULL /* under MPI rank 0 assembles */
              : host_calloc((size_t)(n > 0 ? n : 1), sizeof *g, s->sharded ? "a whole tensor of the sharded run" : "a whole tensor of the one-device run");
  if (!g && rt_process_count(s->rt) == 1) return NULL; /* else it still takes part in the fetches */
  size_t bytes = (size_t)rt_place_elements(pl) * rt_dtype_size((RtDtype)pl->dtype);
  for (int d = 0; d < s->ndev; d++) {
    if (!rt_place_holds(pl, d) || (pl->take && !pl->take[d])) continue; /* every process skips the same */
    /* under MPI the block comes to rank 0 (every rank makes the same calls) */
    void *scratch = g && !rt_device_local(s->rt, d) ? host_calloc(bytes, 1, "a block from another rank") : NULL;
    if (g && !rt_device_local(s->rt, d) && !scratch) free(g), g = NULL; /* rt_fetch_to_root drops what it cannot keep */
    const void *buf = rt_fetch_to_root(s->rt, d, s->slots[d][slot], bytes, scratch);
    if (buf && g) rt_place_gather(pl, d, buf, g);
    free(scratch);
  }
  if (rt_process_rank(s->rt) != 0) { /* rank 0 holds the whole value */
    free(g);
    return NULL;
  }
  return g;
}

/* Lockstep: the sharded side's carried slots (and adam's step count) replaced by the one-device
 * side's, cut into its blocks; its outputs freed (those updated in place live in a carried slot's
 * buffer and go with it). Under MPI every rank calls it, `from` open on rank 0 alone: rank 0
 * assembles each slot and hands it to the others (rt_bcast_from_root), each places its own
 * devices' blocks. */
static int side_restate(Side *s, const Side *from) {
  const RtProgram *p = s->p;
  int base = p->nin + p->nparams;
  for (int d = 0; d < s->ndev; d++)
    for (int j = 0; j < p->nout; j++) {
      void **out = &s->slots[d][base + j];
      bool alias = false;
      for (int k = 0; k < p->ncarry && *out; k++) alias |= s->slots[d][p->carry[2 * k]] == *out;
      if (p->nt >= 0 && *out) alias |= s->slots[d][p->nt] == *out;
      if (*out && !alias) rt_free(rt_device(s->rt, d), *out);
      *out = NULL;
    }
  for (int k = 0; k <= p->ncarry; k++) {
    int slot = k < p->ncarry ? p->carry[2 * k] : p->nt;
    if (slot < 0) continue;
    const RtPlace *whole = &p->slots[slot].whole;
    int64_t n = 1;
    for (int i = 0; i < whole->rank; i++) n *= whole->global[i];
    bool root = rt_process_rank(s->rt) == 0;
    double *g = root ? assemble(from, slot) : host_calloc((size_t)(n > 0 ? n : 1), sizeof *g, "the one-device run's state");
    char msg[256] = "out of host memory for the one-device run's state"; /* said by assemble or host_calloc */
    if (!rt_processes_agree(s->rt, g != NULL, msg, sizeof msg)) {
      free(g);
      return RT_E_NOMEM;
    }
    rt_bcast_from_root(s->rt, g, sizeof *g * (size_t)n);
    for (int d = 0; d < s->ndev; d++) {
      void *buf = rt_device_local(s->rt, d) ? s->slots[d][slot] : NULL;
      if (buf) rt_place_fill(placement(s, slot), d, buf, g, 0, 0, 0, 0);
    }
    free(g);
  }
  return RT_OK;
}

/* A time as shardc's reports print one: 3 significant digits in s, ms, us or ns. */
static const char *seconds_text(char *buf, size_t n, double s) {
  if (s <= 0) snprintf(buf, n, "0");
  else if (s >= 1) snprintf(buf, n, "%.3g s", s);
  else if (s >= 1e-3) snprintf(buf, n, "%.3g ms", s * 1e3);
  else if (s >= 1e-6) snprintf(buf, n, "%.3g us", s * 1e6);
  else snprintf(buf, n, "%.3g ns", s * 1e9);
  return buf;
}

/* --help: what the executable does and its options, as they behave. */
static void usage(FILE *f, const char *argv0, const RtProgram *p) {
  int ndev = 1;
  for (int a = 0; a < p->naxes; a++) ndev *= p->axis_size[a];
  bool mpi = p->backend == RT_BACKEND_MPI;
  fprintf(f,
          "usage: %s%s [--steps N] [--seed N] [--timeout S] [--hbm BYTES] [--format text|json]\n"
          "       [--no-reference] [--allow-nonfinite]%s\n"
          "Runs %s (built by shardc build) sharded on %d %s (mesh %s) and on one device,\n"
          "compares their outputs and prints PASS or FAIL, as `shardc run` does.\n\n"
          "  --steps N           %s to run and compare, 1 to %d (default 1)\n"
          "  --seed N            the seed inputs and params are made from (default %llu, the build's)\n"
          "  --timeout S         a collective's longest wait in seconds, at most 1e6 (default 60)\n"
          "  --hbm BYTES         cap each device's memory at BYTES (default: no cap)\n"
          "  --format text|json  the report's form (default text)\n"
          "  --no-reference      do not run the one-device program (nor compare)\n"
          "%s"
          "  --allow-nonfinite   a NaN or an infinity is no FAIL where both runs hold it at the same place\n"
          "  --help              this text\n"
          "Each option also takes its value as --opt=VALUE.\n"
          "exit status: 0 PASS, 1 FAIL or an error, 2 a usage error\n",
          mpi ? "mpirun -np RANKS " : "", argv0, mpi ? " [--threads-per-rank T]" : "", p->name, ndev,
          mpi ? "devices, one MPI rank each or T device threads per rank," : "device threads", p->mesh,
          p->step ? "train steps" : "runs of the function (on the same inputs)", RT_MAX_STEPS, (unsigned long long)p->seed,
          mpi ? "  --threads-per-rank T device threads in each rank: RANKS = devices / T (default 1)\n" : "");
}

typedef struct LaunchArgs {
  int steps;
  uint64_t seed;
  int json;
  bool allow_nonfinite;
  int no_reference;
  int threads_per_rank; /* mpi */
  RtConfig cfg;
} LaunchArgs;

/* A usage error: "ARGV0: bad --steps 'abc': expected an integer from 1 to 1000000", exit 2. */
static int bad_arg(const char *argv0, const char *opt, const char *v, const char *expected) {
  if (!*v) fprintf(stderr, "%s: option '%s' needs a value (see '%s --help')\n", argv0, opt, argv0);
  else fprintf(stderr, "%s: bad %s '%s': expected %s (see '%s --help')\n", argv0, opt, v, expected, argv0);
  return 2;
}

/* -1 when the options are good, else the exit status (--help: 0; a usage error: 2). */
static int parse_args(int argc, char **argv, const RtProgram *p, LaunchArgs *a) {
  const char *argv0 = argc > 0 ? argv[0] : "program";
  *a = (LaunchArgs){.steps = 1, .seed = p->seed, .threads_per_rank = 1};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout, argv0, p);
      return 0;
    }
    if (!strcmp(argv[i], "--no-reference")) {
      a->no_reference = 1;
      continue;
    }
    if (!strcmp(argv[i], "--allow-nonfinite")) {
      a->allow_nonfinite = true;
      continue;
    }
    static const char *const opts[] = {"--steps", "--seed", "--timeout", "--hbm", "--format", "--threads-per-rank"};
    const char *opt = NULL, *v = NULL;
    for (size_t k = 0; k < sizeof opts / sizeof opts[0] && !v; k++)
      if ((v = rt_arg_value(argc, argv, &i, opts[k]))) opt = opts[k];
    if (!v) {
      fprintf(stderr, "%s: unknown %s '%s' (see '%s --help')\n", argv0, argv[i][0] == '-' ? "option" : "argument", argv[i], argv0);
      return 2;
    }
    if (!*v) return bad_arg(argv0, opt, v, NULL);
    uint64_t x;
    if (!strcmp(opt, "--steps")) {
      if (!rt_arg_uint(v, 1, RT_MAX_STEPS, &x)) return bad_arg(argv0, opt, v, "an integer from 1 to 1000000");
      a->steps = (int)x;
    } else if (!strcmp(opt, "--seed")) {
      if (!rt_arg_uint(v, 0, UINT64_MAX, &x)) return bad_arg(argv0, opt, v, "a non-negative integer");
      a->seed = x;
    } else if (!strcmp(opt, "--hbm")) {
      if (!rt_arg_uint(v, 1, SIZE_MAX, &x)) return bad_arg(argv0, opt, v, "a positive number of bytes");
      a->cfg.mem_cap = (size_t)x;
    } else if (!strcmp(opt, "--timeout")) {
      if (!rt_arg_seconds(v, &a->cfg.timeout_s)) return bad_arg(argv0, opt, v, "seconds > 0 (at most 1e6)");
    } else if (!strcmp(opt, "--threads-per-rank")) {
      if (p->backend != RT_BACKEND_MPI) return bad_arg(argv0, opt, v, "nothing: an option of executables built with --backend mpi");
      if (!rt_arg_uint(v, 1, RT_DEFAULT_MAX_DEVICES, &x)) return bad_arg(argv0, opt, v, "an integer from 1 to 64");
      a->threads_per_rank = (int)x;
    } else if (!strcmp(v, "text") || !strcmp(v, "json")) {
      a->json = !strcmp(v, "json");
    } else {
      return bad_arg(argv0, opt, v, "text or json");
    }
  }
  return -1;
}

int rt_launch_main(int argc, char **argv, const RtProgram *prog) {
  LaunchArgs args;
  int rc = parse_args(argc, argv, prog, &args);
  if (rc >= 0) return rc;
  const char *fail = getenv("SHARDC_FAIL_HOST_ALLOC");
  if (fail && *fail) host_fail_at = atol(fail);
  RtProgram q = *prog; /* with the seed of the command line */
  q.seed = args.seed;
  const RtProgram *p = &q;
  int steps = args.steps, json = args.json, no_reference = args.no_reference;
  bool mpi = p->backend == RT_BACKEND_MPI;
  RtConfig cfg = args.cfg;
  Side ref = {0}, shd = {0};
  int status = 1;
  double *loss = host_calloc((size_t)steps, sizeof(double), "the sharded run's losses"),
         *loss_ref = host_calloc((size_t)steps, sizeof(double), "the one-device run's losses");
  double **got = host_calloc((size_t)p->nout + 1, sizeof *got, "the outputs' table"),
         **want = host_calloc((size_t)p->nout + 1, sizeof *want, "the outputs' table"),
         **before = host_calloc((size_t)p->nout + 1, sizeof *before, "the outputs' table");
  RtCmpData *data = host_calloc((size_t)p->nout + 1, sizeof *data, "the outputs' table");
  RtVerdict V;
  rt_verdict_init(&V, args.allow_nonfinite);
  if (getenv("SHARDC_VERDICT_TRACE")) V.trace = stderr; /* every tensor's comparison, one line each */
  V.lr = p->lr;
  /* routing: the sharded run follows the one-device run's decisions where they differ by rounding */
  RtRouteLog *routes = rt_route_log_new();
  bool root = true, has_ref = false;
  char msg[1024] = "";
  if (!loss || !loss_ref || !got || !want || !before || !data) goto done;
  if (!routes) {
    fprintf(stderr, "error: out of host memory for the routing log\n");
    goto done;
  }
  RtConfig cfg_ref = cfg, cfg_shd = cfg;
  cfg_ref.route_log = cfg_shd.route_log = routes;
  cfg_ref.route_mode = RT_ROUTE_RECORD, cfg_shd.route_mode = RT_ROUTE_FOLLOW;
  /* The sharded side first: under MPI its rt_open checks the job's size before any work. Every
   * rank runs it; rank 0 alone runs the one-device program, compares and prints. */
  if (mpi) cfg_shd.backend = RT_BACKEND_MPI, cfg_shd.threads_per_rank = args.threads_per_rank;
  if (side_open(&shd, p, true, &cfg_shd) != RT_OK) goto done;
  root = rt_process_rank(shd.rt) == 0, has_ref = root && !no_reference;
  bool ok = !has_ref || side_open(&ref, p, false, &cfg_ref) == RT_OK;
  if (!rt_processes_agree(shd.rt, ok, msg, sizeof msg)) goto done;
  /* lockstep, as `shardc run`: each step of both runs starts from the one-device run's state (under
   * MPI rank 0's, handed to every rank); a train step compares every output after every step, a
   * forward its last run's */
  for (int s = 0; s < steps; s++) {
    ok = true;
    for (int j = 0; has_ref && p->step && j < p->nout; j++)
      if (p->cmp[j].before >= 0 && !(before[j] = assemble(&ref, p->cmp[j].before))) ok = false;
    rt_route_log_clear(routes);
    ok = ok && (!has_ref || side_step(&ref) == RT_OK);
    if (!rt_processes_agree(shd.rt, ok, msg, sizeof msg)) goto done;
    if (!no_reference && !rt_route_log_share(shd.rt, routes)) goto done;
    if (side_step(&shd) != RT_OK) goto done;
    if (p->step || s == steps - 1) {
      ok = true;
      for (int j = 0; j < p->nout; j++) { /* every rank takes part; rank 0 gets the whole values */
        got[j] = assemble(&shd, p->nin + p->nparams + j);
        want[j] = has_ref ? assemble(&ref, p->nin + p->nparams + j) : NULL;
        if (root && (!got[j] || (has_ref && !want[j]))) ok = false; /* out of host memory: said by assemble */
      }
      if (!rt_processes_agree(shd.rt, ok, msg, sizeof msg)) goto done;
      const char *perturb = getenv("SHARDC_RUN_PERTURB"); /* tests, as `shardc run`: output 0's first element */
      if (root && perturb && *perturb && s == steps - 1) got[0][0] += atof(perturb);
      V.t = s + 1;
      for (int j = 0; has_ref && j < p->nout; j++) {
        const RtPlace *whole = &p->slots[p->nin + p->nparams + j].whole;
        const RtCmpDesc *c = &p->cmp[j];
        int64_t n = 1;
        for (int i = 0; i < whole->rank; i++) n *= whole->global[i];
        data[j] = (RtCmpData){.n = n, .shd = got[j], .ref = want[j], .before = before[j], .m = c->m >= 0 ? got[c->m] : NULL,
                              .v = c->v >= 0 ? got[c->v] : NULL};
      }
      if (has_ref) rt_verdict_step(&V, p->cmp, data, p->nout);
      if (root && p->step) loss[s] = got[0][0], loss_ref[s] = want[0] ? want[0][0] : NAN;
      for (int j = 0; j < p->nout; j++) {
        free(got[j]), free(want[j]), free(before[j]);
        got[j] = want[j] = before[j] = NULL;
      }
    }
    if (p->step && s < steps - 1) {
      if (no_reference) {
        side_carry(&shd);
      } else {
        if (has_ref) side_carry(&ref);
        if (side_restate(&shd, &ref) != RT_OK) goto done;
      }
    }
  }
  size_t peak = 0;
  double clock[2] = {0, 0}; /* the simulated clock, averaged over the devices */
  for (int d = 0; d < shd.ndev; d++) {
    RtStats st;
    if (rt_stats(shd.rt, d, &st) != RT_OK) continue;
    if (st.mem_peak > peak) peak = st.mem_peak;
    clock[0] += st.sim_compute_s / shd.ndev, clock[1] += st.sim_comm_s / shd.ndev;
  }
  int ranks = rt_process_count(shd.rt);
  char where[96];
  if (mpi) snprintf(where, sizeof where, "%d device%s in %d MPI rank%s", shd.ndev, shd.ndev == 1 ? "" : "s", ranks, ranks == 1 ? "" : "s");
  else snprintf(where, sizeof where, "%d device thread%s", shd.ndev, shd.ndev == 1 ? "" : "s");
  if (!root) {
    /* rank 0 reports; rt_mpi_main gives every rank its status */
  } else if (json) {
    printf("{\"devices\": %d, \"steps\": %d, \"pass\": %s, \"max_abs_err\": %.17g, \"max_rel_err\": %.17g, \"loss\": [", shd.ndev, steps,
           no_reference ? "null" : V.pass ? "true" : "false", isfinite(V.worst_abs) ? V.worst_abs : 1e308,
           isfinite(V.worst_rel) ? V.worst_rel : 1e308);
    for (int s = 0; p->step && s < steps; s++) printf("%s%.9g", s ? ", " : "", loss[s]);
    printf("], \"step_time_s\": %.9g, \"compile_s\": 0, \"peak_bytes_per_device\": %zu, \"reference_step_time_s\": %.9g",
           shd.seconds / steps, peak, ref.seconds / steps);
    /* what ran (rt_executed): averaged over the program's devices of record, as run reports it */
    static const char *const kinds[] = {"all_gather", "reduce_scatter", "all_reduce", "all_to_all", "collective_permute"};
    int nrep = p->nexecuted > 0 ? p->nexecuted : 1, printed = 0;
    RtExecuted seen[256];
    double count[256];
    int nseen = 0;
    bool known = true; /* under MPI a device of another process: its counts are not here */
    for (int r = 0; r < nrep && known; r++) {
      int d = p->nexecuted > 0 ? p->executed[r] : 0;
      RtExecuted ex[256];
      int k = rt_executed(shd.rt, d, ex, 256);
      if (k < 0) known = false;
      for (int i = 0; i < k && i < 256; i++) {
        int j = 0;
        while (j < nseen && !(seen[j].kind == ex[i].kind && seen[j].axes == ex[i].axes && seen[j].bytes_per_device == ex[i].bytes_per_device)) j++;
        if (j == nseen && nseen < 256) seen[nseen] = ex[i], count[nseen++] = 0;
        if (j < nseen) count[j] += (double)ex[i].count / nrep;
      }
    }
    printf(", \"executed\": %s", known ? "[" : "null");
    for (int i = 0; known && i < nseen; i++) {
      printf("%s{\"kind\": \"%s\", \"axes\": [", printed++ ? ", " : "", seen[i].kind >= 0 && seen[i].kind < 5 ? kinds[seen[i].kind] : "?");
      for (int a = 0, first = 1; a < p->naxes; a++)
        if (seen[i].axes >> a & 1u) printf("%s\"%s\"", first ? "" : ", ", p->axis_name[a]), first = 0;
      printf("], \"bytes_per_device\": %.17g, \"count\": %.17g}", seen[i].bytes_per_device, count[i]);
    }
    if (known) printf("]");
    printf(", \"backend\": \"%s\"", mpi ? "mpi" : "threads");
    if (mpi) printf(", \"ranks\": %d, \"threads_per_rank\": %d", ranks, args.threads_per_rank);
    printf(", \"reference\": %s", no_reference ? "false" : "true");
    printf(", \"simulated\": {\"target\": \"%s\", \"compute_s\": %.17g, \"comm_s\": %.17g", p->target, clock[0], clock[1]);
    if (p->sim_step_s >= 0)
      printf(", \"sim_compute_s\": %.17g, \"sim_comm_s\": %.17g, \"sim_step_time_s\": %.17g", p->sim_compute_s,
             p->sim_comm_s, p->sim_step_s);
    printf("}}\n");
  } else {
    if (no_reference) {
      printf("RAN: %s on %s (mesh %s); not compared (--no-reference)\n", p->name, where, p->mesh);
    } else {
      printf("%s: %s on %s (mesh %s) vs one device\n", V.pass ? "PASS" : "FAIL", p->name, where, p->mesh);
      rt_verdict_print(&V, stdout);
      int64_t routed, followed;
      rt_route_log_counts(routes, &routed, &followed);
      if (followed)
        printf("  routing        %lld of %lld top-k decisions (tokens x routing calls)%s differed by rounding alone (near-equal "
               "logits); the sharded run followed the one-device run's there\n", (long long)followed, (long long)routed,
               mpi && ranks > 1 ? " on rank 0's devices" : "");
    }
    for (int s = 0; p->step && s < steps; s++)
      if (no_reference) printf("  loss step %-4d %.6g\n", s + 1, loss[s]);
      else printf("  loss step %-4d %.6g (one device: %.6g)\n", s + 1, loss[s], loss_ref[s]);
    if (no_reference)
      printf("  step time      %.3f ms sharded%s\n", shd.seconds / steps * 1e3, steps > 1 ? " (mean of the steps)" : "");
    else
      printf("  step time      %.3f ms sharded, %.3f ms on one device%s\n", shd.seconds / steps * 1e3, ref.seconds / steps * 1e3,
             steps > 1 ? " (mean of the steps)" : "");
    printf("  compile time   0 ms (built ahead of time)\n");
    printf("  peak memory    %zu bytes per device\n", peak);
    char a[32], b[32];
    printf("  simulated      on %s: the ops each device ran take %s of compute and %s of collectives", p->target,
           seconds_text(a, sizeof a, clock[0]), seconds_text(b, sizeof b, clock[1]));
    if (p->sim_step_s >= 0) {
      char c[32], d[32], e[32];
      printf(" (shardc sim: %s and %s; a step of %s with overlap)", seconds_text(c, sizeof c, p->sim_compute_s),
             seconds_text(d, sizeof d, p->sim_comm_s), seconds_text(e, sizeof e, p->sim_step_s));
    }
    printf("\n");
  }
  status = root && !V.pass ? 1 : 0; /* under MPI rank 0's verdict is everyone's (rt_mpi_main) */
done:
  for (int j = 0; got && want && before && j < p->nout; j++) free(got[j]), free(want[j]), free(before[j]);
  free(got), free(want), free(before), free(data);
  side_close(&ref);
  side_close(&shd);
  rt_route_log_free(routes);
  free(loss), free(loss_ref);
  return status;
}
