/* test_ir.c: the IR builder (compiler/ir_build.c, ir_fuse.c, ir.c) against small programs.
 *
 * Each case runs the real pipeline on source text held here: the stdlib's targets (and, where a
 * case says so, layers and models/llama or models/gpt) parsed from SHARDC_SOURCE_STDLIB, then the
 * case's text from memory, sema_program, ir_build. Checks: the type (dtype, dims, order) each
 * expression form gives, loops (one OP_LOOP per stacked `for`, body lowered once, carried values
 * and invariants), inlining, flattened param paths, attention fusion (and its absence when an
 * intermediate escapes), and a located error for each mistake. Prints PASS/FAIL per case and
 * `N passed, N failed`; exits 1 on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "ir.h"
#include "parse.h"
#include "unit_pipeline.h"
#include "unit_test.h"

#ifndef SHARDC_SOURCE_STDLIB
#define SHARDC_SOURCE_STDLIB "stdlib"
#endif

enum { LIB_LAYERS = 1, LIB_LLAMA = 2, LIB_GPT = 4 };

static const char prelude[] =
  "mesh pod = tpu_v5e[data: 2, model: 2]\n"
  "dim batch = 8, seq = 16, kseq = seq, embed = 32, hidden = 64, heads = 4, kv_heads = 2\n"
  "dim group = heads / kv_heads, head = 8, vocab = 100, layers = 3, small = 5, pair = 2, qdim = 32\n"
  "dim embed2 = embed\n";

/* ---- running the pipeline ---- */

static Ast *parse_lib(UnitRun *r, const char *rel) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", SHARDC_SOURCE_STDLIB, rel);
  Source *s = source_load(path);
  if (!s) {
    ut_fail("cannot read %s", path);
    return NULL;
  }
  return parse_source(&r->arena, s);
}

/* The stdlib files `libs` asks for, then the prelude + `src` from memory (r->text), through sema
 * and ir_build. */
static IrModule *run(UnitRun *r, const char *src, const char *entry, int libs) {
  unit_run_start(r);
  Ast *files[8];
  int n = 0;
  files[n++] = parse_lib(r, "targets.shard");
  if (libs & (LIB_LAYERS | LIB_LLAMA | LIB_GPT)) files[n++] = parse_lib(r, "layers.shard");
  if (libs & LIB_LLAMA) files[n++] = parse_lib(r, "models/llama.shard");
  if (libs & LIB_GPT) files[n++] = parse_lib(r, "models/gpt.shard");
  size_t len = strlen(prelude) + strlen(src);
  r->text = malloc(len + 1);
  snprintf(r->text, len + 1, "%s%s", prelude, src);
  Source *s = source_from_memory("test.shard", r->text, len);
  files[n++] = parse_source(&r->arena, s);
  for (int i = 0; i < n; i++)
    if (!files[i]) return NULL;
  ParsedProgram pp = {files, n};
  SemaOptions so = {.entry = entry};
  if (diag_error_count() == 0) r->p = sema_program(&r->arena, &pp, &so);
  if (r->p && diag_error_count() == 0 && r->p->entry) r->m = ir_build(&r->arena, r->p);
  fflush(r->df);
  return r->m;
}

/* The source's line numbers count the prelude's lines too. */
static int prelude_lines(void) {
  int n = 0;
  for (const char *c = prelude; *c; c++) n += *c == '\n';
  return n;
}

/* ---- looking at the IR ---- */

static const char *ty(const Value *v) {
  static char bufs[4][256];
  static int k;
  char *b = bufs[k++ % 4];
  if (!v) return "(null)";
  return tensor_type_format(b, 256, &v->type);
}

static const Op *find_op(const IrFunc *f, OpKind k, int nth) {
  for (const Op *o = f->first; o; o = o->next) {
    if (o->kind == k && nth-- == 0) return o;
    if (o->kind == OP_LOOP && o->body) {
      const Op *r = find_op(o->body, k, nth);
      if (r) return r;
      nth -= unit_count_ops(o->body, k, true);
    }
  }
  return NULL;
}

/* The value bound to `name` last in main (results keep their source names). */
static const Value *named(const IrFunc *f, const char *name) {
  const Value *found = NULL;
  for (const Op *o = f->first; o; o = o->next)
    for (int i = 0; i < o->nresults; i++)
      if (o->results[i]->name && strcmp(o->results[i]->name, name) == 0) found = o->results[i];
  return found;
}

static const IrParam *param(const IrModule *m, const char *path) {
  for (int i = 0; i < m->nparams; i++)
    if (strcmp(m->params[i].path, path) == 0) return &m->params[i];
  return NULL;
}

