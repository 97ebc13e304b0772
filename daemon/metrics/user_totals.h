// Per-user job and byte counters that never go down, from per-session counters that vanish when a
// session ends. Prometheus treats a counter that drops as a restart, so a user's total cannot be
// the sum over the sessions alive now: each session's last counts are kept, and when it is gone
// they move to its user's retired total. What a session counted between the last scrape and its
// end is lost (it was never seen); everything seen stays.
#ifndef TIER_DAEMON_METRICS_USER_TOTALS_H_
#define TIER_DAEMON_METRICS_USER_TOTALS_H_

#include <cstdint>
#include <map>
#include <vector>

#include "common/mutex.h"

namespace tier::daemon {

struct UserCounters {
  uint64_t jobs_completed = 0;
  uint64_t jobs_failed = 0;
  uint64_t bytes_offloaded = 0;
  uint64_t bytes_reloaded = 0;

  UserCounters& operator+=(const UserCounters& other);
};

// One attached session's counters as read now.
struct SessionCounts {
  uint64_t session_id = 0;
  uint32_t uid = 0;
  UserCounters counters;
};

class UserTotals {
 public:
  // The totals by uid, with `live` (every attached session now) folded in. Thread-safe.
  std::map<uint32_t, UserCounters> Update(const std::vector<SessionCounts>& live);

 private:
  Mutex mu_;
  std::map<uint64_t, SessionCounts> last_seen_ ABSL_GUARDED_BY(mu_);  // by session id
  std::map<uint32_t, UserCounters> retired_ ABSL_GUARDED_BY(mu_);     // by uid: ended sessions
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_METRICS_USER_TOTALS_H_
