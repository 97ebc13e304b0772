// A device allocation described for registration with tierd (wire::RegisterBuffer + the file
// descriptors that travel beside it): what client/gpu exports and the session registers.
#ifndef TIER_CLIENT_GPU_DEVICE_ALLOCATION_H_
#define TIER_CLIENT_GPU_DEVICE_ALLOCATION_H_

#include <array>
#include <cstdint>
#include <vector>

#include "common/unique_fd.h"
#include "tier/session_wire.h"

namespace tier::client::gpu {

struct DeviceAllocation {
  wire::BufferKind kind = wire::BufferKind::kCudaIpc;  // kCudaIpc, kCudaVmmFd or kCudaSemaphores
  int device = -1;                                      // this process's ordinal
  std::array<uint8_t, 16> device_uuid{};                // the GPU's UUID (cudaDeviceProp::uuid)
  uint64_t base = 0;                                    // device address of the allocation
  uint64_t bytes = 0;                                   // its size
  uint64_t offset = 0;                                  // the queried pointer's offset in it
  // The virtual address range the allocation lies in (cuMemGetAddressRange): for VMM memory the
  // whole reservation, which may hold many pages side by side; else the allocation itself.
  uint64_t reservation_base = 0;
  uint64_t reservation_bytes = 0;
  // VMM: the GPU's memory. cuMemGetAddressRange may give one page's mapping rather than the
  // reservation, so a segment is assumed to reach at least this far past its first page (what
  // PyTorch reserves per expandable segment).
  uint64_t device_memory_bytes = 0;
  std::array<uint8_t, 64> ipc_handle{};                 // kCudaIpc, kCudaSemaphores
  UniqueFd fd;                                          // kCudaVmmFd: POSIX fd shareable handle
  // kCudaVmmPages: one fd per page, in address order; their sizes are also packed into
  // ipc_handle as little-endian uint64 (the wire format).
  std::vector<UniqueFd> page_fds;
  std::vector<uint64_t> page_bytes;
};

}  // namespace tier::client::gpu

#endif  // TIER_CLIENT_GPU_DEVICE_ALLOCATION_H_
