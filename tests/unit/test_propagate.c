/* test_propagate.c: the propagation search's incremental figures against a full recomputation.
 *
 * The search (compiler/shard/propagate.c) runs where explain and sim weigh the plan the layout
 * forbids (IrModule.weigh: the plan propagation finds without the layout's binding, never taken),
 * so every configuration here asks for it. It derives again only what a trial pin changes and keeps
 * the collectives' cost in a ledger updated op by op (partition.c's PartLedger). With the audit
 * hook on (propagate_audit), after every trial, accepted and again once undone, it compares the
 * ledger's cost, count and errors and its layout term with a from-scratch partition_cost and
 * count, and every free value's sharding with a full derivation. This runs it over every .shard
 * file named (directories searched), under every mesh and layout the file declares (a train step
 * whole, as test_partition does), and over generated programs of unrolled matmul layers (forward
 * and train step, under tensor parallelism, FSDP with it, and data parallelism), and fails any
 * configuration where a trial's figures differ, or where no trial was checked at all (the
 * generated programs must exercise the search). A trial the search stops early as unable to win
 * (propagate.c's cannot_win), or skips as known to lose (known_to_lose), is derived to the end
 * under the audit all the same, checked as every trial is, and must lose; the generated FSDP train
 * step must have both. The ledger's bound (partition_ledger_bound_before) is checked against a
 * sum unit by unit after every trial. Prints PASS/FAIL/SKIP per configuration and
 * "N passed, N failed". */
#define _GNU_SOURCE /* mkstemps */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "diag.h"
#include "ir.h"
#include "propagate.h"
#include "step.h"
#include "unit_pipeline.h"
#include "unit_test.h"

static int npass, nfail, nskip;
static long total_checked;
static double worst_rel;

/* One configuration: 1 pass, 0 fail, -1 skip (does not compile). need_trials: fail when the
 * search checked no trial; need_cuts: when it stopped no trial early as unable to win, or knew none
 * to lose from such a trial of an earlier round (each such trial is derived to the end all the
 * same under the audit, and must lose, its time at least the bound it was stopped or skipped on). */
static int run_config(const char *path, const char *mesh, const char *layout, const char *entry, bool need_trials,
                      bool need_cuts) {
  Arena a;
  arena_init(&a);
  diag_reset();
  ParsedProgram *pp = parse_program(&a, path, unit_stdlib_dir());
  int res = -1;
  PropagateAudit au = {0};
  if (pp && pp->nfiles > 0 && diag_error_count() == 0) {
    SemaOptions so = {.mesh = mesh, .layout = layout, .entry = entry};
    Program *p = sema_program(&a, pp, &so);
    if (!p->usage_error && diag_error_count() == 0 && p->entry && p->mesh) {
      IrModule *m = step_build(&a, p); /* a train step whole; else the entry alone */
      if (m && diag_error_count() == 0) {
        m->weigh.want = true; /* the search runs only to weigh the plan the layout forbids */
        propagate_audit(&au);
        propagate_module(m, p);
        propagate_audit(NULL);
        res = au.mismatches == 0 && (!need_trials || au.checked > 0) && (!need_cuts || (au.cut > 0 && au.skipped > 0))
                  ? 1
                  : 0;
      }
    }
  }
  arena_free(&a);
  const char *verdict = res < 0 ? "SKIP" : res ? "PASS" : "FAIL";
  printf("%s %s mesh=%s layout=%s%s%s: %ld trials checked (%ld units derived again, %ld re-costed, %ld stopped "
         "early as unable to win, %ld known to lose), %ld differ, largest relative time difference %.1e\n",
         verdict, path, mesh ? mesh : "-", layout ? layout : "-", entry ? " entry=" : "", entry ? entry : "",
         au.checked, au.derived, au.walked, au.cut, au.skipped, au.mismatches, au.max_rel_err);
  if (au.first[0]) printf("  first difference: %s\n", au.first);
  total_checked += au.checked;
  if (au.max_rel_err > worst_rel) worst_rel = au.max_rel_err;
  if (res < 0) nskip++;
  else if (res == 0) nfail++;
  else npass++;
  return res;
}

static void run_file(const char *path) {
  char *meshes[32], *layouts[32];
  int nm, nl;
  unit_declared(path, meshes, &nm, layouts, &nl, 32);
  for (int i = 0; i < nm; i++)
    for (int j = 0; j < nl; j++) run_config(path, meshes[i], layouts[j], NULL, false, false);
  for (int i = 0; i < nm; i++) free(meshes[i]);
  for (int j = 0; j < nl; j++) free(layouts[j]);
}

static void run_path(const char *path) {
  if (!ut_each_shard(path, run_file)) {
    fprintf(stderr, "test_propagate: cannot read %s\n", path);
    nfail++;
  }
}

/* bench_propagate's program (12 layers, every dim shared), with three layouts. */
static void run_generated(void) {
  char path[] = "/tmp/test_propagate_XXXXXX.shard";
  int fd = mkstemps(path, 6);
  if (fd < 0) {
    nfail++;
    return;
  }
  FILE *f = fdopen(fd, "w");
  fprintf(f, "import \"targets\"\nmesh pod = h100[data: 8, model: 8]\n");
  fprintf(f, "dim batch = 64, seq = 512, embed = 1024, hidden = 4096\n");
  fprintf(f, "layout tp { batch: data\n  hidden: model }\n");
  fprintf(f, "layout fsdp_tp { batch: data\n  embed: data\n  hidden: model }\n");
  fprintf(f, "layout dp { batch: (data, model) }\nmodel deep {\n");
  int n = 12;
  for (int i = 0; i < n; i++) fprintf(f, "  param w%d: bf16[embed, hidden]\n  param v%d: bf16[hidden, embed]\n", i, i);
  fprintf(f, "  fn forward(x: bf16[batch, seq, embed]) -> bf16[batch, seq, embed] {\n");
  for (int i = 0; i < n; i++) fprintf(f, "    x = x + gelu(x @ w%d) @ v%d\n", i, i);
  fprintf(f, "    return x\n  }\n}\ntrain deep.forward {\n  loss = mse\n  optimizer = adam\n}\n");
  fclose(f);
  static const char *layouts[] = {"tp", "fsdp_tp", "dp"};
  for (int i = 0; i < 3; i++) {
    run_config(path, NULL, layouts[i], "deep.forward", i == 1, false); /* tp, dp: no forward candidate */
    run_config(path, NULL, layouts[i], NULL, true, i == 1); /* fsdp_tp: a pinned residual stream loses */
  }
  unlink(path);
}

int main(int argc, char **argv) {
  FILE *devnull = fopen("/dev/null", "w");
  diag_configure(devnull ? devnull : stderr, DIAG_MACHINE, false);
  run_generated();
  for (int i = 1; i < argc; i++) run_path(argv[i]);
  printf("%d passed, %d failed (%d skipped); %ld trials checked, largest relative time difference %.1e\n", npass,
         nfail, nskip, total_checked, worst_rel);
  if (devnull) fclose(devnull);
  return nfail > 0 || npass == 0 || total_checked == 0 ? 1 : 0;
}
