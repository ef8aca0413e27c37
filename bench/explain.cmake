# explain.cmake: bench_explain, the explain stages timed on LLaMA 3 405B over 16,384 devices
# (bench/bench_explain.c). To be included from bench/CMakeLists.txt: include(explain.cmake).
add_executable(bench_explain ${CMAKE_CURRENT_LIST_DIR}/bench_explain.c)
target_link_libraries(bench_explain PRIVATE shardc_core)
set_target_properties(bench_explain PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
# A smoke run only (no timed tests: bench/run.sh reports the numbers).
add_test(NAME bench.explain COMMAND bench_explain --reps 1)
