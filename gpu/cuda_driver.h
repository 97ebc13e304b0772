// The CUDA driver API functions Tierd uses, reached through cudaGetDriverEntryPointByVersion so
// that nothing links libcuda directly (the runtime finds the driver the process already loaded),
// and their errors. The runtime API helpers both runtimes share are in gpu/runtime.h.
#ifndef TIER_GPU_CUDA_DRIVER_H_
#define TIER_GPU_CUDA_DRIVER_H_

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tier::gpu::cuda {

// Entry points, resolved for the CUDA 12.0 ABI (the _v2 stream memory operations).
struct Driver {
  PFN_cuGetErrorName_v6000 GetErrorName = nullptr;
  PFN_cuGetErrorString_v6000 GetErrorString = nullptr;
  PFN_cuDeviceGet_v2000 DeviceGet = nullptr;
  PFN_cuDeviceGetAttribute_v2000 DeviceGetAttribute = nullptr;
  PFN_cuStreamWaitValue64_v11070 StreamWaitValue64 = nullptr;
  PFN_cuStreamWriteValue64_v11070 StreamWriteValue64 = nullptr;
  PFN_cuMemGetAddressRange_v3020 MemGetAddressRange = nullptr;
  PFN_cuMemRetainAllocationHandle_v11000 MemRetainAllocationHandle = nullptr;
  PFN_cuMemGetAllocationPropertiesFromHandle_v10020 MemGetAllocationPropertiesFromHandle = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 MemGetAllocationGranularity = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 MemExportToShareableHandle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 MemImportFromShareableHandle = nullptr;
  PFN_cuMemAddressReserve_v10020 MemAddressReserve = nullptr;
  PFN_cuMemAddressFree_v10020 MemAddressFree = nullptr;
  PFN_cuMemMap_v10020 MemMap = nullptr;
  PFN_cuMemUnmap_v10020 MemUnmap = nullptr;
  PFN_cuMemSetAccess_v10020 MemSetAccess = nullptr;
  PFN_cuMemRelease_v10020 MemRelease = nullptr;
  PFN_cuMemCreate_v10020 MemCreate = nullptr;  // tests allocate VMM memory with it
  PFN_cuPointerGetAttribute_v4000 PointerGetAttribute = nullptr;
};

// Loads the table once (thread-safe); UNAVAILABLE with the reason if the runtime or driver is
// missing or too old.
absl::StatusOr<const Driver*> GetDriver();

// "what: CUDA_ERROR_X (description)" with a fitting canonical code.
absl::Status DriverError(CUresult result, absl::string_view what);
inline absl::Status CheckDriver(CUresult result, absl::string_view what) {
  return result == CUDA_SUCCESS ? absl::OkStatus() : DriverError(result, what);
}

}  // namespace tier::gpu::cuda

#endif  // TIER_GPU_CUDA_DRIVER_H_
