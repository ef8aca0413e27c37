# propagate.cmake: bench_propagate, check's pass pipeline on generated programs of N unrolled
# matmul layers, forward (125 to 1000) and a train step (125, 250) (bench/bench_propagate.c).
# Included by bench/CMakeLists.txt.
add_executable(bench_propagate ${CMAKE_CURRENT_LIST_DIR}/bench_propagate.c)
target_link_libraries(bench_propagate PRIVATE shardc_core)
set_target_properties(bench_propagate PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
# A smoke run only (10 layers, forward and train step): bench/run.sh reports the numbers.
add_test(NAME bench.propagate COMMAND bench_propagate --smoke)
