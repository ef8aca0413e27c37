# check.cmake: the memory model's unit test against the book's figures (tests/unit/test_check.c).
add_executable(test_check ${CMAKE_CURRENT_LIST_DIR}/test_check.c)
target_link_libraries(test_check PRIVATE shardc_core)
target_compile_definitions(test_check PRIVATE SHARDC_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
add_test(NAME unit.check COMMAND test_check)

# check's advice lists no change that saves nothing (issue 22): LLaMA 3 70B under pure FSDP on 64
# H100s once suggested `seq: (data, model)` (170.72 GB -> 170.72 GB) before `microbatches = 4`;
# the plan without it, checked, fits as well, so the advice is `microbatches = 4` alone. Fails on
# any "X -> X per device" line of the first plan (the same figure before and after a change that
# is not marked as needed by the rest), and unless the plan is the one change.
add_test(NAME check.advice.saves_nothing
         COMMAND sh -c "$<TARGET_FILE:shardc> check ${CMAKE_SOURCE_DIR}/samples/llama3_70b.shard --layout fsdp --mesh 'h100[data: 8, model: 8]' > advice_saves_nothing.out; cat advice_saves_nothing.out; awk '/ -> .* per device/ && $1 == $4 && $2 == $5 { bad = 1 } END { exit bad }' advice_saves_nothing.out || echo 'A CHANGE THAT SAVES NOTHING IS LISTED'")
set_tests_properties(check.advice.saves_nothing PROPERTIES
  FAIL_REGULAR_EXPRESSION "A CHANGE THAT SAVES NOTHING IS LISTED"
  PASS_REGULAR_EXPRESSION "what would fit [^\n]*\n  1\\. set `microbatches = 4` in the train step\n[^\n]*\n +[0-9.]+ GB -> [0-9.]+ GB per device[^\n]*\n  fits: ")
