# posted.cmake: bench_posted, a collective-matmul-shaped ring of posted permutes overlapped with
# GEMMs, blocking vs posted vs a progress-thread emulation (bench/bench_posted.c).
add_executable(bench_posted ${CMAKE_CURRENT_LIST_DIR}/bench_posted.c)
target_include_directories(bench_posted PRIVATE ${OPENBLAS_INCLUDE_DIR})
target_link_libraries(bench_posted PRIVATE shardrt)
set_target_properties(bench_posted PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
# A smoke run only (no timed tests: docs/benchmarks.md reports the numbers).
add_test(NAME bench.posted COMMAND bench_posted --smoke)
