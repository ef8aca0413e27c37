# mpi.cmake: bench_mpi, the runtime's AllReduce and AllGather over MPI against Open MPI's own and the
# threads backend (bench/bench_mpi.c; run under mpirun -np 4, docs/benchmarks.md). Where CMake found
# MPI; ctest runs a smoke run only.
if(MPI_C_FOUND AND MPIRUN_EXECUTABLE)
  add_executable(bench_mpi ${CMAKE_CURRENT_LIST_DIR}/bench_mpi.c)
  target_link_libraries(bench_mpi PRIVATE shardrt_mpi shardrt MPI::MPI_C)
  set_target_properties(bench_mpi PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
  add_test(NAME bench.mpi COMMAND ${MPIRUN_EXECUTABLE} --allow-run-as-root --oversubscribe -np 2 $<TARGET_FILE:bench_mpi> --smoke)
  set_tests_properties(bench.mpi PROPERTIES TIMEOUT 120 PROCESSORS 2)
  if(SHARDC_SANITIZE) # as unit.runtime.mpi.* (runtime/tests/CMakeLists.txt)
    set_property(TEST bench.mpi APPEND PROPERTY ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:fast_unwind_on_malloc=0")
  endif()
endif()
