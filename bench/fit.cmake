# fit.cmake: bench_fit, check's search for what would fit on a generated program of N MLP blocks,
# against one check of it (bench/bench_fit.c). Included by bench/CMakeLists.txt.
add_executable(bench_fit ${CMAKE_CURRENT_LIST_DIR}/bench_fit.c)
target_link_libraries(bench_fit PRIVATE shardc_core)
set_target_properties(bench_fit PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
# A smoke run only (25 blocks; it must find a plan): bench/run.sh reports the numbers.
add_test(NAME bench.fit COMMAND bench_fit --smoke)
