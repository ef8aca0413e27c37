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
