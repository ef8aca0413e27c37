# pipe_run.cmake: pipelines (layers@stage) lowered and run by `shardc run` (compiler/codegen/lower_pipe.c,
# runtime/pipeline.c): sharded equals one device, 3 train steps, under each schedule on 2 and 4
# stages (tests/unit/native/pipe: a small LLaMA, tensor parallel within a stage), the two pipeline
# samples at small sizes (GPT-3's tied embedding: an AllReduce between the first and the last stage;
# Megatron's send split over `model`), and mutations that must FAIL. unit.native runs the same
# programs against the interpreter.
set(PIPE_DIR ${CMAKE_CURRENT_LIST_DIR}/native/pipe)
foreach(schedule gpipe 1f1b interleaved)
  add_test(NAME run.pipe.${schedule}
           COMMAND $<TARGET_FILE:shardc> run ${PIPE_DIR}/pipe_${schedule}.shard --layout pp --steps 3
                   --mesh "h100[data: 1, stage: 2, model: 2]")
  add_test(NAME run.pipe.${schedule}.stages4
           COMMAND $<TARGET_FILE:shardc> run ${PIPE_DIR}/pipe_${schedule}.shard --layout pp --steps 3 -D layers=8
                   --mesh "h100[data: 1, stage: 4, model: 2]")
  set_tests_properties(run.pipe.${schedule} run.pipe.${schedule}.stages4 PROPERTIES TIMEOUT 300
                       PASS_REGULAR_EXPRESSION "^PASS: ")
endforeach()
add_test(NAME run.pipe.dp
         COMMAND $<TARGET_FILE:shardc> run ${PIPE_DIR}/pipe_1f1b.shard --layout pp --steps 2 -D batch=16
                 --mesh "h100[data: 2, stage: 2, model: 2]")
set(PIPE_LM -D seq=8 -D embed=32 -D hidden=64 -D heads=4 -D head=8 -D vocab=64 -D layers=4)
add_test(NAME run.gpt3_175b.ptd
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/gpt3_175b.shard ${PIPE_LM} -D batch=256 --steps 2
                 --mesh "h100[data: 1, stage: 2, model: 2]")
add_test(NAME run.gpt3_175b.ptd.stages4
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/gpt3_175b.shard ${PIPE_LM} -D batch=256 --steps 2
                 --mesh "h100[data: 1, stage: 4, model: 2]")
foreach(layout pp_tp_sp pp_tp pp_fsdp_tp_sp)
  add_test(NAME run.llama3_405b_pp.${layout}
           COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/llama3_405b_pp.shard ${PIPE_LM} -D kv_heads=2
                   -D batch=32 --layout ${layout} --steps 2 --mesh "h100[data: 2, stage: 2, model: 2]")
endforeach()
add_test(NAME run.llama3_405b_pp.forward
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/llama3_405b_pp.shard ${PIPE_LM} -D kv_heads=2
                 -D batch=16 --entry llama.forward --mesh "h100[data: 1, stage: 4, model: 2]")
set_tests_properties(run.gpt3_175b.ptd run.gpt3_175b.ptd.stages4 run.llama3_405b_pp.pp_tp_sp run.llama3_405b_pp.pp_tp
                     run.llama3_405b_pp.pp_fsdp_tp_sp run.llama3_405b_pp.forward run.pipe.dp PROPERTIES TIMEOUT 300
                     PASS_REGULAR_EXPRESSION "^PASS: ")
# Mutations: a microbatch's embedding gradient dropped on stage 0 (SHARDC_PIPE_MUTATE=1, the
# lowering skips that action), and one device's result perturbed: run must print FAIL with its figures.
add_test(NAME run.pipe.mutation.dropped_gradient
         COMMAND $<TARGET_FILE:shardc> run ${PIPE_DIR}/pipe_1f1b.shard --layout pp --steps 2)
set_tests_properties(run.pipe.mutation.dropped_gradient PROPERTIES ENVIRONMENT "SHARDC_PIPE_MUTATE=1"
                     PASS_REGULAR_EXPRESSION "FAIL: [^\n]*\n  worst error")
add_test(NAME run.pipe.mutation.perturbed
         COMMAND $<TARGET_FILE:shardc> run ${PIPE_DIR}/pipe_interleaved.shard --layout pp --steps 2)
set_tests_properties(run.pipe.mutation.perturbed PROPERTIES ENVIRONMENT "SHARDC_RUN_PERTURB=1"
                     PASS_REGULAR_EXPRESSION "FAIL: [^\n]*\n  worst error")
# `shardc build`: the executable places params on their stages and stacked tensors in storage
# order as run does, and prints run's losses (interleaved(2), 3 steps: the same figures as run.pipe.interleaved,
# whose third step starts, as every step, from the one-device run's state: docs/run.md, lockstep).
add_test(NAME build.pipe.interleaved
         COMMAND sh -c "$<TARGET_FILE:shardc> build ${PIPE_DIR}/pipe_interleaved.shard --layout pp -o pipe_built && ./pipe_built --steps 3")
set_tests_properties(build.pipe.interleaved PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION
                     "PASS: .*loss step 1    4.29881 .*loss step 3    4.10543")
# --save after two interleaved(2) steps writes the stacked params in the model's layer order: loaded
# into the 1f1b program they give the third step's loss to rounding (run.pipe.interleaved: 4.10543
# sharded, 4.10502 on one device, from the one-device run's state after two steps; the saved params
# are the sharded run's, one step's rounding away: 4.10511). The same file with its layers in
# interleaved storage order (rows 0, 2, 1, 3, permuted with NumPy) gives 4.1949.
add_test(NAME run.pipe.save_load
         COMMAND sh -c "rm -rf pipe_save && $<TARGET_FILE:shardc> run ${PIPE_DIR}/pipe_interleaved.shard --layout pp --steps 2 --save pipe_save && $<TARGET_FILE:shardc> run ${PIPE_DIR}/pipe_1f1b.shard --layout pp --load pipe_save")
set_tests_properties(run.pipe.save_load PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION "PASS: [^\n]*pipe_1f1b[^\n]*\n[^\n]*\n  loss step 1    4\\.105")
# The simulated clock under a pipeline: each stage's regions, their f32 gradient accumulation and
# their sends (with Megatron's send split over model in GPT-3's ptd) priced as shardc sim prices
# them, averaged over the devices: equal to `shardc sim` (native/clock_check.cmake).
shardc_clock_test(gpt3_ptd ${CMAKE_SOURCE_DIR}/samples/gpt3_175b.shard ${PIPE_LM} -D batch=256
                  --mesh "h100[data: 1, stage: 2, model: 2]")
shardc_clock_test(interleaved ${PIPE_DIR}/pipe_interleaved.shard --layout pp)
