/* ir_print.c: the IR as stable text, for tests, golden files and `--emit-ir`.
 *
 *   ir llama.forward
 *   param #0 embedding : bf16[vocab, embed]  @34:9
 *   param #1 blocks.attn_norm.scale : f32[layers, embed]  stacked 1  @...
 *   fn forward
 *     %0 = param #0 embedding : bf16[vocab, embed]  @34:9
 *     %14 = input #0 tokens : i32[batch, seq]  @39:14
 *     %15 = take %0, %14 : bf16[batch, seq, embed]  @40:11  (x)
 *     %40 = loop layers x32 slices(%1, %2) carried(%15) invariant() : bf16[batch, seq, embed]  @41:3
 *       in %41 : f32[embed]  (blocks.attn_norm.scale)
 *       ...
 *       %60 = add %43, %59 : bf16[batch, seq, embed]  @...
 *       yield %60
 *     return %70
 *
 * One op per line: `%id = name operands attributes : result type  @line:col  (source name)`;
 * types show shardings once propagation has set them (sharding_format), and once localisation has
 * run each value's per-device extents (`<4x2048x4096>`) and each op's per-device facts (offsets,
 * divisors, a collective's parts: print_local_facts); loop bodies are indented under their loop,
 * inputs first. Constants print the shortest text that reads back exactly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "route.h"

static void print_number(FILE *out, double x) {
  char buf[64];
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, sizeof buf, "%.*g", prec, x);
    if (strtod(buf, NULL) == x) break;
  }
  fputs(buf, out);
}

static void print_type(FILE *out, const IrModule *m, const Value *v) {
  char buf[512];
  const Mesh *mesh = m->prog ? m->prog->mesh : NULL;
  sharding_format(buf, sizeof buf, &v->type, &v->sharding, mesh);
  fputs(buf, out);
  if (m->localized) { /* the per-device type: each dim's local extent */
    fputs(" <", out);
    for (int i = 0; i < v->type.rank; i++) fprintf(out, "%s%lld", i ? "x" : "", (long long)v->local[i]);
    fputc('>', out);
  }
  if (v->route && v->route->nresults == 1) /* held as k entries per token (route.h) */
    fprintf(out, " entries(%%%d)", v->route->results[0]->id);
}

static void print_dims(FILE *out, Dim *const *dims, int n) {
  fputc('[', out);
  for (int i = 0; i < n; i++) fprintf(out, "%s%s", i ? ", " : "", dims[i] ? dims[i]->name : "?");
  fputc(']', out);
}

static void print_refs(FILE *out, Value *const *vs, int from, int to) {
  for (int i = from; i < to; i++) fprintf(out, "%s%%%d", i > from ? ", " : "", vs[i] ? vs[i]->id : -1);
}

static void print_loc(FILE *out, SrcLoc loc) {
  if (loc.file) fprintf(out, "  @%d:%d", loc.line, loc.col);
}

static void indent(FILE *out, int depth) {
  for (int i = 0; i < depth; i++) fputs("  ", out);
}

static void print_axes(FILE *out, const IrModule *m, uint16_t axes) {
  const Mesh *mesh = m->prog ? m->prog->mesh : NULL;
  fputc('(', out);
  int k = 0;
  for (int a = 0; a < 16; a++) {
    if (!((axes >> a) & 1)) continue;
    if (k++) fputs(", ", out);
    if (mesh && a < mesh->naxes) fputs(mesh->axes[a].name, out);
    else fprintf(out, "#%d", a);
  }
  fputc(')', out);
}

static void print_func(FILE *out, const IrModule *m, const IrFunc *f, int depth);
static void print_action(FILE *out, const PipeAction *a) {
  static const char *const aname[] = {"first", "fwd", "last", "bwd", "first_bwd", "send", "recv"};
  fprintf(out, " %s%s(%d.%d", aname[a->kind], a->kind >= PA_SEND ? (a->backward ? "_grad" : "_act") : "", a->mb, a->chunk);
  if (a->kind >= PA_SEND) fprintf(out, "%s%d", a->kind == PA_SEND ? ">" : "<", a->peer);
  fputc(')', out);
}

static void print_pipeline(FILE *out, const IrModule *m, const PipeInfo *pi, int depth);
static void print_op(FILE *out, const IrModule *m, const Op *op, int depth);

static void print_axis_list(FILE *out, const IrModule *m, const int8_t *axes, int n) {
  const Mesh *mesh = m->prog ? m->prog->mesh : NULL;
  fputc('(', out);
  for (int k = 0; k < n; k++) {
    if (k) fputs(", ", out);
    if (mesh && axes[k] >= 0 && axes[k] < mesh->naxes) fputs(mesh->axes[axes[k]].name, out);
    else fprintf(out, "#%d", axes[k]);
  }
  fputc(')', out);
}

