/* test_fitsearch.c: `check`'s suggestions when a program does not fit (compiler/analysis/fitsearch.c).
 *
 * Every plan the search prints is re-checked here on its own terms: the changes are written into
 * the program's source text (a rule added to or grown in the layout block, keys set in the train
 * block, a padded dim as -D), and that text goes through the whole of `check` again; its memory
 * must be the figure the plan reports, and its verdict the same. So a plan can only pass if the
 * program its words describe is the program the search checked.
 * Then the hand-derived cases: the least number of devices for 70B with adam on 8 H100s
 * (tests/check/needs_devices.shard), GPT-2's vocabulary padded to 50304
 * (tests/check/gpt2_vocab_pad.shard), and a generated program of 100 MLP blocks that fits once two
 * rules change. */
#define _GNU_SOURCE /* mkstemps */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "fitsearch.h"
#include "memory.h"
#include "unit_test.h"

#ifndef SHARDC_SOURCE_DIR
#define SHARDC_SOURCE_DIR "."
#endif

static FILE *quiet;

typedef struct Run {
  Arena arena;
  CheckedProgram cp;
  MemoryReport r;
  FitAdvice fa;
  bool ok;
} Run;

/* check's front half, the pass pipeline, the memory model and (when it does not fit) the search. */
static bool run_check(Run *R, const char *path, const char *layout, DimOption *dims, int ndims, bool search) {
  Options o = {.argv0 = "test_fitsearch", .command = "check", .input = path, .layout = layout, .dims = dims,
               .ndims = ndims};
  diag_reset();
  diag_configure(quiet, DIAG_MACHINE, false);
  arena_init(&R->arena);
  memset(&R->fa, 0, sizeof R->fa);
  R->ok = check_load(&o, &R->arena, &R->cp) == EXIT_OK && R->cp.ir && pipeline_run(R->cp.ir, R->cp.prog) &&
          diag_error_count() == 0;
  if (!R->ok) return false;
  memory_estimate(R->cp.prog, R->cp.ir, &R->r);
  if (search) {
    FitInput in = {.cp = &R->cp, .base = &R->r};
    fit_search(&in, &R->fa);
  }
  return true;
}

static void run_free(Run *R) { arena_free(&R->arena); }

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
  if (s) s[n] = 0;
  fclose(f);
  return s;
}

/* s with [at, at + len) replaced by `with` (s is freed). */
static char *splice(char *s, size_t at, size_t len, const char *with) {
  size_t n = strlen(s), w = strlen(with);
  char *t = malloc(n - len + w + 1);
  memcpy(t, s, at);
  memcpy(t + at, with, w);
  memcpy(t + at + w, s + at + len, n - at - len + 1);
  free(s);
  return t;
}

/* The `{ ... }` block after the first "KEYWORD NAME" at a line start (NAME NULL: any): the offsets
 * of its '{' and '}' (layout and train bodies hold no braces). */
static bool find_block(const char *s, const char *keyword, const char *name, size_t *open, size_t *close) {
  char head[256];
  snprintf(head, sizeof head, "%s %s", keyword, name ? name : "");
  size_t hl = strlen(head);
  for (const char *p = s; (p = strstr(p, head)) != NULL; p++) {
    if (p != s && p[-1] != '\n') continue;
    if (name && !(p[hl] == ' ' || p[hl] == '{')) continue;
    const char *o = strchr(p, '{'), *c = o ? strchr(o, '}') : NULL;
    if (!c) return false;
    *open = (size_t)(o - s), *close = (size_t)(c - s);
    return true;
  }
  return false;
}

/* The rule line (or in-line rule) for `dim` inside [open, close): offset of its text after ':' and
 * the length to the end of its value (a comment, a newline, the next rule or the '}'). */
static bool find_rule(const char *s, size_t open, size_t close, const char *dim, size_t *at, size_t *len) {
  size_t dl = strlen(dim);
  for (size_t i = open + 1; i + dl < close; i++) {
    bool start = s[i - 1] == '{' || s[i - 1] == ' ' || s[i - 1] == '\n' || s[i - 1] == '\t';
    if (!start || strncmp(s + i, dim, dl) != 0 || s[i + dl] != ':') continue;
    size_t v = i + dl + 1, e = v;
    while (e < close && s[e] == ' ') e++;
    if (s[e] == '(') while (e < close && s[e] != ')') e++;
    while (e < close && s[e] != '\n' && s[e] != '#' && s[e] != ' ' && s[e] != '}') e++;
    *at = v, *len = e - v;
    return true;
  }
  return false;
}

