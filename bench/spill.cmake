# Spill bandwidth: tierd and the SpillStore against fio and dd on the same directory (a program, not a test).
add_executable(tier_spill_bench ${CMAKE_CURRENT_LIST_DIR}/spill_bench.cc)
target_link_libraries(tier_spill_bench PRIVATE tier_spill tier_client_core)
