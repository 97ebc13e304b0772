#include "daemon/tiers/spill_policy.h"

namespace tier::daemon {

Rank SpillPolicy::RankOf(NextUse use) {
  // Hinted: larger hint = used later = smaller rank. Unhinted: older = used later = smaller rank.
  if (use.hint != 0) return Rank{0, ~uint64_t{0} - use.hint};
  return Rank{1, use.seq};
}

bool SpillPolicy::MustSpill(const storage::PoolUsage& usage) const {
  return usage.used_bytes * 100 > usage.capacity_bytes * watermarks_.high_pct;
}

bool SpillPolicy::KeepSpilling(const storage::PoolUsage& usage) const {
  return usage.used_bytes * 100 > usage.capacity_bytes * watermarks_.low_pct;
}

bool SpillPolicy::MayPrefetch(const storage::PoolUsage& usage, uint64_t bytes) const {
  return (usage.used_bytes + bytes) * 100 <= usage.capacity_bytes * watermarks_.low_pct;
}

}  // namespace tier::daemon
