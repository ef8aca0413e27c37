# schedule.cmake: the pipeline schedules' bounded form (compiler/shard/schedule.c) against the
# schedules written out in full by a reference generator, and the in-flight peak and the counts
# read off the form against the same walk over the full lists (tests/unit/test_schedule.c).
add_executable(test_schedule ${CMAKE_CURRENT_LIST_DIR}/test_schedule.c)
target_link_libraries(test_schedule PRIVATE shardc_core)
add_test(NAME unit.schedule COMMAND test_schedule)
