#include "daemon/metrics/job_metrics.h"

#include <algorithm>

#include "daemon/metrics/metrics.h"

namespace tier::daemon {

JobKind JobKindOf(uint32_t opcode) {
  switch (static_cast<ring::Opcode>(opcode)) {
    case ring::Opcode::kOffload:
      return JobKind::kOffload;
    case ring::Opcode::kReload:
      return JobKind::kReload;
    case ring::Opcode::kFree:
      return JobKind::kFree;
    case ring::Opcode::kNop:
      return JobKind::kNop;
  }
  return JobKind::kInvalid;
}

std::string_view JobKindName(JobKind kind) {
  switch (kind) {
    case JobKind::kOffload:
      return "offload";
    case JobKind::kReload:
      return "reload";
    case JobKind::kFree:
      return "free";
    case JobKind::kNop:
      return "nop";
    case JobKind::kInvalid:
      break;
  }
  return "invalid";
}

int SizeClassOf(JobKind kind, uint64_t len) {
  if (kind != JobKind::kOffload && kind != JobKind::kReload) return kNoSize;
  if (len <= (64u << 10)) return 0;
  if (len <= (1u << 20)) return 1;
  if (len <= (16u << 20)) return 2;
  if (len <= (256u << 20)) return 3;
  return 4;
}

std::string_view SizeClassName(int size_class) {
  static constexpr std::string_view kNames[kSizeClasses] = {
      "0-64KiB", "64KiB-1MiB", "1MiB-16MiB", "16MiB-256MiB", "256MiB+", "none"};
  return size_class >= 0 && size_class < kSizeClasses ? kNames[size_class] : "none";
}

JobMetrics::JobMetrics() : shards_(std::make_unique<Shard[]>(kMetricShards)) {}

void JobMetrics::Started(uint64_t session_id, const ring::SubmissionEntry& entry) {
  Shard& shard = shards_[MetricShardOf(session_id)];
  shard.started[static_cast<int>(JobKindOf(entry.opcode))].fetch_add(1, std::memory_order_relaxed);
  submit_times_.Record(session_id, entry.job_id, MonotonicNs());
}

void JobMetrics::Completed(uint64_t session_id, const ring::SubmissionEntry& entry,
                           int status_code) {
  const JobKind kind = JobKindOf(entry.opcode);
  const int k = static_cast<int>(kind);
  if (status_code < 0 || status_code >= kStatusCodes) status_code = 2;  // UNKNOWN
  Shard& shard = shards_[MetricShardOf(session_id)];
  shard.completed[k][status_code].fetch_add(1, std::memory_order_relaxed);
  std::optional<uint64_t> ns = submit_times_.Elapsed(session_id, entry.job_id, MonotonicNs());
  if (!ns) {
    shard.unmeasured.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  Histogram& histogram = shard.latency[k][SizeClassOf(kind, entry.len)];
  // The first bucket whose bound is >= the latency (Prometheus' "le"); past the last: +Inf.
  const auto bucket = std::lower_bound(kLatencyBoundsNs.begin(), kLatencyBoundsNs.end(), *ns) -
                      kLatencyBoundsNs.begin();
  histogram.buckets[bucket].fetch_add(1, std::memory_order_relaxed);
  histogram.sum_ns.fetch_add(*ns, std::memory_order_relaxed);
}

uint64_t JobMetrics::started(JobKind kind) const {
  uint64_t sum = 0;
  for (int i = 0; i < kMetricShards; ++i) {
    sum += shards_[i].started[static_cast<int>(kind)].load(std::memory_order_relaxed);
  }
  return sum;
}

uint64_t JobMetrics::completed(JobKind kind, int status_code) const {
  if (status_code < 0 || status_code >= kStatusCodes) return 0;
  uint64_t sum = 0;
  for (int i = 0; i < kMetricShards; ++i) {
    const auto& count = shards_[i].completed[static_cast<int>(kind)][status_code];
    sum += count.load(std::memory_order_relaxed);
  }
  return sum;
}

uint64_t JobMetrics::unmeasured() const {
  uint64_t sum = 0;
  for (int i = 0; i < kMetricShards; ++i) {
    sum += shards_[i].unmeasured.load(std::memory_order_relaxed);
  }
  return sum;
}

LatencySnapshot JobMetrics::latency(JobKind kind, int size_class) const {
  LatencySnapshot out;
  if (size_class < 0 || size_class >= kSizeClasses) return out;
  // Read without stopping writers: sum and buckets may disagree by the jobs that completed
  // meanwhile, which a scrape tolerates (the next one catches up).
  for (int s = 0; s < kMetricShards; ++s) {
    const Histogram& histogram = shards_[s].latency[static_cast<int>(kind)][size_class];
    for (int i = 0; i < kLatencyBuckets; ++i) {
      const uint64_t n = histogram.buckets[i].load(std::memory_order_relaxed);
      out.buckets[i] += n;
      out.count += n;
    }
    out.sum_ns += histogram.sum_ns.load(std::memory_order_relaxed);
  }
  return out;
}

}  // namespace tier::daemon
