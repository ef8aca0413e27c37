# memory.cmake: check's memory figures off the buffer plan against hand derivations
# (tests/unit/test_memory.c, programs in tests/unit/memory/).
add_executable(test_memory ${CMAKE_CURRENT_LIST_DIR}/test_memory.c)
target_link_libraries(test_memory PRIVATE shardc_core)
target_compile_definitions(test_memory PRIVATE MEMORY_TEST_DIR="${CMAKE_CURRENT_LIST_DIR}/memory")
add_test(NAME unit.memory COMMAND test_memory)
