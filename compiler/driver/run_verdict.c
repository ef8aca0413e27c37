/* run_verdict.c: run_verdict.h's noise bounds and comparison rules. */
#include <math.h>
#include <stdlib.h>

#include "run_verdict.h"
#include "shardrt.h"
#include "step.h"

/* the unit roundoff of a stored dtype: half its spacing at 1 */
static double unit_roundoff(DType dt) {
  switch (dt) {
  case DT_BF16: return 0x1p-8;
  case DT_F16: return 0x1p-11;
  case DT_F8E4M3: return 0x1p-4;
  case DT_F8E5M2: return 0x1p-3;
  case DT_F32: return 0x1p-24;
  default: return 0; /* integers are exact */
  }
}

typedef struct Noise {
  double *var;  /* by Value.id */
  double *umax; /* the largest unit roundoff on any path that made the value */
  int n;
} Noise;

static double var_of(const Noise *z, const Value *v) { return v && v->id >= 0 && v->id < z->n ? z->var[v->id] : 0; }
static double umax_of(const Noise *z, const Value *v) { return v && v->id >= 0 && v->id < z->n ? z->umax[v->id] : 0; }
static void set_var(Noise *z, const Value *v, double x) {
  if (v && v->id >= 0 && v->id < z->n) z->var[v->id] = x;
}
static void set_umax(Noise *z, const Value *v, double u) {
  if (v && v->id >= 0 && v->id < z->n) z->umax[v->id] = u;
}

static double reduced_elements(const Op *op) {
  double k = 1;
  for (int i = 0; i < op->ndims; i++)
    if (op->dims[i]) k *= (double)op->dims[i]->size;
  return k;
}

static void walk(Noise *z, const IrFunc *f);

/* a loop: the body trip by trip (carried values feed the next trip); stacked outputs the worst of
 * any trip. Past 64 trips the carried bounds grow by the last trip's increment. */
static void walk_loop(Noise *z, const Op *op) {
  const IrFunc *b = op->body;
  int nc = op->ncarried;
  double *carried = calloc((size_t)nc + 1, sizeof *carried), *last = calloc((size_t)nc + 1, sizeof *last);
  double *stacked = calloc((size_t)op->nstacked + 1, sizeof *stacked);
  if (!carried || !last || !stacked) {
    free(carried), free(last), free(stacked);
    for (int k = 0; k < op->nresults; k++) set_var(z, op->results[k], 1); /* no bound: compare loosely */
    return;
  }
  for (int k = 0; k < nc; k++) carried[k] = var_of(z, op->operands[op->nslices + k]);
  int64_t trips = op->count > 0 ? op->count : 1, walked = trips < 64 ? trips : 64;
  for (int64_t t = 0; t < walked; t++) {
    for (int i = 0; i < b->ninputs && i < op->noperands; i++) {
      bool is_carried = i >= op->nslices && i < op->nslices + nc;
      set_var(z, b->inputs[i], is_carried ? carried[i - op->nslices] : var_of(z, op->operands[i]));
      /* the roundoffs that reach a carried input: the operand's, then the body's outputs' */
      double u = umax_of(z, op->operands[i]);
      if (is_carried && t > 0 && i - op->nslices < b->noutputs) u = fmax(u, umax_of(z, b->outputs[i - op->nslices]));
      set_umax(z, b->inputs[i], u);
    }
    walk(z, b);
    for (int k = 0; k < nc && k < b->noutputs; k++) last[k] = carried[k], carried[k] = var_of(z, b->outputs[k]);
    for (int k = 0; k < op->nstacked && nc + k < b->noutputs; k++) stacked[k] = fmax(stacked[k], var_of(z, b->outputs[nc + k]));
  }
  for (int k = 0; k < nc; k++) carried[k] += (double)(trips - walked) * fmax(0, carried[k] - last[k]);
  for (int k = 0; k < op->nresults; k++) {
    set_var(z, op->results[k], k < nc ? carried[k] : stacked[k - nc < op->nstacked ? k - nc : 0]);
    set_umax(z, op->results[k], k < b->noutputs ? fmax(umax_of(z, b->outputs[k]), k < nc ? umax_of(z, op->operands[op->nslices + k]) : 0) : 0);
  }
  free(carried), free(last), free(stacked);
}

