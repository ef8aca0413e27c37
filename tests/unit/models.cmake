# models.cmake: the stdlib models the Hugging Face import uses (stdlib/models/{bert,vit,gpt2,gemma,
# qwen2,deepseek}.shard and their layers in stdlib/layers.shard), through the small programs of
# tests/models/ (which suite.models also checks):
#   params.models.X  `shardc check` counts the params the model's formula gives at the program's
#                    sizes (the formula written out below, term by term as the stdlib file's header
#                    states it; tests/models/param_count.cmake)
#   run.models.X     `shardc run --steps 2`: the train step sharded over the program's 4-device mesh
#                    equals one device (Adam, f32 master copy). Four programs, as compiling each
#                    takes seconds: bert (encoder attention, biases, post-norm, two inputs), vit
#                    (the patch embedding), qwen2_moe (query/key/value biases, fine-grained experts
#                    with a gated shared expert) and deepseek_v3 (latent attention with compressed
#                    queries, sigmoid routing with a bias); the others reuse these layers or
#                    llama's and are checked (suite.models, params.models.X). All nine PASS by hand:
#                    for f in tests/models/*.shard; do shardc run $f --steps 2; done
# Included by tests/CMakeLists.txt.
set(MODELS_DIR ${CMAKE_SOURCE_DIR}/tests/models)

function(model_params name file expect)
  add_test(NAME params.models.${name}
           COMMAND ${CMAKE_COMMAND} -DSHARDC=$<TARGET_FILE:shardc> -DFILE=${MODELS_DIR}/${file}.shard
                   "-DEXPECT=${expect}" "-DARGS=${ARGN}" -P ${MODELS_DIR}/param_count.cmake)
endfunction()

# bert_small: vocab 64, seq 8, types 2, embed 32, hidden 64, heads 4 x head 8, 2 layers.
#   embeddings (vocab + seq + types) * embed + 2 embed; per layer: attention 4 E (heads head) +
#   3 (heads head) + E, MLP 2 E hidden + hidden + E, two LayerNorms 4 E; MLM head E^2 + 3 E + vocab
model_params(bert bert_small
  "(64 + 8 + 2) * 32 + 2 * 32 + 2 * (4 * 32 * 32 + 3 * 32 + 32 + 2 * 32 * 64 + 64 + 32 + 4 * 32) + 32 * 32 + 3 * 32 + 64")
# vit_small: 3 channels, patches of 4 x 4 pixels, 16 patches, embed 32, hidden 64, 4 heads of 8,
#   10 classes, 2 layers: patch kernel and bias, positions, blocks, final LayerNorm and classifier
model_params(vit vit_small
  "3 * 4 * 4 * 32 + 32 + 16 * 32 + 2 * (4 * 32 * 32 + 3 * 32 + 32 + 2 * 32 * 64 + 64 + 32 + 4 * 32) + 2 * 32 + 32 * 10 + 10")
# ViT-B/16 at full size (224 x 224 images, 14 x 14 patches of 16 x 16, embed 768, hidden 3072, 12
# heads of 64, 12 layers, 1000 classes) against torchvision's vit_b_16, 86,567,656 params: that
# model has a class token (embed) and one more position row (embed), which models/vit has not.
model_params(vit_b16 vit_small "86567656 - 2 * 768"
  -D embed=768 -D hidden=3072 -D heads=12 -D head=64 -D layers=12 -D ph=14 -D pw=14 -D py=16 -D px=16 -D classes=1000)
# gpt2_small: embed 32, hidden 128, 4 heads of 8, vocab 64, 8 positions, 2 layers:
#   per block attention with biases, MLP with biases, two LayerNorms; tied embedding, positions,
#   final LayerNorm
model_params(gpt2 gpt2_small
  "2 * (4 * 32 * 32 + 3 * 32 + 32 + 2 * 32 * 128 + 128 + 32 + 4 * 32) + 64 * 32 + 8 * 32 + 2 * 32")
# gemma_small: embed 32, hidden 64, 4 query heads and 1 key/value head of 16, vocab 64, 2 layers:
#   per block E head (2 heads + 2 kv_heads) + 3 E hidden + 2 E; tied embedding, final norm
model_params(gemma gemma_small "2 * (32 * 16 * (2 * 4 + 2 * 1) + 3 * 32 * 64 + 2 * 32) + 64 * 32 + 32")
# qwen2_small: embed 32, hidden 64, 4 query and 2 key/value heads of 8, vocab 64, 2 layers:
#   attention + its biases head (heads + 2 kv_heads); untied embeddings
model_params(qwen2 qwen2_small
  "2 * (32 * 8 * (2 * 4 + 2 * 2) + 8 * (4 + 2 * 2) + 3 * 32 * 64 + 2 * 32) + 2 * 64 * 32 + 32")
# qwen2_moe_small: as qwen2_small with 4 routed experts of 16, a shared expert of 32 and its gate:
#   gate E expert + expert 3 E expert_hidden + 3 E shared_hidden + E
model_params(qwen2_moe qwen2_moe_small
  "2 * (32 * 8 * (2 * 4 + 2 * 2) + 8 * (4 + 2 * 2) + 32 * 4 + 4 * 3 * 32 * 16 + 3 * 32 * 32 + 32 + 2 * 32) + 2 * 64 * 32 + 32")
# deepseek_small: embed 32, 4 heads of 8 (kv_heads 4), 1 dense block (hidden 64), 2 MoE blocks of
#   8 routed experts of 16 and shared experts of 32, vocab 64
model_params(deepseek deepseek_small
  "(32 * 8 * 16 + 3 * 32 * 64 + 64) + 2 * (32 * 8 * 16 + 32 * 8 + 8 * 3 * 32 * 16 + 3 * 32 * 32 + 64) + 2 * 64 * 32 + 32")
# deepseek_v2_lite_small: multi-head latent attention, 4 heads, kv_rank 16, qk_nope 8, qk_rope 4,
#   v_head 8: queries E heads (nope + rope), latent and shared rotary key E (kv_rank + rope) +
#   kv_rank (its norm), keys and values kv_rank heads (nope + v_head), output heads v_head E
model_params(deepseek_v2_lite deepseek_v2_lite_small
  "(32 * 4 * 12 + 32 * 20 + 16 + 16 * 4 * 16 + 4 * 8 * 32 + 3 * 32 * 64 + 64) + 2 * (32 * 4 * 12 + 32 * 20 + 16 + 16 * 4 * 16 + 4 * 8 * 32 + 32 * 8 + 8 * 3 * 32 * 16 + 3 * 32 * 32 + 64) + 2 * 64 * 32 + 32")
# deepseek_v3_small: compressed queries (q_rank 24: E q_rank + q_rank + q_rank heads (nope + rope)),
#   shared experts of 16, the routing bias (expert)
model_params(deepseek_v3 deepseek_v3_small
  "(32 * 24 + 24 + 24 * 4 * 12 + 32 * 20 + 16 + 16 * 4 * 16 + 4 * 8 * 32 + 3 * 32 * 64 + 64) + 2 * (32 * 24 + 24 + 24 * 4 * 12 + 32 * 20 + 16 + 16 * 4 * 16 + 4 * 8 * 32 + 32 * 8 + 8 * 3 * 32 * 16 + 3 * 32 * 16 + 8 + 64) + 2 * 64 * 32 + 32")

foreach(name bert vit qwen2_moe deepseek_v3)
  add_test(NAME run.models.${name} COMMAND $<TARGET_FILE:shardc> run ${MODELS_DIR}/${name}_small.shard --steps 2)
endforeach()
