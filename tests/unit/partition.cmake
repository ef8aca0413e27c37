# partition.cmake: the reference check of propagation and partitioning (tests/unit/test_partition.c)
# over every sample, every explain test program and the sharded-step programs (train steps whole),
# under each of their meshes and layouts.
# Included by tests/CMakeLists.txt; paths are relative to this file.
add_executable(test_partition ${CMAKE_CURRENT_LIST_DIR}/test_partition.c ${CMAKE_CURRENT_LIST_DIR}/unit_pipeline.c)
target_link_libraries(test_partition PRIVATE shardc_core)
add_test(NAME unit.partition
         COMMAND test_partition ${CMAKE_SOURCE_DIR}/samples ${CMAKE_SOURCE_DIR}/tests/explain
                 ${CMAKE_CURRENT_LIST_DIR}/step_spmd)
