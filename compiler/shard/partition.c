/* partition.c: collectives into the IR where operands are not sharded as their ops need.
 *
 * In: an IrModule after propagation (every value sharded, every op planned: Op.plan). Out: the
 * same module with collective ops inserted, each with the mesh axes it runs over and its reason
 * (Op.reason: the op that needed it, the operand, and where each axis in question came from).
 *
 * One walk serves two purposes: run dry (partition_cost) it only adds up the collectives' time,
 * which is what propagation minimises; applied (partition_module) it rewrites the IR. Per op, in
 * program order:
 *   - each operand is resharded to what the plan computes with (partition_plan.c's reshard_plan:
 *     partial sums reduced, AllToAll, AllGather; slices are local and left implicit, recorded in
 *     Op.in_shard). A value resharded the same way twice in one function, for the same phase of a
 *     train step (forward and loss, backward, optimizer), is resharded once.
 *   - the op's own collectives: the AllReduce(max) after a max over a sharded dim; a softmax, a
 *     norm, their gradients or a cross entropy over a sharded dim becomes its statistics (local
 *     max / sums, AllReduced, exact; the cross entropy's gradient reuses its logsumexp).
 *   - the result: if its sharding differs from what the op produces (a written type, or a
 *     propagation pin), the collectives follow the op and take over the result's uses. A written
 *     type that gathers a dim the op produced sharded is a warning (never a silent replication).
 *   - split / merge whose operand's sharding cannot be kept: a located error.
 *   - loops: carried and invariant values are resharded before the loop to the body's sharding,
 *     body outputs at the end of the body to the carried sharding (one sharding every iteration)
 *     and to their stacked result's row (a layer's gradient reduced as the backward makes it);
 *     under a pipeline (the stacked params' leading dim sharded over stage axes) the carried
 *     activations go to the next stage by a CollectivePermute at each stage boundary (a backward
 *     loop's gradients to the previous one).
 * A collective inside a loop body runs once per iteration: its count is the loop's trips. Every
 * collective takes the phase (Op.phase) of the op it serves; its reason names a param's gradient
 * where it reduces one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "partition.h"
#include "route.h"
#include "step.h"

#define NORM_EPSILON 1e-5 /* rmsnorm / layernorm epsilon in their statistics form */

typedef struct Cached {
  const Value *v;
  Sharding to;
  Value *out;
  int phase;            /* phase_class of the op that asked for it */
  int prev;             /* the entry before it of the same value, or -1 */
} Cached;
/* A region's reshards, in order (data, len, cap: a VEC), and by value (its last entry, open
 * addressing), so that a look-up reads only that value's entries. */
typedef struct CacheVec {
  Cached *data;
  int len, cap;
  const Value **hkey;
  int *hval;
  int hcap, hlen;
} CacheVec;

struct LseKept;

typedef struct Walk {
  IrModule *m;
  const Program *p;
  const Mesh *mesh;
  bool apply;
  PartCost cost;
  Arena *tmp;           /* per walk (dry runs); reasons go to the module's arena */
  int errors;           /* reported (apply) */
  VEC(SrcLoc) warned;   /* places already warned about */
  int phase;            /* OpPhase of the op being partitioned: the collectives made for it get it */
  const char *subject;  /* what the value being resharded is, when the walk knows better than the
                           value ("the gradient of blocks.ffn.w_up, one layer's row"), or NULL */
  VEC(struct LseKept) lse; /* the logsumexps of the vocab-parallel cross entropies walked so far */
  const Value *orig[2]; /* the op being partitioned: its first two operands as written */
  Op *hint;             /* the op inserted last (insert_before) */
  Value **subst;        /* by value id: what its later readers read instead (replace_later) */
  int nsubst;
  struct PartLedger *ledger; /* a ledger's walk of one unit: every cached reshard goes to its keys */
} Walk;

/* A cross entropy over a sharded class dim keeps its logsumexp (labels-shaped, f32) for its
 * gradient, which then needs no statistics of its own: keyed by the op's logits and labels as
 * written (before any reshard), the function, and the sharding the statistic has. */
typedef struct LseKept {
  const Value *logits, *labels;
  const IrFunc *f;
  Sharding s;
  Value *lse;           /* NULL in a dry run */
} LseKept;

/* A train step's forward (and loss), backward, and optimizer update: a reshard made for one is not
 * reused by another. A weight gathered for the forward is gathered again for the backward (FSDP:
 * gathered weights are temporaries, not kept for the backward), as an activation is. */
static int phase_class(int phase) {
  if (phase == PHASE_FORWARD || phase == PHASE_LOSS) return 0;
  return phase == PHASE_UPDATE ? 2 : 1;
}

/* ---- text for reasons ---- */

/* "line 12" in the file compiled, "models/llama.shard:38" in another (stdlib paths relative to
 * the stdlib, others by base name: golden output must not depend on where the tree lives). */
const char *partition_where(Arena *a, const Program *p, SrcLoc loc) {
  if (!loc.file) return "(no location)";
  if (!p || loc.file == p->main_file) return arena_printf(a, "line %d", loc.line);
  const char *path = loc.file->path, *s = path, *hit;
  while ((hit = strstr(s, "stdlib/"))) s = hit + 7;
  if (s == path) {
    const char *slash = strrchr(path, '/');
    s = slash ? slash + 1 : path;
  }
  return arena_printf(a, "%s:%d", s, loc.line);
}

static const char *where(const Walk *W, SrcLoc loc) { return partition_where(W->m->arena, W->p, loc); }


static const char *axes_text(const Walk *W, uint16_t axes) {
  char buf[160];
  int n = 0, cnt = 0;
  for (int a = 0; a < W->mesh->naxes; a++) cnt += (axes >> a) & 1;
  buf[0] = 0;
  if (cnt > 1) n += snprintf(buf + n, sizeof buf - (size_t)n, "(");
  int k = 0;
  for (int a = 0; a < W->mesh->naxes && n < (int)sizeof buf - 20; a++)
    if ((axes >> a) & 1) n += snprintf(buf + n, sizeof buf - (size_t)n, "%s%s", k++ ? ", " : "", W->mesh->axes[a].name);
  if (cnt > 1) snprintf(buf + n, sizeof buf - (size_t)n, ")");
  return arena_printf(W->m->arena, "%s", buf);
}

/* "x's", "tokens'" */
static const char *poss(const Walk *W, const char *name) {
  size_t n = strlen(name);
  return arena_printf(W->m->arena, "%s%s", name, n > 0 && name[n - 1] == 's' ? "'" : "'s");
}

static const char *shard_text(const Walk *W, const TensorType *t, const Sharding *s) {
  char buf[512];
  sharding_format(buf, sizeof buf, t, s, W->mesh);
  return arena_printf(W->m->arena, "%s", buf);
}

static const char *value_text(const Walk *W, const Value *v) {
  while (v->def && ir_op_is_collective(v->def->kind) && !v->name) v = v->def->operands[0];
  if (v->name) return arena_printf(W->m->arena, "%s", v->name);
  if (v->def) {
    if (v->def->kind == OP_PARAM && v->def->index >= 0 && v->def->index < W->m->nparams)
      return arena_printf(W->m->arena, "%s", W->m->params[v->def->index].path);
    return arena_printf(W->m->arena, "the %s at %s", ir_op_label(v->def), where(W, v->def->loc));
  }
  return arena_printf(W->m->arena, "%%%d", v->id);
}

/* "layout rule `hidden: model` (line 23)", "`@model` (line 12)", "propagated from line 40". */
static const char *origin_text(const Walk *W, ShardSource src, SrcLoc loc) {
  if (src == SHARD_LAYOUT && W->p->layout) {
    for (int r = 0; r < W->p->layout->nrules; r++) {
      const LayoutRule *rule = &W->p->layout->rules[r];
      if (rule->loc.line != loc.line || rule->loc.file != loc.file) continue;
      char ax[128] = "";
      int n = 0;
      for (int k = 0; k < rule->naxes && n < (int)sizeof ax - 20; k++)
        n += snprintf(ax + n, sizeof ax - (size_t)n, "%s%s", k ? ", " : "", rule->axes[k]);
      return arena_printf(W->m->arena, "layout rule `%s: %s%s%s` (%s)", rule->dim, rule->naxes > 1 ? "(" : "", ax,
                          rule->naxes > 1 ? ")" : "", where(W, loc));
    }
    return arena_printf(W->m->arena, "the layout (%s)", where(W, loc));
  }
  if (src == SHARD_ANNOTATION) {
    const char *text = "@";
    const char *line;
    size_t len;
    if (loc.file && loc.len > 0 && loc.len < 80 && source_line(loc.file, loc.line, &line, &len)) {
      /* the annotated dim as written: `j@x` (the source's line index: no scan from the start) */
      if ((size_t)loc.col - 1 + (size_t)loc.len <= len) {
        const char *b = line + loc.col - 1, *e = b + loc.len;
        if (memchr(b, '(', (size_t)loc.len) && !memchr(b, ')', (size_t)loc.len)) /* close `@(x, y` */
          while (*e && *e != '\n' && e[-1] != ')') e++;
        text = arena_strndup(W->m->arena, b, (size_t)(e - b));
      }
    }
    return arena_printf(W->m->arena, "`%s` (%s)", text, where(W, loc));
  }
  if (src == SHARD_PROPAGATED && loc.file) return arena_printf(W->m->arena, "propagation at %s", where(W, loc));
  return "propagation";
}

static const char *dim_origin(const Walk *W, const Value *v, int d) {
  return origin_text(W, v->dim_src[d], v->dim_loc[d]);
}

/* The names of a plan's summed dims that are sharded: "batch, seq". */
static const char *sum_dim_names(const Walk *W, const OpPlan *pl) {
  const char *t = "";
  for (int f = 0; f < pl->nf; f++)
    if (pl->fkind[f] == FK_SUM && pl->nax[f])
      t = arena_printf(W->m->arena, "%s%s%s", t, *t ? ", " : "", pl->fdim[f]->name);
  return t;
}

/* "the gradient of w_in" when v is a param's gradient (a step's grad.PATH value, or the row of a
 * stacked gradient a backward loop is about to stack: W->subject), else NULL. */
static const char *grad_subject(const Walk *W, const Value *v) {
  if (W->subject) return W->subject;
  if (v->name && strncmp(v->name, "grad.", 5) == 0)
    return arena_printf(W->m->arena, "the gradient of %s", v->name + 5);
  const IrFunc *b = v->func; /* a backward loop's body output it stacks as a param's gradient */
  for (const Op *o = b && b->parent ? b->parent->first : NULL; o; o = o->next) {
    if (o->kind != OP_LOOP || o->body != b) continue;
    for (int r = o->ncarried; r < o->nresults && r < b->noutputs; r++) {
      const Name n = o->results[r]->name;
      if (b->outputs[r] == v && n && strncmp(n, "grad.", 5) == 0)
        return arena_printf(W->m->arena, "the gradient of %s (one layer's row)", n + 5);
    }
  }
  return NULL;
}

/* Why the partial sum v exists: the op that made it and where its summed axes came from. */
static const char *partial_text(const Walk *W, const Value *v) {
  const Op *maker = NULL;
  for (const Value *x = v; x && x->def && !maker;) { /* walk linear ops back to the summing op */
    const Op *d = x->def;
    if (d->plan && d->plan->factored && (d->plan->made_partial & v->sharding.partial)) maker = d;
    else if (d->noperands > 0 && d->operands[0]->sharding.partial) x = d->operands[0];
    else if (d->noperands > 1 && d->operands[1]->sharding.partial) x = d->operands[1];
    else break;
  }
  const char *ax = axes_text(W, v->sharding.partial);
  if (!maker) {
    const Op *acc = NULL; /* a loop that accumulated it unreduced (a step's microbatches) */
    for (const Value *x = v; x && x->def && !acc; x = x->def->noperands == 1 ? x->def->operands[0] : NULL)
      if (x->def->kind == OP_LOOP) acc = x->def;
    const char *grad = grad_subject(W, v);
    if (acc)
      return arena_printf(W->m->arena,
                          "%s is a partial sum over %s: the loop at %s sums every microbatch's %s unreduced (each "
                          "device's covers only its own shard of the batch), so it is reduced once, here",
                          grad ? grad : value_text(W, v), ax, where(W, acc->loc), grad ? "gradient" : "value");
    return arena_printf(W->m->arena, "%s is a partial sum over %s", grad ? grad : value_text(W, v), ax);
  }
  const OpPlan *pl = maker->plan;
  const char *dims = "";
  for (int f = 0; f < pl->nf; f++) {
    if (pl->fkind[f] != FK_SUM || !pl->nax[f]) continue;
    const char *org = "";
    if (pl->src[f] >= 0 && pl->src[f] < maker->noperands)
      org = dim_origin(W, maker->operands[pl->src[f]], pl->src_dim[f]);
    dims = arena_printf(W->m->arena, "%s%s%s (%s)", dims, *dims ? ", " : "", pl->fdim[f]->name, org);
  }
  const char *grad = grad_subject(W, v);
  if (grad && maker->phase != PHASE_FORWARD && maker->phase != PHASE_LOSS)
    return arena_printf(W->m->arena,
                        "%s is a partial sum over %s: the %s at %s (in the backward) sums over %s, sharded over %s, "
                        "so each device's %s covers only its own shard of %s",
                        grad, ax, maker->kind == OP_CONTRACT ? "contraction" : ir_op_name(maker->kind),
                        where(W, maker->loc), dims, ax, maker->kind == OP_TAKE_GRAD ? "scatter" : "sum",
                        sum_dim_names(W, pl));
  if (maker->kind == OP_TAKE)
    return arena_printf(W->m->arena,
                        "take at %s gathers rows of %s, which are sharded over %s by %s: each device "
                        "gathers the rows it holds (a masked local gather) and the pieces are summed",
                        where(W, maker->loc), value_text(W, maker->operands[0]), ax, dims);
  const char *bwd = maker->phase == PHASE_BACKWARD || maker->phase == PHASE_RECOMPUTE ? " (in the backward)" : "";
  if (maker->kind == OP_CONTRACT)
    return arena_printf(W->m->arena,
                        "the contraction at %s%s sums over %s, sharded over %s in both operands "
                        "(matmul case 3), so %s is a partial sum over %s",
                        where(W, maker->loc), bwd, dims, ax, v->name ? v->name : "its result", ax);
  return arena_printf(W->m->arena, "the %s at %s%s sums over %s, sharded over %s, so %s is a partial sum",
                      ir_op_name(maker->kind), where(W, maker->loc), bwd, dims, ax, value_text(W, v));
}

static const char *time_text(const Walk *W, double s) {
  if (s >= 1) return arena_printf(W->m->arena, "%.3g s", s);
  if (s >= 1e-3) return arena_printf(W->m->arena, "%.3g ms", s * 1e3);
  return arena_printf(W->m->arena, "%.3g us", s * 1e6);
}

/* "; chosen by cost: 55.9 us against 28.7 ms the other way" when the op's plan was a choice. */
static const char *choice_text(const Walk *W, const OpPlan *pl) {
  if (!pl->conflict || pl->alt_time_s < 0) return "";
  if (pl->kept) /* the plan-choice rule's costs come after the layout's binding of the weights */
    return arena_printf(W->m->arena, "; the layout binds the weights' tensor-parallel shards, so a plan that gathers "
                                     "them is not taken (it would take %s against %s)",
                        time_text(W, pl->alt_time_s), time_text(W, pl->time_s));
  return arena_printf(W->m->arena, "; chosen by cost: %s against %s for the next best plan", time_text(W, pl->time_s),
                      time_text(W, pl->alt_time_s));
}