/* The program text a plan describes, written from the changes' own terms. */
static char *apply_plan(char *src, const Program *p, const FitChange *ch, int n, DimOption *dims, int *ndims) {
  const Mesh *m = p->mesh;
  const char *layout = p->layout ? p->layout->name : "suggested";
  if (!p->layout) src = splice(src, strlen(src), 0, "\nlayout suggested {\n}\n"); /* "a new layout" */
  for (int i = 0; i < n; i++) {
    const FitChange *c = &ch[i];
    if (c->pad_to > 0) dims[(*ndims)++] = (DimOption){c->dim->name, c->pad_to};
    char text[256];
    size_t open, close, at, len;
    if (c->kind == FIT_RULE) {
      int k = snprintf(text, sizeof text, " %s", c->naxes > 1 ? "(" : "");
      for (int j = 0; j < c->naxes; j++) k += snprintf(text + k, sizeof text - (size_t)k, "%s%s", j ? ", " : "", m->axes[c->axes[j]].name);
      snprintf(text + k, sizeof text - (size_t)k, "%s", c->naxes > 1 ? ")" : "");
      if (!find_block(src, "layout", layout, &open, &close)) return src;
      if (c->extends && find_rule(src, open, close, c->dim->name, &at, &len)) {
        src = splice(src, at, len, text);
      } else {
        char line[300];
        snprintf(line, sizeof line, "  %s:%s\n", c->dim->name, text);
        src = splice(src, close, 0, line);
      }
    } else if (c->kind == FIT_REMAT || c->kind == FIT_ZERO || c->kind == FIT_MICRO) {
      static const char *const remat[] = {"none", "full", "dots"};
      const char *key = c->kind == FIT_REMAT ? "remat" : c->kind == FIT_ZERO ? "zero" : "microbatches";
      char value[32];
      snprintf(value, sizeof value, "%s", c->kind == FIT_REMAT ? remat[c->value] : "");
      if (c->kind != FIT_REMAT) snprintf(value, sizeof value, "%d", c->value);
      if (!find_block(src, "train", NULL, &open, &close)) return src;
      char pat[64];
      snprintf(pat, sizeof pat, "\n  %s = ", key);
      const char *hit = strstr(src + open, pat);
      if (hit && (size_t)(hit - src) < close) {
        size_t v = (size_t)(hit - src) + strlen(pat), e = v;
        while (src[e] && src[e] != '\n' && src[e] != ' ' && src[e] != '#') e++;
        src = splice(src, v, e - v, value);
      } else {
        snprintf(text, sizeof text, "  %s = %s\n", key, value);
        src = splice(src, close, 0, text);
      }
    }
  }
  return src;
}

/* Each plan (and padding) of R's advice, written into the source and checked again. */
static void recheck_plans(Run *R, const char *path, const char *layout) {
  char tmp[] = "/tmp/test_fitsearch_XXXXXX.shard";
  int fd = mkstemps(tmp, 6);
  if (fd < 0) {
    ut_fail("cannot make a temporary file");
    return;
  }
  close(fd);
  const FitAdvice *fa = &R->fa;
  for (int i = 0; i < fa->nplans + fa->npads; i++) {
    const FitPlan *pl = i < fa->nplans ? &fa->plans[i] : &fa->pads[i - fa->nplans];
    for (int upto = 1; upto <= pl->n; upto++) {
      const FitFigures *want = &pl->after[upto - 1];
      if (!want->valid) continue; /* a prefix the budget left unchecked */
      char *src = read_text(path);
      DimOption dims[FIT_MAX_CHANGES];
      int ndims = 0;
      src = apply_plan(src, R->cp.prog, pl->change, upto, dims, &ndims);
      FILE *f = fopen(tmp, "w");
      fputs(src, f);
      fclose(f);
      free(src);
      Run Q;
      if (!run_check(&Q, tmp, layout, dims, ndims, false)) {
        ut_fail("plan %d (%s ...), first %d change(s): the program it describes has errors", i + 1, pl->text[0], upto);
      } else {
        if (Q.r.total != want->total)
          ut_fail("plan %d (%s ...), first %d change(s): reports %lld bytes per device, the program it describes "
                  "has %lld", i + 1, pl->text[0], upto, (long long)want->total, (long long)Q.r.total);
        if (Q.r.fits != want->fits) ut_fail("plan %d: reports fits = %d, the program has %d", i + 1, want->fits, Q.r.fits);
      }
      run_free(&Q);
    }
  }
  unlink(tmp);
}

/* The not-fitting programs of the tests and samples, each plan re-checked. */
static void case_recheck(const char *rel, const char *layout) {
  char path[1024], name[1200];
  snprintf(path, sizeof path, "%s/%s", SHARDC_SOURCE_DIR, rel);
  snprintf(name, sizeof name, "%s%s%s: every suggestion is the program its words describe", rel,
           layout ? " --layout " : "", layout ? layout : "");
  ut_begin(name);
  Run R;
  if (!run_check(&R, path, layout, NULL, 0, true)) {
    ut_fail("did not check");
  } else if (R.r.fits) {
    ut_fail("fits: nothing to suggest");
  } else {
    if (R.fa.nplans == 0 && R.fa.min_devices <= R.cp.prog->mesh->devices) ut_fail("no plan, and no bound");
    recheck_plans(&R, path, layout);
  }
  run_free(&R);
  ut_end();
}

