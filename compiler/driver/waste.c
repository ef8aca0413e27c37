/* waste.c: setups that waste the machine (see waste.h for the exact conditions).
 *
 * Two walks over the device program: the FLOPs each device computes and which of them are
 * replicated over each mesh axis; the per-layer activation collectives each axis carries and their
 * ideal time. A fix is a changed program (a -D, a layout rule, a mesh with its axes reordered)
 * built and passed through the pass pipeline quietly, then walked again. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "diag.h"
#include "memory.h"
#include "opcost.h"
#include "report.h"
#include "devprog.h"
#include "step.h"
#include "waste.h"

/* ---- what the device program computes ---- */

typedef struct Work {
  double total;                      /* FLOPs per device and step */
  double repl[MAX_MESH_AXES];        /* of which replicated over axis a */
  double tp_s[MAX_MESH_AXES];        /* per-layer activation collectives over axis a: ideal s */
  double tp_n[MAX_MESH_AXES];        /* and how many */
} Work;

static uint16_t sharding_mask(const Sharding *s, int rank) {
  uint16_t u = s->partial;
  for (int d = 0; d < rank && d < MAX_RANK; d++)
    for (int k = 0; k < s->naxes[d]; k++) u |= (uint16_t)(1u << s->axes[d][k]);
  return u;
}

/* The axes an op's work is split over: its results' (dims and partial sums). A localised module
 * (waste_find's) reads no operand finer than it is held: localize.c made each such slice an op. */
static uint16_t op_split_axes(const Op *op) {
  uint16_t u = 0;
  for (int r = 0; r < op->nresults; r++) u |= sharding_mask(&op->results[r]->sharding, op->results[r]->type.rank);
  return u;
}

static CollKind coll_kind_of(OpKind k) {
  switch (k) {
  case OP_ALL_GATHER: return COLL_ALL_GATHER;
  case OP_REDUCE_SCATTER: return COLL_REDUCE_SCATTER;
  case OP_ALL_REDUCE: return COLL_ALL_REDUCE;
  case OP_ALL_TO_ALL: return COLL_ALL_TO_ALL;
  default: return COLL_PERMUTE;
  }
}

typedef struct Walk {
  const Mesh *mesh;
  const Op *micro;        /* the step's microbatch loop (not a layer loop), or NULL */
  const PipeInfo *pi;     /* for main's ops' places */
  Work *w;
} Walk;

/* mult: runs per step of f on an average device; in_layer: f is (inside) a stacked-layer loop */
static void walk(const Walk *W, const IrFunc *f, double mult, bool in_layer, bool is_main) {
  const Mesh *mesh = W->mesh;
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_LOOP && op->body) {
      walk(W, op->body, mult * (double)(op->count > 0 ? op->count : 1), in_layer || op != W->micro, false);
      continue;
    }
    if (op->kind == OP_PIPELINE && op->pipe) {
      for (int r = 0; r < PR__COUNT; r++)
        if (op->pipe->region[r])
          walk(W, op->pipe->region[r], mult * opcost_region_runs(op->pipe, r, true) / op->pipe->stages, in_layer, false);
      continue;
    }
    if (op->nresults < 1) continue;
    double x = mult;
    if (is_main && W->pi && W->pi->stages > 0) { /* placed on some stages: their share of the devices */
      int k = 0;
      for (int s = 0; s < W->pi->stages; s++) k += dev_stage_runs(dev_op_runs(op), s, W->pi->stages);
      x *= (double)k / W->pi->stages;
    }
    if (ir_op_is_collective(op->kind)) {
      CollKind k = coll_kind_of(op->kind);
      if (!in_layer || op->role != ROLE_ACTIVATION || k == COLL_ALL_TO_ALL || k == COLL_PERMUTE || op->noperands < 1)
        continue;
      const Value *v = k == COLL_ALL_GATHER ? op->results[0] : op->operands[0];
      double t = cost_collective(mesh, k, op->axes, (double)sharding_local_bytes(&v->type, &v->sharding, mesh), true, NULL);
      for (int a = 0; a < mesh->naxes; a++)
        if ((op->axes >> a) & 1) W->w->tp_s[a] += x * t, W->w->tp_n[a] += x;
      continue;
    }
    OpCost c;
    opcost(op, true, &c);
    if (!(c.flops > 0)) continue;
    double fl = c.flops * x;
    uint16_t u = op_split_axes(op);
    W->w->total += fl;
    for (int a = 0; a < mesh->naxes; a++)
      if (!((u >> a) & 1)) W->w->repl[a] += fl;
  }
}

