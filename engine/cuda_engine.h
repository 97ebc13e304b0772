// The CUDA copy engine: the stream engine (engine/stream_engine.h) over the CUDA runtime, with the
// driver's stream memory operations reached through entry points (gpu/cuda_driver.h).
#ifndef TIER_ENGINE_CUDA_ENGINE_H_
#define TIER_ENGINE_CUDA_ENGINE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/copy_engine.h"

namespace tier::engine {

// Fails (UNAVAILABLE / FAILED_PRECONDITION, with the reason) when there is no device, no driver,
// or a device without 64-bit stream memory operations, or when the start-up self-test of stream
// memory operations on mapped host memory fails.
absl::StatusOr<std::unique_ptr<CopyEngine>> MakeCudaEngine(const GpuEngineOptions& options);

}  // namespace tier::engine

#endif  // TIER_ENGINE_CUDA_ENGINE_H_