/* 100 MLP blocks [embed, h_i] x [h_i, embed], every h_i its own dim, data parallel on 64 H100s:
 * params 100 x 2 x 8192 x 32768 x 2 B = 107.4 GB and adam's state 429.5 GB on every device. Over
 * all 64 devices (`batch` and `embed` over (data, model)) the states are 8.4 GB per device and
 * the activations a 64th: it fits. */
static void write_mlp100(const char *path) {
  FILE *f = fopen(path, "w");
  fprintf(f, "import \"targets\"\nmesh pod = h100[data: 8, model: 8]\ndim batch = 64, seq = 4096, embed = 8192\n");
  for (int i = 0; i < 100; i++) fprintf(f, "dim h%d = 32768\n", i);
  fprintf(f, "layout dp { batch: data }\nmodel big {\n");
  for (int i = 0; i < 100; i++) fprintf(f, "  param w%d: bf16[embed, h%d]\n  param v%d: bf16[h%d, embed]\n", i, i, i, i);
  fprintf(f, "  fn forward(x: bf16[batch, seq, embed]) -> bf16[batch, seq, embed] {\n");
  for (int i = 0; i < 100; i++) fprintf(f, "    x = x + gelu(x @ w%d) @ v%d\n", i, i);
  fprintf(f, "    return x\n  }\n}\ntrain big.forward {\n  loss = mse\n  optimizer = adam\n}\n");
  fclose(f);
}

int main(void) {
  quiet = fopen("/dev/null", "w");
  if (!quiet) quiet = stderr;

  case_recheck("samples/llama3_70b.shard", "dp");
  case_recheck("samples/llama3_70b.shard", "dp_tp");
  case_recheck("samples/llama3_70b.shard", "fsdp_tp");
  case_recheck("tests/check/llama3_70b_book.shard", NULL);
  case_recheck("tests/check/gpt2_vocab_pad.shard", NULL);
  case_recheck("tests/check/needs_devices.shard", NULL);
  case_recheck("tests/check/suggest_indivisible_axis.shard", NULL);
  case_recheck("tests/check/no_layout.shard", NULL);
  case_recheck("tests/check/remat_selective_nofit.shard", "fsdp"); /* every other remat an anchor */

  /* the bound, by hand in tests/check/needs_devices.shard */
  ut_begin("70B with adam on 8 H100s: needs at least 11 devices (846,649,753,600 B of params, grads and state)");
  Run R;
  char path[1024];
  snprintf(path, sizeof path, "%s/tests/check/needs_devices.shard", SHARDC_SOURCE_DIR);
  if (run_check(&R, path, NULL, NULL, 0, true)) {
    double all = R.fa.state_params + R.fa.state_grads + R.fa.state_optimizer;
    UT_CHECK(all == 846649753600.0, "params + grads + optimizer = %.0f B, want 846649753600", all);
    UT_CHECK(R.fa.min_devices == 11, "at least %lld devices, want 11", (long long)R.fa.min_devices);
    UT_CHECK(!R.fa.found, "a plan fits on 8 devices");
  } else {
    ut_fail("did not check");
  }
  run_free(&R);
  ut_end();

  ut_begin("GPT-2's vocabulary: `vocab: model` over 4 pads 50257 to 50304, 75,200 more params");
  snprintf(path, sizeof path, "%s/tests/check/gpt2_vocab_pad.shard", SHARDC_SOURCE_DIR);
  if (run_check(&R, path, NULL, NULL, 0, true)) {
    UT_CHECK(R.fa.npads == 1, "%d paddings, want 1", R.fa.npads);
    if (R.fa.npads == 1) {
      const FitChange *c = &R.fa.pads[0].change[0];
      UT_CHECK(strcmp(c->dim->name, "vocab") == 0 && c->pad_to == 50304, "pads %s to %lld", c->dim->name,
               (long long)c->pad_to);
      Run Q;
      DimOption d = {"vocab", 50304};
      if (run_check(&Q, path, NULL, &d, 1, false))
        UT_CHECK(Q.r.param_count - R.r.param_count == 75200, "%lld more params, want 75200",
                 (long long)(Q.r.param_count - R.r.param_count));
      run_free(&Q);
      UT_CHECK(R.fa.pads[0].after[0].flops > R.fa.base.flops, "padding adds no FLOPs");
    }
  } else {
    ut_fail("did not check");
  }
  run_free(&R);
  ut_end();

  ut_begin("100 MLP blocks, data parallel on 64 H100s: a plan that fits, re-checked");
  char tmp[] = "/tmp/test_fitsearch_mlp100_XXXXXX.shard";
  int fd = mkstemps(tmp, 6);
  if (fd >= 0) {
    close(fd);
    write_mlp100(tmp);
    if (run_check(&R, tmp, NULL, NULL, 0, true)) {
      UT_CHECK(!R.r.fits, "fits as written");
      UT_CHECK(R.fa.found, "no plan fits (searched %d, checked %d)", R.fa.candidates, R.fa.checked);
      recheck_plans(&R, tmp, NULL);
    } else {
      ut_fail("did not check");
    }
    run_free(&R);
    unlink(tmp);
  }
  ut_end();
  return ut_summary();
}