/* Why operand i of op is gathered over `mask` on its dim d (the op computes without them). */
static const char *lost_text(const Walk *W, const Op *op, int i, int d, uint16_t mask) {
  const OpPlan *pl = op->plan;
  const Value *v = op->operands[i];
  const char *vn = value_text(W, v), *dn = v->type.dims[d]->name, *an = axes_text(W, mask);
  const char *org = dim_origin(W, v, d), *opn = ir_op_name(op->kind);
  const char *line = where(W, op->loc);
  int f = -1;
  for (int g = 0; pl && g < pl->nf; g++)
    if (pl->fdim[g] == v->type.dims[d]) f = g;
  uint8_t why = f >= 0 ? pl->why[f] : WHY_NONE;
  if (f >= 0 && pl->fkind[f] == FK_RING && !pl->ring_axes) /* attention's key dim, not a ring */
    return arena_printf(W->m->arena,
                        "the %s at %s needs %s whole; %s shards it over %s (from %s) (ring attention needs the "
                        "layout to map the query dim to those axes and no head dim to them)",
                        opn, line, dn, vn, an, org);
  switch (why) {
  case WHY_CASE2:
    return arena_printf(W->m->arena,
                        "the contraction at %s contracts %s, which %s shards over %s (from %s) but the other "
                        "operand does not: %s is gathered first (matmul case 2)",
                        line, dn, vn, an, org, vn);
  case WHY_WHOLE:
    return arena_printf(W->m->arena, "the %s at %s needs %s whole; %s shards it over %s (from %s)", opn, line, dn, vn,
                        an, org);
  case WHY_BLOCKED:
    return arena_printf(W->m->arena,
                        "%s cannot shard %s in the %s at %s (a pipeline's stage axis, or the axis of a partial "
                        "sum passing through); %s has it from %s",
                        an, dn, opn, line, vn, org);
  case WHY_INDIVISIBLE:
    return arena_printf(W->m->arena, "%s does not divide %s in the %s at %s", an, dn, opn, line);
  default: break;
  }
  /* the axes went to other dims of the op (matmul case 4, or any conflict) */
  const char *others = "";
  for (int g = 0; pl && g < pl->nf; g++) {
    if (g == f || !(mask & 0xffff)) continue;
    uint16_t got = 0;
    for (int k = 0; k < pl->nax[g]; k++) got |= (uint16_t)(1u << pl->ax[g][k]);
    if (!(got & mask)) continue;
    const char *gorg = "propagation";
    if (pl->src[g] >= 0 && pl->src[g] < op->noperands) {
      const Value *gv = op->operands[pl->src[g]];
      gorg = arena_printf(W->m->arena, "as in %s, from %s", value_text(W, gv), dim_origin(W, gv, pl->src_dim[g]));
    } else if (pl->src[g] == -1) {
      gorg = "the result's type";
    }
    others = arena_printf(W->m->arena, "%s%s%s (%s)", others, *others ? " and " : "", pl->fdim[g]->name, gorg);
  }
  if (*others)
    return arena_printf(W->m->arena,
                        "%s shards %s in the %s at %s, and an axis shards one dim of an op: %s %s (from %s) is "
                        "gathered%s",
                        an, others, opn, line, poss(W, vn), dn, org, choice_text(W, pl));
  if (why == WHY_CONFLICT && f >= 0 && (pl->fkind[f] == FK_STATS || pl->fkind[f] == FK_MAX))
    return arena_printf(W->m->arena,
                        "the %s at %s reduces over %s, sharded over %s in %s (from %s): gathering it is cheaper "
                        "than reducing locally and all-reducing%s",
                        opn, line, dn, an, vn, org, choice_text(W, pl));
  if (why == WHY_CONFLICT)
    return arena_printf(W->m->arena, "the operands of the %s at %s disagree on %s; gathering %s %s over %s (from %s) "
                        "is the cheapest way%s", opn, line, dn, poss(W, vn), dn, an, org, choice_text(W, pl));
  return arena_printf(W->m->arena, "the %s at %s takes %s without %s on %s (from %s)", opn, line, vn, an, dn, org);
}

/* v is a param, or a loop body's slice or invariant standing for one (what FSDP gathers). */
static bool is_param(const Value *v) {
  if (v->def) return v->def->kind == OP_PARAM || (v->def->kind == OP_TRANSPOSE && v->spec && is_param(v->def->operands[0]));
  const IrFunc *b = v->func;
  if (!b || !b->parent) return false;
  for (const Op *o = b->parent->first; o; o = o->next) {
    if (o->kind != OP_LOOP || o->body != b) continue;
    for (int i = 0; i < b->ninputs && i < o->noperands; i++)
      if (b->inputs[i] == v) return (i < o->nslices && o->operands[i]->spec) || is_param(o->operands[i]);
  }
  return false;
}

/* ---- expert parallelism's AllToAlls (route.h) ---- */

/* The dispatch whose buffer v is (through casts, transposes, slices and earlier collectives). */
static const Op *dispatched_by(const Value *v) {
  for (int k = 0; v && v->def && k < 16; k++) {
    const Op *d = v->def;
    if (ir_route_contract(d, NULL) == CONTRACT_DISPATCH) return d;
    if (d->noperands != 1 || !(d->kind == OP_CAST || d->kind == OP_TRANSPOSE || d->kind == OP_SLICE ||
                               ir_op_is_collective(d->kind)))
      return NULL;
    v = d->operands[0];
  }
  return NULL;
}

/* The combine reading v: `reader` if it is one, else (reader NULL: a result resharded after its
 * op) the first combine of v's function that reads it. */
static const Op *combined_by(const Value *v, const Op *reader) {
  if (reader) return ir_route_contract(reader, NULL) == CONTRACT_COMBINE ? reader : NULL;
  for (const Op *o = v->func ? v->func->first : NULL; o; o = o->next)
    for (int i = 0; i < o->noperands; i++)
      if (o->operands[i] == v && ir_route_contract(o, NULL) == CONTRACT_COMBINE) return o;
  return NULL;
}

/* The first op of v's function that reads v and is not a collective (who a reshard is for, when
 * it follows v's op: a result's reshard), or NULL. */
static const Op *first_reader(const Value *v) {
  for (const Op *o = v->func ? v->func->first : NULL; o; o = o->next)
    for (int i = 0; i < o->noperands; i++)
      if (o->operands[i] == v && !ir_op_is_collective(o->kind)) return o;
  return NULL;
}

/* " as w's batch is (from ...)": an operand of op other than v that holds dim d over `axes` (the
 * shards v is brought to line up with; a cast of a named value by that name), or "". */
static const char *lined_up_with(const Walk *W, const Op *op, const Value *v, const Dim *d, uint16_t axes) {
  for (int i = 0; op && i < op->noperands; i++) {
    const Value *o = op->operands[i];
    int p = tensor_type_find(&o->type, d);
    if (o == v || p < 0) continue;
    uint16_t m = 0;
    for (int k = 0; k < o->sharding.naxes[p]; k++) m |= (uint16_t)(1u << o->sharding.axes[p][k]);
    if (!(m & axes)) continue;
    const Value *named = o;
    if (!o->name && o->def && o->def->kind == OP_CAST && o->def->operands[0]->name) named = o->def->operands[0];
    return arena_printf(W->m->arena, ", as %s %s is (from %s)", poss(W, value_text(W, named)), d->name,
                        dim_origin(W, o, p));
  }
  return "";
}

/* The reason of an AllToAll that moves a dispatch's slots to the experts or the experts' slots back
 * to their tokens (forward), or their gradients (backward); NULL for any other. */
static const char *expert_a2a_reason(const Walk *W, const ReshardStep *s, const Value *v, const Op *op,
                                     const char *who) {
  const TensorType *t = &v->type;
  if (s->dim < 0 || s->dim2 < 0) return NULL;
  const Dim *to = t->dims[s->dim2], *from = t->dims[s->dim];
  const char *ax = axes_text(W, s->axes);
  bool bwd = W->phase == PHASE_BACKWARD;
  const Op *comb = combined_by(v, op);
  if (comb)
    return arena_printf(W->m->arena,
                        "expert parallelism: the combine at %s reads %s, %s in their slots, with %s sharded over %s "
                        "instead of %s%s: the AllToAll sends each group's slots back to the devices that hold its "
                        "tokens",
                        where(W, comb->loc), value_text(W, v),
                        bwd ? "the gradient of the experts' inputs" : "the experts' outputs", to->name, ax, from->name,
                        lined_up_with(W, comb, v, to, s->axes));
  const Op *disp = dispatched_by(v);
  if (!disp) return NULL;
  const Op *reader = op ? op : first_reader(v);
  if (reader) who = arena_printf(W->m->arena, "the %s at %s", ir_op_label(reader), where(W, reader->loc));
  return arena_printf(W->m->arena,
                      "expert parallelism: %s reads %s, %s the dispatch at %s put in the experts' slots, with %s "
                      "sharded over %s instead of %s%s: the AllToAll sends each expert's slots to the devices that "
                      "hold that expert",
                      who, value_text(W, v), bwd ? "the gradient of the experts' outputs, which" : "the tokens",
                      where(W, disp->loc), to->name, ax, from->name, lined_up_with(W, reader, v, to, s->axes));
}

/* The reason of one reshard step of value v toward what `who` needs (already a phrase). */
static const char *step_reason(const Walk *W, const ReshardStep *s, const Value *v, const Op *op, int operand,
                               const char *who) {
  const TensorType *t = &v->type;
  switch (s->kind) {
  case COLL_ALL_REDUCE:
  case COLL_REDUCE_SCATTER: {
    const char *why = partial_text(W, v);
    if (s->kind == COLL_ALL_REDUCE)
      return arena_printf(W->m->arena, "%s; %s needs it summed", why, who);
    return arena_printf(W->m->arena, "%s; %s needs it summed and sharded as %s, so the sum is a ReduceScatter",
                        why, who, shard_text(W, t, &s->after));
  }
  case COLL_ALL_TO_ALL: {
    const char *ep = expert_a2a_reason(W, s, v, op, who);
    if (ep) return ep;
    return arena_printf(W->m->arena, "%s needs %s shards over %s on %s instead of %s (%s)", who, poss(W, value_text(W, v)),
                        axes_text(W, s->axes), t->dims[s->dim2]->name, t->dims[s->dim]->name,
                        dim_origin(W, v, s->dim));
  }
  case COLL_ALL_GATHER: {
    const char *parts = "";
    for (int d = 0; d < t->rank; d++) {
      uint16_t mask = 0;
      for (int k = 0; k < s->before.naxes[d]; k++)
        if (s->axes & (1u << s->before.axes[d][k])) mask |= (uint16_t)(1u << s->before.axes[d][k]);
      if (!mask) continue;
      const char *one = op && operand >= 0 ? lost_text(W, op, operand, d, mask)
                                           : arena_printf(W->m->arena, "%s needs %s %s without %s (from %s)", who,
                                                          poss(W, value_text(W, v)), t->dims[d]->name, axes_text(W, mask),
                                                          dim_origin(W, v, d));
      parts = arena_printf(W->m->arena, "%s%s%s", parts, *parts ? "; " : "", one);
    }
    if (phase_class(W->phase) == 1 && is_param(v))
      parts = arena_printf(W->m->arena, "%s (gathered again for the backward: gathered weights are not kept "
                           "from the forward)", parts);
    return parts;
  }
  default: return who;
  }
}

/* ---- building collective ops ---- */

static OpKind coll_op(CollKind k) { return ir_coll_op(k); }

/* A collective op over `axes` reading x, its result sharded `after`; not yet in any list. */
static Op *coll_new(Walk *W, IrFunc *f, OpKind kind, SrcLoc loc, Value *x, const Sharding *after, uint16_t axes,
                    const char *reason) {
  Op *c = ir_op_new(W->m, f, kind, loc, &x, 1, &x->type, 1);
  c->phase = (uint8_t)W->phase;
  c->axes = axes;
  c->reason = reason;
  c->partitioned = true;
  Value *r = c->results[0];
  r->sharding = *after;
  r->shard_source = SHARD_PROPAGATED;
  r->shard_loc = loc;
  for (int d = 0; d < r->type.rank; d++) {
    r->dim_src[d] = after->naxes[d] ? x->dim_src[d] : SHARD_FREE;
    r->dim_loc[d] = x->dim_loc[d];
  }
  r->partial_loc = after->partial ? x->partial_loc : (SrcLoc){0};
  return c;
}

/* The ops of a reshard, chained from x; *last gets the final value. Returns the first op. */
static Op *chain_new(Walk *W, IrFunc *f, SrcLoc loc, Value *x, const Reshard *rs, const Op *op, int operand,
                     const char *who, Value **last) {
  Op *first = NULL, *prev = NULL;
  Value *cur = x;
  for (int i = 0; i < rs->n; i++) {
    const ReshardStep *s = &rs->step[i];
    const char *why = step_reason(W, s, cur, op, operand, who);
    Op *c = coll_new(W, f, coll_op(s->kind), loc, cur, &s->after, s->axes, why);
    c->dim_index = s->dim;
    c->dim_index2 = s->dim2;
    if (prev) prev->next = c; /* linked privately; the caller splices the chain in */
    else first = c;
    prev = c;
    cur = c->results[0];
  }
  *last = cur;
  return first;
}

/* ir_insert_before, looking for pos's predecessor from the op inserted last first: the walk
 * inserts in program order, so pos is mostly just after it, and the insertions of a whole walk
 * cost about one pass over the function instead of one each. */
static void insert_before(Walk *W, IrFunc *f, Op *pos, Op *op) {
  if (pos && W->hint && W->hint->func == f && f->first != pos)
    for (Op *o = W->hint; o; o = o->next)
      if (o->next == pos) {
        op->func = f;
        op->next = pos;
        o->next = op;
        W->hint = op;
        return;
      }
  ir_insert_before(f, pos, op);
  W->hint = op;
}

/* ir_replace_uses(f, from, to) for the uses of `from` the walk has not reached yet, which are all
 * of them but the collectives just made for it (a value is read after its op, and the walk is
 * at its op): each later op's operands, and f's outputs, are replaced as the walk reaches them
 * (take_replaced), instead of searching the whole function for every replaced value. */
static void replace_later(Walk *W, const Value *from, Value *to) {
  if (from->id < 0) return;
  if (from->id >= W->nsubst) {
    int n = W->nsubst ? W->nsubst : 1024;
    while (n <= from->id) n *= 2;
    Value **ns = ARENA_ARRAY(W->tmp, Value *, n);
    if (W->nsubst) memcpy(ns, W->subst, sizeof *ns * (size_t)W->nsubst);
    W->subst = ns;
    W->nsubst = n;
  }
  W->subst[from->id] = to;
}

static Value *replaced(const Walk *W, Value *v) {
  for (int k = 0; v && v->id >= 0 && v->id < W->nsubst && W->subst[v->id] && k < 64; k++) v = W->subst[v->id];
  return v;
}

static void take_replaced(const Walk *W, Value **vals, int n) {
  if (!W->nsubst) return;
  for (int i = 0; i < n; i++) vals[i] = replaced(W, vals[i]);
}

static void splice_before(Walk *W, IrFunc *f, Op *pos, Op *first) {
  while (first) {
    Op *n = first->next;
    insert_before(W, f, pos, first);
    first = n;
  }
}

/* A reshard's `who` phrase (only a partitioning walk uses it: a dry run neither formats it nor
 * evaluates its arguments, which allocate in the module's arena). */
#define WHO(W, ...) ((W)->apply ? arena_printf((W)->m->arena, __VA_ARGS__) : "")

/* Adds a reshard's cost (times mult). */
static void charge(Walk *W, double time, double n, double mult) {
  W->cost.time_s += time * mult;
  W->cost.count += n * mult;
}

static Value *ledger_reshard(Walk *W, IrFunc *f, Value *v, const Sharding *to, double mult);

