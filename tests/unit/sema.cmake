# sema.cmake: the declaration checker's unit test (tests/unit/test_sema.c): did-you-mean, checked
# int64 arithmetic, the tensor size message, and the usage errors of -D, --mesh, --layout, --entry.
# Included by tests/CMakeLists.txt; paths are relative to this file.
add_executable(test_sema ${CMAKE_CURRENT_LIST_DIR}/test_sema.c)
target_link_libraries(test_sema PRIVATE shardc_core)
add_test(NAME unit.sema COMMAND test_sema)
