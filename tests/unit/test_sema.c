/* test_sema.c: the declaration checker's helpers and command-line choices, where a .shard case
 * cannot look: did-you-mean (compiler/base/suggest.c), checked int64 arithmetic (checked.h), the
 * "tensor too large" message (compiler/sema/size.c), the usage errors sema_program returns for
 * the driver to print with exit 2 (-D, --mesh, --layout, --entry naming nothing declared), which
 * now suggest the closest declared name, and size(d) folded into the stdlib attention's scale
 * (which must still fuse, following -D head=N). Prints PASS/FAIL per case and "N passed, N
 * failed"; exits 1 on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "diag.h"
#include "ir.h"
#include "parse.h"
#include "program.h"
#include "suggest.h"
#include "unit_test.h"

static Arena arena;

static const char *suggest_among(const char *want, const char *const *cands) {
  Suggest s = suggest_begin(want);
  for (int i = 0; cands[i]; i++) suggest_try(&s, cands[i]);
  return s.best;
}

static void expect_suggest(const char *want, const char *const *cands, const char *expected) {
  const char *got = suggest_among(want, cands);
  if (expected == NULL && got == NULL) return;
  if (expected && got && strcmp(expected, got) == 0) return;
  ut_fail("suggest '%s': got %s, want %s", want, got ? got : "(none)", expected ? expected : "(none)");
}

static const char *const PROGRAM =
    "target t { kind = gpu  flops = { bf16 = 1e15 }  hbm = 80e9  hbm_bw = 3e12  nvlink_bw = 4.5e11\n"
    "  node_size = 8  network_bw = 5e10  nvlink_latency = 1e-6  network_latency = 3e-6 }\n"
    "mesh pod = t[data: 4, model: 2]\n"
    "mesh big_pod = t[data: 8, model: 2]\n"
    "dim batch = 8, embed = 64, hidden = 128\n"
    "layout fsdp { batch: data  embed: data }\n"
    "layout tensor_parallel { hidden: model }\n"
    "model mlp {\n"
    "  param w: bf16[embed, hidden]\n"
    "  fn forward(x: bf16[batch, embed]) -> bf16[batch, hidden] { return x @ w }\n"
    "  fn backward(x: bf16[batch, embed]) -> bf16[batch, hidden] { return x @ w }\n"
    "}\n";

/* The usage error sema_program returns for these choices ("" when none). Without --entry the
 * program is also an error (mlp has two functions), which does not matter here. */
static const char *usage(SemaOptions opt) {
  diag_reset();
  FILE *sink = fopen("/dev/null", "w");
  diag_configure(sink, DIAG_MACHINE, false);
  Source *src = source_from_memory("test.shard", PROGRAM, strlen(PROGRAM));
  Ast *ast = parse_source(&arena, src);
  ParsedProgram pp = {&ast, 1};
  Program *p = sema_program(&arena, &pp, &opt);
  fclose(sink);
  diag_configure(stderr, DIAG_TEXT, false);
  return p->usage_error ? p->usage_error : "";
}

static void expect_usage(SemaOptions opt, const char *text) {
  const char *got = usage(opt);
  UT_CHECK(strstr(got, text) != NULL, "usage error: want \"%s\", got \"%s\"", text, got);
}

static const char *const ATTENTION =
    "import \"targets\"\n"
    "import \"layers\"\n"
    "mesh pod = tpu_v5e[data: 2, model: 2]\n"
    "dim batch = 2, seq = 8, kseq = seq, embed = 64, heads = 4, head = 128\n"
    "model net {\n"
    "  param attn: attention\n"
    "  fn forward(x: bf16[batch, seq, embed]) -> bf16[batch, seq, embed] { return attn.forward(x) }\n"
    "}\n";

/* The stdlib attention built with head = `head` (a -D when not 0): its fused op's scale, or -1
 * when there is no single fused attention. */
