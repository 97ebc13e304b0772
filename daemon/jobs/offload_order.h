// Numbers offloads in the order tierd accepted them (Object::seq: the spiller spills the oldest
// unhinted object first) without a counter that every GPU's ring poller adds to (one shared
// atomic per job is a cache miss for every GPU while another floods tierd with jobs: issue 26).
// Each session shard (daemon/metrics/metric_shards.h) numbers its offloads by the monotonic clock
// in nanoseconds, raised past its own last number; the shard is folded into the low bits. So
// numbers are unique, grow with each offload of a shard, and across shards follow the clock.
#ifndef TIER_DAEMON_JOBS_OFFLOAD_ORDER_H_
#define TIER_DAEMON_JOBS_OFFLOAD_ORDER_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>

#include "daemon/metrics/metric_shards.h"
#include "daemon/metrics/metrics.h"

namespace tier::daemon {

class OffloadOrder {
 public:
  // The number of an offload of session `session_id` accepted now (never 0).
  uint64_t Next(uint64_t session_id) {
    const int shard = MetricShardOf(session_id);
    std::atomic<uint64_t>& last = last_[shard].value;
    const uint64_t now = MonotonicNs();
    uint64_t prev = last.load(std::memory_order_relaxed);
    uint64_t next;
    do {
      next = std::max(now, prev + 1);
    } while (!last.compare_exchange_weak(prev, next, std::memory_order_relaxed));
    return next * kMetricShards + static_cast<uint64_t>(shard);
  }

 private:
  struct alignas(64) Last {
    std::atomic<uint64_t> value{0};
  };
  std::array<Last, kMetricShards> last_{};
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_JOBS_OFFLOAD_ORDER_H_
