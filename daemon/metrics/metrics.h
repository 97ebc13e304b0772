// Counters the status API reports. Lock-free on the job path: relaxed atomics, and a bandwidth
// meter of per-100 ms buckets over the last few seconds.
#ifndef TIER_DAEMON_METRICS_METRICS_H_
#define TIER_DAEMON_METRICS_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>

#include "daemon/jobs/job_gauge.h"
#include "daemon/metrics/job_metrics.h"

namespace tier::daemon {

// Bytes moved per 100 ms bucket over the last kBuckets buckets.
class BandwidthMeter {
 public:
  static constexpr int kBuckets = 50;  // 5 s
  void Add(uint64_t bytes, uint64_t now_ms);
  double BytesPerSecond(uint64_t now_ms) const;

 private:
  struct Bucket {
    std::atomic<uint64_t> epoch{0};  // now_ms / 100 of the bucket's contents
    std::atomic<uint64_t> bytes{0};
  };
  std::array<Bucket, kBuckets> buckets_;
};

// Counts shared by a session and the daemon totals.
struct JobCounters {
  std::atomic<uint64_t> jobs_completed{0};
  std::atomic<uint64_t> jobs_failed{0};
  std::atomic<uint64_t> bytes_offloaded{0};
  std::atomic<uint64_t> bytes_reloaded{0};
};

struct DaemonMetrics {
  JobCounters totals;
  JobGauge jobs_in_flight;
  // Jobs in flight that wait for nothing a client holds (no GPU ticket): only the daemon can be
  // holding them up, so when they stop completing, the daemon has stopped serving (health).
  std::atomic<uint64_t> unticketed_in_flight{0};
  // When a job last completed, or when jobs_in_flight last rose from 0 (MonotonicMs).
  std::atomic<uint64_t> last_progress_ms{0};
  BandwidthMeter bandwidth;
  // By kind and status code, and latency histograms (the metrics exporter, tierctl top).
  JobMetrics jobs;
};

uint64_t MonotonicMs();
uint64_t MonotonicNs();

}  // namespace tier::daemon

#endif  // TIER_DAEMON_METRICS_METRICS_H_
