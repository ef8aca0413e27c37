# editors.cmake: the syntax highlighting of editors/ (a TextMate grammar for VS Code and most
# editors, a Vim syntax file) against the compiler. Included by tests/CMakeLists.txt.
#   editors.grammars           the word lists equal the lexer's keywords, the builtin functions,
#                              the dtypes and the train step's keys (tests/editors/check_grammars.cmake)
#   editors.grammars.mutation  ... and that check fails on a grammar missing a keyword or adding a
#                              builtin the compiler does not have
#   editors.vim                a real Vim (where installed) loads the syntax file through ftdetect
#                              and gives each word of tests/editors/sample.shard its group
#   editors.textmate           the TextMate grammar's regexes compile and scope sample.shard's words
#                              (Node.js, where installed: tests/editors/textmate_check.js)
set(EDITORS_TESTS ${CMAKE_SOURCE_DIR}/tests/editors)
add_test(NAME editors.grammars COMMAND ${CMAKE_COMMAND} -DSRC=${CMAKE_SOURCE_DIR} -P ${EDITORS_TESTS}/check_grammars.cmake)
set(MUTATED ${CMAKE_CURRENT_BINARY_DIR}/editors_mutated)
add_test(NAME editors.grammars.mutation
         COMMAND sh -c "mkdir -p ${MUTATED} && sed 's/ serve$//' ${CMAKE_SOURCE_DIR}/editors/vim/syntax/shard.vim > ${MUTATED}/shard.vim && sed 's/|dropout)/|dropout|frobnicate)/' ${CMAKE_SOURCE_DIR}/editors/vscode/syntaxes/shard.tmLanguage.json > ${MUTATED}/shard.tmLanguage.json && ${CMAKE_COMMAND} -DSRC=${CMAKE_SOURCE_DIR} -DVIM=${MUTATED}/shard.vim -DTEXTMATE=${MUTATED}/shard.tmLanguage.json -P ${EDITORS_TESTS}/check_grammars.cmake")
set_tests_properties(editors.grammars.mutation PROPERTIES PASS_REGULAR_EXPRESSION
  "have:[ \n]+frobnicate.*shard.vim:[ \n]+keywords[ \n]+missing:[ \n]+serve")
# (CMake wraps the message at its own width, between any two words: the pattern allows it)

find_program(VIM_PROGRAM vim)
if(VIM_PROGRAM)
  add_test(NAME editors.vim
           COMMAND sh -c "OUT=${CMAKE_CURRENT_BINARY_DIR}/vim_check.out && export OUT && rm -f $OUT && ${VIM_PROGRAM} -Nu NONE -i NONE -es --cmd 'set rtp^=${CMAKE_SOURCE_DIR}/editors/vim' -S ${EDITORS_TESTS}/vim_check.vim ${EDITORS_TESTS}/sample.shard; cat $OUT && grep -q '^filetype shard$' $OUT && grep -q '^done$' $OUT && ! grep -q ' want ' $OUT")
endif()
find_program(NODE_PROGRAM NAMES node nodejs)
if(NODE_PROGRAM)
  add_test(NAME editors.textmate
           COMMAND ${NODE_PROGRAM} ${EDITORS_TESTS}/textmate_check.js ${CMAKE_SOURCE_DIR}/editors/vscode/syntaxes/shard.tmLanguage.json
                   ${EDITORS_TESTS}/sample.shard)
endif()
