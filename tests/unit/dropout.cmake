# dropout.cmake: dropout(x, p) (ops.def's OP_DROPOUT, compiler/ir/dropout.h; docs/training.md,
# "Dropout"): the mask's statistics (test_dropout.c), the LLVM lowering against the interpreter
# (test_native's one-case form), and `shardc run`: each sharded train step equals the unsharded one,
# which holds only if every device draws the unsharded program's mask (its elements' global
# indices). The gradient's mask is test_autodiff's finite-difference cases.
add_executable(test_dropout ${CMAKE_CURRENT_LIST_DIR}/test_dropout.c)
target_link_libraries(test_dropout PRIVATE shardc_core)
add_test(NAME unit.dropout COMMAND test_dropout)

set(DROPOUT_MLP ${CMAKE_CURRENT_LIST_DIR}/dropout/mlp_dropout.shard)
foreach(layout fsdp_tp tp sp)
  add_test(NAME run.dropout.${layout}
           COMMAND $<TARGET_FILE:shardc> run ${DROPOUT_MLP} --layout ${layout} --mesh "h100[data: 2, model: 2]" --steps 2)
  set_tests_properties(run.dropout.${layout} PROPERTIES PASS_REGULAR_EXPRESSION "PASS: ")
  add_test(NAME native.dropout.${layout} COMMAND test_native ${DROPOUT_MLP} ${layout})
  add_test(NAME native.dropout.${layout}.forward COMMAND test_native ${DROPOUT_MLP} ${layout} mlp.forward)
endforeach()
