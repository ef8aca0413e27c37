# check.cmake: the memory model's unit test against the book's figures (tests/unit/test_check.c).
add_executable(test_check ${CMAKE_CURRENT_LIST_DIR}/test_check.c)
target_link_libraries(test_check PRIVATE shardc_core)
target_compile_definitions(test_check PRIVATE SHARDC_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
add_test(NAME unit.check COMMAND test_check)