/* v brought to `to` before `pos` (NULL: at f's end): the value to use instead of v. */
static size_t cache_slot(const CacheVec *c, const Value *v) {
  uint64_t x = (uint64_t)(uintptr_t)v;
  x = (x ^ (x >> 31)) * 0x9e3779b97f4a7c15ull;
  size_t j = (size_t)(x ^ (x >> 29)) & (size_t)(c->hcap - 1);
  while (c->hkey[j] && c->hkey[j] != v) j = (j + 1) & (size_t)(c->hcap - 1);
  return j;
}

static const Cached *cache_find(const Walk *W, const CacheVec *c, const Value *v, const Sharding *to) {
  if (!c->hcap) return NULL;
  size_t j = cache_slot(c, v);
  for (int i = c->hkey[j] ? c->hval[j] : -1; i >= 0; i = c->data[i].prev)
    if (c->data[i].phase == phase_class(W->phase) && sharding_equal(&c->data[i].to, to, v->type.rank)) return &c->data[i];
  return NULL;
}

static void cache_add(Walk *W, CacheVec *c, Cached e) {
  if (2 * (c->hlen + 1) > c->hcap) {
    int ncap = c->hcap ? 2 * c->hcap : 64;
    const Value **nk = ARENA_ARRAY(W->tmp, const Value *, ncap);
    int *nv = ARENA_ARRAY(W->tmp, int, ncap);
    CacheVec g = {.hkey = nk, .hval = nv, .hcap = ncap};
    for (int i = 0; i < c->hcap; i++)
      if (c->hkey[i]) {
        size_t j = cache_slot(&g, c->hkey[i]);
        nk[j] = c->hkey[i];
        nv[j] = c->hval[i];
      }
    c->hkey = nk, c->hval = nv, c->hcap = ncap;
  }
  size_t j = cache_slot(c, e.v);
  e.prev = c->hkey[j] ? c->hval[j] : -1;
  if (!c->hkey[j]) c->hkey[j] = e.v, c->hlen++;
  c->hval[j] = c->len;
  VEC_PUSH(W->tmp, *c, e);
}

static Value *reshard_value(Walk *W, IrFunc *f, Op *pos, Value *v, const Sharding *to, double mult, CacheVec *cache,
                            const Op *op, int operand, const char *who, SrcLoc loc) {
  if (sharding_equal(&v->sharding, to, v->type.rank)) return v;
  if (W->ledger) return ledger_reshard(W, f, v, to, mult);
  const Cached *hit = cache_find(W, cache, v, to);
  if (hit) return hit->out;
  /* A rename is a view: its source is resharded (once, whoever else reads it: attention's q reads
   * x, its k and v read x[seq -> kseq]) and renamed again. The sharding maps by position. */
  const Op *rn = v->def;
  if (rn && rn->kind == OP_RENAME && rn->func == f && rn->noperands == 1 && rn->operands[0]->func == f &&
      sharding_equal(&rn->operands[0]->sharding, &v->sharding, v->type.rank)) {
    Value *u = rn->operands[0];
    Value *U = reshard_value(W, f, pos, u, to, mult, cache, op, operand, who, loc);
    Value *out = v;
    if (W->apply && U != u) {
      Op *r = ir_op_new(W->m, f, OP_RENAME, rn->loc, &U, 1, &v->type, 1);
      r->dims = rn->dims;
      r->ndims = rn->ndims;
      r->phase = (uint8_t)W->phase;
      r->partitioned = true;
      out = r->results[0];
      out->sharding = *to;
      out->shard_source = SHARD_PROPAGATED;
      memcpy(out->dim_src, v->dim_src, sizeof out->dim_src);
      memcpy(out->dim_loc, v->dim_loc, sizeof out->dim_loc);
      out->name = v->name;
      insert_before(W, f, pos, r);
    }
    cache_add(W, cache, (Cached){v, *to, out, phase_class(W->phase), -1});
    return out;
  }
  Reshard rs;
  if (!reshard_plan(W->mesh, &v->type, &v->sharding, to, &rs)) return v;
  charge(W, rs.time_s, rs.n, mult);
  Value *out = v;
  if (W->apply && rs.n > 0) {
    Op *first = chain_new(W, f, loc, v, &rs, op, operand, who, &out);
    splice_before(W, f, pos, first);
  }
  cache_add(W, cache, (Cached){v, *to, out, phase_class(W->phase), -1});
  return out;
}

/* ---- the op's own collectives ---- */

static Value *emit_before(Walk *W, IrFunc *f, Op *pos, OpKind k, SrcLoc loc, Value **ops, int n, TensorType t,
                          const Sharding *s, Dim **dims, int ndims) {
  Op *o = ir_op_new(W->m, f, k, loc, ops, n, &t, 1);
  o->phase = (uint8_t)W->phase;
  o->partitioned = true;
  if (ndims > 0) {
    o->dims = ARENA_ARRAY(W->m->arena, Dim *, ndims);
    memcpy(o->dims, dims, sizeof(Dim *) * (size_t)ndims);
    o->ndims = ndims;
  }
  Value *r = o->results[0];
  if (s) r->sharding = *s;
  r->shard_source = SHARD_PROPAGATED;
  r->shard_loc = loc;
  insert_before(W, f, pos, o);
  return r;
}

static TensorType without_dim(const TensorType *t, const Dim *d, DType dt, const Sharding *s, Sharding *out) {
  TensorType r = {.dtype = dt, .rank = 0};
  memset(out, 0, sizeof *out);
  for (int i = 0; i < t->rank; i++) {
    if (t->dims[i] == d) continue;
    r.dims[r.rank] = t->dims[i];
    out->naxes[r.rank] = s->naxes[i];
    memcpy(out->axes[r.rank], s->axes[i], sizeof s->axes[i]);
    r.rank++;
  }
  return r;
}

/* A reduction over d (OP_MAX or OP_SUM/OP_MEAN) of x sharded over `axes` on d, then its AllReduce:
 * the reduced value, replicated over `axes`. */
static Value *reduce_all(Walk *W, IrFunc *f, Op *pos, OpKind k, SrcLoc loc, Value *x, const Sharding *xs, Dim *d,
                         uint16_t axes, const char *why) {
  Sharding rs; /* xs: the shards of x the reduction reads (x's own or a local slice) */
  TensorType t = without_dim(&x->type, d, x->type.dtype, xs, &rs);
  Sharding raw = rs;
  raw.partial = axes;
  Value *part = emit_before(W, f, pos, k, loc, &x, 1, t, &raw, &d, 1);
  part->partial_max = k == OP_MAX;
  part->partial_loc = loc;
  Op *c = coll_new(W, f, OP_ALL_REDUCE, loc, part, &rs, axes, why);
  c->reduce_max = k == OP_MAX;
  insert_before(W, f, pos, c);
  return c->results[0];
}

/* pick(x, idx) along d with d sharded over `axes` (each device picks from its block, zero
 * elsewhere), then its AllReduce: the picked values, replicated over `axes`. */
static Value *pick_all(Walk *W, IrFunc *f, Op *pos, SrcLoc loc, Value *x, const Sharding *xs, Value *idx, Dim *d,
                       uint16_t axes, const char *why) {
  Sharding rs;
  TensorType t = without_dim(&x->type, d, x->type.dtype, xs, &rs);
  Sharding raw = rs;
  raw.partial = axes;
  Value *ops[2] = {x, idx};
  Value *part = emit_before(W, f, pos, OP_PICK, loc, ops, 2, t, &raw, &d, 1);
  part->partial_loc = loc;
  Op *c = coll_new(W, f, OP_ALL_REDUCE, loc, part, &rs, axes, why);
  insert_before(W, f, pos, c);
  return c->results[0];
}

static Value *scalar_const(Walk *W, IrFunc *f, Op *pos, SrcLoc loc, double x) {
  TensorType t = {.dtype = DT_F32, .rank = 0};
  Value *v = emit_before(W, f, pos, OP_CONST, loc, NULL, 0, t, NULL, NULL, 0);
  v->def->scalar = x;
  return v;
}

/* A binary elementwise op before `pos`, of type t and sharding s. */
static Value *bin_before(Walk *W, IrFunc *f, Op *pos, OpKind k, SrcLoc loc, Value *a, Value *b, const TensorType *t,
                         const Sharding *s) {
  Value *ops[2] = {a, b};
  return emit_before(W, f, pos, k, loc, ops, 2, *t, s, NULL, 0);
}

/* x in f32 (a cast before `pos` unless it is f32 already). */
static Value *f32_before(Walk *W, IrFunc *f, Op *pos, SrcLoc loc, Value *x, const Sharding *s) {
  if (x->type.dtype == DT_F32) return x;
  TensorType t = x->type;
  t.dtype = DT_F32;
  return emit_before(W, f, pos, OP_CAST, loc, &x, 1, t, s, NULL, 0);
}

/* rsqrt(v + eps) of a statistic v. */
static Value *rsqrt_eps(Walk *W, IrFunc *f, Op *pos, SrcLoc loc, Value *v) {
  Value *eps = scalar_const(W, f, pos, loc, NORM_EPSILON);
  Value *ve = bin_before(W, f, pos, OP_ADD, loc, v, eps, &v->type, &v->sharding);
  return emit_before(W, f, pos, OP_RSQRT, loc, &ve, 1, ve->type, &v->sharding, NULL, 0);
}

/* What a cross entropy kept for the gradient being partitioned (W->orig: its logits and labels as
 * written), with its statistics sharded s. */
static LseKept *lse_find(Walk *W, const IrFunc *f, const Sharding *s, int rank) {
  for (int i = 0; i < W->lse.len; i++) {
    LseKept *k = &W->lse.data[i];
    if (k->f == f && k->logits == W->orig[0] && k->labels == W->orig[1] && sharding_equal(&k->s, s, rank)) return k;
  }
  return NULL;
}

/* The logsumexp over the sharded class dim of a cross entropy's logits xf (f32, sharded xs):
 * kept from the cross entropy for its gradient, else m = max [AR max], s = sum(exp(xf - m)) [AR],
 * m + log(s). */
static Value *ce_lse(Walk *W, IrFunc *f, Op *op, Value *xf, const Sharding *xs, const char *why) {
  Dim *d = op->dims[0];
  uint16_t ax = op->plan->stats_axes;
  SrcLoc loc = op->loc;
  Sharding ss;
  TensorType st = without_dim(&xf->type, d, DT_F32, xs, &ss);
  LseKept *k = lse_find(W, f, &ss, st.rank);
  if (op->kind == OP_CROSS_ENTROPY_GRAD && k && k->lse) return k->lse;
  Value *m = reduce_all(W, f, op, OP_MAX, loc, xf, xs, d, ax, why);
  Value *z = bin_before(W, f, op, OP_SUB, loc, xf, m, &xf->type, xs);
  Value *e = emit_before(W, f, op, OP_EXP, loc, &z, 1, xf->type, xs, NULL, 0);
  Value *s = reduce_all(W, f, op, OP_SUM, loc, e, xs, d, ax, why);
  Value *ls = emit_before(W, f, op, OP_LOG, loc, &s, 1, s->type, &s->sharding, NULL, 0);
  Value *lse = bin_before(W, f, op, OP_ADD, loc, m, ls, &m->type, &m->sharding);
  if (k && op->kind == OP_CROSS_ENTROPY) k->lse = lse;
  return lse;
}

/* How many statistics AllReduces op's statistics form makes: its plan's, but a cross entropy's
 * gradient reuses the logsumexp its cross entropy kept (none), or makes its own (2). A cross
 * entropy records what it keeps (dry runs too: their costs must match). */
static int stats_count(Walk *W, const IrFunc *f, const Op *op) {
  const OpPlan *pl = op->plan;
  if (op->kind != OP_CROSS_ENTROPY && op->kind != OP_CROSS_ENTROPY_GRAD) return pl->nstats;
  Sharding ss;
  TensorType st = without_dim(&op->operands[0]->type, op->dims[0], DT_F32, &pl->req[0], &ss);
  if (op->kind == OP_CROSS_ENTROPY_GRAD) return lse_find(W, f, &ss, st.rank) ? 0 : 2;
  LseKept k = {W->orig[0], W->orig[1], f, ss, NULL};
  VEC_PUSH(W->tmp, W->lse, k);
  return pl->nstats;
}

/* softmax / rmsnorm / layernorm and their gradients over a sharded dim d, in statistics form
 * (exact, in f32; [AR]: an AllReduce over the dim's axes of a value without d):
 *   softmax:        m = max(x) [AR max]; e = exp(x - m); s = sum(e) [AR]; e / s
 *   rmsnorm:        ms = mean(x * x) [AR]; x * rsqrt(ms + eps) * scale
 *   layernorm:      mu = mean(x) [AR]; c = x - mu; var = mean(c * c) [AR];
 *                   c * rsqrt(var + eps) * scale + bias
 *   softmax_grad:   t = sum(dy * y) [AR]; y * (dy - t)
 *   rmsnorm_grad:   r = rsqrt(mean(x * x) [AR] + eps); xh = x r; e = dy * scale;
 *                   (e - xh * mean(e * xh) [AR]) * r
 *   layernorm_grad: c = x - mean(x) [AR]; r = rsqrt(mean(c * c) [AR] + eps); xh = c r;
 *                   e = dy * scale; (e - mean(e) [AR] - xh * mean(e * xh) [AR]) * r
 *   cross_entropy:  lse = max(x) [AR max] + log(sum(exp(x - max)) [AR]); lse - pick(x, labels) [AR]
 *                   (pick: the label's logit where this device holds it, else 0)
 *   cross_entropy_grad: (exp(x - lse) - onehot(labels)) * dl, lse kept from the cross entropy
 * The op is replaced; its result's uses go to the last value. */
