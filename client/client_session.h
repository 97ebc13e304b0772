// The client library's session: the object behind tier_session*. Opens the session over gRPC,
// attaches over the session socket, registers buffers, and runs jobs through the shared-memory ring.
//
// Threads: any number may submit and wait at once. One mutex guards the ring ends and the job
// tables; at most one waiter at a time sleeps on the completion doorbell (the "reaper") and wakes
// the others through a condition variable when it reaps.
#ifndef TIER_CLIENT_CLIENT_SESSION_H_
#define TIER_CLIENT_CLIENT_SESSION_H_

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
#include "client/control_client.h"
#include "client/device_registry.h"
#include "client/job_ring.h"
#include "client/session_channel.h"
#include "tier/ring.h"

namespace tier::client {

struct SessionOptions {
  std::string socket_path;  // empty: DefaultSocketPath()
  std::string name;
  uint64_t quota_bytes = 0;
  uint32_t ring_entries = 0;
  int connect_timeout_ms = 5000;
  // How long Open waits for a tierd that is not listening yet or turns sessions away for a moment
  // (starting, restarting, draining); 0: one attempt.
  int daemon_wait_ms = 60000;
  uint64_t spin_ns = 50000;  // how long a waiter polls the ring before it sleeps
  // A call that has waited this long for tierd says so on stderr, once, with what it waits for
  // (0: never). $TIER_WAIT_WARN_MS overrides the default.
  int64_t wait_warn_ms = 10000;
};

struct Completion {
  uint64_t job = 0;
  uint64_t object = 0;
  uint64_t len = 0;
  absl::Status status;
};

// A persistent object's length and wire::kObject* flags (StatPersistent).
struct PersistentState {
  uint64_t len = 0;
  uint32_t flags = 0;
};

// A job as the client submits it: the ring's submission entry (job_id is left to the session,
// which numbers what it pushes; sync becomes the ticket take_ticket returns), and what stays in
// this process.
struct JobRequest : ring::SubmissionEntry {
  int device = -1;  // GPU buffers: this process's ordinal (not sent; kept for stream waits)
};

class ClientSession {
 public:
  static absl::StatusOr<std::unique_ptr<ClientSession>> Open(const SessionOptions& options);
  ~ClientSession();

  uint64_t id() const { return session_id_; }
  uint64_t quota_bytes() const { return quota_bytes_; }
  uint32_t ring_entries() const { return ring_.capacity(); }
  // The daemon is gone (the session socket hung up) / is draining (ring::kDaemonDraining).
  bool daemon_draining() const { return ring_.daemon_state() & ring::kDaemonDraining; }
  const std::string& engine() const { return engine_; }

  // Host memory shared with the daemon (a sealed memfd), registered.
  absl::StatusOr<uint64_t> AllocHostBuffer(uint64_t bytes, void** ptr);
  absl::StatusOr<uint64_t> RegisterFd(int fd, uint64_t bytes);
  absl::StatusOr<uint64_t> RegisterRaw(const wire::RegisterBuffer& request,
                                       absl::Span<const int> fds);
  absl::Status UnregisterBuffer(uint64_t buffer_id);
  // Appends pages to a segment registration (DeviceRegistry); returns its size after.
  absl::StatusOr<uint64_t> ExtendRaw(const wire::ExtendBuffer& request, absl::Span<const int> fds);
  // Drops a registration in the daemon without waiting for jobs (the daemon keeps the memory
  // mapped until the jobs that use it are done). For registrations of memory that is gone.
  absl::Status UnregisterRaw(uint64_t buffer_id);

  // Registers the GPU allocation holding `device_ptr` (once per allocation; see DeviceRegistry).
  // With len > 0 the range [device_ptr, +len) must lie in the registered buffer (VMM pages mapped
  // side by side are registered together; OUT_OF_RANGE where that is not possible).
  absl::StatusOr<DeviceRegistry::Registered> RegisterDevice(const void* device_ptr,
                                                            uint64_t len = 0);
  DeviceRegistry& devices() { return *devices_; }
  // Whether `buffer_id` is host memory this session shares with the daemon (AllocHostBuffer).
  bool IsHostBuffer(uint64_t buffer_id);
  // Where [ptr, +len) lies in that memory: its buffer and the offset there. NOT_FOUND when ptr is
  // in no such buffer; OUT_OF_RANGE when the range runs past the end of the one holding ptr.
  struct HostRange {
    uint64_t buffer_id = 0;
    uint64_t offset = 0;
  };
  absl::StatusOr<HostRange> FindHostRange(const void* ptr, uint64_t len);

  // A fresh object id for an offload (unique in this session).
  uint64_t NewObjectId();

  // What the link of this process's GPU `device` achieved for tierd's copies lately, as tierd
  // measured it (bytes per second, D2H then H2D; 0 until enough bytes moved): one gRPC call.
  // NOT_FOUND when tierd does not serve that GPU (host engine, other GPUs).
  struct LinkRate {
    double d2h_bytes_per_s = 0;
    double h2d_bytes_per_s = 0;
  };
  absl::StatusOr<LinkRate> GetLinkRate(int device);

