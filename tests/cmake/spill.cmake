# The spill store: CRC-32C, the io queues (io_uring, thread pool, fault injection), SpillStore.
# Their files live under this build directory (a real disk for O_DIRECT; /tmp may be tmpfs);
# TIER_SPILL_TEST_DIR in the environment overrides it.
foreach(_spill_test spill_crc32c_test spill_io_queue_test spill_store_test)
  tier_add_test(${_spill_test} LABEL unit
    SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/${_spill_test}.cc LIBS tier_spill)
  target_compile_definitions(${_spill_test} PRIVATE TIER_SPILL_TEST_DIR="${CMAKE_BINARY_DIR}")
endforeach()

# The NVMe tier's policy alone, and the spiller over a real pool and store.
tier_add_test(spill_policy_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/spill_policy_test.cc LIBS tierd_lib)
# The tiers behind the job executor: the object table, the admission queue, the spiller, the
# NVMe transfers (SpillRead, SpillWrite).
tier_add_test(tiers_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/object_table_test.cc
          ${CMAKE_SOURCE_DIR}/tests/unit/admission_queue_test.cc
          ${CMAKE_SOURCE_DIR}/tests/unit/spiller_test.cc
          ${CMAKE_SOURCE_DIR}/tests/unit/spill_read_test.cc
  LIBS tierd_lib)
target_compile_definitions(tiers_test PRIVATE TIER_SPILL_TEST_DIR="${CMAKE_BINARY_DIR}")
# The job executor over a real session ring, pool and tiers, with a scripted copy engine.
tier_add_test(job_executor_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/job_executor_test.cc
          ${CMAKE_SOURCE_DIR}/tests/unit/job_gauge_test.cc
  LIBS tierd_lib)
target_compile_definitions(job_executor_test PRIVATE TIER_SPILL_TEST_DIR="${CMAKE_BINARY_DIR}")
# Named, persistent objects: the per-uid namespaces alone (issue 17).
tier_add_test(persistent_store_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/persistent_store_test.cc
  LIBS tierd_lib)
tier_add_test(persistent_journal_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/persistent_journal_test.cc
  LIBS tierd_lib)
