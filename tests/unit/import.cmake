# import.cmake: `shardc import` (docs/import.md) over configs written from the published model
# cards (tests/import/*.json): each imported program must pass `shardc check` (exit 0, fits) and
# its parameter count must equal the published count, exactly, plus only the difference written
# beside it (import_check.cmake); configs the import must refuse fail with the key and its place
# (import_error.cmake). Included by tests/CMakeLists.txt.
set(IMPORT_DIR ${CMAKE_SOURCE_DIR}/tests/import)
set(IMPORT_OUT ${CMAKE_CURRENT_BINARY_DIR}/import)
file(MAKE_DIRECTORY ${IMPORT_OUT})

# import_case(NAME PUBLISHED [DIFF formula]): tests/import/NAME.json.
function(import_case name published)
  set(diff 0)
  if(ARGC GREATER 2)
    set(diff "${ARGV2}")
  endif()
  add_test(NAME import.${name}
           COMMAND ${CMAKE_COMMAND} -DSHARDC=$<TARGET_FILE:shardc> -DCONFIG=${IMPORT_DIR}/${name}.json
                   -DOUT=${IMPORT_OUT}/${name}.shard -DPUBLISHED=${published} "-DDIFF=${diff}"
                   -P ${IMPORT_DIR}/import_check.cmake)
endfunction()

# Published counts. "index" is the checkpoint's model.safetensors.index.json, whose total_size
# holds 2 bytes per param of a bf16 checkpoint; "safetensors" the count the Hugging Face Hub shows
# (its API's safetensors.total), which is what the model page rounds.
# meta-llama/Meta-Llama-3-8B: index total_size 16,060,522,496 / 2 (page: 8.03B)
import_case(llama3_8b 8030261248)
# meta-llama/Meta-Llama-3-70B: index total_size 141,107,412,992 / 2 (page: 70.6B)
import_case(llama3_70b 70553706496)
# meta-llama/Llama-2-7b-hf: LlamaForCausalLM's count, 6,738,415,616 (page: 6.74B; KerasNLP's
# llama2_7b_en preset states the same; the fp16 index also holds the rotary buffers)
import_case(llama2_7b 6738415616)
# meta-llama/Llama-3.2-1B (embeddings tied: models/llama's llama_tied): 1,235,814,400 (page: 1.24B)
import_case(llama3.2_1b 1235814400)
# mistralai/Mistral-7B-v0.1: index total_size 14,483,464,192 / 2 (page: 7.24B)
import_case(mistral_7b 7241732096)
# mistralai/Mixtral-8x7B-v0.1: safetensors 46,702,792,704 (page: 46.7B; samples/mixtral_8x7b.shard
# works it out by hand)
import_case(mixtral_8x7b 46702792704)
# Qwen/Qwen2.5-7B: index total_size 15,231,233,024 / 2 (model card: 7.61B)
import_case(qwen2.5_7b 7615616512)
# Qwen/Qwen2.5-0.5B (embeddings tied: models/qwen2's qwen2_tied): 494,032,768 (model card: 0.49B)
import_case(qwen2.5_0.5b 494032768)
# Qwen/Qwen2.5-32B: index total_size 65,527,752,704 / 2 (the model card's "32.5B" is not the
# checkpoint's count; the page shows 32.8B)
import_case(qwen2.5_32b 32763876352)
# Qwen/Qwen2-57B-A14B: safetensors 57,408,658,944 (page: 57.4B)
import_case(qwen2_57b_a14b 57408658944)
# deepseek-ai/DeepSeek-V2-Lite: index total_size 31,412,968,448 / 2 (model card: 15.7B)
import_case(deepseek_v2_lite 15706484224)
# deepseek-ai/DeepSeek-V2: 235,741,434,880 (model card: 236B); group-limited routing and the routed
# scaling factor are noted in the header, not expressed
import_case(deepseek_v2 235741434880)
# deepseek-ai/deepseek-moe-16b-base: 16,375,728,128 (model card: 16.4B)
import_case(deepseek_moe_16b 16375728128)
# deepseek-ai/DeepSeek-V3: the main model's 671,026,419,200 (README_WEIGHTS: 671B, 685B with the
# 14B multi-token-prediction module, which Hugging Face does not load and the import leaves out)
import_case(deepseek_v3 671026419200)
# google/gemma-7b: 8,537,680,896 (page: 8.54B; KerasNLP's gemma_7b_en preset states the same)
import_case(gemma_7b 8537680896)
# openai-community/gpt2: GPT2LMHeadModel's 124,439,808, the "124M" (the page's 137M counts the
# checkpoint's causal-mask buffers too)
import_case(gpt2 124439808)
# google-bert/bert-base-uncased: BertModel's 109,482,240 (the paper's 110M; KerasNLP's
# bert_base_en_uncased preset states the same). models/bert has the MLM head and no pooler:
# + (embed^2 + embed + 2 embed + vocab) - (embed^2 + embed) = vocab + 2 embed (embed 768, vocab 30522)
import_case(bert_base 109482240 "30522 + 2 * 768")
# google-bert/bert-large-uncased: BertModel's 335,141,888 (the paper's 340M), the same difference
import_case(bert_large 335141888 "30522 + 2 * 1024")

