// What the GPU copy engine (engine/stream_engine.h) needs from CUDA or HIP: GpuRuntime, a small
// interface implemented once for both (engine/portable_runtime.h, compiled per runtime) and by
// the tests' fake runtime (tests/gpu/stream_engine_fixture.h). No GPU header is included here.
#ifndef TIER_ENGINE_GPU_RUNTIME_H_
#define TIER_ENGINE_GPU_RUNTIME_H_

#include <cstdint>
#include <cstring>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/copy_engine.h"

namespace tier::engine {

using GpuStream = void*;  // cudaStream_t / hipStream_t

// Client memory opened in the daemon by the runtime; destroying it unmaps it.
class DeviceMapping {
 public:
  virtual ~DeviceMapping() = default;
  virtual char* base() const = 0;  // device address in the daemon
  virtual uint64_t bytes() const = 0;
  virtual int device() const = 0;  // the daemon's ordinal
  // ImportedBuffer::Extend (VMM segments only).
  virtual absl::Status Extend(BufferExtension&) {
    return absl::FailedPreconditionError(
        "only an expandable-segment registration (kCudaVmmSegment) can be extended");
  }
};

struct MappedHost {
  void* host = nullptr;     // CPU address
  uint64_t device_addr = 0;  // the same memory as the GPU addresses it (stream memory ops)
};

// One host-to-host copy for a runtime's host callback (GpuRuntime::HostCopyAsync): Run(task)
// copies and deletes it.
struct HostCopyTask {
  char* dst;
  const char* src;
  uint64_t len;
  static void Run(void* task) {
    auto* copy = static_cast<HostCopyTask*>(task);
    std::memcpy(copy->dst, copy->src, copy->len);
    delete copy;
  }
};

// What the core needs from CUDA or HIP. Calls that take a device make it current first. Each
// call's class (common/thread_role.h) is in its comment.
class GpuRuntime {
 public:
  virtual ~GpuRuntime() = default;
  virtual absl::string_view name() const = 0;
  virtual absl::Status SetDevice(int device) = 0;                                   // enqueue
  virtual absl::StatusOr<GpuStream> CreateStream(int device, bool high_priority) = 0;  // setup
  virtual void DestroyStream(int device, GpuStream stream) = 0;                      // release
  // true: everything queued on the stream has finished; false: still running; error: it failed.
  virtual absl::StatusOr<bool> StreamDone(int device, GpuStream stream) = 0;         // enqueue
  // Stream memory operations on a GPU address (device memory or mapped host memory). The wait
  // passes once *addr >= value (cyclic on CUDA: tickets stay below kMaxTicket). Enqueue.
  virtual absl::Status WaitValue64(GpuStream stream, uint64_t addr, uint64_t value) = 0;
  virtual absl::Status WriteValue64(GpuStream stream, uint64_t addr, uint64_t value) = 0;
  virtual absl::Status CopyAsync(GpuStream stream, Direction direction, char* client, char* pool,
                                 uint64_t len) = 0;  // enqueue
  // Several copies of one direction in one call, in stream order after what was queued before
  // (the copies of one call may run in any order among themselves; they never overlap). Enqueue.
  // The default issues one CopyAsync each; CUDA >= 12.8 issues them with one cudaMemcpyBatchAsync.
  struct CopyOp {
    char* client;
    char* pool;
    uint64_t len;
  };
  virtual absl::Status CopyBatchAsync(GpuStream stream, Direction direction,
                                      absl::Span<const CopyOp> ops) {
    for (const CopyOp& op : ops) {
      if (absl::Status s = CopyAsync(stream, direction, op.client, op.pool, op.len); !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }
  // A copy between two host buffers, in stream order, that does not block the caller: a memcpy
  // run by the runtime's host-function thread when the stream reaches it. (A host-to-host
  // cudaMemcpyAsync is synchronous with the calling thread: it would wait there for everything
  // queued before it, ticket waits included.)
  // (Runtimes hand a HostCopyTask to their host-callback API.) Enqueue.
  virtual absl::Status HostCopyAsync(GpuStream stream, char* dst, const char* src,
                                     uint64_t len) = 0;
  // Pinned host memory every device can address (portable, mapped).
  virtual absl::StatusOr<MappedHost> AllocMappedHost(uint64_t bytes) = 0;  // setup
  virtual void FreeMappedHost(void* host) = 0;                            // release
  virtual absl::Status RegisterHost(char* base, uint64_t bytes) = 0;      // setup
  // Pins host memory for every GPU and maps it into their address space (portable, mapped), so
  // streams can write it (a session's ticket page: the done counters). Undone by UnregisterHost.
  virtual absl::Status RegisterMappedHost(char* base, uint64_t bytes) = 0;  // setup
  // The address at which `device`'s streams reach `host`, registered by RegisterMappedHost.
  virtual absl::StatusOr<uint64_t> HostDeviceAddress(int device, char* host) = 0;  // setup
  virtual void UnregisterHost(char* base) = 0;                            // release
  // The daemon's GPU of import.device_uuid (the client named it as its GPU import.device);
  // FAILED_PRECONDITION when tierd does not see it.
  virtual absl::StatusOr<int> FindDevice(const BufferImport& import) = 0;  // setup
  // Opens client memory: kCudaIpc, kCudaVmmFd, kCudaVmmPages, kCudaVmmSegment. Validates device
  // and size.
  // Setup; destroying the DeviceMapping is a release call.
  virtual absl::StatusOr<std::unique_ptr<DeviceMapping>> Open(BufferImport& import) = 0;
};

}  // namespace tier::engine

#endif  // TIER_ENGINE_GPU_RUNTIME_H_