/* A program that must build; prints its diagnostics if it does not. */
static IrModule *build_ok(UnitRun *r, const char *src, const char *entry, int libs) {
  IrModule *m = run(r, src, entry, libs);
  if (!m) ut_fail("did not build:\n%s", r->diags ? r->diags : "");
  else if (!ir_verify(m, stdout)) ut_fail("ir_verify failed");
  return m;
}

/* The main function's result must have this type; optionally the op that made it. */
static void expect_result(const char *name, const char *src, const char *type, OpKind kind) {
  ut_begin(name);
  UnitRun r;
  IrModule *m = build_ok(&r, src, NULL, 0);
  if (m) {
    UT_CHECK(m->main->noutputs == 1, "no output");
    const Value *out = m->main->noutputs ? m->main->outputs[0] : NULL;
    UT_CHECK(out && strcmp(ty(out), type) == 0, "result %s, expected %s", ty(out), type);
    if ((int)kind >= 0) UT_CHECK(unit_count_ops(m->main, kind, true) >= 1, "no %s op", ir_op_name(kind));
  }
  unit_run_free(&r);
  ut_end();
}

/* A program whose ir_build must report an error containing `text` at source line `line` of the
 * case (1 = the case's first line). */
static void expect_error(const char *name, const char *src, int line, const char *text, int libs) {
  ut_begin(name);
  UnitRun r;
  IrModule *m = run(&r, src, NULL, libs);
  UT_CHECK(!m, "built without errors");
  UT_CHECK(r.p != NULL, "sema failed:\n%s", r.diags ? r.diags : "");
  char want[64];
  snprintf(want, sizeof want, "error|test.shard|%d|", line + prelude_lines());
  bool found = false;
  for (const char *l = r.diags; l && *l;) {
    const char *e = strchr(l, '\n');
    size_t n = e ? (size_t)(e - l) : strlen(l);
    char buf[2048];
    snprintf(buf, sizeof buf, "%.*s", (int)n, l);
    if (strncmp(buf, want, strlen(want)) == 0 && strstr(buf, text)) found = true;
    l = e ? e + 1 : l + n;
  }
  UT_CHECK(found, "no error '%s' at line %d; got:\n%s", text, line, r.diags ? r.diags : "");
  unit_run_free(&r);
  ut_end();
}

/* ---- expression forms ---- */

#define FN1(args, ret, body) "model t {\n  fn forward(" args ") -> " ret " {\n" body "\n  }\n}\n"

