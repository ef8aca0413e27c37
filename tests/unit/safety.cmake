# safety.cmake: issue 17's reproducers, one ctest each (safety/safety.sh CASE runs shardc, or what it
# builds, as a user would, in its own scratch directory): .npy files and --load, no shell and no
# code injection in build, no output that destroys an input or leaves a half-written file (full
# disk, symlinks, signals, concurrent saves), and a built executable's arguments and allocations.
# Included by tests/CMakeLists.txt.
set(SAFETY_SH ${CMAKE_CURRENT_LIST_DIR}/safety/safety.sh)
foreach(case load_fifo load_unreadable load_bad_npy load_fortran load_int32_max
             build_no_shell build_quoted_path no_shell_in_source
             output_is_input save_into_load build_intermediates build_sigterm full_disk save_symlink save_lock
             exe_args exe_seed exe_host_alloc)
  add_test(NAME safety.${case} COMMAND sh ${SAFETY_SH} $<TARGET_FILE:shardc> ${CMAKE_SOURCE_DIR} ${case})
  set_tests_properties(safety.${case} PROPERTIES TIMEOUT 300)
endforeach()
