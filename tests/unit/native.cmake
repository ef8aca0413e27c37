# native.cmake: the LLVM lowering against the reference interpreter (test_native.c), and `shardc run`
# end to end: sharded equals one device on small inline meshes, and a perturbed device must FAIL.
add_executable(test_native ${CMAKE_CURRENT_LIST_DIR}/test_native.c)
target_link_libraries(test_native PRIVATE shardc_core)
set_target_properties(test_native PROPERTIES ENABLE_EXPORTS ON)
target_compile_definitions(test_native PRIVATE
  NATIVE_TEST_DIR="${CMAKE_CURRENT_LIST_DIR}/native"
  INTERP_TEST_DIR="${CMAKE_CURRENT_LIST_DIR}/interp"
  MOE_TEST_DIR="${CMAKE_CURRENT_LIST_DIR}/moe"
  STEP_SPMD_DIR="${CMAKE_CURRENT_LIST_DIR}/step_spmd"
  SHARDC_SAMPLES="${CMAKE_SOURCE_DIR}/samples")
add_test(NAME unit.native COMMAND test_native)

set(MLP_SMALL -D batch=8 -D seq=16 -D embed=64 -D hidden=128)
foreach(layout fsdp_tp dp fsdp tp)
  add_test(NAME run.mlp.forward.${layout}
           COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --entry mlp.forward
                   --layout ${layout} --mesh "h100[data: 2, model: 2]")
  add_test(NAME run.mlp.train.${layout}
           COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --steps 3
                   --layout ${layout} --mesh "h100[data: 2, model: 2]")
endforeach()
add_test(NAME run.mlp_sgd_mb.train
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_CURRENT_LIST_DIR}/interp/mlp_sgd_mb.shard --steps 3)
# A forward with --steps runs N times on the same inputs (the runtime reuses its large freed
# buffers from the second run on) and compares the last output.
add_test(NAME run.mlp.forward.steps
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --entry mlp.forward
                 --mesh "h100[data: 2, model: 2]" --steps 3)
set_tests_properties(run.mlp.forward.steps PROPERTIES PASS_REGULAR_EXPRESSION "PASS: .*\\(mean of 3 steps\\)")
# The mutation check: one device's result perturbed, run must FAIL (exit 1).
add_test(NAME run.mlp.mutation
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --entry mlp.forward
                 --mesh "h100[data: 2, model: 2]")
# (the report must say FAIL with its figures: a crash does not count as catching the perturbation)
set_tests_properties(run.mlp.mutation PROPERTIES ENVIRONMENT "SHARDC_RUN_PERTURB=1"
                     PASS_REGULAR_EXPRESSION "FAIL: [^\n]*\n  worst error")

# Transformer samples at small sizes on an inline 4-device mesh: each train step (2 steps: adam,
# microbatches, remat as the sample declares) sharded equals one device.
# (LM_DIMS without batch, for the samples run at another batch: a dim given two sizes is a usage error)
set(LM_DIMS -D seq=8 -D embed=32 -D hidden=64 -D heads=4 -D head=8 -D vocab=64 -D layers=2)
set(LM_SMALL -D batch=8 ${LM_DIMS})
foreach(case llama3_8b:fsdp_tp llama3_8b:fsdp_tp_sp llama3_8b:dp llama2_13b:fsdp llama3_70b:dp_tp llama3_405b:hsdp_tp_sp)
  string(REPLACE ":" ";" parts ${case})
  list(GET parts 0 sample)
  list(GET parts 1 layout)
  set(mesh "h100[data: 2, model: 2]")
  if(sample STREQUAL "llama3_405b")
    set(mesh "h100[data: 2, fsdp: 1, model: 2]")
  endif()
  add_test(NAME run.${sample}.${layout}
           COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/${sample}.shard ${LM_SMALL} -D kv_heads=2
                   --layout ${layout} --mesh ${mesh} --steps 2)
endforeach()
# GPT-3's layouts pipeline over `stage`; on a mesh without it the rule is skipped: layernorm, gelu,
# causal multi-head attention, 128 microbatches.
add_test(NAME run.gpt3_175b.ptd_nostage
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/gpt3_175b.shard ${LM_DIMS} -D batch=256
                 --mesh "h100[data: 2, model: 2]")

