#include "daemon/sessions/session_registry.h"

#include <sys/random.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"

namespace tier::daemon {
namespace {

uint32_t RoundUpPow2(uint32_t n) {
  uint32_t p = ring::kMinEntries;
  while (p < n && p < ring::kMaxEntries) p <<= 1;
  return p;
}

}  // namespace

SessionRegistry::SessionRegistry(const SessionLimits& limits, JobExecutor& executor,
                                 engine::CopyEngine& engine)
    : limits_(limits), ledger_(limits.client), executor_(executor), engine_(engine),
      reaper_([this] { Reap(); }) {}

SessionRegistry::~SessionRegistry() {
  EndAllAndWait();
  {
    MutexLock lock(&reap_mu_);
    stopping_ = true;
  }
  reap_cv_.SignalAll();
  reaper_.join();
}

absl::StatusOr<OpenedSession> SessionRegistry::Open(std::string name, uint64_t quota_bytes,
                                                    uint32_t ring_entries,
                                                    std::optional<uid_t> opener) {
  if (draining()) return absl::UnavailableError("tierd is draining: no new sessions");
  if (name.size() > 64) return absl::InvalidArgumentError("session name longer than 64 bytes");
  for (char c : name) {
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError("session name has non-printable characters");
    }
  }
  if (quota_bytes == 0) quota_bytes = limits_.default_quota_bytes;
  quota_bytes = std::min(quota_bytes, limits_.max_quota_bytes);
  if (ring_entries == 0) ring_entries = limits_.default_ring_entries;
  if (ring_entries > ring::kMaxEntries) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring_entries ", ring_entries, " above the maximum ", ring::kMaxEntries));
  }
  ring_entries = RoundUpPow2(ring_entries);

  AttachToken token;
  if (::getrandom(token.data(), token.size(), 0) != static_cast<ssize_t>(token.size())) {
    return ErrnoStatus("getrandom");
  }
  MutexLock lock(&mu_);
  if (sessions_.size() >= limits_.max_sessions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tierd serves at most ", limits_.max_sessions, " sessions (max_sessions)"));
  }
  // (Its uid's share first: one user's opens that never attach could otherwise hold every slot.)
  if (opener.has_value()) {
    if (absl::Status share = ledger_.AddPending(*opener); !share.ok()) return share;
  }
  uint64_t id = next_id_++;
  if (opener.has_value()) pending_openers_.emplace(id, *opener);
  auto session = std::make_shared<Session>(id, std::move(name), token, quota_bytes, ring_entries);
  session->set_ledger(&ledger_);
  sessions_.emplace(id, session);
  return OpenedSession{std::move(session), token};
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Attach(uint64_t session_id,
                                                                 const AttachToken& token,
                                                                 const PeerCredentials& peer) {
  std::shared_ptr<Session> session;
  {
    MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    // One answer for "no such session" and "wrong token", so ids cannot be probed.
    if (it == sessions_.end() || !it->second->TokenMatches(token)) {
      return absl::PermissionDeniedError("no pending session with that id and token");
    }
    session = it->second;
  }
  // (Session::Attach says so too; asked first so that the uid's slot is not counted twice.)
  if (session->attached()) return absl::AlreadyExistsError("session is already attached");
  if (session->closing()) return absl::FailedPreconditionError("session is closing");
  // The pending slot becomes an attached one, now counted for the attaching process's uid (its
  // opener's, as a rule): a user over its share loses this one at once rather than holding it
  // until the attach timeout.
  ReleasePending(session_id);
  if (absl::Status slot = ledger_.AddSession(peer.uid); !slot.ok()) {
    End(session, slot.message());
    return slot;
  }
  absl::Status attached = session->Attach(
      peer, [this](const engine::EngineSessionInfo& info) { return engine_.OpenSession(info); });
  if (!attached.ok()) {
    ledger_.RemoveSession(peer.uid);
    return attached;
  }
  // A drain that began while it attached: it learns of it too (SetDraining told the others).
  if (draining()) session->TellDraining();
  Changed();
  LogInfoLimited(session_log_, "session ", session_id, " '", session->name(), "' attached by pid ",
                 peer.pid, " uid ", peer.uid);
  return session;
}

absl::Status SessionRegistry::Close(uint64_t session_id, const AttachToken& token) {
  std::shared_ptr<Session> session;
  {
    MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end() || !it->second->TokenMatches(token)) {
      return absl::PermissionDeniedError("no session with that id and token");
    }
    session = it->second;
  }
  End(session, "closed by its client");
  MutexLock lock(&mu_);
  while (sessions_.contains(session_id)) reaped_cv_.Wait(&mu_);
  return absl::OkStatus();
}

