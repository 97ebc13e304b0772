// The client's side of the ticket protocol (gpu/ticket_protocol.h) on one GPU: the session's
// semaphore page there and the ticket stream that raises its tickets. Written once, over
// SyncRuntime (sync_runtime.h), for CUDA and HIP alike; a fake runtime tests it without a GPU.
#ifndef TIER_CLIENT_GPU_DEVICE_SYNC_H_
#define TIER_CLIENT_GPU_DEVICE_SYNC_H_

#include <array>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/gpu/device_allocation.h"
#include "client/gpu/sync_runtime.h"
#include "common/mutex.h"
#include "tier/ring.h"

namespace tier::client::gpu {

// Thread-safe.
class DeviceSync {
 public:
  // Allocates and zeroes a semaphore page on `device` and creates its ticket stream, which raises
  // the tickets in `slot` (this GPU's slot of a registered ticket page). FAILED_PRECONDITION if
  // the GPU lacks 64-bit stream memory operations.
  static absl::StatusOr<std::unique_ptr<DeviceSync>> Create(std::unique_ptr<SyncRuntime> runtime,
                                                            int device, ring::TicketSlot* slot);
  // Frees the page: only after the session closed, or the daemon is known dead and
  // ReleaseWaiters() returned.
  ~DeviceSync();
  DeviceSync(const DeviceSync&) = delete;
  DeviceSync& operator=(const DeviceSync&) = delete;

  int device() const { return device_; }

  // The page, for registration with the daemon (kind kCudaSemaphores).
  absl::StatusOr<DeviceAllocation> Export();

  // Takes the next offload ticket k and enqueues, on the ticket stream, a wait for the work
  // enqueued so far on each producer stream (none given: the legacy default stream), then
  // produced = k. Push job k to the ring after this returns. On error no ticket was taken.
  absl::StatusOr<uint64_t> TicketOffload(absl::Span<void* const> producer_streams);

  // Takes the next reload ticket k and enqueues, on the ticket stream, a wait for the work
  // enqueued so far on `consumer_stream` (call it after the destination was allocated on that
  // stream), then reload_ready = k. Then call WaitReloadDone(consumer_stream, k) and push job k.
  // On error no ticket was taken.
  absl::StatusOr<uint64_t> TicketReload(void* consumer_stream);

  // Makes `stream` wait (on the GPU) until reload k has been copied into its destination.
  absl::Status WaitReloadDone(void* stream, uint64_t ticket);

  // Makes `stream` wait (on the GPU) until offload k has been copied out of its source: a stream
  // that frees or overwrites the source calls this first.
  absl::Status WaitOffloadDone(void* stream, uint64_t ticket);

  // The daemon is gone: sets offload_done and reload_done to kReleasedTicket from a fresh stream
  // (retrying on other fresh streams if one is stuck behind a blocked hardware queue) and waits
  // until the write has landed, so no stream of this process waits for the daemon any more.
  // Later ticket calls fail with UNAVAILABLE. DEADLINE_EXCEEDED if no write landed within ~2 s.
  absl::Status ReleaseWaiters();

  // The four counters as they are now (the done counters by a synchronous read on a private
  // stream): produced, offload_done, reload_ready, reload_done. For tests and diagnostics.
  absl::StatusOr<std::array<uint64_t, 4>> ReadCounters();

 private:
  DeviceSync(std::unique_ptr<SyncRuntime> runtime, int device, ring::TicketSlot* slot);
  absl::Status Init();
  uint64_t Addr(uint64_t offset) const;
  absl::Status FollowStream(void* stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WaitOn(void* stream, uint64_t offset, uint64_t ticket);
  // One attempt of ReleaseWaiters: true once the writes landed, false if the stream stayed
  // blocked for the attempt's time.
  absl::StatusOr<bool> ReleaseFrom(SyncRuntime::Stream stream);

  const std::unique_ptr<SyncRuntime> runtime_;
  const int device_;
  ring::TicketSlot* const slot_;
  uint64_t produced_addr_ = 0;
  uint64_t reload_ready_addr_ = 0;
  void* page_ = nullptr;
  SyncRuntime::Stream ticket_ = nullptr;
  SyncRuntime::Stream read_ = nullptr;
  SyncRuntime::Event event_ = nullptr;

  Mutex mu_;  // ticket order = order of the writes on the ticket stream
  uint64_t next_offload_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_reload_ ABSL_GUARDED_BY(mu_) = 1;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tier::client::gpu

#endif  // TIER_CLIENT_GPU_DEVICE_SYNC_H_
