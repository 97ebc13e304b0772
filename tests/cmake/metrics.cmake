# Metrics (issue 15): the job path's counters and histograms.
tier_add_test(job_metrics_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/job_metrics_test.cc LIBS tierd_lib)
