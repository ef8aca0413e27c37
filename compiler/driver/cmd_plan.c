/* cmd_plan.c: `shardc plan FILE [--devices N] [--target T] [--top K]`: the fastest meshes, layouts
 * and step keys that fit, ranked by simulated step time, each as `.shard` text to paste, with the
 * reason the first beats the second and the program's own in one sentence of figures. The search
 * is plan_search.h's; docs/plan.md. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "memory.h"
#include "plan_search.h"
#include "report.h"
#include "suggest.h"

static const char *bytes(Arena *a, double b) {
  char buf[32];
  memory_format_bytes(buf, sizeof buf, b);
  return arena_printf(a, "%s", buf);
}

/* "FSDP 64 x TP 8 + SP, remat full": the strategy in the words the book uses. */
static const char *strategy(Arena *a, const PlanCand *c) {
  char *s = arena_printf(a, "%s", "");
  const int *z = c->size; /* stage, data, fsdp, ep, ctx, model (plan_axis_names) */
  if (z[0] > 1 && c->interleave > 1)
    s = arena_printf(a, "%sPP %d interleaved(%d) (%d microbatches)", s, z[0], c->interleave, c->microbatches);
  else if (z[0] > 1) s = arena_printf(a, "%sPP %d (%d microbatches)", s, z[0], c->microbatches);
  if (z[2] > 1) s = arena_printf(a, "%s%sDP %d x FSDP %d (HSDP)", s, *s ? " x " : "", z[1], z[2]);
  else if (z[1] > 1) s = arena_printf(a, "%s%s%s %d", s, *s ? " x " : "", c->fsdp ? "FSDP" : c->zero ? "DP (ZeRO-1)" : "DP", z[1]);
  if (z[3] > 1) s = arena_printf(a, "%s%sEP %d", s, *s ? " x " : "", z[3]);
  if (z[4] > 1) s = arena_printf(a, "%s%sCP %d", s, *s ? " x " : "", z[4]);
  if (z[5] > 1) s = arena_printf(a, "%s%sTP %d%s", s, *s ? " x " : "", z[5], c->sp ? " + SP" : "");
  if (!*s) s = "one device";
  static const char *const remat[] = {"none", "full", "dots", "selective"};
  return arena_printf(a, "%s, remat %s%s", s, remat[c->remat & 3], z[5] > 1 && c->tp_off ? ", tp_overlap off" : "");
}

/* Why `a` beats `b`, in one sentence: the step times and the parts of the difference that matter. */
static const char *reason(Arena *A, const char *an, const PlanCand *a, const char *bn, const PlanCand *b) {
  if (a->fits && !b->fits)
    return arena_printf(A, "%s fits (%s per device) and %s does not (%s)", an, bytes(A, a->memory), bn, bytes(A, b->memory));
  double d = b->step_s - a->step_s;
  char *s = arena_printf(A, "%s is %s per step faster than %s (%s against %s, MFU %.1f%% against %.1f%%)", an,
                         report_seconds(A, d), bn, report_seconds(A, a->step_s), report_seconds(A, b->step_s),
                         100 * a->mfu, 100 * b->mfu);
  struct { const char *what; double x, y; } part[] = {{"exposed communication", a->exposed_s, b->exposed_s},
                                                      {"compute", a->compute_s, b->compute_s},
                                                      {"pipeline bubble", a->bubble_s, b->bubble_s}};
  int n = 0;
  for (int k = 0; k < 3; k++) {
    double dk = part[k].y - part[k].x;
    if (!(fabs(dk) >= 0.05 * fabs(d)) || fabs(dk) < 1e-9) continue;
    s = arena_printf(A, "%s%s %s %s %s (%s against %s)", s, n ? ", and" : ":", report_seconds(A, fabs(dk)),
                     dk > 0 ? "less" : "more", part[k].what, report_seconds(A, part[k].x), report_seconds(A, part[k].y));
    n++;
  }
  return s;
}

