# devprog.cmake: the device program (shard/devprog.h) against the test's brute force
# (tests/unit/test_devprog.c): replica groups, blocks, collectives' and rings' groups, stages and
# the block placement's descriptions, over every sample, explain test program, sharded-step
# program and the native tests' rings, under each of their meshes and layouts.
add_executable(test_devprog ${CMAKE_CURRENT_LIST_DIR}/test_devprog.c ${CMAKE_CURRENT_LIST_DIR}/unit_pipeline.c)
target_link_libraries(test_devprog PRIVATE shardc_core)
add_test(NAME unit.devprog
         COMMAND test_devprog ${CMAKE_SOURCE_DIR}/samples ${CMAKE_SOURCE_DIR}/tests/explain
                 ${CMAKE_CURRENT_LIST_DIR}/step_spmd ${CMAKE_CURRENT_LIST_DIR}/native/ring_ba.shard
                 ${CMAKE_CURRENT_LIST_DIR}/native/pipe)
set_tests_properties(unit.devprog PROPERTIES TIMEOUT 900)
