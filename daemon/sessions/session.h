// One client session: its identity (kernel credentials of the session socket), quota, shared-memory
// job ring with its doorbells, registered buffers, and the objects it holds in the daemon.
//
// Threads: a ring poller consumes the submission queue (one at a time: the one holding it, see
// TakeSubmissions); engine threads post completions; the session listener registers buffers and
// ends the session; gRPC threads read snapshots. Everything mutable beyond the ring ends is
// guarded by mu_.
#ifndef TIER_DAEMON_SESSIONS_SESSION_H_
#define TIER_DAEMON_SESSIONS_SESSION_H_

#include <array>
#include <atomic>
#include <functional>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "common/unique_fd.h"
#include "common/unix_socket.h"
#include "daemon/metrics/metrics.h"
#include "daemon/sessions/usage_ledger.h"
#include "daemon/tiers/object_table.h"
#include "engine/copy_engine.h"
#include "storage/extent_allocator.h"
#include "storage/spill_store.h"
#include "tier/ring.h"

namespace tier::daemon {

using AttachToken = std::array<uint8_t, 16>;

struct SessionSnapshot {
  uint64_t id = 0;
  std::string name;
  bool attached = false;
  PeerCredentials peer;
  uint64_t quota_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t objects = 0;
  uint64_t buffers = 0;
  BufferCharge charged;  // what the buffers cost: host memory mapped, GPU address space reserved
  uint64_t jobs_in_flight = 0;
  uint64_t jobs_completed = 0;
  uint64_t jobs_failed = 0;
  uint64_t bytes_offloaded = 0;
  uint64_t bytes_reloaded = 0;
  uint64_t age_ms = 0;
  std::vector<engine::LaneStatus> lanes;  // filled by the registry (the engine's view)
};

class Session {
 public:
  Session(uint64_t id, std::string name, const AttachToken& token, uint64_t quota_bytes,
          uint32_t ring_entries);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  uint64_t id() const { return id_; }
  const std::string& name() const { return name_; }
  uint64_t quota_bytes() const { return quota_bytes_; }
  uint32_t ring_entries() const { return ring_entries_; }
  uint64_t created_ms() const { return created_ms_; }
  bool TokenMatches(const AttachToken& token) const;

  // Creates the ring segment and doorbells, opens the session in the copy engine (through
  // `open_engine`, which gets the ring's ticket page) and binds the session to the attaching
  // process.
  using EngineOpener = absl::FunctionRef<absl::StatusOr<std::unique_ptr<engine::EngineSession>>(
      const engine::EngineSessionInfo&)>;
  absl::Status Attach(const PeerCredentials& peer, EngineOpener open_engine);
  bool attached() const;
  PeerCredentials peer() const;  // the attaching process (zeros until attached)
  int ring_fd() const { return ring_fd_.get(); }
  uint64_t ring_bytes() const { return ring_bytes_; }
  // Doorbells are Unix socket pairs, not eventfds: O_NONBLOCK belongs to an open file
  // description, and an eventfd has only one, shared with the client, which could clear the flag
  // and make the daemon's read or write block every session (found by a hostile client). A socket
  // pair has two ends, two files: the client only ever holds its own, and the daemon reads and
  // writes its end with MSG_DONTWAIT, which no flag of anyone's can turn into a blocking call.
  // (Sockets rather than pipes: a client writing to a daemon that died gets EPIPE from
  // send(MSG_NOSIGNAL), not a SIGPIPE that kills the trainer.) sq: the client rings, the daemon
  // reads; cq: the daemon rings, the client reads. Clients written for eventfds work unchanged:
  // they write and read 8 bytes.
  int sq_doorbell_fd() const { return sq_doorbell_.get(); }  // the daemon's end
  // The client's ends, sent with the attach reply and then closed here (ReleaseClientDoorbells).
  int client_sq_doorbell_fd() const { return client_sq_doorbell_.get(); }
  int client_cq_doorbell_fd() const { return client_cq_doorbell_.get(); }
  void ReleaseClientDoorbells();
  // The ring's ticket page (tier/ring.h): written by the client's GPU streams, read by the engine.
  const ring::TicketPage* tickets() const { return tickets_; }
  engine::EngineSession* engine_session() const { return engine_session_.get(); }
  // For threads other than the listener's: the engine session once attached, else null.
  engine::EngineSession* engine_session_if_attached() const;

