# sim.cmake: bench_sim, `shardc sim` timed stage by stage on every sample and validation program
# (bench/bench_sim.c). Run it from the repository's root; bench/run.sh reports its numbers.
add_executable(bench_sim ${CMAKE_CURRENT_LIST_DIR}/bench_sim.c)
target_link_libraries(bench_sim PRIVATE shardc_core)
target_compile_definitions(bench_sim PRIVATE SHARDC_SOURCE_STDLIB="${CMAKE_SOURCE_DIR}/stdlib")
set_target_properties(bench_sim PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
# A smoke run only (no timed tests).
add_test(NAME bench.sim COMMAND bench_sim samples/llama3_405b.shard --reps 1 WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
