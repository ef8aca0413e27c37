# bind.cmake: a layout binds every value (tests/unit/test_bind.c): after propagation, every value
# without a written type, in every sample, explain test program and step test program under each
# of their meshes and layouts, holds each dim a layout rule maps (after the skips) as the rule maps
# it. Included by tests/CMakeLists.txt.
add_executable(test_bind ${CMAKE_CURRENT_LIST_DIR}/test_bind.c ${CMAKE_CURRENT_LIST_DIR}/unit_pipeline.c)
target_link_libraries(test_bind PRIVATE shardc_core)
add_test(NAME unit.bind
         COMMAND test_bind ${CMAKE_SOURCE_DIR}/samples ${CMAKE_SOURCE_DIR}/tests/explain
                 ${CMAKE_CURRENT_LIST_DIR}/step_spmd ${CMAKE_CURRENT_LIST_DIR}/moe)