static void test_forms(void) {
  expect_result("matmul contracts every shared dim",
                "model t {\n  param w: bf16[embed, hidden]\n"
                "  fn forward(x: bf16[batch, seq, embed]) -> bf16[batch, seq, hidden] { return x @ w }\n}\n",
                "bf16[batch, seq, hidden]", OP_CONTRACT);
  expect_result("matmul result: a's dims then b's new dims",
                "model t {\n  param w: bf16[hidden, embed]\n"
                "  fn forward(x: bf16[embed, batch]) -> bf16[batch, hidden] { return x @ w }\n}\n",
                "bf16[batch, hidden]", OP_CONTRACT);
  expect_result("contract over keeps batch dims in a's position",
                FN1("q: bf16[batch, seq, heads, head], k: bf16[batch, kseq, heads, head]",
                    "bf16[batch, seq, heads, kseq]", "    return contract(q, k, over: head)"),
                "bf16[batch, seq, heads, kseq]", OP_CONTRACT);
  expect_result("contract over two dims",
                FN1("a: f32[batch, heads, head], b: f32[heads, head, embed]", "f32[batch, embed]",
                    "    return contract(a, b, over: (heads, head))"),
                "f32[batch, embed]", OP_CONTRACT);
  expect_result("elementwise broadcast by name",
                FN1("a: f32[batch, embed], b: f32[seq, embed]", "f32[batch, embed, seq]", "    return a + b"),
                "f32[batch, embed, seq]", OP_ADD);
  expect_result("literal takes the tensor's dtype",
                FN1("a: bf16[batch]", "bf16[batch]", "    return 0.5 * a - 1"), "bf16[batch]", OP_SUB);
  expect_result("unary minus", FN1("a: f32[batch]", "f32[batch]", "    return -a"), "f32[batch]", OP_NEG);
  expect_result("functions keep the type",
                FN1("a: bf16[batch, embed]", "bf16[batch, embed]",
                    "    return silu(gelu(relu(sigmoid(tanh(exp(log(sqrt(rsqrt(a)))))))))"),
                "bf16[batch, embed]", OP_SILU);
  expect_result("sum over two dims drops them",
                FN1("a: f32[batch, seq, embed]", "f32[batch]", "    return sum(a, over: (seq, embed))"), "f32[batch]",
                OP_SUM);
  expect_result("mean and max",
                FN1("a: f32[batch, seq]", "f32[batch]", "    return mean(a, over: seq) + max(a, over: seq)"),
                "f32[batch]", OP_MAX);
  expect_result("softmax keeps the type",
                FN1("a: bf16[batch, seq]", "bf16[batch, seq]", "    return softmax(a, over: seq)"), "bf16[batch, seq]",
                OP_SOFTMAX);
  expect_result("rmsnorm with an f32 scale returns x's dtype",
                "model t {\n  param s: f32[embed]\n"
                "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] { return rmsnorm(x, s, over: embed) }\n}\n",
                "bf16[batch, embed]", OP_RMSNORM);
  expect_result("layernorm",
                "model t {\n  param s: f32[embed]  param b: f32[embed]\n"
                "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] { return layernorm(x, s, b, over: embed) }\n}\n",
                "bf16[batch, embed]", OP_LAYERNORM);
  expect_result("rename keeps the position",
                FN1("a: bf16[batch, seq, embed]", "bf16[batch, kseq, embed]", "    return a[seq -> kseq]"),
                "bf16[batch, kseq, embed]", OP_RENAME);
  expect_result("split in place",
                FN1("a: bf16[batch, heads, head]", "bf16[batch, kv_heads, group, head]",
                    "    return split(a, heads -> (kv_heads, group))"),
                "bf16[batch, kv_heads, group, head]", OP_SPLIT);
  expect_result("merge at the first merged dim",
                FN1("a: bf16[batch, kv_heads, group, head]", "bf16[batch, heads, head]",
                    "    return merge(a, (kv_heads, group) -> heads)"),
                "bf16[batch, heads, head]", OP_MERGE);
  expect_result("take: idx dims then the table's rest",
                "model t {\n  param e: bf16[vocab, embed]\n"
                "  fn forward(t: i32[batch, seq]) -> bf16[batch, seq, embed] { return take(e, t) }\n}\n",
                "bf16[batch, seq, embed]", OP_TAKE);
  expect_result("causal keeps the type",
                FN1("s: f32[batch, seq, kseq]", "f32[batch, seq, kseq]", "    return causal(s, seq, kseq)"),
                "f32[batch, seq, kseq]", OP_CAUSAL);
  expect_result("cast", FN1("a: bf16[batch]", "f32[batch]", "    return f32(a)"), "f32[batch]", OP_CAST);
  expect_result("integer arithmetic", FN1("a: i32[batch]", "i32[batch]", "    return a * 2 + a"), "i32[batch]",
                OP_ADD);
  expect_result("a literal let folds and broadcasts",
                FN1("a: f32[batch]", "f32[batch]", "    let c = 2 * 0.25\n    return a * c"), "f32[batch]", OP_MUL);
  expect_result("the return is transposed to its written order",
                FN1("a: f32[batch, seq]", "f32[seq, batch]", "    return a"), "f32[seq, batch]", OP_TRANSPOSE);

  /* folding: 2 * 3 is one constant 6 */
  ut_begin("literals fold");
  UnitRun r;
  IrModule *m = build_ok(&r, FN1("a: f32[batch]", "f32[batch]", "    return a + 2 * 3"), NULL, 0);
  if (m) {
    UT_CHECK(unit_count_ops(m->main, OP_CONST, false) == 1, "expected one constant");
    const Op *c = find_op(m->main, OP_CONST, 0);
    UT_CHECK(c && c->scalar == 6 && c->results[0]->type.dtype == DT_F32, "constant is not f32 6");
  }
  unit_run_free(&r);
  ut_end();
}

/* ---- names and boundaries ---- */