# What does not run ends with a located error, exit 1, never a crash: a mesh over the thread limit,
# --hbm too small. (Pipelines run: pipe_run.cmake.)
add_test(NAME run.error.mesh_too_large
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/llama3_8b.shard -D batch=8)
set_tests_properties(run.error.mesh_too_large PROPERTIES
                     PASS_REGULAR_EXPRESSION "error: run: mesh 'v5p_256' has 256 devices.*--mesh 'h100\\[data: 2, model: 2\\]'")
add_test(NAME run.error.hbm
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --entry mlp.forward
                 --mesh "h100[data: 2, model: 2]" --hbm 1000)
set_tests_properties(run.error.hbm PROPERTIES
                     PASS_REGULAR_EXPRESSION "device [0-9]+: out of memory for buffer '[a-z_.]+'.*over the cap of 1000 bytes")
add_test(NAME run.json
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --steps 2
                 --mesh "h100[data: 2, model: 2]" --format json)
set_tests_properties(run.json PROPERTIES PASS_REGULAR_EXPRESSION
  "\"devices\":\t4,\n\t\"steps\":\t2,\n\t\"pass\":\ttrue,\n\t\"max_abs_err\":[^\n]*\n\t\"max_rel_err\":[^\n]*\n\t\"loss\":\t\\[[^]]*\\],\n\t\"step_time_s\":[^\n]*\n\t\"compile_s\":[^\n]*\n\t\"peak_bytes_per_device\":")

# --save then --load: the params saved after two steps, loaded, give the loss the third step had
# (checked by hand once: 0.340093); here: both runs PASS and the files exist.
string(REPLACE ";" " " MLP_SMALL_TEXT "${MLP_SMALL}")
add_test(NAME run.save_load
         COMMAND sh -c "rm -rf run_save && $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL_TEXT} --steps 2 --mesh 'h100[data: 2, model: 2]' --save run_save && test -s run_save/w_in.npy && test -s run_save/loss.npy && $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL_TEXT} --mesh 'h100[data: 2, model: 2]' --load run_save")
set_tests_properties(run.save_load PROPERTIES PASS_REGULAR_EXPRESSION "loss step 1    0.34009")
# A token outside the vocabulary (loaded from tokens.npy) fails the device with the op and its line.
add_test(NAME run.error.take_index
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_CURRENT_LIST_DIR}/interp/llama_small.shard --entry llama.forward
                 --load ${CMAKE_CURRENT_LIST_DIR}/native/bad_tokens)
set_tests_properties(run.error.take_index PROPERTIES
                     PASS_REGULAR_EXPRESSION "device 0: line 38: take: index 70 out of range \\[0, 64\\)")
add_test(NAME run.error.load_shape
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_CURRENT_LIST_DIR}/interp/llama_small.shard --entry llama.forward
                 --load ${CMAKE_CURRENT_LIST_DIR}/native/bad_tokens -D batch=2)
set_tests_properties(run.error.load_shape PROPERTIES
                     PASS_REGULAR_EXPRESSION "tokens.npy holds int32\\[4, 8\\], but 'tokens' is i32\\[batch=2, seq=8\\]")

# Inputs and params are generated per global index: 2, 4 and 8 devices see the same numbers, so the
# first loss (computed before any update) is the same on each (0.346788, the 4-device run's).
foreach(m "h100[data: 2]" "h100[data: 2, model: 2]" "h100[data: 4, model: 2]")
  string(REGEX REPLACE "[^0-9]" "" tag "${m}")
  add_test(NAME run.same_values.${tag}
           COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --mesh ${m} --layout fsdp_tp)
  set_tests_properties(run.same_values.${tag} PROPERTIES PASS_REGULAR_EXPRESSION "PASS: .*loss step 1    0.34678[89]")
endforeach()

