# npy.cmake: the .npy reader on valid and malformed files written byte by byte (test_npy.c): what
# NumPy writes is read exactly, everything else refused with a clean message, never a crash, a
# hang or an allocation the header asks for. Included by tests/CMakeLists.txt.
add_executable(test_npy ${CMAKE_CURRENT_LIST_DIR}/test_npy.c)
target_link_libraries(test_npy PRIVATE shardc_core)
target_compile_definitions(test_npy PRIVATE NPY_SEEDS="${CMAKE_SOURCE_DIR}/tests/fuzz/npy")
add_test(NAME unit.npy COMMAND test_npy)
set_tests_properties(unit.npy PROPERTIES TIMEOUT 60)