static Value *expand_stats(Walk *W, IrFunc *f, Op *op) {
  const OpPlan *pl = op->plan;
  Dim *d = op->dims[0];
  Value *x = op->operands[0], *res = op->results[0];
  SrcLoc loc = op->loc;
  uint16_t ax = pl->stats_axes;
  const char *an = axes_text(W, ax);
  bool grad = op->kind == OP_SOFTMAX_GRAD || op->kind == OP_RMSNORM_GRAD || op->kind == OP_LAYERNORM_GRAD;
  const char *why = op->kind == OP_CROSS_ENTROPY || op->kind == OP_CROSS_ENTROPY_GRAD
    ? arena_printf(W->m->arena,
                   "the %s at %s reduces over the classes %s, sharded over %s (from %s): each device takes the "
                   "max and the sum of exponentials of its shard of the logits%s, and small AllReduces of "
                   "per-position f32 statistics combine them (Megatron's vocab-parallel cross entropy: the "
                   "logits are never gathered)%s",
                   ir_op_name(op->kind), where(W, loc), d->name, an,
                   dim_origin(W, x, tensor_type_find(&x->type, d)),
                   op->kind == OP_CROSS_ENTROPY ? " and picks the labels' logits it holds" : "",
                   pl->alt_time_s >= 0 ? arena_printf(W->m->arena, "; %s against %s to gather them",
                                                      time_text(W, pl->time_s), time_text(W, pl->alt_time_s))
                                       : "")
    : arena_printf(W->m->arena,
                                 "the %s at %s %s over %s, sharded over %s (from %s): each device "
                                 "reduces its shard and the statistics are all-reduced (exact, f32)%s",
                                 ir_op_name(op->kind), where(W, loc),
                                 grad ? "(the backward of a normalisation) reduces" : "normalises", d->name, an,
                                 dim_origin(W, x, tensor_type_find(&x->type, d)),
                                 pl->alt_time_s >= 0 ? arena_printf(W->m->arena, "; %s against %s to gather it",
                                                                    time_text(W, pl->time_s), time_text(W, pl->alt_time_s))
                                                     : "");
  TensorType tf = x->type;
  tf.dtype = DT_F32;
  Sharding sx = pl->req[0]; /* the shards the op computes with (x's own, or a local slice of it) */
  Op *mark = op; /* the ops made below sit between the previous op and `op` */
  Op *prev = NULL;
  for (Op *o = f->first; o && o != op; o = o->next) prev = o;
  Value *xf = f32_before(W, f, op, loc, x, &sx);
  Value *y;
  switch (op->kind) { /* kept: each statistics op's own decomposition into local pieces */
  case OP_SOFTMAX: {
    Value *m = reduce_all(W, f, op, OP_MAX, loc, xf, &sx, d, ax, why);
    Value *z = bin_before(W, f, op, OP_SUB, loc, xf, m, &tf, &sx);
    Value *e = emit_before(W, f, op, OP_EXP, loc, &z, 1, tf, &sx, NULL, 0);
    Value *s = reduce_all(W, f, op, OP_SUM, loc, e, &sx, d, ax, why);
    y = bin_before(W, f, op, OP_DIV, loc, e, s, &tf, &sx);
    break;
  }
  case OP_SOFTMAX_GRAD: { /* (y, dy): xf is y */
    Value *dyf = f32_before(W, f, op, loc, op->operands[1], &pl->req[1]);
    Value *p = bin_before(W, f, op, OP_MUL, loc, dyf, xf, &tf, &sx);
    Value *t = reduce_all(W, f, op, OP_SUM, loc, p, &sx, d, ax, why);
    Value *u = bin_before(W, f, op, OP_SUB, loc, dyf, t, &tf, &sx);
    y = bin_before(W, f, op, OP_MUL, loc, xf, u, &tf, &sx);
    break;
  }
  case OP_RMSNORM_GRAD: case OP_LAYERNORM_GRAD: { /* (x, scale, dy) */
    Value *c = xf;
    if (op->kind == OP_LAYERNORM_GRAD) {
      Value *mu = reduce_all(W, f, op, OP_MEAN, loc, xf, &sx, d, ax, why);
      c = bin_before(W, f, op, OP_SUB, loc, xf, mu, &tf, &sx);
    }
    Value *c2 = bin_before(W, f, op, OP_MUL, loc, c, c, &tf, &sx);
    Value *r = rsqrt_eps(W, f, op, loc, reduce_all(W, f, op, OP_MEAN, loc, c2, &sx, d, ax, why));
    Value *xh = bin_before(W, f, op, OP_MUL, loc, c, r, &tf, &sx);
    Value *sf = f32_before(W, f, op, loc, op->operands[1], &pl->req[1]);
    Value *dyf = f32_before(W, f, op, loc, op->operands[2], &pl->req[2]);
    Value *e = bin_before(W, f, op, OP_MUL, loc, dyf, sf, &tf, &sx);
    Value *exh = bin_before(W, f, op, OP_MUL, loc, e, xh, &tf, &sx);
    Value *m2 = reduce_all(W, f, op, OP_MEAN, loc, exh, &sx, d, ax, why);
    Value *t = bin_before(W, f, op, OP_MUL, loc, xh, m2, &tf, &sx);
    Value *u = e;
    if (op->kind == OP_LAYERNORM_GRAD) {
      Value *m1 = reduce_all(W, f, op, OP_MEAN, loc, e, &sx, d, ax, why);
      u = bin_before(W, f, op, OP_SUB, loc, e, m1, &tf, &sx);
    }
    u = bin_before(W, f, op, OP_SUB, loc, u, t, &tf, &sx);
    y = bin_before(W, f, op, OP_MUL, loc, u, r, &tf, &sx);
    break;
  }
  case OP_CROSS_ENTROPY: case OP_CROSS_ENTROPY_GRAD: { /* (logits, labels[, dl]) */
    Value *lse = ce_lse(W, f, op, xf, &sx, why);
    if (op->kind == OP_CROSS_ENTROPY) {
      Value *pk = pick_all(W, f, op, loc, xf, &sx, op->operands[1], d, ax, why);
      y = bin_before(W, f, op, OP_SUB, loc, lse, pk, &lse->type, &lse->sharding);
      break;
    }
    Value *z = bin_before(W, f, op, OP_SUB, loc, xf, lse, &tf, &sx);
    Value *p = emit_before(W, f, op, OP_EXP, loc, &z, 1, tf, &sx, NULL, 0);
    Value *oh = emit_before(W, f, op, OP_ONEHOT, loc, &op->operands[1], 1, tf, &sx, &d, 1);
    Value *q = bin_before(W, f, op, OP_SUB, loc, p, oh, &tf, &sx);
    y = bin_before(W, f, op, OP_MUL, loc, q, f32_before(W, f, op, loc, op->operands[2], &pl->req[2]), &tf, &sx);
    break;
  }
  default: { /* rmsnorm, layernorm */
    Value *c = xf;
    if (op->kind == OP_LAYERNORM) {
      Value *mu = reduce_all(W, f, op, OP_MEAN, loc, xf, &sx, d, ax, why);
      c = bin_before(W, f, op, OP_SUB, loc, xf, mu, &tf, &sx);
    }
    Value *c2 = bin_before(W, f, op, OP_MUL, loc, c, c, &tf, &sx);
    Value *r = rsqrt_eps(W, f, op, loc, reduce_all(W, f, op, OP_MEAN, loc, c2, &sx, d, ax, why));
    Value *n = bin_before(W, f, op, OP_MUL, loc, c, r, &tf, &sx);
    y = bin_before(W, f, op, OP_MUL, loc, n, op->operands[1], &tf, &sx);
    if (op->kind == OP_LAYERNORM && op->noperands > 2) y = bin_before(W, f, op, OP_ADD, loc, y, op->operands[2], &tf, &sx);
    break;
  }
  }
  if (res->type.dtype != DT_F32) y = emit_before(W, f, op, OP_CAST, loc, &y, 1, res->type, &sx, NULL, 0);
  /* the new ops that read the original operands read them as the plan has them (local slices) */
  for (Op *o = prev ? prev->next : f->first; o && o != mark; o = o->next)
    for (int k = 0; k < o->noperands; k++)
      for (int i = 0; i < op->noperands && i < pl->nopnd; i++) {
        Value *orig = op->operands[i];
        if (o->operands[k] != orig || sharding_equal(&orig->sharding, &pl->req[i], orig->type.rank)) continue;
        if (!o->in_shard) {
          o->in_shard = ARENA_ARRAY(W->m->arena, Sharding, o->noperands);
          for (int j = 0; j < o->noperands; j++) o->in_shard[j] = o->operands[j]->sharding;
        }
        o->in_shard[k] = pl->req[i];
      }
  /* the result keeps its name and type order: a transpose to it if the order differs */
  if (!tensor_type_equal(&y->type, &res->type)) y = emit_before(W, f, op, OP_TRANSPOSE, loc, &y, 1, res->type, &pl->natural, NULL, 0);
  y->name = res->name;
  y->spec = res->spec;
  y->shard_source = res->shard_source;
  memcpy(y->dim_src, res->dim_src, sizeof y->dim_src);
  memcpy(y->dim_loc, res->dim_loc, sizeof y->dim_loc);
  replace_later(W, res, y);
  ir_remove(f, op);
  return y;
}

/* ---- ops ---- */

static bool warned_at(Walk *W, SrcLoc loc) {
  for (int i = 0; i < W->warned.len; i++)
    if (W->warned.data[i].file == loc.file && W->warned.data[i].line == loc.line && W->warned.data[i].col == loc.col)
      return true;
  VEC_PUSH(W->tmp, W->warned, loc);
  return false;
}

/* "the return type of attention.forward (layers.shard:73)", "the type of argument x of
 * mlp.forward (line 49)", "its written type (line 12)" (a typed let). */
static const char *spec_text(const Walk *W, const TypeSpec *spec) {
  const Program *p = W->p;
  for (int i = 0; i < p->nmodels; i++) {
    const Model *mo = p->models[i];
    for (int k = 0; mo && k < mo->nfns; k++) {
      const FnDecl *fn = &mo->fns[k];
      if (spec == &fn->ret)
        return arena_printf(W->m->arena, "the return type of %s.%s (%s)", mo->name, fn->name, where(W, spec->loc));
      for (int a = 0; a < fn->nargs; a++)
        if (spec == &fn->args[a].type)
          return arena_printf(W->m->arena, "the type of argument %s of %s.%s (%s)", fn->args[a].name, mo->name,
                              fn->name, where(W, spec->loc));
    }
  }
  return arena_printf(W->m->arena, "its written type (%s)", where(W, spec->loc));
}

/* The origins of an op's raw result (what it computes before a reshard to a written type): each
 * dim's axes trace back to the operand dim its plan took them from. */
static void raw_origins(Value *r, const Op *op) {
  const OpPlan *pl = op->plan;
  for (int d = 0; d < r->type.rank; d++) {
    r->dim_src[d] = SHARD_FREE;
    if (!r->sharding.naxes[d] || !pl || !pl->factored) continue;
    for (int f = 0; f < pl->nf; f++) {
      if (pl->fdim[f] != r->type.dims[d] || pl->src[f] < 0 || pl->src[f] >= op->noperands) continue;
      const Value *o = op->operands[pl->src[f]];
      r->dim_src[d] = o->dim_src[pl->src_dim[f]];
      r->dim_loc[d] = o->dim_loc[pl->src_dim[f]];
    }
  }
}

/* r holds `nat` (what its op produced) but must have the sharding r carries now (a written type
 * or a propagation pin): the collectives follow `after` and take over r's uses; r keeps `nat`. */
/* The op computes only the block of its result r's sharding asks for, finer than what its plan
 * produces: each operand dim that is a result dim it keeps is read sliced alike (Op.in_shard); a
 * dim it reduces over (a norm's) is computed whole and its result sliced. */
static void slice_operands_to(Walk *W, Op *op, const Value *r) {
  bool planned = op->plan && op->plan->factored;
  bool elementwise = op->kind == OP_ADD || op->kind == OP_SUB || op->kind == OP_MUL || op->kind == OP_DIV ||
                     op->kind == OP_CAST || op->kind == OP_TRANSPOSE; /* (the ops a statistics form ends with) */
  if ((!planned && !elementwise) || op->nresults != 1 || op->results[0] != r) return;
  const Sharding *R = &r->sharding;
  for (int i = 0; i < op->noperands; i++) {
    const Value *v = op->operands[i];
    Sharding s = op->in_shard ? op->in_shard[i] : v->sharding;
    bool changed = false;
    for (int d = 0; d < v->type.rank; d++) {
      const Dim *dim = v->type.dims[d];
      for (int j = 0; op->kind == OP_RENAME && j + 1 < op->ndims; j += 2)
        if (op->dims[j] == dim) dim = op->dims[j + 1];
      int e = tensor_type_find(&r->type, dim), f = 0;
      if (planned) {
        while (f < op->plan->nf && op->plan->fdim[f] != dim) f++;
        if (f == op->plan->nf || op->plan->fkind[f] != FK_KEEP) continue; /* reduced over: computed whole */
      }
      if (e < 0 || s.naxes[d] >= R->naxes[e] || memcmp(s.axes[d], R->axes[e], s.naxes[d]) != 0) continue;
      s.naxes[d] = R->naxes[e];
      memcpy(s.axes[d], R->axes[e], sizeof s.axes[d]);
      changed = true;
    }
    if (!changed) continue;
    if (!op->in_shard) {
      op->in_shard = ARENA_ARRAY(W->m->arena, Sharding, op->noperands);
      for (int k = 0; k < op->noperands; k++) op->in_shard[k] = op->operands[k]->sharding;
    }
    op->in_shard[i] = s;
  }
}

static void reshard_result(Walk *W, IrFunc *f, Op *after, Value *r, const Sharding *nat, double mult) {
  if (sharding_equal(nat, &r->sharding, r->type.rank)) return;
  Reshard rs;
  if (!reshard_plan(W->mesh, &r->type, nat, &r->sharding, &rs)) return;
  charge(W, rs.time_s, rs.n, mult);
  if (W->apply && rs.n == 0 && r->def) slice_operands_to(W, r->def, r);
  if (!W->apply || rs.n == 0) return; /* only a slice: the op computes its part directly */
  const Op *op = r->def ? r->def : after;
  Sharding want = r->sharding;
  const char *grad = r->spec ? NULL : grad_subject(W, r);
  bool bound = false; /* a dim held as a layout rule maps it (the layout binds the value) */
  for (int d = 0; d < r->type.rank; d++) bound |= want.naxes[d] && r->dim_src[d] == SHARD_LAYOUT;
  const char *who = r->spec ? arena_printf(W->m->arena, "%s, %s,", spec_text(W, r->spec), shard_text(W, &r->type, &want))
                    : grad  ? arena_printf(W->m->arena, "its stacked gradient's sharding, %s (%s),",
                                           shard_text(W, &r->type, &want), bound ? "the layout's" : "propagation's choice")
                    : bound ? arena_printf(W->m->arena, "the layout's sharding of %s, %s,", value_text(W, r),
                                           shard_text(W, &r->type, &want))
                            : arena_printf(W->m->arena, "propagation's choice for %s, %s,", value_text(W, r),
                                           shard_text(W, &r->type, &want));
  for (const Op *u = f->first; u && !r->spec; u = u->next) /* logits made whole along a route's tokens */
    if (u->kind == OP_ROUTE && u->noperands == 1 && u->operands[0] == r && u->ndims >= 3) {
      who = arena_printf(W->m->arena, "the route at %s, which fills each expert's slots in order of %s and so reads "
                         "the logits whole along it,", where(W, u->loc), u->dims[1]->name);
      break;
    }
  Value saved = *r;
  r->sharding = *nat;
  raw_origins(r, op);
  Value *last;
  Op *first = chain_new(W, f, op->loc, r, &rs, NULL, -1, who, &last);
  replace_later(W, r, last); /* the chain keeps reading r */
  splice_before(W, f, after->next, first);
  /* the final value takes r's identity as the source knows it */
  last->name = r->name;
  last->spec = r->spec;
  memcpy(last->dim_src, saved.dim_src, sizeof last->dim_src);
  memcpy(last->dim_loc, saved.dim_loc, sizeof last->dim_loc);
  last->shard_source = saved.shard_source;
  last->shard_loc = saved.shard_loc;
  r->spec = NULL;
  r->shard_source = SHARD_PROPAGATED;
  /* never replicate silently: a written type that gathers a dim the op produced sharded (but the
   * optimizer's update of a param, run on its sharded state's shard (ZeRO), is gathered back by
   * design) */
  for (int i = 0; i < rs.n; i++) {
    if (rs.step[i].kind != COLL_ALL_GATHER || !last->spec) continue;
    if (op->phase == PHASE_UPDATE) {
      first->reason = arena_printf(W->m->arena,
                                   "%s: the optimizer state is sharded further than the param (zero), so the "
                                   "update runs on the state's shard and the updated param is gathered back",
                                   first->reason);
      continue;
    }
    SrcLoc at = last->spec->loc.file ? last->spec->loc : op->loc;
    if (op->phase != PHASE_FORWARD) { /* a gradient takes its param's type: nothing the user wrote */
      first->reason = arena_printf(W->m->arena, "%s (a gradient has its param's written type, %s)", first->reason,
                                   spec_text(W, last->spec));
      continue;
    }
    first->reason = arena_printf(W->m->arena, "%s [a warning: %s replicates a value its op produced sharded]",
                                 first->reason, spec_text(W, last->spec));
    if (warned_at(W, at)) continue;
    diag_warning(at, "this type replicates %s over %s, which the %s at %s produces sharded (%s): an AllGather "
                 "follows it",
                 value_text(W, last), axes_text(W, rs.step[i].axes), ir_op_name(op->kind), where(W, op->loc),
                 shard_text(W, &r->type, nat));
  }
}

/* The AllReduce(max) after a max over a sharded dim: r becomes the local maxima (partial over
 * the axes), the AllReduce's result takes over its uses, then any reshard to r's sharding. */
