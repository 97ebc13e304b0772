# Issue 30: two unprivileged uids (tests/integration/as_uid.h) against a real tierd, one scenario
# per finding about persistent objects. Label hostile_client (`ctest -L hostile_client`); needs
# root, skips otherwise.
tier_add_test(hostile_persistent_test LABEL integration TIMEOUT 1200
  SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/hostile_persistent_fairness_test.cc
          ${CMAKE_SOURCE_DIR}/tests/integration/hostile_persistent_restart_test.cc
  LIBS tier_test_daemon tier_client_static)
set_property(TEST hostile_persistent_test APPEND PROPERTY LABELS hostile_client)
