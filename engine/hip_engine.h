// The HIP copy engine: the stream engine (engine/stream_engine.h) over the HIP runtime. Same
// design as CUDA; what HIP lacks is UNIMPLEMENTED (VMM fd import: kCudaVmmFd).
#ifndef TIER_ENGINE_HIP_ENGINE_H_
#define TIER_ENGINE_HIP_ENGINE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/copy_engine.h"

namespace tier::engine {

absl::StatusOr<std::unique_ptr<CopyEngine>> MakeHipEngine(const GpuEngineOptions& options);

}  // namespace tier::engine

#endif  // TIER_ENGINE_HIP_ENGINE_H_
