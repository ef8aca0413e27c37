/* main.c: the shardc command line.
 *
 * `shardc COMMAND FILE [options]`: parse the options (anywhere after the program name) into an
 * Options, set up diagnostics, and run the command from the table below. Exit codes: 0 success,
 * 1 the program is wrong (diagnostics say why), 2 a usage error (one line on stderr). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver.h"
#include "report.h"
#include "shardrt.h"
#include "stepset.h"
#include "table.h"

typedef int (*CommandFn)(const Options *);

typedef struct Command {
  const char *name;
  CommandFn fn; /* NULL: not implemented yet */
  const char *help;
} Command;

/* One line per subcommand, in the order `shardc --help` lists them. */
static const Command commands[] = {
  {"parse", cmd_parse, "parse only; print the syntax tree in a stable text form"},
  {"check", cmd_check, "parse, type-check, memory fit per device; exit 1 if it does not fit"},
  {"explain", cmd_explain, "every op with its sharding; every inserted collective with reason and cost"},
  {"sim", cmd_sim, "simulated step on the mesh's target: time, breakdown, MFU"},
  {"run", cmd_run, "lower through LLVM, run on CPU threads (one per device), compare with unsharded"},
  {"build", cmd_build, "compile to an executable (-o FILE) that runs and checks like run"},
  {"plan", cmd_plan, "search meshes, layouts and step keys: the fastest steps that fit, ranked, with reasons"},
  {"report", cmd_report, "one self-contained HTML page (-o FILE): memory, timeline, phases, collectives"},
  {"import", cmd_import, "a Hugging Face config.json as a .shard program on the stdlib's models (-o FILE)"},
};

static void print_help(FILE *f) {
  fprintf(f, "usage: shardc COMMAND FILE [options]\n"
             "       shardc import config.json [-o FILE]\n"
             "       shardc --help | --version\n\ncommands:\n");
  for (size_t i = 0; i < ARRAY_LEN(commands); i++)
    fprintf(f, "  %-8s %s%s\n", commands[i].name, commands[i].help, commands[i].fn ? "" : " (not implemented yet)");
  fprintf(f,
          "\noptions:\n"
          "  -D dim=N               set the size of a dim (overrides its declaration; a dim\n"
          "                         given twice must have the same size both times)\n"
          "  --set KEY=VALUE        set a train step key as if written in the train block\n"
          "                         (--set remat=full --set microbatches=8; checked as written)\n"
          "  --layout NAME          use this layout (default: the first declared); check,\n"
          "                         explain and sim take several --layout and --mesh: a row each\n"
          "  --mesh NAME|'T[axes]'  use this mesh (default: the first declared), or one given\n"
          "                         inline: --mesh 'h100[data: 2, model: 2]'\n"
          "  --entry model.fn       compile this function alone, with no train step\n"
          "  --format text|json     output format of check, explain and sim (default text)\n"
          "  --emit-llvm            run: print the lowered LLVM IR (after O2) instead of running\n"
          "  --emit-ir              print shardc's tensor IR after checking (check)\n"
          "  -o FILE                output file (build, report; import, written whole or not at all)\n"
          "  --trace FILE           write a trace of the simulated step (sim)\n"
          "  --ideal                use the targets' peak figures, no efficiency factors (sim)\n"
          "  --tokens N             sim: days to train on N tokens at the simulated rate\n"
          "  --mfu R                sim: with --tokens, at this MFU (a fraction) instead\n"
          "  --shardings            check: every param's and input's sharding and where it came\n"
          "                         from; explain: every value's\n"
          "  --show NAME            explain: draw which block of NAME (a param, an input, a let)\n"
          "                         each device holds, as a grid over the mesh axes\n"
          "  --steps N              run: train steps to run and compare (default 1); a forward\n"
          "                         runs N times on the same inputs (its time is their mean)\n"
          "  --seed N               run: the seed inputs and params are made from (default 0)\n"
          "  --timeout S            run: a collective's longest wait in seconds (default 60)\n"
          "  --hbm BYTES            run: cap each device's memory at BYTES\n"
          "  --allow-nonfinite      run: a NaN or an infinity is no FAIL where both runs hold\n"
          "                         it at the same place (by default any is a FAIL)\n"
          "  --backend threads|mpi  run, build: one thread per device (default), or MPI ranks:\n"
          "                         run starts mpirun itself (-np = the mesh's devices) unless\n"
          "                         it already runs under it; build makes a program for mpirun\n"
          "  --threads-per-rank T   mpi: T device threads in each of devices / T ranks\n"
          "  --hostfile FILE        run --backend mpi: the hosts mpirun starts ranks on\n"
          "  --no-reference         run: do not run the one-device program (nor compare)\n"
          "  --no-cache             run: compile without the on-disk cache of compiled objects\n"
          "                         ($SHARDC_CACHE_DIR, else ~/.cache/shardc)\n"
          "  --load DIR, --save DIR run: inputs and params from DIR/NAME.npy; results to DIR\n"
          "  --devices N            plan: devices to plan for (default: the program's first mesh's)\n"
          "  --target NAME          plan: the target to plan for (default: the first mesh's)\n"
          "  --top K                plan: candidates to print (default 5)\n"
          "  --diag-format text|machine\n"
          "                         diagnostics as text with source lines (default), or one\n"
          "                         line each: error|file|line|col|message\n"
          "  --help, --version\n"
          "\nexit status: 0 success, 1 the program is wrong or does not fit, 2 usage error\n"
          "environment: SHARDC_STDLIB overrides where `import \"x\"` looks for stdlib files;\n"
          "SHARDC_MPIRUN, SHARDC_MPIRUN_ARGS: the mpirun `run --backend mpi` starts, and more\n"
          "arguments for it\n");
}

