/* test_autodiff.c: training-step compilation (compiler/step.c, autodiff.c) on small programs and
 * on every sample.
 *
 * Each case runs the real pipeline (parse, sema_program, step_build) on source text held here or
 * on samples/. Structural checks: ir_verify passes on every step; the step's inputs and outputs
 * (labels, step count, optimizer state) have the documented types; each param's gradient has the
 * param's type; the backward of a stacked loop is one reverse loop; remat policies change the
 * stacked residuals and the recomputed ops; FLOPs counted from the step's IR (contractions times
 * loop trips) are 6N per token for a stacked MLP and 8N under full remat; microbatching is one
 * loop over the per-microbatch `batch`. Numerical checks (when the interpreter implements the
 * training ops): every op's gradient against central finite differences of the loss, in double
 * precision. Prints PASS/FAIL per case and `N passed, N failed`; exits 1 on any failure.
 * TEST_AD_PRINT=1 prints each case's step IR. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"
#include "diag.h"
#include "interp.h"
#include "ir.h"
#include "parse.h"
#include "partition.h"
#include "shard.h"
#include "opcost.h"
#include "step.h"
#include "unit_pipeline.h"
#include "unit_test.h"

static const char prelude[] =
  "import \"targets\"\n"
  "mesh pod = tpu_v5e[data: 2, model: 2]\n"
  "dim batch = 4, seq = 3, kseq = seq, embed = 4, hidden = 6, heads = 2, kv_heads = 1\n"
  "dim group = heads / kv_heads, head = 2, vocab = 5, layers = 3, pair = 2, qdim = 4, embed2 = 5, seq2 = seq\n"
  "layout dp { batch: data  hidden: model }\n";

/* ---- running the pipeline ---- */

/* Parses `path` with its imports, checks it, builds the step (TEST_AD_PRINT: prints it). */
static IrModule *run_file(UnitRun *r, const char *path) {
  IrModule *m = unit_run_file(r, path, NULL, step_build);
  if (m && getenv("TEST_AD_PRINT")) ir_print(stdout, m);
  return m;
}

/* The prelude, then `src`, written to a temporary file (imports resolve against the stdlib). */
static IrModule *run(UnitRun *r, const char *src) {
  unit_run_start(r);
  snprintf(r->path, sizeof r->path, "/tmp/test_autodiff_XXXXXX");
  int fd = mkstemp(r->path);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!f) {
    ut_fail("cannot write a temporary file");
    return NULL;
  }
  fputs(prelude, f);
  fputs(src, f);
  fclose(f);
  return run_file(r, r->path);
}

static IrModule *build_ok(UnitRun *r, const char *src) {
  IrModule *m = run(r, src);
  if (!m) ut_fail("did not build:\n%s", r->diags ? r->diags : "");
  else if (!ir_verify(m, stdout)) ut_fail("ir_verify failed");
  else if (!m->step) ut_fail("no step was built");
  return m && m->step ? m : NULL;
}

/* ---- looking at the IR ---- */

static const char *ty(const TensorType *t) {
  static char bufs[4][256];
  static int k;
  char *b = bufs[k++ % 4];
  return tensor_type_format(b, 256, t);
}

static int count_phase(const IrFunc *f, OpPhase ph) {
  int n = 0;
  for (const Op *o = f->first; o; o = o->next) {
    n += o->phase == ph;
    if (o->kind == OP_LOOP && o->body) n += count_phase(o->body, ph);
  }
  return n;
}

/* The nth loop (pre-order) */
static const Op *find_loop(const IrFunc *f, bool reverse, int *nth) {
  for (const Op *o = f->first; o; o = o->next) {
    if (o->kind != OP_LOOP) continue;
    if (o->reverse == reverse && (*nth)-- == 0) return o;
    const Op *r = o->body ? find_loop(o->body, reverse, nth) : NULL;
    if (r) return r;
  }
  return NULL;
}

static const Op *loop_of(const IrModule *m, bool reverse, int nth) { return find_loop(m->main, reverse, &nth); }

static int count_loops(const IrFunc *f, bool reverse) {
  int n = 0;
  for (const Op *o = f->first; o; o = o->next) {
    if (o->kind != OP_LOOP) continue;
    n += o->reverse == reverse;
    if (o->body) n += count_loops(o->body, reverse);
  }
  return n;
}

/* Every param's gradient has the param's type; every updated param too. */
static void check_grads(const IrModule *m) {
  const StepInfo *si = m->step;
  UT_CHECK(si->nparams == m->nparams, "step has %d params, module %d", si->nparams, m->nparams);
  for (int i = 0; i < si->nparams; i++) {
    const StepParam *sp = &si->params[i];
    const IrParam *ip = &m->params[i];
    UT_CHECK(sp->grad && tensor_type_equal(&sp->grad->type, &ip->type), "grad of %s: %s, param %s", ip->path,
             sp->grad ? ty(&sp->grad->type) : "none", ty(&ip->type));
    UT_CHECK(sp->out_param >= 0 && sp->out_param < m->main->noutputs &&
                 tensor_type_equal(&m->main->outputs[sp->out_param]->type, &ip->type),
             "updated %s has the wrong type", ip->path);
  }
  const Value *loss = m->main->noutputs ? m->main->outputs[0] : NULL;
  UT_CHECK(loss && loss->type.rank == 0 && loss->type.dtype == DT_F32, "the loss is not f32[]");
}

/* ---- structural cases ---- */

static const char mlp_src[] =
  "model mlp {\n"
  "  param w_in: bf16[embed, hidden]\n"
  "  param w_out: bf16[hidden, embed]\n"
  "  fn forward(x: bf16[batch, seq, embed]) -> bf16[batch, seq, embed] {\n"
  "    return gelu(x @ w_in) @ w_out\n"
  "  }\n"
  "}\n";

