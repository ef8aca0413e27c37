# stage_layers.cmake: uneven pipeline stages (`stage_layers`): check's memory per stage against a
# formula, sim's step against a hand-built 1f1b and gpipe schedule, explain's per-stage lines, run's
# located refusal (tests/unit/test_stage_layers.c). Included by tests/CMakeLists.txt.
add_executable(test_stage_layers ${CMAKE_CURRENT_LIST_DIR}/test_stage_layers.c)
target_link_libraries(test_stage_layers PRIVATE shardc_core)
target_compile_definitions(test_stage_layers PRIVATE SHARDC_BIN="$<TARGET_FILE:shardc>" SHARDC_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
add_dependencies(test_stage_layers shardc)
add_test(NAME unit.stage_layers COMMAND test_stage_layers)
