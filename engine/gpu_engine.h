// The GPU copy engine of the runtime this build chose (CUDA: cuda_engine.cc, HIP: hip_engine.cc):
// the stream engine (engine/stream_engine.h) over engine/portable_runtime.h.
#ifndef TIER_ENGINE_GPU_ENGINE_H_
#define TIER_ENGINE_GPU_ENGINE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/copy_engine.h"

namespace tier::engine {

// Fails (UNAVAILABLE / FAILED_PRECONDITION, with the reason) when there is no device, no driver,
// or a device without 64-bit stream memory operations, or when the start-up self-test of stream
// memory operations on mapped host memory fails.
absl::StatusOr<std::unique_ptr<CopyEngine>> StartGpuEngine(const GpuEngineOptions& options);

}  // namespace tier::engine

#endif  // TIER_ENGINE_GPU_ENGINE_H_