static cJSON *cand_json(Arena *a, const PlanCand *c) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "mesh", c->mesh);
  if (c->layout) cJSON_AddStringToObject(j, "layout", c->layout);
  else cJSON_AddNullToObject(j, "layout");
  if (c->step) cJSON_AddStringToObject(j, "step", c->step);
  cJSON_AddNumberToObject(j, "step_time_s", c->step_s);
  cJSON_AddNumberToObject(j, "mfu", c->mfu);
  cJSON_AddBoolToObject(j, "fits", c->fits);
  cJSON_AddNumberToObject(j, "memory_per_device", c->memory);
  cJSON_AddNumberToObject(j, "compute_s", c->compute_s);
  cJSON_AddNumberToObject(j, "exposed_comm_s", c->exposed_s);
  cJSON_AddNumberToObject(j, "bubble_s", c->bubble_s);
  if (c->comm_axes) cJSON_AddStringToObject(j, "comm_by_axes", c->comm_axes);
  if (c->step) cJSON_AddStringToObject(j, "strategy", strategy(a, c));
  if (c->step) cJSON_AddNumberToObject(j, "estimate_s", c->estimate_s);
  if (c->step) cJSON_AddNumberToObject(j, "estimate_memory", c->estimate_memory);
  return j;
}

static void print_indented(const char *text, const char *indent) {
  for (const char *s = text; *s;) {
    size_t n = strcspn(s, "\n");
    printf("%s%.*s\n", indent, (int)n, s);
    s += n + (s[n] == '\n');
  }
}

