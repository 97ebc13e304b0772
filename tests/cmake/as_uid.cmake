# The helper that runs part of a test as another uid (tests/integration/as_uid.h), tested on its
# own: the two-uid tests (label hostile_client) rely on it. Skips unless root.
tier_add_test(as_uid_test LABEL integration TIMEOUT 120
  SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/as_uid_test.cc
  LIBS tier_test_daemon tier_client_static)
