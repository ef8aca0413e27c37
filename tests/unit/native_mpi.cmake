# native_mpi.cmake: `shardc run/build --backend mpi` end to end, where CMake found MPI (scripts/setup.sh
# installs Open MPI, so CI runs these). `run --backend mpi` starts mpirun itself (as root with
# --allow-run-as-root; --oversubscribe on this 2-core machine); each start costs about a second.
# The runtime's own MPI tests are runtime/tests (unit.runtime.mpi.*).
if(NOT (MPI_C_FOUND AND MPIRUN_EXECUTABLE))
  return()
endif()
set(MPIRUN_AS_ROOT ${MPIRUN_EXECUTABLE} --allow-run-as-root --oversubscribe)
set(SAME ${CMAKE_CURRENT_LIST_DIR}/mpi/same_as_threads.sh $<TARGET_FILE:shardc>)
# MLP_SMALL, MLP_SMALL_TEXT, LM_DIMS, LM_SMALL and shardc_clock_test: native.cmake's

# The same bits as the threads backend: --save's files compared byte for byte (same_as_threads.sh),
# forward and train steps, one rank per device (-np 4 and 8) and the hybrid (2 device threads per
# rank), and every kind of collective the samples lower: the MLP's AllGather/ReduceScatter/AllReduce,
# sequence parallelism, Mixtral's AllToAlls, a pipeline's sends and receives (GPT-3: Megatron's send
# split, the tied embedding's AllReduce between the first and last stage), ring attention's permutes
# (a causal ring of 4 in zigzag order, 8 devices). Each rank compiles the program (about 1.5 s for a
# LLaMA step on an idle core), so the larger ones run 2 device threads per rank.
function(shardc_mpi_same name)
  add_test(NAME run.mpi.same.${name} COMMAND ${SAME} ${name} ${ARGN})
  set_tests_properties(run.mpi.same.${name} PROPERTIES PASS_REGULAR_EXPRESSION "SAME: [0-9]+ files byte for byte"
                       TIMEOUT 300 PROCESSORS 2)
endfunction()
shardc_mpi_same(mlp_train_np4 ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --steps 3 --mesh "h100[data: 2, model: 2]"
                -- --backend mpi)
shardc_mpi_same(mlp_forward_np8 ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --entry mlp.forward --layout tp
                --mesh "h100[data: 4, model: 2]" -- --backend mpi)
shardc_mpi_same(mlp_train_hybrid ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --steps 2 --mesh "h100[data: 4, model: 2]"
                -- --backend mpi --threads-per-rank 2)
shardc_mpi_same(llama3_8b_sp ${CMAKE_SOURCE_DIR}/samples/llama3_8b.shard ${LM_SMALL} -D kv_heads=2 --layout fsdp_tp_sp
                --steps 2 --mesh "h100[data: 2, model: 2]" -- --backend mpi)
shardc_mpi_same(mixtral_ep ${CMAKE_SOURCE_DIR}/samples/mixtral_8x7b.shard ${LM_DIMS} -D batch=16 -D kv_heads=2 -D expert=4
                -D cap=4 --steps 2 --mesh "h100[data: 1, ep: 2, model: 2]" -- --backend mpi --threads-per-rank 2)
shardc_mpi_same(gpt3_pipeline_hybrid ${CMAKE_SOURCE_DIR}/samples/gpt3_175b.shard -D seq=8 -D embed=32 -D hidden=64 -D heads=4
                -D head=8 -D vocab=64 -D layers=4 -D batch=256 --steps 2 --mesh "h100[data: 1, stage: 2, model: 2]"
                -- --backend mpi --threads-per-rank 2)
shardc_mpi_same(ring_causal_np8 ${CMAKE_CURRENT_LIST_DIR}/step_spmd/ring_causal.shard --mesh ring4 --layout cp --steps 2
                -- --backend mpi)

