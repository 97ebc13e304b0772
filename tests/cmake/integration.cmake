# Real tierd processes, real sockets, real shared memory (host engine).
add_library(tier_test_daemon STATIC ${CMAKE_SOURCE_DIR}/tests/integration/tierd_process.cc)
target_link_libraries(tier_test_daemon PUBLIC tier_proto)
target_compile_definitions(tier_test_daemon PRIVATE TIERD_BIN="$<TARGET_FILE:tierd>")
target_include_directories(tier_test_daemon PUBLIC ${CMAKE_SOURCE_DIR}/tests/integration
                           ${CMAKE_SOURCE_DIR}/include)

# The kill -9 victim: a separate C program on the shared library, as a foreign client would be.
add_executable(doomed_client ${CMAKE_SOURCE_DIR}/tests/integration/doomed_client.c)
target_link_libraries(doomed_client PRIVATE tierclient)

tier_add_test(end_to_end_test LABEL integration TIMEOUT 600
  SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/end_to_end_test.cc
  LIBS tier_test_daemon tier_client_static)
target_compile_definitions(end_to_end_test PRIVATE DOOMED_CLIENT_BIN="$<TARGET_FILE:doomed_client>")
add_dependencies(end_to_end_test doomed_client)
# A wait for tierd warns after 300 ms instead of 10 s (the stopped-daemon test reads the warning).
set_tests_properties(end_to_end_test PROPERTIES ENVIRONMENT TIER_WAIT_WARN_MS=300)

# tier_offload_ranges, tier_reload_ranges: raw pointers registered and moved in one call.
tier_add_test(ranges_test LABEL integration TIMEOUT 300
  SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/ranges_test.cc
  LIBS tier_test_daemon tier_client_static)

tier_add_test(protocol_test LABEL integration TIMEOUT 600
  SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/protocol_test.cc
  LIBS tier_test_daemon tier_client_static)

tier_add_test(spill_integration_test LABEL integration TIMEOUT 600
  SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/spill_test.cc
  LIBS tier_test_daemon tier_client_static)

# Issue 16: hostile and careless clients against a real tierd, one scenario per finding.
tier_add_test(hostile_client_test LABEL integration TIMEOUT 600
  SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/hostile_client_session_test.cc
          ${CMAKE_SOURCE_DIR}/tests/integration/hostile_client_memory_test.cc
  LIBS tier_test_daemon tier_client_static)
# Issue 30: a hostile client as one uid, a witness as another (as_uid.h; root only, skips
# elsewhere). Both files are the `hostile_client` group: ctest -L hostile_client.
tier_add_test(hostile_uid_test LABEL integration TIMEOUT 600
  SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/hostile_uid_test.cc
  LIBS tier_test_daemon tier_client_static)
set_tests_properties(hostile_client_test hostile_uid_test PROPERTIES
  LABELS "integration;hostile_client")

# Issue 17: named, persistent objects; object_peer is a client run as another uid.
add_executable(object_peer ${CMAKE_SOURCE_DIR}/tests/integration/object_peer.c)
target_link_libraries(object_peer PRIVATE tierclient)
tier_add_test(persistent_test LABEL integration TIMEOUT 600
  SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/persistent_test.cc
  LIBS tier_test_daemon tier_client_static)
target_compile_definitions(persistent_test PRIVATE OBJECT_PEER_BIN="$<TARGET_FILE:object_peer>")
add_dependencies(persistent_test object_peer)