/* What localisation states (localize.h): offsets `at(seq: (model) x512)` (a block of 512 starting
 * at 512 x the device's block number over (model)), a mean's global divisor, a collective's parts
 * in rank order (`gather dim 1 (data)`, `scatter`, `split`/`concat`, a permute's shift), its
 * reduction. */
static void print_local_facts(FILE *out, const IrModule *m, const Op *op) {
  if (op->noffs) {
    fputs(" at(", out);
    for (int k = 0; k < op->noffs; k++) {
      const DimIndex *d = &op->offs[k];
      fprintf(out, "%s%s: ", k ? ", " : "", d->dim ? d->dim->name : "?");
      print_axis_list(out, m, d->axes, d->naxes);
      fprintf(out, " x%lld", (long long)d->extent);
    }
    fputc(')', out);
  }
  if (op->divisor > 0) {
    fputs(" divisor ", out);
    print_number(out, op->divisor);
  }
  /* (each collective's reduction and its parts' verbs are its own) */
  if (op->kind == OP_ALL_REDUCE) fputs(op->reduce_max ? " max" : " sum", out);
  if (op->kind == OP_REDUCE_SCATTER) fputs(" sum", out);
  if (op->coll) {
    static const char *const verb[] = {"gather", "scatter", "", "split", "shift"};
    for (int k = 0; k < op->coll->nparts; k++) {
      const CollDim *p = &op->coll->parts[k];
      const char *v = op->kind == OP_ALL_GATHER ? verb[0] : op->kind == OP_REDUCE_SCATTER ? verb[1]
                      : op->kind == OP_ALL_TO_ALL ? (k == 0 ? verb[3] : "concat") : verb[4];
      if (op->kind == OP_PERMUTE) fprintf(out, " %s %+d ring", v, op->coll->shift);
      else fprintf(out, " %s dim %d", v, p->dim);
      fputc(' ', out);
      print_axis_list(out, m, p->axes, p->naxes);
    }
    if (op->coll_period > 0) fprintf(out, " every %lld trips (pipeline)", (long long)op->coll_period);
    if (op->coll->ngroup) fprintf(out, " group {%d, %d}", op->coll->group[0], op->coll->group[1]);
  }
  if (op->bucket) fprintf(out, " bucket %d", op->bucket);
}