static bool json_requested; /* --format json anywhere on the command line: usage errors are JSON too */

static int usage_error(const char *fmt, const char *arg) {
  char msg[512];
  snprintf(msg, sizeof msg, fmt, arg);
  fprintf(stderr, "shardc: %s (see 'shardc --help')\n", msg);
  if (json_requested) {
    cJSON *o = cJSON_CreateObject(), *errs = cJSON_AddArrayToObject(o, "errors"), *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddItemToArray(errs, e);
    report_json(o);
  }
  return EXIT_USAGE;
}

/* -D NAME=N: NAME an identifier, N a positive integer (digits, '_' between digits allowed). */
static bool parse_dim_override(const char *s, DimOption *d) {
  const char *eq = strchr(s, '=');
  if (!eq || eq == s) return false;
  for (const char *p = s; p < eq; p++) {
    bool alpha = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_';
    if (!alpha && !(p > s && *p >= '0' && *p <= '9')) return false;
  }
  const char *p = eq + 1;
  if (!*p) return false;
  int64_t v = 0;
  for (; *p; p++) {
    if (*p == '_' && p > eq + 1 && p[1] >= '0' && p[1] <= '9') continue;
    if (*p < '0' || *p > '9') return false;
    if (v > (INT64_MAX - (*p - '0')) / 10) return false;
    v = v * 10 + (*p - '0');
  }
  if (v <= 0) return false;
  d->name = strndup(s, (size_t)(eq - s));
  d->value = v;
  return d->name != NULL;
}

/* Options that take a value accept `--opt VALUE` and `--opt=VALUE` (`-DNAME=N`, `-oFILE` too). */
static const char *option_value(int argc, char **argv, int *i, const char *opt) {
  const char *a = argv[*i];
  size_t n = strlen(opt);
  if (strncmp(a, opt, n) != 0) return NULL;
  if (a[n] == '=' && opt[1] == '-') return a + n + 1;
  if (a[n] != '\0' && opt[1] != '-') return a + n; /* -DNAME=N, -oFILE */
  if (a[n] != '\0') return NULL;
  if (*i + 1 >= argc) return "";
  return argv[++*i];
}

