// The GPU copy engine's runtime-neutral core, shared by CUDA (cuda_engine.cc) and HIP
// (hip_engine.cc). It holds what is the same on both: per-session streams, ticket ordering,
// completion detection, delay injection, abandoning sessions. The runtime behind it is reached
// only through GpuRuntime, so this header and stream_engine.cc include no GPU header.
//
// Per session and per GPU the engine keeps two lanes (D2H = kToPool, H2D = kFromPool), each an
// own non-blocking stream, so a client that never writes its tickets stalls only its own lanes.
// For job k of a lane the stream runs, with no host synchronization between jobs:
//   wait(semaphore[ready] >= k)                 the client's ticket (skipped when sync == 0)
//   [write(reached = seq); wait(gate >= seq)]   delay injection only (see GpuEngineOptions)
//   [wait(writer lane completed >= s)]          H2D only: a D2H copy into the same pool bytes
//   copy
//   write(semaphore[done] = k)                  releases the client's streams (sync != 0)
//   write(completed = seq)                      host-mapped word the poller thread reads
// `seq` is the lane's own job counter. Completion detection: one poller thread reads each busy
// lane's `completed` word (pinned host memory written by the stream: no CUDA call, no driver
// lock, a few hundred ns after the GPU wrote it), runs the callbacks of jobs up to it, spins
// briefly after progress and then backs off to short sleeps. A lane stuck for watchdog_ms has its
// stream queried, which turns a stream error into failed jobs (and an idle stream whose word did
// not move into completed jobs, logged: a safety net, not the normal path).
#ifndef TIER_GPU_STREAM_ENGINE_H_
#define TIER_GPU_STREAM_ENGINE_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gpu/copy_engine.h"

namespace tier::gpu {

using GpuStream = void*;  // cudaStream_t / hipStream_t

// Client memory opened in the daemon by the runtime; destroying it unmaps it.
class DeviceMapping {
 public:
  virtual ~DeviceMapping() = default;
  virtual char* base() const = 0;  // device address in the daemon
  virtual uint64_t bytes() const = 0;
  virtual int device() const = 0;  // the daemon's ordinal
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
  static void Run(void* task);
};

// What the core needs from CUDA or HIP. Calls that take a device make it current first.
class GpuRuntime {
 public:
  virtual ~GpuRuntime() = default;
  virtual absl::string_view name() const = 0;
  virtual absl::Status SetDevice(int device) = 0;
  virtual absl::StatusOr<GpuStream> CreateStream(int device, bool high_priority) = 0;
  virtual void DestroyStream(int device, GpuStream stream) = 0;
  // true: everything queued on the stream has finished; false: still running; error: it failed.
  virtual absl::StatusOr<bool> StreamDone(int device, GpuStream stream) = 0;
  // Stream memory operations on a GPU address (device memory or mapped host memory). The wait
  // passes once *addr >= value (cyclic on CUDA: tickets stay below kMaxTicket).
  virtual absl::Status WaitValue64(GpuStream stream, uint64_t addr, uint64_t value) = 0;
  virtual absl::Status WriteValue64(GpuStream stream, uint64_t addr, uint64_t value) = 0;
  virtual absl::Status CopyAsync(GpuStream stream, Direction direction, char* client, char* pool,
                                 uint64_t len) = 0;
  // A copy between two host buffers, in stream order, that does not block the caller: a memcpy
  // run by the runtime's host-function thread when the stream reaches it. (A host-to-host
  // cudaMemcpyAsync is synchronous with the calling thread: it would wait there for everything
  // queued before it, ticket waits included.)
  // (Runtimes hand a HostCopyTask to their host-callback API.)
  virtual absl::Status HostCopyAsync(GpuStream stream, char* dst, const char* src,
                                     uint64_t len) = 0;
  // Pinned host memory every device can address (portable, mapped).
  virtual absl::StatusOr<MappedHost> AllocMappedHost(uint64_t bytes) = 0;
  virtual void FreeMappedHost(void* host) = 0;
  virtual absl::Status RegisterHost(char* base, uint64_t bytes) = 0;
  virtual void UnregisterHost(char* base) = 0;
  // Opens client memory: kCudaIpc, kCudaVmmFd, kCudaSemaphores. Validates device and size.
  virtual absl::StatusOr<std::unique_ptr<DeviceMapping>> Open(BufferImport& import) = 0;
};

// The engine over `runtime` (name() is the runtime's).
std::unique_ptr<CopyEngine> MakeStreamEngine(std::unique_ptr<GpuRuntime> runtime,
                                             const GpuEngineOptions& options);

}  // namespace tier::gpu

#endif  // TIER_GPU_STREAM_ENGINE_H_