static void work_of(const IrModule *m, const Mesh *mesh, Work *w) {
  memset(w, 0, sizeof *w);
  Walk W = {.mesh = mesh, .micro = m->step ? m->step->micro_loop : NULL,
            .pi = m->pipeline ? m->pipeline->pipe : NULL, .w = w};
  walk(&W, m->main, 1, false, true);
}

static double model_flops(const IrModule *m) {
  StepFlops fl;
  step_flops(m, &fl);
  return (m->step ? 3 : 1) * fl.forward;
}

static uint16_t stage_axes(const IrModule *m) {
  uint16_t st = 0;
  const PipeInfo *pi = m->pipeline ? m->pipeline->pipe : NULL;
  for (int k = 0; pi && k < pi->nstage_axes; k++) st |= (uint16_t)(1u << pi->stage_axes[k]);
  return st;
}

static bool slow_link(LinkKind k) { return k == LINK_NETWORK || k == LINK_DCN; }

/* ---- a changed program, checked quietly ---- */

typedef struct Variant {
  Name dim;               /* a -D, or NULL */
  int64_t size;
  const Layout *layout;   /* NULL: the program's */
  const Mesh *mesh;       /* NULL: the program's */
} Variant;

/* The variant's module after the pass pipeline, or NULL when it has errors; *qp its program. */
static IrModule *variant_build(Arena *scratch, const CheckedProgram *cp, const Variant *v, const Program **qp) {
  diag_push_quiet();
  int errors = diag_quiet_error_count();
  IrModule *m = NULL;
  const Program *prog = cp->prog;
  if (v->dim) {
    SemaOptions so = cp->so;
    so.overrides = ARENA_ARRAY(scratch, DimOverride, cp->so.noverrides + 1);
    so.noverrides = 0;
    for (int i = 0; i < cp->so.noverrides; i++)
      if (cp->so.overrides[i].name != v->dim) so.overrides[so.noverrides++] = cp->so.overrides[i];
    so.overrides[so.noverrides++] = (DimOverride){v->dim, v->size};
    CheckedProgram cp2;
    memset(&cp2, 0, sizeof cp2);
    if (check_program(scratch, cp->parsed, &so, &cp2) != EXIT_OK || !cp2.prog || !cp2.prog->mesh ||
        diag_quiet_error_count() != errors)
      goto done;
    prog = cp2.prog;
  }
  Program *q = ARENA_ARRAY(scratch, Program, 1);
  *q = *prog;
  q->diag_once = NULL;
  if (v->layout) q->layout = v->layout;
  if (v->mesh) q->mesh = v->mesh;
  m = check_build_ir(scratch, q);
  if (!m || !pipeline_run(m, q) || diag_quiet_error_count() != errors) m = NULL;
  *qp = q;
done:
  diag_pop_quiet();
  return m;
}

/* ---- replicated axes ---- */

static const LayoutRule *rule_for(const Layout *L, Name dim) {
  for (int r = 0; L && r < L->nrules; r++)
    if (L->rules[r].dim == dim) return &L->rules[r];
  return NULL;
}

static const Dim *dim_named(const Program *p, Name n) {
  for (int i = 0; i < p->ndims; i++)
    if (p->dims[i]->name == n) return p->dims[i];
  return NULL;
}

static const char *rule_text(Arena *a, const LayoutRule *r) {
  if (r->naxes == 1) return arena_printf(a, "%s: %s", r->dim, r->axes[0]);
  char buf[256];
  int k = snprintf(buf, sizeof buf, "%s: (", r->dim);
  for (int i = 0; i < r->naxes && k < (int)sizeof buf - 40; i++)
    k += snprintf(buf + k, sizeof buf - (size_t)k, "%s%s", i ? ", " : "", r->axes[i]);
  snprintf(buf + k, sizeof buf - (size_t)k, ")");
  return arena_printf(a, "%s", buf);
}

/* The devices a rule needs its dim to divide by: its axes' sizes on the mesh (0: an axis the mesh
 * lacks, the rule is skipped whole), times the microbatches for the step's batch. */
