# native.cmake: the LLVM lowering against the reference interpreter (test_native.c), and `shardc run`
# end to end: sharded equals one device on small inline meshes, and a perturbed device must FAIL.
add_executable(test_native ${CMAKE_CURRENT_LIST_DIR}/test_native.c)
target_link_libraries(test_native PRIVATE shardc_core)
set_target_properties(test_native PROPERTIES ENABLE_EXPORTS ON)
target_compile_definitions(test_native PRIVATE
  NATIVE_TEST_DIR="${CMAKE_CURRENT_LIST_DIR}/native"
  INTERP_TEST_DIR="${CMAKE_CURRENT_LIST_DIR}/interp"
  SHARDC_SAMPLES="${CMAKE_SOURCE_DIR}/samples")
add_test(NAME unit.native COMMAND test_native)

set(MLP_SMALL -D batch=8 -D seq=16 -D embed=64 -D hidden=128)
foreach(layout fsdp_tp dp fsdp tp)
  add_test(NAME run.mlp.forward.${layout}
           COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --entry mlp.forward
                   --layout ${layout} --mesh "h100[data: 2, model: 2]")
  add_test(NAME run.mlp.train.${layout}
           COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --steps 3
                   --layout ${layout} --mesh "h100[data: 2, model: 2]")
endforeach()
add_test(NAME run.mlp_sgd_mb.train
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_CURRENT_LIST_DIR}/interp/mlp_sgd_mb.shard --steps 3)
# The mutation check: one device's result perturbed, run must FAIL (exit 1).
add_test(NAME run.mlp.mutation
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --entry mlp.forward
                 --mesh "h100[data: 2, model: 2]")
# (the report must say FAIL with its figures: a crash does not count as catching the perturbation)
set_tests_properties(run.mlp.mutation PROPERTIES ENVIRONMENT "SHARDC_RUN_PERTURB=1"
                     PASS_REGULAR_EXPRESSION "FAIL: [^\n]*\n  worst error")
