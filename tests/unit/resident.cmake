# resident.cmake: check's memory the way Megatron reports it (issue 22): resident state per device
# by what it is, the peak by class, the largest buffers named by tensor, dtype, per-device shape
# and relative path (tests/unit/test_resident.c). Included by tests/CMakeLists.txt.
add_executable(test_resident ${CMAKE_CURRENT_LIST_DIR}/test_resident.c)
target_link_libraries(test_resident PRIVATE shardc_core)
target_compile_definitions(test_resident PRIVATE SHARDC_BIN="$<TARGET_FILE:shardc>" SHARDC_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
add_dependencies(test_resident shardc)
add_test(NAME unit.resident COMMAND test_resident)