static int64_t rule_divisor(const Program *p, const LayoutRule *r) {
  int64_t prod = 1;
  for (int k = 0; k < r->naxes; k++) {
    int ax = mesh_axis_index(p->mesh, r->axes[k]);
    if (ax < 0) return 0;
    prod *= p->mesh->axes[ax].size;
  }
  if (p->step && p->step->microbatches > 1 && strcmp(r->dim, "batch") == 0) prod *= p->step->microbatches;
  return prod;
}

/* Is the variant a fix of f: checked with no errors, and the finding gone (a replicated axis:
 * under half its FLOPs replicated; slow tensor parallelism: the axis on fast links, or its
 * per-layer activation collectives at most half the time)? Fills f's fixed_* figures. */
static bool try_fix(const CheckedProgram *cp, const Variant *v, Name axis, WasteFinding *f) {
  Arena scratch;
  arena_init(&scratch);
  const Program *q = NULL;
  IrModule *m = variant_build(&scratch, cp, v, &q);
  bool ok = false;
  int ax = m ? mesh_axis_index(q->mesh, axis) : -1;
  if (ax >= 0) {
    Work w;
    work_of(m, q->mesh, &w);
    if (f->kind == WASTE_REPLICATED_AXIS) {
      double share = w.total > 0 ? w.repl[ax] / w.total : 1;
      ok = share < WASTE_REPLICATED_SHARE;
      f->fixed_share = share;
      f->fixed_mfu_bound = w.total > 0 ? model_flops(m) / ((double)q->mesh->devices * w.total) : 0;
    } else {
      ok = !slow_link(q->mesh->axes[ax].link) || w.tp_s[ax] <= 0.5 * f->comm_s;
      f->fixed_comm_s = w.tp_s[ax];
    }
  }
  arena_free(&scratch);
  return ok;
}

/* Fix 1 of either kind: -D for a rule naming the axis that is skipped because its dim does not
 * divide (the smallest multiple above the dim's size). */
static bool fix_skipped_rule(Arena *a, const CheckedProgram *cp, WasteFinding *f) {
  const Program *p = cp->prog;
  Name axis = p->mesh->axes[f->axis].name;
  const Layout *L = p->layout;
  for (int r = 0; L && r < L->nrules; r++) {
    const LayoutRule *rule = &L->rules[r];
    bool names = false;
    for (int k = 0; k < rule->naxes; k++) names |= rule->axes[k] == axis;
    const Dim *d = names ? dim_named(p, rule->dim) : NULL;
    int64_t div = d ? rule_divisor(p, rule) : 0;
    if (!d || div <= 1 || d->size % div == 0) continue;
    int64_t n = (d->size / div + 1) * div;
    Variant v = {.dim = d->name, .size = n};
    if (try_fix(cp, &v, axis, f)) {
      f->fix = arena_printf(a, "-D %s=%lld, so that rule `%s` (line %d) applies", d->name, (long long)n,
                            rule_text(a, rule), rule->loc.line);
      return true;
    }
  }
  return false;
}

/* The fixes of a replicated axis, in waste.h's order; the first that checks is kept. */
static void fix_replicated(Arena *a, const CheckedProgram *cp, WasteFinding *f) {
  const Program *p = cp->prog;
  Name axis = p->mesh->axes[f->axis].name;
  const Layout *L = p->layout;
  if (fix_skipped_rule(a, cp, f)) return;
  /* 2. the axis added to the batch rule (or a new one); 3. with the batch made to divide */
  Name batch = intern_cstr("batch");
  const Dim *bd = dim_named(p, batch);
  if (!bd) return;
  const LayoutRule *br = rule_for(L, batch);
  if (br && br->naxes >= MAX_AXES_PER_DIM) return;
  for (int k = 0; br && k < br->naxes; k++)
    if (br->axes[k] == axis) return; /* the rule names it already (and applies: not 1.) */
  Layout *nl = ARENA_ARRAY(a, Layout, 1);
  *nl = L ? *L : (Layout){.name = intern_cstr("suggested"), .loc = p->mesh->loc};
  nl->rules = ARENA_ARRAY(a, LayoutRule, (L ? L->nrules : 0) + 1);
  if (L) memcpy(nl->rules, L->rules, sizeof(LayoutRule) * (size_t)L->nrules);
  LayoutRule *nr = NULL;
  for (int r = 0; r < nl->nrules; r++)
    if (nl->rules[r].dim == batch) nr = &nl->rules[r];
  if (!nr) {
    nr = &nl->rules[nl->nrules++];
    *nr = (LayoutRule){.dim = batch, .loc = nl->loc};
  }
  nr->axes[nr->naxes++] = axis;
  const char *where = L ? arena_printf(a, " in layout %s", L->name) : " in a layout";
  const char *text = arena_printf(a, "`%s`%s", rule_text(a, nr), br ? where : arena_printf(a, " (a new rule)%s", where));
  Variant v = {.layout = nl};
  if (try_fix(cp, &v, axis, f)) {
    f->fix = text;
    return;
  }
  int64_t div = rule_divisor(p, nr);
  if (div <= 1 || bd->size % div == 0) return;
  v.dim = batch;
  v.size = (bd->size / div + 1) * div;
  if (try_fix(cp, &v, axis, f)) f->fix = arena_printf(a, "%s with -D batch=%lld", text, (long long)v.size);
}

