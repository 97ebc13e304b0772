# GPU tests (label gpu): built where the CUDA runtime was chosen; each exits 77 ("no GPU:
# skipped") where no device exists, which tier_add_test maps to SKIPPED.
if(TIER_GPU_RUNTIME STREQUAL "cuda")
  tier_add_test(cuda_engine_test LABEL gpu TIMEOUT 600
    SOURCES gpu/cuda_engine_test.cc
    LIBS tier_engine tier_client_gpu tier_common CUDA::cudart absl::strings)
endif()

# The GPU engine's runtime-neutral core over a fake runtime: runs everywhere.
tier_add_test(stream_engine_test LABEL unit
  SOURCES gpu/stream_engine_ordering_test.cc gpu/stream_engine_lifecycle_test.cc
  LIBS tier_engine tier_common)
tier_add_test(pool_writes_test LABEL unit
  SOURCES unit/pool_writes_test.cc
  LIBS tier_engine tier_common)
tier_add_test(link_meter_test LABEL unit
  SOURCES unit/link_meter_test.cc
  LIBS tier_engine tier_common)
tier_add_test(link_share_test LABEL unit
  SOURCES unit/link_share_test.cc
  LIBS tier_engine tier_common)

# The GPU data path end to end: real tierd (CUDA engine) and the client library.
if(TIER_GPU_RUNTIME STREQUAL "cuda")
  tier_add_test(daemon_gpu_test LABEL gpu TIMEOUT 900
    SOURCES gpu/daemon_gpu_main.cc gpu/daemon_gpu_contract_test.cc gpu/daemon_gpu_memory_test.cc
            gpu/daemon_gpu_sessions_test.cc
    LIBS tier_test_daemon tier_client_static tier_client_gpu tier_gpu_runtime CUDA::cudart)
endif()

# The host engine's fed copies (reloads pipelined behind an NVMe read).
tier_add_test(host_engine_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/host_engine_test.cc LIBS tier_engine)

# Which CUDA calls wait for GPU work (and block other threads meanwhile) on this driver: the
# evidence behind gpu/gpu_call_class.h. A program, not a ctest test: run by scripts/gpu-tests.
if(TIER_GPU_RUNTIME STREQUAL "cuda")
  add_executable(cuda_blocking_probe gpu/cuda_blocking_probe.cc)
  target_link_libraries(cuda_blocking_probe PRIVATE tier_gpu_runtime tier_common CUDA::cudart
                        Threads::Threads)
endif()