# The report: rank 0 prints, with the backend and the ranks; the simulated clock, summed per device
# on its rank and gathered to rank 0, equals `shardc sim` as under threads.
add_test(NAME run.mpi.json
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --steps 2
                 --mesh "h100[data: 2, model: 2]" --backend mpi --format json)
set_tests_properties(run.mpi.json PROPERTIES TIMEOUT 120 PROCESSORS 2 PASS_REGULAR_EXPRESSION
  "\"devices\":\t4,\n\t\"steps\":\t2,\n\t\"pass\":\ttrue,.*\"backend\":\t\"mpi\",\n\t\"ranks\":\t4,\n\t\"threads_per_rank\":\t1")
shardc_clock_test(mpi_mlp ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --mesh "h100[data: 2, model: 2]" --backend mpi)
set_tests_properties(run.clock.mpi_mlp PROPERTIES TIMEOUT 120 PROCESSORS 2)
# The per-rank peak is check's per-device total, as under threads (each rank allocates its own
# devices' buffers only; MPI's staging buffers are the transport's, not a device's)
add_test(NAME peak.mlp.train.mpi COMMAND ${PEAK_CHECK} ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --steps 2
                                        --mesh "h100[data: 2, model: 2]" --backend mpi --threads-per-rank 2)
set_tests_properties(peak.mlp.train.mpi PROPERTIES TIMEOUT 120 PROCESSORS 2)
# --no-reference: the one-device program neither lowered nor run (programs too large for one host)
add_test(NAME run.mpi.no_reference
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --steps 2
                 --mesh "h100[data: 2, model: 2]" --backend mpi --threads-per-rank 2 --no-reference)
set_tests_properties(run.mpi.no_reference PROPERTIES TIMEOUT 120 PROCESSORS 2 PASS_REGULAR_EXPRESSION
  "RAN: .* on 4 devices in 2 MPI ranks \\(mesh cli\\); not compared \\(--no-reference\\)\n  loss step 1    0.346788\n")

# The verdict under MPI (docs/run.md, How run decides PASS): rank 0 runs the one-device program and
# compares; lockstep hands its state to every rank each step, and its routing decisions too. A
# wrong gradient (0.003 on one device's w_in, sgd at lr 10) must FAIL naming w_in, as under threads
# (run.verdict.wrong_gradient); Mixtral-tiny under tp_sp, whose bf16 gate partial sums flip near-tied
# top-k choices (run.verdict.routing), must PASS with the sharded run following rank 0's decisions
# on both ranks (rank 1's devices route with rank 0's log: a flip left there would FAIL).
add_test(NAME run.mpi.verdict.wrong_gradient
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_CURRENT_LIST_DIR}/native/verdict/mlp_sgd10.shard -D batch=8 -D seq=16
                 -D embed=64 -D hidden=128 --mesh "h100[data: 2, model: 2]" --steps 2 --backend mpi)
set_tests_properties(run.mpi.verdict.wrong_gradient PROPERTIES TIMEOUT 120 PROCESSORS 2 ENVIRONMENT "SHARDC_RUN_PERTURB=0.003@w_in"
  PASS_REGULAR_EXPRESSION "FAIL: .* on 4 devices in 4 MPI ranks .*failure        w_in: element 0: ")
add_test(NAME run.mpi.verdict.routing
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_CURRENT_LIST_DIR}/moe/mixtral_tiny.shard --layout tp_sp --seed 1 --steps 2
                 --backend mpi --threads-per-rank 2)
set_tests_properties(run.mpi.verdict.routing PROPERTIES TIMEOUT 300 PROCESSORS 2 PASS_REGULAR_EXPRESSION
  "PASS: .* on 4 devices in 2 MPI ranks .*routing        [1-9][0-9]* of [0-9]+ top-k decisions \\(tokens x routing calls\\) on rank 0's devices")

