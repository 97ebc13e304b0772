// The GPU calls the client's DeviceRegistry makes, behind one small interface: the runtime's
// (RuntimeDeviceMemory(), over client_gpu.h) in the library, a fake in tests, so the registry's
// rules (reuse, growth, stale pages, when a registration may go) are tested without a GPU.
#ifndef TIER_CLIENT_GPU_DEVICE_MEMORY_H_
#define TIER_CLIENT_GPU_DEVICE_MEMORY_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "client/gpu/device_allocation.h"
#include "client/gpu/device_sync.h"
#include "tier/ring.h"

namespace tier::client::gpu {

class TicketPageRegistration;

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // gpu::ExportDeviceAllocation: the one allocation (VMM: page) mapped at `device_ptr`.
  virtual absl::StatusOr<DeviceAllocation> ExportAllocation(const void* device_ptr) = 0;
  // gpu::AllocationId: the identity of the physical allocation mapped at `device_ptr` (0: none).
  virtual uint64_t AllocationId(const void* device_ptr) = 0;
  // gpu::RegisterTicketPage and gpu::CreateDeviceSync.
  virtual absl::StatusOr<std::unique_ptr<TicketPageRegistration>> RegisterTicketPage(
      ring::TicketPage* page) = 0;
  virtual absl::StatusOr<std::unique_ptr<DeviceSync>> CreateDeviceSync(int device,
                                                                       ring::TicketSlot* slot) = 0;
};

// The GPU runtime the library was built for (client_gpu.h).
std::unique_ptr<DeviceMemory> RuntimeDeviceMemory();

// ExportAllocation for a range: the allocation holding `device_ptr`, which must also hold `len`
// bytes from it. A range over VMM pages mapped side by side (PyTorch expandable segments) becomes
// one kCudaVmmPages allocation of up to wire::kMaxVmmPages pages. OUT_OF_RANGE when the range
// crosses the end of a cudaMalloc allocation, runs into unmapped or non-exportable memory, or
// needs more pages. len == 0 is ExportAllocation. (client_gpu_range.cc)
absl::StatusOr<DeviceAllocation> ExportDeviceRange(DeviceMemory& memory, const void* device_ptr,
                                                   uint64_t len);
// ExportDeviceRange with the allocation at `device_ptr` already exported (`first`).
absl::StatusOr<DeviceAllocation> ExportDeviceRangeFrom(DeviceMemory& memory, DeviceAllocation first,
                                                       const void* device_ptr, uint64_t len);

}  // namespace tier::client::gpu

#endif  // TIER_CLIENT_GPU_DEVICE_MEMORY_H_