  // ---- Ring pollers (daemon/jobs/ring_pollers.h) ----
  // The GPU whose ring poller serves the session: the device of the first GPU buffer it
  // registered (AddBuffer), -1 before that and for a session of host memory only. Set once.
  int home_device() const { return home_device_.load(std::memory_order_acquire); }
  // The consumer end of the submission queue (and CanAdmit, and the raising of jobs in flight)
  // belongs to one poller at a time, `poller` >= 0. Take: true when this poller holds it now
  // (it was free, or already its own). Release: only by the holder, after its last use. The
  // release/acquire pair orders everything the first holder did to the queue before anything the
  // next one does, so a session that moves to its GPU's poller loses no entry and none is taken
  // twice.
  bool TakeSubmissions(int poller);
  // For a session that moved to another poller's care (home_device() set).
  void ReleaseSubmissions(int poller);
  bool HoldsSubmissions(int poller) const {
    return sq_holder_.load(std::memory_order_acquire) == poller;
  }
  // Let go by its old poller, not taken yet by its new one: in nobody's passes.
  bool moving() const { return sq_holder_.load(std::memory_order_acquire) == kMoving; }

  // ---- The poller holding the submission queue only ----
  ring::Consumer<ring::SubmissionEntry>& submissions() { return sq_; }
  // True when one more job can be accepted without overrunning the completion queue: jobs in
  // flight plus completions the client has not reaped stay below its capacity.
  bool CanAdmit();

  // ---- Any thread ----
  // Posts a completion and wakes the client if it sleeps. False if the client corrupted the ring
  // (the session is then broken and should be closed).
  bool PostCompletion(const ring::CompletionEntry& entry);
  bool broken() const { return broken_.load(std::memory_order_relaxed); }

  // Buffers. Each counts against the session's limits and, through the ledger (set before the
  // session attaches; none in unit tests), its user's and the node's.
  void set_ledger(UsageLedger* ledger) { ledger_ = ledger; }
  // Whether one more buffer costing `charge` (host memory mapped, GPU address space reserved)
  // fits: RESOURCE_EXHAUSTED naming the limit if not. Session listener thread (the only one
  // adding).
  absl::Status CheckBufferLimits(const BufferCharge& charge) const;
  // The first buffer on a GPU makes that GPU the session's home_device(). `charge` (what
  // CheckBufferLimits passed: the listener derives it from the request) counts until the buffer
  // is removed.
  uint64_t AddBuffer(std::shared_ptr<engine::ImportedBuffer> buffer, BufferCharge charge = {});
  bool RemoveBuffer(uint64_t buffer_id);
  std::shared_ptr<engine::ImportedBuffer> FindBuffer(uint64_t buffer_id);

  // Job accounting and closing. BeginJob fails once the session is closing.
  bool BeginJob();
  void EndJob();
  void MarkClosing();
  bool closing() const;
  // Blocks until no job is in flight (after MarkClosing, none can start).
  void WaitIdle();