  // Named, persistent objects (tier.h): each one round trip on the session socket.
  // Binds `object_id` (fresh, not yet offloaded) to a new persistent object `name`.
  absl::Status CreatePersistent(absl::string_view name, uint64_t object_id, uint64_t len);
  // Binds `object_id` (fresh) to the existing persistent object `name`; returns its length.
  absl::StatusOr<uint64_t> OpenPersistent(absl::string_view name, uint64_t object_id);
  // Deletes `name` of `uid` (wire::kCallerUid: the caller's own).
  absl::Status DeletePersistent(absl::string_view name, uint32_t uid);
  // Length and wire::kObject* flags of `name`, binding nothing.
  absl::StatusOr<PersistentState> StatPersistent(absl::string_view name);
  // Drops the binding of `object_id` (the object stays).
  absl::Status ReleasePersistent(uint64_t object_id);
  // Pushes a job; returns its id. Blocks only while the ring is full.
  absl::StatusOr<uint64_t> Submit(const JobRequest& request);
  // Submit for a job on a GPU buffer: `take_ticket` runs just before the push, under the lock that
  // orders pushes, so tickets of a lane reach the ring in ticket order (see client/gpu/client_gpu.h). If
  // it fails nothing is pushed. The ticket taken is stored in request.sync. A batch of one.
  absl::StatusOr<uint64_t> SubmitTicketed(JobRequest& request,
                                          absl::FunctionRef<absl::StatusOr<uint64_t>()> take_ticket);
  // A batch: `take_ticket` runs once (a GPU batch shares one ticket; for host buffers it returns
  // 0), then all requests go to the ring together, each marked with the batch's size. At most
  // min(ring_entries, ring::kMaxBatchJobs) requests; waits for room for all of them first, so a
  // batch is never half pushed. Returns the job ids, in request order.
  absl::StatusOr<std::vector<uint64_t>> SubmitBatch(
      absl::Span<JobRequest> requests, absl::FunctionRef<absl::StatusOr<uint64_t>()> take_ticket);
  // Makes `stream` wait on the GPU until GPU job `job` has copied: an offload its source out
  // (the stream may then free or overwrite the source), a reload into its destination (the
  // stream may then read it). No-op for a finished job or one on host memory; INVALID_ARGUMENT
  // when `job` is a GPU job of the other kind.
  absl::Status StreamWaitJob(uint64_t job, bool reload, void* stream);
  // Waits for one job (timeout_ms < 0: no limit). The result can be taken once.
  absl::Status Wait(uint64_t job, int64_t timeout_ms);
  // Takes up to `max` finished results without blocking.
  std::vector<Completion> Poll(size_t max);
  // Waits for every job submitted so far.
  absl::Status WaitAll(int64_t timeout_ms);
  size_t in_flight() const;
  bool daemon_gone() const;
  // The newest job id pushed so far (0: none), and the oldest job not yet complete (the next id
  // when none is): the registry drops a retired GPU registration only after its jobs.
  uint64_t LastJobPushed() const;
  uint64_t OldestPendingJob() const;

 private:
  ClientSession(const SessionOptions& options, std::unique_ptr<ControlClient> control,
                SessionChannel channel, JobRing ring);
  // Moves every posted completion into done_. Caller holds mu_.
  size_t ReapLocked();
  // Blocks until `ready()` holds, the deadline passes, or the daemon is gone. Caller holds `lock`.
  // After wait_warn_ms it logs, once, that it waits for `what()` (called with the lock held).
  template <typename Pred, typename What>
  bool WaitLocked(std::unique_lock<std::mutex>& lock, int64_t timeout_ms, Pred ready, What what);
  void MarkDaemonGoneLocked();
  // SubmitBatch's work, writing the job ids to `jobs` (requests.size() of them): one path for a
  // lone job and a batch, with no allocation for the lone one.
  absl::Status PushBatch(absl::Span<JobRequest> requests,
                         absl::FunctionRef<absl::StatusOr<uint64_t>()> take_ticket,
                         absl::Span<uint64_t> jobs);
  // GPU sessions: a thread that notices the daemon's death even while no thread of the
  // application waits for a job (its streams may be waiting on the GPU) and releases them.
  void StartDeathWatch();

  const SessionOptions options_;
  std::unique_ptr<ControlClient> control_;
  uint64_t session_id_ = 0;
  std::string token_;
  uint64_t quota_bytes_ = 0;
  std::string engine_;
  pid_t daemon_pid_ = 0;  // tierd's, from the session socket's peer credentials (0: unknown)

  std::mutex channel_mu_;
  SessionChannel channel_;  // guarded by channel_mu_

  mutable std::mutex mu_;
  std::condition_variable cv_;
  JobRing ring_;
  bool reaper_active_ = false;
  bool daemon_gone_ = false;
  uint64_t next_job_ = 1;
  uint64_t next_object_ = 1;
  std::unordered_set<uint64_t> pending_;
  std::unordered_map<uint64_t, Completion> done_;
  struct Ticket {
    int device;
    uint64_t ticket;
    bool reload;
  };
  std::unordered_map<uint64_t, Ticket> gpu_tickets_;  // GPU offloads and reloads not yet reaped

  struct HostBuffer {
    void* ptr;
    uint64_t bytes;
  };
  // Their own lock, not channel_mu_: FindHostRange runs on every tier_offload_ranges and must not
  // wait behind another thread's round trip on the channel. Taken after channel_mu_, never before.
  std::mutex host_mu_;
  std::unordered_map<uint64_t, HostBuffer> host_buffers_;  // guarded by host_mu_
  std::map<uintptr_t, uint64_t> host_by_address_;          // base -> id; guarded by host_mu_
  std::unique_ptr<DeviceRegistry> devices_;
  UniqueFd death_watch_stop_;  // eventfd
  std::thread death_watch_;
};

}  // namespace tier::client

#endif  // TIER_CLIENT_CLIENT_SESSION_H_