void SessionRegistry::End(const std::shared_ptr<Session>& session, absl::string_view reason) {
  if (session->closing()) return;
  session->MarkClosing();
  Changed();
  LogInfoLimited(session_log_, "session ", session->id(), " '", session->name(), "' ends: ",
                 reason);
  // Release whatever waits on the client (GPU semaphores) so its jobs can finish.
  if (session->engine_session() != nullptr) engine_.AbandonSession(session->engine_session());
  {
    MutexLock lock(&reap_mu_);
    to_reap_.push_back(session);
  }
  reap_cv_.Signal();
}

void SessionRegistry::Changed() {
  generation_.fetch_add(1, std::memory_order_acq_rel);
  if (on_change_) on_change_();
}

void SessionRegistry::Reap() {
  for (;;) {
    std::shared_ptr<Session> session;
    {
      MutexLock lock(&reap_mu_);
      while (!stopping_ && to_reap_.empty()) reap_cv_.Wait(&reap_mu_);
      if (to_reap_.empty()) return;
      session = std::move(to_reap_.front());
      to_reap_.pop_front();
    }
    // No job can start any more (closing); wait for the running ones, then free everything.
    session->WaitIdle();
    executor_.ReleaseAll(*session);
    if (session->attached()) ledger_.RemoveSession(session->peer().uid);
    ReleasePending(session->id());
    {
      MutexLock lock(&mu_);
      sessions_.erase(session->id());
    }
    reaped_cv_.SignalAll();
  }
}

void SessionRegistry::ReleasePending(uint64_t session_id) {
  std::optional<uid_t> opener;
  {
    MutexLock lock(&mu_);
    auto it = pending_openers_.find(session_id);
    if (it == pending_openers_.end()) return;
    opener = it->second;
    pending_openers_.erase(it);
  }
  ledger_.RemovePending(*opener);
}

void SessionRegistry::ExpirePending() {
  std::vector<std::shared_ptr<Session>> expired;
  {
    MutexLock lock(&mu_);
    // Read under the lock: a session opened after `now` was read would make now - created_ms
    // wrap around and expire it at birth (seen under load).
    const uint64_t now = MonotonicMs();
    for (auto& [id, session] : sessions_) {
      if (!session->attached() && !session->closing() &&
          now > session->created_ms() + limits_.attach_timeout_ms) {
        expired.push_back(session);
      }
    }
  }
  for (auto& session : expired) End(session, "not attached in time");
}

void SessionRegistry::EndAllAndWait() {
  std::vector<std::shared_ptr<Session>> all;
  {
    MutexLock lock(&mu_);
    for (auto& [id, session] : sessions_) all.push_back(session);
  }
  for (auto& session : all) End(session, "daemon shutting down");
  MutexLock lock(&mu_);
  while (!sessions_.empty()) reaped_cv_.Wait(&mu_);
}

std::vector<std::shared_ptr<Session>> SessionRegistry::ActiveSessions() const {
  std::vector<std::shared_ptr<Session>> active;
  MutexLock lock(&mu_);
  for (auto& [id, session] : sessions_) {
    if (session->attached() && !session->closing()) active.push_back(session);
  }
  return active;
}

std::vector<SessionSnapshot> SessionRegistry::Snapshots() const {
  std::vector<std::shared_ptr<Session>> all;
  {
    MutexLock lock(&mu_);
    for (auto& [id, session] : sessions_) all.push_back(session);
  }
  std::vector<SessionSnapshot> out;
  out.reserve(all.size());
  for (auto& session : all) {
    out.push_back(session->Snapshot());
    if (engine::EngineSession* engine_session = session->engine_session_if_attached()) {
      out.back().lanes = engine_.Lanes(engine_session);
    }
  }
  return out;
}

void SessionRegistry::SetDraining() {
  draining_.store(true, std::memory_order_release);
  for (const std::shared_ptr<Session>& session : ActiveSessions()) session->TellDraining();
}

uint64_t SessionRegistry::SessionObjects() const {
  uint64_t objects = 0;
  for (const std::shared_ptr<Session>& session : ActiveSessions()) {
    objects += session->objects()->size();
  }
  return objects;
}

size_t SessionRegistry::size() const {
  MutexLock lock(&mu_);
  return sessions_.size();
}

}  // namespace tier::daemon
