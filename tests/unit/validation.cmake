# validation.cmake: the validation data's unit test (tests/unit/test_validation.c): the book's worked
# cases on the stdlib targets, bench/validation/published.json's arithmetic, and every
# bench/validation program through `shardc check` with its FLOP count against the published formula.
# Included by tests/CMakeLists.txt; paths are relative to this file.
add_executable(test_validation ${CMAKE_CURRENT_LIST_DIR}/test_validation.c)
target_link_libraries(test_validation PRIVATE shardc_core)
target_compile_definitions(test_validation PRIVATE SHARDC_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
                                                   SHARDC_BIN="$<TARGET_FILE:shardc>")
add_dependencies(test_validation shardc)
add_test(NAME unit.validation COMMAND test_validation)
