// Counters the status API reports. Lock-free on the job path: relaxed atomics, and a bandwidth
// meter of per-100 ms buckets over the last few seconds. The daemon-wide ones are kept in shards
// by session (daemon/metrics/metric_shards.h), so that the threads of different GPUs write
// different cache lines; readers sum them.
#ifndef TIER_DAEMON_METRICS_METRICS_H_
#define TIER_DAEMON_METRICS_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>

#include "daemon/jobs/job_gauge.h"
#include "daemon/metrics/job_metrics.h"
#include "daemon/metrics/metric_shards.h"

namespace tier::daemon {

// Bytes moved per 100 ms bucket over the last kBuckets buckets, in shards by session
// (`session_id`; 0 for the NVMe tier's meters, which one thread feeds).
class BandwidthMeter {
 public:
  static constexpr int kBuckets = 50;  // 5 s
  void Add(uint64_t bytes, uint64_t now_ms, uint64_t session_id = 0);
  double BytesPerSecond(uint64_t now_ms) const;

 private:
  struct Bucket {
    std::atomic<uint64_t> epoch{0};  // now_ms / 100 of the bucket's contents
    std::atomic<uint64_t> bytes{0};
  };
  struct alignas(64) Shard {
    std::array<Bucket, kBuckets> buckets;
  };
  std::array<Shard, kMetricShards> shards_;
};

// Counts shared by a session and the daemon totals.
struct JobCounters {
  std::atomic<uint64_t> jobs_completed{0};
  std::atomic<uint64_t> jobs_failed{0};
  std::atomic<uint64_t> bytes_offloaded{0};
  std::atomic<uint64_t> bytes_reloaded{0};
};

// The daemon's totals of JobCounters, by session shard.
struct JobTotals {
  ShardedCounter jobs_completed;
  ShardedCounter jobs_failed;
  ShardedCounter bytes_offloaded;
  ShardedCounter bytes_reloaded;
};

struct DaemonMetrics {
  JobTotals totals;
  JobGauge jobs_in_flight;
  // Jobs in flight that wait for nothing a client holds (no GPU ticket): only the daemon can be
  // holding them up, so when they stop completing, the daemon has stopped serving (health).
  ShardedCounter unticketed_in_flight;
  // When a job last completed, or when a shard's jobs in flight last rose from 0 (MonotonicMs).
  ShardedLatest last_progress_ms;
  BandwidthMeter bandwidth;
  // By kind and status code, and latency histograms (the metrics exporter, tierctl top).
  JobMetrics jobs;
};

uint64_t MonotonicMs();
uint64_t MonotonicNs();

}  // namespace tier::daemon

#endif  // TIER_DAEMON_METRICS_METRICS_H_
