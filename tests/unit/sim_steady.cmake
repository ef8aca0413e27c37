# sim_steady.cmake: `shardc sim` from a steady state (a pipeline of many microbatches, a loop past the
# task budget) against the same simulated in full, and at sizes only the steady state reaches against
# closed forms (tests/unit/test_sim_steady.c). Included by tests/CMakeLists.txt.
add_executable(test_sim_steady ${CMAKE_CURRENT_LIST_DIR}/test_sim_steady.c)
target_link_libraries(test_sim_steady PRIVATE shardc_core)
add_test(NAME unit.sim_steady COMMAND test_sim_steady)
