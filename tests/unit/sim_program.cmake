# sim_program.cmake: `shardc sim`'s translation of programs to the timeline, against timelines
# derived by hand (tests/unit/test_sim_program.c). Included by tests/CMakeLists.txt.
add_executable(test_sim_program ${CMAKE_CURRENT_LIST_DIR}/test_sim_program.c)
target_link_libraries(test_sim_program PRIVATE shardc_core)
add_test(NAME unit.sim_program COMMAND test_sim_program)
