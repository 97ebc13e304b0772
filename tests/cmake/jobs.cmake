# The job path's ring pollers, one per GPU and a default one (issue 26), over real sessions, rings,
# registry, executor and tiers, with a copy engine that can make one GPU slow or stall it.
tier_add_test(ring_pollers_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/ring_pollers_test.cc LIBS tierd_lib)
# What clients hold against the per-session, per-uid and node-wide limits.
tier_add_test(usage_ledger_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/usage_ledger_test.cc LIBS tierd_lib)