/* Returns -1 when the options are good, else the exit code (help, version or a usage error). */
static int parse_args(int argc, char **argv, Options *o) {
  static const char *const valued[] = {"-D", "--set", "--layout", "--mesh", "--entry", "--format",
                                       "-o", "--trace", "--diag-format", "--tokens", "--mfu", "--show",
                                       "--steps", "--seed", "--timeout", "--hbm", "--load", "--save", "--backend",
                                       "--threads-per-rank", "--hostfile", "--devices", "--target", "--top"};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      print_help(stdout);
      return EXIT_OK;
    }
    if (strcmp(a, "--version") == 0) {
      printf("shardc %s\nLLVM %s\n", SHARDC_VERSION, lower_llvm_version());
      return EXIT_OK;
    }
    if (a[0] != '-' || a[1] == '\0') { /* a positional ("-" alone would be a file name) */
      if (!o->command) o->command = a;
      else if (!o->input) o->input = a;
      else return usage_error("unexpected argument '%s'", a);
      continue;
    }
    if (strcmp(a, "--emit-llvm") == 0) { o->emit_llvm = true; continue; }
    if (strcmp(a, "--emit-ir") == 0) { o->emit_ir = true; continue; }
    if (strcmp(a, "--ideal") == 0) { o->ideal = true; continue; }
    if (strcmp(a, "--shardings") == 0) { o->shardings = true; continue; }
    if (strcmp(a, "--allow-nonfinite") == 0) { o->allow_nonfinite = true; continue; }
    if (strcmp(a, "--no-reference") == 0) { o->no_reference = true; continue; }
    if (strcmp(a, "--no-cache") == 0) { o->no_cache = true; continue; }

    const char *opt = NULL, *v = NULL;
    for (size_t k = 0; k < ARRAY_LEN(valued) && !v; k++) {
      int j = i;
      v = option_value(argc, argv, &j, valued[k]);
      if (v) opt = valued[k], i = j;
    }
    if (!v) return usage_error("unknown option '%s'", a);
    if (!*v) return usage_error("option '%s' needs a value", opt);

    if (strcmp(opt, "-D") == 0) {
      DimOption d;
      if (!parse_dim_override(v, &d)) return usage_error("bad -D '%s': expected NAME=N with N a positive integer", v);
      for (int k = 0; k < o->ndims; k++) /* the same size again is harmless; another one is a mistake */
        if (strcmp(o->dims[k].name, d.name) == 0 && o->dims[k].value != d.value) {
          char msg[200];
          snprintf(msg, sizeof msg, "-D %.64s given twice with different sizes (%lld and %lld)", d.name,
                   (long long)o->dims[k].value, (long long)d.value);
          free((char *)d.name);
          return usage_error("%s", msg);
        }
      DimOption *nd = realloc(o->dims, sizeof(DimOption) * (size_t)(o->ndims + 1));
      if (!nd) abort();
      o->dims = nd;
      o->dims[o->ndims++] = d;
    } else if (strcmp(opt, "--set") == 0) {
      char msg[400];
      size_t kl;
      if (!stepset_valid(v, &kl, msg, sizeof msg)) return usage_error("%s", msg);
      for (int k = 0; k < o->nsets; k++) { /* the same again is harmless; another value is a mistake */
        size_t ol;
        stepset_valid(o->sets[k], &ol, msg, sizeof msg);
        size_t a = strspn(v, " \t"), b = strspn(o->sets[k], " \t");
        if (kl - a == ol - b && strncmp(v + a, o->sets[k] + b, kl - a) == 0 && strcmp(v, o->sets[k]) != 0) {
          snprintf(msg, sizeof msg, "--set %.*s given twice with different values ('%.100s' and '%.100s')",
                   (int)(kl - a), v + a, o->sets[k], v);
          return usage_error("%s", msg);
        }
      }
      const char **ns = realloc(o->sets, sizeof(char *) * (size_t)(o->nsets + 1));
      if (!ns) abort();
      o->sets = ns;
      o->sets[o->nsets++] = v;
    } else if (strcmp(opt, "--layout") == 0 || strcmp(opt, "--mesh") == 0) {
      bool lay = opt[2] == 'l';
      const char ***list = lay ? &o->layouts : &o->meshes;
      int *n = lay ? &o->nlayouts : &o->nmeshes;
      const char **nl = realloc(*list, sizeof(char *) * (size_t)(*n + 1));
      if (!nl) abort();
      *list = nl;
      nl[(*n)++] = v;
      if (lay && !o->layout) o->layout = v;
      if (!lay && !o->mesh) o->mesh = v;
    }
    else if (strcmp(opt, "--entry") == 0) o->entry = v;
    else if (strcmp(opt, "-o") == 0) o->output = v;
    else if (strcmp(opt, "--trace") == 0) o->trace = v;
    else if (strcmp(opt, "--show") == 0) o->show = v;
    else if (strcmp(opt, "--load") == 0) o->load = v;
    else if (strcmp(opt, "--save") == 0) o->save = v;
    else if (strcmp(opt, "--hostfile") == 0) o->hostfile = v;
    else if (strcmp(opt, "--target") == 0) o->target = v;
    else if (strcmp(opt, "--devices") == 0 || strcmp(opt, "--top") == 0) {
      uint64_t x;
      bool dev = opt[2] == 'd';
      if (!rt_arg_uint(v, 1, dev ? (1u << 20) : 1000, &x))
        return usage_error(dev ? "bad --devices '%s': expected an integer from 1 to 1048576" : "bad --top '%s': expected an integer from 1 to 1000", v);
      if (dev) o->devices = (int64_t)x;
      else o->top = (int)x;
    }
    else if (strcmp(opt, "--backend") == 0) {
      if (strcmp(v, "threads") != 0 && strcmp(v, "mpi") != 0) return usage_error("bad --backend '%s': expected threads or mpi", v);
#ifndef SHARDC_HAVE_MPI
      if (strcmp(v, "mpi") == 0)
        return usage_error("--backend %s: this shardc was built without MPI (install libopenmpi-dev and openmpi-bin, then rebuild)", v);
#endif
      o->backend = v;
    } else if (strcmp(opt, "--threads-per-rank") == 0) { /* as a built executable parses it (launch.c) */
      uint64_t x;
      if (!rt_arg_uint(v, 1, RT_DEFAULT_MAX_DEVICES, &x)) return usage_error("bad --threads-per-rank '%s': expected an integer from 1 to 64", v);
      o->threads_per_rank = (int)x;
    } else if (strcmp(opt, "--steps") == 0 || strcmp(opt, "--seed") == 0 || strcmp(opt, "--hbm") == 0) {
      /* parsed as a built executable parses them (runtime/args.c) */
      uint64_t x;
      if (strcmp(opt, "--steps") == 0) {
        if (!rt_arg_uint(v, 1, RT_MAX_STEPS, &x)) return usage_error("bad --steps '%s': expected an integer from 1 to 1000000", v);
        o->steps = (int)x;
      } else if (strcmp(opt, "--seed") == 0) {
        if (!rt_arg_uint(v, 0, UINT64_MAX, &x)) return usage_error("bad --seed '%s': expected a non-negative integer", v);
        o->seed = x;
      } else {
        if (!rt_arg_uint(v, 1, INT64_MAX, &x)) return usage_error("bad --hbm '%s': expected a positive number of bytes", v);
        o->hbm = (int64_t)x;
      }
    } else if (strcmp(opt, "--timeout") == 0) {
      double x;
      if (!rt_arg_seconds(v, &x)) return usage_error("bad --timeout '%s': expected seconds > 0 (at most 1e6)", v);
      o->timeout = x;
    }
    else if (strcmp(opt, "--tokens") == 0 || strcmp(opt, "--mfu") == 0) {
      char *end;
      double x = strtod(v, &end);
      bool mfu = opt[2] == 'm';
      if (*end || !(x > 0) || x > 1e30 || (mfu && x > 1))
        return usage_error(mfu ? "bad --mfu '%s': expected a fraction in (0, 1]" : "bad --tokens '%s': expected a positive number", v);
      if (mfu) o->mfu = x;
      else o->tokens = x;
    }
    else if (strcmp(opt, "--format") == 0) {
      if (strcmp(v, "text") == 0) o->format = FORMAT_TEXT;
      else if (strcmp(v, "json") == 0) o->format = FORMAT_JSON;
      else return usage_error("bad --format '%s': expected text or json", v);
    } else if (strcmp(opt, "--diag-format") == 0) {
      if (strcmp(v, "text") == 0) o->diag_format = DIAG_TEXT;
      else if (strcmp(v, "machine") == 0) o->diag_format = DIAG_MACHINE;
      else return usage_error("bad --diag-format '%s': expected text or machine", v);
    }
  }
  return -1;
}