static void test_names(void) {
  UnitRun r;
  ut_begin("rebinding in another order transposes back");
  IrModule *m = build_ok(&r,
                         FN1("a: f32[batch, seq], b: f32[seq, batch]", "f32[batch, seq]",
                             "    let x = a\n    x = b * 2\n    return x"),
                         NULL, 0);
  if (m) {
    UT_CHECK(unit_count_ops(m->main, OP_TRANSPOSE, false) == 1, "expected one transpose");
    const Op *t = find_op(m->main, OP_TRANSPOSE, 0);
    UT_CHECK(t && strcmp(ty(t->results[0]), "f32[batch, seq]") == 0, "transpose gives %s", t ? ty(t->results[0]) : "-");
  }
  unit_run_free(&r);
  ut_end();

  ut_begin("typed let: transposed, carries its spec");
  m = build_ok(&r,
               FN1("a: f32[batch, seq]", "f32[seq, batch]",
                   "    let h: f32[seq, batch@data] = a * 2\n    return h"),
               NULL, 0);
  if (m) {
    const Value *h = named(m->main, "h");
    UT_CHECK(h && strcmp(ty(h), "f32[seq, batch]") == 0, "h is %s", ty(h));
    UT_CHECK(h && h->spec && h->spec->nat[1] == 1, "h has no spec with the @");
  }
  unit_run_free(&r);
  ut_end();

  ut_begin("inputs, params and the result carry specs");
  m = build_ok(&r,
               "model t {\n  param w: bf16[embed, hidden]\n"
               "  fn forward(x: bf16[batch, embed]) -> bf16[batch, hidden] { return x @ w }\n}\n",
               NULL, 0);
  if (m) {
    const Op *in = find_op(m->main, OP_INPUT, 0), *pa = find_op(m->main, OP_PARAM, 0);
    UT_CHECK(in && in->results[0]->spec == &m->entry->args[0].type, "input spec");
    UT_CHECK(pa && pa->results[0]->spec == &m->params[0].spec, "param spec");
    UT_CHECK(m->main->outputs[0]->spec == &m->entry->ret, "result spec");
  }
  unit_run_free(&r);
  ut_end();
}

/* ---- inlining, params, loops ---- */

static const char sub_models[] =
  "model lin {\n  param w: bf16[embed, embed2]\n"
  "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] { return (x @ w)[embed2 -> embed] }\n}\n"
  "model two {\n  param a: lin  param b: lin\n"
  "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] {\n"
  "    x = x + a.forward(x)\n    return b.forward(x)\n  }\n}\n";

static void test_inline_and_loops(void) {
  UnitRun r;
  ut_begin("inlining sub-model calls");
  IrModule *m = build_ok(&r, sub_models, NULL, 0);
  if (m) {
    UT_CHECK(m->nparams == 2 && param(m, "a.w") && param(m, "b.w"), "params are not a.w, b.w");
    UT_CHECK(unit_count_ops(m->main, OP_CONTRACT, true) == 2, "expected 2 contractions");
    UT_CHECK(unit_count_ops(m->main, OP_LOOP, true) == 0, "no loop expected");
  }
  unit_run_free(&r);
  ut_end();

  char src[4096];
  snprintf(src, sizeof src,
           "%smodel top {\n  param blocks: two[layers]\n  param pos: bf16[embed]\n"
           "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] {\n"
           "    let y = x * 2\n"
           "    for blk in blocks { let t = blk.forward(x) + pos\n x = t * y }\n"
           "    return x\n  }\n}\n",
           sub_models);
  ut_begin("a stacked loop: slices, carried, invariants");
  m = build_ok(&r, src, NULL, 0);
  if (m) {
    const IrParam *p = param(m, "blocks.a.w");
    UT_CHECK(p && p->stack_depth == 1 && strcmp(ty(&(Value){.type = p->type}), "bf16[layers, embed, embed2]") == 0,
             "blocks.a.w is not bf16[layers, embed, embed] stacked once");
    UT_CHECK(p && p->spec.rank == 3 && p->spec.dims[0]->size == 3, "stacked spec");
    UT_CHECK(unit_count_ops(m->main, OP_LOOP, false) == 1, "expected one loop");
    const Op *loop = find_op(m->main, OP_LOOP, 0);
    if (loop) {
      UT_CHECK(loop->count == 3 && loop->stack_dim && strcmp(loop->stack_dim->name, "layers") == 0, "count/stack dim");
      UT_CHECK(loop->nslices == 2 && loop->ncarried == 1, "slices %d carried %d", loop->nslices, loop->ncarried);
      UT_CHECK(loop->noperands == 5, "invariants: %d operands (want slices 2, carried 1, pos and y)", loop->noperands);
      UT_CHECK(loop->body->ninputs == 5 && strcmp(ty(loop->body->inputs[0]), "bf16[embed, embed2]") == 0,
               "slice input type %s", ty(loop->body->inputs[0]));
      UT_CHECK(unit_count_ops(loop->body, OP_CONTRACT, false) == 2, "body holds the two contractions once");
      UT_CHECK(loop->results[0]->name && strcmp(loop->results[0]->name, "x") == 0, "result rebinds x");
      UT_CHECK(m->main->outputs[0] == loop->results[0] || m->main->outputs[0]->def->operands[0] == loop->results[0],
               "the return is the loop's result");
    }
  }
  unit_run_free(&r);
  ut_end();

  snprintf(src, sizeof src,
           "%smodel mid {\n  param subs: lin[pair]\n"
           "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] { for c in subs { x = c.forward(x) }\n return x }\n}\n"
           "model top {\n  param blocks: mid[layers]\n"
           "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] { for b in blocks { x = b.forward(x) }\n return x }\n}\n",
           sub_models);
  ut_begin("nested stacks: stack_depth 2, nested loops");
  m = build_ok(&r, src, NULL, 0);
  if (m) {
    const IrParam *p = param(m, "blocks.subs.w");
    UT_CHECK(p && p->stack_depth == 2 && strcmp(ty(&(Value){.type = p->type}), "bf16[layers, pair, embed, embed2]") == 0,
             "blocks.subs.w is not bf16[layers, pair, embed, embed]");
    const Op *outer = find_op(m->main, OP_LOOP, 0);
    UT_CHECK(outer && outer->count == 3, "outer loop");
    const Op *inner = outer ? find_op(outer->body, OP_LOOP, 0) : NULL;
    UT_CHECK(inner && inner->count == 2 && inner->nslices == 1 && inner->ncarried == 1, "inner loop");
    UT_CHECK(inner && strcmp(ty(inner->body->inputs[0]), "bf16[embed, embed2]") == 0, "inner slice type");
    UT_CHECK(unit_count_ops(m->main, OP_CONTRACT, true) == 1, "one contraction in all");
  }
  unit_run_free(&r);
  ut_end();
}

