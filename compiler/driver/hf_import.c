/* hf_import.c: a Hugging Face config.json to a .shard program on the stdlib's models (hf_import.h).
 *
 * Each supported model_type has one function below that reads the keys it understands into a Plan:
 * the stdlib model, the `dim` lines, the parameter count by that model's formula (the header of
 * its stdlib file), the dims tensor parallelism may split, and what differs from the original.
 * A value that would change the architecture in a way the stdlib model does not state is an error
 * at that value, naming the key; a key that changes nothing here (the rotary embedding's base,
 * dropout, token ids) is noted in the header with the reason. Keys no family knows are warned
 * about and listed, never silently dropped.
 *
 * The writer then picks what the config does not say (docs/import.md, "Defaults"):
 *   mesh   H100s: the fewest, a power of two and at least one node of 8, whose share of the training
 *          state (16 bytes per param: bf16 params and grads, f32 master copy, Adam's two f32
 *          moments) is at most 40 GB, half an H100's HBM, the other half for activations;
 *          tensor parallelism over `model` (up to 8, within a node, a power of two dividing every
 *          dim it splits) for models of 10e9 params or more; expert parallelism over `ep` (up to
 *          8, dividing the experts) for mixtures of experts; data parallelism over `data` for the
 *          rest, with the weights sharded over it too (FSDP: `embed: data`)
 *   seq    max_position_embeddings capped at 4096; a learned position table (BERT, GPT-2) has
 *          exactly that many rows, so there seq is the table's size
 *   batch  4 sequences per data-parallel rank, in 4 microbatches (one sequence per rank each)
 *   step   cross entropy, Adam, an f32 master copy, full recomputation */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "diag.h"
#include "hf_import.h"
#include "report.h"
#include "suggest.h"

/* Why a key changes nothing here: the header prints these beside the key. */
#define R_ROPE "the rotary embedding is not expressed (no params, no matmul FLOPs; stdlib/layers.shard)"
#define R_EPS "the norms' epsilon is 1e-5 here (language.md, Numerics)"
#define R_DROPOUT "dropout is not expressed (no params, no FLOPs)"
#define R_INIT "initial values: run draws its own (--seed) or reads them (--load)"
#define R_DTYPE "params are bf16 here, with an f32 master copy in the train step"
#define R_TOKEN "a token id of the tokenizer"
#define R_OUTPUT "what Hugging Face's forward returns or caches; no params, no FLOPs"
#define R_META "bookkeeping of the checkpoint"
#define R_LABELS "a classification head's labels; the head is not part of this model"
#define R_REMAT "recomputation: the train step's remat key says it"
#define R_TP "how Meta's code slices its matmuls for tensor parallelism: the same math"
#define R_AUX "the router's load-balancing loss: a train step optimises its loss alone; the stdlib " \
              "MoE layers state theirs as a separate entry (docs/moe.md)"

/* Keys any config may hold that change nothing here. */
static const struct { const char *key, *why; } generic_keys[] = {
  {"architectures", R_META}, {"auto_map", R_META}, {"_name_or_path", R_META},
  {"transformers_version", R_META}, {"tokenizer_class", R_META}, {"torch_dtype", R_DTYPE},
  {"use_cache", R_OUTPUT}, {"return_dict", R_OUTPUT}, {"output_hidden_states", R_OUTPUT},
  {"output_attentions", R_OUTPUT}, {"torchscript", R_OUTPUT}, {"use_return_dict", R_OUTPUT},
  {"task_specific_params", R_OUTPUT}, {"bos_token_id", R_TOKEN}, {"eos_token_id", R_TOKEN},
  {"pad_token_id", R_TOKEN}, {"sep_token_id", R_TOKEN}, {"decoder_start_token_id", R_TOKEN},
  {"initializer_range", R_INIT}, {"initializer_factor", R_INIT}, {"id2label", R_LABELS},
  {"label2id", R_LABELS}, {"num_labels", R_LABELS}, {"problem_type", R_LABELS},
  {"classifier_dropout", R_DROPOUT}, {"gradient_checkpointing", R_REMAT},
  {"rope_theta", R_ROPE}, {"rope_scaling", R_ROPE}, {"rms_norm_eps", R_EPS}, {"layer_norm_eps", R_EPS},
  {"layer_norm_epsilon", R_EPS}, {"attention_dropout", R_DROPOUT},
};

typedef struct TpDim {
  const char *dim;
  int64_t size;
} TpDim;

typedef struct Plan {
  HfConfig *c;
  const char *type;             /* model_type */
  bool ok;
  const char *file, *model;     /* the stdlib file and model */
  const char *about;            /* what the model is, for the header */
  VEC(const char *) shapes;     /* header lines: the shapes, in words */
  VEC(const char *) dims;       /* `dim` lines after batch and seq */
  VEC(const char *) notes;      /* header lines: what differs from the original model */
  int64_t params;               /* saturating: a huge config still reads "too big" */
  int64_t embed, vocab, max_pos; /* max_pos 0: the config gives none */
  bool learned_pos;             /* a position table of seq rows: seq is max_pos */
  TpDim tp[12];                 /* dims tensor parallelism splits, in the layout's order */
  int ntp;
  bool moe;
  int64_t experts, topk;
  bool topk_dim;                /* declare `topk` (the stdlib model reads size(topk)) */
  const char *labels;           /* the train step's labels, for the header */
} Plan;

/* ---- small helpers ---- */

static int64_t mul(int64_t a, int64_t b) { return sat_mul(a, b); }
static int64_t mul3(int64_t a, int64_t b, int64_t c) { return sat_mul(sat_mul(a, b), c); }
static int64_t add(int64_t a, int64_t b) { return sat_add(a, b); }

/* A header line, a `dim` line or a note, formatted into the arena (arena_printf checks the format). */
#define PLAN_PUSH(p, vec, ...) VEC_PUSH((p)->c->arena, (p)->vec, arena_printf((p)->c->arena, __VA_ARGS__))
#define shape(p, ...) PLAN_PUSH(p, shapes, __VA_ARGS__)
#define dimline(p, ...) PLAN_PUSH(p, dims, __VA_ARGS__)
#define note(p, ...) PLAN_PUSH(p, notes, __VA_ARGS__)

static void tp(Plan *p, const char *dim, int64_t size) {
  if (p->ntp < (int)ARRAY_LEN(p->tp)) p->tp[p->ntp++] = (TpDim){dim, size};
}

static SrcLoc value_loc(Plan *p, const char *key) {
  HfKey *k = hf_key(p->c, key);
  return k ? k->value_loc : hf_file_loc(p->c);
}

