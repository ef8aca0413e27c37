# frontend.cmake: the front end's unit test (lexer, parser and diagnostics on pathological inputs).
# Included by tests/CMakeLists.txt; paths are relative to this file.
add_executable(test_frontend ${CMAKE_CURRENT_LIST_DIR}/test_frontend.c)
target_link_libraries(test_frontend PRIVATE shardc_core)
add_test(NAME unit.frontend COMMAND test_frontend)

# Reading input from the command line: a pipe is read to its end (`shardc check <(generate)`); a
# file over the input limit (lowered here with SHARDC_MAX_INPUT) and /dev/zero are refused with
# exit 1 and a message naming the limit, /dev/zero without reading more than the limit.
add_test(NAME cli.input_pipe
         COMMAND sh -c "cat \"$1\" | \"$0\" check /dev/stdin | grep -q '^train mlp.forward'"
                 $<TARGET_FILE:shardc> ${CMAKE_SOURCE_DIR}/samples/mlp.shard)
add_test(NAME cli.input_limit
         COMMAND sh -c "out=$(SHARDC_MAX_INPUT=100 \"$0\" check \"$1\" 2>&1); rc=$?; echo \"$out\";
                        [ $rc -eq 1 ] && echo \"$out\" | grep -q \"cannot read '.*mlp.shard': it is larger than 100 bytes\""
                 $<TARGET_FILE:shardc> ${CMAKE_SOURCE_DIR}/samples/mlp.shard)
add_test(NAME cli.input_dev_zero
         COMMAND sh -c "out=$(\"$0\" check /dev/zero 2>&1); rc=$?; echo \"$out\";
                        [ $rc -eq 1 ] && echo \"$out\" | grep -q 'larger than 64 MiB'"
                 $<TARGET_FILE:shardc>)
# An old-Mac file (lone CR line endings) starting with a comment is many lines, not one comment:
# the undefined name on its line 7 is reported there, exit 1.
add_test(NAME cli.cr_line_endings
         COMMAND sh -c "printf '# an old Mac file\\rimport \"targets\"\\rmesh pod = tpu_v5e[data: 2]\\rdim a = 8\\rmodel m {\\r  fn f(x: f32[a]) -> f32[a] {\\r    return y\\r  }\\r}\\r' > cr_only.shard;
                        out=$(\"$0\" check cr_only.shard 2>&1); rc=$?; echo \"$out\";
                        [ $rc -eq 1 ] && echo \"$out\" | grep -q 'cr_only.shard:7:12: error: undefined name y'"
                 $<TARGET_FILE:shardc>)