static void walk(Noise *z, const IrFunc *f) {
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_LOOP) {
      walk_loop(z, op);
      continue;
    }
    double in = 0, uin = 0;
    for (int i = 0; i < op->noperands; i++) in = fmax(in, var_of(z, op->operands[i])), uin = fmax(uin, umax_of(z, op->operands[i]));
    for (int k = 0; k < op->nresults; k++) {
      const Value *r = op->results[k];
      double u = unit_roundoff(r->type.dtype), u32 = unit_roundoff(DT_F32), x;
      switch (op->kind) {
      case OP_INPUT: case OP_PARAM: case OP_CONST: x = 0; break;
      /* views and data movement: no arithmetic */
      case OP_RENAME: case OP_SPLIT: case OP_MERGE: case OP_TRANSPOSE: case OP_SLICE: case OP_BROADCAST:
      case OP_TAKE: case OP_CAUSAL: case OP_CAUSAL_GRAD: case OP_ONEHOT: case OP_PICK: case OP_ROUTE:
      case OP_ALL_GATHER: case OP_ALL_TO_ALL: case OP_PERMUTE: case OP_RELU:
        x = in;
        break;
      case OP_CAST: /* rounds when it narrows */
        x = in + (unit_roundoff(r->type.dtype) > unit_roundoff(op->operands[0]->type.dtype) ? u * u : 0);
        break;
      case OP_ADAM_MOMENT: /* v = b2 v + (1 - b2) g^2: twice g's relative error */
        x = fmax(var_of(z, op->operands[0]), (op->flag ? 4 : 1) * var_of(z, op->operands[1])) + u * u;
        break;
      /* reductions: a sharded run rounds partial sums and accumulates in another order */
      case OP_CONTRACT: case OP_SUM: case OP_MEAN: case OP_ROUTE_GRAD: case OP_TAKE_GRAD:
      case OP_REDUCE_SCATTER: case OP_ALL_REDUCE:
        x = in + 2 * u * u + reduced_elements(op) * u32 * u32;
        break;
      case OP_ATTENTION: case OP_ATTENTION_GRAD: case OP_SOFTMAX: case OP_SOFTMAX_GRAD: case OP_RMSNORM:
      case OP_RMSNORM_GRAD: case OP_LAYERNORM: case OP_LAYERNORM_GRAD: case OP_CROSS_ENTROPY:
      case OP_CROSS_ENTROPY_GRAD: {
        /* a row (or a key sequence) reduced in double, then products with it */
        double rowlen = op->ndims > 0 && op->dims[op->ndims > 1 ? 1 : 0] ? (double)op->dims[op->ndims > 1 ? 1 : 0]->size : 1;
        x = in + 2 * u * u + rowlen * u32 * u32;
        break;
      }
      default: x = in + u * u; break; /* elementwise arithmetic, the optimizer's updates */
      }
      set_var(z, r, x);
      set_umax(z, r, x > in ? fmax(uin, u) : uin); /* an op that rounds adds its dtype's */
    }
  }
}

void run_verdict_noise(const IrModule *m, double *noise, double *umax) {
  Noise z = {.n = m->nvalues > 0 ? m->nvalues : 1};
  z.var = calloc((size_t)z.n, sizeof *z.var);
  z.umax = calloc((size_t)z.n, sizeof *z.umax);
  if (z.var && z.umax) walk(&z, m->main);
  for (int j = 0; j < m->main->noutputs; j++) {
    const Value *v = m->main->outputs[j];
    double u = unit_roundoff(v->type.dtype), var = z.var && z.umax ? var_of(&z, v) : 1;
    noise[j] = RUN_NOISE_C * sqrt(fmax(var, u * u));
    if (umax) umax[j] = fmax(u, z.var && z.umax ? umax_of(&z, v) : unit_roundoff(DT_BF16));
  }
  free(z.var), free(z.umax);
}