static void fail(Plan *p, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(Plan *p, const char *key, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char buf[1024];
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  diag_error(value_loc(p, key), "%s", buf);
  p->ok = false;
}

/* Is `v` one of the space-separated words of `allowed`? */
static bool one_of(const char *v, const char *allowed) {
  size_t n = strlen(v);
  for (const char *w = allowed; *w;) {
    size_t m = strcspn(w, " ");
    if (m == n && strncmp(w, v, n) == 0) return true;
    w += m;
    while (*w == ' ') w++;
  }
  return false;
}

/* A string key that must be one of `allowed` (its default when missing); `why` says what the
 * stdlib model does instead. */
static const char *need_str(Plan *p, const char *key, const char *dflt, const char *allowed, const char *why) {
  const char *v = hf_str(p->c, key, dflt, &p->ok);
  if (v && !one_of(v, allowed)) fail(p, key, "\"%s\" is \"%s\": %s", key, v, why);
  return v;
}

static void need_bool(Plan *p, const char *key, bool dflt, bool want, const char *why) {
  bool v = hf_bool(p->c, key, dflt, &p->ok);
  if (v != want) fail(p, key, "\"%s\" is %s: %s", key, v ? "true" : "false", why);
}

static void need_int(Plan *p, const char *key, int64_t dflt, int64_t want, const char *why) {
  int64_t v = hf_int(p->c, key, dflt, p->type, &p->ok);
  if (v != want) fail(p, key, "\"%s\" is %lld: %s", key, (long long)v, why);
}

/* A key read for a note of the header: it changes nothing the program states. */
static void noted(Plan *p, const char *key, const char *why) {
  HfKey *k = hf_key(p->c, key);
  if (!k) return;
  k->state = HF_IGNORED;
  k->why = why;
}

/* The key's number without reading it (NaN when missing, null or not a number). */
static double peek(Plan *p, const char *key) {
  HfKey *k = hf_key(p->c, key);
  return k && cJSON_IsNumber(k->value) ? k->value->valuedouble : 0.0 / 0.0;
}

static int64_t req(Plan *p, const char *key) { return hf_int(p->c, key, HF_REQUIRED, p->type, &p->ok); }
static int64_t opt(Plan *p, const char *key, int64_t dflt) { return hf_int(p->c, key, dflt, p->type, &p->ok); }

/* ---- the decoders' common keys ---- */

typedef struct Dec {
  int64_t embed, layers, heads, kv, head, vocab, hidden;
  bool tied;
} Dec;

/* hidden_size, num_hidden_layers, num_attention_heads, vocab_size, max_position_embeddings,
 * tie_word_embeddings (default `tied`); with `gqa` also num_key_value_heads (default: heads) and
 * head_dim (default: hidden_size / heads). */
static void read_decoder(Plan *p, Dec *d, bool tied, bool gqa) {
  d->embed = req(p, "hidden_size");
  d->layers = req(p, "num_hidden_layers");
  d->heads = req(p, "num_attention_heads");
  d->kv = gqa ? opt(p, "num_key_value_heads", d->heads) : d->heads;
  d->vocab = req(p, "vocab_size");
  p->max_pos = opt(p, "max_position_embeddings", 0);
  d->head = gqa ? opt(p, "head_dim", 0) : 1;
  d->tied = hf_bool(p->c, "tie_word_embeddings", tied, &p->ok);
  p->embed = d->embed;
  p->vocab = d->vocab;
  if (!p->ok) return;
  if (!d->head) {
    if (d->embed % d->heads != 0)
      fail(p, "hidden_size", "\"hidden_size\" %lld is not a multiple of \"num_attention_heads\" %lld, and there is no "
           "\"head_dim\" to give the heads' size", (long long)d->embed, (long long)d->heads);
    d->head = d->embed / d->heads;
  }
  if (d->heads % d->kv != 0)
    fail(p, "num_key_value_heads", "\"num_key_value_heads\" %lld does not divide \"num_attention_heads\" %lld: each "
         "key/value head serves the same number of query heads", (long long)d->kv, (long long)d->heads);
}

static int64_t gqa_params(const Dec *d) { return mul3(d->embed, d->head, add(mul(2, d->heads), mul(2, d->kv))); }

static void gqa_dims(Plan *p, const Dec *d) {
  dimline(p, "dim heads = %lld, kv_heads = %lld, group = heads / kv_heads, head = %lld", (long long)d->heads,
          (long long)d->kv, (long long)d->head);
}

static void heads_shape(Plan *p, const Dec *d) {
  if (d->kv == d->heads) shape(p, "%lld heads of %lld", (long long)d->heads, (long long)d->head);
  else shape(p, "%lld query heads and %lld key/value heads of %lld", (long long)d->heads, (long long)d->kv,
             (long long)d->head);
}

/* Mistral's and Qwen2's window: attention to the last `sliding_window` positions. Noted, since
 * here every position attends to all before it. */
static void sliding_window(Plan *p, const char *key) {
  HfKey *k = hf_key(p->c, key);
  if (!k || cJSON_IsNull(k->value)) {
    hf_ignore(p->c, key, "no window: every position attends to all before it, as here");
    return;
  }
  int64_t w = opt(p, key, 0);
  if (!p->ok) return;
  noted(p, key, "every position here attends to all before it; with seq at most the window, that is the same");
  if (w < 4096 && (p->max_pos == 0 || w < p->max_pos))
    note(p, "attention: every position attends to all before it; the original attends to the last %lld only "
         "(sliding_window), which for seq above %lld is less work than counted here", (long long)w, (long long)w);
}

/* ---- families ---- */

/* LLaMA 2 and 3, Mistral: models/llama. */
static void fam_llama(Plan *p) {
  Dec d;
  read_decoder(p, &d, false, true);
  d.hidden = req(p, "intermediate_size");
  need_str(p, "hidden_act", "silu", "silu", "models/llama's MLP is SwiGLU (silu); no other activation is supported");
  need_bool(p, "attention_bias", false, false, "models/llama's attention has no biases (model_type \"qwen2\" has "
            "biases on the query, key and value projections)");
  need_bool(p, "mlp_bias", false, false, "models/llama's MLP has no biases");
  hf_ignore(p->c, "pretraining_tp", R_TP);
  if (strcmp(p->type, "mistral") == 0) sliding_window(p, "sliding_window");
  if (!p->ok) return;
  p->file = "models/llama";
  p->model = d.tied ? "llama_tied" : "llama";
  p->about = d.tied ? "a LLaMA-style decoder with its input embedding and output projection tied"
                    : "a LLaMA-style decoder (untied embeddings)";
  shape(p, "%lld layers, embed %lld, SwiGLU hidden %lld", (long long)d.layers, (long long)d.embed, (long long)d.hidden);
  heads_shape(p, &d);
  shape(p, "vocabulary %lld", (long long)d.vocab);
  dimline(p, "dim embed = %lld, hidden = %lld", (long long)d.embed, (long long)d.hidden);
  gqa_dims(p, &d);
  dimline(p, "dim vocab = %lld, layers = %lld", (long long)d.vocab, (long long)d.layers);
  int64_t block = add(add(gqa_params(&d), mul3(3, d.embed, d.hidden)), mul(2, d.embed));
  p->params = add(add(mul(d.layers, block), mul3(d.tied ? 1 : 2, d.vocab, d.embed)), d.embed);
  tp(p, "heads", d.heads), tp(p, "kv_heads", d.kv), tp(p, "hidden", d.hidden);
}

/* Mixtral: models/mixtral (layers' moe_mlp, top 2). */
static void fam_mixtral(Plan *p) {
  Dec d;
  read_decoder(p, &d, false, true);
  d.hidden = req(p, "intermediate_size");
  int64_t experts = req(p, "num_local_experts");
  need_int(p, "num_experts_per_tok", 2, 2, "models/mixtral (layers' moe_mlp) sends each token to its top 2 experts");
  need_str(p, "hidden_act", "silu", "silu", "models/mixtral's experts are SwiGLU (silu); no other activation is supported");
  need_bool(p, "tie_word_embeddings", false, false, "models/mixtral's embeddings are untied");
  hf_ignore(p->c, "router_aux_loss_coef", R_AUX);
  hf_ignore(p->c, "output_router_logits", R_OUTPUT);
  hf_ignore(p->c, "router_jitter_noise", "noise on the router's logits in training is not expressed (no params, "
            "no FLOPs)");
  sliding_window(p, "sliding_window");
  if (!p->ok) return;
  if (experts < 2) fail(p, "num_local_experts", "\"num_local_experts\" is %lld: each token goes to 2 experts",
                        (long long)experts);
  if (!p->ok) return;
  p->file = "models/mixtral";
  p->model = "mixtral";
  p->about = "a Mixtral-style decoder: LLaMA's blocks with a mixture of SwiGLU experts, top 2 per token";
  shape(p, "%lld layers, embed %lld, %lld experts of SwiGLU hidden %lld, top 2 per token", (long long)d.layers,
        (long long)d.embed, (long long)experts, (long long)d.hidden);
  heads_shape(p, &d);
  shape(p, "vocabulary %lld", (long long)d.vocab);
  dimline(p, "dim embed = %lld, hidden = %lld", (long long)d.embed, (long long)d.hidden);
  gqa_dims(p, &d);
  dimline(p, "dim expert = %lld", (long long)experts);
  dimline(p, "dim vocab = %lld, layers = %lld", (long long)d.vocab, (long long)d.layers);
  int64_t block = add(add(add(gqa_params(&d), mul(experts, mul3(3, d.embed, d.hidden))), mul(d.embed, experts)),
                      mul(2, d.embed));
  p->params = add(add(mul(d.layers, block), mul3(2, d.vocab, d.embed)), d.embed);
  p->moe = true, p->experts = experts, p->topk = 2;
  tp(p, "heads", d.heads), tp(p, "kv_heads", d.kv), tp(p, "hidden", d.hidden);
}

static int64_t qkv_bias_params(const Dec *d) { return add(gqa_params(d), mul(d->head, add(d->heads, mul(2, d->kv)))); }

static void qwen_window(Plan *p) {
  need_bool(p, "use_sliding_window", false, false, "sliding-window attention is not expressed: every position "
            "attends to all before it here");
  hf_ignore(p->c, "sliding_window", "used only with use_sliding_window");
  hf_ignore(p->c, "max_window_layers", "used only with use_sliding_window");
  hf_ignore(p->c, "use_mrope", R_ROPE);
}

/* Qwen2 and Qwen2.5: models/qwen2 (attention with query, key and value biases). */
static void fam_qwen2(Plan *p) {
  Dec d;
  read_decoder(p, &d, false, true);
  d.hidden = req(p, "intermediate_size");
  need_str(p, "hidden_act", "silu", "silu", "models/qwen2's MLP is SwiGLU (silu); no other activation is supported");
  qwen_window(p);
  if (!p->ok) return;
  p->file = "models/qwen2";
  p->model = d.tied ? "qwen2_tied" : "qwen2";
  p->about = d.tied ? "a Qwen2 decoder (attention with query, key and value biases), embeddings tied"
                    : "a Qwen2 decoder (attention with query, key and value biases), embeddings untied";
  shape(p, "%lld layers, embed %lld, SwiGLU hidden %lld", (long long)d.layers, (long long)d.embed, (long long)d.hidden);
  heads_shape(p, &d);
  shape(p, "vocabulary %lld", (long long)d.vocab);
  dimline(p, "dim embed = %lld, hidden = %lld", (long long)d.embed, (long long)d.hidden);
  gqa_dims(p, &d);
  dimline(p, "dim vocab = %lld, layers = %lld", (long long)d.vocab, (long long)d.layers);
  int64_t block = add(add(qkv_bias_params(&d), mul3(3, d.embed, d.hidden)), mul(2, d.embed));
  p->params = add(add(mul(d.layers, block), mul3(d.tied ? 1 : 2, d.vocab, d.embed)), d.embed);
  tp(p, "heads", d.heads), tp(p, "kv_heads", d.kv), tp(p, "hidden", d.hidden);
}

/* Fine-grained experts: routed (experts of expert_hidden, top topk) and shared. */
typedef struct Moe {
  int64_t experts, topk, expert_hidden, shared_hidden;
} Moe;

static int64_t moe_params(const Plan *p, const Moe *m) {
  return add(add(mul(p->embed, m->experts), mul(m->experts, mul3(3, p->embed, m->expert_hidden))),
             mul3(3, p->embed, m->shared_hidden));
}

static void moe_dims(Plan *p, const Moe *m) {
  dimline(p, "dim expert = %lld, expert_hidden = %lld, shared_hidden = %lld, topk = %lld", (long long)m->experts,
          (long long)m->expert_hidden, (long long)m->shared_hidden, (long long)m->topk);
  p->moe = true, p->experts = m->experts, p->topk = m->topk, p->topk_dim = true;
}

static void check_topk(Plan *p, const Moe *m) {
  if (p->ok && m->topk > m->experts)
    fail(p, "num_experts_per_tok", "\"num_experts_per_tok\" %lld is more than the %lld routed experts",
         (long long)m->topk, (long long)m->experts);
}

/* Qwen2-MoE: models/qwen2's qwen2_moe. */
static void fam_qwen2_moe(Plan *p) {
  Dec d;
  read_decoder(p, &d, false, true);
  Moe m;
  m.experts = req(p, "num_experts");
  m.topk = req(p, "num_experts_per_tok");
  m.expert_hidden = req(p, "moe_intermediate_size");
  m.shared_hidden = req(p, "shared_expert_intermediate_size");
  need_bool(p, "tie_word_embeddings", false, false, "models/qwen2's qwen2_moe has untied embeddings");
  need_int(p, "decoder_sparse_step", 1, 1, "every block of models/qwen2's qwen2_moe is a mixture of experts");
  if (!hf_empty_list(p->c, "mlp_only_layers", &p->ok))
    fail(p, "mlp_only_layers", "\"mlp_only_layers\" is not empty: every block of models/qwen2's qwen2_moe is a "
         "mixture of experts");
  need_bool(p, "norm_topk_prob", false, false, "models/qwen2's qwen2_moe weights the chosen experts by their softmax "
            "probabilities, not renormalised over the chosen");
  need_str(p, "hidden_act", "silu", "silu", "the experts are SwiGLU (silu); no other activation is supported");
  hf_ignore(p->c, "intermediate_size", "the dense MLP's width: no block is dense here (decoder_sparse_step 1, no "
            "mlp_only_layers)");
  hf_ignore(p->c, "router_aux_loss_coef", R_AUX);
  hf_ignore(p->c, "output_router_logits", R_OUTPUT);
  qwen_window(p);
  check_topk(p, &m);
  if (!p->ok) return;
  p->file = "models/qwen2";
  p->model = "qwen2_moe";
  p->about = "a Qwen2-MoE decoder: Qwen2's attention, every block a mixture of routed experts and a gated shared "
             "expert";
  shape(p, "%lld layers, embed %lld", (long long)d.layers, (long long)d.embed);
  heads_shape(p, &d);
  shape(p, "%lld routed experts of SwiGLU hidden %lld, top %lld per token (softmax weights, not renormalised), and a "
        "shared expert of %lld with a sigmoid gate", (long long)m.experts, (long long)m.expert_hidden,
        (long long)m.topk, (long long)m.shared_hidden);
  shape(p, "vocabulary %lld", (long long)d.vocab);
  dimline(p, "dim embed = %lld", (long long)d.embed);
  gqa_dims(p, &d);
  moe_dims(p, &m);
  dimline(p, "dim vocab = %lld, layers = %lld", (long long)d.vocab, (long long)d.layers);
  int64_t block = add(add(add(qkv_bias_params(&d), moe_params(p, &m)), d.embed), mul(2, d.embed));
  p->params = add(add(mul(d.layers, block), mul3(2, d.vocab, d.embed)), d.embed);
  tp(p, "heads", d.heads), tp(p, "kv_heads", d.kv), tp(p, "expert_hidden", m.expert_hidden);
  tp(p, "shared_hidden", m.shared_hidden);
}

/* DeepSeek's MoE keys, shared by deepseek, deepseek_v2 and deepseek_v3: n_routed_experts,
 * n_shared_experts, num_experts_per_tok, moe_intermediate_size, intermediate_size (the dense
 * blocks'), first_k_dense_replace, moe_layer_freq. */
static void read_deepseek_moe(Plan *p, Moe *m, int64_t *hidden, int64_t *dense, int64_t layers) {
  m->experts = req(p, "n_routed_experts");
  int64_t shared = req(p, "n_shared_experts");
  m->topk = req(p, "num_experts_per_tok");
  m->expert_hidden = req(p, "moe_intermediate_size");
  m->shared_hidden = mul(shared, m->expert_hidden);
  *hidden = req(p, "intermediate_size");
  if (peek(p, "first_k_dense_replace") == 0)
    fail(p, "first_k_dense_replace", "\"first_k_dense_replace\" is 0: models/deepseek's models start with at least one "
         "dense block, as every published DeepSeek model does");
  *dense = p->ok ? req(p, "first_k_dense_replace") : 1;
  need_int(p, "moe_layer_freq", 1, 1, "after the first first_k_dense_replace blocks, every block of "
           "models/deepseek is a mixture of experts");
  need_str(p, "hidden_act", "silu", "silu", "the MLPs and experts are SwiGLU (silu); no other activation is supported");
  need_bool(p, "attention_bias", false, false, "models/deepseek's attention has no biases");
  need_bool(p, "tie_word_embeddings", false, false, "models/deepseek's embeddings are untied");
  hf_ignore(p->c, "aux_loss_alpha", R_AUX);
  hf_ignore(p->c, "seq_aux", R_AUX);
  hf_ignore(p->c, "pretraining_tp", R_TP);
  hf_ignore(p->c, "ep_size", "DeepSeek's inference code's expert parallelism; the layout here says how experts "
            "shard");
  if (p->ok && *dense >= layers)
    fail(p, "first_k_dense_replace", "\"first_k_dense_replace\" %lld leaves no mixture-of-experts block of the %lld",
         (long long)*dense, (long long)layers);
  check_topk(p, m);
}

/* DeepSeek-V2's and -V3's extras of routing that the stdlib does not state: noted. */
static void deepseek_routing_notes(Plan *p, const Moe *m) {
  HfConfig *c = p->c;
  const char *method = hf_has(c, "topk_method") && cJSON_IsString(hf_key(c, "topk_method")->value)
                           ? hf_key(c, "topk_method")->value->valuestring : "greedy";
  int64_t groups = opt(p, "n_group", 1), per = opt(p, "topk_group", 1);
  if (strcmp(method, "greedy") != 0 && groups > 1) {
    note(p, "routing: each token picks its top %lld of all %lld experts; DeepSeek's %s limits it to the experts of "
         "its best %lld of %lld groups (no params, no FLOPs; the AllToAlls here may reach more devices than "
         "DeepSeek's)", (long long)m->topk, (long long)m->experts, method, (long long)per, (long long)groups);
    noted(p, "n_group", "group-limited routing is not expressed (see above)");
    noted(p, "topk_group", "group-limited routing is not expressed (see above)");
  } else {
    noted(p, "n_group", "routing is over all experts, as here");
    noted(p, "topk_group", "routing is over all experts, as here");
  }
  double scale = hf_num(c, "routed_scaling_factor", 1.0, &p->ok);
  if (scale != 1.0)
    note(p, "routing: DeepSeek scales the routed experts' sum by routed_scaling_factor %g; not here (no params, no "
         "FLOPs)", scale);
  noted(p, "routed_scaling_factor", scale == 1.0 ? "nothing to scale" : "not applied (see above)");
}

/* DeepSeekMoE (model_type "deepseek"): models/deepseek's deepseek. */
static void fam_deepseek(Plan *p) {
  Dec d;
  read_decoder(p, &d, false, true);
  Moe m;
  int64_t hidden, dense;
  read_deepseek_moe(p, &m, &hidden, &dense, d.layers);
  need_str(p, "scoring_func", "softmax", "softmax", "models/deepseek's deepseek weights experts by a softmax");
  need_bool(p, "norm_topk_prob", false, false, "models/deepseek's deepseek weights the chosen experts by their "
            "softmax probabilities, not renormalised over the chosen");
  if (!p->ok) return;
  p->file = "models/deepseek";
  p->model = "deepseek";
  p->about = "a DeepSeekMoE decoder: the first blocks dense, the rest shared plus fine-grained routed experts";
  shape(p, "%lld layers (%lld dense, SwiGLU hidden %lld; %lld mixtures of experts), embed %lld", (long long)d.layers,
        (long long)dense, (long long)hidden, (long long)(d.layers - dense), (long long)d.embed);
  heads_shape(p, &d);
  shape(p, "%lld routed experts of SwiGLU hidden %lld, top %lld per token (softmax weights), and shared experts "
        "of %lld in all", (long long)m.experts, (long long)m.expert_hidden, (long long)m.topk,
        (long long)m.shared_hidden);
  shape(p, "vocabulary %lld", (long long)d.vocab);
  dimline(p, "dim embed = %lld, hidden = %lld", (long long)d.embed, (long long)hidden);
  gqa_dims(p, &d);
  moe_dims(p, &m);
  dimline(p, "dim vocab = %lld, dense_layers = %lld, moe_layers = %lld", (long long)d.vocab, (long long)dense,
          (long long)(d.layers - dense));
  int64_t a = gqa_params(&d), norms = mul(2, d.embed);
  int64_t dense_block = add(add(a, mul3(3, d.embed, hidden)), norms);
  int64_t moe_block = add(add(a, moe_params(p, &m)), norms);
  p->params = add(add(add(mul(dense, dense_block), mul(d.layers - dense, moe_block)), mul3(2, d.vocab, d.embed)), d.embed);
  tp(p, "heads", d.heads), tp(p, "kv_heads", d.kv), tp(p, "hidden", hidden);
  tp(p, "expert_hidden", m.expert_hidden), tp(p, "shared_hidden", m.shared_hidden);
}

/* DeepSeek-V2, -V2-Lite and -V3: multi-head latent attention. */
static void fam_deepseek_mla(Plan *p) {
  bool v3 = strcmp(p->type, "deepseek_v3") == 0;
  Dec d;
  read_decoder(p, &d, false, false);
  hf_ignore(p->c, "num_key_value_heads", "multi-head latent attention has no key/value heads: every head's keys and "
            "values come from the shared latent (kv_lora_rank)");
  int64_t kv_rank = req(p, "kv_lora_rank");
  int64_t q_rank = opt(p, "q_lora_rank", 0);
  int64_t nope = req(p, "qk_nope_head_dim"), rope = req(p, "qk_rope_head_dim"), vh = req(p, "v_head_dim");
  Moe m;
  int64_t hidden, dense;
  read_deepseek_moe(p, &m, &hidden, &dense, d.layers);
  if (v3) {
    need_str(p, "scoring_func", "sigmoid", "sigmoid", "models/deepseek's deepseek_v3 scores experts by a sigmoid "
             "(model_type \"deepseek_v2\" by a softmax)");
    need_str(p, "topk_method", "noaux_tc", "noaux_tc", "models/deepseek's deepseek_v3 picks experts by affinity plus "
             "a balancing bias (noaux_tc)");
    need_bool(p, "norm_topk_prob", true, true, "models/deepseek's deepseek_v3 renormalises the chosen experts' "
              "affinities");
    if (p->ok && !q_rank)
      fail(p, "q_lora_rank", "\"q_lora_rank\" is null: models/deepseek's deepseek_v3 compresses the queries "
           "(mla_q_attention), as DeepSeek-V3 does");
    hf_ignore(p->c, "num_nextn_predict_layers", "the multi-token-prediction module is not part of the main model "
              "(Hugging Face does not load it; DeepSeek counts 671B without its 14B)");
    hf_ignore(p->c, "quantization_config", "DeepSeek ships FP8 weights; params are bf16 here (f8 is a dtype of the "
              "language, not used by the stdlib models)");
  } else {
    need_str(p, "scoring_func", "softmax", "softmax", "models/deepseek's deepseek_v2 weights experts by a softmax "
             "(model_type \"deepseek_v3\" scores by a sigmoid)");
    need_str(p, "topk_method", "greedy", "greedy group_limited_greedy", "routing picks the top experts of all "
             "(greedy) or, noted, of a token's best groups (group_limited_greedy)");
    need_bool(p, "norm_topk_prob", false, false, "models/deepseek's deepseek_v2 weights the chosen experts by their "
              "softmax probabilities, not renormalised over the chosen");
  }
  deepseek_routing_notes(p, &m);
  if (!p->ok) return;
  p->file = "models/deepseek";
  p->model = v3 ? "deepseek_v3" : q_rank ? "deepseek_v2" : "deepseek_v2_lite";
  p->about = v3 ? "a DeepSeek-V3 decoder: multi-head latent attention, the first blocks dense, the rest shared plus "
                  "fine-grained routed experts (sigmoid affinities, a balancing bias)"
                : "a DeepSeek-V2 decoder: multi-head latent attention, the first blocks dense, the rest shared plus "
                  "fine-grained routed experts";
  shape(p, "%lld layers (%lld dense, SwiGLU hidden %lld; %lld mixtures of experts), embed %lld", (long long)d.layers,
        (long long)dense, (long long)hidden, (long long)(d.layers - dense), (long long)d.embed);
  if (q_rank)
    shape(p, "multi-head latent attention: %lld heads; queries through a latent of %lld; keys and values from a "
          "latent of %lld; per head %lld + %lld (rotary) for queries and keys, %lld for values",
          (long long)d.heads, (long long)q_rank, (long long)kv_rank, (long long)nope, (long long)rope, (long long)vh);
  else
    shape(p, "multi-head latent attention: %lld heads; keys and values from a latent of %lld; per head %lld + %lld "
          "(rotary) for queries and keys, %lld for values", (long long)d.heads, (long long)kv_rank, (long long)nope,
          (long long)rope, (long long)vh);
  shape(p, "%lld routed experts of SwiGLU hidden %lld, top %lld per token, and shared experts of %lld in all",
        (long long)m.experts, (long long)m.expert_hidden, (long long)m.topk, (long long)m.shared_hidden);
  shape(p, "vocabulary %lld", (long long)d.vocab);
  note(p, "attention: the scores are the sum of two contractions (the latent part and the rotary part), which the "
       "fused attention op does not take: they are held whole ([batch, seq, heads, kseq]) where flash-style "
       "MLA kernels would not, so memory and time count more than DeepSeek's kernels use");
  dimline(p, "dim embed = %lld, hidden = %lld", (long long)d.embed, (long long)hidden);
  if (q_rank)
    dimline(p, "dim heads = %lld, q_rank = %lld, kv_rank = %lld, qk_nope = %lld, qk_rope = %lld, v_head = %lld",
            (long long)d.heads, (long long)q_rank, (long long)kv_rank, (long long)nope, (long long)rope, (long long)vh);
  else
    dimline(p, "dim heads = %lld, kv_rank = %lld, qk_nope = %lld, qk_rope = %lld, v_head = %lld", (long long)d.heads,
            (long long)kv_rank, (long long)nope, (long long)rope, (long long)vh);
  moe_dims(p, &m);
  dimline(p, "dim vocab = %lld, dense_layers = %lld, moe_layers = %lld", (long long)d.vocab, (long long)dense,
          (long long)(d.layers - dense));
  /* layers' mla_attention / mla_q_attention */
  int64_t keys = add(add(mul(d.embed, add(kv_rank, rope)), kv_rank), mul3(kv_rank, d.heads, add(nope, vh)));
  int64_t queries = q_rank ? add(add(mul(d.embed, q_rank), q_rank), mul3(q_rank, d.heads, add(nope, rope)))
                           : mul3(d.embed, d.heads, add(nope, rope));
  int64_t a = add(add(queries, keys), mul3(d.heads, vh, d.embed)), norms = mul(2, d.embed);
  int64_t dense_block = add(add(a, mul3(3, d.embed, hidden)), norms);
  int64_t moe_block = add(add(add(a, moe_params(p, &m)), norms), v3 ? m.experts : 0);
  p->params = add(add(add(mul(dense, dense_block), mul(d.layers - dense, moe_block)), mul3(2, d.vocab, d.embed)), d.embed);
  tp(p, "heads", d.heads), tp(p, "hidden", hidden), tp(p, "expert_hidden", m.expert_hidden);
  tp(p, "shared_hidden", m.shared_hidden);
}

/* Gemma: models/gemma. */
static void fam_gemma(Plan *p) {
  Dec d;
  read_decoder(p, &d, true, true);
  d.hidden = req(p, "intermediate_size");
  need_bool(p, "tie_word_embeddings", true, true, "models/gemma ties its embedding, as Gemma does");
  const char *act = need_str(p, "hidden_act", "gelu", "gelu gelu_pytorch_tanh", "models/gemma's MLP is GeGLU (gelu)");
  const char *act2 = need_str(p, "hidden_activation", act ? act : "gelu", "gelu gelu_pytorch_tanh",
                              "models/gemma's MLP is GeGLU (gelu)");
  need_bool(p, "attention_bias", false, false, "models/gemma's attention has no biases");
  if (!p->ok) return;
  p->file = "models/gemma";
  p->model = "gemma";
  p->about = "a Gemma decoder: GeGLU MLPs, the embedding tied and scaled by sqrt(embed)";
  shape(p, "%lld layers, embed %lld, GeGLU hidden %lld", (long long)d.layers, (long long)d.embed, (long long)d.hidden);
  heads_shape(p, &d);
  shape(p, "vocabulary %lld", (long long)d.vocab);
  if ((act && strcmp(act, "gelu_pytorch_tanh") == 0) || (act2 && strcmp(act2, "gelu_pytorch_tanh") == 0))
    note(p, "GELU: exact here, the tanh approximation in the original (the same params and FLOPs)");
  note(p, "norms: Gemma's RMSNorm multiplies by (1 + scale), this one by scale (the same params)");
  dimline(p, "dim embed = %lld, hidden = %lld", (long long)d.embed, (long long)d.hidden);
  gqa_dims(p, &d);
  dimline(p, "dim vocab = %lld, layers = %lld", (long long)d.vocab, (long long)d.layers);
  int64_t block = add(add(gqa_params(&d), mul3(3, d.embed, d.hidden)), mul(2, d.embed));
  p->params = add(add(mul(d.layers, block), mul(d.vocab, d.embed)), d.embed);
  tp(p, "heads", d.heads), tp(p, "kv_heads", d.kv), tp(p, "hidden", d.hidden);
}

/* The attention and MLP of layers' biased_attention / encoder_attention and biased_mlp, plus two
 * LayerNorms: one GPT-2 or BERT block. */
static int64_t biased_block(int64_t embed, int64_t heads, int64_t head, int64_t hidden) {
  int64_t inner = mul(heads, head);
  int64_t attn = add(add(mul3(4, embed, inner), mul(3, inner)), embed);
  int64_t mlp = add(add(mul3(2, embed, hidden), hidden), embed);
  return add(add(attn, mlp), mul(4, embed));
}

/* GPT-2: models/gpt2. */
static void fam_gpt2(Plan *p) {
  int64_t embed = req(p, "n_embd"), layers = req(p, "n_layer"), heads = req(p, "n_head");
  int64_t vocab = req(p, "vocab_size"), npos = req(p, "n_positions");
  int64_t ctx = opt(p, "n_ctx", npos);
  int64_t inner = opt(p, "n_inner", 0);
  const char *act = need_str(p, "activation_function", "gelu_new", "gelu gelu_new gelu_pytorch_tanh gelu_fast",
                             "models/gpt2's MLP uses GELU");
  need_bool(p, "tie_word_embeddings", true, true, "models/gpt2 ties its embedding, as GPT-2 does");
  need_bool(p, "scale_attn_weights", true, true, "the attention scores are scaled by 1/sqrt(head) here");
  need_bool(p, "scale_attn_by_inverse_layer_idx", false, false, "the attention scores are not scaled by the layer "
            "here");
  need_bool(p, "add_cross_attention", false, false, "models/gpt2 is a decoder alone, with no cross-attention");
  hf_ignore(p->c, "reorder_and_upcast_attn", "computes the scores in f32: the softmax here does too");
  hf_ignore(p->c, "resid_pdrop", R_DROPOUT);
  hf_ignore(p->c, "embd_pdrop", R_DROPOUT);
  hf_ignore(p->c, "attn_pdrop", R_DROPOUT);
  hf_ignore(p->c, "summary_type", "GPT2DoubleHeadsModel's classification head, not part of the language model");
  hf_ignore(p->c, "summary_use_proj", "GPT2DoubleHeadsModel's classification head, not part of the language model");
  hf_ignore(p->c, "summary_activation", "GPT2DoubleHeadsModel's classification head, not part of the language model");
  hf_ignore(p->c, "summary_proj_to_labels", "GPT2DoubleHeadsModel's classification head, not part of the language "
            "model");
  hf_ignore(p->c, "summary_first_dropout", R_DROPOUT);
  if (!p->ok) return;
  if (ctx != npos) fail(p, "n_ctx", "\"n_ctx\" %lld differs from \"n_positions\" %lld", (long long)ctx, (long long)npos);
  if (embed % heads != 0)
    fail(p, "n_embd", "\"n_embd\" %lld is not a multiple of \"n_head\" %lld", (long long)embed, (long long)heads);
  if (!p->ok) return;
  int64_t hidden = inner ? inner : mul(4, embed), head = embed / heads;
  p->embed = embed, p->vocab = vocab, p->max_pos = npos, p->learned_pos = true;
  p->file = "models/gpt2";
  p->model = "gpt2";
  p->about = "GPT-2: a decoder with learned positions, biases on every projection, the embedding tied";
  shape(p, "%lld layers, embed %lld, GELU MLP hidden %lld, %lld heads of %lld", (long long)layers, (long long)embed,
        (long long)hidden, (long long)heads, (long long)head);
  shape(p, "vocabulary %lld, %lld learned positions", (long long)vocab, (long long)npos);
  if (act && strcmp(act, "gelu") != 0)
    note(p, "GELU: exact here, the tanh approximation (%s) in the original (the same params and FLOPs)", act);
  dimline(p, "dim embed = %lld, hidden = %lld", (long long)embed, (long long)hidden);
  dimline(p, "dim heads = %lld, head = %lld", (long long)heads, (long long)head);
  dimline(p, "dim vocab = %lld, layers = %lld", (long long)vocab, (long long)layers);
  p->params = add(add(add(mul(layers, biased_block(embed, heads, head, hidden)), mul(vocab, embed)), mul(npos, embed)),
                  mul(2, embed));
  tp(p, "heads", heads), tp(p, "hidden", hidden);
}

/* BERT: models/bert. */
static void fam_bert(Plan *p) {
  int64_t embed = req(p, "hidden_size"), layers = req(p, "num_hidden_layers"), heads = req(p, "num_attention_heads");
  int64_t hidden = req(p, "intermediate_size"), vocab = req(p, "vocab_size");
  int64_t npos = req(p, "max_position_embeddings"), types = opt(p, "type_vocab_size", 2);
  need_str(p, "hidden_act", "gelu", "gelu", "models/bert's MLP uses the exact GELU, as BERT does");
  need_str(p, "position_embedding_type", "absolute", "absolute", "models/bert has a learned position table "
           "(absolute); relative positions are not expressed");
  need_bool(p, "is_decoder", false, false, "models/bert is an encoder: every position sees every other");
  need_bool(p, "add_cross_attention", false, false, "models/bert is an encoder alone, with no cross-attention");
  hf_ignore(p->c, "hidden_dropout_prob", R_DROPOUT);
  hf_ignore(p->c, "attention_probs_dropout_prob", R_DROPOUT);
  hf_ignore(p->c, "directionality", "a tokenizer setting");
  static const char *const pooler[] = {"pooler_fc_size", "pooler_num_attention_heads", "pooler_num_fc_layers",
                                       "pooler_size_per_head", "pooler_type"};
  for (size_t i = 0; i < ARRAY_LEN(pooler); i++)
    hf_ignore(p->c, pooler[i], "the pooler is not part of models/bert (its header says why)");
  if (!p->ok) return;
  if (embed % heads != 0)
    fail(p, "hidden_size", "\"hidden_size\" %lld is not a multiple of \"num_attention_heads\" %lld", (long long)embed,
         (long long)heads);
  if (!p->ok) return;
  int64_t head = embed / heads;
  p->embed = embed, p->vocab = vocab, p->max_pos = npos, p->learned_pos = true;
  p->file = "models/bert";
  p->model = "bert";
  p->about = "a BERT encoder with its masked-language-model head (no pooler)";
  p->labels = "labels: i32[batch, seq], the token at every position (BERT scores the 15% it masked)";
  shape(p, "%lld post-norm layers, embed %lld, GELU MLP hidden %lld, %lld heads of %lld", (long long)layers,
        (long long)embed, (long long)hidden, (long long)heads, (long long)head);
  shape(p, "vocabulary %lld, %lld learned positions, %lld token types", (long long)vocab, (long long)npos,
        (long long)types);
  note(p, "heads: no pooler and no next-sentence head; the masked-language-model head is included (Hugging Face's "
       "BertModel holds the pooler instead: this has vocab + 2 x embed = %lld params more)",
       (long long)add(vocab, mul(2, embed)));
  note(p, "the MLM head scores every position, BERT's only the masked ones: the same params, more FLOPs here");
  dimline(p, "dim embed = %lld, embed_out = embed, hidden = %lld", (long long)embed, (long long)hidden);
  dimline(p, "dim heads = %lld, head = %lld, types = %lld", (long long)heads, (long long)head, (long long)types);
  dimline(p, "dim vocab = %lld, layers = %lld", (long long)vocab, (long long)layers);
  int64_t embeddings = add(mul(add(add(vocab, npos), types), embed), mul(2, embed));
  int64_t head_params = add(add(mul(embed, embed), mul(3, embed)), vocab);
  p->params = add(add(embeddings, mul(layers, biased_block(embed, heads, head, hidden))), head_params);
  tp(p, "heads", heads), tp(p, "hidden", hidden);
}

typedef struct Family {
  const char *type;
  void (*read)(Plan *);
} Family;

static const Family families[] = {
  {"llama", fam_llama},         {"mistral", fam_llama},          {"mixtral", fam_mixtral},
  {"qwen2", fam_qwen2},         {"qwen2_moe", fam_qwen2_moe},    {"deepseek", fam_deepseek},
  {"deepseek_v2", fam_deepseek_mla}, {"deepseek_v3", fam_deepseek_mla}, {"gemma", fam_gemma},
  {"gpt2", fam_gpt2},           {"bert", fam_bert},
};

const char *hf_import_model_types(void) {
  static char buf[256];
  if (!buf[0])
    for (size_t i = 0; i < ARRAY_LEN(families); i++)
      snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", i ? ", " : "", families[i].type);
  return buf;
}

/* ---- the writer ---- */

static const char *commas(Arena *a, int64_t n) {
  char digits[32], out[48];
  int len = snprintf(digits, sizeof digits, "%lld", (long long)n), k = 0;
  for (int i = 0; i < len; i++) {
    if (i > 0 && (len - i) % 3 == 0) out[k++] = ',';
    out[k++] = digits[i];
  }
  out[k] = '\0';
  return arena_strndup(a, out, (size_t)k);
}

#define HBM_H100 80e9
#define STATE_BUDGET 40e9        /* training state per device: half the HBM */
#define TP_FROM_PARAMS 10e9      /* tensor parallelism from this many params */

typedef struct HfMesh {
  int64_t data, ep, model, devices;
} HfMesh;

static HfMesh choose_mesh(const Plan *p) {
  HfMesh m = {1, 1, 1, 1};
  if ((double)p->params >= TP_FROM_PARAMS) {
    m.model = 8;
    for (bool divides = false; !divides && m.model > 1;) {
      divides = true;
      for (int i = 0; i < p->ntp; i++)
        if (p->tp[i].size % m.model != 0) divides = false;
      if (!divides) m.model /= 2;
    }
  }
  if (p->moe)
    for (m.ep = 8; m.ep > 1 && p->experts % m.ep != 0;) m.ep /= 2;
  double state = 16.0 * (double)p->params;
  while (m.data < ((int64_t)1 << 20) &&
         (state / (double)(m.data * m.ep * m.model) > STATE_BUDGET || m.data * m.ep * m.model < 8))
    m.data *= 2;
  m.devices = m.data * m.ep * m.model;
  return m;
}

/* A header line of the program: `first`, then the text wrapped at 100 columns under `indent`. */
static void hline(FILE *f, const char *first, const char *indent, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void hline(FILE *f, const char *first, const char *indent, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char buf[2048];
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  report_wrapped(f, 100, first, indent, buf);
}

static void write_program(Plan *p, FILE *f, const char *name, HfProgram *out) {
  HfConfig *c = p->c;
  Arena *a = c->arena;
  HfMesh m = choose_mesh(p);
  int64_t seq = p->learned_pos ? p->max_pos : p->max_pos && p->max_pos < 4096 ? p->max_pos : 4096;
  int64_t dp = m.data * m.ep, batch = 4 * dp;
  const char *mesh = m.ep > 1 ? arena_printf(a, "h100[data: %lld, ep: %lld%s]", (long long)m.data, (long long)m.ep,
                                             m.model > 1 ? arena_printf(a, ", model: %lld", (long long)m.model) : "")
                     : m.model > 1 ? arena_printf(a, "h100[data: %lld, model: %lld]", (long long)m.data, (long long)m.model)
                                   : arena_printf(a, "h100[data: %lld]", (long long)m.data);
  bool fsdp = dp > 1, vocab_tp = m.model > 1 && p->vocab % m.model == 0;
  const char *layout = arena_printf(a, "%s%s%s", fsdp ? "fsdp" : "dp", m.ep > 1 ? "_ep" : "", m.model > 1 ? "_tp" : "");
  int64_t cap = 0;
  bool cap_exact = true;
  if (p->moe) {
    int64_t slots = mul(seq, p->topk);
    cap_exact = slots % p->experts == 0;
    cap = cap_exact ? slots / p->experts : slots / p->experts + 1;
  }

  hline(f, "# ", "# ", "%s: generated by `shardc import %s` from a Hugging Face config (model_type \"%s\").",
        name ? name : "(stdout)", c->src->path, p->type);
  fprintf(f, "#\n");
  hline(f, "# Model: ", "#   ", "%s's %s, %s. The config's shapes:", p->file, p->model, p->about);
  for (int i = 0; i < p->shapes.len; i++) hline(f, "#   ", "#     ", "%s", p->shapes.data[i]);
  hline(f, "# ", "# ", "Parameters: %s, by the formula in %s.shard's header (`shardc check` prints its own count).",
        commas(a, p->params), p->file);
  fprintf(f, "#\n# What the import chose (the config does not say; change any of it):\n");
  hline(f, "#   mesh    ", "#           ", "%s, %lld devices.%s%s data: the fewest (a power of two) for which "
        "the training state (16 bytes per param: bf16 params and grads, an f32 master copy, Adam's two moments) takes "
        "at most 40 GB per device, half the HBM, on at least one node of 8", mesh, (long long)m.devices,
        m.model > 1 ? arena_printf(a, " model: tensor parallelism over %lld devices within a node (8, or fewer "
                                      "where 8 does not divide the heads and MLP widths), as models of 10e9 params "
                                      "or more use it.", (long long)m.model)
                    : " No tensor parallelism (under 10e9 params).",
        m.ep > 1 ? arena_printf(a, " ep: expert parallelism over %lld devices (up to 8, dividing the %lld experts).",
                                (long long)m.ep, (long long)p->experts) : "");
  hline(f, "#   layout  ", "#           ", "%s: the batch over %s%s%s%s%s", layout, m.ep > 1 ? "(data, ep)" : "data",
        fsdp ? ", the weights too (FSDP)" : "", m.ep > 1 ? ", the experts over ep" : "",
        m.model > 1 ? ", heads and MLP widths over model" : "",
        m.model > 1 && !vocab_tp ? arena_printf(a, " (the vocabulary, %lld, does not divide by %lld: it is not split)",
                                                (long long)p->vocab, (long long)m.model) : "");
  if (p->learned_pos) hline(f, "#   seq     ", "#           ", "%lld, the rows of the learned position table", (long long)seq);
  else if (p->max_pos)
    hline(f, "#   seq     ", "#           ", "%lld (max_position_embeddings %lld%s)", (long long)seq,
          (long long)p->max_pos, p->max_pos > 4096 ? ", capped at 4096" : "");
  else hline(f, "#   seq     ", "#           ", "4096 (the config gives no max_position_embeddings)");
  hline(f, "#   batch   ", "#           ", "%lld sequences, 4 per data-parallel rank, in 4 microbatches", (long long)batch);
  hline(f, "#   train   ", "#           ", "cross entropy (%s), adam, an f32 master copy, full recomputation",
        p->labels ? p->labels : "labels: i32[batch, seq], the next tokens");
  if (p->moe)
    hline(f, "#   cap     ", "#           ", "%lld slots per expert and sequence: seq x %lld / %lld experts%s, a capacity "
          "factor of 1", (long long)cap, (long long)p->topk, (long long)p->experts, cap_exact ? "" : ", rounded up");
  if (p->notes.len) {
    fprintf(f, "#\n# What differs from the original model:\n");
    for (int i = 0; i < p->notes.len; i++) hline(f, "#   ", "#     ", "%s", p->notes.data[i]);
  }
  bool any = false;
  for (int i = 0; i < c->nkeys; i++) {
    HfKey *k = &c->keys[i];
    if (k->state != HF_IGNORED) continue;
    if (!any) fprintf(f, "#\n# Config fields that change nothing here:\n");
    any = true;
    hline(f, "#   ", "#     ", "%s = %s: %s", k->name, hf_value_text(c, k->value), k->why);
    VEC_PUSH(a, out->ignored, k->name);
  }
  any = false;
  for (int i = 0; i < c->nkeys; i++) {
    HfKey *k = &c->keys[i];
    if (k->state != HF_UNREAD) continue;
    if (!any) fprintf(f, "#\n# Config fields the import does not know (not read; check that they change nothing):\n");
    any = true;
    hline(f, "#   ", "#     ", "%s = %s", k->name, hf_value_text(c, k->value));
    VEC_PUSH(a, out->unknown, k->name);
  }
  const char *shown = name ? name : "FILE.shard";
  fprintf(f, "#\n#   shardc check %s\n#   shardc explain %s\n#   shardc sim %s\n\n", shown, shown, shown);

  fprintf(f, "import \"targets\"\nimport \"%s\"\n\n", p->file);
  fprintf(f, "mesh h100_%lld = %s\n\n", (long long)m.devices, mesh);
  fprintf(f, "dim batch = %lld, seq = %lld, kseq = seq\n", (long long)batch, (long long)seq);
  for (int i = 0; i < p->dims.len; i++) fprintf(f, "%s\n", p->dims.data[i]);
  if (p->moe) {
    if (cap_exact) fprintf(f, "dim cap = seq * %s / expert\n", p->topk_dim ? "topk" : arena_printf(a, "%lld", (long long)p->topk));
    else fprintf(f, "dim cap = %lld                    # seq x topk / expert, rounded up\n", (long long)cap);
  }
  fprintf(f, "\nlayout %s {\n", layout);
  fprintf(f, "  %-28s# data parallelism\n", m.ep > 1 ? "batch: (data, ep)" : "batch: data");
  if (m.ep > 1) fprintf(f, "  %-28s# expert parallelism\n", "expert: ep");
  if (fsdp && m.ep > 1) {
    /* an expert's weights already use ep (their `expert`): the rule keeps data for them */
    fprintf(f, "  %-28s# FSDP: the weights (the experts': over data)\n", "embed: (data, ep)");
  } else if (fsdp) {
    fprintf(f, "  %-28s# FSDP: the weights too\n", "embed: data");
  }
  if (m.model > 1) {
    for (int i = 0; i < p->ntp; i++)
      fprintf(f, "  %s: model%s\n", p->tp[i].dim, i == 0 ? arena_printf(a, "%*s# tensor parallelism",
                                                                          (int)(21 - strlen(p->tp[i].dim)), "") : "");
    if (vocab_tp) fprintf(f, "  vocab: model\n");
  }
  fprintf(f, "}\n\ntrain %s.forward {\n  loss = cross_entropy\n  optimizer = adam\n  master = f32\n  remat = full\n"
             "  microbatches = 4\n}\n", p->model);

  out->stdlib_file = p->file;
  out->model = p->model;
  out->params = p->params;
  out->mesh = mesh;
  out->devices = m.devices;
}

/* ---- the driver of it all ---- */

/* A key nothing read or ignored: warned at its name, with the closest key this model type knows. */
static void warn_unknown(HfConfig *c, const char *type) {
  /* the keys this model type reads that the config lacks: the candidates, found once */
  VEC(const char *) absent = {0};
  for (int j = 0; j < c->asked.len; j++)
    if (!hf_key(c, c->asked.data[j])) VEC_PUSH(c->arena, absent, c->asked.data[j]);
  for (int i = 0; i < c->nkeys; i++) {
    HfKey *k = &c->keys[i];
    if (k->state != HF_UNREAD) continue;
    Suggest s = suggest_begin(diag_would_show(DIAG_WARNING) ? k->name : NULL);
    for (int j = 0; j < absent.len; j++) suggest_try(&s, absent.data[j]);
    char buf[160];
    diag_warning(k->name_loc, "key \"%s\" is not one the import knows for model_type \"%s\": it is not read, and the "
                 "program's header lists it%s", k->name, type, suggest_text(&s, buf, sizeof buf));
  }
}

bool hf_import(HfConfig *c, const char *name, HfProgram *out) {
  memset(out, 0, sizeof *out);
  HfKey *mt = hf_key(c, "model_type");
  if (!mt || !cJSON_IsString(mt->value)) {
    if (mt) diag_error(mt->value_loc, "\"model_type\" is %s: expected a string, one of %s", hf_value_text(c, mt->value),
                       hf_import_model_types());
    else diag_error(hf_file_loc(c), "no \"model_type\" in this config (the import knows %s)", hf_import_model_types());
    return false;
  }
  mt->state = HF_READ;
  const char *type = mt->value->valuestring;
  const Family *fam = NULL;
  for (size_t i = 0; i < ARRAY_LEN(families); i++)
    if (strcmp(families[i].type, type) == 0) fam = &families[i];
  if (!fam) {
    Suggest s = suggest_begin(type);
    for (size_t i = 0; i < ARRAY_LEN(families); i++) suggest_try(&s, families[i].type);
    char buf[160];
    diag_error(mt->value_loc, "model_type \"%s\" is not supported%s (the import knows %s)", type,
               suggest_text(&s, buf, sizeof buf), hf_import_model_types());
    return false;
  }
  Plan p = {.c = c, .type = type, .ok = true};
  fam->read(&p);
  if (!p.ok) return false;
  if (p.params >= SIZE_LIMIT) {
    diag_error(hf_file_loc(c), "the sizes in this config give more than 2^62 params");
    return false;
  }
  for (size_t i = 0; i < ARRAY_LEN(generic_keys); i++) hf_ignore(c, generic_keys[i].key, generic_keys[i].why);
  warn_unknown(c, type);
  out->model_type = type;

  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) abort();
  write_program(&p, f, name, out);
  if (fclose(f) != 0 || !text) abort();
  out->text = arena_strndup(c->arena, text, len);
  free(text);
  return true;
}
