// Which copy engine tierd runs (the `engine` setting; see engine_factory.h).
#ifndef TIER_GPU_ENGINE_KIND_H_
#define TIER_GPU_ENGINE_KIND_H_

namespace tier::gpu {

enum class EngineKind {
  kAuto,  // the GPU engine when a device is present, else the host engine
  kHost,  // memcpy on worker threads (no GPU)
  kCuda,  // needs a tierd built with CUDA
  kHip,   // needs a tierd built with HIP
};

}  // namespace tier::gpu

#endif  // TIER_GPU_ENGINE_KIND_H_
