tier_add_test(extent_allocator_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/extent_allocator_test.cc LIBS tier_storage)
tier_add_test(extent_cache_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/extent_cache_test.cc LIBS tier_storage)
tier_add_test(host_pool_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/host_pool_test.cc LIBS tier_storage)
tier_add_test(ring_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/ring_test.cc LIBS tier_common)

tier_add_test(log_rate_limiter_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/log_rate_limiter_test.cc LIBS tier_common)
tier_add_test(populate_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/populate_test.cc LIBS tier_common)
tier_add_test(process_state_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/process_state_test.cc LIBS tier_common)

tier_add_test(session_channel_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/session_channel_test.cc LIBS tier_client_core)

tier_add_test(device_sync_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/device_sync_test.cc LIBS tier_client_gpu)

tier_add_test(device_registry_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/device_registry_test.cc LIBS tier_client_core)

tier_add_test(segment_request_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/segment_request_test.cc LIBS tierd_parsers)