  // The session's objects (daemon/tiers/object_table.h): every change of their state, and the quota.
  const std::shared_ptr<ObjectTable>& objects() const { return objects_; }
  // Tells the client tierd is draining (ring::kDaemonDraining in its ring's header).
  void TellDraining();
  // Where the object a job names by `id` lives: a persistent object bound to `id` (its uid's
  // table, daemon/persistent/persistent_store.h), else the session's own table under the same id.
  ObjectSlot Resolve(uint64_t id) const;
  // Binds the session's object id `id` to a persistent object's slot. ALREADY_EXISTS when `id`
  // is bound already or names an object of the session's own table; INVALID_ARGUMENT for id 0;
  // RESOURCE_EXHAUSTED past kMaxBound.
  absl::Status Bind(uint64_t id, ObjectSlot slot);
  // Whether Bind(id, ...) would succeed now: asked before a create reserves a name for `id`, so
  // that a refused bind leaves no reservation behind.
  absl::Status CheckBindable(uint64_t id) const;
  // Drops the binding of `id` (the persistent object stays). NOT_FOUND when `id` is not bound.
  absl::Status Unbind(uint64_t id);
  // Ids a session may bind: each binding (and the name a create reserves for it) is daemon
  // memory that no byte quota counts until its offload lands.
  static constexpr size_t kMaxBound = 4096;
  // Every registered buffer, for release at close (takes the lock itself: drop them outside it).
  std::vector<std::shared_ptr<engine::ImportedBuffer>> TakeAllBuffers();

  JobCounters& counters() { return counters_; }
  SessionSnapshot Snapshot() const;

 private:
  const uint64_t id_;
  const std::string name_;
  const AttachToken token_;
  const uint64_t quota_bytes_;
  const uint32_t ring_entries_;
  const uint64_t created_ms_;
  const std::shared_ptr<ObjectTable> objects_;

  UniqueFd ring_fd_;
  uint64_t ring_bytes_ = 0;
  void* ring_base_ = nullptr;
  std::shared_ptr<void> ring_mapping_;  // unmaps ring_base_ once the engine lets go too
  const ring::TicketPage* tickets_ = nullptr;
  UniqueFd sq_doorbell_;         // the daemon's ends of the doorbell socket pairs
  UniqueFd cq_doorbell_;
  UniqueFd client_sq_doorbell_;  // the client's ends, until sent
  UniqueFd client_cq_doorbell_;
  ring::Consumer<ring::SubmissionEntry> sq_;
  Mutex cq_mu_;
  ring::Producer<ring::CompletionEntry> cq_ ABSL_GUARDED_BY(cq_mu_);
  std::atomic<bool> broken_{false};
  std::unique_ptr<engine::EngineSession> engine_session_;
  std::atomic<int> home_device_{-1};
  // The poller holding the submission queue (>= 0); kNoHolder: none yet; kMoving: let go by
  // the poller the session moved away from.
  static constexpr int kNoHolder = -1;
  static constexpr int kMoving = -2;
  std::atomic<int> sq_holder_{kNoHolder};

  mutable Mutex mu_;
  CondVar idle_cv_;
  bool attached_ ABSL_GUARDED_BY(mu_) = false;
  PeerCredentials peer_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t jobs_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Copies of closing_ and jobs_in_flight_, written under mu_ with them, for the ring poller's
  // checks on every entry and every pass (closing(), CanAdmit()) without taking mu_. The poller
  // holding the queue is the only thread that raises jobs_in_flight_, so its copy is never below
  // the truth there: a stale value only admits later.
  std::atomic<bool> closing_seen_{false};
  std::atomic<uint64_t> in_flight_seen_{0};
  uint64_t next_buffer_id_ ABSL_GUARDED_BY(mu_) = 1;
  struct Registered {
    std::shared_ptr<engine::ImportedBuffer> buffer;
    BufferCharge charge;
  };
  std::unordered_map<uint64_t, Registered> buffers_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<uint64_t, ObjectSlot> bound_ ABSL_GUARDED_BY(mu_);
  // bound_ is empty (the common case): jobs resolve their ids without taking mu_.
  std::atomic<bool> any_bound_{false};
  BufferCharge charged_ ABSL_GUARDED_BY(mu_);  // buffers_' charges together
  UsageLedger* ledger_ = nullptr;
  JobCounters counters_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_SESSIONS_SESSION_H_
