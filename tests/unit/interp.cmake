# interp.cmake: the reference interpreter's unit test (compiler/interp*.c: every op by hand, gradient
# ops against finite differences, fused attention, loops, and SPMD runs of partitioned programs
# against global runs). Included by tests/CMakeLists.txt; paths are relative to this file.
add_executable(test_interp ${CMAKE_CURRENT_LIST_DIR}/test_interp.c ${CMAKE_CURRENT_LIST_DIR}/unit_pipeline.c)
target_link_libraries(test_interp PRIVATE shardc_core)
target_compile_definitions(test_interp PRIVATE
  INTERP_TEST_DIR="${CMAKE_CURRENT_LIST_DIR}/interp"
  SHARDC_SAMPLES="${CMAKE_SOURCE_DIR}/samples")
add_test(NAME unit.interp COMMAND test_interp)