static void test_mlp(void) {
  char src[2048];
  snprintf(src, sizeof src, "%strain mlp.forward { loss = mse  optimizer = adam  master = f32 }\n", mlp_src);
  ut_begin("mlp: adam with master copies: inputs, outputs, gradients");
  UnitRun r;
  IrModule *m = build_ok(&r, src);
  if (m) {
    const StepInfo *si = m->step;
    IrFunc *f = m->main;
    check_grads(m);
    UT_CHECK(si->nargs == 1 && si->in_labels == 1 && si->in_t == 2, "inputs: args %d labels %d t %d", si->nargs,
             si->in_labels, si->in_t);
    UT_CHECK(strcmp(ty(&f->inputs[1]->type), "bf16[batch, seq, embed]") == 0, "labels %s", ty(&f->inputs[1]->type));
    UT_CHECK(f->inputs[1]->spec != NULL, "labels carry no written type");
    UT_CHECK(f->inputs[2]->type.rank == 0 && f->inputs[2]->type.dtype == DT_F32, "step count %s", ty(&f->inputs[2]->type));
    /* per param: master, m, v (f32) */
    UT_CHECK(f->ninputs == 3 + 3 * 2, "%d inputs", f->ninputs);
    UT_CHECK(f->noutputs == 1 + 2 + 3 * 2, "%d outputs", f->noutputs);
    for (int i = 0; i < si->nparams; i++) {
      const StepParam *sp = &si->params[i];
      UT_CHECK(sp->in_master >= 0 && sp->in_m >= 0 && sp->in_v >= 0 && sp->out_master >= 0 && sp->out_m >= 0 &&
                   sp->out_v >= 0, "param %d lacks state", i);
      if (sp->in_m < 0) continue;
      const Value *mv = f->inputs[sp->in_m];
      UT_CHECK(mv->type.dtype == DT_F32 && tensor_type_same_dims(&mv->type, &m->params[i].type), "moment %s",
               ty(&mv->type));
    }
    UT_CHECK(unit_count_ops(f, OP_ADAM_UPDATE, false) == 2 && unit_count_ops(f, OP_ADAM_MOMENT, false) == 4, "adam ops");
    UT_CHECK(unit_count_ops(f, OP_CONTRACT, true) == 5, "%d contractions (2 forward, 3 backward: x needs none)",
             unit_count_ops(f, OP_CONTRACT, true));
    UT_CHECK(unit_count_ops(f, OP_GELU_GRAD, true) == 1, "no gelu_grad");
  }
  unit_run_free(&r);
  ut_end();

  snprintf(src, sizeof src, "%strain mlp.forward { loss = mse  optimizer = sgd }\n", mlp_src);
  ut_begin("mlp: sgd keeps no state");
  m = build_ok(&r, src);
  if (m) {
    check_grads(m);
    UT_CHECK(m->step->in_t == -1 && m->main->ninputs == 2 && m->main->noutputs == 3, "inputs %d outputs %d",
             m->main->ninputs, m->main->noutputs);
    UT_CHECK(unit_count_ops(m->main, OP_SGD_UPDATE, false) == 2, "sgd ops");
    const Op *u = NULL;
    for (const Op *o = m->main->first; o; o = o->next)
      if (o->kind == OP_SGD_UPDATE) u = o;
    UT_CHECK(u && u->scalar == 1e-2, "sgd's default lr");
  }
  unit_run_free(&r);
  ut_end();
}

static const char stack_src[] =
  "model layer {\n"
  "  param w_in: f32[embed, hidden]\n"
  "  param w_out: f32[hidden, embed]\n"
  "  fn forward(x: f32[batch, seq, embed]) -> f32[batch, seq, embed] {\n"
  "    return x + gelu(x @ w_in) @ w_out\n"
  "  }\n"
  "}\n"
  "model net {\n"
  "  param blocks: layer[layers]\n"
  "  fn forward(x: f32[batch, seq, embed]) -> f32[batch, seq, embed] {\n"
  "    for b in blocks { x = b.forward(x) }\n"
  "    return x\n"
  "  }\n"
  "}\n";

static int64_t nstacked_of(const IrModule *m) {
  const Op *fwd = loop_of(m, false, 0);
  return fwd ? fwd->nstacked : -1;
}

