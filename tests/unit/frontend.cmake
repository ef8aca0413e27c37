# frontend.cmake: the front end's unit test (lexer, parser and diagnostics on pathological inputs).
# Included by tests/CMakeLists.txt; paths are relative to this file.
add_executable(test_frontend ${CMAKE_CURRENT_LIST_DIR}/test_frontend.c)
target_link_libraries(test_frontend PRIVATE shardc_core)
add_test(NAME unit.frontend COMMAND test_frontend)
