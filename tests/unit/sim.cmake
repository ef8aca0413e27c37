# sim.cmake: the simulator's unit test (compiler/sim/: the timeline engine, its Chrome trace, the
# pipeline schedules against their closed forms). Included by tests/CMakeLists.txt.
add_executable(test_sim ${CMAKE_CURRENT_LIST_DIR}/test_sim.c)
target_link_libraries(test_sim PRIVATE shardc_core)
add_test(NAME unit.sim COMMAND test_sim)
