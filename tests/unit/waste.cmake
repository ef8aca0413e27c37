# waste.cmake: issue 22's warnings about setups that waste the machine (a mesh axis that shards no
# compute, tensor parallelism across nodes), their figures and their checked fixes
# (tests/unit/test_waste.c). Included by tests/CMakeLists.txt.
add_executable(test_waste ${CMAKE_CURRENT_LIST_DIR}/test_waste.c)
target_link_libraries(test_waste PRIVATE shardc_core)
target_compile_definitions(test_waste PRIVATE SHARDC_BIN="$<TARGET_FILE:shardc>")
add_dependencies(test_waste shardc)
add_test(NAME unit.waste COMMAND test_waste)
