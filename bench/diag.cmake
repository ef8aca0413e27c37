# diag.cmake: bench_diag, diagnostics timed at 1k, 10k and 100k (bench/bench_diag.c): the cost of 10x
# the diagnostics must stay near 10x. Included by bench/CMakeLists.txt.
add_executable(bench_diag ${CMAKE_CURRENT_LIST_DIR}/bench_diag.c)
target_link_libraries(bench_diag PRIVATE shardc_core)
set_target_properties(bench_diag PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
# A smoke run only (no timed tests: bench/run.sh reports the numbers).
add_test(NAME bench.diag COMMAND bench_diag --reps 1 --smoke)