/* The stacked MLP under each policy: residuals, recomputation, FLOPs per token. */
static void test_stack(void) {
  static const char *names[] = {"none", "full", "dots"};
  int64_t nst[3] = {0}, nrec[3] = {0};
  double flops[3] = {0}, recomp[3] = {0};
  int64_t saved[3] = {0};
  for (int k = 0; k < 3; k++) {
    char src[4096], title[128];
    snprintf(src, sizeof src, "%strain net.forward { loss = mse  optimizer = sgd  remat = %s }\n", stack_src, names[k]);
    snprintf(title, sizeof title, "stacked mlp, remat = %s: one reverse loop, stacked gradients", names[k]);
    ut_begin(title);
    UnitRun r;
    IrModule *m = build_ok(&r, src);
    if (m) {
      check_grads(m);
      UT_CHECK(count_loops(m->main, false) == 1 && count_loops(m->main, true) == 1, "%d forward, %d reverse loops",
               count_loops(m->main, false), count_loops(m->main, true));
      const Op *fl = loop_of(m, false, 0), *bl = loop_of(m, true, 0);
      if (fl && bl) {
        UT_CHECK(bl->count == fl->count && bl->stack_dim == fl->stack_dim, "the reverse loop runs over another dim");
        UT_CHECK(bl->nstacked == 2, "the backward loop stacks %d gradients", bl->nstacked);
        for (int i = 0; i < bl->nstacked; i++) {
          const Value *g = bl->results[bl->ncarried + i];
          UT_CHECK(g->type.dims[0] == fl->stack_dim, "stacked gradient %s", ty(&g->type));
        }
        /* the residuals are the forward loop's stacked results, marked saved */
        for (int i = fl->ncarried; i < fl->nresults; i++)
          UT_CHECK(fl->results[i]->saved && fl->results[i]->type.dims[0] == fl->stack_dim, "residual %d", i);
      }
      char *txt = NULL;
      size_t ntxt = 0;
      FILE *pf = open_memstream(&txt, &ntxt);
      ir_print(pf, m);
      fclose(pf);
      UT_CHECK(txt && strstr(txt, " reverse :") && strstr(txt, " stacked ") && strstr(txt, "gelu_grad") &&
                   strstr(txt, "sgd_update") && strstr(txt, "[saved]"),
               "ir_print lacks the training ops");
      UT_CHECK(k != 1 || (txt && strstr(txt, "[recompute]")), "ir_print lacks [recompute]");
      free(txt);
      nst[k] = nstacked_of(m);
      nrec[k] = count_phase(m->main, PHASE_RECOMPUTE);
      StepFlops sf;
      step_flops(m, &sf);
      double tokens = 4 * 3, N = 3.0 * 2 * 4 * 6; /* batch * seq; layers * 2 * embed * hidden */
      flops[k] = sf.total / tokens / N;
      recomp[k] = sf.recompute / tokens / N;
      saved[k] = step_saved_bytes(m, r.p->mesh);
    }
    unit_run_free(&r);
    ut_end();
  }
  ut_begin("remat: none keeps most, full keeps only block inputs and recomputes, dots in between");
  UT_CHECK(nst[1] == 1, "full stacks %lld residuals, want 1 (the block input)", (long long)nst[1]);
  UT_CHECK(nst[0] > nst[2] && nst[2] > nst[1], "stacked residuals none %lld dots %lld full %lld", (long long)nst[0],
           (long long)nst[2], (long long)nst[1]);
  UT_CHECK(nrec[0] == 0 && nrec[1] > nrec[2] && nrec[2] > 0, "recomputed ops none %lld dots %lld full %lld",
           (long long)nrec[0], (long long)nrec[2], (long long)nrec[1]);
  UT_CHECK(saved[0] > saved[2] && saved[2] > saved[1] && saved[1] > 0, "saved bytes none %lld dots %lld full %lld",
           (long long)saved[0], (long long)saved[2], (long long)saved[1]);
  ut_end();
  ut_begin("FLOPs per token: 6N, 8N under full remat");
  UT_CHECK(fabs(flops[0] - 6) < 1e-9 && fabs(flops[2] - 6) < 1e-9, "none %g dots %g, want 6", flops[0], flops[2]);
  UT_CHECK(fabs(flops[1] - 8) < 1e-9 && fabs(recomp[1] - 2) < 1e-9, "full %g (recompute %g), want 8 (2)", flops[1],
           recomp[1]);
  ut_end();
}

/* Every sample's train step builds and verifies; one reverse loop per stacked loop. */
static void test_samples(void) {
  char dir[1024], names[64][256];
  int n = unit_samples(dir, sizeof dir, names, 64);
  for (int i = 0; i < n; i++) {
    char title[300], path[1400];
    snprintf(title, sizeof title, "sample %.200s: the train step builds and verifies", names[i]);
    snprintf(path, sizeof path, "%.1000s/%.200s", dir, names[i]);
    ut_begin(title);
    UnitRun r;
    unit_run_start(&r);
    IrModule *m = run_file(&r, path);
    UT_CHECK(m, "did not build:\n%s", r.diags ? r.diags : "");
    if (m) {
      UT_CHECK(ir_verify(m, stdout), "ir_verify failed");
      UT_CHECK(m->step, "no step");
      if (m->step) check_grads(m);
      UT_CHECK(count_loops(m->main, true) == count_loops(m->main, false) - (m->step && m->step->micro_loop ? 1 : 0),
               "%d forward loops, %d reverse", count_loops(m->main, false), count_loops(m->main, true));
    }
    unit_run_free(&r);
    ut_end();
  }
}

static void test_micro(void) {
  char src[4096];
  snprintf(src, sizeof src, "%strain net.forward { loss = mse  optimizer = adam  microbatches = 2  remat = full }\n",
           stack_src);
  ut_begin("microbatches = 2: one loop over microbatches, f32 accumulators");
  UnitRun r;
  IrModule *m = build_ok(&r, src);
  if (m) {
    check_grads(m);
    const StepInfo *si = m->step;
    const Op *L = si->micro_loop;
    UT_CHECK(L && L->count == 2 && si->micro_dim && si->micro_dim->size == 2, "no microbatch loop of 2");
    UT_CHECK(si->micro_batch && si->micro_batch->size == 2 && strcmp(si->micro_batch->name, "batch") == 0,
             "per-microbatch batch");
    if (L) {
      UT_CHECK(L->nslices == 2, "%d slices (x and labels)", L->nslices);
      for (int i = 0; i < L->ncarried; i++) UT_CHECK(L->results[i]->type.dtype == DT_F32, "accumulator %d not f32", i);
      const Value *x = L->body->inputs[0];
      UT_CHECK(tensor_type_find(&x->type, si->micro_batch) == 0, "the body's x: %s", ty(&x->type));
      UT_CHECK(count_loops(L->body, false) == 1 && count_loops(L->body, true) == 1, "the stacked loops are inside");
    }
    StepFlops sf;
    step_flops(m, &sf);
    double tokens = 4 * 3, N = 3.0 * 2 * 4 * 6;
    UT_CHECK(fabs(sf.total / tokens / N - 8) < 1e-9, "FLOPs per token %g, want 8", sf.total / tokens / N);
  }
  unit_run_free(&r);
  ut_end();
}

