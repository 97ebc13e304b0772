// The one interface between the daemon and whatever moves bytes: the host engine (memcpy on worker
// threads; no GPU needed, what CI runs), CUDA, or HIP. The daemon never knows which one runs.
//
// The engine imports client memory (a memfd, a CUDA IPC handle, a VMM fd) once per registration,
// pins the host pool once at start, and runs copy jobs between imported client memory and pool
// extents. Jobs of one direction run in submission order (see CopyJob); completion is reported once
// per job through its `done` callback, on an engine thread.
#ifndef TIER_ENGINE_COPY_ENGINE_H_
#define TIER_ENGINE_COPY_ENGINE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>


#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/unique_fd.h"
#include "engine/source_feed.h"
#include "tier/ring.h"
#include "tier/session_wire.h"

namespace tier::engine {

// Pages for ImportedBuffer::Extend (checked by daemon/sessions/segment_request.h; the engine checks them
// against the buffer).
struct BufferExtension {
  uint64_t offset = 0;      // where the first page goes: must be the buffer's bytes()
  uint64_t page_bytes = 0;  // every page's size: must be the segment's
  std::vector<UniqueFd> page_fds;  // in address order
};

// Client memory opened in the daemon. Destroying it closes the mapping / IPC handle.
class ImportedBuffer {
 public:
  virtual ~ImportedBuffer() = default;
  virtual char* base() const = 0;  // host pointer (host engine) or device pointer (GPU engines)
  virtual uint64_t bytes() const = 0;
  // GPU engines: the daemon's ordinal of the GPU holding the memory; -1 for host memory.
  virtual int device() const { return -1; }
  // Maps more pages after the buffer's end (wire::ExtendBuffer; kCudaVmmSegment buffers only):
  // bytes() grows once they are mapped. One caller at a time (the session listener); jobs may
  // run meanwhile. On an error nothing was added. FAILED_PRECONDITION for buffers that cannot
  // grow.
  virtual absl::Status Extend(BufferExtension&) {
    return absl::FailedPreconditionError(
        "only an expandable-segment registration (kCudaVmmSegment) can be extended");
  }
};

// What a client sent to register a buffer (validated by the engine).
struct BufferImport {
  wire::BufferKind kind = wire::BufferKind::kHostMemfd;
  int device = -1;
  uint64_t bytes = 0;
  std::array<uint8_t, 64> ipc_handle{};
  std::array<uint8_t, 16> device_uuid{};
  UniqueFd fd;  // kHostMemfd, kCudaVmmFd
  // kCudaVmmPages, kCudaVmmSegment: one fd and size per page, in address order (validated by
  // the listener).
  std::vector<UniqueFd> page_fds;
  std::vector<uint64_t> page_bytes;
  // kCudaVmmSegment: the address space to reserve, so that Extend maps more pages in place.
  uint64_t reserve_bytes = 0;
};

// What the engine is told of a session when it opens.
struct EngineSessionInfo {
  uint64_t id = 0;
  std::string label;  // for logs, e.g. "session 5 'train' (pid 1234)"
  uint32_t uid = 0;   // the client's user (SO_PEERCRED): a user's sessions share one link window
  // The session ring's ticket page (tier/ring.h): the client's GPU streams raise their tickets
  // in it and the daemon's copy streams its done counters. GPU engines read the tickets and
  // register the page with their runtime (for the done writes); the host engine ignores it.
  // Untrusted. Mapped while `tickets_owner` is held: a GPU engine keeps it until its release
  // thread has unregistered the page, which may be after the EngineSession is gone.
  ring::TicketPage* tickets = nullptr;
  std::shared_ptr<const void> tickets_owner;
};

// Per-session engine state. GPU engines keep here the session's own D2H/H2D streams (so a client
// that never writes a ticket stalls only its own lanes, never another session's) and its
// semaphore page. The host engine keeps nothing. Destroying it abandons the session (below).
class EngineSession {
 public:
  virtual ~EngineSession() = default;
};

enum class Direction {
  kToPool,    // offload: client buffer -> pool extent (device to host on a GPU)
  kFromPool,  // reload: pool extent -> client buffer (host to device on a GPU)
};

// One lane (GPU, direction) of a session as the engine sees it now, for diagnostics.
struct LaneStatus {
  int device = -1;
  Direction direction = Direction::kToPool;
  uint64_t queued = 0;          // accepted, not yet issued to the GPU
  uint64_t held = 0;            // arrived ahead of a smaller ticket that has not arrived yet
  uint64_t in_flight = 0;       // issued, not yet complete
  uint64_t waiting_ticket = 0;  // the ticket the lane waits for from the client (0: none)
  uint64_t client_ticket = 0;   // the client's counter as last read (what it reported so far)
  uint64_t waiting_ms = 0;      // how long the lane has waited for that ticket
  // What the lane's first queued job waits for on the host ("" when nothing is queued or it is
  // being issued), and whether the engine is looking at the lane (false with jobs queued is a bug).
  std::string blocked_on;
  bool active = false;
  // The stream: seq of the last job issued and of the last completed; the oldest job in flight's
  // age and the GPU-side waits it is behind that are not met yet ("" when none).
  uint64_t issued_seq = 0;
  uint64_t completed_seq = 0;
  uint64_t oldest_in_flight_ms = 0;
  std::string gpu_waits;
};

// Engine-wide counts, to check that nothing is left behind.
struct EngineCounts {
  uint64_t buffers = 0;           // imported client buffers not yet closed
  uint64_t lanes = 0;             // per-session GPU lanes (streams) alive
  uint64_t pending_releases = 0;  // mappings and streams queued for release
};

// What one GPU's link achieved for the engine's copies lately (engine/link_meter.h): bytes per
// second while copies were in flight, each direction; 0 before enough bytes moved.
struct LinkRate {
  int device = -1;  // the daemon's ordinal
  double d2h_bytes_per_s = 0;
  double h2d_bytes_per_s = 0;
  uint64_t d2h_bytes = 0;  // moved since start
  uint64_t h2d_bytes = 0;
};

struct CopyJob {
  Direction direction = Direction::kToPool;
  char* client = nullptr;  // inside an ImportedBuffer
  char* pool = nullptr;    // inside the host pool
  uint64_t len = 0;
  // The session the job belongs to (from CopyEngine::OpenSession), never null.
  EngineSession* session = nullptr;
  // GPU engines: the job's ticket from the ring entry (0 = none). The host engine ignores it.
  //
  // Tickets number a session's jobs per GPU and per direction 1, 2, 3, ... (the client takes
  // them; see client/gpu/client_gpu.h). A GPU engine issues a session's ticketed jobs of one GPU and
  // direction in ticket order, holding back a job until every smaller ticket has been submitted,
  // because its completion write `done = k` tells the client that every job up to k is done.
  // So every ticket the client took must reach Submit exactly once: a job the daemon rejects
  // before copying must still be submitted as a ticket-only job (below) and then reported failed,
  // or every later job of that lane waits until the session ends.
  uint64_t sync = 0;
  // How many jobs share `sync` (a batch: the client took one ticket for all of them; 0 or 1: a
  // lone job). The engine issues them once all have been submitted, in submission order, and
  // signals the ticket once, after the last copy. Every job of a batch must reach Submit (a
  // rejected one as a ticket-only job), as for lone tickets; each still completes on its own.
  uint32_t batch_size = 1;
  // A job with len == 0 is ticket-only: no copy; the GPU engine still waits for the ticket and
  // signals it (so the client's streams are released), then calls done(OK). The host engine
  // completes it at once. `client` may then be null; `device` says which GPU's lane it belongs to.
  // GPU engines: the daemon's GPU ordinal of `client` (ImportedBuffer::device()); -1 = let the
  // engine find it from `client`, or, for a ticket-only job without `client`, the session's only
  // GPU with a semaphore page.
  int device = -1;
  // kFromPool only: the pool bytes are still arriving (see engine/source_feed.h). The engine copies
  // each chunk once the feed has it in place (in chunk order, all after the job's ticket wait, as
  // one job: one done write, one callback), and the job fails with the feed's error if it ends
  // with one. Null: the pool bytes are all in place now.
  std::shared_ptr<SourceFeed> feed;
  // Called exactly once when the copy finished or failed.
  absl::AnyInvocable<void(absl::Status) &&> done;
};

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  virtual absl::string_view name() const = 0;
  // true: a kFromPool job submitted after a kToPool job into the same pool bytes reads what that
  // job wrote (the GPU engines order them on the GPU), so the daemon may submit a reload of an
  // object still being filled at once, provided the fill's job was submitted first: Submit
  // returned for it (ObjectTable::FillSubmitted), not merely decided on another thread. false
  // (host engine: independent lanes): the daemon holds such a reload back until the fill
  // completed.
  virtual bool orders_pool_reads() const { return false; }
  // Pins the host pool for this engine (cudaHostRegister on GPUs; nothing for the host engine).
  virtual absl::Status RegisterPool(char* base, uint64_t bytes) = 0;
  virtual absl::StatusOr<std::unique_ptr<EngineSession>> OpenSession(
      const EngineSessionInfo& info) = 0;
  // The client is gone or closing: release anything of the session's that waits on the client
  // (GPU: jobs not yet issued fail with CANCELLED; copies already issued finish, since a tierd
  // stream never waits for a client). Every job's callback still runs once.
  virtual void AbandonSession(EngineSession* session) = 0;
  virtual absl::StatusOr<std::unique_ptr<ImportedBuffer>> Import(EngineSession* session,
                                                                 BufferImport import) = 0;
  // Queues a copy. Copies of one direction start in submission order; the two directions run
  // independently (both PCIe directions at once on a GPU).
  virtual void Submit(CopyJob job) = 0;
  // Finishes every queued job (their callbacks run), then stops accepting work.
  virtual void Shutdown() = 0;
  // Diagnostics: the session's lanes (GPU engines; empty for the host engine) and the counts.
  virtual std::vector<LaneStatus> Lanes(EngineSession* session) {
    (void)session;
    return {};
  }
  virtual EngineCounts Counts() const = 0;
  // The GPUs' links as the engine measured them (GPU engines; empty for the host engine).
  virtual std::vector<LinkRate> LinkRates() const { return {}; }
  // Jobs without a ticket that are queued behind a job waiting for its client's ticket: the
  // client holds them up, not tierd (health leaves them out). 0 for the host engine.
  virtual uint64_t UnticketedBehindClients() const { return 0; }
};

