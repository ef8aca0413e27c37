# clock_check.cmake: `shardc run`'s simulated clock against `shardc sim`, as two commands.
#   cmake -DSHARDC=... -DARGS="file;-D;...;--mesh;..." -P clock_check.cmake
# The devices of a run add, for every op they execute, the time sim's model gives it; averaged over
# the devices, the compute and the collective seconds of one step must be what `shardc sim` reports
# for the same program, mesh and sizes (its compute_s and comm_s), to 1e-9 relative.
execute_process(COMMAND ${SHARDC} run ${ARGS} --format json OUTPUT_VARIABLE run_out RESULT_VARIABLE run_rc)
execute_process(COMMAND ${SHARDC} sim ${ARGS} --format json OUTPUT_VARIABLE sim_out RESULT_VARIABLE sim_rc)
if(NOT run_rc EQUAL 0 OR NOT sim_rc EQUAL 0)
  message(FATAL_ERROR "run exited ${run_rc}, sim ${sim_rc}:\n${run_out}\n${sim_out}")
endif()
foreach(key compute comm)
  string(JSON ran GET "${run_out}" simulated ${key}_s)
  string(JSON simulated GET "${sim_out}" ${key}_s)
  # |ran - simulated| <= 1e-9 simulated (awk: CMake has no floating-point arithmetic)
  execute_process(COMMAND awk "BEGIN { r = ${ran}; s = ${simulated}; d = r - s; if (d < 0) d = -d; exit !(s > 0 && d <= 1e-9 * s) }"
                  RESULT_VARIABLE bad)
  if(NOT bad EQUAL 0)
    message(FATAL_ERROR "${key}: the run's clock says ${ran} s, shardc sim ${simulated} s")
  endif()
  message(STATUS "${key}: run's clock ${ran} s, shardc sim ${simulated} s")
endforeach()
