# What an operator deploys beside the binaries (deploy/): the Grafana dashboard asks only for
# metrics, labels and values tierd exports, in valid PromQL (tests/deploy/grafana_dashboard_test.py:
# a live scrape of a real tierd, plus the exposition of a snapshot with every field set for the
# families only a GPU shows). Not in sanitizer builds: the test loads libtierclient.so into an
# uninstrumented python3.
add_executable(metrics_exposition_sample ${CMAKE_SOURCE_DIR}/tests/deploy/metrics_exposition_sample.cc)
target_link_libraries(metrics_exposition_sample PRIVATE tierd_lib)
target_include_directories(metrics_exposition_sample PRIVATE ${CMAKE_SOURCE_DIR}/tests)

if(TIER_SANITIZE)
  message(STATUS "grafana_dashboard_test: not registered in a sanitizer build")
elseif(NOT EXISTS /usr/bin/python3)
  message(STATUS "grafana_dashboard_test: not registered (/usr/bin/python3 not found)")
else()
  find_program(TIER_PROMTOOL promtool)
  if(NOT TIER_PROMTOOL)
    set(TIER_PROMTOOL "")  # the test then skips its PromQL syntax check, saying so
  endif()
  add_test(NAME grafana_dashboard_test
           COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/deploy/grafana_dashboard_test.py
                   --dashboard ${CMAKE_SOURCE_DIR}/deploy/grafana/tierd-dashboard.json
                   --tierd $<TARGET_FILE:tierd> --sample $<TARGET_FILE:metrics_exposition_sample>
                   --python-dir ${CMAKE_SOURCE_DIR}/python --build-dir ${CMAKE_BINARY_DIR}
                   --promtool "${TIER_PROMTOOL}")
  set_tests_properties(grafana_dashboard_test PROPERTIES
    LABELS integration TIMEOUT 120 ENVIRONMENT "PYTHONDONTWRITEBYTECODE=1")
  # The Kubernetes manifests: tierd accepts the ConfigMap's config, the admin token is out of
  # what training pods mount, the example trainer runs as a non-root uid (issue 30, finding 13).
  add_test(NAME kubernetes_manifest_test
           COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/deploy/kubernetes_manifest_test.py
                   --manifests ${CMAKE_SOURCE_DIR}/deploy/kubernetes --tierd $<TARGET_FILE:tierd>)
  set_tests_properties(kubernetes_manifest_test PROPERTIES
    LABELS "integration;hostile_client" TIMEOUT 60 ENVIRONMENT "PYTHONDONTWRITEBYTECODE=1")
endif()
