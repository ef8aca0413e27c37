# textbook.cmake: a layer's collectives on the samples against the literature's counts and bytes
# (tests/unit/test_textbook.c, compiler/analysis/textbook.c). Included by tests/CMakeLists.txt.
add_executable(test_textbook ${CMAKE_CURRENT_LIST_DIR}/test_textbook.c)
target_link_libraries(test_textbook PRIVATE shardc_core)
target_compile_definitions(test_textbook PRIVATE SHARDC_SAMPLES="${CMAKE_SOURCE_DIR}/samples")
add_test(NAME unit.textbook COMMAND test_textbook)
