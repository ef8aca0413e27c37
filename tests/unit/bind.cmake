# bind.cmake: a layout binds every value (tests/unit/test_bind.c): after propagation, every value
# without a written type, in every sample, explain test program and step test program under each
# of their meshes and layouts, holds each dim a layout rule maps (after the skips) as the rule maps
# it; and the newcomers' cases of issue 18 (tests/unit/bind/). Included by tests/CMakeLists.txt.
add_executable(test_bind ${CMAKE_CURRENT_LIST_DIR}/test_bind.c ${CMAKE_CURRENT_LIST_DIR}/unit_pipeline.c)
target_link_libraries(test_bind PRIVATE shardc_core)
add_test(NAME unit.bind
         COMMAND test_bind ${CMAKE_SOURCE_DIR}/samples ${CMAKE_SOURCE_DIR}/tests/explain
                 ${CMAKE_CURRENT_LIST_DIR}/step_spmd ${CMAKE_CURRENT_LIST_DIR}/moe
                 --newcomers ${CMAKE_CURRENT_LIST_DIR}/bind)
# A layout rule naming the pipeline's stage axis for another dim is skipped (a warning at the rule),
# and the step runs: on main it passed check and deadlocked in run (issue 18: 55 of 1,503 cases).
add_test(NAME run.pipe.stage_rule_skipped
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/tests/sema/layout_pipeline_axis.shard --steps 2
                 --timeout 60)
set_tests_properties(run.pipe.stage_rule_skipped PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION "(^|\n)PASS: ")
# A multi-axis rule keeps the axes the tensor does not use yet (queries seq@ctx beside heads@model):
# the step run so computes what one device computes.
add_test(NAME run.multi_axis_keep
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/tests/explain/multi_axis_keep.shard -D batch=2 -D seq=16
                 -D embed=32 -D heads=4 -D head=8 --timeout 60)
set_tests_properties(run.multi_axis_keep PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION "(^|\n)PASS: ")
# sim says, in one line, what a plan the layout forbids would save, and the rule (issue 18, item 4).
# tests/explain/conflict_cost.shard under tp_sp at batch 256, seq 2048, by hand (ideal figures, 45
# GB/s ICI, model of size 2): the bound plan gathers x (bf16[64, 2048, 1024] a data shard, 268,435,456
# bytes) over model and reduce-scatters the output: 2 x 134,217,728 / 45e9 = 5.965 ms; the free plan
# gathers w_in and w_out (bf16 1024 x 4096, 8,388,608 bytes each): 2 x 4,194,304 / 45e9 = 186.4 us;
# it would save 5.778818844 ms. The rule is `hidden: model` (tests/explain/mlp.shard:28).
set(conflict ${CMAKE_SOURCE_DIR}/tests/explain/conflict_cost.shard --layout tp_sp -D batch=256 -D seq=2048)
add_test(NAME sim.forbidden_cheaper.text COMMAND $<TARGET_FILE:shardc> sim ${conflict})
set_tests_properties(sim.forbidden_cheaper.text PROPERTIES PASS_REGULAR_EXPRESSION
  "\nlayout +layout rule `hidden: model` \\(mlp\\.shard:28\\) binds hidden to model[^\n]* would save 5\\.78 ms of collective time per step \\(ideal figures: 186 us against 5\\.97 ms;[^\n]*\n")
add_test(NAME sim.forbidden_cheaper.json COMMAND $<TARGET_FILE:shardc> sim ${conflict} --format json)
set_tests_properties(sim.forbidden_cheaper.json PROPERTIES PASS_REGULAR_EXPRESSION
  "\"forbidden_cheaper\":[ \t]+{[\n\t]+\"saves_s\":[ \t]+0\\.0057788188[0-9]*,[\n\t]+\"bound_comm_s\":[ \t]+0\\.0059652323[0-9]*,[\n\t]+\"unbound_comm_s\":[ \t]+0\\.0001864135[0-9]*,[\n\t]+\"rule\":[ \t]+\"hidden: model\",[\n\t]+\"file\":[ \t]+\"mlp\\.shard\",[\n\t]+\"line\":[ \t]+28,")
# A layout whose plan nothing beats prints no such line (the same MLP under tp: the layer's
# AllReduce is what the free search also finds).
add_test(NAME sim.forbidden_cheaper.none
         COMMAND $<TARGET_FILE:shardc> sim ${CMAKE_SOURCE_DIR}/tests/explain/conflict_cost.shard --layout tp -D batch=256
                 -D seq=2048)
set_tests_properties(sim.forbidden_cheaper.none PROPERTIES FAIL_REGULAR_EXPRESSION "\nlayout " PASS_REGULAR_EXPRESSION "\nstep time ")
# explain's json carries the same object (its text line is in tests/explain/conflict_cost.out).
add_test(NAME explain.forbidden_cheaper.json COMMAND $<TARGET_FILE:shardc> explain ${conflict} --format json)
set_tests_properties(explain.forbidden_cheaper.json PROPERTIES PASS_REGULAR_EXPRESSION
  "\"forbidden_cheaper\":[ \t]+{[\n\t]+\"saves_s\":[ \t]+0\\.0057788188[0-9]*,[\n\t]+\"bound_comm_s\":[ \t]+0\\.0059652323[0-9]*,[\n\t]+\"unbound_comm_s\":[ \t]+0\\.0001864135[0-9]*,[\n\t]+\"rule\":[ \t]+\"hidden: model\",[\n\t]+\"file\":[ \t]+\"mlp\\.shard\",[\n\t]+\"line\":[ \t]+28,")
