# table.cmake: check, explain and sim over several --layout and --mesh (compiler/driver/table.c):
# each row equals the command run alone on its combination (tests/unit/test_table.c). Included by
# tests/CMakeLists.txt.
add_executable(test_table ${CMAKE_CURRENT_LIST_DIR}/test_table.c)
target_link_libraries(test_table PRIVATE shardc_core)
target_compile_definitions(test_table PRIVATE SHARDC_BIN="$<TARGET_FILE:shardc>" SHARDC_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
add_dependencies(test_table shardc)
add_test(NAME unit.table COMMAND test_table)
