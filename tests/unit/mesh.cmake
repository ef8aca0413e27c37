# mesh.cmake: the unit test of mesh forming (compiler/mesh.c through sema_program: TPU torus
# placement, slices over DCN, GPU NVLink domains, unformable meshes).
# Included by tests/CMakeLists.txt; paths are relative to this file.
add_executable(test_mesh ${CMAKE_CURRENT_LIST_DIR}/test_mesh.c)
target_link_libraries(test_mesh PRIVATE shardc_core)
add_test(NAME unit.mesh COMMAND test_mesh)
