// client_gpu.h, what HIP does not have (the rest is client_gpu_runtime.cc): no VMM export here,
// so only hipMalloc memory (legacy IPC handles) can be registered, and no cheap allocation id.
#include "client/gpu/client_gpu.h"
#include "client/gpu/vmm_export.h"

namespace tier::client::gpu {

uint64_t AllocationId(const void*) { return 0; }  // no cheap identity: always export

absl::StatusOr<bool> ExportVmmAllocation(const void*, DeviceAllocation*) { return false; }

}  // namespace tier::client::gpu
