/* gen_program.c: writes a large, syntactically valid .shard program for the front-end benchmark.
 *
 * In: an output path, a line count to reach (default 1,000,000) and a seed (default 1). Out: the
 * file, made of numbered "units" of 76 lines each. A unit declares dims (with dim
 * expressions), a target (every kind of value: numbers, negative numbers, floats, strings, names,
 * calls, lists, nested blocks), two meshes, a layout (one- and multi-axis rules), three models (tensor,
 * instance and stacked params; functions using every statement and expression form of the
 * grammar) and a train step. The same seed always gives the same bytes: numbers and a few
 * choices come from a fixed xorshift generator, never from the clock.
 *
 * The program is meant to parse cleanly, not to type-check: the benchmark times the parser. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state;

static uint64_t rng_next(void) {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return rng_state = x;
}

/* A number in [lo, hi]. */
static int rng_range(int lo, int hi) { return lo + (int)(rng_next() % (uint64_t)(hi - lo + 1)); }

static const char *const targets[] = {"tpu_v4", "tpu_v5e", "tpu_v5p", "tpu_v6e",
                                      "a100",   "h100",    "h200",    "b200"};
static const char *const dtypes[] = {"f32", "bf16", "f16", "f8", "i32", "i8"};
static const char *const unary_fns[] = {"exp", "log", "sqrt", "rsqrt", "tanh",
                                        "sigmoid", "relu", "gelu", "silu"};
static const char *const reductions[] = {"sum", "mean", "max"};

