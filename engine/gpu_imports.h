// Client memory the GPU engine opens for a session (CopyEngine::Import, on the session listener:
// setup calls only): GPU memory (IPC handles, VMM pages, VMM segments that grow by Extend), a
// client's host memory (pinned memfds), and the binding of a ticket slot (kCudaSemaphores),
// which registers the session's ticket page with the runtime (TicketPagePin). Memory registered
// on a GPU makes the session's two lanes for it first, so that Submit never creates a stream.
// Every mapping is closed on the release thread.
#ifndef TIER_ENGINE_GPU_IMPORTS_H_
#define TIER_ENGINE_GPU_IMPORTS_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/copy_engine.h"
#include "engine/gpu_runtime.h"
#include "engine/gpu_session.h"
#include "engine/gpu_set.h"
#include "engine/lane.h"
#include "engine/lane_words.h"
#include "engine/release_thread.h"

namespace tier::engine {

class GpuImporter {
 public:
  GpuImporter(GpuRuntime& runtime, std::shared_ptr<ReleaseThread> releaser, HostWordPool& words,
              GpuSet& gpus)
      : runtime_(runtime), releaser_(std::move(releaser)), words_(words), gpus_(gpus) {}

  absl::StatusOr<std::unique_ptr<ImportedBuffer>> Import(GpuSession& session,
                                                         BufferImport import);

  uint64_t live_buffers() const { return live_buffers_.load(); }
  uint64_t live_lanes() const { return live_lanes_.load(); }

 private:
  absl::StatusOr<std::unique_ptr<ImportedBuffer>> ImportDevice(GpuSession& session,
                                                               BufferImport& import);
  absl::StatusOr<std::unique_ptr<ImportedBuffer>> ImportHost(GpuSession& session,
                                                             BufferImport& import);
  absl::StatusOr<std::unique_ptr<ImportedBuffer>> BindTicketSlot(SessionState& state,
                                                                 const BufferImport& import);
  absl::StatusOr<std::shared_ptr<TicketPagePin>> PinTicketPage(SessionState& state);
  // The session's two lanes on `device`, made if missing (a stream each).
  absl::Status EnsureLanes(SessionState& state, int device);
  absl::Status EnsureLane(SessionState& state, int device, Direction direction);
  // The mapping as a buffer of the session, entered in its range map.
  std::unique_ptr<ImportedBuffer> AddBuffer(GpuSession& session,
                                            std::unique_ptr<DeviceMapping> mapping, bool host);
  // Closes a mapping on the release thread.
  void Release(std::unique_ptr<DeviceMapping> mapping);

  GpuRuntime& runtime_;
  const std::shared_ptr<ReleaseThread> releaser_;
  HostWordPool& words_;
  GpuSet& gpus_;
  std::atomic<uint64_t> live_buffers_{0};
  std::atomic<uint64_t> live_lanes_{0};
};

}  // namespace tier::engine

#endif  // TIER_ENGINE_GPU_IMPORTS_H_