# Configs the import refuses: exit 1, the key and its place (file:line:col) in the message, and an
# -o file untouched. import_refused(NAME EXPECT [BASE EDIT]) writes NAME.json from BASE with EDIT
# ("old|new") when given.
function(import_refused name expect)
  set(extra "")
  if(ARGC GREATER 3)
    set(extra -DBASE=${IMPORT_DIR}/${ARGV2}.json "-DEDIT=${ARGV3}")
    set(config ${IMPORT_OUT}/${name}.json)
  else()
    set(config ${IMPORT_DIR}/${name}.json)
  endif()
  add_test(NAME import.error.${name}
           COMMAND ${CMAKE_COMMAND} -DSHARDC=$<TARGET_FILE:shardc> -DCONFIG=${config} ${extra}
                   "-DEXPECT=${expect}" -DOUT=${IMPORT_OUT}/${name}.out.shard -P ${IMPORT_DIR}/import_error.cmake)
endfunction()
import_refused(bad_syntax "bad_syntax.json:4:3: error: JSON syntax error at '\"'")
import_refused(unterminated "unterminated.json:4:1: error: JSON syntax error: the file ends in the middle of a value")
import_refused(not_object "not_object.json:1:1: error: a config.json holds one JSON object")
import_refused(duplicate_key "duplicate_key.json:5:3: error: key \"n_embd\" is given twice \\(first at line 3\\)")
import_refused(t5 "t5.json:8:17: error: model_type \"t5\" is not supported \\(the import knows llama, mistral")
import_refused(model_type_typo "model_type_typo.json:14:17: error: model_type \"lama\" is not supported; did you mean 'llama'"
               llama3_8b "\"model_type\": \"llama\"|\"model_type\": \"lama\"")
import_refused(missing_key "missing_key.json:1:1: error: .*has no \"hidden_size\" \\(a model_type \"llama\" config needs it\\)"
               llama3_8b "\"hidden_size\": 4096,|")
import_refused(wrong_type "wrong_type.json:10:18: error: \"hidden_size\" is \"4096\": expected a whole number"
               llama3_8b "\"hidden_size\": 4096|\"hidden_size\": \"4096\"")
import_refused(llama_gelu "llama_gelu.json:9:17: error: \"hidden_act\" is \"gelu\": models/llama's MLP is SwiGLU"
               llama3_8b "\"hidden_act\": \"silu\"|\"hidden_act\": \"gelu\"")
import_refused(llama_bias "llama_bias.json:5:21: error: \"attention_bias\" is true: models/llama's attention has no biases"
               llama3_8b "\"attention_bias\": false|\"attention_bias\": true")
import_refused(llama_kv "llama_kv.json:17:26: error: \"num_key_value_heads\" 5 does not divide \"num_attention_heads\" 32"
               llama3_8b "\"num_key_value_heads\": 8|\"num_key_value_heads\": 5")
import_refused(mixtral_top3 "mixtral_top3.json:15:26: error: \"num_experts_per_tok\" is 3: models/mixtral .* top 2 experts"
               mixtral_8x7b "\"num_experts_per_tok\": 2|\"num_experts_per_tok\": 3")
import_refused(qwen2_window "qwen2_window.json:26:25: error: \"use_sliding_window\" is true: sliding-window attention is not expressed"
               qwen2.5_7b "\"use_sliding_window\": false|\"use_sliding_window\": true")
import_refused(qwen2_moe_norm "qwen2_moe_norm.json:17:21: error: \"norm_topk_prob\" is true: .*not renormalised"
               qwen2_57b_a14b "\"norm_topk_prob\": false|\"norm_topk_prob\": true")
import_refused(qwen2_moe_dense "qwen2_moe_dense.json:7:26: error: \"decoder_sparse_step\" is 2: every block of models/qwen2's qwen2_moe is a mixture of experts"
               qwen2_57b_a14b "\"decoder_sparse_step\": 1|\"decoder_sparse_step\": 2")
import_refused(deepseek_v3_no_q_lora "deepseek_v3_no_q_lora.json:35:18: error: \"q_lora_rank\" is null: models/deepseek's deepseek_v3 compresses the queries"
               deepseek_v3 "\"q_lora_rank\": 1536|\"q_lora_rank\": null")
