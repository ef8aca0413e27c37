# diff.cmake: the differential tester (tests/diff/README.md) in ctest.
#   diff.regress   every case of tests/diff/regress/ (the reproducers of what the tester found and
#                  the verdict's former false alarms): each must PASS or be refused as it says
#   diff.fixed     300 random cases of the fixed seed `ci`, then the regression list (the open
#                  findings of known.txt must recur as listed, and nothing else may fail): only in the
#                  ASan+UBSan build (-DSHARDC_SANITIZE=ON), which .ci/run's asan phase tests; the
#                  JIT'd code is not instrumented there (LLVM makes it at run time), the compiler,
#                  the host side of run and the runtime's kernels are
#   diff.mpi       24 random cases of the fixed seed `mpi` over the runtime's MPI backend (run
#                  --backend mpi: one rank per device, the hybrid of 2 device threads per rank past
#                  4 ranks), where CMake found MPI; open findings in known-mpi.txt as known.txt's.
#                  About 100 s on 2 idle cores (each rank compiles the program)
find_program(DIFF_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(DIFF_PYTHON3)
  set(DIFF_PY ${DIFF_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/diff.py --shardc $<TARGET_FILE:shardc> --jobs 2 --shrink 0)
  add_test(NAME diff.regress COMMAND ${DIFF_PY} --regress-only --findings diff-regress-findings)
  set_tests_properties(diff.regress PROPERTIES TIMEOUT 1800 LABELS diff)
  if(SHARDC_SANITIZE)
    add_test(NAME diff.fixed COMMAND ${DIFF_PY} --cases 300 --seed ci --regress --findings diff-fixed-findings
                                     --known ${CMAKE_CURRENT_LIST_DIR}/known.txt
                                     --timeout 60 --wall 900)
    set_tests_properties(diff.fixed PROPERTIES TIMEOUT 3600 LABELS diff)
  endif()
  if(MPI_C_FOUND AND MPIRUN_EXECUTABLE)
    add_test(NAME diff.mpi COMMAND ${DIFF_PY} --backend mpi --max-ranks 4 --cases 24 --seed mpi
                                   --findings diff-mpi-findings --known ${CMAKE_CURRENT_LIST_DIR}/known-mpi.txt
                                   --timeout 60 --wall 600)
    set_tests_properties(diff.mpi PROPERTIES TIMEOUT 1800 LABELS diff PROCESSORS 2)
    if(SHARDC_SANITIZE OR SHARDC_FUZZ) # as native_mpi.cmake's: Open MPI's state at exit is not a leak of ours
      set_tests_properties(diff.mpi PROPERTIES ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1")
    endif()
  endif()
endif()
