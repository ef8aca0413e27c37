# objcache.cmake: SHA-256 and the on-disk cache of compiled objects (test_objcache.c), and `shardc
# run` through it: a second run of the same program takes the object from the cache and still
# passes; --no-cache writes nothing. Included by tests/CMakeLists.txt.
add_executable(test_objcache ${CMAKE_CURRENT_LIST_DIR}/test_objcache.c)
target_link_libraries(test_objcache PRIVATE shardc_core)
add_test(NAME unit.objcache COMMAND test_objcache)
set_tests_properties(unit.objcache PROPERTIES TIMEOUT 60)
add_test(NAME run.cache COMMAND ${CMAKE_COMMAND} -DSHARDC=$<TARGET_FILE:shardc> -DSRC=${CMAKE_SOURCE_DIR}
         -DDIR=${CMAKE_CURRENT_BINARY_DIR}/run_cache -P ${CMAKE_CURRENT_LIST_DIR}/cache/run_cache.cmake)
set_tests_properties(run.cache PROPERTIES TIMEOUT 300)
add_test(NAME run.tier COMMAND ${CMAKE_COMMAND} -DSHARDC=$<TARGET_FILE:shardc> -DSRC=${CMAKE_SOURCE_DIR}
         -DDIR=${CMAKE_CURRENT_BINARY_DIR}/run_tier -P ${CMAKE_CURRENT_LIST_DIR}/cache/run_tier.cmake)
set_tests_properties(run.tier PROPERTIES TIMEOUT 600 PROCESSORS 2)
