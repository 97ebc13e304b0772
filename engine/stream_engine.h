// The GPU copy engine's runtime-neutral core, shared by CUDA (cuda_engine.cc) and HIP
// (hip_engine.cc). It holds what is the same on both: per-session lanes, ticket ordering, issue
// and completion, delay injection, abandoning sessions. The runtime behind it is reached only
// through GpuRuntime, so this header and stream_engine.cc include no GPU header.
//
// Per session and per GPU the engine keeps two lanes (D2H = kToPool, H2D = kFromPool), each an
// own non-blocking stream. One worker thread per GPU issues and completes the jobs of that GPU's
// lanes; Submit (the ring poller) only queues. Job k of a lane is issued once the client's ticket
// for it is in the session's ticket page (tier/ring.h: host memory the client's ticket stream
// writes after the job's producers, or its consumer's allocation point), and then, with no host
// synchronization between jobs, the lane's stream runs
//   [wait(writer lane completed >= s)]   H2D only: a D2H copy into the same pool bytes, issued
//   copy                                 (fed reloads: one copy per chunk, issued as chunks land)
//   write(ticket page[done] = k)         host memory shared with the client: releases its streams
//   write(completed = seq)               host-mapped word the worker reads for completion
// `seq` is the lane's own job counter. A batch (the jobs of one ticket, CopyJob::batch_size) is
// issued once all of its jobs arrived: its copies in one CopyBatchAsync, then one done write. The
// completed write is made once per pass of the worker over the lane, for the last job issued in
// it (the word only grows, so it completes every job up to it).
//
// Sharing a GPU's link: the copy engine serves streams in the order copies were issued, so a
// session that queues 512 MiB ahead makes another session's 1 MiB job wait for all of it
// (measured: 3% of its fair share). While another lane of the GPU and direction has work (or had
// in the last 2 ms), a lane keeps at most GpuEngineOptions::lane_window_bytes issued and not
// completed, issues larger copies in chunks of a quarter of it, and writes `completed` after
// each piece so the window reopens as pieces land. A lane alone is not limited.
//
// WHY TIERD CANNOT DEADLOCK ON THE GPU (the rule, checked by the tests). A tierd stream waits on
// the GPU only for copies tierd has already issued (the pool-write wait above). Nothing queued on
// a tierd stream waits for a client, for a client's ticket, or for a word a tierd host thread is
// yet to write. So everything on tierd's streams finishes on its own in bounded time, whatever
// any client or tierd thread does. That matters because some runtime calls synchronize
// implicitly: closing an IPC mapping (cudaIpcCloseMemHandle), unmapping VMM memory, unpinning
// host memory wait until the device's queued work is done, and meanwhile hold a driver lock that
// every other runtime call of the process needs (measured: tests/gpu/cuda_blocking_probe.cc).
// Before, copies waited on the GPU for client tickets and delay-injection gates; a session's end
// closed its IPC mappings, which waited for those copies while holding the driver lock; the ring
// poller (issuing the reloads the clients' tickets waited behind) and the poller (opening the
// gates) blocked on that lock: a cycle, and every client hung in registration (issue 10). With
// the rule, such a call waits at most for copies already running.
// Which thread makes which runtime call (gpu/thread_role.h, MayCall): device workers only
// enqueue (copies, value writes, queries); setup calls (streams, opening client memory, pinning)
// come from registration, outside any lock the job path takes; release calls (closing client
// memory, unpinning, destroying streams) run on the engine's release thread only; the ring poller
// and the spill I/O threads make none. A blocked runtime call then delays only what it is for.
//
// Completion detection: the worker reads each busy lane's `completed` word (pinned host memory
// written by the stream: no runtime call, no driver lock), runs the callbacks of jobs up to it,
// spins briefly after progress and then backs off to short sleeps while its lanes have work. A
// lane whose issued jobs make no progress for watchdog_ms has its stream queried, which turns a
// stream error into failed jobs. A lane that waits lane_wait_warn_ms for a client's ticket logs
// it once; Lanes() reports every lane's wait (tierctl clients).
#ifndef TIER_ENGINE_STREAM_ENGINE_H_
#define TIER_ENGINE_STREAM_ENGINE_H_

#include <cstdint>
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
  static void Run(void* task);
};

// What the core needs from CUDA or HIP. Calls that take a device make it current first. Each
// call's class (gpu/thread_role.h) is in its comment.
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

// The engine over `runtime` (name() is the runtime's).
std::unique_ptr<CopyEngine> MakeStreamEngine(std::unique_ptr<GpuRuntime> runtime,
                                             const GpuEngineOptions& options);

}  // namespace tier::engine

#endif  // TIER_ENGINE_STREAM_ENGINE_H_
