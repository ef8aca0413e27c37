# stepset.cmake: `--set key=value` (compiler/driver/stepset.c): a set key gives the figures the key
# written in the program gives, and its errors are located or usage errors (tests/unit/test_stepset.c).
# Included by tests/CMakeLists.txt.
add_executable(test_stepset ${CMAKE_CURRENT_LIST_DIR}/test_stepset.c)
target_link_libraries(test_stepset PRIVATE shardc_core)
target_compile_definitions(test_stepset PRIVATE SHARDC_BIN="$<TARGET_FILE:shardc>" SHARDC_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
add_dependencies(test_stepset shardc)
add_test(NAME unit.stepset COMMAND test_stepset)
