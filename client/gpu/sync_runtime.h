// The GPU runtime operations the ticket protocol needs on the client side, as one small
// interface: sync_runtime_gpu.cc implements it once for CUDA and HIP (gpu/runtime_names.h), and
// DeviceSync (device_sync.h) is written once over it, so gpu/ticket_protocol.h's deadlock-freedom
// argument is about one piece of code. Tests drive DeviceSync through a scripted fake.
//
// Streams and events are opaque (cudaStream_t / hipStream_t, cudaEvent_t / hipEvent_t). A null
// Stream is the legacy default stream of the current GPU. Device addresses are integers.
// Every call acts on the current GPU: DeviceSync makes its GPU current first (DeviceScope).
#ifndef TIER_CLIENT_GPU_SYNC_RUNTIME_H_
#define TIER_CLIENT_GPU_SYNC_RUNTIME_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tier::client::gpu {

class SyncRuntime {
 public:
  using Stream = void*;
  using Event = void*;

  virtual ~SyncRuntime() = default;

  // Makes `device` current and returns the device that was (-1: it already was `device`).
  virtual absl::StatusOr<int> SwapDevice(int device) const = 0;
  // Makes `previous` (from SwapDevice, >= 0) current again.
  virtual void RestoreDevice(int previous) const = 0;

  // FAILED_PRECONDITION unless `device` can write and wait on 64-bit words from its streams.
  virtual absl::Status CheckStreamMemOps(int device) const = 0;
  virtual absl::StatusOr<std::array<uint8_t, 16>> DeviceUuid(int device) const = 0;

  // The address at which the current GPU's streams reach registered, mapped host memory.
  virtual absl::StatusOr<uint64_t> HostDevicePointer(void* host) const = 0;

  // A non-blocking stream.
  virtual absl::StatusOr<Stream> CreateStream() const = 0;
  // Returns at once; a stream with queued work is freed once that work ran.
  virtual void DestroyStream(Stream stream) const = 0;
  virtual absl::StatusOr<Event> CreateEvent() const = 0;
  virtual void DestroyEvent(Event event) const = 0;

  // Captures the work queued so far on `stream`. INVALID_ARGUMENT (the runtime's error cleared)
  // when `stream` is no live stream of the current GPU.
  virtual absl::Status RecordEvent(Event event, Stream stream) const = 0;
  virtual absl::Status StreamWaitEvent(Stream stream, Event event) const = 0;

  // Stream memory operations on 64-bit words.
  virtual absl::Status WriteValue64(Stream stream, uint64_t address, uint64_t value) const = 0;
  // `stream` waits until the word at `address` is >= `value` (the runtime's cyclic compare).
  virtual absl::Status WaitValue64(Stream stream, uint64_t address, uint64_t value) const = 0;
};

// Makes a GPU current for a scope and restores the caller's after.
class DeviceScope {
 public:
  DeviceScope(const SyncRuntime& runtime, int device) : runtime_(runtime) {
    absl::StatusOr<int> previous = runtime.SwapDevice(device);
    if (previous.ok()) {
      previous_ = *previous;
    } else {
      status_ = previous.status();
    }
  }
  ~DeviceScope() {
    if (previous_ >= 0) runtime_.RestoreDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  const SyncRuntime& runtime_;
  int previous_ = -1;
  absl::Status status_;
};

// The runtime this library was built for; UNIMPLEMENTED in a build without a GPU runtime.
absl::StatusOr<std::unique_ptr<SyncRuntime>> NewSyncRuntime();

}  // namespace tier::client::gpu

#endif  // TIER_CLIENT_GPU_SYNC_RUNTIME_H_
