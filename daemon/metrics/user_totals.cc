#include "daemon/metrics/user_totals.h"

#include "common/mutex.h"

namespace tier::daemon {

UserCounters& UserCounters::operator+=(const UserCounters& other) {
  jobs_completed += other.jobs_completed;
  jobs_failed += other.jobs_failed;
  bytes_offloaded += other.bytes_offloaded;
  bytes_reloaded += other.bytes_reloaded;
  return *this;
}

std::map<uint32_t, UserCounters> UserTotals::Update(const std::vector<SessionCounts>& live) {
  MutexLock lock(&mu_);
  std::map<uint64_t, SessionCounts> now;
  for (const SessionCounts& session : live) now[session.session_id] = session;
  // Sessions seen before and gone now: their last counts stay with their user.
  for (const auto& [id, seen] : last_seen_) {
    if (!now.contains(id)) retired_[seen.uid] += seen.counters;
  }
  last_seen_ = std::move(now);
  std::map<uint32_t, UserCounters> totals = retired_;
  for (const auto& [id, session] : last_seen_) totals[session.uid] += session.counters;
  return totals;
}

}  // namespace tier::daemon
