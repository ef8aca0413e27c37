# fitsearch.cmake: check's suggestions, each re-checked as the program its words describe
# (tests/unit/test_fitsearch.c).
add_executable(test_fitsearch ${CMAKE_CURRENT_LIST_DIR}/test_fitsearch.c)
target_link_libraries(test_fitsearch PRIVATE shardc_core)
target_compile_definitions(test_fitsearch PRIVATE SHARDC_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
add_test(NAME unit.fitsearch COMMAND test_fitsearch)