# An independent check of the math with NumPy (Debian's python3-numpy; skipped where missing):
# the MLP sample's forward and first loss, and causal attention, fed the same .npy files through
# --load, outputs read back from --save.
find_program(SYSTEM_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(SYSTEM_PYTHON3)
  execute_process(COMMAND ${SYSTEM_PYTHON3} -c "import numpy" RESULT_VARIABLE NUMPY_MISSING OUTPUT_QUIET ERROR_QUIET)
  if(NUMPY_MISSING EQUAL 0)
    add_test(NAME run.numpy
             COMMAND ${SYSTEM_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/native/numpy_check.py $<TARGET_FILE:shardc>
                     ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/numpy_check)
  endif()
endif()

# shardc build: an executable (object + the runtime library) that runs like `run` and prints the
# same report: the same losses as `run` prints for the same command (its third step, as each, starts
# from the one-device run's state: 0.340094, between the one-device 0.340096 and 0.340093, the
# sharded run's own third step before lockstep).
add_test(NAME build.mlp
         COMMAND sh -c "$<TARGET_FILE:shardc> build ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL_TEXT} --mesh 'h100[data: 2, model: 2]' -o mlp_built && ./mlp_built --steps 3")
set_tests_properties(build.mlp PROPERTIES PASS_REGULAR_EXPRESSION
                     "PASS: .*loss step 1    0.346788 .*loss step 3    0.340094")
add_test(NAME build.llama3_8b
         COMMAND sh -c "$<TARGET_FILE:shardc> build ${CMAKE_SOURCE_DIR}/samples/llama3_8b.shard -D batch=8 -D seq=8 -D embed=32 -D hidden=64 -D heads=4 -D head=8 -D vocab=64 -D layers=2 -D kv_heads=2 --mesh 'h100[data: 2, model: 2]' -o llama_built && ./llama_built --steps 2 --format json")
set_tests_properties(build.llama3_8b PROPERTIES PASS_REGULAR_EXPRESSION "\"pass\": true")

# A device that stops taking part (SHARDC_RUN_STALL=S: device 0 sleeps S s, then returns without
# running): a collective of the others times out after --timeout and names its device, the
# collective with its op's line (rt_at_line) and the device it waits for (which device notices first
# depends on the threads' timing: one waiting for device 0, or one waiting for a device that waits
# for it); with S 0 they notice at once. An error, never a hang.
add_test(NAME run.error.timeout
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --entry mlp.forward
                 --mesh "h100[data: 2, model: 2]" --timeout 0.3)
set_tests_properties(run.error.timeout PROPERTIES ENVIRONMENT "SHARDC_RUN_STALL=1" TIMEOUT 20
  PASS_REGULAR_EXPRESSION "sharded program failed: device [0-9] \\[data=[01], model=[01]\\]: line [0-9]+: (all_gather|all_reduce) over \\((data|model)\\) timed out after 0.3 s waiting for device [0-9] \\[data=[01], model=[01]\\] \\(")
add_test(NAME run.error.device_returned
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --entry mlp.forward
                 --mesh "h100[data: 2, model: 2]")
set_tests_properties(run.error.device_returned PROPERTIES ENVIRONMENT "SHARDC_RUN_STALL=0" TIMEOUT 20
  PASS_REGULAR_EXPRESSION "device 0 \\[data=0, model=0\\] \\(returned from its entry function\\) without calling it")

# Mixtral at small sizes under expert parallelism (route, AllToAll dispatch and combine), 2 steps.
add_test(NAME run.mixtral_8x7b.dp_ep_tp
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mixtral_8x7b.shard ${LM_DIMS} -D batch=16
                 -D kv_heads=2 -D expert=4 -D cap=4 --mesh "h100[data: 1, ep: 2, model: 2]" --steps 2)

# Ring attention (context parallelism, runtime/nn_ring.c): the sequence over ctx, K/V blocks round
# the ring; causal in zigzag order and full, 2 train steps on rings of 2, 4 and 8 devices; the
# long-context LLaMA sample (seq: ctx, tensor parallelism over model, full remat, 8 microbatches)
# forward and train on an inline mesh with ctx 2 and ctx 4.
foreach(kind causal full)
  foreach(ring ring2 ring4 ring8)
    add_test(NAME run.ring_${kind}.${ring}
             COMMAND $<TARGET_FILE:shardc> run ${CMAKE_CURRENT_LIST_DIR}/step_spmd/ring_${kind}.shard --mesh ${ring}
                     --layout cp --steps 2)
  endforeach()
endforeach()
foreach(case ctx2:h100[data:1,ctx:2,model:2] ctx4:h100[data:1,ctx:4,model:1])
  string(REPLACE ":" ";" parts ${case})
  list(GET parts 0 name)
  string(REPLACE "${name}:" "" mesh ${case})
  string(REPLACE ":" ": " mesh ${mesh})
  string(REPLACE "," ", " mesh ${mesh})
  add_test(NAME run.llama3_8b_long.forward.${name}
           COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/llama3_8b_long.shard ${LM_SMALL} -D kv_heads=2
                   --entry llama.forward --mesh ${mesh})
  add_test(NAME run.llama3_8b_long.train.${name}
           COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/llama3_8b_long.shard ${LM_SMALL} -D kv_heads=2
                   --mesh ${mesh} --steps 2)
endforeach()
# A ring over a tuple against the mesh's order (seq: (b, a) on [a: 2, b: 2]): one order, the key
# dim's tuple, in --emit-ir (the device program's ring and groups) and in what run runs.
add_test(NAME devprog.ring_order
         COMMAND $<TARGET_FILE:shardc> check ${CMAKE_CURRENT_LIST_DIR}/native/ring_ba.shard --layout ba --mesh ringba --emit-ir)
set_tests_properties(devprog.ring_order PROPERTIES PASS_REGULAR_EXPRESSION "ring #[0-9]+ \\(b, a\\), 3 steps[^\n]*\n.*groups #[0-9]+ \\(b, a\\): \\{0, 2, 1, 3\\}"
                     FAIL_REGULAR_EXPRESSION "ring #[0-9]+ \\(a, b\\)")
add_test(NAME run.ring_ba
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_CURRENT_LIST_DIR}/native/ring_ba.shard --layout ba --mesh ringba --steps 2)
# `shardc build` of a causal ring (the sequence in zigzag order): the executable places its blocks
# through the same descriptions as run (the runtime's block placement), so it prints run's losses.
add_test(NAME build.llama3_8b_long.ctx2
         COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/native/build_vs_run.sh $<TARGET_FILE:shardc> long_built 2
                 ${CMAKE_SOURCE_DIR}/samples/llama3_8b_long.shard ${LM_SMALL} -D kv_heads=2 --mesh "h100[data: 1, ctx: 2, model: 2]")
set_tests_properties(build.llama3_8b_long.ctx2 PROPERTIES TIMEOUT 300)
add_test(NAME build.ring_causal.ring4
         COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/native/build_vs_run.sh $<TARGET_FILE:shardc> ring_built 2
                 ${CMAKE_CURRENT_LIST_DIR}/step_spmd/ring_causal.shard --mesh ring4 --layout cp)
set_tests_properties(build.ring_causal.ring4 PROPERTIES TIMEOUT 300)
# Mutations run must FAIL: one device's result perturbed, and the causal mask reading storage
# positions instead of the zigzag order's logical ones (SHARDC_RING_MUTATE=zigzag, lower_ring.c).
add_test(NAME run.ring.mutation
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_CURRENT_LIST_DIR}/step_spmd/ring_causal.shard --mesh ring4 --layout cp
                 --entry causal_net.forward)
