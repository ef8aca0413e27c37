# verdict.cmake: `shardc run`'s verdict end to end (docs/run.md, "How run decides PASS"); its rules
# on hand-made tensors are unit.runtime.verdict. A FAIL must be a wrong answer and a PASS a right
# one: each mutation below must FAIL, naming its tensor, and each program below must PASS.
set(VERDICT_DIR ${CMAKE_CURRENT_LIST_DIR}/native/verdict)
set(VMLP -D batch=8 -D seq=16 -D embed=64 -D hidden=128 --mesh "h100[data: 2, model: 2]")
set(VMLP_TEXT "-D batch=8 -D seq=16 -D embed=64 -D hidden=128 --mesh 'h100[data: 2, model: 2]'") # for sh -c

# A NaN in one device's result (SHARDC_RUN_PERTURB=nan adds NaN to its first element).
add_test(NAME run.verdict.nan COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${VMLP} --entry mlp.forward)
set_tests_properties(run.verdict.nan PROPERTIES ENVIRONMENT "SHARDC_RUN_PERTURB=nan" PASS_REGULAR_EXPRESSION
  "FAIL: .*failure        result: non-finite values \\(1 in the sharded run, 0 in the one-device run; element 0: nan sharded")
# The same in a built executable (the verdict is runtime/verdict.c in both).
add_test(NAME build.verdict.nan
         COMMAND sh -c "$<TARGET_FILE:shardc> build ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${VMLP_TEXT} --entry mlp.forward -o verdict_built && SHARDC_RUN_PERTURB=nan ./verdict_built")
set_tests_properties(build.verdict.nan PROPERTIES PASS_REGULAR_EXPRESSION
  "FAIL: .*failure        result: non-finite values \\(1 in the sharded run, 0 in the one-device run")

# A wrong gradient exposed by sgd at lr 10: one element of w_in's update off by 0.003 (three bf16
# units in the last place; the gradient off by 3e-4, a third of the largest) must FAIL; the same
# program unperturbed PASSes (run.verdict.sgd_lr10).
add_test(NAME run.verdict.wrong_gradient
         COMMAND $<TARGET_FILE:shardc> run ${VERDICT_DIR}/mlp_sgd10.shard ${VMLP} --steps 2)
set_tests_properties(run.verdict.wrong_gradient PROPERTIES ENVIRONMENT "SHARDC_RUN_PERTURB=0.003@w_in"
  PASS_REGULAR_EXPRESSION "FAIL: .*failure        w_in: element 0: ")
add_test(NAME run.verdict.sgd_lr10 COMMAND $<TARGET_FILE:shardc> run ${VERDICT_DIR}/mlp_sgd10.shard ${VMLP} --steps 2)
# A gradient off in adam's first moment (0.001 on m's first element: the gradient 0.01 off).
add_test(NAME run.verdict.wrong_moment COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${VMLP} --steps 2)
set_tests_properties(run.verdict.wrong_moment PROPERTIES ENVIRONMENT "SHARDC_RUN_PERTURB=0.001@adam.m.w_out"
  PASS_REGULAR_EXPRESSION "FAIL: .*failure        [a-z.]*w_out: element 0: ")

# Routing: under tensor and sequence parallelism Mixtral-tiny's bf16 gate partial sums flip a few
# near-tied choices at seed 1 (docs/run.md): the sharded run follows the one-device run's there
# and says so, and PASSes; routing by its own logits (SHARDC_ROUTE_OWN=1) it FAILs.
add_test(NAME run.verdict.routing
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_CURRENT_LIST_DIR}/moe/mixtral_tiny.shard --layout tp_sp --seed 1 --steps 2)
set_tests_properties(run.verdict.routing PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION
  "PASS: .*routing        [1-9][0-9]* of [0-9]+ top-k decisions")
add_test(NAME run.verdict.routing.own
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_CURRENT_LIST_DIR}/moe/mixtral_tiny.shard --layout tp_sp --seed 1 --steps 2)
set_tests_properties(run.verdict.routing.own PROPERTIES TIMEOUT 300 ENVIRONMENT "SHARDC_ROUTE_OWN=1"
  PASS_REGULAR_EXPRESSION "FAIL: .*failure        ")

