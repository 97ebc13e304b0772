// The CUDA copy engine: the stream engine (gpu/stream_engine.h) over the CUDA runtime, with the
// driver's stream memory operations reached through entry points (gpu/cuda_driver.h).
#ifndef TIER_GPU_CUDA_ENGINE_H_
#define TIER_GPU_CUDA_ENGINE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "gpu/copy_engine.h"

namespace tier::gpu {

// Fails (UNAVAILABLE / FAILED_PRECONDITION, with the reason) when there is no device, no driver,
// or a device without 64-bit stream memory operations, or when the start-up self-test of stream
// memory operations on mapped host memory fails.
absl::StatusOr<std::unique_ptr<CopyEngine>> MakeCudaEngine(const GpuEngineOptions& options);

}  // namespace tier::gpu

#endif  // TIER_GPU_CUDA_ENGINE_H_