/* ---- numerical checks ---- */

/* The interpreter runs a step whose outputs are replaced by (loss, every param's gradient). */
typedef struct Grads {
  double loss;
  Tensor **g;     /* per param */
  int n;
} Grads;

static bool run_grads(IrModule *m, Tensor **inputs, Tensor **params, Grads *out, char *err, size_t nerr) {
  IrFunc *f = m->main;
  int n = m->nparams;
  Value **saved = f->outputs;
  int nsaved = f->noutputs;
  Value **outs = calloc((size_t)n + 1, sizeof(Value *));
  outs[0] = m->step->loss;
  for (int i = 0; i < n; i++) outs[1 + i] = m->step->params[i].grad;
  f->outputs = outs;
  f->noutputs = n + 1;
  Tensor **res = calloc((size_t)n + 1, sizeof(Tensor *));
  InterpOptions o = {.precision = INTERP_F64};
  InterpStats st = {0};
  bool ok = interp_run(m, &o, inputs, params, res, &st);
  f->outputs = saved;
  f->noutputs = nsaved;
  free(outs);
  if (!ok) {
    snprintf(err, nerr, "%s", st.error);
    free(res);
    return false;
  }
  out->loss = res[0] && res[0]->n == 1 ? res[0]->data[0] : NAN;
  tensor_free(res[0]);
  out->g = calloc((size_t)n + 1, sizeof(Tensor *));
  out->n = n;
  for (int i = 0; i < n; i++) out->g[i] = res[1 + i];
  free(res);
  return true;
}

static void grads_free(Grads *g) {
  if (g->g) interp_free_tensors(g->g, g->n);
  memset(g, 0, sizeof *g);
}

/* Integer inputs (indices, labels) in [0, bound), the same for every module with these inputs. */
static void clamp_ints(const IrModule *m, Tensor **inputs, int64_t bound) {
  for (int i = 0; i < interp_ninputs(m); i++) {
    Tensor *t = inputs[i];
    if (!t || !dtype_is_int(t->type.dtype)) continue;
    for (int64_t k = 0; k < t->n; k++) t->data[k] = (double)((k * 7 + i * 3 + 1) % bound);
  }
}

/* Central differences of the loss against each param element (all of them for small params, an
 * even spread of 40 for larger ones), in double precision. */
static void fd_check(const char *title, const char *src) {
  ut_begin(title);
  UnitRun r;
  IrModule *m = build_ok(&r, src);
  if (!m) {
    unit_run_free(&r);
    ut_end();
    return;
  }
  Tensor **inputs = interp_random_inputs(m, 7), **params = interp_random_params(m, 11);
  clamp_ints(m, inputs, 5);
  Grads base = {0};
  char err[512] = "";
  if (!run_grads(m, inputs, params, &base, err, sizeof err)) {
    ut_fail("interp: %s", err);
  } else {
    const double h = 1e-6;
    double worst = 0;
    for (int i = 0; i < m->nparams && ut_ok(); i++) {
      Tensor *p = params[i], *g = base.g[i];
      UT_CHECK(g && g->n == p->n, "gradient of %s has %lld elements", m->params[i].path, (long long)(g ? g->n : -1));
      if (!g || g->n != p->n) break;
      double gmax = 0;
      for (int64_t k = 0; k < g->n; k++) gmax = fmax(gmax, fabs(g->data[k]));
      int64_t step = p->n <= 40 ? 1 : p->n / 40;
      for (int64_t k = 0; k < p->n && ut_ok(); k += step) {
        double x = p->data[k];
        Grads a = {0}, b = {0};
        p->data[k] = x + h;
        bool ok = run_grads(m, inputs, params, &a, err, sizeof err);
        p->data[k] = x - h;
        ok = ok && run_grads(m, inputs, params, &b, err, sizeof err);
        p->data[k] = x;
        if (!ok) {
          ut_fail("interp: %s", err);
        } else {
          double fd = (a.loss - b.loss) / (2 * h), an = g->data[k];
          double e = fabs(fd - an) / (1e-3 * gmax + 1e-9);
          if (e > worst) worst = e;
          UT_CHECK(fabs(fd - an) <= 1e-3 * fmax(gmax, 1e-6), "d loss / d %s[%lld]: analytic %.9g, finite difference %.9g",
                   m->params[i].path, (long long)k, an, fd);
        }
        grads_free(&a);
        grads_free(&b);
      }
    }
    if (getenv("TEST_AD_PRINT")) printf("    worst error %.3g of the tolerance\n", worst);
  }
  grads_free(&base);
  interp_free_tensors(inputs, interp_ninputs(m));
  interp_free_tensors(params, m->nparams);
  unit_run_free(&r);
  ut_end();
}

/* A one-fn model `t` with params `decls` whose forward is `body`, trained with `train`. */
static void fd_case(const char *title, const char *decls, const char *args, const char *ret, const char *body,
                    const char *train) {
  char src[8192];
  snprintf(src, sizeof src,
           "model t {\n%s\n  fn forward(%s) -> %s {\n%s\n  }\n}\ntrain t.forward { optimizer = sgd  %s }\n", decls,
           args, ret, body, train);
  fd_check(title, src);
}

#define MSE "loss = mse"
#define XE "loss = cross_entropy"
#define X3 "x: f32[batch, seq, embed]"
#define R3 "f32[batch, seq, embed]"