static void print_op(FILE *out, const IrModule *m, const Op *op, int depth) {
  indent(out, depth);
  for (int i = 0; i < op->nresults; i++) fprintf(out, "%s%%%d", i ? ", " : "", op->results[i]->id);
  if (op->nresults) fputs(" = ", out);
  fputs(ir_op_name(op->kind), out);
  /* the operands (or what stands for them), then the attributes: by the table's AttrKind */
  AttrKind at = (AttrKind)ir_op_info(op->kind)->attrs;
  switch (at) {
  case AT_INDEX:
    fprintf(out, " #%d", op->index);
    if (op->nresults && op->results[0]->name) fprintf(out, " %s", op->results[0]->name);
    break;
  case AT_NUMBER:
    fputc(' ', out);
    print_number(out, op->scalar);
    break;
  case AT_LOOP:
    fprintf(out, " %s x%lld slices(", op->stack_dim ? op->stack_dim->name : "?", (long long)op->count);
    print_refs(out, op->operands, 0, op->nslices);
    fputs(") carried(", out);
    print_refs(out, op->operands, op->nslices, op->nslices + op->ncarried);
    fputs(") invariant(", out);
    print_refs(out, op->operands, op->nslices + op->ncarried, op->noperands);
    fputc(')', out);
    if (op->nstacked) fprintf(out, " stacked %d", op->nstacked);
    if (op->reverse) fputs(" reverse", out);
    break;
  default:
    if (op->noperands) fputc(' ', out);
    print_refs(out, op->operands, 0, op->noperands);
    break;
  }
  switch (at) {
  case AT_OVER:
    fputs(" over ", out);
    print_dims(out, op->dims, op->ndims);
    if (ir_route_contract(op, NULL) != CONTRACT_DENSE) fprintf(out, " (%s)", ir_op_label(op));
    break;
  case AT_ROUTE:
    if (op->ndims == 3)
      fprintf(out, " top %d over [%s] tokens [%s] slots [%s]", op->index, op->dims[0]->name, op->dims[1]->name,
              op->dims[2]->name);
    break;
  case AT_ADDING:
    fputs(" adding ", out);
    print_dims(out, op->dims, op->ndims);
    break;
  case AT_DIMS:
    fputc(' ', out);
    print_dims(out, op->dims, op->ndims);
    break;
  case AT_ATTENTION: /* attention_grad: which gradient, after the forward's attributes */
    if (op->ndims == 3)
      fprintf(out, " head [%s] key [%s] query [%s]", op->dims[0]->name, op->dims[1]->name, op->dims[2]->name);
    fputs(" scale ", out);
    print_number(out, op->scalar);
    if (op->flag) fputs(" causal", out);
    if (op->kind == OP_ATTENTION_GRAD) fprintf(out, " d%c", op->index == 0 ? 'q' : op->index == 1 ? 'k' : 'v');
    break;
  case AT_LR:
    fputs(" lr ", out);
    print_number(out, op->scalar);
    break;
  case AT_BETA:
    fputs(" beta ", out);
    print_number(out, op->scalar);
    if (op->flag) fputs(" squared", out);
    break;
  case AT_RENAME:
    fputs(" [", out);
    for (int i = 0; i + 1 < op->ndims; i += 2)
      fprintf(out, "%s%s -> %s", i ? ", " : "", op->dims[i]->name, op->dims[i + 1]->name);
    fputc(']', out);
    break;
  case AT_SPLIT:
    if (op->ndims >= 2) {
      fprintf(out, " [%s -> (", op->dims[0]->name);
      for (int i = 1; i < op->ndims; i++) fprintf(out, "%s%s", i > 1 ? ", " : "", op->dims[i]->name);
      fputs(")]", out);
    }
    break;
  case AT_MERGE:
    if (op->ndims >= 2) {
      fputs(" [(", out);
      for (int i = 0; i + 1 < op->ndims; i++) fprintf(out, "%s%s", i ? ", " : "", op->dims[i]->name);
      fprintf(out, ") -> %s]", op->dims[op->ndims - 1]->name);
    }
    break;
  case AT_COLL:
    fputs(" over ", out);
    print_axes(out, m, op->axes);
    if (op->coll) break; /* localised: print_local_facts gives every part */
    if (op->dim_index >= 0) fprintf(out, " dim %d", op->dim_index);
    if (op->kind == OP_ALL_TO_ALL && op->dim_index2 >= 0) fprintf(out, " to %d", op->dim_index2);
    break;
  case AT_NONE: case AT_INDEX: case AT_NUMBER: case AT_LOOP:
    break;
  }
  print_local_facts(out, m, op);
  if (op->nresults) {
    fputs(" : ", out);
    for (int i = 0; i < op->nresults; i++) {
      if (i) fputs(", ", out);
      print_type(out, m, op->results[i]);
    }
  }
  print_loc(out, op->loc);
  if (at != AT_INDEX && op->nresults == 1 && op->results[0]->name)
    fprintf(out, "  (%s)", op->results[0]->name);
  for (int i = 0; i < op->nresults; i++)
    if (op->results[i]->saved) {
      fputs("  [saved]", out);
      break;
    }
  if (op->phase == PHASE_RECOMPUTE) fputs("  [recompute]", out);
  if (op->place) /* on some stages only (shard/stages.c) */
    fprintf(out, "  [on %s%s%s]", op->place & PLACE_FIRST ? "first" : "",
            op->place & PLACE_MID ? (op->place & PLACE_FIRST ? ", middle" : "middle") : "",
            op->place & PLACE_LAST ? (op->place & (PLACE_FIRST | PLACE_MID) ? ", last" : "last") : "");
  if (op->reason) fprintf(out, "  # %s", op->reason);
  fputc('\n', out);
  if (op->kind == OP_LOOP && op->body) print_func(out, m, op->body, depth + 1);
  if (op->kind == OP_PIPELINE && op->pipe) print_pipeline(out, m, op->pipe, depth + 1);
}

/* A pipeline's regions with their wiring, then each stage's schedule:
 *   region chunk_fwd
 *     in %41 : ...  (env #3)          an operand of the pipeline (a microbatch's row of a slice)
 *     in %42 : ...  (act)             the activation or gradient arriving
 *     in %43 : ...  (chunk #5)        the chunk's rows of stacked operand #5
 *     in %44 : ...  (saved #1)        what the forward of this chunk kept
 *     ...
 *     yield %50 (act), %51 (save #1), %52 (acc #3)
 *   stage 0: first(0) fwd(0.0) send(0.1>1) ...   (microbatch.chunk; > the peer stage)
 * or, when the schedule is too long to list (shard/schedule.h), its bounded form, where
 *   [ fwd(3.0) ... bwd(0.0) ]x1000 +1              runs 1000 times, microbatches 1 higher each run */