/* ---- the stdlib models and fusion ---- */

static void test_models(void) {
  UnitRun r;
  ut_begin("llama: one loop over layers, fused gqa attention");
  IrModule *m = build_ok(&r, "dim vocab2 = 7\n", "llama.forward", LIB_LLAMA);
  if (m) {
    UT_CHECK(unit_count_ops(m->main, OP_LOOP, false) == 1 && unit_count_ops(m->main, OP_LOOP, true) == 1, "expected one loop");
    const Op *loop = find_op(m->main, OP_LOOP, 0);
    if (loop) {
      UT_CHECK(loop->count == 3, "count %lld", (long long)loop->count);
      UT_CHECK(loop->nslices == 9 && loop->ncarried == 1 && loop->noperands == 10, "slices %d carried %d operands %d",
               loop->nslices, loop->ncarried, loop->noperands);
      UT_CHECK(unit_count_ops(loop->body, OP_ATTENTION, false) == 1, "no fused attention in the body");
      UT_CHECK(unit_count_ops(loop->body, OP_SOFTMAX, false) == 0, "softmax left unfused");
      UT_CHECK(unit_count_ops(loop->body, OP_RMSNORM, false) == 2, "two norms per block");
      const Op *at = find_op(loop->body, OP_ATTENTION, 0);
      if (at) {
        UT_CHECK(strcmp(ty(at->results[0]), "bf16[batch, seq, kv_heads, group, head]") == 0, "attention type %s",
                 ty(at->results[0]));
        /* The stdlib scales by rsqrt(size(head)): head = 8 here (the prelude), so 1/sqrt(8). */
        UT_CHECK(at->flag == 1 && fabs(at->scalar - 1 / sqrt(8.0)) < 1e-12, "causal/scale %.17g", at->scalar);
        UT_CHECK(at->ndims == 3 && strcmp(at->dims[0]->name, "head") == 0 && strcmp(at->dims[1]->name, "kseq") == 0 &&
                     strcmp(at->dims[2]->name, "seq") == 0,
                 "attention dims");
        UT_CHECK(at->loc2.line > 0 && at->loc2.line == at->loc.line - 2, "loc2 line %d vs %d", at->loc2.line, at->loc.line);
      }
    }
    const IrParam *p = param(m, "blocks.attn.wq");
    UT_CHECK(p && p->stack_depth == 1 && strcmp(ty(&(Value){.type = p->type}), "bf16[layers, embed, heads, head]") == 0,
             "blocks.attn.wq");
    UT_CHECK(param(m, "embedding") && param(m, "norm.scale") && param(m, "blocks.ffn.w_down"), "param paths");
    UT_CHECK(m->nparams == 12, "%d params", m->nparams);
    UT_CHECK(strcmp(ty(m->main->outputs[0]), "f32[batch, seq, vocab]") == 0, "result %s", ty(m->main->outputs[0]));
  }
  unit_run_free(&r);
  ut_end();

  ut_begin("gpt: tied embedding, fused mha attention");
  m = build_ok(&r, "", "gpt.forward", LIB_GPT);
  if (m) {
    UT_CHECK(unit_count_ops(m->main, OP_LOOP, false) == 1, "expected one loop");
    UT_CHECK(unit_count_ops(m->main, OP_ATTENTION, true) == 1, "expected one attention");
    const Op *at = find_op(m->main, OP_ATTENTION, 0);
    UT_CHECK(at && strcmp(ty(at->results[0]), "bf16[batch, seq, heads, head]") == 0, "attention type");
    UT_CHECK(m->nparams == 14, "%d params", m->nparams);
  }
  unit_run_free(&r);
  ut_end();

  const char *attn =
    "model t {\n  fn forward(q: bf16[batch, seq, heads, head], k: bf16[batch, kseq, heads, head],\n"
    "             v: bf16[batch, kseq, heads, head]) -> bf16[batch, seq, heads, head] {\n"
    "    let s = contract(q, k, over: head) / 4\n"
    "    let p = softmax(s, over: kseq)\n"
    "    return contract(p, v, over: kseq)%s\n  }\n}\n";
  char src[2048];
  snprintf(src, sizeof src, attn, "");
  ut_begin("fusion without causal: scale from a division");
  m = build_ok(&r, src, NULL, 0);
  if (m) {
    const Op *at = find_op(m->main, OP_ATTENTION, 0);
    UT_CHECK(at && at->scalar == 0.25 && at->flag == 0 && at->dims[2] && strcmp(at->dims[2]->name, "seq") == 0,
             "attention scale/causal/query");
    UT_CHECK(unit_count_ops(m->main, OP_CONTRACT, false) == 0 && unit_count_ops(m->main, OP_CONST, false) == 0,
             "the pattern's ops remain");
  }
  unit_run_free(&r);
  ut_end();

  snprintf(src, sizeof src, attn, " + sum(s, over: kseq)");
  ut_begin("no fusion when an intermediate is used elsewhere");
  m = build_ok(&r, src, NULL, 0);
  if (m) {
    UT_CHECK(unit_count_ops(m->main, OP_ATTENTION, true) == 0, "fused although s escapes");
    UT_CHECK(unit_count_ops(m->main, OP_SOFTMAX, true) == 1, "softmax gone");
  }
  unit_run_free(&r);
  ut_end();
}

