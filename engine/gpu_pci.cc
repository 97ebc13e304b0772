#include "engine/gpu_pci.h"

#include "absl/status/statusor.h"
#include "common/log.h"

#if defined(TIER_HAVE_CUDA)
#include "gpu/cuda_driver.h"
#endif
#if defined(TIER_HAVE_HIP)
#include "gpu/hip_util.h"
#endif

namespace tier::engine {

std::vector<std::string> GpuPciBusIds(absl::string_view engine_name) {
  std::vector<std::string> ids;
#if defined(TIER_HAVE_CUDA)
  namespace runtime = gpu::cuda;
  const bool ours = engine_name == "cuda";
#elif defined(TIER_HAVE_HIP)
  namespace runtime = gpu::hip;
  const bool ours = engine_name == "hip";
#else
  (void)engine_name;
  return ids;
#endif
#if defined(TIER_HAVE_CUDA) || defined(TIER_HAVE_HIP)
  if (!ours) return ids;
  const int count = runtime::DeviceCount();
  for (int device = 0; device < count; ++device) {
    absl::StatusOr<std::string> id = runtime::PciBusId(device);
    if (!id.ok()) LogWarning("GPU ", device, ": no PCI bus id (", id.status().message(), ")");
    ids.push_back(id.ok() ? *id : "");
  }
  return ids;
#endif
}

}  // namespace tier::engine