# shardc build --backend mpi: an executable for mpirun -np N (the losses of build.mlp: in lockstep step 3
# starts from the one-device run's state after step 2, so its loss is the one-device run's 0.340096 within
# rounding, 0.340094 as under threads; the sharded run's own drifted state gave 0.340093)
add_test(NAME build.mpi.mlp
         COMMAND sh -c "$<TARGET_FILE:shardc> build ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL_TEXT} --mesh 'h100[data: 2, model: 2]' --backend mpi -o mlp_mpi_built && ${MPIRUN_EXECUTABLE} --allow-run-as-root --oversubscribe -np 4 ./mlp_mpi_built --steps 3")
set_tests_properties(build.mpi.mlp PROPERTIES TIMEOUT 120 PROCESSORS 2 PASS_REGULAR_EXPRESSION
                     "PASS: .* on 4 devices in 4 MPI ranks .*loss step 1    0.346788 .*loss step 3    0.340094")

# Failures are errors, never hangs. A wrong -np is refused before any work (no lowering: the timing
# line SHARDC_RUN_TIMING prints after it never shows).
add_test(NAME run.mpi.error.np
         COMMAND ${MPIRUN_AS_ROOT} -np 3 $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL}
                 --mesh "h100[data: 2, model: 2]" --backend mpi)
set_tests_properties(run.mpi.error.np PROPERTIES TIMEOUT 120 PROCESSORS 2 ENVIRONMENT "SHARDC_RUN_TIMING=1"
  PASS_REGULAR_EXPRESSION "error: run: mesh 'cli' has 4 devices and the MPI backend runs 1 per rank \\(--threads-per-rank\\), so the job needs 4 ranks \\(mpirun -np 4\\)\; this one has 3"
  FAIL_REGULAR_EXPRESSION "run: passes and lowering")
add_test(NAME build.mpi.error.np
         COMMAND sh -c "$<TARGET_FILE:shardc> build ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL_TEXT} --mesh 'h100[data: 2, model: 2]' --backend mpi -o mlp_mpi_np && ${MPIRUN_EXECUTABLE} --allow-run-as-root --oversubscribe -np 2 ./mlp_mpi_np")
set_tests_properties(build.mpi.error.np PROPERTIES TIMEOUT 120 PROCESSORS 2 PASS_REGULAR_EXPRESSION
  "error: mesh \\[data: 2, model: 2\\] has 4 devices and the MPI backend runs 1 per rank, so the job needs 4 ranks \\(mpirun -np 4\\)\; this one has 2")
add_test(NAME run.mpi.error.threads_per_rank
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --mesh "h100[data: 2, model: 2]"
                 --backend mpi --threads-per-rank 3)
set_tests_properties(run.mpi.error.threads_per_rank PROPERTIES
  PASS_REGULAR_EXPRESSION "error: run: --threads-per-rank 3 does not divide the 4 devices of mesh 'cli'")
# no mpirun to start: named, with what to do
add_test(NAME run.mpi.error.no_mpirun
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --mesh "h100[data: 2, model: 2]"
                 --backend mpi)
set_tests_properties(run.mpi.error.no_mpirun PROPERTIES ENVIRONMENT "SHARDC_MPIRUN=/nonexistent/mpirun"
  PASS_REGULAR_EXPRESSION "shardc: run: --backend mpi starts its 4 ranks with mpirun, which is not executable at \\$SHARDC_MPIRUN: install Open MPI")
# a rank killed mid-step (SHARDC_MPI_KILL=D:N: device D's rank SIGKILLs itself at its N-th collective):
# the run ends at once with an error naming the rank, its device's coordinates and the collective
# it was in, with the op's line (from the status file the ranks keep). (A regex's semicolons are
# escaped: CMake would split the property there into several regexes, any of which passes.)
add_test(NAME run.mpi.error.killed
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --steps 2
                 --mesh "h100[data: 2, model: 2]" --backend mpi)
set_tests_properties(run.mpi.error.killed PROPERTIES TIMEOUT 60 PROCESSORS 2 ENVIRONMENT "SHARDC_MPI_KILL=2:3"
  PASS_REGULAR_EXPRESSION "shardc: run: rank 2 \\(pid [0-9]+\\) ended without finishing \\(killed, or it exited\\): device 2 \\[data=1, model=0\\] in (all_reduce|all_gather|reduce_scatter) over \\{(data|model)\\} at line [0-9]+ .*\; mpirun stopped the other ranks")