/* ---- errors ---- */

static void test_errors(void) {
  expect_error("no shared dim",
               "model t {\n  fn forward(x: f32[batch, seq], y: f32[embed]) -> f32[batch] {\n"
               "    return sum(x @ y, over: seq)\n  }\n}\n",
               3, "no shared dim between x: f32[batch, seq] and y: f32[embed]", 0);
  expect_error("contract over a missing dim",
               FN1("x: f32[batch, seq], y: f32[seq, embed]", "f32[batch, embed]",
                   "    return contract(x, y, over: embed)"),
               3, "contract over embed: x: f32[batch, seq] has no dim embed", 0);
  expect_error("dtype mismatch",
               FN1("x: bf16[batch], y: f32[batch]", "f32[batch]", "    return x + y"), 3,
               "dtype mismatch: bf16 + f32; cast one with f32(x)", 0);
  expect_error("return type mismatch",
               FN1("x: f32[batch, seq, embed]", "bf16[batch, seq, embed]", "    return x"), 3,
               "return type mismatch: expected bf16[batch, seq, embed], found f32[batch, seq, embed]", 0);
  expect_error("rename to a dim of another size",
               FN1("x: f32[batch, seq]", "f32[batch, embed]", "    return x[seq -> small]"), 3,
               "cannot rename seq (16) to small (5): sizes differ", 0);
  expect_error("rename of a missing dim", FN1("x: f32[batch, seq]", "f32[batch, seq]", "    return x[embed -> qdim]"), 3,
               "has no dim embed", 0);
  expect_error("split size mismatch",
               FN1("x: f32[batch, heads]", "f32[batch, small, pair]", "    return split(x, heads -> (small, pair))"), 3,
               "sizes differ", 0);
  expect_error("merge size mismatch",
               FN1("x: f32[batch, small, pair]", "f32[batch, heads]", "    return merge(x, (small, pair) -> heads)"), 3,
               "sizes differ", 0);
  expect_error("undefined name with a suggestion",
               FN1("x: f32[batch]", "f32[batch]", "    let hidden_x = x\n    return hiden_x"), 4,
               "undefined name hiden_x; did you mean 'hidden_x'?", 0);
  expect_error("duplicate let", FN1("x: f32[batch]", "f32[batch]", "    let y = x\n    let y = x * 2\n    return y"),
               4, "y is already defined", 0);
  expect_error("let shadowing an argument", FN1("x: f32[batch]", "f32[batch]", "    let x = 1\n    return x"), 3,
               "x is already defined", 0);
  expect_error("rebinding with another type",
               FN1("x: f32[batch], y: f32[seq]", "f32[batch]", "    x = y\n    return x"), 3,
               "rebinding x changes its type: expected f32[batch], found f32[seq]", 0);
  expect_error("rebinding an undefined name", FN1("x: f32[batch]", "f32[batch]", "    z = x\n    return x"), 3,
               "undefined name z", 0);
  expect_error("take with a float index",
               "model t {\n  param e: bf16[vocab, embed]\n"
               "  fn forward(t: f32[batch]) -> bf16[batch, embed] {\n    return take(e, t)\n  }\n}\n",
               4, "take index must be an integer tensor", 0);
  expect_error("float literal with an integer tensor",
               FN1("x: i32[batch]", "i32[batch]", "    return x * 0.5"), 3,
               "non-integer literal 0.5 with integer tensor x: i32[batch]", 0);
  expect_error("unknown function", FN1("x: f32[batch]", "f32[batch]", "    return softplus(x)"), 3,
               "unknown function softplus", 0);
  expect_error("missing over:", FN1("x: f32[batch, seq]", "f32[batch]", "    return sum(x)"), 3, "sum needs over:", 0);
  expect_error("unknown named argument", FN1("x: f32[batch, seq]", "f32[batch]", "    return sum(x, along: seq)"), 3,
               "unknown named argument along:", 0);
  expect_error("wrong arity", FN1("x: f32[batch, seq]", "f32[batch, seq]", "    return exp(x, x)"), 3,
               "exp takes 1 argument, found 2", 0);
  expect_error("function of an integer tensor", FN1("x: i32[batch]", "i32[batch]", "    return exp(x)"), 3,
               "exp needs a float tensor", 0);
  expect_error("softmax over a missing dim", FN1("x: f32[batch]", "f32[batch]", "    return softmax(x, over: seq)"), 3,
               "softmax over seq", 0);
  expect_error("typed let mismatch",
               FN1("x: f32[batch]", "f32[batch]", "    let h: bf16[batch] = x\n    return x"), 3,
               "type of h: expected bf16[batch], found f32[batch]", 0);
  expect_error("call argument mismatch",
               "model lin {\n  param w: bf16[embed, embed2]\n"
               "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] { return (x @ w)[embed2 -> embed] }\n}\n"
               "model t {\n  param l: lin\n"
               "  fn forward(x: f32[batch, embed]) -> bf16[batch, embed] {\n    return l.forward(x)\n  }\n}\n",
               8, "argument x of l.forward: expected bf16[batch, embed], found f32[batch, embed]", 0);
  const char *stack =
    "model lin {\n  param w: bf16[embed, embed2]\n"
    "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] { return (x @ w)[embed2 -> embed] }\n}\n"
    "model t {\n  param blocks: lin[layers]\n  param one: lin\n"
    "  fn forward(x: bf16[batch, embed]) -> bf16[batch, embed] {\n%s\n    return x\n  }\n}\n";
  char src[2048];
  snprintf(src, sizeof src, stack, "    x = blocks.forward(x)");
  expect_error("stacked model called outside a loop", src, 9, "wrong stacked-model use", 0);
  snprintf(src, sizeof src, stack, "    for b in one { x = b.forward(x) }");
  expect_error("for over a single model", src, 9, "wrong stacked-model use", 0);
  snprintf(src, sizeof src, stack, "    for b in x { x = b.forward(x) }");
  expect_error("for over a tensor", src, 9, "wrong stacked-model use", 0);
  snprintf(src, sizeof src, stack, "    let y = blocks");
  expect_error("a stack used as a value", src, 9, "wrong stacked-model use", 0);
  snprintf(src, sizeof src, stack, "    for b in blocks { x = f32(b.forward(x)) }");
  expect_error("a loop rebinding with another type", src, 9, "rebinding x changes its type", 0);
  snprintf(src, sizeof src, stack, "    for b in blocks { let y = b.forward(x) }\n    x = y");
  expect_error("loop locals die with the loop", src, 10, "undefined name y", 0);
  snprintf(src, sizeof src, stack, "    x = x + 1\n    return x\n    x = x");
  expect_error("statement after return", src, 11, "unreachable", 0);
  snprintf(src, sizeof src, stack, "    let z = x @ one");
  expect_error("a model used as a value", src, 9, "one is a model", 0);
  snprintf(src, sizeof src, stack, "    x = one.backward(x)");
  expect_error("a model without that fn", src, 9, "model lin has no fn backward", 0);
  expect_error("a mistake in a function the entry never calls",
               "model unused {\n  fn forward(x: f32[batch]) -> f32[batch] { return x + y }\n}\n"
               "model t {\n  fn forward(x: f32[batch]) -> f32[batch] { return x }\n}\n",
               2, "undefined name y", 0);
}