static void test_numeric(void) {
  /* contractions and elementwise arithmetic, with broadcasting by dim name */
  fd_case("gradient: a @ b, contract with a batch dim", "  param w: f32[embed, hidden]  param u: f32[hidden, seq, embed]",
          X3, R3, "    let h = x @ w\n    return contract(h, u, over: hidden)", MSE);
  fd_case("gradient: + - * / and neg, broadcast", "  param a: f32[embed]  param b: f32[seq, embed]  param c: f32[embed]",
          X3, R3, "    let y = (x + a) * b - x / (c * c + 1)\n    return -y * 0.5", MSE);
  fd_case("gradient: exp log sqrt rsqrt", "  param a: f32[embed]", X3, R3,
          "    let p = exp(x * a)\n    return log(p + 1) + sqrt(p) + rsqrt(p + 2)", MSE);
  fd_case("gradient: tanh sigmoid relu gelu silu", "  param a: f32[embed, embed2]", X3, "f32[batch, seq, embed2]",
          "    let z = x @ a\n    return tanh(z) + sigmoid(z) * relu(z) + gelu(z) - silu(z)", MSE);
  /* every elementwise function of the op table (ops.def's OPF_CALL ops), each alone: a function
   * added to the table has its gradient checked here without a line of this test changing. The
   * operand z^2 + 1 >= 1 is inside every one's domain (log, sqrt, rsqrt) and away from relu's kink. */
  for (int k = 0; k < OP__COUNT; k++) {
    const OpInfo *oi = ir_op_info((OpKind)k);
    if (!(oi->flags & OPF_CALL) || oi->arity != 1) continue;
    char title[96], body[160];
    snprintf(title, sizeof title, "gradient: %s (ops.def)", oi->name);
    snprintf(body, sizeof body, "    let z = x @ a\n    return %s(z * z + 1)", oi->name);
    fd_case(title, "  param a: f32[embed, embed2]", X3, "f32[batch, seq, embed2]", body, MSE);
  }
  /* reductions */
  fd_case("gradient: sum mean max", "  param a: f32[embed, hidden]", X3, "f32[batch, hidden]",
          "    let z = x @ a\n    return sum(z, over: seq) + mean(z, over: seq) * max(z, over: seq)", MSE);
  fd_case("gradient: softmax", "  param a: f32[embed, hidden]", X3, "f32[batch, seq, hidden]",
          "    return softmax(x @ a, over: hidden)", MSE);
  fd_case("gradient: rmsnorm (x and scale)", "  param a: f32[embed, hidden]  param s: f32[hidden]", X3,
          "f32[batch, seq, hidden]", "    return rmsnorm(x @ a, s, over: hidden)", MSE);
  fd_case("gradient: layernorm (x, scale, bias)", "  param a: f32[embed, hidden]  param s: f32[hidden]  param b: f32[hidden]",
          X3, "f32[batch, seq, hidden]", "    return layernorm(x @ a, s, b, over: hidden)", MSE);
  /* reshapes */
  fd_case("gradient: rename split merge transpose", "  param a: f32[embed, qdim]  param w: f32[heads, head, kseq]", X3,
          "f32[batch, qdim, seq]",
          "    let q = split(x @ a, qdim -> (heads, head))\n    let k = contract(q, w, over: (heads, head))\n"
          "    let m: f32[batch, seq, heads, head] = merge(split(q, heads -> (pair, kv_heads)), (pair, kv_heads) -> heads)\n"
          "    let r: f32[batch, qdim, seq] = merge(m, (heads, head) -> qdim) * 2\n    return r + sum(k[kseq -> seq2], over: seq2)",
          MSE);
  /* gathers, casts, the losses */
  fd_case("gradient: take and cross_entropy", "  param emb: f32[vocab, embed]  param out: f32[embed, vocab]",
          "tok: i32[batch, seq]", "f32[batch, seq, vocab]", "    return take(emb, tok) @ out", XE);
  fd_case("gradient: casts", "  param a: f32[embed, hidden]", X3, "f32[batch, seq, hidden]",
          "    return f32(gelu(bf16(x @ a)))", MSE);
  /* attention: fused (causal, scaled) and a causal mask without fusion */
  fd_case("gradient: fused causal attention",
          "  param wq: f32[embed, heads, head]  param wk: f32[embed, heads, head]  param wv: f32[embed, heads, head]", X3,
          "f32[batch, seq, heads, head]",
          "    let q = x @ wq\n    let k = x[seq -> kseq] @ wk\n    let v = x[seq -> kseq] @ wv\n"
          "    let s = contract(q, k, over: head) * 0.7\n    let p = softmax(causal(s, seq, kseq), over: kseq)\n"
          "    return contract(p, v, over: kseq)",
          MSE);
  fd_case("gradient: grouped-query attention (split q)",
          "  param wq: f32[embed, heads, head]  param wk: f32[embed, kv_heads, head]  param wv: f32[embed, kv_heads, head]",
          X3, "f32[batch, seq, heads, head]",
          "    let q = split(x @ wq, heads -> (kv_heads, group))\n    let k = x[seq -> kseq] @ wk\n    let v = x[seq -> kseq] @ wv\n"
          "    let s = contract(q, k, over: head) * 0.7\n    let p = softmax(causal(s, seq, kseq), over: kseq)\n"
          "    return merge(contract(p, v, over: kseq), (kv_heads, group) -> heads)",
          MSE);
  fd_case("gradient: causal without fusion", "  param wq: f32[embed, head]  param wk: f32[embed, head]", X3,
          "f32[batch, seq, kseq]",
          "    let s = contract(x @ wq, x[seq -> kseq] @ wk, over: head)\n    let c = causal(s, seq, kseq)\n"
          "    return softmax(c, over: kseq) + s * 0.1",
          MSE);
  /* dropout: the backward must apply the forward's mask (a different seed or index fails here) */
  fd_case("gradient: dropout (the forward's mask)", "  param a: f32[embed, hidden]", X3, "f32[batch, seq, hidden]",
          "    let z = x @ a\n    return dropout(z, 0.3) * 2 + dropout(z * z, 0.5)", MSE);
  fd_check("gradient: dropout in a stacked loop, remat = full (recomputed: the same mask)",
           "model blk {\n  param w: f32[embed, hidden]  param v: f32[hidden, embed]\n"
           "  fn forward(x: f32[batch, seq, embed]) -> f32[batch, seq, embed] {\n"
           "    return x + dropout(tanh(x @ w), 0.25) @ v\n  }\n}\n"
           "model net {\n  param blocks: blk[layers]\n"
           "  fn forward(x: f32[batch, seq, embed]) -> f32[batch, seq, embed] {\n"
           "    for b in blocks { x = b.forward(x) }\n    return x\n  }\n}\n"
           "train net.forward { loss = mse  optimizer = sgd  remat = full }\n");
  /* stacked loops under every policy, and microbatches */
  static const char *pol[] = {"none", "full", "dots"};
  for (int k = 0; k < 3; k++) {
    char src[4096], title[128];
    snprintf(src, sizeof src,
             "model blk {\n  param w: f32[embed, hidden]  param v: f32[hidden, embed]  param s: f32[embed]\n"
             "  fn forward(x: f32[batch, seq, embed], c: f32[embed]) -> f32[batch, seq, embed] {\n"
             "    return x + silu(rmsnorm(x, s, over: embed) @ w) @ v * c\n  }\n}\n"
             "model net {\n  param blocks: blk[layers]  param c: f32[embed]\n"
             "  fn forward(x: f32[batch, seq, embed]) -> f32[batch, seq, embed] {\n"
             "    for b in blocks { x = b.forward(x, c) }\n    return x\n  }\n}\n"
             "train net.forward { loss = mse  optimizer = sgd  remat = %s%s }\n",
             pol[k], k == 1 ? "  microbatches = 2" : "");
    snprintf(title, sizeof title, "gradient: stacked loop with an invariant, remat = %s%s", pol[k],
             k == 1 ? ", 2 microbatches" : "");
    fd_check(title, src);
  }
  fd_check("gradient: llama block (attention in a stacked loop), microbatches",
           "import \"models/llama\"\n"
           "train llama.forward { loss = cross_entropy  optimizer = sgd  remat = dots  microbatches = 2 }\n");
}