static double attention_scale(int64_t head) {
  diag_reset();
  Source *src = source_from_memory("attn.shard", ATTENTION, strlen(ATTENTION));
  ParsedProgram *pp = parse_program_source(&arena, src, SHARDC_SOURCE_STDLIB);
  DimOverride d = {intern_cstr("head"), head};
  SemaOptions opt = {.overrides = &d, .noverrides = head ? 1 : 0};
  Program *p = sema_program(&arena, pp, &opt);
  IrModule *m = diag_error_count() == 0 ? ir_build(&arena, p) : NULL;
  if (!m) return -1;
  int n = 0;
  double scale = -1;
  for (const Op *o = m->main->first; o; o = o->next)
    if (o->kind == OP_ATTENTION) n++, scale = o->scalar;
  for (const Op *o = m->main->first; o; o = o->next)
    if (o->kind == OP_SOFTMAX || o->kind == OP_CAUSAL) n = 0; /* left unfused */
  return n == 1 ? scale : -1;
}


/* ---- the layout's rules on one tensor (layout_map_dims; language.md, Layouts, Routing,
 * Pipelines) ---- */

static const char *const RULES =
    "target t { kind = gpu  flops = { bf16 = 1e15 }  hbm = 80e9  hbm_bw = 3e12  nvlink_bw = 4.5e11\n"
    "  node_size = 8  network_bw = 5e10  nvlink_latency = 1e-6  network_latency = 3e-6 }\n"
    "mesh m = t[data: 2, stage: 2, ctx: 2, ep: 2, model: 2]\n"
    "dim batch = 8, seq = 8, embed = 16, heads = 4, head = 4, expert = 4, cap = 2, layers = 4\n"
    "layout cp { heads: model  seq: (ctx, model) }\n"
    "layout ep { batch: (data, ep)  expert: ep }\n"
    "layout pp { layers: stage  batch: (data, stage)  embed: stage  heads: model }\n"
    "layout flat { batch: (data, stage)  embed: stage }\n"
    "layout mc { heads: model  seq: (model, ctx)  cap: (model, ctx) }\n"
    "model blk {\n"
    "  param w: bf16[embed, heads, head]\n"
    "  fn forward(x: bf16[batch, seq, embed]) -> bf16[batch, seq, embed] { return x }\n"
    "}\n"
    "model net {\n"
    "  param gate: bf16[embed, expert]\n"
    "  param blocks: blk[layers]\n"
    "  fn forward(x: bf16[batch, seq, embed]) -> f32[batch, seq, expert, cap] {\n"
    "    return route(f32(x @ gate), top: 1, over: expert, tokens: seq, slots: cap)\n"
    "  }\n"
    "}\n";

static Program *rules_program(const char *layout) {
  diag_reset();
  FILE *sink = fopen("/dev/null", "w");
  diag_configure(sink, DIAG_MACHINE, false);
  Source *src = source_from_memory("rules.shard", RULES, strlen(RULES));
  Ast *ast = parse_source(&arena, src);
  ParsedProgram pp = {&ast, 1};
  SemaOptions opt = {.layout = layout, .entry = "net.forward"};
  Program *p = sema_program(&arena, &pp, &opt);
  fclose(sink);
  diag_configure(stderr, DIAG_TEXT, false);
  return p->usage_error || !p->mesh ? NULL : p;
}

/* The sharding layout_map_dims gives a tensor of these dims, as "dim@(a, b), dim, ..." (the
 * expected strings below are written by hand from language.md's rules). */
static const char *mapped(const Program *p, const char *const *names, int n) {
  Dim *dims[MAX_RANK];
  for (int i = 0; i < n; i++) dims[i] = program_find_dim(p, intern_cstr(names[i]));
  Sharding s;
  layout_map_dims(p, dims, n, &s, NULL, false);
  char *out = arena_printf(&arena, "%s", "");
  for (int i = 0; i < n; i++) {
    out = arena_printf(&arena, "%s%s%s", out, i ? ", " : "", names[i]);
    if (!s.naxes[i]) continue;
    out = arena_printf(&arena, "%s@%s", out, s.naxes[i] > 1 ? "(" : "");
    for (int k = 0; k < s.naxes[i]; k++)
      out = arena_printf(&arena, "%s%s%s", out, k ? ", " : "", p->mesh->axes[s.axes[i][k]].name);
    if (s.naxes[i] > 1) out = arena_printf(&arena, "%s)", out);
  }
  return out;
}