set_tests_properties(run.ring.mutation PROPERTIES ENVIRONMENT "SHARDC_RUN_PERTURB=1"
                     PASS_REGULAR_EXPRESSION "FAIL: [^\n]*\n  worst error")
add_test(NAME run.ring.mutation.zigzag
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_CURRENT_LIST_DIR}/step_spmd/ring_causal.shard --mesh ring4 --layout cp
                 --entry causal_net.forward)
set_tests_properties(run.ring.mutation.zigzag PROPERTIES ENVIRONMENT "SHARDC_RING_MUTATE=zigzag"
                     PASS_REGULAR_EXPRESSION "FAIL: [^\n]*\n  worst error")
# The simulated clock (issue 11): what the devices executed, priced by sim's model as they ran it,
# equals `shardc sim` on the same program: a forward, train steps with microbatches, remat and
# tensor/sequence parallelism, expert parallelism's AllToAlls, and ring attention.
# shardc_clock_test(NAME ARGS...): `shardc run ARGS` and `shardc sim ARGS`, compute and collective
# seconds compared by native/clock_check.cmake (pipe_run.cmake uses it too).
function(shardc_clock_test name)
  add_test(NAME run.clock.${name}
           COMMAND ${CMAKE_COMMAND} -DSHARDC=$<TARGET_FILE:shardc> "-DARGS=${ARGN}"
                   -P ${CMAKE_SOURCE_DIR}/tests/unit/native/clock_check.cmake)
