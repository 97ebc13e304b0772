// The HIP engine: PortableRuntime (engine/portable_runtime.h) and what HIP does differently: host
// copies by hipStreamAddCallback, and no VMM imports.
#include <memory>

#include "engine/gpu_engine.h"
#include "engine/portable_runtime.h"
#include "gpu/runtime.h"

namespace tier::engine {
namespace {

class HipRuntime final : public PortableRuntime {
 public:
 protected:
  // hipStreamAddCallback, not hipLaunchHostFunc: the HIP runtime Debian ships (5.2) declares the
  // latter but does not export it. The callback runs in stream order either way.
  absl::Status EnqueueHostCopy(GpuStream stream, HostCopyTask* task) override {
    auto run = [](hipStream_t, hipError_t, void* arg) { HostCopyTask::Run(arg); };
    return gpu::CheckRuntime(hipStreamAddCallback(static_cast<hipStream_t>(stream), run, task, 0),
                             "hipStreamAddCallback");
  }

  absl::Status CanImport(wire::BufferKind kind) const override {
    if (kind == wire::BufferKind::kCudaVmmFd || kind == wire::BufferKind::kCudaVmmPages ||
        kind == wire::BufferKind::kCudaVmmSegment) {
      return absl::UnimplementedError(
          "the HIP engine cannot import VMM (fd) allocations: this HIP has no "
          "hipMemImportFromShareableHandle; register hipMalloc memory");
    }
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<CopyEngine>> StartGpuEngine(const GpuEngineOptions& options) {
  return StartEngine(std::make_unique<HipRuntime>(), options);
}

}  // namespace tier::engine