#define EXPECT_MAPPED(p, want, ...)                                                    \
  do {                                                                                 \
    static const char *const names_[] = {__VA_ARGS__};                                 \
    const char *got_ = mapped(p, names_, (int)(sizeof names_ / sizeof names_[0]));     \
    UT_CHECK(strcmp(got_, want) == 0, "got %s, want %s", got_, want);                  \
  } while (0)

static void test_layout_rules(void) {
  ut_begin("a multi-axis rule keeps, in order, the axes the tensor does not use yet");
  Program *p = rules_program("cp");
  UT_CHECK(p != NULL, "the program does not check");
  if (p) {
    EXPECT_MAPPED(p, "batch, seq@(ctx, model), embed", "batch", "seq", "embed"); /* the residual stream */
    EXPECT_MAPPED(p, "batch, seq@ctx, heads@model, head", "batch", "seq", "heads", "head"); /* the queries */
  }
  ut_end();

  ut_begin("routing: in a tensor with the expert dim and not the tokens dim, the expert rule first");
  p = rules_program("ep");
  UT_CHECK(p != NULL && p->nroute_dims == 1, "the route's dims were not found");
  if (p) {
    EXPECT_MAPPED(p, "batch@(data, ep), seq, embed", "batch", "seq", "embed");      /* the tokens */
    EXPECT_MAPPED(p, "batch@data, expert@ep, cap, embed", "batch", "expert", "cap", "embed"); /* xe */
    EXPECT_MAPPED(p, "batch@(data, ep), seq, expert, cap", "batch", "seq", "expert", "cap"); /* the route's */
  }
  ut_end();

  ut_begin("pipelines: a rule naming the stage axis for another dim is skipped, with one warning at it");
  diag_reset();
  p = rules_program("pp");
  UT_CHECK(p != NULL && p->nstack_dims == 1, "the stacking dim was not found");
  if (p) {
    const LayoutRule *r = NULL;
    uint16_t st = layout_stage_axes(p, &r);
    UT_CHECK(st == 1u << 1 && r && r->dim == intern_cstr("layers"), "stage axes %#x", st);
    EXPECT_MAPPED(p, "batch, seq, embed", "batch", "seq", "embed");
    EXPECT_MAPPED(p, "layers@stage, embed, heads@model, head", "layers", "embed", "heads", "head");
  }
  ut_end();

  /* The same rule, a whole-or-nothing reading against language.md's (a multi-axis rule keeps, in
   * order, those of its axes the tensor does not use yet). Sizes: seq 8, cap 2; ctx 2, model 2. */
  ut_begin("a multi-axis rule whose first axis another dim took keeps the rest; divisibility is the kept axes'");
  p = rules_program("mc");
  if (p) {
    EXPECT_MAPPED(p, "seq@(model, ctx), embed", "seq", "embed");        /* nothing taken: the whole rule */
    EXPECT_MAPPED(p, "seq@ctx, heads@model", "seq", "heads");           /* model taken by heads: ctx kept */
    /* cap 2: (model, ctx) is 4 and does not divide it, so alone the rule is skipped; with heads on
     * model the kept ctx (2) divides it */
    EXPECT_MAPPED(p, "cap, embed", "cap", "embed");
    EXPECT_MAPPED(p, "heads@model, cap@ctx", "heads", "cap");
    EXPECT_MAPPED(p, "seq@(model, ctx), cap", "seq", "cap");            /* both taken: skipped */
    /* an explicit `@` takes an axis as an earlier rule does (layout_apply) */
    TypeSpec t = {.dtype = DT_BF16, .rank = 2};
    t.dims[0] = program_find_dim(p, intern_cstr("embed"));
    t.dims[1] = program_find_dim(p, intern_cstr("seq"));
    t.at[0][0] = intern_cstr("model");
    t.nat[0] = 1;
    Sharding s;
    UT_CHECK(layout_apply(p, &t, &s, NULL), "embed@model is legal");
    UT_CHECK(s.naxes[0] == 1 && s.axes[0][0] == mesh_axis_index(p->mesh, intern_cstr("model")), "embed@model");
    UT_CHECK(s.naxes[1] == 1 && s.axes[1][0] == mesh_axis_index(p->mesh, intern_cstr("ctx")),
             "seq: (model, ctx) after embed@model keeps ctx (got %d axes)", s.naxes[1]);
  }
  ut_end();

  ut_begin("without a pipeline (no stacked param on the axis) the same rules apply");
  p = rules_program("flat");
  if (p) {
    UT_CHECK(layout_stage_axes(p, NULL) == 0, "a stage axis without a stacking rule");
    EXPECT_MAPPED(p, "batch@(data, stage), seq, embed", "batch", "seq", "embed");
    EXPECT_MAPPED(p, "embed@stage, heads, head", "embed", "heads", "head");
  }
  ut_end();
}