/* One optimizer step from zero state: sgd p - lr g; adam (t = 1, m = v = 0) p - lr g / (|g| + eps),
 * with the new moments 0.1 g and 0.001 g^2; the master copy updated and the param its cast. */
static void test_update(void) {
  static const char *opts[] = {"optimizer = sgd  lr = 0.5", "optimizer = adam  lr = 0.25", "optimizer = adam  master = f32"};
  for (int k = 0; k < 3; k++) {
    char src[2048], title[128];
    snprintf(src, sizeof src,
             "model t {\n  param w: %s[embed, hidden]\n  fn forward(x: f32[batch, seq, embed]) -> f32[batch, seq, hidden] {\n"
             "    return f32(%s(x) @ w)\n  }\n}\ntrain t.forward { loss = mse  %s }\n", k == 2 ? "bf16" : "f32",
             k == 2 ? "bf16" : "f32", opts[k]);
    snprintf(title, sizeof title, "the update: %s", opts[k]);
    ut_begin(title);
    UnitRun r;
    IrModule *m = build_ok(&r, src);
    if (m) {
      IrFunc *f = m->main;
      const StepParam *sp = &m->step->params[0];
      int no = f->noutputs;
      Value **outs = calloc((size_t)no + 1, sizeof(Value *));
      memcpy(outs, f->outputs, sizeof(Value *) * (size_t)no);
      outs[no] = sp->grad;
      Value **keep = f->outputs;
      f->outputs = outs;
      f->noutputs = no + 1;
      Tensor **inputs = interp_random_inputs(m, 1), **params = interp_random_params(m, 2);
      for (int i = m->step->nargs + 1; i < interp_ninputs(m); i++) /* step count 1, zero state */
        for (int64_t e = 0; e < inputs[i]->n; e++) inputs[i]->data[e] = i == m->step->in_t ? 1 : 0;
      if (sp->in_master >= 0) memcpy(inputs[sp->in_master]->data, params[0]->data, sizeof(double) * (size_t)params[0]->n);
      Tensor **res = calloc((size_t)no + 1, sizeof(Tensor *));
      InterpOptions o = {.precision = INTERP_F64};
      InterpStats st = {0};
      if (!interp_run(m, &o, inputs, params, res, &st)) {
        ut_fail("interp: %s", st.error);
      } else {
        const Tensor *g = res[no], *p1 = res[sp->out_param], *p0 = params[0];
        double lr = m->step->step->lr, worst = 0;
        for (int64_t e = 0; e < g->n; e++) {
          double gv = g->data[e], want;
          if (k == 0) want = p0->data[e] - lr * gv;
          else want = p0->data[e] - lr * gv / (fabs(gv) + IR_ADAM_EPS);
          worst = fmax(worst, fabs(p1->data[e] - want));
          if (k > 0) {
            worst = fmax(worst, fabs(res[sp->out_m]->data[e] - 0.1 * gv));
            worst = fmax(worst, fabs(res[sp->out_v]->data[e] - 0.001 * gv * gv));
          }
          if (sp->out_master >= 0) worst = fmax(worst, fabs(res[sp->out_master]->data[e] - want));
        }
        UT_CHECK(worst < 1e-9, "the update is off by %g", worst);
      }
      interp_free_tensors(res, no + 1);
      interp_free_tensors(inputs, interp_ninputs(m));
      interp_free_tensors(params, m->nparams);
      f->outputs = keep;
      f->noutputs = no;
      free(outs);
    }
    unit_run_free(&r);
    ut_end();
  }
}

