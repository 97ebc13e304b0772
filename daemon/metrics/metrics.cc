#include "daemon/metrics/metrics.h"

#include <time.h>

namespace tier::daemon {

void BandwidthMeter::Add(uint64_t bytes, uint64_t now_ms, uint64_t session_id) {
  uint64_t epoch = now_ms / 100;
  Bucket& bucket = shards_[MetricShardOf(session_id)].buckets[epoch % kBuckets];
  uint64_t seen = bucket.epoch.load(std::memory_order_relaxed);
  // The first writer of a new epoch resets the bucket; a racing Add may lose a few bytes to the
  // reset, which a bandwidth readout tolerates.
  if (seen != epoch && bucket.epoch.compare_exchange_strong(seen, epoch)) {
    bucket.bytes.store(0, std::memory_order_relaxed);
  }
  bucket.bytes.fetch_add(bytes, std::memory_order_relaxed);
}

double BandwidthMeter::BytesPerSecond(uint64_t now_ms) const {
  uint64_t now_epoch = now_ms / 100;
  uint64_t total = 0;
  for (const Shard& shard : shards_) {
    for (const Bucket& bucket : shard.buckets) {
      uint64_t epoch = bucket.epoch.load(std::memory_order_relaxed);
      if (epoch + kBuckets > now_epoch && epoch <= now_epoch) {
        total += bucket.bytes.load(std::memory_order_relaxed);
      }
    }
  }
  return static_cast<double>(total) / (kBuckets / 10.0);
}

uint64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t MonotonicMs() { return MonotonicNs() / 1000000; }

}  // namespace tier::daemon
