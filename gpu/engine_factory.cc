#include "gpu/engine_factory.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"

#if defined(TIER_HAVE_CUDA)
#include "gpu/cuda_engine.h"
#endif
#if defined(TIER_HAVE_HIP)
#include "gpu/hip_engine.h"
#endif

namespace tier::gpu {
namespace {

constexpr const char* kGpuRuntime =
#if defined(TIER_HAVE_CUDA)
    "cuda";
#elif defined(TIER_HAVE_HIP)
    "hip";
#else
    "";
#endif

absl::StatusOr<std::unique_ptr<CopyEngine>> MakeGpuEngine(const EngineOptions& options) {
  GpuEngineOptions gpu;
  gpu.copy_delay_us = options.copy_delay_us;
  gpu.lane_wait_warn_ms = options.lane_wait_warn_ms;
#if defined(TIER_HAVE_CUDA)
  return MakeCudaEngine(gpu);
#elif defined(TIER_HAVE_HIP)
  return MakeHipEngine(gpu);
#else
  (void)gpu;
  return absl::UnimplementedError("this tierd was built without a GPU runtime (TIER_GPU=none)");
#endif
}

}  // namespace

absl::StatusOr<std::unique_ptr<CopyEngine>> MakeCopyEngine(const EngineOptions& options) {
  HostEngineOptions host;
  host.threads_per_direction = options.host_threads;
  host.copy_delay_us = options.copy_delay_us;
  if (options.kind == "host") return MakeHostEngine(host);
  if (options.kind == "auto") {
    absl::StatusOr<std::unique_ptr<CopyEngine>> engine = MakeGpuEngine(options);
    if (engine.ok()) return engine;
    if (engine.status().code() == absl::StatusCode::kUnavailable ||
        engine.status().code() == absl::StatusCode::kUnimplemented) {
      LogInfo("no GPU engine (", engine.status().message(), "); using the host engine");
    } else {
      LogWarning("GPU present but its engine failed (", engine.status().message(),
                 "); using the host engine");
    }
    return MakeHostEngine(host);
  }
  if (options.kind == "cuda" || options.kind == "hip") {
    if (options.kind != kGpuRuntime) {
      return absl::UnimplementedError(
          absl::StrCat("engine '", options.kind, "' is not built into this tierd",
                       *kGpuRuntime ? absl::StrCat(" (it has '", kGpuRuntime, "')") : ""));
    }
    return MakeGpuEngine(options);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown engine '", options.kind, "': use auto, host, cuda or hip"));
}

}  // namespace tier::gpu
