# sim_cli.cmake: `shardc sim` run as a user runs it: JSON keys and errors, a program that does not
# fit, the Chrome trace, --tokens, the line on a plan the layout forbids (tests/unit/test_sim_cli.c). Included by tests/CMakeLists.txt.
add_executable(test_sim_cli ${CMAKE_CURRENT_LIST_DIR}/test_sim_cli.c)
target_link_libraries(test_sim_cli PRIVATE shardc_core)
target_compile_definitions(test_sim_cli PRIVATE SHARDC_BIN="$<TARGET_FILE:shardc>"
                                                SHARDC_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
add_dependencies(test_sim_cli shardc)
add_test(NAME unit.sim_cli COMMAND test_sim_cli)
