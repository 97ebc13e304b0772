#include "engine/engine_factory.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"

#if defined(TIER_HAVE_CUDA) || defined(TIER_HAVE_HIP)
#include "engine/gpu_engine.h"
#endif

namespace tier::engine {
namespace {

// The GPU engine built in, if any.
#if defined(TIER_HAVE_CUDA)
constexpr EngineKind kBuiltGpu = EngineKind::kCuda;
#elif defined(TIER_HAVE_HIP)
constexpr EngineKind kBuiltGpu = EngineKind::kHip;
#else
constexpr EngineKind kBuiltGpu = EngineKind::kHost;  // none
#endif

const char* Name(EngineKind kind) {
  switch (kind) {
    case EngineKind::kAuto:
      return "auto";
    case EngineKind::kHost:
      return "host";
    case EngineKind::kCuda:
      return "cuda";
    case EngineKind::kHip:
      return "hip";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<CopyEngine>> MakeGpuEngine(const EngineOptions& options) {
  GpuEngineOptions gpu;
  gpu.copy_delay_us = options.copy_delay_us;
  gpu.lane_wait_warn_ms = options.lane_wait_warn_ms;
  gpu.poll_spin_us = options.gpu_poll_spin_us;
  gpu.lane_window_bytes = options.gpu_lane_window_bytes;
#if defined(TIER_HAVE_CUDA) || defined(TIER_HAVE_HIP)
  return StartGpuEngine(gpu);
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
  switch (options.kind) {
    case EngineKind::kHost:
      return MakeHostEngine(host);
    case EngineKind::kAuto: {
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
    case EngineKind::kCuda:
    case EngineKind::kHip:
      if (options.kind != kBuiltGpu) {
        return absl::UnimplementedError(absl::StrCat(
            "engine '", Name(options.kind), "' is not built into this tierd",
            kBuiltGpu != EngineKind::kHost ? absl::StrCat(" (it has '", Name(kBuiltGpu), "')")
                                           : ""));
      }
      return MakeGpuEngine(options);
  }
  return absl::InvalidArgumentError("unknown engine kind");
}

}  // namespace tier::engine
