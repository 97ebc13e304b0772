# daemon/config and daemon/control/systemd_notifier.
tier_add_test(config_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/config_text_test.cc
          ${CMAKE_SOURCE_DIR}/tests/unit/config_load_test.cc
  LIBS tierd_lib GTest::gmock)
# Reads deploy/tierd.conf to check it lists every key with its default.
target_compile_definitions(config_test PRIVATE TIER_SOURCE_DIR="${CMAKE_SOURCE_DIR}")

tier_add_test(systemd_notifier_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/systemd_notifier_test.cc LIBS tierd_lib)