endfunction()
shardc_clock_test(mlp_train ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --mesh "h100[data: 2, model: 2]")
shardc_clock_test(mlp_forward ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --entry mlp.forward
                  --mesh "tpu_v5e[data: 2, model: 2]")
shardc_clock_test(llama3_8b ${CMAKE_SOURCE_DIR}/samples/llama3_8b.shard ${LM_SMALL} -D kv_heads=2 --layout fsdp_tp_sp
                  --mesh "h100[data: 2, model: 2]")
shardc_clock_test(mixtral ${CMAKE_SOURCE_DIR}/samples/mixtral_8x7b.shard ${LM_DIMS} -D batch=16 -D kv_heads=2 -D expert=4
                  -D cap=4 --mesh "h100[data: 1, ep: 2, model: 2]")
shardc_clock_test(ring ${CMAKE_SOURCE_DIR}/samples/llama3_8b_long.shard ${LM_SMALL} -D kv_heads=2
                  --mesh "h100[data: 1, ctx: 2, model: 2]")
# The measured peak follows the buffer plan: `run`'s peak_bytes_per_device within 10% of `check`'s
# memory.per_device.total for the same arguments (peak_vs_check.sh prints both and the ratio).
set(PEAK_CHECK ${CMAKE_CURRENT_LIST_DIR}/native/peak_vs_check.sh $<TARGET_FILE:shardc>)
add_test(NAME peak.mlp.forward COMMAND ${PEAK_CHECK} ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --entry mlp.forward
                                       --mesh "h100[data: 2, model: 2]")
foreach(layout fsdp_tp dp tp)
  add_test(NAME peak.mlp.train.${layout} COMMAND ${PEAK_CHECK} ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --steps 2
                                                 --layout ${layout} --mesh "h100[data: 2, model: 2]")
endforeach()
add_test(NAME peak.llama3_8b.forward COMMAND ${PEAK_CHECK} ${CMAKE_SOURCE_DIR}/samples/llama3_8b.shard ${LM_SMALL} -D kv_heads=2
                                             --entry llama.forward --mesh "h100[data: 2, model: 2]")
foreach(layout fsdp_tp fsdp_tp_sp)
  add_test(NAME peak.llama3_8b.train.${layout} COMMAND ${PEAK_CHECK} ${CMAKE_SOURCE_DIR}/samples/llama3_8b.shard ${LM_SMALL}
                                                       -D kv_heads=2 --layout ${layout} --mesh "h100[data: 2, model: 2]" --steps 2)
endforeach()
add_test(NAME peak.mixtral_8x7b.train COMMAND ${PEAK_CHECK} ${CMAKE_SOURCE_DIR}/samples/mixtral_8x7b.shard ${LM_DIMS} -D batch=16
                                              -D kv_heads=2 -D expert=4 -D cap=4 --mesh "h100[data: 1, ep: 2, model: 2]" --steps 2)
# ... and the check can fail: with the lowering ignoring the plan (SHARDC_NO_BUFPLAN=1: no in-place
# results, no updates over their inputs, every slice copied) llama3_8b's step holds 1.18x.
add_test(NAME peak.llama3_8b.no_plan COMMAND ${PEAK_CHECK} ${CMAKE_SOURCE_DIR}/samples/llama3_8b.shard ${LM_SMALL} -D kv_heads=2
                                             --mesh "h100[data: 2, model: 2]" --steps 2)
set_tests_properties(peak.llama3_8b.no_plan PROPERTIES ENVIRONMENT "SHARDC_NO_BUFPLAN=1"
                     PASS_REGULAR_EXPRESSION "FAIL: measured peak [0-9]+ B per device, check total [0-9]+ B, ratio 1\\.[1-9]")

