# executed.cmake: what ran is what was explained (issue 18, item 5). For every sample and every layout
# it declares, at small sizes (docs/run.md), `shardc run --format json`'s "executed" (the collectives
# the runtime counted: device 0's, or under a pipeline the mean over one device of each stage)
# equals `shardc explain --format json`'s "collectives", aggregated by kind, axes and bytes per
# device (tests/unit/native/executed_vs_explain.py).
find_program(EXECUTED_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(EXECUTED_PYTHON3)
  set(EXEC_CHECK ${EXECUTED_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/native/executed_vs_explain.py $<TARGET_FILE:shardc>)
  set(EXEC_MLP -D batch=8 -D seq=16 -D embed=64 -D hidden=128)
  set(EXEC_LM_NOBATCH -D seq=8 -D embed=32 -D hidden=64 -D heads=4 -D head=8 -D vocab=64 -D layers=2)
  set(EXEC_LM -D batch=8 -D seq=8 -D embed=32 -D hidden=64 -D heads=4 -D head=8 -D vocab=64 -D layers=2)
  set(EXEC_PIPE -D seq=8 -D embed=32 -D hidden=64 -D heads=4 -D head=8 -D vocab=64 -D layers=4)
  foreach(layout fsdp_tp dp fsdp tp)
    add_test(NAME executed.mlp.train.${layout}
             COMMAND ${EXEC_CHECK} ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${EXEC_MLP} --layout ${layout} --mesh "h100[data: 2, model: 2]")
  endforeach()
  add_test(NAME executed.mlp.forward
           COMMAND ${EXEC_CHECK} ${CMAKE_SOURCE_DIR}/samples/mlp.shard ${EXEC_MLP} --entry mlp.forward --mesh "h100[data: 2, model: 2]")
  # every layout of every dense LM sample
  foreach(case llama3_8b:fsdp_tp llama3_8b:fsdp_tp_sp llama3_8b:fsdp llama3_8b:dp_tp llama3_8b:dp
               llama2_13b:fsdp_tp llama2_13b:fsdp_tp_sp llama2_13b:fsdp llama2_13b:dp_tp llama2_13b:dp
               llama3_70b:fsdp_tp_sp llama3_70b:fsdp_tp llama3_70b:fsdp llama3_70b:dp_tp llama3_70b:dp
               llama3_405b:fsdp_tp_sp llama3_405b:fsdp_tp llama3_405b:hsdp_tp_sp llama3_405b:dp_tp)
    string(REPLACE ":" ";" parts ${case})
    list(GET parts 0 sample)
    list(GET parts 1 layout)
    set(mesh "h100[data: 2, model: 2]")
    if(sample STREQUAL "llama3_405b")
      set(mesh "h100[data: 1, fsdp: 2, model: 2]")
    endif()
    add_test(NAME executed.${sample}.${layout}
             COMMAND ${EXEC_CHECK} ${CMAKE_SOURCE_DIR}/samples/${sample}.shard ${EXEC_LM} -D kv_heads=2 --layout ${layout} --mesh ${mesh})
  endforeach()
  add_test(NAME executed.llama3_8b.forward
           COMMAND ${EXEC_CHECK} ${CMAKE_SOURCE_DIR}/samples/llama3_8b.shard ${EXEC_LM} -D kv_heads=2 --entry llama.forward
                   --mesh "h100[data: 2, model: 2]")
  add_test(NAME executed.gpt3_175b.ptd_nostage
           COMMAND ${EXEC_CHECK} ${CMAKE_SOURCE_DIR}/samples/gpt3_175b.shard ${EXEC_LM_NOBATCH} -D batch=256 --mesh "h100[data: 2, model: 2]")
  # (ptd_sp is refused at these sizes by check, explain and run alike, on main too: "this pipeline
  # cannot be split into stages: the contract here makes a value read on another stage", the tied
  # embedding's logits at gpt.shard:42; the full-size sample checks)
  foreach(layout ptd ptd_fsdp)
    add_test(NAME executed.gpt3_175b.${layout}
             COMMAND ${EXEC_CHECK} ${CMAKE_SOURCE_DIR}/samples/gpt3_175b.shard ${EXEC_PIPE} -D batch=256 --layout ${layout}
                     --mesh "h100[data: 1, stage: 2, model: 2]")
  endforeach()
  foreach(layout pp_tp_sp pp_tp pp_fsdp_tp_sp)
    add_test(NAME executed.llama3_405b_pp.${layout}
             COMMAND ${EXEC_CHECK} ${CMAKE_SOURCE_DIR}/samples/llama3_405b_pp.shard ${EXEC_PIPE} -D kv_heads=2 -D batch=32
                     --layout ${layout} --mesh "h100[data: 2, stage: 2, model: 2]")
  endforeach()
  # known gaps (executed_vs_explain.py): the ring's backward runs more than the one backward ring
  # explain counts; a route's patterned value is moved dense where explain prices its entries
  add_test(NAME executed.llama3_8b_long.train
           COMMAND ${EXEC_CHECK} --gap ring-backward ${CMAKE_SOURCE_DIR}/samples/llama3_8b_long.shard ${EXEC_LM} -D kv_heads=2 --mesh "h100[data: 1, ctx: 2, model: 2]")
  add_test(NAME executed.llama3_8b_long.forward
           COMMAND ${EXEC_CHECK} ${CMAKE_SOURCE_DIR}/samples/llama3_8b_long.shard ${EXEC_LM} -D kv_heads=2 --entry llama.forward
                   --mesh "h100[data: 1, ctx: 4, model: 1]")
  add_test(NAME executed.mixtral_8x7b.dp_ep_tp
           COMMAND ${EXEC_CHECK} --gap route-density ${CMAKE_SOURCE_DIR}/samples/mixtral_8x7b.shard ${EXEC_LM_NOBATCH} -D batch=16 -D kv_heads=2 -D expert=4 -D cap=4
                   --mesh "h100[data: 1, ep: 2, model: 2]")
  add_test(NAME executed.mixtral_8x7b.dp_tp
           COMMAND ${EXEC_CHECK} --gap route-density ${CMAKE_SOURCE_DIR}/samples/mixtral_8x7b.shard ${EXEC_LM_NOBATCH} -D batch=16 -D kv_heads=2 -D expert=4 -D cap=4
                   --layout dp_tp --mesh "h100[data: 1, ep: 2, model: 2]")
  add_test(NAME executed.pipe.interleaved
           COMMAND ${EXEC_CHECK} ${CMAKE_CURRENT_LIST_DIR}/native/pipe/pipe_interleaved.shard --layout pp --mesh "h100[data: 1, stage: 2, model: 2]")
  get_property(exec_tests DIRECTORY PROPERTY TESTS)
  foreach(t ${exec_tests})
    if(t MATCHES "^executed\\.")
      set_tests_properties(${t} PROPERTIES TIMEOUT 600)
    endif()
  endforeach()
endif()