static void max_allreduce(Walk *W, IrFunc *f, Op *op, double mult) {
  const OpPlan *pl = op->plan;
  Value *r = op->results[0];
  const TensorType *rt = &r->type;
  charge(W, cost_collective(W->mesh, COLL_ALL_REDUCE, pl->max_axes, (double)sharding_local_bytes(rt, &pl->natural, W->mesh), true, NULL), 1, mult);
  if (!W->apply) {
    Reshard rs;
    if (reshard_plan(W->mesh, rt, &pl->natural, &r->sharding, &rs)) charge(W, rs.time_s, rs.n, mult);
    return;
  }
  int xd = -1;
  for (int fi = 0; fi < pl->nf; fi++)
    if (pl->fkind[fi] == FK_MAX && pl->nax[fi]) xd = tensor_type_find(&op->operands[0]->type, pl->fdim[fi]);
  const char *why = arena_printf(W->m->arena,
                                 "the max at %s reduces over %s, sharded over %s (from %s): each device takes "
                                 "the max of its shard and the AllReduce takes the max of the pieces",
                                 where(W, op->loc), xd >= 0 ? op->operands[0]->type.dims[xd]->name : "?",
                                 axes_text(W, pl->max_axes), xd >= 0 ? dim_origin(W, op->operands[0], xd) : "?");
  Sharding final = r->sharding, raw = pl->natural;
  raw.partial |= pl->max_axes;
  r->sharding = raw;
  r->partial_max = true;
  r->partial_loc = op->loc;
  Op *c = coll_new(W, f, OP_ALL_REDUCE, op->loc, r, &pl->natural, pl->max_axes, why);
  c->reduce_max = true;
  Value *cr = c->results[0];
  replace_later(W, r, cr);
  insert_before(W, f, op->next, c);
  cr->name = r->name;
  cr->spec = r->spec;
  memcpy(cr->dim_src, r->dim_src, sizeof cr->dim_src);
  memcpy(cr->dim_loc, r->dim_loc, sizeof cr->dim_loc);
  r->spec = NULL;
  cr->sharding = final;
  reshard_result(W, f, c, cr, &pl->natural, mult);
}

/* Ring attention (the op's plan put its key dim on its query dim's axes): the op runs the ring
 * itself, n - 1 CollectivePermute steps of the K/V blocks (the backward's first op: K, V and
 * their gradients), charged here. Under `causal` the sequence is stored in zigzag order
 * (IrModule.zigzag) so that every device does the same work. */
static void ring_attention(Walk *W, Op *op, double mult) {
  const OpPlan *pl = op->plan;
  uint16_t ring = pl->ring_axes;
  int n = (int)sharding_axes_product(W->mesh, ring);
  bool carries = op->kind == OP_ATTENTION || op->index == 0; /* the op that carries the ring's cost */
  if (carries) {
    const Value *k = op->operands[1], *v = op->operands[2];
    CollCost step;
    int steps = cost_ring(W->mesh, ring, (double)sharding_local_bytes(&k->type, &pl->req[1], W->mesh),
                          (double)sharding_local_bytes(&v->type, &pl->req[2], W->mesh), op->kind == OP_ATTENTION_GRAD, true, &step);
    charge(W, steps * step.time_s, 1, mult);
  }
  if (!W->apply) return;
  op->ring = ring;
  bool zig = op->flag && n > 1 && op->ndims > 2;
  if (zig && op->dims[2]->size % (2 * n) != 0) {
    diag_error(op->loc, "causal ring attention over %s splits %s (%lld) into 2 x %d chunks, which it does not divide",
               axes_text(W, ring), op->dims[2]->name, (long long)op->dims[2]->size, n);
    zig = false;
  }
  if (zig) {
    struct Zigzag *z = &W->m->zigzag;
    if (!z->axes) *z = (struct Zigzag){.dims = {op->dims[2], op->dims[1]}, .axes = ring, .n = n};
    else if (z->axes != ring || (z->dims[0] != op->dims[2] && z->dims[0] != op->dims[1]))
      diag_error(op->loc, "two causal ring attentions split different sequences or over different axes: one "
                          "zigzag order per program");
  }
  const Dim *qd = op->ndims > 2 ? op->dims[2] : NULL, *kd = op->ndims > 1 ? op->dims[1] : NULL;
  op->reason = arena_printf(
      W->m->arena,
      "ring attention over %s (the layout maps %s there and no head dim): each device keeps its %s block and the "
      "%s travel the ring, %d CollectivePermute steps, each overlapped with the attention of the block at hand "
      "and merged by online softmax; no device holds more than two K/V blocks%s",
      axes_text(W, ring), qd ? qd->name : "the query dim", qd ? qd->name : "query",
      op->kind == OP_ATTENTION ? "K/V blocks" : "K/V blocks and their gradients", n - 1,
      zig ? arena_printf(W->m->arena, "; causal: %s and %s are split into %d chunks, device i holding chunks i and "
                                      "%d-i, so that every device does the same work",
                         qd ? qd->name : "?", kd ? kd->name : "?", 2 * n, 2 * n - 1)
          : "");
}

static void walk_factored(Walk *W, IrFunc *f, Op *op, double mult, CacheVec *cache) {
  OpPlan *pl = op->plan;
  W->orig[0] = op->noperands > 0 ? op->operands[0] : NULL;
  W->orig[1] = op->noperands > 1 ? op->operands[1] : NULL;
  const char *who = "";
  if (W->apply && op->kind == OP_TRANSPOSE && op->results[0]->spec) /* a boundary's copy (ir_build) */
    who = spec_text(W, op->results[0]->spec);
  else if (W->apply)
    who = arena_printf(W->m->arena, "the %s at %s", ir_op_name(op->kind), where(W, op->loc));
  Sharding *in_shard = NULL;
  for (int i = 0; i < op->noperands && i < pl->nopnd; i++) {
    Value *v = op->operands[i];
    Value *nv = reshard_value(W, f, op, v, &pl->req[i], mult, cache, op, i, who, op->loc);
    if (!W->apply) continue;
    op->operands[i] = nv;
    if (!sharding_equal(&nv->sharding, &pl->req[i], nv->type.rank)) {
      if (!in_shard) {
        in_shard = ARENA_ARRAY(W->m->arena, Sharding, op->noperands);
        for (int k = 0; k < op->noperands; k++) in_shard[k] = op->operands[k]->sharding;
      }
      in_shard[i] = pl->req[i];
    }
  }
  if (W->apply && in_shard) {
    for (int k = 0; k < op->noperands; k++)
      if (k < pl->nopnd && !sharding_equal(&in_shard[k], &pl->req[k], op->operands[k]->type.rank))
        in_shard[k] = op->operands[k]->sharding;
    op->in_shard = in_shard;
  }
  if (pl->ring_axes) ring_attention(W, op, mult);
  const TensorType *rt = &op->results[0]->type;
  if (pl->max_axes && sharding_axes_product(W->mesh, pl->max_axes) > 1) {
    max_allreduce(W, f, op, mult);
    return;
  }
  if (pl->stats_axes && pl->stats_factor >= 0 && sharding_axes_product(W->mesh, pl->stats_axes) > 1) {
    Sharding ss;
    TensorType st = without_dim(rt, pl->fdim[pl->stats_factor], DT_F32, &pl->natural, &ss);
    double b = (double)sharding_local_bytes(&st, &ss, W->mesh);
    int nst = stats_count(W, f, op);
    charge(W, nst * cost_collective(W->mesh, COLL_ALL_REDUCE, pl->stats_axes, b, true, NULL), nst, mult);
    if (!W->apply) {
      reshard_result(W, f, op, op->results[0], &pl->natural, mult);
      return;
    }
    Sharding want = op->results[0]->sharding;
    Value *y = expand_stats(W, f, op); /* y holds the natural sharding; r's written type may want more */
    y->sharding = want;
    reshard_result(W, f, y->def, y, &pl->natural, mult);
    return;
  }
  reshard_result(W, f, op, op->results[0], &pl->natural, mult);
}

/* An op without a sharding rule (none exists today; a safe default for new op kinds) runs
 * replicated: every operand gathered and summed, the result replicated. */
static void walk_replicated(Walk *W, IrFunc *f, Op *op, double mult, CacheVec *cache) {
  Sharding none;
  memset(&none, 0, sizeof none);
  const char *who = W->apply ? arena_printf(W->m->arena, "the %s at %s (an op that runs replicated)",
                                            ir_op_name(op->kind), where(W, op->loc))
                             : "";
  for (int i = 0; i < op->noperands; i++) {
    Value *nv = reshard_value(W, f, op, op->operands[i], &none, mult, cache, NULL, -1, who, op->loc);
    if (W->apply) op->operands[i] = nv;
  }
  reshard_result(W, f, op, op->results[0], &none, mult);
}

static void walk_reshape(Walk *W, IrFunc *f, Op *op, double mult, CacheVec *cache) {
  OpPlan *pl = op->plan;
  if (!pl) return;
  if (pl->nopnd == 1 && !sharding_equal(&pl->req[0], &op->operands[0]->sharding, op->operands[0]->type.rank)) {
    /* the operand gathered on the dims the reshape cannot keep (the layout binds the result) */
    const char *who = WHO(W, "the %s at %s (it cannot keep %s's sharding, %s, on its parts)", ir_op_name(op->kind),
                          where(W, op->loc), value_text(W, op->operands[0]),
                          shard_text(W, &op->operands[0]->type, &op->operands[0]->sharding));
    Value *nv = reshard_value(W, f, op, op->operands[0], &pl->req[0], mult, cache, NULL, -1, who, op->loc);
    if (W->apply) op->operands[0] = nv;
  }
  if (pl->reshape_bad_dim >= 0) {
    W->cost.errors++;
    if (W->apply) {
      const Value *x = op->operands[0];
      int d = pl->reshape_bad_dim;
      const Sharding *s = &x->sharding;
      int64_t n = 1;
      for (int k = 0; k < s->naxes[d]; k++) n *= W->mesh->axes[s->axes[d][k]].size;
      uint16_t ax = 0;
      for (int k = 0; k < s->naxes[d]; k++) ax |= (uint16_t)(1u << s->axes[d][k]);
      const char *parts = ""; /* split: dims[1..] are the parts; merge: dims[0..n-2] */
      int from = op->kind == OP_SPLIT ? 1 : 0, to = op->kind == OP_SPLIT ? op->ndims : op->ndims - 1;
      for (int j = from; j < to; j++)
        parts = arena_printf(W->m->arena, "%s%s%s=%lld", parts, j > from ? ", " : "", op->dims[j]->name,
                             (long long)op->dims[j]->size);
      if (op->kind == OP_SPLIT)
        diag_error(op->loc,
                   "this split cannot keep the sharding of %s: %s is sharded %lld ways over %s (from %s), which "
                   "does not lay out evenly onto (%s) major part first; shard a part instead, or unshard %s",
                   value_text(W, x), x->type.dims[d]->name, (long long)n, axes_text(W, ax), dim_origin(W, x, d),
                   parts, x->type.dims[d]->name);
      else
        diag_error(op->loc,
                   "this merge cannot keep the sharding of %s: %s is sharded over %s (from %s) but a more major "
                   "part is not fully sharded, so a device's elements of the merged dim would not be contiguous "
                   "(%s); shard the most major part instead",
                   value_text(W, x), x->type.dims[d]->name, axes_text(W, ax), dim_origin(W, x, d), parts);
      W->errors++;
    }
  }
  reshard_result(W, f, op, op->results[0], &pl->natural, mult);
}

static void walk_func(Walk *W, IrFunc *f, double mult, CacheVec *cache);

/* The stage axes of a loop (its slices' leading dim) and the microbatches a step splits into. */
static uint16_t stage_axes(const Op *loop) {
  uint16_t m = 0;
  for (int i = 0; i < loop->nslices && i < loop->noperands; i++) {
    const Sharding *s = &loop->operands[i]->sharding;
    for (int k = 0; k < s->naxes[0]; k++) m |= (uint16_t)(1u << s->axes[0][k]);
  }
  return m;
}

static int microbatches(const Program *p) { return p->step && p->step->microbatches > 1 ? p->step->microbatches : 1; }

/* The microbatches a pipeline's transfers are counted over here: a step's microbatch loop holds the
 * pipeline and its trips count them already (1); a forward alone stands for all of them. */
static int pipe_microbatches(const Walk *W) {
  return W->m->step && W->m->step->micro_loop ? 1 : microbatches(W->p);
}

uint16_t partition_stage_axes(const Op *loop) { return stage_axes(loop); }

/* "the gradient of blocks.attn.wq (one layer's row)" when stacked result r of loop op is a stacked
 * param's gradient, else NULL. */
static const char *stacked_grad_subject(const Walk *W, const Op *loop, int r) {
  const char *name = loop->results[r]->name; /* autodiff names them grad.PATH */
  if (!W->apply || !name || strncmp(name, "grad.", 5) != 0) return NULL;
  return arena_printf(W->m->arena, "the gradient of %s (one layer's row)", name + 5);
}

/* A loop's carried and invariant values resharded before it to the body's sharding. */
static void walk_loop_head(Walk *W, IrFunc *f, Op *op, double mult, CacheVec *cache) {
  IrFunc *b = op->body;
  /* stacked operands: the body reads each row as the stacked value holds it, and reshards it at
   * its start where it computes with another sharding (a forward loop's saved rows may be partial
   * sums its body left unreduced, which the backward's body reads reduced: issue 18's wrong
   * gradients with the residual stream sharded under microbatches). Inside the body, so that a
   * pipeline's stacked operands stay the forward's results (stages.c). */
  for (int i = 0; i < op->nslices && i < op->noperands && i < b->ninputs; i++) {
    Value *outer = op->operands[i], *in = b->inputs[i];
    if (in->type.rank != outer->type.rank - 1) continue;
    Sharding row;
    memset(&row, 0, sizeof row);
    for (int d = 1; d < outer->type.rank; d++) {
      row.naxes[d - 1] = outer->sharding.naxes[d];
      memcpy(row.axes[d - 1], outer->sharding.axes[d], sizeof row.axes[0]);
    }
    row.partial = outer->sharding.partial;
    if (sharding_equal(&row, &in->sharding, in->type.rank)) continue;
    double trips = op->count > 0 ? (double)op->count : 1;
    if (!W->apply) { /* a dry run: what the reshard of every row costs */
      Reshard rs;
      if (reshard_plan(W->mesh, &in->type, &row, &in->sharding, &rs)) charge(W, rs.time_s, rs.n, mult * trips);
      continue;
    }
    Sharding want = in->sharding;
    in->sharding = row;
    const char *who = WHO(W, "the loop at %s (each iteration reads one row of %s as %s)", where(W, op->loc),
                          value_text(W, outer), shard_text(W, &in->type, &want));
    CacheVec none = {0};
    Op *first = b->first; /* the chain goes before it */
    Value *nv = reshard_value(W, b, first, in, &want, mult * trips, &none, NULL, -1, who, op->loc);
    if (nv == in) {
      in->sharding = want; /* nothing to do after all (a local slice: the readers' Op.in_shard) */
      continue;
    }
    /* the body's readers of the row read the resharded row (the chain just made reads the row) */
    for (Op *o = first; o; o = o->next)
      for (int k = 0; k < o->noperands; k++)
        if (o->operands[k] == in) o->operands[k] = nv;
    for (int k = 0; k < b->noutputs; k++)
      if (b->outputs[k] == in) b->outputs[k] = nv;
  }
  for (int i = op->nslices; i < op->noperands && i < b->ninputs; i++) {
    Value *outer = op->operands[i], *in = b->inputs[i];
    bool carried = i < op->nslices + op->ncarried;
    const char *who = WHO(W,
                                   "the loop at %s (its %s value %s has one sharding for every iteration: %s)",
                                   where(W, op->loc), carried ? "carried" : "invariant", value_text(W, in),
                                   W->apply ? shard_text(W, &in->type, &in->sharding) : "");
    Value *nv = reshard_value(W, f, op, outer, &in->sharding, mult, cache, NULL, -1, who, op->loc);
    if (W->apply) op->operands[i] = nv;
  }
}