# Collective matmuls (shard/cmm.c, devprog.h's DevCmm; docs/passes.md "Collective matmuls"): the
# final norm's AllGather over `model` (4 devices) before the unembedding runs as 3 permutes around
# partial contractions. At these sizes the cost model does not choose it (3 permutes' latency
# against a tiny matmul), so SHARDC_CMM=always forces it. The permuted block is x's
# [batch 8 / 2 microbatches / 2 (data), seq 8/4, embed 32] in bf16: 2 x 2 x 32 x 2 = 256 bytes.
set(CMM_CASE ${CMAKE_SOURCE_DIR}/samples/llama3_8b.shard ${LM_SMALL} -D kv_heads=4 --layout fsdp_tp_sp
    --mesh "h100[data: 2, model: 4]")
add_test(NAME run.cmm.ir COMMAND $<TARGET_FILE:shardc> check ${CMM_CASE} --emit-ir)
set_tests_properties(run.cmm.ir PROPERTIES ENVIRONMENT "SHARDC_CMM=always" PASS_REGULAR_EXPRESSION
                     "contract [^\n]* collective matmul #[0-9]+ \\(model\\), 3 steps of 256 bytes \\(runs the ring\\)")
add_test(NAME run.cmm.off COMMAND $<TARGET_FILE:shardc> check ${CMM_CASE} --emit-ir --set tp_overlap=off)
set_tests_properties(run.cmm.off PROPERTIES ENVIRONMENT "SHARDC_CMM=always" FAIL_REGULAR_EXPRESSION "collective matmul")
add_test(NAME run.cmm.forward COMMAND $<TARGET_FILE:shardc> run ${CMM_CASE} --entry llama.forward)
set_tests_properties(run.cmm.forward PROPERTIES ENVIRONMENT "SHARDC_CMM=always" PASS_REGULAR_EXPRESSION "^PASS: ")
add_test(NAME run.cmm.train COMMAND $<TARGET_FILE:shardc> run ${CMM_CASE} --steps 2)
set_tests_properties(run.cmm.train PROPERTIES ENVIRONMENT "SHARDC_CMM=always" PASS_REGULAR_EXPRESSION "^PASS: ")
# each block written where rank r + j's goes instead of r - j's: run must FAIL
add_test(NAME run.cmm.mutation COMMAND $<TARGET_FILE:shardc> run ${CMM_CASE} --entry llama.forward)
set_tests_properties(run.cmm.mutation PROPERTIES ENVIRONMENT "SHARDC_CMM=always;SHARDC_CMM_MUTATE=order"
                     PASS_REGULAR_EXPRESSION "FAIL: [^\n]*\n  worst error")
# at the sample's own sizes the cost model chooses it: explain lists the AllGather, overlapped
add_test(NAME explain.cmm.json COMMAND $<TARGET_FILE:shardc> explain ${CMAKE_SOURCE_DIR}/samples/llama3_8b.shard
         --layout fsdp_tp_sp --format json)
set_tests_properties(explain.cmm.json PROPERTIES PASS_REGULAR_EXPRESSION
                     "\"overlapped\":[ \t]*true,[ \t\n]*\"overlap\":[ \t]*\"collective matmul \\(tp_overlap\\): 3 permutes of [0-9.]+ MB over \\(model\\)")
add_test(NAME explain.cmm.off COMMAND $<TARGET_FILE:shardc> explain ${CMAKE_SOURCE_DIR}/samples/llama3_8b.shard
         --layout fsdp_tp_sp --format json --set tp_overlap=off)
set_tests_properties(explain.cmm.off PROPERTIES FAIL_REGULAR_EXPRESSION "overlapped")