/* ---- slow tensor parallelism ---- */

static const char *mesh_text(Arena *a, const Mesh *m) {
  char buf[512];
  int k = snprintf(buf, sizeof buf, "%s[", m->target->name);
  for (int i = 0; i < m->naxes && k < (int)sizeof buf - 80; i++)
    k += snprintf(buf + k, sizeof buf - (size_t)k, "%s%s: %d", i ? ", " : "", m->axes[i].name, m->axes[i].size);
  snprintf(buf + k, sizeof buf - (size_t)k, "]");
  return arena_printf(a, "%s", buf);
}

/* 1. a skipped rule made to apply; 2. the mesh with the axis moved minor, formed on its target. */
static void fix_slow_tp(Arena *a, const CheckedProgram *cp, WasteFinding *f) {
  if (fix_skipped_rule(a, cp, f)) return;
  const Mesh *m0 = cp->prog->mesh;
  if (f->axis == m0->naxes - 1) return; /* minor already: too large for one fast domain */
  Mesh *nm = ARENA_ARRAY(a, Mesh, 1);
  *nm = *m0;
  int k = 0;
  for (int i = 0; i < m0->naxes; i++)
    if (i != f->axis) nm->axes[k++] = m0->axes[i];
  nm->axes[k] = m0->axes[f->axis];
  diag_push_quiet();
  bool formed = mesh_form(nm);
  diag_pop_quiet();
  if (!formed || slow_link(nm->axes[k].link)) return;
  Variant v = {.mesh = nm};
  if (try_fix(cp, &v, m0->axes[f->axis].name, f)) f->fix = arena_printf(a, "--mesh '%s'", mesh_text(a, nm));
}

static const char *secs(Arena *a, double s) {
  if (s >= 100) return arena_printf(a, "%.0f s", s);
  return report_seconds(a, s);
}

/* ---- the findings ---- */

static const char *pct(Arena *a, double x) {
  double p = 100 * x;
  if (p >= 99.95 || p <= 0) return arena_printf(a, "%.0f%%", p);
  return arena_printf(a, p >= 0.1 ? "%.1f%%" : "%.2g%%", p);
}

