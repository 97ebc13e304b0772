// The client's side of the ticket protocol (gpu/ticket_protocol.h) on one GPU: that GPU's slot of
// the session's ticket page (tickets raised by its ticket stream, done counters written by the
// daemon) and the ticket stream. Written once, over SyncRuntime (sync_runtime.h), for CUDA and
// HIP alike; a fake runtime tests it without a GPU.
#ifndef TIER_CLIENT_GPU_DEVICE_SYNC_H_
#define TIER_CLIENT_GPU_DEVICE_SYNC_H_

#include <array>
#include <atomic>
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
  // Creates the ticket stream of `device`, which raises the tickets in `slot` (this GPU's slot of
  // the session's ticket page, registered with the runtime: gpu::RegisterTicketPage), and whose
  // consumers wait on the slot's done counters. FAILED_PRECONDITION if the GPU lacks 64-bit
  // stream memory operations.
  static absl::StatusOr<std::unique_ptr<DeviceSync>> Create(std::unique_ptr<SyncRuntime> runtime,
                                                            int device, ring::TicketSlot* slot);
  ~DeviceSync();
  DeviceSync(const DeviceSync&) = delete;
  DeviceSync& operator=(const DeviceSync&) = delete;

  int device() const { return device_; }

  // What binds the slot to this GPU in the daemon (kind kCudaSemaphores: no memory, the GPU's
  // UUID and ordinal).
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

  // The daemon is gone: stores kReleasedTicket into both done counters, so every wait of this
  // process's streams on the daemon passes, and later ticket calls fail with UNAVAILABLE. Plain
  // CPU stores into host memory, no runtime call and no lock but this object's: it cannot meet a
  // driver lock held by a launch stuck behind one of those waits. Call it again for a while
  // after the death: a done write the dying daemon had queued may land after the first store.
  void ReleaseWaiters();

  // The four counters as they are now: produced, offload_done, reload_ready, reload_done. For
  // tests and diagnostics.
  std::array<uint64_t, 4> ReadCounters() const;

 private:
  DeviceSync(std::unique_ptr<SyncRuntime> runtime, int device, ring::TicketSlot* slot);
  absl::Status Init();
  absl::Status FollowStream(void* stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WaitOn(void* stream, uint64_t address, uint64_t ticket);

  const std::unique_ptr<SyncRuntime> runtime_;
  const int device_;
  ring::TicketSlot* const slot_;
  // The slot's words as this GPU's streams address them.
  uint64_t produced_addr_ = 0;
  uint64_t reload_ready_addr_ = 0;
  uint64_t offload_done_addr_ = 0;
  uint64_t reload_done_addr_ = 0;
  SyncRuntime::Stream ticket_ = nullptr;
  SyncRuntime::Event event_ = nullptr;

  Mutex mu_;  // ticket order = order of the writes on the ticket stream
  uint64_t next_offload_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_reload_ ABSL_GUARDED_BY(mu_) = 1;
  // Read without mu_ by ReleaseWaiters' callers' later ticket calls; set under it.
  std::atomic<bool> released_{false};
};

}  // namespace tier::client::gpu

#endif  // TIER_CLIENT_GPU_DEVICE_SYNC_H_
