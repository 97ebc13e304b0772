# Issue 15: what an operator installs. A client and a daemon of different protocol versions refuse
# each other, naming both.
tier_add_test(protocol_version_test LABEL integration TIMEOUT 120
  SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/version_test.cc
  LIBS tier_test_daemon tier_client_static absl::strings)
