# ir.cmake: the IR builder's unit test (compiler/ir_build.c, ir_fuse.c, ir.c on small programs and
# the stdlib models). Included by tests/CMakeLists.txt; paths are relative to this file.
add_executable(test_ir ${CMAKE_CURRENT_LIST_DIR}/test_ir.c ${CMAKE_CURRENT_LIST_DIR}/unit_pipeline.c)
target_link_libraries(test_ir PRIVATE shardc_core)
add_test(NAME unit.ir COMMAND test_ir)