int main(void) {
  arena_init(&arena);
  test_layout_rules();

  ut_begin("edit distance: insertions, deletions, swaps, case");
  UT_CHECK(suggest_distance("hidden", "hiden") == 1, "hidden/hiden");
  UT_CHECK(suggest_distance("embed", "embde") == 1, "a swap is one edit");
  UT_CHECK(suggest_distance("Batch", "batch") == 0, "case is ignored");
  UT_CHECK(suggest_distance("seq", "kseq") == 1, "seq/kseq");
  UT_CHECK(suggest_distance("", "abc") == 3, "empty");
  UT_CHECK(suggest_distance("abc", "xyz") == 3, "abc/xyz");
  char longname[100];
  memset(longname, 'a', 99);
  longname[99] = 0;
  UT_CHECK(suggest_distance(longname, "a") > 2, "names over 64 bytes are not compared");
  ut_end();

  ut_begin("did-you-mean picks the closest, or nothing");
  static const char *const dims[] = {"batch", "seq", "kseq", "embed", "hidden", "heads", "head", "layers", NULL};
  expect_suggest("hiden", dims, "hidden");
  expect_suggest("embde", dims, "embed");
  expect_suggest("lay", dims, "layers");          /* a prefix */
  expect_suggest("layer", dims, "layers");
  expect_suggest("sq", dims, "seq");              /* short names: one edit */
  expect_suggest("xy", dims, NULL);               /* two edits of a 2-byte name is anything */
  expect_suggest("vocab", dims, NULL);
  expect_suggest("heads", dims, "head");          /* exact names are not suggested for themselves */
  static const char *const keys[] = {"hbm", "hbm_bw", "ici_bw", NULL};
  expect_suggest("hbm_bandwidth", keys, "hbm_bw"); /* the longer shared start wins */
  static const char *const targets[] = {"tpu_v4", "tpu_v5e", "tpu_v5p", "h100", "h200", NULL};
  expect_suggest("tpu_v5", targets, "tpu_v5e");   /* first of equally close */
  expect_suggest("H100", targets, "h100");
  Suggest s = suggest_begin("hiden");
  suggest_try(&s, "hidden");
  char buf[64];
  UT_CHECK(strcmp(suggest_text(&s, buf, sizeof buf), "; did you mean 'hidden'?") == 0, "text: %s", buf);
  s = suggest_begin("zzz");
  suggest_try(&s, "hidden");
  UT_CHECK(strcmp(suggest_text(&s, buf, sizeof buf), "") == 0, "no suggestion: empty text");
  UT_CHECK(suggest_is_typo("hiden", "hidden") && !suggest_is_typo("lay", "layers"), "typo, not prefix");
  ut_end();

  ut_begin("checked and saturating int64");
  int64_t r;
  UT_CHECK(!ckd_mul(&r, (int64_t)1 << 31, (int64_t)1 << 31) && r == (int64_t)1 << 62, "2^31 x 2^31");
  UT_CHECK(ckd_mul(&r, (int64_t)1 << 32, (int64_t)1 << 31), "2^63 overflows");
  UT_CHECK(ckd_add(&r, INT64_MAX, 1), "INT64_MAX + 1 overflows");
  UT_CHECK(ckd_sub(&r, INT64_MIN, 1), "INT64_MIN - 1 overflows");
  UT_CHECK(sat_mul((int64_t)1 << 40, (int64_t)1 << 40) == INT64_MAX, "sat_mul clamps up");
  UT_CHECK(sat_mul(-((int64_t)1 << 40), (int64_t)1 << 40) == INT64_MIN, "sat_mul clamps down");
  UT_CHECK(sat_add(INT64_MAX, INT64_MAX) == INT64_MAX && sat_add(INT64_MIN, -1) == INT64_MIN, "sat_add clamps");
  UT_CHECK(sat_add(sat_mul(INT64_MAX, 2), 5) == INT64_MAX, "a saturated total stays saturated");
  UT_CHECK(sat_mul(6, 7) == 42 && sat_add(40, 2) == 42, "exact when it fits");
  UT_CHECK(size_ok(SIZE_LIMIT) && !size_ok(SIZE_LIMIT + 1) && !size_ok(0), "size_ok");
  ut_end();

  ut_begin("tensor too large: the message shows the product and the -D");
  Dim a = {.name = intern_cstr("seq"), .size = (int64_t)1 << 44, .overridden = true};
  Dim b = {.name = intern_cstr("embed"), .size = 1 << 20};
  Dim *ab[2] = {&a, &b};
  const char *m = tensor_size_error(&arena, ab, 2, DT_BF16);
  UT_CHECK(m && strcmp(m, "tensor too large: bf16[seq, embed] would hold 3.69e+19 bytes (seq 17592186044416 x "
                          "embed 1048576 x 2 bytes; set by -D seq=17592186044416); a tensor holds at most 2^62 "
                          "bytes") == 0, "got %s", m ? m : "(none)");
  b.size = 1 << 17; /* 2^44 x 2^17 x 2 = 2^62: exactly the limit */
  UT_CHECK(tensor_size_error(&arena, ab, 2, DT_BF16) == NULL, "2^62 bytes are allowed");
  UT_CHECK(tensor_size_error(&arena, ab, 2, DT_F32) != NULL, "2^63 bytes are not");
  ut_end();

  ut_begin("usage errors suggest the closest declared name");
  DimOverride d1 = {intern_cstr("hiden"), 4};
  expect_usage((SemaOptions){.overrides = &d1, .noverrides = 1},
               "-D hiden: the program declares no dim 'hiden'; did you mean 'hidden'? (dims: batch, embed, hidden)");
  DimOverride d2 = {intern_cstr("hidden"), SIZE_LIMIT + 1};
  expect_usage((SemaOptions){.overrides = &d2, .noverrides = 1},
               "-D hidden=4611686018427387905: a dim's size is at most 2^62 (4611686018427387904)");
  expect_usage((SemaOptions){.mesh = "big_pd"}, "--mesh big_pd: no such mesh; did you mean 'big_pod'? (meshes: pod, big_pod)");
  expect_usage((SemaOptions){.layout = "tensor"},
               "--layout tensor: no such layout; did you mean 'tensor_parallel'? (layouts: fsdp, tensor_parallel)");
  expect_usage((SemaOptions){.layout = "zzz"}, "--layout zzz: no such layout (layouts: fsdp, tensor_parallel)");
  expect_usage((SemaOptions){.entry = "mpl.forward"}, "--entry mpl.forward: no model 'mpl'; did you mean 'mlp'?");
  expect_usage((SemaOptions){.entry = "mlp.forwad"},
               "--entry mlp.forwad: model 'mlp' has no function 'forwad'; did you mean 'forward'? (its functions: "
               "forward, backward)");
  expect_usage((SemaOptions){.entry = "mlp.forward"}, "");
  ut_end();

  ut_begin("size(head): the stdlib attention scales by 1/sqrt(head), fused, following -D");
  double s128 = attention_scale(0), s64 = attention_scale(64), s8 = attention_scale(8);
  UT_CHECK(s128 > 0 && fabs(s128 - 1 / sqrt(128.0)) < 1e-15, "head = 128: scale %.17g", s128);
  UT_CHECK(s64 == 0.125, "-D head=64: scale %.17g, want 0.125", s64);
  UT_CHECK(s8 > 0 && fabs(s8 - 1 / sqrt(8.0)) < 1e-15, "-D head=8: scale %.17g", s8);
  ut_end();

  source_free_all();
  intern_reset();
  arena_free(&arena);
  return ut_summary();
}
