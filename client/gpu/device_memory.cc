// RuntimeDeviceMemory (device_memory.h): runtime neutral, over client_gpu.h.
#include "client/gpu/device_memory.h"

#include "client/gpu/client_gpu.h"

namespace tier::client::gpu {
namespace {

class RuntimeMemory final : public DeviceMemory {
 public:
  absl::StatusOr<DeviceAllocation> ExportAllocation(const void* device_ptr) override {
    return ExportDeviceAllocation(device_ptr);
  }
  uint64_t AllocationId(const void* device_ptr) override { return gpu::AllocationId(device_ptr); }
  absl::StatusOr<std::unique_ptr<TicketPageRegistration>> RegisterTicketPage(
      ring::TicketPage* page) override {
    return gpu::RegisterTicketPage(page);
  }
  absl::StatusOr<std::unique_ptr<DeviceSync>> CreateDeviceSync(int device,
                                                               ring::TicketSlot* slot) override {
    return gpu::CreateDeviceSync(device, slot);
  }
};

}  // namespace

std::unique_ptr<DeviceMemory> RuntimeDeviceMemory() { return std::make_unique<RuntimeMemory>(); }

}  // namespace tier::client::gpu