# The ReduceScatter side (shard/cmm.c try_scatter, DevCmm.scatter, lower.c lower_cmm_scatter): a
# contraction whose partial sum a tensor-parallel ReduceScatter (or AllReduce: the ring, then an
# AllGather of the blocks) reduces runs as n - 1 permutes carrying the accumulator. SHARDC_CMM=scatter
# forces this side alone (the AllGather side by its cost model: not at these sizes). Every sample
# using tensor parallelism, forward and train, sharded == one device. In CMM_CASE (model: 4) the
# permuted accumulator is a block of the partial sum [batch 8 / 2 microbatches / 2 (data), seq 8/4,
# embed 32] in bf16: 2 x 2 x 32 x 2 = 256 bytes; the train step's IR has 5 rings: 2 in the layer
# loop's body (attention's wo, the MLP's w_down), the same 2 in the backward loop's recomputed
# forward (remat), and the unembedding's input gradient; the backward's other input gradients are
# sums of contractions and stay whole ReduceScatters.
add_test(NAME run.cmm.rs.ir COMMAND $<TARGET_FILE:shardc> check ${CMM_CASE} --emit-ir)
set_tests_properties(run.cmm.rs.ir PROPERTIES ENVIRONMENT "SHARDC_CMM=scatter" PASS_REGULAR_EXPRESSION
                     "contract [^\n]* collective matmul #[0-9]+ \\(model\\), 3 steps of 256 bytes \\(runs the reduce-scatter ring\\)[^\n]*\n[ ]*%[0-9]+ = reduce_scatter [^\n]*\\(made by its contraction's reduce-scatter ring\\)")
add_test(NAME run.cmm.rs.count COMMAND sh -c "$<TARGET_FILE:shardc> check \"$@\" --emit-ir | grep -c 'runs the reduce-scatter ring'" sh ${CMM_CASE})
set_tests_properties(run.cmm.rs.count PROPERTIES ENVIRONMENT "SHARDC_CMM=scatter" PASS_REGULAR_EXPRESSION "^5\n$")
# unforced at these sizes the cost model refuses it (3 permutes' latency against a tiny matmul),
# and tp_overlap = off refuses it forced
add_test(NAME run.cmm.rs.unpaid COMMAND $<TARGET_FILE:shardc> check ${CMM_CASE} --emit-ir)
add_test(NAME run.cmm.rs.off COMMAND $<TARGET_FILE:shardc> check ${CMM_CASE} --emit-ir --set tp_overlap=off)
set_tests_properties(run.cmm.rs.off PROPERTIES ENVIRONMENT "SHARDC_CMM=scatter")
set_tests_properties(run.cmm.rs.unpaid run.cmm.rs.off PROPERTIES FAIL_REGULAR_EXPRESSION "reduce-scatter ring"
                     PASS_REGULAR_EXPRESSION "reduce_scatter")
set(CMM_RS_LM ${LM_DIMS} -D kv_heads=4 --mesh "h100[data: 2, model: 4]")
function(cmm_rs_case name model)
  add_test(NAME run.cmm.rs.${name}.forward COMMAND $<TARGET_FILE:shardc> run ${ARGN} --entry ${model}.forward)
  add_test(NAME run.cmm.rs.${name}.train COMMAND $<TARGET_FILE:shardc> run ${ARGN} --steps 2)
  set_tests_properties(run.cmm.rs.${name}.forward run.cmm.rs.${name}.train PROPERTIES ENVIRONMENT "SHARDC_CMM=scatter"
                       PASS_REGULAR_EXPRESSION "(^|\n)PASS: ")
endfunction()
set(CMM_PIPE_LM -D seq=8 -D embed=32 -D hidden=64 -D heads=4 -D head=8 -D vocab=64 -D layers=4)
cmm_rs_case(mlp.tp mlp ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --layout tp --mesh "h100[data: 2, model: 4]")
cmm_rs_case(mlp.fsdp_tp mlp ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --layout fsdp_tp --mesh "h100[data: 2, model: 4]")
foreach(case llama3_8b:fsdp_tp_sp llama3_8b:fsdp_tp llama3_8b:dp_tp llama2_13b:fsdp_tp_sp llama3_70b:fsdp_tp_sp)
  string(REPLACE ":" ";" parts ${case})
  list(GET parts 0 sample)
  list(GET parts 1 layout)
  cmm_rs_case(${sample}.${layout} llama ${CMAKE_SOURCE_DIR}/samples/${sample}.shard -D batch=8 ${CMM_RS_LM} --layout ${layout})
endforeach()
cmm_rs_case(llama3_405b.hsdp_tp_sp llama ${CMAKE_SOURCE_DIR}/samples/llama3_405b.shard -D batch=8 ${LM_DIMS} -D kv_heads=4
            --layout hsdp_tp_sp --mesh "h100[data: 2, fsdp: 1, model: 4]")
