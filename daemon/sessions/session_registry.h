// The daemon's sessions: opened (pending) over gRPC, attached over the session socket, ended by the
// client, by its death, by a broken ring, or by shutdown. Ending a session is asynchronous: it stops
// taking jobs at once, the engine releases anything that waits on the client, and a reaper thread
// returns its memory once its last job has completed.
#ifndef TIER_DAEMON_SESSIONS_SESSION_REGISTRY_H_
#define TIER_DAEMON_SESSIONS_SESSION_REGISTRY_H_

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/log_rate_limiter.h"
#include "common/mutex.h"
#include "daemon/jobs/job_executor.h"
#include "daemon/sessions/session.h"
#include "daemon/sessions/usage_ledger.h"
#include "engine/copy_engine.h"

namespace tier::daemon {

struct SessionLimits {
  uint64_t default_quota_bytes = 0;
  uint64_t max_quota_bytes = 0;
  uint32_t default_ring_entries = 1024;
  uint32_t max_sessions = 256;
  uint32_t attach_timeout_ms = 10000;
  ClientLimits client;  // per session, per uid and node-wide (daemon/sessions/usage_ledger.h)
};

struct OpenedSession {
  std::shared_ptr<Session> session;
  AttachToken token;
};

class SessionRegistry {
 public:
  SessionRegistry(const SessionLimits& limits, JobExecutor& executor, engine::CopyEngine& engine);
  ~SessionRegistry();

  // `opener`: the uid of the caller (SO_PEERCRED of its control connection) when known; its
  // pending sessions count against max_sessions_per_uid until they attach or expire.
  absl::StatusOr<OpenedSession> Open(std::string name, uint64_t quota_bytes,
                                     uint32_t ring_entries,
                                     std::optional<uid_t> opener = std::nullopt);
  // Binds a pending session to the attaching process. A user at max_sessions_per_uid gets
  // RESOURCE_EXHAUSTED, and the pending session ends (its slot is free at once).
  absl::StatusOr<std::shared_ptr<Session>> Attach(uint64_t session_id, const AttachToken& token,
                                                  const PeerCredentials& peer);
  // Ends a session on its opener's request (token checked). Returns once its memory is released.
  absl::Status Close(uint64_t session_id, const AttachToken& token);
  // Ends a session (client gone, ring broken, shutdown); returns at once.
  void End(const std::shared_ptr<Session>& session, absl::string_view reason);
  // Ends pending sessions not attached within the attach timeout.
  void ExpirePending();
  // Ends every session and waits until all are released.
  void EndAllAndWait();

  // Attached, not closing. The pollers re-read this when generation() changes.
  std::vector<std::shared_ptr<Session>> ActiveSessions() const;
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }
  // A session's home device was set (its first GPU buffer, Session::AddBuffer): the generation
  // changes too, so that it moves to its GPU's ring poller (daemon/jobs/ring_pollers.h).
  void HomeChanged() { Changed(); }
  // Called (from any thread) whenever the active set or a session's home changes, so that
  // sleeping pollers look again. Set once, before sessions exist.
  void set_on_change(std::function<void()> on_change) { on_change_ = std::move(on_change); }
  std::vector<SessionSnapshot> Snapshots() const;
  size_t size() const;
  // What every client holds together: attached sessions, buffers, host bytes mapped.
  UsageLedger::Usage ClientTotals() const { return ledger_.Totals(); }

  // Draining, in two steps (Daemon::Drain). First no new sessions, and every attached session's
  // ring says so (ring::kDaemonDraining): its client offloads no more and keeps new data on the
  // GPU, while its reloads and frees go on, so what it offloaded comes back before tierd exits.
  // Then, refusing: every job is refused (UNAVAILABLE).
  void SetDraining();
  bool draining() const { return draining_.load(std::memory_order_acquire); }
  void SetRefusing() { refusing_.store(true, std::memory_order_release); }
  bool refusing() const { return refusing_.load(std::memory_order_acquire); }
  // Objects the attached sessions hold (persistent objects are the uid tables', not counted).
  uint64_t SessionObjects() const;

 private:
  void Reap();
  void Changed();
  // The session no longer counts as its opener's pending one (attached, or ended).
  void ReleasePending(uint64_t session_id);

  const SessionLimits limits_;
  UsageLedger ledger_;
  JobExecutor& executor_;
  engine::CopyEngine& engine_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> refusing_{false};
  std::atomic<uint64_t> generation_{0};
  std::function<void()> on_change_;
  // Sessions attaching and ending: at most 50 lines per 10 s (common/log_rate_limiter.h).
  LogRateLimiter session_log_{50, 10000};

  mutable Mutex mu_;
  CondVar reaped_cv_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Includes closing ones until reaped.
  std::map<uint64_t, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  // Pending sessions counted against their opener's uid in ledger_: session id -> opener.
  std::map<uint64_t, uid_t> pending_openers_ ABSL_GUARDED_BY(mu_);

  Mutex reap_mu_;
  CondVar reap_cv_;
  std::deque<std::shared_ptr<Session>> to_reap_ ABSL_GUARDED_BY(reap_mu_);
  bool stopping_ ABSL_GUARDED_BY(reap_mu_) = false;
  std::thread reaper_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_SESSIONS_SESSION_REGISTRY_H_
