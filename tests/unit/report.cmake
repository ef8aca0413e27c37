# report.cmake: `shardc report FILE -o PAGE` (issue 22). Included by tests/CMakeLists.txt.
#   report.mlp, report.pipeline   the page's data block equals check's and sim's --format json
#                                 objects, every drawn figure (phase rows, memory bars per device and
#                                 per stage, resident bars per stage, collectives by kind and axes,
#                                 param grids) equals its
#                                 source, no external resource; rendered by headless chromium to a
#                                 PNG with no console error (tests/report/report_check.py)
#   report.no_browser             ... the same checks without a browser when chromium is missing
#                                 (never skipped silently: the browser tests then fail)
#   report.input_refused          -o equal to the input is refused (exit 1), the input untouched
#   report.needs_output           no -o is a usage error (exit 2)
find_program(REPORT_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
find_program(REPORT_CHROMIUM chromium)
if(REPORT_PYTHON3)
  set(REPORT_CHECK ${REPORT_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/report/report_check.py --shardc $<TARGET_FILE:shardc>)
  if(REPORT_CHROMIUM)
    set(REPORT_BROWSER --browser ${REPORT_CHROMIUM})
  else()
    set(REPORT_BROWSER --browser chromium-not-found)
  endif()
  add_test(NAME report.mlp COMMAND ${REPORT_CHECK} ${REPORT_BROWSER} --out ${CMAKE_CURRENT_BINARY_DIR}/report_mlp
           ${CMAKE_SOURCE_DIR}/samples/mlp.shard)
  add_test(NAME report.pipeline COMMAND ${REPORT_CHECK} ${REPORT_BROWSER} --out ${CMAKE_CURRENT_BINARY_DIR}/report_pp
           ${CMAKE_SOURCE_DIR}/samples/llama3_405b_pp.shard)
  set_tests_properties(report.mlp report.pipeline PROPERTIES TIMEOUT 300)
  add_test(NAME report.no_browser COMMAND ${REPORT_CHECK} --out ${CMAKE_CURRENT_BINARY_DIR}/report_nb
           ${CMAKE_SOURCE_DIR}/samples/llama3_8b.shard)
endif()
add_test(NAME report.input_refused
         COMMAND sh -c "cp ${CMAKE_SOURCE_DIR}/samples/mlp.shard in.shard && cp in.shard keep.shard && \
                        $<TARGET_FILE:shardc> report in.shard -o in.shard; rc=$?; \
                        test $rc = 1 && cmp in.shard keep.shard && echo refused-and-kept"
         WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(report.input_refused PROPERTIES PASS_REGULAR_EXPRESSION "is an input.*refused-and-kept")
add_test(NAME report.needs_output COMMAND $<TARGET_FILE:shardc> report ${CMAKE_SOURCE_DIR}/samples/mlp.shard)
set_tests_properties(report.needs_output PROPERTIES WILL_FAIL TRUE)
