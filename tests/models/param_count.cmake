# param_count.cmake: `shardc check FILE ARGS --format json` must count EXPECT params.
#
#   cmake -DSHARDC=... -DFILE=x.shard "-DEXPECT=formula" ["-DARGS=-D;embed=768;..."] -P param_count.cmake
#
# EXPECT is a math(EXPR) formula written from the stdlib model's parameter formula (its file's
# header) at the program's sizes, never the count shardc printed.
foreach(v SHARDC FILE EXPECT)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "param_count.cmake needs -D${v}=...")
  endif()
endforeach()
execute_process(COMMAND ${SHARDC} check ${FILE} ${ARGS} --format json RESULT_VARIABLE rc OUTPUT_VARIABLE json ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "shardc check ${FILE} ${ARGS}: exit ${rc}\n${json}${err}")
endif()
string(JSON count GET "${json}" params count)
math(EXPR expect "${EXPECT}")
if(NOT count STREQUAL expect)
  message(FATAL_ERROR "${FILE}: check counts ${count} params, the formula ${EXPECT} gives ${expect}")
endif()
message(STATUS "${FILE}: ${count} params, as the formula gives")
