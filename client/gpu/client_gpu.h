// The client library's GPU layer (libtierclient links it as tier_client_gpu): exporting device
// allocations for registration, and the per-GPU tickets and semaphore page that order the client's
// streams against the daemon's copy streams (completion reaches the client's streams on the GPU,
// with no host round trip).
//
// Runtime neutral: no CUDA or HIP type appears here; streams are passed as void* (cudaStream_t or
// hipStream_t; nullptr = the legacy default stream of the page's GPU). Built for CUDA
// (client_gpu_cuda.cc), HIP (client_gpu_hip.cc) or nothing (client_gpu_none.cc: UNIMPLEMENTED).
//
// The protocol this layer keeps with the daemon's engines (tickets, the semaphore page, why it
// cannot deadlock, a dead peer) is in gpu/ticket_protocol.h, which both sides include.
#ifndef TIER_CLIENT_GPU_CLIENT_GPU_H_
#define TIER_CLIENT_GPU_CLIENT_GPU_H_

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/unique_fd.h"
#include "gpu/ticket_protocol.h"
#include "tier/ring.h"
#include "tier/session_wire.h"

namespace tier::client::gpu {

using ::tier::gpu::kMaxTicket;
using ::tier::gpu::kOffloadDoneOffset;
using ::tier::gpu::kReleasedTicket;
using ::tier::gpu::kReloadDoneOffset;
using ::tier::gpu::kSemaphoreAllocBytes;
using ::tier::gpu::kSemaphorePageBytes;

// Number of GPUs this process sees; 0 when there is no device or no driver (never an error then).
int GpuDeviceCount();

// A device allocation described for registration (wire::RegisterBuffer + an optional fd).
struct DeviceAllocation {
  wire::BufferKind kind = wire::BufferKind::kCudaIpc;  // kCudaIpc, kCudaVmmFd or kCudaSemaphores
  int device = -1;                                      // this process's ordinal
  std::array<uint8_t, 16> device_uuid{};                // the GPU's UUID (cudaDeviceProp::uuid)
  uint64_t base = 0;                                    // device address of the allocation
  uint64_t bytes = 0;                                   // its size
  uint64_t offset = 0;                                  // the queried pointer's offset in it
  std::array<uint8_t, 64> ipc_handle{};                 // kCudaIpc, kCudaSemaphores
  UniqueFd fd;                                          // kCudaVmmFd: POSIX fd shareable handle
  // kCudaVmmPages: one fd per page, in address order; their sizes are also packed into
  // ipc_handle as little-endian uint64 (the wire format).
  std::vector<UniqueFd> page_fds;
  std::vector<uint64_t> page_bytes;
};

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

// ExportDeviceAllocation for a range: the allocation holding `device_ptr`, which must also hold
// `len` bytes from it. A range over VMM pages mapped side by side (PyTorch expandable segments)
// becomes one kCudaVmmPages allocation of up to wire::kMaxVmmPages pages. OUT_OF_RANGE when the
// range crosses the end of a cudaMalloc allocation, runs into unmapped or non-exportable memory,
// or needs more pages. len == 0 is ExportDeviceAllocation.
absl::StatusOr<DeviceAllocation> ExportDeviceRange(const void* device_ptr, uint64_t len);

// The semaphore page of one session on one GPU, with the ticket stream. Thread-safe.
class DeviceSync {
 public:
  virtual ~DeviceSync() = default;
  virtual int device() const = 0;

  // The page, for registration with the daemon (kind kCudaSemaphores).
  virtual absl::StatusOr<DeviceAllocation> Export() = 0;

  // Takes the next offload ticket k and enqueues, on the ticket stream, a wait for the work
  // enqueued so far on each producer stream (none given: the legacy default stream), then
  // produced = k. Push job k to the ring after this returns. On error no ticket was taken.
  virtual absl::StatusOr<uint64_t> TicketOffload(absl::Span<void* const> producer_streams) = 0;

  // Takes the next reload ticket k and enqueues, on the ticket stream, a wait for the work
  // enqueued so far on `consumer_stream` (call it after the destination was allocated on that
  // stream), then reload_ready = k. Then call WaitReloadDone(consumer_stream, k) and push job k.
  // On error no ticket was taken.
  virtual absl::StatusOr<uint64_t> TicketReload(void* consumer_stream) = 0;

  // Makes `stream` wait (on the GPU) until reload k has been copied into its destination.
  virtual absl::Status WaitReloadDone(void* stream, uint64_t ticket) = 0;

  // Makes `stream` wait (on the GPU) until offload k has been copied out of its source: a stream
  // that frees or overwrites the source calls this first.
  virtual absl::Status WaitOffloadDone(void* stream, uint64_t ticket) = 0;

  // The daemon is gone: sets offload_done and reload_done to kReleasedTicket from a fresh stream
  // (retrying on other fresh streams if one is stuck behind a blocked hardware queue) and waits
  // until the write has landed, so no stream of this process waits for the daemon any more.
  // Later ticket calls fail with UNAVAILABLE. DEADLINE_EXCEEDED if no write landed within ~2 s.
  virtual absl::Status ReleaseWaiters() = 0;

  // The four counters as they are now (the done counters by a synchronous read on a private
  // stream): produced, offload_done, reload_ready, reload_done. For tests and diagnostics.
  virtual absl::StatusOr<std::array<uint64_t, 4>> ReadCounters() = 0;
};

// The session's ticket page registered with the GPU runtime (pinned and mapped for every GPU), so
// that this process's streams can write it; unregistered on destruction. Create it before the
// session's first DeviceSync and destroy it after the last (after the daemon stopped reading).
class TicketPageRegistration {
 public:
  virtual ~TicketPageRegistration() = default;
};
absl::StatusOr<std::unique_ptr<TicketPageRegistration>> RegisterTicketPage(ring::TicketPage* page);

// Allocates and zeroes a semaphore page on `device` and creates its ticket stream, which raises
// the tickets in `slot` (this GPU's slot of a registered ticket page). Fails with
// FAILED_PRECONDITION if the GPU lacks 64-bit stream memory operations.
absl::StatusOr<std::unique_ptr<DeviceSync>> CreateDeviceSync(int device, ring::TicketSlot* slot);

}  // namespace tier::client::gpu

#endif  // TIER_CLIENT_GPU_CLIENT_GPU_H_