/* The command the options name, after the checks no command makes itself. The exit code. */
static int run_command(Options *o) {
  if (!o->command) return usage_error("%s", "usage: shardc COMMAND FILE [options]");
  const Command *cmd = NULL;
  for (size_t i = 0; i < ARRAY_LEN(commands); i++)
    if (strcmp(commands[i].name, o->command) == 0) cmd = &commands[i];
  if (!cmd) return usage_error("unknown command '%s'", o->command);
  if (!cmd->fn) return usage_error("'%s' is not implemented yet", cmd->name);
  if (!o->input) return usage_error("missing input file for '%s'", cmd->name);
  if ((o->threads_per_rank || o->hostfile) && !(o->backend && strcmp(o->backend, "mpi") == 0))
    return usage_error("%s is an option of --backend mpi", o->threads_per_rank ? "--threads-per-rank" : "--hostfile");

  bool table = o->nlayouts > 1 || o->nmeshes > 1;
  if (table) {
    bool takes = strcmp(cmd->name, "check") == 0 || strcmp(cmd->name, "explain") == 0 || strcmp(cmd->name, "sim") == 0;
    if (!takes) return usage_error("only check, explain and sim take several --layout or --mesh ('%s' takes one)", cmd->name);
    const char *one = o->trace ? "--trace" : o->show ? "--show" : o->emit_ir ? "--emit-ir" : o->shardings ? "--shardings"
                      : o->tokens ? "--tokens" : NULL;
    if (one) return usage_error("%s describes one layout on one mesh: give one --layout and one --mesh with it", one);
  }
  bool color = o->diag_format == DIAG_TEXT && isatty(STDERR_FILENO) && !getenv("NO_COLOR");
  diag_configure(stderr, o->diag_format, color);
  report_begin(o);
  int rc = report_end(o, table ? table_run(o, cmd->fn) : cmd->fn(o));
  diag_finish();
  if (fflush(stdout) != 0) {
    fprintf(stderr, "shardc: cannot write output: %s\n", strerror(errno));
    if (rc == EXIT_OK) rc = EXIT_PROGRAM_ERROR;
  }
  return rc;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    json_requested |= strcmp(argv[i], "--format=json") == 0 ||
                      (strcmp(argv[i], "--format") == 0 && i + 1 < argc && strcmp(argv[i + 1], "json") == 0);
  Options o = {0};
  o.argv0 = argv[0];
  o.argc = argc, o.argv = argv;
  int rc = parse_args(argc, argv, &o);
  if (rc < 0) rc = run_command(&o);
  for (int i = 0; i < o.ndims; i++) free((char *)o.dims[i].name);
  free(o.dims);
  free(o.sets), free(o.layouts), free(o.meshes);
  return rc;
}