cmm_rs_case(gpt3_175b.ptd_nostage gpt ${CMAKE_SOURCE_DIR}/samples/gpt3_175b.shard -D batch=256 ${LM_DIMS}
            --mesh "h100[data: 2, model: 4]")
cmm_rs_case(mixtral_8x7b.dp_ep_tp mixtral ${CMAKE_SOURCE_DIR}/samples/mixtral_8x7b.shard -D batch=16 ${LM_DIMS} -D kv_heads=2
            -D expert=4 -D cap=4 --mesh "h100[data: 1, ep: 2, model: 2]")
cmm_rs_case(llama3_8b_long.ctx2 llama ${CMAKE_SOURCE_DIR}/samples/llama3_8b_long.shard -D batch=8 ${LM_DIMS} -D kv_heads=2
            --mesh "h100[data: 1, ctx: 2, model: 2]")
cmm_rs_case(llama3_405b_pp.pp_tp_sp llama ${CMAKE_SOURCE_DIR}/samples/llama3_405b_pp.shard -D batch=32 ${CMM_PIPE_LM} -D kv_heads=2
            --layout pp_tp_sp --mesh "h100[data: 2, stage: 2, model: 2]")
cmm_rs_case(gpt3_175b.ptd gpt ${CMAKE_SOURCE_DIR}/samples/gpt3_175b.shard -D batch=256 ${CMM_PIPE_LM}
            --mesh "h100[data: 1, stage: 2, model: 2]")
# The rings ran: the runtime's record of the forward lists permutes (and no reduce_scatter over model)
add_test(NAME run.cmm.rs.executed COMMAND $<TARGET_FILE:shardc> run ${CMM_CASE} --entry llama.forward --format json)
set_tests_properties(run.cmm.rs.executed PROPERTIES ENVIRONMENT "SHARDC_CMM=scatter" PASS_REGULAR_EXPRESSION
                     "\"pass\":[ \t]*true.*\"kind\":[ \t]*\"collective_permute\",[ \t\n]*\"axes\":[ \t\n]*\\[\"model\"\\]")
# each step's partial product of the block one step off (r - j instead of r - 1 - j): run must
# FAIL, under a ReduceScatter (fsdp_tp_sp) and an AllReduce (dp_tp)
add_test(NAME run.cmm.rs.mutation COMMAND $<TARGET_FILE:shardc> run ${CMM_CASE} --entry llama.forward)
add_test(NAME run.cmm.rs.mutation.allreduce COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/llama3_8b.shard
         -D batch=8 ${CMM_RS_LM} --layout dp_tp --entry llama.forward)
set_tests_properties(run.cmm.rs.mutation run.cmm.rs.mutation.allreduce PROPERTIES
                     ENVIRONMENT "SHARDC_CMM=scatter;SHARDC_CMM_MUTATE=order" PASS_REGULAR_EXPRESSION "FAIL: [^\n]*\n  worst error")
# at the sample's own sizes the cost model chooses it: explain lists the ReduceScatter (the
# AllReduce under dp_tp), overlapped, with its reason
add_test(NAME explain.cmm.rs.json COMMAND $<TARGET_FILE:shardc> explain ${CMAKE_SOURCE_DIR}/samples/llama3_8b.shard
         --layout fsdp_tp_sp --format json)
set_tests_properties(explain.cmm.rs.json PROPERTIES PASS_REGULAR_EXPRESSION
                     "\"overlapped\":[ \t]*true,[ \t\n]*\"overlap\":[ \t]*\"collective matmul \\(tp_overlap\\): 4 partial contractions into blocks of seq, each added to the accumulator that 3 permutes of [0-9.]+ MB over \\(model\\) carry around: ")
add_test(NAME explain.cmm.rs.allreduce COMMAND $<TARGET_FILE:shardc> explain ${CMAKE_SOURCE_DIR}/samples/llama3_8b.shard
         --layout dp_tp)
set_tests_properties(explain.cmm.rs.allreduce PROPERTIES PASS_REGULAR_EXPRESSION
                     "all_reduce over model at layers.shard:38[^\n]*\n[^\n]*\n[^\n]*\n(          [^\n]*\n|     why:[^\n]*\n)*     overlapped: collective matmul \\(tp_overlap\\): 4 partial contractions into blocks of")
