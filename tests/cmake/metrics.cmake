# Metrics (issue 15): the job path's counters and histograms, the Prometheus form of the daemon's
# state, and a real Prometheus scraping a real tierd (tests/integration/metrics_test.cc).
tier_add_test(job_metrics_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/job_metrics_test.cc LIBS tierd_lib)
tier_add_test(metrics_snapshot_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/metrics_snapshot_test.cc LIBS tierd_lib GTest::gmock)

# A real Prometheus scraping a real tierd while a client runs jobs (skips, saying so, where the
# prometheus binary is missing).
tier_add_test(metrics_integration_test LABEL integration TIMEOUT 120
  SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/metrics_test.cc
  LIBS tier_test_daemon tier_client_static absl::strings)
tier_add_test(health_monitor_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/health_monitor_test.cc LIBS tierd_lib)
