// The HIP copy engine: the stream engine (gpu/stream_engine.h) over the HIP runtime. Same
// design as CUDA; what HIP lacks is UNIMPLEMENTED (VMM fd import: kCudaVmmFd).
#ifndef TIER_GPU_HIP_ENGINE_H_
#define TIER_GPU_HIP_ENGINE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "gpu/copy_engine.h"

namespace tier::gpu {

absl::StatusOr<std::unique_ptr<CopyEngine>> MakeHipEngine(const GpuEngineOptions& options);

}  // namespace tier::gpu

#endif  // TIER_GPU_HIP_ENGINE_H_