/* Writes unit u; returns the number of lines written. */
static long write_unit(FILE *f, long u) {
  long lines = 0;
#define L(...) (fprintf(f, __VA_ARGS__), fputc('\n', f), lines++)
#define BLANK() (fputc('\n', f), lines++)
  const char *dt = dtypes[rng_range(0, 3)];
  const char *fn1 = unary_fns[rng_range(0, 8)];
  const char *red = reductions[rng_range(0, 2)];
  int embed = 64 * rng_range(1, 64), heads = rng_range(1, 32), head = 64 * rng_range(1, 4);

  L("# ---- unit %ld ----", u);
  L("dim u%ld_batch = %d, u%ld_seq = %d_048", u, 8 * rng_range(1, 64), u, rng_range(1, 9));
  L("dim u%ld_embed = %d, u%ld_hidden = u%ld_embed * 4", u, embed, u, u);
  L("dim u%ld_heads = %d, u%ld_head = %d, u%ld_q = u%ld_heads * u%ld_head", u, heads, u, head, u, u,
    u);
  L("dim u%ld_kv = (u%ld_heads + %d) / 2 - 1, u%ld_kseq = u%ld_seq", u, u, rng_range(1, 9), u, u);
  L("dim u%ld_vocab = 32_000, u%ld_layers = %d", u, u, rng_range(1, 126));
  BLANK();
  L("target u%ld_chip {                # a user-declared target", u);
  L("  kind = tpu");
  L("  name = \"chip %ld\"", u);
  L("  flops = { bf16 = %d.%de14, f32 = %d.5e13 }", rng_range(1, 9), rng_range(0, 99),
    rng_range(1, 9));
  L("  hbm = %d_000_000_000  hbm_bw = 8.19e11", rng_range(8, 192));
  L("  torus = [%d, %d, %d]  wrap = [true, false, -1]", rng_range(1, 16), rng_range(1, 16),
    rng_range(1, 16));
  L("  ici = { bw = 4.5e10  latency = 1e-6  links = { x = 2 y = 2 } }");
  L("  offset = -%d", rng_range(1, 1000));
  L("  schedule = interleaved(%d)", rng_range(1, 8));
  L("}");
  L("mesh u%ld_pod = %s[data: %d, model: %d]", u, targets[rng_range(0, 7)], 1 << rng_range(0, 6),
    1 << rng_range(0, 3));
  L("mesh u%ld_big = u%ld_chip[stage: 4, data: 8, ctx: 2, model: 4]", u, u);
  BLANK();
  L("layout u%ld_fsdp_tp {", u);
  L("  u%ld_batch: data", u);
  L("  u%ld_embed: data", u);
  L("  u%ld_hidden: model", u);
  L("  u%ld_seq: (ctx, model)", u);
  L("  u%ld_layers: stage", u);
  L("}");
  BLANK();
  L("model u%ld_attention {", u);
  L("  param wq: %s[u%ld_embed, u%ld_q]", dt, u, u);
  L("  param wk: %s[u%ld_embed@data, u%ld_q@model]", dt, u, u);
  L("  param wv: %s[u%ld_embed@(data, ctx), u%ld_q]", dt, u, u);
  L("  param wo: %s[u%ld_q, u%ld_embed]", dt, u, u);
  L("  param scale: f32[u%ld_embed]", u);
  BLANK();
  L("  fn forward(x: %s[u%ld_batch@data, u%ld_seq, u%ld_embed]) -> %s[u%ld_batch, u%ld_seq, u%ld_embed] {",
    dt, u, u, u, dt, u, u, u);
  L("    let h = rmsnorm(x, scale, over: u%ld_embed)", u);
  L("    let q = split(h @ wq, u%ld_q -> (u%ld_heads, u%ld_head))", u, u, u);
  L("    let k = split(h @ wk, u%ld_q -> (u%ld_heads, u%ld_head))[u%ld_seq -> u%ld_kseq]", u, u, u, u,
    u);
  L("    let v = split(h @ wv, u%ld_q -> (u%ld_heads, u%ld_head))[u%ld_seq -> u%ld_kseq]", u, u, u, u,
    u);
  L("    let s: f32[u%ld_batch, u%ld_heads@model, u%ld_seq, u%ld_kseq] = contract(q, k, over: u%ld_head) * 0.125",
    u, u, u, u, u);
  L("    s = causal(s, u%ld_seq, u%ld_kseq)", u, u);
  L("    let p = softmax(s, over: u%ld_kseq)", u);
  L("    let o = merge(contract(p, v, over: u%ld_kseq), (u%ld_heads, u%ld_head) -> u%ld_q)", u, u, u,
    u);
  L("    return x + o @ wo");
  L("  }");
  L("}");
  BLANK();
  L("model u%ld_block {", u);
  L("  param attn: u%ld_attention", u);
  L("  param w_in: %s[u%ld_embed, u%ld_hidden]", dt, u, u);
  L("  param w_out: %s[u%ld_hidden, u%ld_embed]", dt, u, u);
  L("  fn forward(x: %s[u%ld_batch, u%ld_seq, u%ld_embed]) -> %s[u%ld_batch, u%ld_seq, u%ld_embed] {",
    dt, u, u, u, dt, u, u, u);
  L("    let a = attn.forward(x)");
  L("    let g = %s(a @ w_in) * sigmoid(a @ w_in) - -%d.5 / (a @ w_in + 1)", fn1, rng_range(0, 9));
  L("    let n = %s(g, over: (u%ld_batch, u%ld_seq)) + %s(g, over: u%ld_hidden)", red, u, u, red, u);
  L("    return a + (g @ w_out)[u%ld_seq -> u%ld_seq, u%ld_embed -> u%ld_embed]  # a no-op rename", u,
    u, u, u);
  L("  }");
  L("}");
  BLANK();
  L("model u%ld_lm {", u);
  L("  param embedding: %s[u%ld_vocab, u%ld_embed]", dt, u, u);
  L("  param blocks: u%ld_block[u%ld_layers]", u, u);
  L("  param unembed: %s[u%ld_embed, u%ld_vocab@model]", dt, u, u);
  L("  fn forward(tokens: i32[u%ld_batch, u%ld_seq]) -> f32[u%ld_batch, u%ld_seq, u%ld_vocab] {", u,
    u, u, u, u);
  L("    let x = take(embedding, tokens)");
  L("    for b in blocks { x = b.forward(x) }");
  L("    return f32(x @ unembed)");
  L("  }");
  L("}");
  L("train u%ld_lm.forward {", u);
  L("  loss = cross_entropy  optimizer = adam  master = f32  lr = %d.0e-4", rng_range(1, 9));
  L("  remat = full  microbatches = %d  schedule = 1f1b  zero = 1", 1 << rng_range(0, 4));
  L("  note = \"unit %ld: # not a comment\"", u);
  L("}");
  BLANK();
#undef L
#undef BLANK
  return lines;
}

int main(int argc, char **argv) {
  const char *out = NULL;
  long target = 1000000;
  unsigned long long seed = 1;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--lines") == 0 && i + 1 < argc) target = atol(argv[++i]);
    else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
    else if (argv[i][0] != '-' && !out) out = argv[i];
    else {
      fprintf(stderr, "usage: gen_program OUT.shard [--lines N] [--seed S]\n");
      return 2;
    }
  }
  if (!out || target <= 0) {
    fprintf(stderr, "usage: gen_program OUT.shard [--lines N] [--seed S]\n");
    return 2;
  }
  rng_state = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  if (!rng_state) rng_state = 1;

  FILE *f = fopen(out, "w");
  if (!f) {
    fprintf(stderr, "gen_program: cannot write %s: %s\n", out, strerror(errno));
    return 1;
  }
  long lines = 0, units = 0;
  fprintf(f, "# Generated by bench/gen_program (seed %llu): a front-end benchmark input.\n", seed);
  fprintf(f, "import \"targets\"\n");
  lines += 2;
  while (lines < target) lines += write_unit(f, units++);
  if (fclose(f) != 0) {
    fprintf(stderr, "gen_program: error writing %s: %s\n", out, strerror(errno));
    return 1;
  }
  printf("gen_program: wrote %s: %ld lines, %ld units (seed %llu)\n", out, lines, units, seed);
  return 0;
}
