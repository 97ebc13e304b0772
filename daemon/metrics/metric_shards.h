// Daemon-wide job counts with no daemon-wide cache line on the job path. Every job adds to a few
// counts (jobs in flight, totals, bandwidth, latency histograms) from the thread that runs it:
// the ring poller and the device worker of its GPU. In one atomic each, those lines would move
// between the cores of every GPU's threads, and a flood of small jobs on one GPU would cost every
// other GPU's job a cache miss per count (issue 26). So each count is kept in shards, a cache line
// each, picked by the job's session: the same shard at a job's start and at its end, and
// different sessions (GPUs) on different lines. Reading sums (or takes the latest
// of) the shards: a snapshot that may miss a job counted meanwhile, which every reader tolerates.
#ifndef TIER_DAEMON_METRICS_METRIC_SHARDS_H_
#define TIER_DAEMON_METRICS_METRIC_SHARDS_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>

namespace tier::daemon {

inline constexpr int kMetricShards = 16;

// The shard of a session's jobs. Session ids count up from 1, so sessions opened one after
// another (one per GPU, as ranks do) take different shards until there are more than 16.
inline int MetricShardOf(uint64_t session_id) {
  return static_cast<int>(session_id % kMetricShards);
}

// A count summed over shards. Add and Sub of one job name the same session, so no shard goes
// below zero.
class ShardedCounter {
 public:
  void Add(uint64_t session_id, uint64_t n = 1) {
    shards_[MetricShardOf(session_id)].value.fetch_add(n, std::memory_order_relaxed);
  }
  void Sub(uint64_t session_id, uint64_t n = 1) {
    shards_[MetricShardOf(session_id)].value.fetch_sub(n, std::memory_order_relaxed);
  }
  uint64_t Sum() const {
    uint64_t sum = 0;
    for (const Shard& s : shards_) sum += s.value.load(std::memory_order_relaxed);
    return sum;
  }

 private:
  struct alignas(64) Shard {
    std::atomic<uint64_t> value{0};
  };
  std::array<Shard, kMetricShards> shards_{};
};

// The latest of a value (a time) stored from many threads: each stores into its session's shard,
// the reader takes the largest.
class ShardedLatest {
 public:
  void Store(uint64_t session_id, uint64_t value) {
    shards_[MetricShardOf(session_id)].value.store(value, std::memory_order_relaxed);
  }
  uint64_t Latest() const {
    uint64_t latest = 0;
    for (const Shard& s : shards_) {
      latest = std::max(latest, s.value.load(std::memory_order_relaxed));
    }
    return latest;
  }

 private:
  struct alignas(64) Shard {
    std::atomic<uint64_t> value{0};
  };
  std::array<Shard, kMetricShards> shards_{};
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_METRICS_METRIC_SHARDS_H_
