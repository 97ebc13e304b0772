// client_gpu.h for builds without a GPU runtime (TIER_GPU=none): no devices; everything else is
// UNIMPLEMENTED.
#include "client/gpu/client_gpu.h"

namespace tier::client::gpu {

int GpuDeviceCount() { return 0; }

absl::StatusOr<std::string> GpuPciBusId(int) {
  return absl::UnimplementedError("this client library was built without GPU support");
}

uint64_t AllocationId(const void*) { return 0; }  // no cheap identity: always export

absl::StatusOr<DeviceAllocation> ExportDeviceAllocation(const void*) {
  return absl::UnimplementedError("this client library was built without GPU support");
}

absl::StatusOr<std::unique_ptr<TicketPageRegistration>> RegisterTicketPage(ring::TicketPage*) {
  return absl::UnimplementedError("this client library was built without GPU support");
}

absl::StatusOr<std::unique_ptr<SyncRuntime>> NewSyncRuntime() {
  return absl::UnimplementedError("this client library was built without GPU support");
}

}  // namespace tier::client::gpu
