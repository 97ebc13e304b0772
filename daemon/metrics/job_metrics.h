// What the job path reports about itself: jobs started by kind, jobs ended by kind and status
// code, and latency histograms (submit to completion) by kind and size class. Read by the metrics
// exporter and the status API.
//
// The job path calls Started() and Completed() once per job (JobExecutor::Start, JobEnds::Complete).
// Each costs a clock read and a few relaxed atomic adds into fixed arrays: no lock, no allocation,
// no map. The submit time waits in SubmitTimes (a fixed table) between the two. The arrays are
// kept once per session shard (daemon/metrics/metric_shards.h), so the threads of different GPUs
// add to different cache lines; reading sums the shards.
#ifndef TIER_DAEMON_METRICS_JOB_METRICS_H_
#define TIER_DAEMON_METRICS_JOB_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>

#include "daemon/metrics/metric_shards.h"
#include "daemon/metrics/submit_times.h"
#include "tier/ring.h"

namespace tier::daemon {

enum class JobKind { kOffload, kReload, kFree, kNop, kInvalid };
inline constexpr int kJobKinds = 5;
JobKind JobKindOf(uint32_t opcode);
std::string_view JobKindName(JobKind kind);  // "offload", "reload", "free", "nop", "invalid"

// Offloads and reloads by length: up to 64 KiB, 1 MiB, 16 MiB, 256 MiB, larger. Jobs without a
// length (free, nop, invalid) are in kNoSize.
inline constexpr int kSizeClasses = 6;
inline constexpr int kNoSize = kSizeClasses - 1;
int SizeClassOf(JobKind kind, uint64_t len);
// "0-64KiB", "64KiB-1MiB", "1MiB-16MiB", "16MiB-256MiB", "256MiB+", "none".
std::string_view SizeClassName(int size_class);

// Upper bounds of the latency buckets, in nanoseconds (1 us .. 30 s); one more bucket (+Inf)
// follows the last.
inline constexpr std::array<uint64_t, 23> kLatencyBoundsNs = {
    1'000,       2'500,       5'000,       10'000,        25'000,        50'000,
    100'000,     250'000,     500'000,     1'000'000,     2'500'000,     5'000'000,
    10'000'000,  25'000'000,  50'000'000,  100'000'000,   250'000'000,   500'000'000,
    1'000'000'000, 2'500'000'000, 5'000'000'000, 10'000'000'000, 30'000'000'000};
inline constexpr int kLatencyBuckets = static_cast<int>(kLatencyBoundsNs.size()) + 1;

// The canonical status codes 0 (OK) .. 16 (UNAUTHENTICATED); others count as UNKNOWN (2).
inline constexpr int kStatusCodes = 17;

// One histogram as read: per-bucket counts (not cumulative; the last is +Inf) and their sum.
struct LatencySnapshot {
  std::array<uint64_t, kLatencyBuckets> buckets{};
  uint64_t count = 0;
  uint64_t sum_ns = 0;
};

class JobMetrics {
 public:
  JobMetrics();

  // A job taken from a session's ring and started (not one refused while draining).
  void Started(uint64_t session_id, const ring::SubmissionEntry& entry);
  // A job ended with `status_code` (its completion entry's), started or refused.
  void Completed(uint64_t session_id, const ring::SubmissionEntry& entry, int status_code);

  uint64_t started(JobKind kind) const;
  uint64_t completed(JobKind kind, int status_code) const;
  LatencySnapshot latency(JobKind kind, int size_class) const;
  // Completions not in any histogram: refused before they started, or their submit time was
  // overwritten (more than SubmitTimes::kSlots jobs of a session in flight at once).
  uint64_t unmeasured() const;

 private:
  struct alignas(64) Histogram {
    std::array<std::atomic<uint64_t>, kLatencyBuckets> buckets{};
    std::atomic<uint64_t> sum_ns{0};
  };
  // Every count of the sessions of one shard.
  struct alignas(64) Shard {
    std::array<std::array<Histogram, kSizeClasses>, kJobKinds> latency{};
    std::array<std::array<std::atomic<uint64_t>, kStatusCodes>, kJobKinds> completed{};
    std::array<std::atomic<uint64_t>, kJobKinds> started{};
    std::atomic<uint64_t> unmeasured{0};
  };

  const std::unique_ptr<Shard[]> shards_;  // kMetricShards of them (~100 KiB: on the heap)
  SubmitTimes submit_times_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_METRICS_JOB_METRICS_H_