static int rt_dtype_of(DType dt) {
  switch (dt) {
  case DT_BF16: return RT_BF16;
  case DT_F16: return RT_F16;
  case DT_F8E4M3: return RT_F8E4M3;
  case DT_F8E5M2: return RT_F8E5M2;
  case DT_I32: case DT_I8: return RT_I32;
  default: return RT_F32;
  }
}

RtCmpDesc *run_verdict_descs(Arena *a, const IrModule *m) {
  const IrFunc *f = m->main;
  RtCmpDesc *d = ARENA_ARRAY(a, RtCmpDesc, f->noutputs + 1);
  double *noise = ARENA_ARRAY(a, double, f->noutputs + 1), *umax = ARENA_ARRAY(a, double, f->noutputs + 1);
  run_verdict_noise(m, noise, umax);
  for (int j = 0; j < f->noutputs; j++) {
    const Value *v = f->outputs[j];
    d[j] = (RtCmpDesc){.name = v->name ? v->name : (f->noutputs == 1 ? "result" : arena_printf(a, "result %d", j)), .kind = RT_CMP_VALUE,
                       .dtype = rt_dtype_of(v->type.dtype), .noise = noise[j], .before = -1, .m = -1, .v = -1};
    if (dtype_is_int(v->type.dtype)) d[j].kind = RT_CMP_EXACT;
  }
  const StepInfo *si = m->step;
  if (!si) return d;
  d[0].name = "loss";
  bool adam = si->step->optimizer == OPT_ADAM;
  for (int k = 0; k < si->nparams; k++) {
    const StepParam *sp = &si->params[k];
    const char *path = sp->param >= 0 ? m->params[sp->param].path : "?";
    int in_param = sp->param >= 0 ? f->ninputs + sp->param : -1;
    /* gradients (the moments, sgd's updates): at least one rounding of the step's largest */
    if (sp->out_m >= 0) {
      RtCmpDesc *e = &d[sp->out_m];
      e->name = arena_printf(a, "adam.m.%s", path), e->kind = RT_CMP_UPDATE, e->before = sp->in_m;
      e->group = RT_CMP_GROUP_M, e->floor = RUN_NOISE_C * umax[sp->out_m];
    }
    if (sp->out_v >= 0) {
      RtCmpDesc *e = &d[sp->out_v];
      e->name = arena_printf(a, "adam.v.%s", path), e->kind = RT_CMP_UPDATE, e->before = sp->in_v;
      e->group = RT_CMP_GROUP_V, e->floor = 2 * RUN_NOISE_C * umax[sp->out_v]; /* a square */
    }
    if (sp->out_master >= 0) {
      RtCmpDesc *e = &d[sp->out_master];
      e->name = arena_printf(a, "master.%s", path);
      e->before = sp->in_master;
      if (adam && sp->out_m >= 0 && sp->out_v >= 0) e->kind = RT_CMP_ADAM, e->m = sp->out_m, e->v = sp->out_v;
      else e->kind = RT_CMP_UPDATE, e->group = RT_CMP_GROUP_MASTER, e->floor = RUN_NOISE_C * umax[sp->out_master];
    }
    if (sp->out_param >= 0) {
      RtCmpDesc *e = &d[sp->out_param];
      e->name = path;
      e->before = in_param;
      if (sp->out_master >= 0) e->kind = RT_CMP_ROUNDED, e->m = sp->out_master;
      else if (adam && sp->out_m >= 0 && sp->out_v >= 0) e->kind = RT_CMP_ADAM, e->m = sp->out_m, e->v = sp->out_v;
      else e->kind = RT_CMP_UPDATE, e->group = RT_CMP_GROUP_PARAM, e->floor = RUN_NOISE_C * umax[sp->out_param];
    }
  }
  return d;
}