/* The same gradients, in double precision, whatever the remat policy and the microbatch count. */
static void test_equivalence(void) {
  ut_begin("gradients agree across remat policies and microbatch counts");
  static const char *variants[] = {"remat = none", "remat = full", "remat = dots", "remat = none  microbatches = 2",
                                   "remat = full  microbatches = 2", "remat = dots  microbatches = 2"};
  Grads ref = {0};
  for (size_t v = 0; v < ARRAY_LEN(variants) && ut_ok(); v++) {
    char src[4096];
    snprintf(src, sizeof src,
             "import \"models/llama\"\ntrain llama.forward { loss = cross_entropy  optimizer = sgd  %s }\n", variants[v]);
    UnitRun r;
    IrModule *m = build_ok(&r, src);
    if (m) {
      Tensor **inputs = interp_random_inputs(m, 3), **params = interp_random_params(m, 5);
      clamp_ints(m, inputs, 5);
      Grads g = {0};
      char err[512];
      if (!run_grads(m, inputs, params, &g, err, sizeof err)) {
        ut_fail("%s: interp: %s", variants[v], err);
      } else if (v == 0) {
        ref = g;
        memset(&g, 0, sizeof g);
      } else {
        UT_CHECK(fabs(g.loss - ref.loss) <= 1e-12 * fabs(ref.loss), "%s: loss %.17g, want %.17g", variants[v], g.loss,
                 ref.loss);
        for (int i = 0; i < g.n && i < ref.n; i++) {
          /* (the reference's dims belong to a freed module: compare the numbers) */
          double worst = 0, scale = 0;
          bool same = g.g[i]->n == ref.g[i]->n;
          for (int64_t k = 0; same && k < g.g[i]->n; k++) {
            worst = fmax(worst, fabs(g.g[i]->data[k] - ref.g[i]->data[k]));
            scale = fmax(scale, fabs(ref.g[i]->data[k]));
          }
          UT_CHECK(same && worst <= 1e-10 * scale, "%s: gradient of %s differs by %g (of %g)", variants[v],
                   m->params[i].path, worst, scale);
        }
      }
      grads_free(&g);
      interp_free_tensors(inputs, interp_ninputs(m));
      interp_free_tensors(params, m->nparams);
    }
    unit_run_free(&r);
  }
  grads_free(&ref);
  ut_end();
}

/* The state's and gradients' written types under zero = 0, 1 and 2 (mesh data: 2, model: 2; layout
 * batch: data, hidden: model). */
static void test_zero(void) {
  for (int z = 0; z <= 2; z++) {
    char src[2048], title[128];
    snprintf(src, sizeof src, "%strain mlp.forward { loss = mse  optimizer = adam  master = f32  zero = %d }\n", mlp_src, z);
    snprintf(title, sizeof title, "zero = %d: the shardings of state and gradients", z);
    ut_begin(title);
    UnitRun r;
    IrModule *m = build_ok(&r, src);
    if (m) {
      const StepParam *sp = &m->step->params[0]; /* w_in: bf16[embed, hidden] */
      Sharding s;
      char buf[256];
      const Value *mv = m->main->inputs[sp->in_m];
      UT_CHECK(mv->spec && layout_apply(r.p, mv->spec, &s, NULL), "no written type on the moment");
      sharding_format(buf, sizeof buf, &mv->type, &s, r.p->mesh);
      const char *want = z >= 1 ? "f32[embed@data, hidden@model]" : "f32[embed, hidden@model]";
      UT_CHECK(strcmp(buf, want) == 0, "moment %s, want %s", buf, want);
      const Value *ms = m->main->inputs[sp->in_master];
      UT_CHECK(ms->spec && layout_apply(r.p, ms->spec, &s, NULL), "no written type on the master copy");
      sharding_format(buf, sizeof buf, &ms->type, &s, r.p->mesh);
      UT_CHECK(strcmp(buf, want) == 0, "master %s, want %s", buf, want);
      UT_CHECK(sp->grad->spec && layout_apply(r.p, sp->grad->spec, &s, NULL), "no written type on the gradient");
      sharding_format(buf, sizeof buf, &sp->grad->type, &s, r.p->mesh);
      /* zero >= 1: the gradient the optimizer reads is the state's shard (reduce-scattered: the
       * ZeRO paper's 2 x params of traffic, as plain data parallelism); zero = 2 differs in its
       * microbatch accumulators, sharded too (test_memory.c) */
      want = z >= 1 ? "bf16[embed@data, hidden@model]" : "bf16[embed, hidden@model]";
      UT_CHECK(strcmp(buf, want) == 0, "gradient %s, want %s", buf, want);
      const Value *np = m->main->outputs[sp->out_param];
      UT_CHECK(np->spec == &m->params[0].spec, "the updated param does not carry the param's type");
    }
    unit_run_free(&r);
    ut_end();
  }
}

/* What is kept: attention outputs under dots (with their statistics), activations per
 * microbatch. */
