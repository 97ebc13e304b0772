// The client library's GPU layer (libtierclient links it as tier_client_gpu): exporting device
// allocations for registration, and the per-GPU tickets and done counters (in the session's
// ticket page) that order the client's streams against the daemon's copy streams (completion
// reaches the client's streams on the GPU, with no host round trip).
//
// Runtime neutral: no CUDA or HIP type appears here; streams are passed as void* (cudaStream_t or
// hipStream_t; nullptr = the legacy default stream of the page's GPU). Written once for CUDA and
// HIP (client_gpu_runtime.cc over gpu/runtime_names.h, with client_gpu_cuda.cc or
// client_gpu_hip.cc for what only one has), or for nothing (client_gpu_none.cc: UNIMPLEMENTED).
// The tickets are written once (device_sync.cc) over a small runtime interface (sync_runtime.h).
//
// The protocol this layer keeps with the daemon's engines (tickets, the ticket page, why it
// cannot deadlock, a dead peer) is in gpu/ticket_protocol.h, which both sides include.
#ifndef TIER_CLIENT_GPU_CLIENT_GPU_H_
#define TIER_CLIENT_GPU_CLIENT_GPU_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/gpu/device_allocation.h"
#include "client/gpu/device_sync.h"
#include "common/unique_fd.h"
#include "gpu/ticket_protocol.h"
#include "tier/ring.h"
#include "tier/session_wire.h"

namespace tier::client::gpu {

using ::tier::gpu::kMaxTicket;
using ::tier::gpu::kReleasedTicket;

// Number of GPUs this process sees; 0 when there is no device or no driver (never an error then).
int GpuDeviceCount();

// The PCI bus id of this process's GPU `device` ("0000:3B:00.0"), as the runtime spells it.
absl::StatusOr<std::string> GpuPciBusId(int device);

// Finds the allocation holding `device_ptr` (any pointer inside it) and exports it:
// - VMM memory (cuMemCreate, e.g. PyTorch expandable segments): the physical allocation mapped at
//   the pointer, as a POSIX fd (kCudaVmmFd). It must have been created with
//   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR among its requested handle types. Note: a VMM range
//   made of several physical allocations is several buffers; a tensor crossing one of their
//   boundaries cannot be named as one (buffer, offset, len).
// - cudaMalloc memory: a legacy IPC handle of the allocation base (kCudaIpc).
// Errors: INVALID_ARGUMENT for host, managed or unknown pointers and for memory that cannot be
// exported (e.g. from a stream-ordered pool); UNIMPLEMENTED without a GPU runtime.
absl::StatusOr<DeviceAllocation> ExportDeviceAllocation(const void* device_ptr);

// A cheap identity of the physical allocation mapped at `device_ptr` (CUDA's memory block id,
// unique for the life of the process, so freed memory and memory mapped anew at the same address
// get new ones; the buffer id where the driver lacks it); 0 where there is none or the runtime
// cannot tell. Lets the client reuse a registration without exporting again.
uint64_t AllocationId(const void* device_ptr);


// The session's ticket page registered with the GPU runtime (pinned and mapped for every GPU), so
// that this process's streams can write it; unregistered on destruction. Create it before the
// session's first DeviceSync and destroy it after the last (after the daemon stopped reading).
class TicketPageRegistration {
 public:
  virtual ~TicketPageRegistration() = default;
};
absl::StatusOr<std::unique_ptr<TicketPageRegistration>> RegisterTicketPage(ring::TicketPage* page);

// Creates `device`'s ticket stream, which raises the tickets in `slot` (this GPU's slot of a
// registered ticket page, whose done counters the daemon writes). Fails with
// FAILED_PRECONDITION if the GPU lacks 64-bit stream memory operations.
absl::StatusOr<std::unique_ptr<DeviceSync>> CreateDeviceSync(int device, ring::TicketSlot* slot);

}  // namespace tier::client::gpu

#endif  // TIER_CLIENT_GPU_CLIENT_GPU_H_