void waste_find(Arena *a, const CheckedProgram *cp, WasteReport *out) {
  memset(out, 0, sizeof *out);
  const Program *p = cp->prog;
  const IrModule *m = cp->ir;
  if (!p || !p->mesh || !m || !m->main || !m->localized) return;
  const Mesh *mesh = p->mesh;
  Work w;
  work_of(m, mesh, &w);
  out->device_flops = w.total;
  out->model_flops = model_flops(m);
  out->v = ARENA_ARRAY(a, WasteFinding, 2 * mesh->naxes + 1);
  double bound = w.total > 0 ? out->model_flops / ((double)mesh->devices * w.total) : 0;
  uint16_t st = stage_axes(m);
  for (int ax = 0; ax < mesh->naxes && w.total > 0; ax++) {
    const MeshAxis *x = &mesh->axes[ax];
    double share = w.repl[ax] / w.total;
    if (x->size <= 1 || ((st >> ax) & 1) || share < WASTE_REPLICATED_SHARE) continue;
    WasteFinding *f = &out->v[out->n++];
    *f = (WasteFinding){.kind = WASTE_REPLICATED_AXIS, .axis = ax, .loc = x->loc, .share = share, .mfu_bound = bound};
    fix_replicated(a, cp, f);
    const char *msg = arena_printf(
        a, "mesh axis '%s' (%d devices) shards no compute: %s of each device's FLOPs are computed the same on all %d "
           "devices along it, so MFU cannot exceed %s even at peak FLOP/s",
        x->name, x->size, pct(a, share), x->size, pct(a, bound));
    if (f->fix)
      f->message = arena_printf(a, "%s; fix: %s (checked: %s of the FLOPs replicated, MFU at most %s)", msg, f->fix,
                                pct(a, f->fixed_share), pct(a, f->fixed_mfu_bound));
    else
      f->message = arena_printf(a, "%s; no rule of the layout splits the work over it (give it a dim: batch, or a "
                                   "tensor-parallel dim such as heads or hidden)", msg);
  }
  for (int ax = 0; ax < mesh->naxes; ax++) {
    const MeshAxis *x = &mesh->axes[ax];
    if (x->size <= 1 || !slow_link(x->link) || !(w.tp_n[ax] > 0)) continue;
    WasteFinding *f = &out->v[out->n++];
    *f = (WasteFinding){.kind = WASTE_SLOW_TP, .axis = ax, .loc = x->loc, .comm_s = w.tp_s[ax],
                        .collectives = (int64_t)llround(w.tp_n[ax])};
    fix_slow_tp(a, cp, f);
    bool gpu = mesh->target->kind == TARGET_GPU;
    const char *where = gpu ? (x->per_node > 1 ? arena_printf(a, "straddles nodes (%d of its devices share an NVLink domain)", x->per_node)
                                               : "crosses nodes (one device per NVLink domain)")
                            : "crosses TPU slices";
    const char *msg = arena_printf(
        a, "tensor parallelism over mesh axis '%s' (%d devices) %s: its %lld per-layer activation collectives per "
           "step ride the %s, %s per device at peak bandwidth",
        x->name, x->size, where, (long long)f->collectives, cost_link_name(x->link), secs(a, f->comm_s));
    if (f->fix)
      f->message = arena_printf(a, "%s; fix: %s (checked: %s)", msg, f->fix,
                                f->fixed_comm_s > 0 ? arena_printf(a, "%s of them per step, on %s", secs(a, f->fixed_comm_s),
                                                                   gpu ? "NVLink" : "ICI")
                                                    : arena_printf(a, "none left over '%s'", x->name));
    else
      f->message = arena_printf(a, "%s; no order of the mesh's axes keeps it within %s: make it at most %d devices",
                                msg, gpu ? "a node" : "a slice", gpu ? mesh->target->node_size : x->size);
  }
}

void waste_warn(const WasteReport *r) {
  for (int i = 0; i < r->n; i++) diag_warning(r->v[i].loc, "%s", r->v[i].message);
}

void waste_print(FILE *out, const WasteReport *r) {
  if (r->n == 0) return;
  fprintf(out, "\nwarnings (setups that waste the machine):\n");
  for (int i = 0; i < r->n; i++) fprintf(out, "  - %s\n", r->v[i].message);
}

cJSON *waste_json(const WasteReport *r, const Mesh *mesh) {
  cJSON *arr = cJSON_CreateArray();
  for (int i = 0; i < r->n; i++) {
    const WasteFinding *f = &r->v[i];
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "kind", f->kind == WASTE_REPLICATED_AXIS ? "replicated_axis" : "slow_tensor_parallelism");
    cJSON_AddStringToObject(e, "axis", mesh->axes[f->axis].name);
    cJSON_AddStringToObject(e, "message", f->message);
    if (f->fix) cJSON_AddStringToObject(e, "fix", f->fix);
    else cJSON_AddNullToObject(e, "fix");
    if (f->kind == WASTE_REPLICATED_AXIS) {
      cJSON_AddNumberToObject(e, "replicated_share", f->share);
      cJSON_AddNumberToObject(e, "mfu_bound", f->mfu_bound);
      if (f->fix) {
        cJSON_AddNumberToObject(e, "fixed_replicated_share", f->fixed_share);
        cJSON_AddNumberToObject(e, "fixed_mfu_bound", f->fixed_mfu_bound);
      }
    } else {
      cJSON_AddNumberToObject(e, "comm_s", f->comm_s);
      cJSON_AddNumberToObject(e, "collectives", (double)f->collectives);
      if (f->fix) cJSON_AddNumberToObject(e, "fixed_comm_s", f->fixed_comm_s);
    }
    cJSON_AddItemToArray(arr, e);
  }
  return arr;
}