import_refused(deepseek_v2_sigmoid "deepseek_v2_sigmoid.json:49:19: error: \"scoring_func\" is \"sigmoid\": models/deepseek's deepseek_v2 weights experts by a softmax"
               deepseek_v2_lite "\"scoring_func\": \"softmax\"|\"scoring_func\": \"sigmoid\"")
import_refused(deepseek_no_dense "deepseek_no_dense.json:15:28: error: \"first_k_dense_replace\" is 0: models/deepseek's models start with at least one dense block"
               deepseek_moe_16b "\"first_k_dense_replace\": 1|\"first_k_dense_replace\": 0")
import_refused(deepseek_freq "deepseek_freq.json:23:21: error: \"moe_layer_freq\" is 2"
               deepseek_moe_16b "\"moe_layer_freq\": 1|\"moe_layer_freq\": 2")
import_refused(bert_relative "bert_relative.json:18:30: error: \"position_embedding_type\" is \"relative_key\": models/bert has a learned position table"
               bert_base "\"absolute\"|\"relative_key\"")
import_refused(gpt2_cross "gpt2_cross.json:2:26: error: \"add_cross_attention\" is true: models/gpt2 is a decoder alone"
               gpt2 "{\n|{\n  \"add_cross_attention\": true,\n")
import_refused(gemma_untied "gemma_untied.json:2:26: error: \"tie_word_embeddings\" is false: models/gemma ties its embedding"
               gemma_7b "{\n|{\n  \"tie_word_embeddings\": false,\n")

# Not configs: usage errors exit 2; -o naming the config itself, or a directory that does not
# exist, is refused with nothing written.
add_test(NAME import.error.usage_D
         COMMAND ${CMAKE_COMMAND} -DSHARDC=$<TARGET_FILE:shardc> -DCONFIG=${IMPORT_DIR}/gpt2.json -DARGS=-Dseq=8
                 -DEXIT=2 "-DEXPECT=shardc: import takes -o FILE and --format; -D applies to the program it writes"
                 -P ${IMPORT_DIR}/import_error.cmake)
add_test(NAME import.error.output_is_input
         COMMAND ${CMAKE_COMMAND} -DSHARDC=$<TARGET_FILE:shardc> -DCONFIG=${IMPORT_OUT}/self.json
                 -DBASE=${IMPORT_DIR}/gpt2.json "-DEDIT=gpt2|gpt2" "-DARGS=-o;${IMPORT_OUT}/self.json"
                 "-DEXPECT=shardc: '.*self.json' is an input of this command: refusing to overwrite it" -P ${IMPORT_DIR}/import_error.cmake)
add_test(NAME import.error.output_dir
         COMMAND ${CMAKE_COMMAND} -DSHARDC=$<TARGET_FILE:shardc> -DCONFIG=${IMPORT_DIR}/gpt2.json
                 "-DARGS=-o;${IMPORT_OUT}/no/such/dir/gpt2.shard"
                 "-DEXPECT=shardc: cannot write '.*no/such/dir/gpt2.shard': its directory '.*no/such/dir': No such file or directory \\(nothing was written\\)"
                 -P ${IMPORT_DIR}/import_error.cmake)
# A key the import does not know is a warning at the key, listed in the header, and the program
# is still written (exit 0).
add_test(NAME import.unknown_key
         COMMAND sh -c "sed 's/\"use_cache\": true,/\"use_cache\": true, \"head_dimm\": 128,/' ${IMPORT_DIR}/llama3_8b.json > ${IMPORT_OUT}/unknown_key.json && $<TARGET_FILE:shardc> import ${IMPORT_OUT}/unknown_key.json -o ${IMPORT_OUT}/unknown_key.shard && grep -q '^#   head_dimm = 128$' ${IMPORT_OUT}/unknown_key.shard && $<TARGET_FILE:shardc> check ${IMPORT_OUT}/unknown_key.shard > /dev/null")
set_tests_properties(import.unknown_key PROPERTIES PASS_REGULAR_EXPRESSION
  "unknown_key.json:25:22: warning: key \"head_dimm\" is not one the import knows for model_type \"llama\".*did you mean 'head_dim'")
# The program to stdout, and --format json's object (its params equal the header's).
add_test(NAME import.json
         COMMAND $<TARGET_FILE:shardc> import ${IMPORT_DIR}/deepseek_v2_lite.json --format json)
set_tests_properties(import.json PROPERTIES PASS_REGULAR_EXPRESSION
  "\"model_type\":\t\"deepseek_v2\",\n\t\"stdlib\":\t\"models/deepseek\",\n\t\"model\":\t\"deepseek_v2_lite\",\n\t\"params\":\t15706484224,.*\"program\":\t\"# \\(stdout\\)")
