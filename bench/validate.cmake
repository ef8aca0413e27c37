# validate.cmake: build/bench/validate, which runs `shardc sim` over bench/validation/ and rewrites
# docs/validation.md's tables (bench/validation/validate.c). Run it from the repository's root.
# ctest's unit.validation checks the same rows (tests/unit/test_validation.c); bench.validate checks
# that the doc is not stale.
add_executable(validate ${CMAKE_CURRENT_SOURCE_DIR}/validation/validate.c)
target_include_directories(validate PRIVATE ${CJSON_INCLUDE_DIR})
target_link_libraries(validate PRIVATE ${CJSON_LIBRARY} ${MATH_LIBRARY})
set_target_properties(validate PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
add_dependencies(validate shardc)
add_test(NAME bench.validate COMMAND validate --shardc $<TARGET_FILE:shardc> --check
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
