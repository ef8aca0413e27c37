# bounds.cmake: issue 17's reproducers of unbounded time and memory (tests/unit/bounds/), run through
# the shardc binary under a memory cap (ulimit -v 2000000) and a 10 s limit per command, against
# figures from smaller runs (tests/unit/test_bounds.c). `test_bounds /work/main/build/shardc` runs
# them against another build.
add_executable(test_bounds ${CMAKE_CURRENT_LIST_DIR}/test_bounds.c)
target_include_directories(test_bounds PRIVATE ${CJSON_INCLUDE_DIR})
target_link_libraries(test_bounds PRIVATE ${CJSON_LIBRARY} m)
target_compile_definitions(test_bounds PRIVATE SHARDC_BIN="$<TARGET_FILE:shardc>"
                           BOUNDS_DIR="${CMAKE_CURRENT_LIST_DIR}/bounds" SAMPLES_DIR="${CMAKE_SOURCE_DIR}/samples")
add_dependencies(test_bounds shardc)
add_test(NAME unit.bounds COMMAND test_bounds)
