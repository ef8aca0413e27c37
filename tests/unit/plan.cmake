# plan.cmake: `shardc plan` (compiler/driver/plan_search.c, cmd_plan.c), by tests/plan/plan_test.py on
# the programs in tests/plan/ and the samples: the book's decision tree, pasted texts reproducing the
# figures, never slower than the samples' layouts, a brute force over a small space, determinism.
# Included by tests/CMakeLists.txt.
find_program(PLAN_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(PLAN_PYTHON3)
  foreach(case tree paste samples brute estimate determinism errors)
    add_test(NAME plan.${case} COMMAND ${PLAN_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/plan/plan_test.py
             $<TARGET_FILE:shardc> ${CMAKE_SOURCE_DIR} ${case})
    set_tests_properties(plan.${case} PROPERTIES TIMEOUT 900 FAIL_REGULAR_EXPRESSION "FAIL ")
  endforeach()
endif()
