# runtime.cmake: bench_runtime, the runtime's GEMM, AllReduce and barriers against cblas_sgemm,
# memcpy and pthread barriers (bench/bench_runtime.c). Included by bench/CMakeLists.txt.
add_executable(bench_runtime ${CMAKE_CURRENT_LIST_DIR}/bench_runtime.c)
target_include_directories(bench_runtime PRIVATE ${OPENBLAS_INCLUDE_DIR})
target_link_libraries(bench_runtime PRIVATE shardrt)
set_target_properties(bench_runtime PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
# A smoke run only, with tiny sizes (no timed tests: bench/run.sh reports the numbers).
add_test(NAME bench.runtime COMMAND bench_runtime --smoke)
