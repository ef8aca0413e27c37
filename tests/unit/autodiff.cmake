# autodiff.cmake: training-step compilation's unit test (compiler/step.c, autodiff.c): structure of
# the step IR on small programs and every sample, FLOPs per remat policy, and finite-difference
# checks of every op's gradient through the interpreter. Included by tests/CMakeLists.txt.
add_executable(test_autodiff ${CMAKE_CURRENT_LIST_DIR}/test_autodiff.c ${CMAKE_CURRENT_LIST_DIR}/unit_pipeline.c)
target_link_libraries(test_autodiff PRIVATE shardc_core)
add_test(NAME unit.autodiff COMMAND test_autodiff)
