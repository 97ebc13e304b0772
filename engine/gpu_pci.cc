#include "engine/gpu_pci.h"

#include "absl/status/statusor.h"
#include "common/log.h"

#if defined(TIER_HAVE_CUDA) || defined(TIER_HAVE_HIP)
#include "gpu/runtime.h"
#endif

namespace tier::engine {

std::vector<std::string> GpuPciBusIds(absl::string_view engine_name) {
  std::vector<std::string> ids;
#if defined(TIER_HAVE_CUDA) || defined(TIER_HAVE_HIP)
  if (engine_name != TIER_GPU_NAME) return ids;
  const int count = gpu::DeviceCount();
  for (int device = 0; device < count; ++device) {
    absl::StatusOr<std::string> id = gpu::PciBusId(device);
    if (!id.ok()) LogWarning("GPU ", device, ": no PCI bus id (", id.status().message(), ")");
    ids.push_back(id.ok() ? *id : "");
  }
#else
  (void)engine_name;
#endif
  return ids;
}

}  // namespace tier::engine