static void test_saved(void) {
  ut_begin("dots keeps attention outputs with their statistics");
  UnitRun r;
  IrModule *m = build_ok(&r, "import \"models/llama\"\ntrain llama.forward { loss = cross_entropy  optimizer = sgd  remat = dots }\n");
  if (m) {
    const Op *fl = loop_of(m, false, 0);
    int attn = 0, dots = 0;
    for (int i = fl ? fl->ncarried : 0; fl && i < fl->nresults; i++) {
      attn += fl->results[i]->saved_attention != NULL;
      const Value *body_out = fl->body->outputs[i];
      dots += body_out->def && (body_out->def->kind == OP_CONTRACT || body_out->def->kind == OP_ATTENTION);
    }
    UT_CHECK(attn == 1, "%d saved attention outputs", attn);
    /* the block input, the attention, and the contractions the backward reads: q, k, v (attention's
     * operands), wo (the second norm's input is recomputed from it), w_gate, w_up (silu and the
     * product); not w_down's, which nothing reads */
    UT_CHECK(fl && dots == 7 && fl->nstacked == 8, "%d kept dots of %d residuals", dots, fl ? fl->nstacked : -1);
    UT_CHECK(unit_count_ops(m->main, OP_ATTENTION, true) == 1, "dots recomputed the attention");
  }
  unit_run_free(&r);
  ut_end();

  ut_begin("activations are per microbatch");
  int64_t b[2] = {0};
  for (int k = 0; k < 2; k++) {
    char src[4096];
    snprintf(src, sizeof src, "%strain net.forward { loss = mse  optimizer = sgd  microbatches = %d }\n", stack_src,
             k ? 2 : 1);
    IrModule *mm = build_ok(&r, src);
    if (mm) b[k] = step_saved_bytes(mm, r.p->mesh);
    unit_run_free(&r);
  }
  UT_CHECK(b[0] > 0 && b[1] * 2 == b[0], "saved %lld with one microbatch, %lld with two", (long long)b[0], (long long)b[1]);
  ut_end();
}

/* A residual that would need a ninth dim is a located error; full remat keeps none. */
static void test_errors(void) {
  static const char big[] =
    "model blk {\n  param a: f32[hidden, heads]  param b: f32[head, pair]  param c: f32[qdim]\n"
    "  fn forward(x: f32[batch, seq, embed]) -> f32[batch, seq, embed] {\n"
    "    let big = exp(x * a * b * c)\n"
    "    return x + sum(big, over: (hidden, heads, head, pair, qdim))\n  }\n}\n"
    "model net {\n  param blocks: blk[layers]\n"
    "  fn forward(x: f32[batch, seq, embed]) -> f32[batch, seq, embed] {\n"
    "    for b in blocks { x = b.forward(x) }\n    return x\n  }\n}\n";
  char src[4096];
  snprintf(src, sizeof src, "%strain net.forward { loss = mse  optimizer = sgd }\n", big);
  ut_begin("a residual with too many dims is a located error");
  UnitRun r;
  IrModule *m = run(&r, src);
  UT_CHECK(!m, "built");
  UT_CHECK(r.diags && strstr(r.diags, "saving this value for the backward would need 9 dims"), "diagnostics:\n%s",
           r.diags ? r.diags : "");
  UT_CHECK(r.diags && strstr(r.diags, "|9|"), "not at the exp (line 9):\n%s", r.diags ? r.diags : "");
  unit_run_free(&r);
  ut_end();
  snprintf(src, sizeof src, "%strain net.forward { loss = mse  optimizer = sgd  remat = full }\n", big);
  ut_begin("... which full remat recomputes instead");
  build_ok(&r, src);
  unit_run_free(&r);
  ut_end();
}

/* Stacks of stacks: the backward of the inner loop inside the backward of the outer. */
static void test_nested(void) {
  static const char *pol[] = {"none", "full", "dots"};
  for (int k = 0; k < 3; k++) {
    char src[4096], title[128];
    snprintf(src, sizeof src,
             "model inner {\n  param w: f32[embed, hidden]  param v: f32[hidden, embed]\n"
             "  fn forward(x: f32[batch, seq, embed]) -> f32[batch, seq, embed] { return x + tanh(x @ w) @ v }\n}\n"
             "model mid {\n  param blocks: inner[pair]  param s: f32[embed]\n"
             "  fn forward(x: f32[batch, seq, embed]) -> f32[batch, seq, embed] {\n"
             "    for b in blocks { x = b.forward(x) }\n    return rmsnorm(x, s, over: embed)\n  }\n}\n"
             "model net {\n  param stages: mid[layers]\n"
             "  fn forward(x: f32[batch, seq, embed]) -> f32[batch, seq, embed] {\n"
             "    for m in stages { x = m.forward(x) }\n    return x\n  }\n}\n"
             "train net.forward { loss = mse  optimizer = sgd  remat = %s }\n", pol[k]);
    snprintf(title, sizeof title, "gradient: nested stacked loops, remat = %s", pol[k]);
    fd_check(title, src);
  }
}

int main(int argc, char **argv) {
  if (argc > 1) { /* test_autodiff FILE: print FILE's step IR */
    UnitRun r;
    unit_run_start(&r);
    IrModule *m = run_file(&r, argv[1]);
    if (m && getenv("TEST_AD_SHARD")) { /* propagation and partitioning over the step */
      shard_assign(m, r.p);
      printf("partition: %s\n", partition_module(m, r.p) ? "ok" : "errors");
      fflush(r.df);
      fputs(r.diags ? r.diags : "", stdout);
    }
    if (m) ir_print(stdout, m);
    else fputs(r.diags ? r.diags : "", stdout);
    if (m && !ir_verify(m, stdout)) printf("ir_verify failed\n");
    unit_run_free(&r);
    return m ? 0 : 1;
  }
  test_mlp();
  test_stack();
  test_micro();
  test_samples();
  test_numeric();
  test_update();
  test_equivalence();
  test_zero();
  test_saved();
  test_errors();
  test_nested();
  return ut_summary();
}