/* A mistake in an inlined body is reported once, however often the body is inlined. */
static void test_once(void) {
  ut_begin("an error in an inlined body is reported once");
  UnitRun r;
  IrModule *m = run(&r,
                    "model lin {\n  fn forward(x: f32[batch]) -> f32[batch] { return x + nope }\n}\n"
                    "model t {\n  param a: lin  param b: lin\n"
                    "  fn forward(x: f32[batch]) -> f32[batch] { return a.forward(b.forward(x)) }\n}\n",
                    NULL, 0);
  UT_CHECK(!m, "built");
  int n = 0;
  for (const char *c = r.diags; c && (c = strstr(c, "undefined name nope")); c++) n++;
  UT_CHECK(n == 1, "reported %d times:\n%s", n, r.diags ? r.diags : "");
  unit_run_free(&r);
  ut_end();

  ut_begin("ir_print is stable");
  char *a = NULL, *b = NULL;
  size_t na = 0, nb = 0;
  for (int k = 0; k < 2; k++) {
    IrModule *mm = build_ok(&r, "", "llama.forward", LIB_LLAMA);
    FILE *f = open_memstream(k ? &b : &a, k ? &nb : &na);
    if (mm) ir_print(f, mm);
    fclose(f);
    unit_run_free(&r);
  }
  UT_CHECK(a && b && strcmp(a, b) == 0 && strstr(a, "attention") && strstr(a, "loop layers x3"), "dumps differ or lack ops");
  if (getenv("TEST_IR_PRINT")) fputs(a ? a : "", stdout);
  free(a);
  free(b);
  ut_end();
}