# a rank whose process exits mid-step (status 3, nothing printed): the same
add_test(NAME run.mpi.error.exited
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --steps 2
                 --mesh "h100[data: 2, model: 2]" --backend mpi)
set_tests_properties(run.mpi.error.exited PROPERTIES TIMEOUT 60 PROCESSORS 2 ENVIRONMENT "SHARDC_MPI_KILL=1:2:exit"
  PASS_REGULAR_EXPRESSION "shardc: run: rank 1 \\(pid [0-9]+\\) ended without finishing \\(killed, or it exited\\): device 1 \\[data=0, model=1\\] in [a-z_]+ over \\{(data|model)\\} at line [0-9]+")
# the hybrid: rank 1 (devices 2 and 3) killed while device 2 waits: both its devices named
add_test(NAME run.mpi.error.killed_hybrid
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --steps 2
                 --mesh "h100[data: 2, model: 2]" --backend mpi --threads-per-rank 2)
set_tests_properties(run.mpi.error.killed_hybrid PROPERTIES TIMEOUT 60 PROCESSORS 2 ENVIRONMENT "SHARDC_MPI_KILL=3:2"
  PASS_REGULAR_EXPRESSION "shardc: run: rank 1 \\(pid [0-9]+\\) ended without finishing \\(killed, or it exited\\): device 2 \\[data=1, model=0\\] [^\;]*\; device 3 \\[data=1, model=1\\] in [a-z_]+ over \\{(data|model)\\} at line [0-9]+")
# a device that stops taking part (SHARDC_RUN_STALL: device 0 sleeps, then returns without running):
# the others time out after --timeout, naming the device they wait for and what it did
add_test(NAME run.mpi.error.timeout
         COMMAND $<TARGET_FILE:shardc> run ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${MLP_SMALL} --entry mlp.forward
                 --mesh "h100[data: 2, model: 2]" --timeout 0.3 --backend mpi)
set_tests_properties(run.mpi.error.timeout PROPERTIES TIMEOUT 60 PROCESSORS 2 ENVIRONMENT "SHARDC_RUN_STALL=1"
  PASS_REGULAR_EXPRESSION "sharded program failed: device [0-9] \\[data=[01], model=[01]\\] on rank [0-9]: line [0-9]+: (all_gather|all_reduce) over \\((data|model)\\) timed out after 0.3 s waiting for device [0-9] \\[data=[01], model=[01]\\] on rank [0-9] \\(")

# Under ASan the ranks run with leak detection off: Open MPI keeps state until exit in components it
# has unloaded by then, which LeakSanitizer's fast unwinder cannot attribute (and the slow one makes a
# JIT compile take minutes). Memory errors still abort. The runtime's MPI code is leak-checked by
# unit.runtime.mpi.* (runtime/tests/CMakeLists.txt), with the slow unwinder.
if(SHARDC_SANITIZE OR SHARDC_FUZZ)
  get_property(shardc_mpi_tests DIRECTORY PROPERTY TESTS)
  list(FILTER shardc_mpi_tests INCLUDE REGEX "mpi")
  set_property(TEST ${shardc_mpi_tests} APPEND PROPERTY ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1")
endif()
# A collective matmul's ring under MPI, where a posted permute (MPI_Isend/Irecv) completes while the
# partial contractions run (native.cmake's CMM_CASE, forced).
add_test(NAME run.mpi.cmm COMMAND $<TARGET_FILE:shardc> run ${CMM_CASE} --steps 2 --backend mpi)
set_tests_properties(run.mpi.cmm PROPERTIES TIMEOUT 300 PROCESSORS 2 ENVIRONMENT "SHARDC_CMM=always"
                     PASS_REGULAR_EXPRESSION "^PASS: [^\n]* in 8 MPI ranks")
