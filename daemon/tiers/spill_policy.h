// The placement policy between the host tier and the NVMe tier, apart from any I/O, lock or
// session: which objects go to NVMe first, which come back first, and when either may happen.
//
// Next use. Every object has one rank on a single line from "used soonest" to "used last":
//   - objects with a client hint (tier_offload_options.next_use_hint: smaller = sooner) are
//     ranked by it;
//   - objects without one are ranked by offload order, newest soonest: activation offload reloads
//     in reverse order of offload, so the oldest activation is the one needed last;
//   - an unhinted object counts as used sooner than any hinted one (the hint says "not before my
//     turn"; no hint says nothing, and a wrong guess about an unhinted object costs less).
// Victims are taken from the "used last" end, prefetches from the "used soonest" end, so a
// prefetched object is never the next victim while something used later is still in memory.
//
// Watermarks (percent of the host pool). Spilling starts above `high` and goes on down to `low`;
// prefetching brings objects back only while the pool stays at or below `low`. Between the two
// nothing moves, so the tiers do not ping-pong an object back and forth.
#ifndef TIER_DAEMON_TIERS_SPILL_POLICY_H_
#define TIER_DAEMON_TIERS_SPILL_POLICY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <utility>

#include "storage/host_pool.h"

namespace tier::daemon {

struct Watermarks {
  uint32_t high_pct = 90;
  uint32_t low_pct = 75;  // <= high_pct (the config checks)
};

struct NextUse {
  uint64_t hint = 0;  // client's hint; 0: none
  uint64_t seq = 0;   // offload order (daemon-wide, increasing)
};

// Ordered by next use: a smaller rank is used later (and spilled sooner).
struct Rank {
  uint64_t group = 0;  // 0: hinted, 1: unhinted
  uint64_t key = 0;
  friend auto operator<=>(const Rank&, const Rank&) = default;
};

class SpillPolicy {
 public:
  explicit SpillPolicy(Watermarks watermarks) : watermarks_(watermarks) {}

  static Rank RankOf(NextUse use);

  // Above the high watermark: start spilling.
  bool MustSpill(const storage::PoolUsage& usage) const;
  // Above the low watermark: a spill already running goes on.
  bool KeepSpilling(const storage::PoolUsage& usage) const;
  // Bringing back `bytes` more keeps the pool at or below the low watermark.
  bool MayPrefetch(const storage::PoolUsage& usage, uint64_t bytes) const;

  const Watermarks& watermarks() const { return watermarks_; }

 private:
  Watermarks watermarks_;
};

// Items kept in next-use order: victims come from one end, prefetches from the other. Not
// thread-safe (the spiller guards it).
template <typename T>
class NextUseQueue {
 public:
  void Add(NextUse use, T item) { items_.emplace(SpillPolicy::RankOf(use), std::move(item)); }
  // The item used last (next to spill), or nothing.
  std::optional<T> TakeUsedLast() {
    if (items_.empty()) return std::nullopt;
    auto it = items_.begin();
    T item = std::move(it->second);
    items_.erase(it);
    return item;
  }
  // The item used soonest (next to prefetch), or nothing.
  std::optional<T> TakeUsedSoonest() {
    if (items_.empty()) return std::nullopt;
    auto it = std::prev(items_.end());
    T item = std::move(it->second);
    items_.erase(it);
    return item;
  }
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }

 private:
  std::multimap<Rank, T> items_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_TIERS_SPILL_POLICY_H_