# Routing under a causal ring (the differential tester's 7-10, issue 18): the sequence is stored in
# zigzag order and the routing log is kept in the tokens' logical order, so the sharded run follows
# the one-device run's near-tied decisions and PASSes; routing by its own logits it FAILs (before
# the fix no recorded group matched and it failed so); the router's gradient made wrong (adam's
# first moment of the gate, 0.004 on element 0) FAILs with the decisions followed.
set(VZIGZAG ${VERDICT_DIR}/mixtral_zigzag.shard --layout zigzag --steps 2 --seed 219268014)
add_test(NAME run.verdict.routing.zigzag COMMAND $<TARGET_FILE:shardc> run ${VZIGZAG})
set_tests_properties(run.verdict.routing.zigzag PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION
  "PASS: .*routing        [1-9][0-9]* of [0-9]+ top-k decisions")
add_test(NAME run.verdict.routing.zigzag.own COMMAND $<TARGET_FILE:shardc> run ${VZIGZAG})
set_tests_properties(run.verdict.routing.zigzag.own PROPERTIES TIMEOUT 300 ENVIRONMENT "SHARDC_ROUTE_OWN=1"
  PASS_REGULAR_EXPRESSION "FAIL: .*failure        ")
add_test(NAME run.verdict.routing.zigzag.wrong_gradient COMMAND $<TARGET_FILE:shardc> run ${VZIGZAG})
set_tests_properties(run.verdict.routing.zigzag.wrong_gradient PROPERTIES TIMEOUT 300
  ENVIRONMENT "SHARDC_RUN_PERTURB=0.004@adam.m.blocks.moe.gate"
  PASS_REGULAR_EXPRESSION "FAIL: .*failure        [a-z.]*blocks.moe.gate: element 0: .*routing        [1-9][0-9]* of")

# Weights loaded as NaN, or as +-3.4e38 (which overflow): every output non-finite in both runs used
# to read "PASS, worst error 0". Each is a FAIL naming the tensor; with --allow-nonfinite the
# all-NaN forward (the same NaNs at the same places) PASSes and says what it left out.
find_program(VERDICT_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(VERDICT_PYTHON3)
  set(WRITE_NPY ${VERDICT_PYTHON3} ${VERDICT_DIR}/write_npy.py)
  string(REPLACE ";" " " WRITE_NPY_TEXT "${WRITE_NPY}")
  add_test(NAME run.verdict.all_nan
           COMMAND sh -c "${WRITE_NPY_TEXT} verdict_nan w_in=64x128:nan w_out=128x64:nan && $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${VMLP_TEXT} --entry mlp.forward --load verdict_nan")
  set_tests_properties(run.verdict.all_nan PROPERTIES PASS_REGULAR_EXPRESSION
    "FAIL: .*failure        result: non-finite values \\(8192 in the sharded run, 8192 in the one-device run")
  add_test(NAME run.verdict.all_nan.allowed
           COMMAND sh -c "${WRITE_NPY_TEXT} verdict_nan2 w_in=64x128:nan w_out=128x64:nan && $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${VMLP_TEXT} --entry mlp.forward --load verdict_nan2 --allow-nonfinite")
  set_tests_properties(run.verdict.all_nan.allowed PROPERTIES PASS_REGULAR_EXPRESSION
    "PASS: .*non-finite     8192 elements NaN or infinite in both runs at the same places")
  add_test(NAME run.verdict.huge
           COMMAND sh -c "${WRITE_NPY_TEXT} verdict_huge w_in=64x128:huge w_out=128x64:huge && $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${VMLP_TEXT} --steps 2 --load verdict_huge")
  set_tests_properties(run.verdict.huge PROPERTIES PASS_REGULAR_EXPRESSION
    "FAIL: .*failure        loss: non-finite values \\(1 in the sharded run, 1 in the one-device run")
endif()