/* The body's end (inner: the body's cache): carried values resharded for the next iteration, a
 * pipeline's stage transfers, stacked rows as their result holds them. */
static void walk_loop_tail(Walk *W, Op *op, double mult, CacheVec *inner) {
  IrFunc *b = op->body;
  double trips = op->count > 0 ? (double)op->count : 1;
  W->phase = op->phase; /* the body's end: carried and stacked values as the loop holds them */
  uint16_t st = stage_axes(op);
  int64_t stages = sharding_axes_product(W->mesh, st);
  for (int r = 0; r < op->ncarried && r < b->noutputs; r++) {
    Value *in = b->inputs[op->nslices + r], *out = b->outputs[r];
    const char *who = WHO(W,
                                   "the next iteration of the loop at %s (carried %s: %s)", where(W, op->loc),
                                   value_text(W, in), W->apply ? shard_text(W, &in->type, &in->sharding) : "");
    Value *nv = reshard_value(W, b, NULL, out, &in->sharding, mult * trips, inner, NULL, -1, who, op->loc);
    if (W->apply) b->outputs[r] = nv;
    if (stages > 1) { /* pipeline: the activations move to the next stage at each stage boundary */
      int mb = microbatches(W->p), pmb = pipe_microbatches(W);
      double bytes = (double)sharding_local_bytes(&in->type, &in->sharding, W->mesh) / pmb;
      double transfers = (double)(stages - 1) * pmb;
      charge(W, cost_collective(W->mesh, COLL_PERMUTE, st, bytes, true, NULL), 1, mult * transfers);
      if (W->apply) {
        int64_t per = op->count / stages > 0 ? op->count / stages : 1;
        const char *why = arena_printf(
            W->m->arena,
            "pipeline: the loop's params shard %s over %s (%lld stages of %lld layers); the carried %s moves to "
            "the %s stage after every %lld layers, %lld transfers per microbatch, %d microbatch%s",
            op->stack_dim ? op->stack_dim->name : "the stacked dim", axes_text(W, st), (long long)stages,
            (long long)per, op->reverse ? arena_printf(W->m->arena, "gradient %s", value_text(W, in)) : value_text(W, in),
            op->reverse ? "previous" : "next", (long long)per, (long long)(stages - 1), mb, mb == 1 ? "" : "es");
        Value *cur = b->outputs[r];
        Op *c = coll_new(W, b, OP_PERMUTE, op->loc, cur, &cur->sharding, st, why);
        c->coll_period = per;
        ir_append(b, c);
        b->outputs[r] = c->results[0];
        c->results[0]->name = cur->name;
      }
    }
  }
  /* stacked outputs: each iteration's row as the stacked result holds it (a partial sum is
   * reduced here, once per iteration: a layer's gradient is all-reduced or reduce-scattered as
   * soon as the backward has made it) */
  for (int r = op->ncarried; r < op->nresults && r < b->noutputs; r++) {
    Value *res = op->results[r], *out = b->outputs[r];
    Sharding want;
    memset(&want, 0, sizeof want);
    for (int d = 1; d < res->type.rank; d++) {
      want.naxes[d - 1] = res->sharding.naxes[d];
      memcpy(want.axes[d - 1], res->sharding.axes[d], sizeof want.axes[0]);
    }
    want.partial = res->sharding.partial;
    /* the stacked result holds the rows as partial sums, but the body's output is now their
     * reduction (its later readers read the reduced value, take_replaced): stack the partial sum
     * the body made, as propagation planned (a reduced value cannot be made partial again) */
    const Op *red = out->def;
    if ((want.partial & ~out->sharding.partial) && red && red->func == b && red->noperands == 1 &&
        (red->kind == OP_ALL_REDUCE || red->kind == OP_REDUCE_SCATTER) &&
        sharding_equal(&red->operands[0]->sharding, &want, out->type.rank)) {
      if (W->apply) b->outputs[r] = red->operands[0];
      out = red->operands[0];
    }
    const char *who = WHO(W, "the loop at %s, which stacks every iteration's %s into %s%s%s,",
                                   where(W, op->loc), res->name ? "row" : value_text(W, out),
                                   res->name ? res->name : "its result", W->apply ? ", " : "",
                                   W->apply ? shard_text(W, &res->type, &res->sharding) : "");
    W->subject = stacked_grad_subject(W, op, r);
    Value *nv = reshard_value(W, b, NULL, out, &want, mult * trips, inner, NULL, -1, who, op->loc);
    W->subject = NULL;
    if (W->apply) b->outputs[r] = nv;
  }
}

static void walk_loop(Walk *W, IrFunc *f, Op *op, double mult, CacheVec *cache) {
  IrFunc *b = op->body;
  if (!b) return;
  double trips = op->count > 0 ? (double)op->count : 1;
  walk_loop_head(W, f, op, mult, cache);
  CacheVec inner = {0};
  walk_func(W, b, mult * trips, &inner);
  walk_loop_tail(W, op, mult, &inner);
  op->partitioned = W->apply;
}

/* route fills each expert's slots in order of the token dim within a group: the tokens a group
 * sends must be on one device. A token dim the logits hold sharded is an error (language.md), not
 * a gather; counted as one in a dry run, so propagation keeps it whole where it can. */
static void route_tokens_whole(Walk *W, const Op *op) {
  if (op->noperands != 1 || op->ndims < 3) return;
  const Value *l = op->operands[0];
  int d = tensor_type_find(&l->type, op->dims[1]);
  if (d < 0) return;
  uint16_t ax = 0;
  for (int k = 0; k < l->sharding.naxes[d]; k++) ax |= (uint16_t)(1u << l->sharding.axes[d][k]);
  if (sharding_axes_product(W->mesh, ax) <= 1) return;
  W->cost.errors++;
  if (!W->apply) return;
  diag_error(op->loc,
             "route reads %s with its tokens dim %s sharded over %s (from %s), but route fills each expert's "
             "slots in order of %s, so every token of a group must be on one device; leave %s unsharded here "
             "(shard the groups, the other dims of the logits, instead)",
             value_text(W, l), op->dims[1]->name, axes_text(W, ax), dim_origin(W, l, d), op->dims[1]->name,
             op->dims[1]->name);
  W->errors++;
}

static void walk_op(Walk *W, IrFunc *f, Op *op, double mult, CacheVec *cache) {
  if (W->apply) take_replaced(W, op->operands, op->noperands);
  if (op->partitioned || ir_op_is_collective(op->kind)) return;
  W->phase = op->phase;
  if (op->kind == OP_LOOP) {
    walk_loop(W, f, op, mult, cache);
    return;
  }
  if (op->kind == OP_ROUTE) route_tokens_whole(W, op);
  if (op->kind == OP_SPLIT || op->kind == OP_MERGE) walk_reshape(W, f, op, mult, cache);
  else if (op->plan && op->plan->factored) walk_factored(W, f, op, mult, cache);
  else if (op->nresults == 1 && op->noperands > 0) walk_replicated(W, f, op, mult, cache);
  if (W->apply) op->partitioned = true;
}

static void walk_func(Walk *W, IrFunc *f, double mult, CacheVec *cache) {
  Op *next;
  for (Op *op = f->first; op; op = next) {
    next = op->next;
    walk_op(W, f, op, mult, cache);
  }
  if (W->apply) take_replaced(W, f->outputs, f->noutputs);
}

/* The entry's outputs take its written return type (ir_build already made them carry it; this
 * only matters for values the search pinned). A train step's outputs carry their written types
 * (params, optimizer state) but the loss: every device returns it whole, so a partial loss (a mean
 * over a sharded batch) is all-reduced here, one scalar. */
static void walk_outputs(Walk *W, CacheVec *cache) {
  IrFunc *f = W->m->main;
  const FnDecl *fn = W->p->entry;
  if (!fn) return;
  for (int i = 0; i < f->noutputs; i++) {
    Value *v = f->outputs[i];
    if (!v || v->spec) continue;
    W->phase = v->def ? v->def->phase : PHASE_FORWARD;
    if (W->m->step) {
      Sharding none;
      memset(&none, 0, sizeof none);
      const char *who = WHO(W, "the step's output %s (every device returns it whole)",
                                     value_text(W, v));
      Value *nv = reshard_value(W, f, NULL, v, &none, 1, cache, NULL, -1, who, v->def ? v->def->loc : fn->loc);
      if (W->apply) f->outputs[i] = nv;
      continue;
    }
    Sharding s, t;
    ShardOrigin o;
    if (!layout_apply(W->p, &fn->ret, &s, &o)) continue;
    memset(&t, 0, sizeof t);
    for (int a = 0; a < v->type.rank; a++)
      for (int b = 0; b < fn->ret.rank; b++)
        if (fn->ret.dims[b] == v->type.dims[a]) t.naxes[a] = s.naxes[b], memcpy(t.axes[a], s.axes[b], sizeof s.axes[b]);
    const char *who = WHO(W, "the return type (%s)", where(W, fn->ret.loc));
    Value *nv = reshard_value(W, f, NULL, v, &t, 1, cache, NULL, -1, who, fn->ret.loc);
    if (W->apply) f->outputs[i] = nv;
  }
}

static void walk_module(Walk *W) {
  CacheVec cache = {0};
  walk_func(W, W->m->main, 1, &cache);
  walk_outputs(W, &cache);
}

PartCost partition_cost(const IrModule *m, const Program *p) {
  PartCost c = {0};
  if (!m || !m->main || !p || !p->mesh) return c;
  Arena tmp;
  arena_init(&tmp);
  Walk W = {.m = (IrModule *)m, .p = p, .mesh = p->mesh, .apply = false, .tmp = &tmp};
  walk_module(&W);
  arena_free(&tmp);
  return W.cost;
}

/* ---- the ledger: partition_cost kept up to date unit by unit ----
 *
 * The dry walk adds up, per op of main in program order (a unit: a loop with its whole body is
 * one; main's outputs are the last), the op's own collectives and the reshards of its operands,
 * each distinct reshard of a value (value, target, phase) charged once: main's cache. The ledger
 * keeps each unit's own cost and the reshard keys it asked for, every key with the count of units
 * asking for it; the total is the units' costs plus the cost of every key asked for. When
 * shardings change, only the units that read or write a changed value (or read it through a
 * rename, which reshards its source) are walked again: their old figures are taken out, all of
 * them first, so that a key still asked for is asked for only by units whose values did not
 * change, and its cost still holds, then they are walked again, in program order. A cross
 * entropy and its gradient share a logsumexp through the walk: when either is walked, all of
 * main's are. Sums are in long double, so that the total of many updates stays within rounding
 * of the walk's own sum (tests/unit/test_propagate.c checks it against partition_cost). */

typedef struct LedgerKey {
  const Value *v;
  Sharding to;          /* canonical: dims past the value's rank and axes past naxes zero */
  int phase;            /* phase_class */
  int refs;             /* units asking for it */
  double time_s, count; /* its reshard's, charged while refs > 0 */
  uint64_t hash;
  VEC(int) askers;      /* the units asking for it (refs of them, repeats kept) */
  int at;               /* the first of them in the walk's order, where `prefix` counts its time; -1 */
  double at_time_s;     /* the time `prefix` holds for it at `at` */
  /* reshard_plan's answer for the value's sharding `from` (a trial and its undo alternate): */
  bool planned, plan_ok;
  Sharding from;
  double plan_time_s, plan_n; /* the reshard's, before the walk's multiplier */
} LedgerKey;

typedef VEC(LedgerKey *) KeyVec;
typedef VEC(int) IntVec;

enum { LU_OP, LU_HEAD, LU_TAIL, LU_OUTPUTS };

/* One unit of the walk: an op of any function, a loop's head (its operands resharded, in the
 * loop's function) or tail (its body's end), or main's outputs. */
typedef struct LedgerUnit {
  Op *op;
  IrFunc *f;            /* the function it is walked in (a tail: the loop's) */
  uint8_t kind;         /* LU_* */
  int tail;             /* a head: its tail */
  double mult;          /* the walk's multiplier there (loop bodies: their trips) */
} LedgerUnit;

struct PartLedger {
  IrModule *m;
  const Program *p;
  Arena a;
  LedgerUnit *unit;     /* in program order, loop bodies between their head and tail; the last
                           stands for main's outputs */
  int n;
  const Op **okey;      /* op -> unit, open addressing */
  int *oval;
  size_t ocap;
  int nvalues;
  IntVec *users;        /* by value id: the units reading it (a loop's: its head; a body's inputs and
                           outputs: the tail too) */
  int *def_unit;        /* by value id: the unit making it (a loop result: its tail), or -1 */
  bool *is_output;      /* by value id: an output of main */
  PartCost *own;        /* by unit: its collectives but main's cached reshards */
  KeyVec *req;          /* by unit: the keys it asked for */
  bool *is_ce;          /* by unit: a cross entropy or its gradient */
  bool any_ce;
  LedgerKey **slot;     /* keys, open addressing */
  size_t cap, len;
  bool *dirty;
  IntVec list;
  long double *prefix;  /* Fenwick tree over units: each unit's own time, and each asked-for key's
                           time at the first unit asking for it (partition_ledger_bound_before) */
  CacheVec cache;       /* never filled: stands for every function's cache in the ledger's walks */
  int cur;              /* the unit being walked */
  long double time_s, count;
  long errors;
  long walked;          /* units walked (statistics) */
  /* a trial's undo log (partition_ledger_begin .. rollback): each unit walked again, with its
   * figures and keys before; each key whose cost a walk set anew */
  bool logging;
  VEC(struct LedgerUndo) undo;
  KeyVec undo_keys;     /* the old keys of the units in `undo`, one run each */
  VEC(struct KeyCost) undo_costs;
  long double saved_time_s, saved_count;
  long saved_errors;
};

typedef struct LedgerUndo {
  int unit;
  PartCost own;
  int first, n;         /* its old keys: undo_keys[first .. first + n) */
} LedgerUndo;

typedef struct KeyCost {
  LedgerKey *e;
  double time_s, count;
} KeyCost;

