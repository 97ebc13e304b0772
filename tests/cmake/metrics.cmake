# Metrics (issue 15): the job path's counters and histograms, the Prometheus form of the daemon's
# state, and a real Prometheus scraping a real tierd (tests/integration/metrics_test.cc).
tier_add_test(job_metrics_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/job_metrics_test.cc LIBS tierd_lib)
tier_add_test(metrics_snapshot_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/metrics_snapshot_test.cc LIBS tierd_lib GTest::gmock)
