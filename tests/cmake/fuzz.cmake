# Fuzz targets (tests/fuzz): the session socket's request parser, the ring entry validator, the
# config parser and the persistent-object journal's parsers (on tierd_parsers alone), and the
# persistent-object requests against a real store (on tierd_lib), each with a seed corpus in
# tests/fuzz/corpus/<target>.
#  - Every build replays each corpus through its target as a test (<target>_fuzz_replay), so an
#    input that once crashed, once added to the corpus, stays a regression test.
#  - With -DTIER_FUZZ=ON (clang) they are libFuzzer binaries (<target>_fuzzer, target `fuzzers`);
#    scripts/test runs each for a bounded time.
set(_tier_fuzz_targets session_message ring_entry config journal persistent_request)
set(_tier_fuzz_lib_persistent_request tierd_lib)
if(TIER_FUZZ)
  foreach(_target IN LISTS _tier_fuzz_targets)
    add_executable(${_target}_fuzzer ${CMAKE_SOURCE_DIR}/tests/fuzz/${_target}_fuzzer.cc)
    if(DEFINED _tier_fuzz_lib_${_target})
      target_link_libraries(${_target}_fuzzer PRIVATE ${_tier_fuzz_lib_${_target}})
    else()
      target_link_libraries(${_target}_fuzzer PRIVATE tierd_parsers)
    endif()
    target_link_options(${_target}_fuzzer PRIVATE -fsanitize=fuzzer)
    list(APPEND _tier_fuzzers ${_target}_fuzzer)
  endforeach()
  add_custom_target(fuzzers DEPENDS ${_tier_fuzzers})
else()
  foreach(_target IN LISTS _tier_fuzz_targets)
    add_executable(${_target}_fuzz_replay ${CMAKE_SOURCE_DIR}/tests/fuzz/${_target}_fuzzer.cc
                   ${CMAKE_SOURCE_DIR}/tests/fuzz/replay_main.cc)
    if(DEFINED _tier_fuzz_lib_${_target})
      target_link_libraries(${_target}_fuzz_replay PRIVATE ${_tier_fuzz_lib_${_target}})
    else()
      target_link_libraries(${_target}_fuzz_replay PRIVATE tierd_parsers)
    endif()
    add_test(NAME ${_target}_fuzz_replay
             COMMAND ${_target}_fuzz_replay ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/${_target})
    set_tests_properties(${_target}_fuzz_replay PROPERTIES LABELS unit TIMEOUT 60)
  endforeach()
endif()
