// The one step of exporting a device allocation (client_gpu.h, ExportDeviceAllocation in
// client_gpu_runtime.cc) that only CUDA has: VMM memory as a POSIX fd (client_gpu_cuda.cc). HIP
// exports IPC handles only (client_gpu_hip.cc).
#ifndef TIER_CLIENT_GPU_VMM_EXPORT_H_
#define TIER_CLIENT_GPU_VMM_EXPORT_H_

#include "absl/status/statusor.h"
#include "client/gpu/device_allocation.h"

namespace tier::client::gpu {

// If `device_ptr` lies in VMM memory: exports the physical allocation mapped there into *out
// (kind, fd, and its base, bytes and offset; *out holds the address range around the pointer on
// entry) and returns true. False: not VMM memory; export it as an IPC handle.
absl::StatusOr<bool> ExportVmmAllocation(const void* device_ptr, DeviceAllocation* out);

}  // namespace tier::client::gpu

#endif  // TIER_CLIENT_GPU_VMM_EXPORT_H_
