# step_spmd.cmake: sharded training steps against unsharded ones (tests/unit/test_step_spmd.c): the
# mlp sample, the stacked MLP of tests/explain/step_mlp.shard and a tiny LLaMA (tests/unit/step_spmd/)
# under data parallelism, FSDP, tensor parallelism and their mixes, run device by device in the
# reference interpreter. Included by
# tests/CMakeLists.txt; paths are relative to this file.
add_executable(test_step_spmd ${CMAKE_CURRENT_LIST_DIR}/test_step_spmd.c)
target_link_libraries(test_step_spmd PRIVATE shardc_core)
target_compile_definitions(test_step_spmd PRIVATE
  STEP_SPMD_DIR="${CMAKE_CURRENT_LIST_DIR}/step_spmd"
  SHARDC_SAMPLES="${CMAKE_SOURCE_DIR}/samples"
  STEP_MLP="${CMAKE_SOURCE_DIR}/tests/explain/step_mlp.shard")
add_test(NAME unit.step_spmd COMMAND test_step_spmd)
