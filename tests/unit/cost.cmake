# cost.cmake: the cost model's unit test (compiler/cost.c against the book's worked examples).
# Included by tests/CMakeLists.txt; paths are relative to this file.
add_executable(test_cost ${CMAKE_CURRENT_LIST_DIR}/test_cost.c)
target_link_libraries(test_cost PRIVATE shardc_core)
add_test(NAME unit.cost COMMAND test_cost)
