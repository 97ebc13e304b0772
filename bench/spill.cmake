# Spill bandwidth: tierd and the SpillStore against fio and dd on the same directory (a program, not a test).
add_executable(tier_spill_bench ${CMAKE_CURRENT_LIST_DIR}/spill_bench.cc)
target_link_libraries(tier_spill_bench PRIVATE tier_spill tier_client_core)
# The persistent journal's durable appends against dd on the same directory (a program, not a test).
if(TARGET tierd_lib)
  add_executable(tier_journal_bench ${CMAKE_CURRENT_LIST_DIR}/journal_bench.cc)
  target_link_libraries(tier_journal_bench PRIVATE tierd_lib)
endif()
