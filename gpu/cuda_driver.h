// The CUDA driver API functions Tierd uses, reached through cudaGetDriverEntryPointByVersion so
// that nothing links libcuda directly (the runtime finds the driver the process already loaded),
// plus the error helpers and a device guard shared by the engine and the client library.
#ifndef TIER_GPU_CUDA_DRIVER_H_
#define TIER_GPU_CUDA_DRIVER_H_

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>

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

// "what: cudaErrorX (description)" with a fitting canonical code.
absl::Status RuntimeError(cudaError_t error, absl::string_view what);
absl::Status DriverError(CUresult result, absl::string_view what);

inline absl::Status CheckRuntime(cudaError_t error, absl::string_view what) {
  return error == cudaSuccess ? absl::OkStatus() : RuntimeError(error, what);
}
inline absl::Status CheckDriver(CUresult result, absl::string_view what) {
  return result == CUDA_SUCCESS ? absl::OkStatus() : DriverError(result, what);
}

// Number of devices; 0 when there is no device or no driver.
int DeviceCount();

// The device's UUID (cached).
absl::StatusOr<std::array<uint8_t, 16>> DeviceUuid(int device);

// This process's ordinal of the GPU with `uuid`, or nullopt.
std::optional<int> DeviceForUuid(const std::array<uint8_t, 16>& uuid);

// The device's PCI bus id as the runtime writes it ("0000:3B:00.0").
absl::StatusOr<std::string> PciBusId(int device);

// FAILED_PRECONDITION unless `device` supports 64-bit stream memory operations (wait/write).
absl::Status CheckStreamMemOps(int device);

// Makes `device` current for the scope and restores the caller's device after: library code must
// not change the current device of an application thread.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

}  // namespace tier::gpu::cuda

#endif  // TIER_GPU_CUDA_DRIVER_H_
