# propagate.cmake: the propagation search's incremental figures (its ledger of collective costs,
# its layout term, its shardings) against a full recomputation after every trial
# (tests/unit/test_propagate.c), over generated programs, every sample and every explain test
# program, under each of their meshes and layouts. Included by tests/CMakeLists.txt.
add_executable(test_propagate ${CMAKE_CURRENT_LIST_DIR}/test_propagate.c ${CMAKE_CURRENT_LIST_DIR}/unit_pipeline.c)
target_link_libraries(test_propagate PRIVATE shardc_core)
add_test(NAME unit.propagate
         COMMAND test_propagate ${CMAKE_SOURCE_DIR}/samples ${CMAKE_SOURCE_DIR}/tests/explain
                 ${CMAKE_CURRENT_LIST_DIR}/step_spmd)