static void print_pipeline(FILE *out, const IrModule *m, const PipeInfo *pi, int depth) {
  static const char *const rname[PR__COUNT] = {"first", "chunk_fwd", "last", "chunk_bwd", "first_bwd"};
  static const char *const iname[] = {"env", "act", "chunk", "saved"};
  static const char *const oname[] = {"act", "save", "acc", "result"};
  indent(out, depth);
  fprintf(out, "stages %d over ", pi->stages);
  print_axis_list(out, m, pi->stage_axes, pi->nstage_axes);
  fprintf(out, ", %d chunk%s of %lld layers each, %d microbatch%s, in flight %d on the first stage, %d on the "
          "last\n", pi->chunks, pi->chunks == 1 ? "" : "s", (long long)pi->chunk_layers, pi->microbatches,
          pi->microbatches == 1 ? "" : "es", pi->in_flight_max[0], pi->in_flight_max[1]);
  for (int r = 0; r < PR__COUNT; r++) {
    const IrFunc *R = pi->region[r];
    if (!R) continue;
    indent(out, depth);
    fprintf(out, "region %s\n", rname[r]);
    for (int i = 0; i < R->ninputs; i++) {
      const Value *v = R->inputs[i];
      PipeSlot sl = pi->in[r][i];
      indent(out, depth + 1);
      fprintf(out, "in %%%d : ", v->id);
      print_type(out, m, v);
      fprintf(out, "  (%s", iname[sl.kind]);
      if (sl.kind != PIN_ACT) fprintf(out, " #%d", sl.index);
      if (v->name) fprintf(out, " %s", v->name);
      fputs(")\n", out);
    }
    for (const Op *op = R->first; op; op = op->next) print_op(out, m, op, depth + 1);
    indent(out, depth + 1);
    fputs("yield", out);
    for (int i = 0; i < R->noutputs; i++) {
      PipeSlot sl = pi->out[r][i];
      fprintf(out, "%s %%%d (%s", i ? "," : "", R->outputs[i]->id, oname[sl.kind]);
      if (sl.kind != POUT_ACT) fprintf(out, " #%d", sl.index);
      fputc(')', out);
    }
    fputc('\n', out);
  }
  /* the whole list when it is kept, else the bounded form: each span once, as [ ... ] xRUNS +STRIDE */
  bool listed = pi->actions && pi->first_action;
  if (!listed && pi->form) {
    indent(out, depth);
    fprintf(out, "schedule of %lld actions, in bounded form:\n", (long long)pi->nactions);
  }
  for (int st = 0; (listed || pi->form) && st < pi->stages; st++) {
    indent(out, depth);
    fprintf(out, "stage %d:", st);
    int i0 = listed ? pi->first_action[st] : pi->first_form[st], i1 = listed ? pi->first_action[st + 1] : pi->first_form[st + 1];
    const PipeSpan *sp = listed ? NULL : &pi->spans[2 * st];
    for (int i = i0; i < i1; i++) {
      for (int k = 0; sp && k < 2; k++)
        if (sp[k].len > 0 && sp[k].first == i) fputs(" [", out);
      print_action(out, listed ? &pi->actions[i] : &pi->form[i]);
      for (int k = 0; sp && k < 2; k++)
        if (sp[k].len > 0 && sp[k].first + sp[k].len - 1 == i) fprintf(out, " ]x%d +%d", sp[k].reps, sp[k].stride);
    }
    fputc('\n', out);
  }
}

static void print_func(FILE *out, const IrModule *m, const IrFunc *f, int depth) {
  if (f->parent) {
    for (int i = 0; i < f->ninputs; i++) {
      const Value *v = f->inputs[i];
      indent(out, depth);
      fprintf(out, "in %%%d : ", v->id);
      print_type(out, m, v);
      if (v->name) fprintf(out, "  (%s)", v->name);
      fputc('\n', out);
    }
  }
  for (const Op *op = f->first; op; op = op->next) print_op(out, m, op, depth);
  indent(out, depth);
  fputs(f->parent ? "yield" : "return", out);
  if (f->noutputs) fputc(' ', out);
  print_refs(out, f->outputs, 0, f->noutputs);
  fputc('\n', out);
}

void ir_print(FILE *out, const IrModule *m) {
  if (!m) return;
  const FnDecl *e = m->entry;
  fprintf(out, "ir %s%s%s\n", e && e->model ? e->model->name : "", e && e->model ? "." : "",
          e ? e->name : (m->main ? m->main->name : "?"));
  for (int i = 0; i < m->nparams; i++) {
    const IrParam *p = &m->params[i];
    char buf[512];
    tensor_type_format(buf, sizeof buf, &p->type);
    fprintf(out, "param #%d %s : %s", i, p->path, buf);
    if (p->stack_depth) fprintf(out, "  stacked %d", p->stack_depth);
    print_loc(out, p->loc);
    fputc('\n', out);
  }
  if (!m->main) return;
  fprintf(out, "fn %s\n", m->main->name ? m->main->name : "?");
  print_func(out, m, m->main, 1);
}