static uint64_t ledger_hash(const LedgerKey *k) {
  uint64_t h = (uint64_t)(uintptr_t)k->v * 0x9e3779b97f4a7c15ull ^ (uint64_t)k->phase;
  const unsigned char *b = (const unsigned char *)&k->to;
  for (size_t i = 0; i < sizeof k->to; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h ^ (h >> 31);
}

static size_t ledger_op_slot(const PartLedger *L, const Op *op) {
  uint64_t x = (uint64_t)(uintptr_t)op;
  x = (x ^ (x >> 31)) * 0x9e3779b97f4a7c15ull;
  size_t j = (size_t)(x ^ (x >> 29)) & (L->ocap - 1);
  while (L->okey[j] && L->okey[j] != op) j = (j + 1) & (L->ocap - 1);
  return j;
}

static int ledger_unit_of(const PartLedger *L, const Op *op) {
  if (!op) return -1;
  size_t j = ledger_op_slot(L, op);
  return L->okey[j] ? L->oval[j] : -1;
}

static void ledger_grow(PartLedger *L) {
  size_t ncap = L->cap ? 2 * L->cap : 1024;
  LedgerKey **ns = ARENA_ARRAY(&L->a, LedgerKey *, ncap);
  for (size_t i = 0; i < L->cap; i++) {
    LedgerKey *k = L->slot[i];
    if (!k) continue;
    size_t j = (size_t)k->hash & (ncap - 1);
    while (ns[j]) j = (j + 1) & (ncap - 1);
    ns[j] = k;
  }
  L->slot = ns;
  L->cap = ncap;
}

/* ---- what the units before a point are charged, by prefix (a Fenwick tree over units 0..n) ---- */

static void prefix_add(PartLedger *L, int u, long double d) {
  for (int i = u + 1; i <= L->n + 1; i += i & -i) L->prefix[i] += d;
}

static long double prefix_before(const PartLedger *L, int u) { /* units 0 .. u-1 */
  long double s = 0;
  for (int i = u; i > 0; i -= i & -i) s += L->prefix[i];
  return s;
}

/* Moves e's time in `prefix` to the first unit now asking for it (none: out), at its time now. */
static void key_place(PartLedger *L, LedgerKey *e) {
  int at = -1;
  for (int i = 0; i < e->askers.len; i++)
    if (at < 0 || e->askers.data[i] < at) at = e->askers.data[i];
  if (at == e->at && (at < 0 || e->time_s == e->at_time_s)) return;
  if (e->at >= 0) prefix_add(L, e->at, -(long double)e->at_time_s);
  if (at >= 0) prefix_add(L, at, e->time_s);
  e->at = at;
  e->at_time_s = e->time_s;
}

static void key_ask(PartLedger *L, LedgerKey *e, int u) {
  e->refs++;
  VEC_PUSH(&L->a, e->askers, u);
  key_place(L, e);
}

static void key_release(PartLedger *L, LedgerKey *e, int u) {
  e->refs--;
  for (int i = 0; i < e->askers.len; i++)
    if (e->askers.data[i] == u) {
      e->askers.data[i] = e->askers.data[--e->askers.len];
      break;
    }
  key_place(L, e);
}

/* reshard_value on main's cache, in a ledger's walk: the key asked for (a rename's source's, as
 * reshard_value resolves it), charged to the ledger when no unit asked for it yet. */
static Value *ledger_reshard(Walk *W, IrFunc *f, Value *v, const Sharding *to, double mult) {
  PartLedger *L = W->ledger;
  const Op *rn = v->def;
  if (rn && rn->kind == OP_RENAME && rn->func == f && rn->noperands == 1 && rn->operands[0]->func == f &&
      sharding_equal(&rn->operands[0]->sharding, &v->sharding, v->type.rank)) {
    Value *u = rn->operands[0];
    if (!sharding_equal(&u->sharding, to, v->type.rank)) ledger_reshard(W, f, u, to, mult);
    return v;
  }
  LedgerKey k;
  memset(&k, 0, sizeof k);
  k.v = v;
  k.phase = phase_class(W->phase);
  k.to.partial = to->partial;
  for (int d = 0; d < v->type.rank && d < MAX_RANK; d++) {
    k.to.naxes[d] = to->naxes[d];
    memcpy(k.to.axes[d], to->axes[d], to->naxes[d]);
  }
  k.hash = ledger_hash(&k);
  LedgerKey *e = NULL;
  /* a unit walked again mostly asks for what it asked for before, in the same order: the key its
   * last walk left in this place of its list (the list is emptied, not cleared) comes first */
  const KeyVec *r = &L->req[L->cur];
  LedgerKey *x = r->len < r->cap ? r->data[r->len] : NULL;
  if (x && x->hash == k.hash && x->v == v && x->phase == k.phase && memcmp(&x->to, &k.to, sizeof k.to) == 0) e = x;
  if (!e && L->cap)
    for (size_t j = (size_t)k.hash & (L->cap - 1); L->slot[j]; j = (j + 1) & (L->cap - 1)) {
      LedgerKey *x = L->slot[j];
      if (x->hash == k.hash && x->v == v && x->phase == k.phase && memcmp(&x->to, &k.to, sizeof k.to) == 0) {
        e = x;
        break;
      }
    }
  if (!e || e->refs == 0) {
    Reshard rs;
    if (e && e->planned && memcmp(&e->from, &v->sharding, sizeof v->sharding) == 0) {
      if (!e->plan_ok) return v;
      rs.time_s = e->plan_time_s;
      rs.n = (int)e->plan_n;
    } else {
      bool ok = reshard_plan(W->mesh, &v->type, &v->sharding, to, &rs);
      if (e) {
        e->planned = true;
        e->plan_ok = ok;
        e->from = v->sharding;
        e->plan_time_s = ok ? rs.time_s : 0;
        e->plan_n = ok ? rs.n : 0;
      }
      if (!ok) return v;
    }
    if (e && L->logging) VEC_PUSH(&L->a, L->undo_costs, ((KeyCost){e, e->time_s, e->count}));
    if (!e) {
      if (2 * (L->len + 1) > L->cap) ledger_grow(L);
      e = ARENA_NEW(&L->a, LedgerKey);
      *e = k;
      e->at = -1;
      e->planned = e->plan_ok = true;
      e->from = v->sharding;
      e->plan_time_s = rs.time_s;
      e->plan_n = rs.n;
      size_t j = (size_t)k.hash & (L->cap - 1);
      while (L->slot[j]) j = (j + 1) & (L->cap - 1);
      L->slot[j] = e;
      L->len++;
    }
    e->time_s = rs.time_s * mult;
    e->count = rs.n * mult;
    L->time_s += e->time_s;
    L->count += e->count;
  }
  key_ask(L, e, L->cur);
  VEC_PUSH(&L->a, L->req[L->cur], e);
  return v;
}

static void ledger_mark(PartLedger *L, int u) {
  if (u < 0 || u > L->n || L->dirty[u]) return;
  L->dirty[u] = true;
  VEC_PUSH(&L->a, L->list, u);
}

/* The units that read v, and through renames of it (reshard_value reshards a rename's source). */
static void ledger_mark_users(PartLedger *L, const Value *v, int depth) {
  if (!v || v->id < 0 || v->id >= L->nvalues || depth > 64) return;
  if (L->is_output[v->id]) ledger_mark(L, L->n);
  for (int i = 0; i < L->users[v->id].len; i++) {
    int u = L->users[v->id].data[i];
    ledger_mark(L, u);
    const Op *op = u < L->n && L->unit[u].kind == LU_OP ? L->unit[u].op : NULL;
    if (op && op->kind == OP_RENAME && op->nresults == 1) ledger_mark_users(L, op->results[0], depth + 1);
  }
}

static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

/* Takes the marked units' figures out, all of them, then walks them again in program order. */
static void ledger_rewalk(PartLedger *L) {
  if (L->any_ce)
    for (int i = 0; i < L->list.len; i++)
      if (L->is_ce[L->list.data[i]]) {
        for (int u = 0; u < L->n; u++)
          if (L->is_ce[u]) ledger_mark(L, u);
        break;
      }
  qsort(L->list.data, (size_t)L->list.len, sizeof(int), cmp_int);
  for (int i = 0; i < L->list.len; i++) {
    int u = L->list.data[i];
    if (L->logging) {
      LedgerUndo un = {.unit = u, .own = L->own[u], .first = L->undo_keys.len, .n = L->req[u].len};
      VEC_PUSH(&L->a, L->undo, un);
      for (int k = 0; k < L->req[u].len; k++) VEC_PUSH(&L->a, L->undo_keys, L->req[u].data[k]);
    }
    L->time_s -= L->own[u].time_s;
    L->count -= L->own[u].count;
    L->errors -= L->own[u].errors;
    prefix_add(L, u, -(long double)L->own[u].time_s);
    for (int k = 0; k < L->req[u].len; k++) {
      LedgerKey *e = L->req[u].data[k];
      key_release(L, e, u);
      if (e->refs > 0) continue;
      L->time_s -= e->time_s;
      L->count -= e->count;
    }
    L->req[u].len = 0;
  }
  Arena tmp;
  arena_init(&tmp);
  Walk W = {.m = L->m, .p = L->p, .mesh = L->p->mesh, .apply = false, .tmp = &tmp, .ledger = L};
  for (int i = 0; i < L->list.len; i++) {
    int u = L->list.data[i];
    L->cur = u;
    W.cost = (PartCost){0};
    const LedgerUnit *lu = &L->unit[u];
    if (lu->kind == LU_OUTPUTS) {
      walk_outputs(&W, &L->cache);
    } else if (lu->kind == LU_OP) {
      walk_op(&W, lu->f, lu->op, lu->mult, &L->cache);
    } else if (!lu->op->partitioned) {
      W.phase = lu->op->phase;
      if (lu->kind == LU_HEAD) walk_loop_head(&W, lu->f, lu->op, lu->mult, &L->cache);
      else walk_loop_tail(&W, lu->op, lu->mult, &L->cache);
    }
    L->own[u] = W.cost;
    prefix_add(L, u, W.cost.time_s);
    L->time_s += W.cost.time_s;
    L->count += W.cost.count;
    L->errors += W.cost.errors;
    L->dirty[u] = false;
    L->walked++;
  }
  L->list.len = 0;
  arena_free(&tmp);
}

static int ledger_count(const IrFunc *f) {
  int n = 0;
  for (const Op *op = f->first; op; op = op->next) n += op->kind == OP_LOOP && op->body ? 2 + ledger_count(op->body) : 1;
  return n;
}

static void ledger_user(PartLedger *L, const Value *v, int u) {
  IntVec *uv = v && v->id >= 0 && v->id < L->nvalues ? &L->users[v->id] : NULL;
  if (uv && (!uv->len || uv->data[uv->len - 1] != u)) VEC_PUSH(&L->a, *uv, u);
}

static void ledger_def(PartLedger *L, const Value *v, int u) {
  if (v && v->id >= 0 && v->id < L->nvalues) L->def_unit[v->id] = u;
}

static int ledger_add(PartLedger *L, Op *op, IrFunc *f, int kind, double mult) {
  L->unit[L->n] = (LedgerUnit){.op = op, .f = f, .kind = (uint8_t)kind, .tail = -1, .mult = mult};
  L->is_ce[L->n] = kind == LU_OP && (op->kind == OP_CROSS_ENTROPY || op->kind == OP_CROSS_ENTROPY_GRAD);
  L->any_ce |= L->is_ce[L->n];
  return L->n++;
}

/* f's units, in the walk's order, with their users and defining units. */
static void ledger_func(PartLedger *L, IrFunc *f, double mult) {
  for (Op *op = f->first; op; op = op->next) {
    bool loop = op->kind == OP_LOOP && op->body;
    int u = ledger_add(L, op, f, loop ? LU_HEAD : LU_OP, mult);
    size_t j = ledger_op_slot(L, op);
    L->okey[j] = op;
    L->oval[j] = u;
    for (int k = 0; k < op->noperands; k++) ledger_user(L, op->operands[k], u);
    if (!loop) {
      for (int r = 0; r < op->nresults; r++) ledger_def(L, op->results[r], u);
      continue;
    }
    IrFunc *b = op->body;
    for (int i = 0; i < b->ninputs; i++) ledger_user(L, b->inputs[i], u), ledger_def(L, b->inputs[i], u);
    ledger_func(L, b, mult * (op->count > 0 ? (double)op->count : 1));
    int t = ledger_add(L, op, f, LU_TAIL, mult);
    L->unit[u].tail = t;
    for (int i = 0; i < b->ninputs; i++) ledger_user(L, b->inputs[i], t);
    for (int i = 0; i < b->noutputs; i++) ledger_user(L, b->outputs[i], t);
    for (int r = 0; r < op->nresults; r++) ledger_user(L, op->results[r], t), ledger_def(L, op->results[r], t);
  }
}

PartLedger *partition_ledger_new(IrModule *m, const Program *p) {
  if (!m || !m->main || !p || !p->mesh) return NULL;
  PartLedger *L = calloc(1, sizeof *L);
  if (!L) abort();
  L->m = m;
  L->p = p;
  arena_init(&L->a);
  int n = ledger_count(m->main);
  L->unit = ARENA_ARRAY(&L->a, LedgerUnit, n + 1);
  L->ocap = 16;
  while (L->ocap < 2 * (size_t)n + 2) L->ocap *= 2;
  L->okey = ARENA_ARRAY(&L->a, const Op *, L->ocap);
  L->oval = ARENA_ARRAY(&L->a, int, L->ocap);
  L->nvalues = m->nvalues > 0 ? m->nvalues : 1;
  L->users = ARENA_ARRAY(&L->a, IntVec, L->nvalues);
  L->def_unit = ARENA_ARRAY(&L->a, int, L->nvalues);
  for (int i = 0; i < L->nvalues; i++) L->def_unit[i] = -1;
  L->is_output = ARENA_ARRAY(&L->a, bool, L->nvalues);
  L->own = ARENA_ARRAY(&L->a, PartCost, n + 1);
  L->req = ARENA_ARRAY(&L->a, KeyVec, n + 1);
  L->is_ce = ARENA_ARRAY(&L->a, bool, n + 1);
  L->dirty = ARENA_ARRAY(&L->a, bool, n + 1);
  L->prefix = ARENA_ARRAY(&L->a, long double, n + 2);
  ledger_func(L, m->main, 1);
  L->unit[L->n] = (LedgerUnit){.kind = LU_OUTPUTS, .f = m->main, .tail = -1, .mult = 1};
  for (int k = 0; k < m->main->noutputs; k++) {
    const Value *v = m->main->outputs[k];
    if (v && v->id >= 0 && v->id < L->nvalues) L->is_output[v->id] = true;
  }
  for (int u = 0; u <= L->n; u++) ledger_mark(L, u);
  ledger_rewalk(L);
  return L;
}

void partition_ledger_update(PartLedger *L, Op *const *ops, int nops, Value *const *vals, int nvals) {
  if (!L) return;
  for (int i = 0; i < nops; i++) {
    int u = ledger_unit_of(L, ops[i]);
    ledger_mark(L, u);
    if (u >= 0 && L->unit[u].kind == LU_HEAD) ledger_mark(L, L->unit[u].tail);
  }
  for (int i = 0; i < nvals; i++) {
    const Value *v = vals[i];
    if (!v || v->id < 0 || v->id >= L->nvalues) continue;
    ledger_mark(L, L->def_unit[v->id]);
    ledger_mark_users(L, v, 0);
  }
  ledger_rewalk(L);
}

void partition_ledger_begin(PartLedger *L) {
  if (!L) return;
  L->logging = true;
  L->undo.len = L->undo_keys.len = L->undo_costs.len = 0;
  L->saved_time_s = L->time_s;
  L->saved_count = L->count;
  L->saved_errors = L->errors;
}

void partition_ledger_commit(PartLedger *L) {
  if (!L) return;
  L->logging = false;
  L->undo.len = L->undo_keys.len = L->undo_costs.len = 0;
}

void partition_ledger_rollback(PartLedger *L) {
  if (!L || !L->logging) return;
  for (int i = L->undo.len - 1; i >= 0; i--) {
    const LedgerUndo *un = &L->undo.data[i];
    KeyVec *r = &L->req[un->unit];
    for (int k = 0; k < r->len; k++) key_release(L, r->data[k], un->unit);
    r->len = 0;
    for (int k = 0; k < un->n; k++) {
      LedgerKey *e = L->undo_keys.data[un->first + k];
      key_ask(L, e, un->unit);
      VEC_PUSH(&L->a, *r, e);
    }
    prefix_add(L, un->unit, (long double)un->own.time_s - L->own[un->unit].time_s);
    L->own[un->unit] = un->own;
  }
  for (int i = L->undo_costs.len - 1; i >= 0; i--) {
    const KeyCost *kc = &L->undo_costs.data[i];
    kc->e->time_s = kc->time_s;
    kc->e->count = kc->count;
    key_place(L, kc->e);
  }
  L->time_s = L->saved_time_s;
  L->count = L->saved_count;
  L->errors = L->saved_errors;
  partition_ledger_commit(L);
}

PartCost partition_ledger_cost(const PartLedger *L) {
  PartCost c = {0};
  if (!L) return c;
  c.time_s = (double)L->time_s;
  c.count = (double)L->count;
  c.errors = (int)L->errors;
  return c;
}

long partition_ledger_walked(const PartLedger *L) { return L ? L->walked : 0; }

/* What the units before op are charged: their own collectives, and each reshard one of them asks
 * for, once. It depends on those units alone, and the total is at least that much. */
double partition_ledger_bound_before(const PartLedger *L, const Op *op) {
  if (!L) return 0;
  if (!op) return (double)L->time_s;
  int u = ledger_unit_of(L, op);
  if (u < 0) return 0;
  return (double)prefix_before(L, u);
}

/* partition_ledger_bound_before for every op of main, against the same sum made unit by unit. */
bool partition_ledger_bound_audit(const PartLedger *L) {
  if (!L) return true;
  long double sum = 0, tol = 1e-12 + 1e-9 * (double)L->time_s;
  size_t cap = 16;
  while (cap < 2 * L->len + 2) cap *= 2;
  const LedgerKey **seen = calloc(cap, sizeof *seen); /* keys counted, open addressing */
  if (!seen) abort();
  bool ok = true;
  for (int u = 0; u < L->n && ok; u++) {
    if (L->unit[u].f == L->m->main && (L->unit[u].kind == LU_OP || L->unit[u].kind == LU_HEAD) &&
        fabsl(sum - (long double)partition_ledger_bound_before(L, L->unit[u].op)) > tol)
      ok = false;
    sum += L->own[u].time_s;
    for (int k = 0; k < L->req[u].len; k++) {
      const LedgerKey *e = L->req[u].data[k];
      size_t j = (size_t)e->hash & (cap - 1);
      while (seen[j] && seen[j] != e) j = (j + 1) & (cap - 1);
      if (!seen[j]) seen[j] = e, sum += e->time_s;
    }
  }
  free(seen);
  return ok;
}

void partition_ledger_free(PartLedger *L) {
  if (!L) return;
  arena_free(&L->a);
  free(L);
}

/* ---- reductions after a sum: one instead of two ----
 *
 * add(R(a), R(b)), where R is the same AllReduce or ReduceScatter of two equally partial values
 * read by nothing else, is R(add(a, b)): the partial sums are added first (an add is linear), and
 * one collective of the same bytes replaces two. The backward of attention meets this where the
 * gradients of q, k and v's projections reach the same input (Megatron-SP reduce-scatters them
 * once). A reduction seen through a rename (a key gradient renamed back to the sequence) is the
 * rename of the reduction of the renamed partial sum; and add(add(c, R(a)), R(b)), a parallel
 * block's x + attention + MLP, is add(c, R(add(a, b))). Since the layout binds every value, each
 * contraction's result is reduced where it is made (its bound dims take the summed axes): this
 * is what puts the reductions of a sum back together.
 *
 * One walk per round over each function, O(ops): uses are counted once per round, a replaced
 * result is mapped to its replacement as later readers are met, inserted ops are spliced before
 * the current one, and the ops made dead are unlinked at the round's end. Rounds repeat until
 * nothing changes (a sum of three reduces once after two). */

typedef struct Sinker {
  IrModule *m;
  IrFunc *f;
  int nv;               /* value ids below this are counted in uses */
  int *uses;            /* by value id: readers in f (ops' operands, f's outputs) */
  Value **repl;         /* by value id: the value that replaced it */
  uint8_t *dead;        /* by value id of an op's first result: the op goes at the round's end */
  Op *prev;             /* the op before the current one (where new ops are spliced) */
} Sinker;

static int sink_uses(const Sinker *S, const Value *v) { return v->id >= 0 && v->id < S->nv ? S->uses[v->id] : -1; }

static void sink_kill(Sinker *S, const Op *op) {
  if (op->nresults > 0 && op->results[0]->id >= 0 && op->results[0]->id < S->nv) S->dead[op->results[0]->id] = 1;
}

static bool sink_is_dead(const Sinker *S, const Op *op) {
  return op->nresults > 0 && op->results[0]->id >= 0 && op->results[0]->id < S->nv && S->dead[op->results[0]->id];
}

/* v as a reduction read by nothing else: the reduction op, and the rename v is of it (or NULL). */
typedef struct SinkArm {
  Op *red, *ren;
} SinkArm;

static bool sink_arm(const Sinker *S, Value *v, SinkArm *arm) {
  Op *d = v->def;
  arm->red = arm->ren = NULL;
  if (!d || d->func != S->f || sink_is_dead(S, d) || sink_uses(S, v) != 1) return false;
  if (d->kind == OP_RENAME && d->noperands == 1) {
    Value *u = d->operands[0];
    Op *r = u->def;
    if (!r || r->func != S->f || sink_is_dead(S, r) || sink_uses(S, u) != 1) return false;
    /* a view only: a rename that also slices (its result a finer block than its operand, issue
     * 18's seed ci case 72) is not the reduction's result renamed, and the one reduction built
     * from the arms would produce the rename's blocks (localize: "its axes are not the axes its
     * shardings move") */
    if (!sharding_equal(&u->sharding, &v->sharding, v->type.rank)) return false;
    arm->ren = d;
    d = r;
  }
  if ((d->kind != OP_ALL_REDUCE && d->kind != OP_REDUCE_SCATTER) || d->reduce_max || d->noperands != 1) return false;
  arm->red = d;
  return true;
}

/* The value an arm stands for: its reduction's result, renamed. */
static const Value *arm_out(const SinkArm *a) { return a->ren ? a->ren->results[0] : a->red->results[0]; }

static bool same_arms(const SinkArm *x, const SinkArm *y) {
  const Value *a = x->red->operands[0], *b = y->red->operands[0], *ra = arm_out(x), *rb = arm_out(y);
  int rank = ra->type.rank;
  return x->red->kind == y->red->kind && x->red->axes == y->red->axes && a->partial_max == b->partial_max &&
         tensor_type_equal(&ra->type, &rb->type) && a->type.rank == rank && b->type.rank == rank &&
         sharding_equal(&a->sharding, &b->sharding, rank) && sharding_equal(&ra->sharding, &rb->sharding, rank);
}

static void sink_splice(Sinker *S, Op *before, Op *op) {
  op->func = S->f;
  op->next = before;
  if (S->prev) S->prev->next = op;
  else S->f->first = op;
  S->prev = op;
}

/* The partial sum an arm reduces, as the arm's result names its dims (renamed where it was). */
static Value *arm_partial(Sinker *S, const SinkArm *a, Op *before) {
  Value *x = a->red->operands[0];
  if (!a->ren) return x;
  Op *r = ir_op_new(S->m, S->f, OP_RENAME, a->ren->loc, &x, 1, &a->ren->results[0]->type, 1);
  r->dims = a->ren->dims;
  r->ndims = a->ren->ndims;
  r->phase = a->ren->phase;
  r->partitioned = true;
  Value *y = r->results[0];
  y->sharding = x->sharding;
  y->partial_max = x->partial_max;
  y->shard_source = SHARD_PROPAGATED;
  y->partial_loc = x->partial_loc;
  sink_splice(S, before, r);
  return y;
}

/* R(add(a, b)) before `before`, its result taking `like`'s identity: returns the reduced value. */
static Value *sink_build(Sinker *S, const SinkArm *x, const SinkArm *y, Op *before, const Value *like) {
  Value *ab[2] = {arm_partial(S, x, before), arm_partial(S, y, before)};
  const Op *R = x->red;
  Op *add = ir_op_new(S->m, S->f, OP_ADD, before->loc, ab, 2, &ab[0]->type, 1);
  add->phase = before->phase;
  add->partitioned = true;
  Value *sum = add->results[0];
  sum->sharding = ab[0]->sharding;
  sum->partial_max = false;
  sum->shard_source = SHARD_PROPAGATED;
  sum->partial_loc = ab[0]->partial_loc;
  sink_splice(S, before, add);
  Op *red = ir_op_new(S->m, S->f, R->kind, R->loc, &sum, 1, &like->type, 1);
  red->phase = R->phase;
  red->axes = R->axes;
  red->dim_index = R->dim_index;
  red->dim_index2 = R->dim_index2;
  red->partitioned = true;
  red->reason = arena_printf(S->m->arena, "%s; the gradients that reach it from several ops are added first and "
                             "reduced once", R->reason ? R->reason : "a partial sum");
  Value *r = red->results[0];
  r->sharding = arm_out(x)->sharding;
  r->shard_source = SHARD_PROPAGATED;
  memcpy(r->dim_src, arm_out(x)->dim_src, sizeof r->dim_src);
  memcpy(r->dim_loc, arm_out(x)->dim_loc, sizeof r->dim_loc);
  sink_splice(S, before, red);
  sink_kill(S, x->red), sink_kill(S, y->red);
  if (x->ren) sink_kill(S, x->ren);
  if (y->ren) sink_kill(S, y->ren);
  return r;
}

static void sink_replace(Sinker *S, Op *op, Value *r) {
  Value *old = op->results[0];
  r->name = old->name;
  r->spec = old->spec;
  r->shard_source = old->shard_source;
  memcpy(r->dim_src, old->dim_src, sizeof r->dim_src);
  memcpy(r->dim_loc, old->dim_loc, sizeof r->dim_loc);
  if (old->id >= 0 && old->id < S->nv) S->repl[old->id] = r;
  sink_kill(S, op);
}

static Value *sink_resolve(const Sinker *S, Value *v) {
  while (v && v->id >= 0 && v->id < S->nv && S->repl[v->id]) v = S->repl[v->id];
  return v;
}

/* One round over f (and its loop bodies): how many sums it reduced once. */
static int sink_round(IrModule *m, IrFunc *f, Arena *a) {
  int n = 0;
  for (Op *op = f->first; op; op = op->next)
    if (op->kind == OP_LOOP && op->body) n += sink_round(m, op->body, a);
  /* not in a step's microbatch body: there the two sums may come from two pipeline stages (a tied
   * embedding's gradient), each reduced where it is made */
  if (m->step && m->step->micro_loop && m->step->micro_loop->body == f) return n;
  Sinker S = {.m = m, .f = f, .nv = m->nvalues};
  S.uses = ARENA_ARRAY(a, int, S.nv + 1);
  S.repl = ARENA_ARRAY(a, Value *, S.nv + 1);
  S.dead = ARENA_ARRAY(a, uint8_t, S.nv + 1);
  for (const Op *o = f->first; o; o = o->next)
    for (int i = 0; i < o->noperands; i++)
      if (o->operands[i] && o->operands[i]->id >= 0 && o->operands[i]->id < S.nv) S.uses[o->operands[i]->id]++;
  for (int i = 0; i < f->noutputs; i++)
    if (f->outputs[i] && f->outputs[i]->id >= 0 && f->outputs[i]->id < S.nv) S.uses[f->outputs[i]->id]++;
  int round = 0;
  for (Op *op = f->first; op; S.prev = op, op = op->next) {
    for (int i = 0; i < op->noperands; i++) op->operands[i] = sink_resolve(&S, op->operands[i]);
    if (op->kind != OP_ADD || op->noperands != 2 || sink_is_dead(&S, op)) continue;
    const Value *res = op->results[0];
    SinkArm x, y;
    /* add(R(a), R(b)) */
    if (sink_arm(&S, op->operands[0], &x) && sink_arm(&S, op->operands[1], &y) && x.red != y.red &&
        same_arms(&x, &y) && tensor_type_equal(&res->type, &arm_out(&x)->type) &&
        /* the add must hold the reductions' blocks: where it computes a finer block (reading them
         * sliced), the one reduction would produce that block from a coarser sum (issue 18: a
         * size-1 axis in two rules; localize: "an all_reduce that changes blocks") */
        sharding_equal(&res->sharding, &arm_out(&x)->sharding, res->type.rank)) {
      sink_replace(&S, op, sink_build(&S, &x, &y, op, res));
      round++;
      continue;
    }
    /* add(add(c, R(a)), R(b)) and its mirror images: add(c, R(add(a, b))) */
    for (int k = 0; k < 2; k++) {
      Value *u = op->operands[k];
      Op *inner = u->def;
      if (!sink_arm(&S, op->operands[1 - k], &y) || !inner || inner->func != f || inner->kind != OP_ADD ||
          inner->noperands != 2 || sink_is_dead(&S, inner) || sink_uses(&S, u) != 1)
        continue;
      int j = sink_arm(&S, inner->operands[0], &x) ? 0 : sink_arm(&S, inner->operands[1], &x) ? 1 : -1;
      if (j < 0 || x.red == y.red || !same_arms(&x, &y)) continue;
      Value *c = inner->operands[1 - j];
      if (!tensor_type_equal(&res->type, &arm_out(&x)->type) || !tensor_type_equal(&c->type, &res->type) ||
          !sharding_equal(&c->sharding, &arm_out(&x)->sharding, res->type.rank) ||
          !sharding_equal(&res->sharding, &arm_out(&x)->sharding, res->type.rank)) /* the blocks, as above */
        continue;
      Value *r = sink_build(&S, &x, &y, op, res);
      Value *cr[2] = {c, r};
      Op *add = ir_op_new(m, f, OP_ADD, op->loc, cr, 2, &res->type, 1);
      add->phase = op->phase;
      add->partitioned = true;
      add->results[0]->sharding = res->sharding;
      sink_splice(&S, op, add);
      sink_kill(&S, inner);
      sink_replace(&S, op, add->results[0]);
      round++;
      break;
    }
  }
  for (int i = 0; i < f->noutputs; i++) f->outputs[i] = sink_resolve(&S, f->outputs[i]);
  /* the dead ops unlinked, in one pass */
  Op *prev = NULL;
  for (Op *o = f->first, *next; o; o = next) {
    next = o->next;
    if (!sink_is_dead(&S, o)) {
      prev = o;
      continue;
    }
    if (prev) prev->next = next;
    else f->first = next;
    o->next = NULL;
  }
  f->last = prev;
  return n + round;
}

static int sink_reductions(IrModule *m) {
  Arena a;
  arena_init(&a);
  int n = sink_round(m, m->main, &a);
  arena_free(&a);
  return n;
}

/* A rename whose readers now read the resharded rename of its source (reshard_value) is read by
 * nothing: it goes, so the program a device runs (and explain's table) holds no dead view. */
static void drop_dead_renames(IrFunc *f) {
  for (Op *op = f->first, *next; op; op = next) {
    next = op->next;
    if (op->kind == OP_LOOP && op->body) drop_dead_renames(op->body);
    if (op->kind == OP_RENAME && ir_count_uses(f, op->results[0]) == 0) ir_remove(f, op);
  }
}

bool partition_module(IrModule *m, const Program *p) {
  if (!m || !m->main || !p || !p->mesh) return true;
  Arena tmp;
  arena_init(&tmp);
  Walk W = {.m = m, .p = p, .mesh = p->mesh, .apply = true, .tmp = &tmp};
  walk_module(&W);
  arena_free(&tmp);
  while (W.errors == 0 && sink_reductions(m) > 0) {
  }
  if (W.errors == 0) drop_dead_renames(m->main);
  return W.errors == 0;
}

/* The first pipelined loop of f or of a loop body in it (a step's microbatch loop holds the
 * forward's; the backward's reverse loop over the same stages follows it). */
static const Op *find_pipeline(const IrFunc *f, const Mesh *mesh) {
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind != OP_LOOP) continue;
    if (sharding_axes_product(mesh, stage_axes(op)) > 1) return op;
    const Op *in = op->body ? find_pipeline(op->body, mesh) : NULL;
    if (in) return in;
  }
  return NULL;
}

bool partition_pipeline(const IrModule *m, Pipeline *out) {
  memset(out, 0, sizeof *out);
  if (!m || !m->main || !m->prog || !m->prog->mesh) return false;
  const Op *op = find_pipeline(m->main, m->prog->mesh);
  if (!op) return false;
  out->loop = op;
  out->axes = stage_axes(op);
  out->stages = sharding_axes_product(m->prog->mesh, out->axes);
  out->layers = op->count;
  return true;
}