struct HostEngineOptions {
  int threads_per_direction = 1;
  uint64_t inline_max_bytes = 64 * 1024;  // copies up to this size run on the submitting thread
  uint64_t copy_delay_us = 0;             // test-only delay injection: sleep before every copy
};

std::unique_ptr<CopyEngine> MakeHostEngine(const HostEngineOptions& options);

// The GPU engines (CUDA, HIP): see engine/stream_engine.h.
struct GpuEngineOptions {
  // Test-only delay injection: every copy is issued this long after its ticket arrived, so a
  // client that uses data before the completion value, or frees a source early, sees a mismatch
  // every time.
  uint64_t copy_delay_us = 0;
  // The device workers (one thread per GPU: issue and completion) spin this long after the last
  // progress, then sleep in growing steps up to poll_max_sleep_us while a lane has work (a job
  // waiting for its ticket, or copies in flight); with none, they block.
  uint32_t poll_spin_us = 50;
  uint32_t poll_max_sleep_us = 50;
  // A lane whose issued jobs made no progress for this long has its stream queried for errors.
  uint32_t watchdog_ms = 100;
  // A lane that has waited this long for a client's ticket logs it once (session, GPU, ticket,
  // what the client reported); tierctl clients shows every lane's wait at any time.
  uint32_t lane_wait_warn_ms = 10000;
  // Shutdown: how long to wait for in-flight jobs before cancelling what waits for a client, and
  // again before failing what is left.
  uint32_t shutdown_grace_ms = 5000;
  // Sharing a GPU's link between sessions: while another lane of the GPU and direction has work
  // (or had in the last 2 ms), a lane keeps at most this many bytes of copies issued and not
  // completed on its stream, issues larger copies in chunks of a quarter of it, and completes
  // each piece on its own, so a job of another session waits behind at most about this much of
  // this one's work (the copy engine serves streams in the order their copies were issued). A
  // lane alone is not limited. 0: no limit (a session may queue any amount ahead of the others).
  uint64_t lane_window_bytes = 0;
};

}  // namespace tier::engine

#endif  // TIER_ENGINE_COPY_ENGINE_H_
