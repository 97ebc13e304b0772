// The daemon's jobs in flight, and a wait for none (drain). The job path pays one atomic add and
// one atomic subtract per job on its session's shard (daemon/metrics/metric_shards.h: no cache
// line shared by every GPU's threads); only a job that brings its shard to zero while someone
// waits takes the lock, to wake the waiter.
#ifndef TIER_DAEMON_JOBS_JOB_GAUGE_H_
#define TIER_DAEMON_JOBS_JOB_GAUGE_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "daemon/metrics/metric_shards.h"

namespace tier::daemon {

class JobGauge {
 public:
  // One more job of session `session_id`; true when its shard rose from zero (no job of the
  // sessions sharing it was in flight).
  bool Add(uint64_t session_id) { return Shard(session_id).fetch_add(1) == 0; }
  // One job of session `session_id` fewer (the session its Add named).
  void Sub(uint64_t session_id) {
    // Sequentially consistent with AwaitZero's increment of waiters_: either this sees the
    // waiter (and wakes it under the lock, so not before it waits), or the waiter's read of the
    // shards comes after this decrement and sees it.
    if (Shard(session_id).fetch_sub(1) == 1 && waiters_.load() > 0) {
      MutexLock lock(&mu_);
      zero_.SignalAll();
    }
  }
  // The sum over the shards: each is read once, so a job that started after its shard was read
  // is not counted (as it would not be had it started after the read of one count).
  uint64_t value() const {
    uint64_t sum = 0;
    for (const Count& c : counts_) sum += c.value.load();
    return sum;
  }

  // Until no job is in flight or `deadline` passed; returns the jobs still in flight.
  uint64_t AwaitZero(std::chrono::steady_clock::time_point deadline) {
    waiters_.fetch_add(1);
    {
      MutexLock lock(&mu_);
      while (value() > 0) {
        if (!zero_.WaitUntil(&mu_, deadline)) break;
      }
    }
    waiters_.fetch_sub(1);
    return value();
  }

 private:
  struct alignas(64) Count {
    std::atomic<uint64_t> value{0};
  };
  std::atomic<uint64_t>& Shard(uint64_t session_id) {
    return counts_[MetricShardOf(session_id)].value;
  }

  std::array<Count, kMetricShards> counts_{};
  // Read on every job's end, written only by a drain: it stays in every core's cache.
  alignas(64) std::atomic<uint32_t> waiters_{0};
  Mutex mu_;
  CondVar zero_;  // with mu_: a shard reached zero
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_JOBS_JOB_GAUGE_H_
