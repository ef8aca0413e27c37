# fp8.cmake: the FP8 dtypes (f8e4m3, f8e5m2) end to end. `run` of a two-layer MLP whose
# contractions take f8e4m3 operands (Transformer Engine's recipe: bf16 master weights, bf16
# results, e5m2 gradients in the backward), sharded equals one device, forward and 3 train steps;
# a perturbed device must FAIL (the tolerance f8 brings is not so loose that anything passes).
# The conversions themselves: unit.runtime.f8 (runtime/tests/test_f8.c); sim and memory against
# formulas: unit.fp8.sim (fp8_sim.py).
foreach(layout tp fsdp_tp)
  add_test(NAME run.fp8_mlp.train.${layout}
           COMMAND $<TARGET_FILE:shardc> run ${CMAKE_CURRENT_LIST_DIR}/fp8/fp8_mlp.shard --steps 3
                   --layout ${layout} --mesh "h100[data: 2, model: 2]")
  add_test(NAME run.fp8_mlp.forward.${layout}
           COMMAND $<TARGET_FILE:shardc> run ${CMAKE_CURRENT_LIST_DIR}/fp8/fp8_mlp.shard --entry mlp.forward
                   --layout ${layout} --mesh "h100[data: 2, model: 2]")
endforeach()
add_test(NAME run.fp8_mlp.mutation
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_CURRENT_LIST_DIR}/fp8/fp8_mlp.shard --steps 2
                 --layout tp --mesh "h100[data: 2, model: 2]")
set_tests_properties(run.fp8_mlp.mutation PROPERTIES ENVIRONMENT "SHARDC_RUN_PERTURB=1"
                     PASS_REGULAR_EXPRESSION "FAIL: [^\n]*\n  worst error")
# sim's FP8 rate (and the one-line warning on targets without FP8 units) and check's bytes, by formula
add_test(NAME unit.fp8.sim COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/fp8/fp8_sim.py $<TARGET_FILE:shardc>
                                   ${CMAKE_CURRENT_LIST_DIR}/fp8)
# the generated code's FP8 conversions (lower_f8.c), fused and through a stored buffer, element by
# element against the formats' definitions
add_test(NAME unit.fp8.cast COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/fp8/fp8_cast.py $<TARGET_FILE:shardc>
                                    ${CMAKE_CURRENT_LIST_DIR}/fp8)
