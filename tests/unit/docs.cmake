# docs.cmake: the commands shown in README.md and docs/*.md against the binary (issue 22).
# Included by tests/CMakeLists.txt.
#   docs.commands           every shardc command in a fenced block of README.md and docs/*.md runs
#                           as shown: its output equals the doc's (durations aside), or, without
#                           shown output, it exits 0 (1 for "does not fit"); the others are marked
#                           in the doc (tests/docs/doc_commands.py says how)
#   docs.commands.mutation  ... and the check fails on tests/docs/wrong.md: a wrong figure and an
#                           unknown option, each named by its line; the marked block is not run
find_program(DOCS_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(DOCS_PYTHON3)
  set(DOC_COMMANDS ${DOCS_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/docs/doc_commands.py --shardc $<TARGET_FILE:shardc>
      --root ${CMAKE_SOURCE_DIR})
  add_test(NAME docs.commands COMMAND ${DOC_COMMANDS})
  set_tests_properties(docs.commands PROPERTIES TIMEOUT 900)
  add_test(NAME docs.commands.mutation COMMAND ${DOC_COMMANDS} ${CMAKE_SOURCE_DIR}/tests/docs/wrong.md)
  set_tests_properties(docs.commands.mutation PROPERTIES PASS_REGULAR_EXPRESSION
    "FAIL tests/docs/wrong.md:5: .*params: 8388609.*FAIL tests/docs/wrong.md:8: .*exit 2.*2 commands run, 1 not run.*, 2 failed")
endif()
#   docs.options            every option of `shardc --help` has a row in docs/language.md's option
#                           table and the table lists none that --help lacks
#   docs.options.mutation   ... and the check fails on the table without its `--hostfile` row
if(DOCS_PYTHON3)
  add_test(NAME docs.options COMMAND ${DOCS_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/docs/options_documented.py
           $<TARGET_FILE:shardc> ${CMAKE_SOURCE_DIR}/docs/language.md)
  set(DOCS_MUTATED ${CMAKE_CURRENT_BINARY_DIR}/docs_mutated_language.md)
  add_test(NAME docs.options.mutation
           COMMAND sh -c "grep -v '^| `--hostfile' ${CMAKE_SOURCE_DIR}/docs/language.md > ${DOCS_MUTATED} && ${DOCS_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/docs/options_documented.py $<TARGET_FILE:shardc> ${DOCS_MUTATED}")
  set_tests_properties(docs.options.mutation PROPERTIES PASS_REGULAR_EXPRESSION "`--hostfile` is in `shardc --help` but not in the option table")
endif()