int cmd_plan(const Options *o) {
  Arena arena;
  arena_init(&arena);
  CheckedProgram cp;
  int rc = check_load(o, &arena, &cp);
  if (rc == EXIT_OK && !cp.ir) {
    diag_error((SrcLoc){0}, "%s declares no train step to plan for", o->input);
    rc = EXIT_PROGRAM_ERROR;
  }
  if (rc == EXIT_OK && (!pipeline_run(cp.ir, cp.prog) || diag_error_count() > 0)) rc = EXIT_PROGRAM_ERROR;
  if (rc != EXIT_OK) {
    arena_free(&arena);
    return rc;
  }
  const Program *p = cp.prog;
  const Target *T = p->mesh->target;
  if (o->target) {
    T = program_find_target(p, intern_cstr(o->target));
    if (!T) {
      Suggest sg = suggest_begin(o->target);
      for (int i = 0; i < p->ntargets; i++) suggest_try(&sg, p->targets[i]->name);
      char sb[160];
      diag_usage("--target %s: the program knows no such target%s (import \"targets\" declares a100, h100, h200, "
                 "b200, tpu_v4, tpu_v5e, tpu_v5p, tpu_v6e)", o->target, suggest_text(&sg, sb, sizeof sb));
      arena_free(&arena);
      return EXIT_USAGE;
    }
  }
  PlanInput in = {.cp = &cp, .o = o, .target = T, .devices = o->devices ? o->devices : p->mesh->devices,
                  .progress = true};
  PlanResult r;
  plan_search(&arena, &in, &r);
  if (r.error) {
    diag_error(p->entry ? p->entry->loc : (SrcLoc){0}, "%s", r.error);
    arena_free(&arena);
    return EXIT_PROGRAM_ERROR;
  }
  int top = o->top > 0 ? o->top : 5;
  if (top > r.ncands) top = r.ncands;
  static const char *const remats[] = {"none", "full", "dots", "selective"};
  const char *own_name = arena_printf(&arena, "the program's own (mesh %s, layout %s, remat %s)", r.own.mesh,
                                      r.own.layout ? r.own.layout : "none", remats[r.own.remat & 3]);
  const char *n1 = r.ncands >= 1 ? arena_printf(&arena, "1 (%s)", strategy(&arena, &r.cands[0])) : NULL;
  const char *n2 = r.ncands >= 2 ? arena_printf(&arena, "2 (%s)", strategy(&arena, &r.cands[1])) : NULL;
  const char *why12 = r.ncands >= 2 ? reason(&arena, n1, &r.cands[0], n2, &r.cands[1]) : NULL;
  const char *why_own = NULL;
  bool same_devices = in.devices == p->mesh->devices && T == p->mesh->target;
  if (r.ncands >= 1 && r.own.evaluated && same_devices)
    why_own = r.cands[0].step_s <= r.own.step_s || !r.own.fits
                  ? reason(&arena, n1, &r.cands[0], own_name, &r.own)
                  : arena_printf(&arena, "%s is faster (%s against %s per step) but outside the space plan searches "
                                         "(docs/plan.md)",
                                 own_name, report_seconds(&arena, r.own.step_s), report_seconds(&arena, r.cands[0].step_s));

  if (o->format == FORMAT_JSON) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "searched", (double)r.enumerated);
    cJSON_AddNumberToObject(j, "pruned", (double)r.pruned);
    cJSON_AddNumberToObject(j, "estimated", (double)r.estimated);
    cJSON_AddNumberToObject(j, "simulated", (double)r.simulated);
    cJSON_AddNumberToObject(j, "remats_skipped", (double)r.skipped);
    cJSON_AddNumberToObject(j, "estimate_seconds", r.estimate_seconds);
    cJSON_AddNumberToObject(j, "evaluated", (double)r.evaluated);
    cJSON_AddNumberToObject(j, "invalid", (double)r.invalid);
    cJSON_AddNumberToObject(j, "devices", (double)in.devices);
    cJSON_AddStringToObject(j, "target", T->name);
    cJSON_AddNumberToObject(j, "seconds", r.seconds);
    cJSON *cs = cJSON_AddArrayToObject(j, "candidates");
    for (int i = 0; i < top; i++) cJSON_AddItemToArray(cs, cand_json(&arena, &r.cands[i]));
    if (r.own.evaluated) cJSON_AddItemToObject(j, "own", cand_json(&arena, &r.own));
    cJSON *why = cJSON_AddArrayToObject(j, "reasons");
    if (why12) cJSON_AddItemToArray(why, cJSON_CreateString(why12));
    if (why_own) cJSON_AddItemToArray(why, cJSON_CreateString(why_own));
    report_json(j);
  } else {
    printf("plan %s on %lld x %s: %lld strategies, %lld pruned by the resident-state bound, %lld estimated "
           "(%.1f us each), the best %lld simulated: %lld programs checked and simulated (%lld with errors), %.2f s\n",
           r.step_name, (long long)in.devices, T->name, (long long)r.enumerated, (long long)r.pruned,
           (long long)r.estimated, r.estimated ? 1e6 * r.estimate_seconds / (double)r.estimated : 0.0,
           (long long)r.simulated, (long long)r.evaluated, (long long)r.invalid, r.seconds);
    if (r.own.evaluated)
      printf("%s: %s per step, MFU %.1f%%, %s per device%s\n", own_name, report_seconds(&arena, r.own.step_s), 100 * r.own.mfu,
             bytes(&arena, r.own.memory), r.own.fits ? "" : ", does not fit");
    if (r.enumerated == 0)
      printf("no strategy: %lld devices admit none of the program's dims' splits (the batch, %lld, must divide over "
             "the data axes; the other axes' sizes over the dims they shard: docs/plan.md)\n",
             (long long)in.devices, (long long)plan_dim_size(p, "batch"));
    else if (r.ncands == 0 || !r.cands[0].fits)
      printf("no candidate fits on %lld x %s\n", (long long)in.devices, T->name);
    for (int i = 0; i < top; i++) {
      const PlanCand *c = &r.cands[i];
      printf("\n%d. %s: %s per step, MFU %.1f%%, %s per device%s\n", i + 1, strategy(&arena, c), report_seconds(&arena, c->step_s),
             100 * c->mfu, bytes(&arena, c->memory), c->fits ? "" : " (does not fit)");
      printf("   compute %s, exposed communication %s, bubble %s; communication by axes: %s\n", report_seconds(&arena, c->compute_s),
             report_seconds(&arena, c->exposed_s), report_seconds(&arena, c->bubble_s), c->comm_axes);
      printf("   mesh planned = %s\n", c->mesh);
      print_indented(c->layout, "   ");
      print_indented(c->step, "   ");
    }
    if (why12 || why_own) printf("\n");
    if (why12) printf("why: %s\n", why12);
    if (why_own) printf("why: %s\n", why_own);
    if (top > 0) printf("(paste a candidate's texts into the program and run `shardc sim FILE --mesh planned --layout plan`)\n");
  }
  rc = r.ncands > 0 && r.cands[0].fits ? EXIT_OK : EXIT_PROGRAM_ERROR; /* the candidates live in the arena */
  arena_free(&arena);
  return rc;
}
