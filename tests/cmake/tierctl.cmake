# tierctl: formatting, tables, JSON, socket path (pure), and the commands against an in-process
# fake daemon, both through the library and through the real binary.
tier_add_test(tierctl_render_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/tierctl_format_test.cc
          ${CMAKE_SOURCE_DIR}/tests/unit/tierctl_table_test.cc
          ${CMAKE_SOURCE_DIR}/tests/unit/tierctl_json_writer_test.cc
          ${CMAKE_SOURCE_DIR}/tests/unit/tierctl_socket_path_test.cc
  LIBS tierctl_lib)
tier_add_test(tierctl_commands_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/tierctl_commands_test.cc
  LIBS tierctl_lib)
# Unit tests do not get TIERCTL_BIN from tier_add_test; this one runs the binary, so it asks.
target_compile_definitions(tierctl_commands_test PRIVATE TIERCTL_BIN="$<TARGET_FILE:tierctl>")
add_dependencies(tierctl_commands_test tierctl)
# tierctl top: rates, percentiles, frames and the refresh loop (no daemon: prepared samples).
tier_add_test(tierctl_top_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/tierctl_top_test.cc LIBS tierctl_lib GTest::gmock)
