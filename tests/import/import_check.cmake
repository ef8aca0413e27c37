# import_check.cmake: `shardc import` of one published config, then `shardc check` of what it wrote.
#
#   cmake -DSHARDC=... -DCONFIG=x.json -DOUT=x.shard -DPUBLISHED=N "-DDIFF=formula" -P import_check.cmake
#
# Fails unless: the import exits 0 with nothing on stderr (a fixture written from a model card holds
# only keys the import knows), the program's header states a parameter count, `shardc check
# --format json` of the program exits 0 with "fits": true, and its params.count equals both
# PUBLISHED + DIFF (DIFF: the documented difference between the stdlib model and the published
# count, a formula for math(EXPR); 0 when the model is the published one) and the header's count.
foreach(v SHARDC CONFIG OUT PUBLISHED)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "import_check.cmake needs -D${v}=...")
  endif()
endforeach()
if(NOT DEFINED DIFF)
  set(DIFF 0)
endif()

file(REMOVE ${OUT})
execute_process(COMMAND ${SHARDC} import ${CONFIG} -o ${OUT} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT err STREQUAL "")
  message(FATAL_ERROR "shardc import ${CONFIG} -o ${OUT}: exit ${rc}\n${out}${err}")
endif()
file(READ ${OUT} program)
if(NOT program MATCHES "# Parameters: ([0-9,]+), by the formula")
  message(FATAL_ERROR "${OUT}: no '# Parameters: N' line in the header")
endif()
string(REPLACE "," "" header_count "${CMAKE_MATCH_1}")

execute_process(COMMAND ${SHARDC} check ${OUT} --format json RESULT_VARIABLE rc OUTPUT_VARIABLE json ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "shardc check ${OUT}: exit ${rc}\n${json}${err}")
endif()
string(JSON count GET "${json}" params count)
string(JSON fits GET "${json}" memory fits)
math(EXPR expect "${PUBLISHED} + (${DIFF})")
if(NOT fits STREQUAL "ON" AND NOT fits STREQUAL "true")
  message(FATAL_ERROR "${OUT}: does not fit (memory.fits = ${fits})")
endif()
if(NOT count STREQUAL expect)
  math(EXPR off "${count} - ${expect}")
  message(FATAL_ERROR "${OUT}: check counts ${count} params; published ${PUBLISHED} + documented difference "
                      "(${DIFF}) = ${expect}; off by ${off}")
endif()
if(NOT header_count STREQUAL count)
  message(FATAL_ERROR "${OUT}: the header says ${header_count} params, check counts ${count}")
endif()
message(STATUS "${CONFIG}: ${count} params (published ${PUBLISHED}, difference ${DIFF}), fits")