/* sharding_format and local sizes on a hand-made sharding. */
static void test_shardings(void) {
  ut_begin("sharding_format and local extents");
  UnitRun r;
  IrModule *m = build_ok(&r, FN1("x: bf16[batch, seq]", "bf16[batch, seq]", "    return x"), NULL, 0);
  if (m) {
    const Mesh *mesh = r.p->mesh;
    TensorType t = m->main->inputs[0]->type;
    Sharding s = {0};
    s.naxes[0] = 1, s.axes[0][0] = 0;
    s.naxes[1] = 2, s.axes[1][0] = 0, s.axes[1][1] = 1;
    char buf[128];
    sharding_format(buf, sizeof buf, &t, &s, mesh);
    UT_CHECK(strcmp(buf, "bf16[batch@data, seq@(data, model)]") == 0, "got %s", buf);
    s.naxes[1] = 0;
    s.partial = 2;
    sharding_format(buf, sizeof buf, &t, &s, mesh);
    UT_CHECK(strcmp(buf, "bf16[batch@data, seq]{sum: model}") == 0, "got %s", buf);
    s.partial = 3;
    sharding_format(buf, sizeof buf, &t, &s, mesh);
    UT_CHECK(strcmp(buf, "bf16[batch@data, seq]{sum: (data, model)}") == 0, "got %s", buf);
    UT_CHECK(sharding_local_extent(&t, &s, mesh, 0) == 4 && sharding_local_extent(&t, &s, mesh, 1) == 16, "extents");
    UT_CHECK(sharding_local_bytes(&t, &s, mesh) == 4 * 16 * 2, "local bytes");
    UT_CHECK(tensor_type_bytes(&t) == 8 * 16 * 2, "bytes");
    char small[8];
    sharding_format(small, sizeof small, &t, &s, mesh);
    UT_CHECK(strlen(small) == 7, "truncation");
  }
  unit_run_free(&r);
  ut_end();
}

/* Every sample and its imports build, verify, and fuse one attention per block. */
static void test_samples(void) {
  char dir[1024], names[64][256];
  int n = unit_samples(dir, sizeof dir, names, 64);
  for (int i = 0; i < n; i++) {
    char title[300], path[1400];
    snprintf(title, sizeof title, "sample %.255s builds", names[i]);
    snprintf(path, sizeof path, "%.1023s/%.255s", dir, names[i]);
    ut_begin(title);
    UnitRun r;
    unit_run_start(&r);
    unit_run_file(&r, path, NULL, ir_build);
    UT_CHECK(r.m, "did not build:\n%s", r.diags ? r.diags : "");
    if (r.m) {
      UT_CHECK(ir_verify(r.m, stdout), "ir_verify failed");
      int loops = unit_count_ops(r.m->main, OP_LOOP, true);
      UT_CHECK(unit_count_ops(r.m->main, OP_ATTENTION, true) == loops, "%d loops but %d attentions", loops,
               unit_count_ops(r.m->main, OP_ATTENTION, true));
    }
    unit_run_free(&r);
    ut_end();
  }
}

int main(void) {
  test_forms();
  test_names();
  test_inline_and_loops();
  test_models();
  test_errors();
  test_once();
  test_shardings();
  test_samples();
  return ut_summary();
}
