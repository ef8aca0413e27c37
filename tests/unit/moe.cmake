# moe.cmake: mixture of experts (tests/unit/test_moe.c): route against hand-computed slots, the
# costs and memory of routed values, the MoE block's gradients against finite differences, expert
# parallelism against the unsharded step, and Mixtral 8x7B's parameter counts. Included by
# tests/CMakeLists.txt; paths are relative to this file.
add_executable(test_moe ${CMAKE_CURRENT_LIST_DIR}/test_moe.c)
target_link_libraries(test_moe PRIVATE shardc_core)
target_compile_definitions(test_moe PRIVATE
  MOE_DIR="${CMAKE_CURRENT_LIST_DIR}/moe"
  SHARDC_SAMPLES="${CMAKE_SOURCE_DIR}/samples")
add_test(NAME unit.moe COMMAND test_moe)
