// Picks the copy engine: host always exists; cuda/hip when built with that runtime; auto takes the
// GPU engine when a device is present and falls back to the host engine (with a log line).
#ifndef TIER_ENGINE_ENGINE_FACTORY_H_
#define TIER_ENGINE_ENGINE_FACTORY_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/copy_engine.h"
#include "engine/engine_kind.h"

namespace tier::engine {

struct EngineOptions {
  EngineKind kind = EngineKind::kAuto;
  int host_threads = 2;       // host engine: worker threads per direction
  uint64_t copy_delay_us = 0;  // test-only delay injection, every engine
  uint32_t lane_wait_warn_ms = 10000;  // GPU engines: see GpuEngineOptions
  uint32_t gpu_poll_spin_us = 50;      // GPU engines: GpuEngineOptions::poll_spin_us
  uint64_t gpu_lane_window_bytes = 0;  // GPU engines: GpuEngineOptions::lane_window_bytes
};

absl::StatusOr<std::unique_ptr<CopyEngine>> MakeCopyEngine(const EngineOptions& options);

}  // namespace tier::engine

#endif  // TIER_ENGINE_ENGINE_FACTORY_H_
