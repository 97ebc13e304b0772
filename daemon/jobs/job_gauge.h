// The daemon's jobs in flight, and a wait for none (drain). The job path pays one atomic add and
// one atomic subtract per job, as a plain counter would; only a job that brings the count to zero
// while someone waits takes the lock, to wake the waiter.
#ifndef TIER_DAEMON_JOBS_JOB_GAUGE_H_
#define TIER_DAEMON_JOBS_JOB_GAUGE_H_

#include <atomic>
#include <chrono>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"

namespace tier::daemon {

class JobGauge {
 public:
  // One more job; true when the count rose from zero.
  bool Add() { return count_.fetch_add(1) == 0; }
  // One job fewer.
  void Sub() {
    // Sequentially consistent with AwaitZero's increment of waiters_: either this sees the
    // waiter (and wakes it under the lock, so not before it waits), or the waiter's read of the
    // count comes after this decrement and sees it.
    if (count_.fetch_sub(1) == 1 && waiters_.load() > 0) {
      MutexLock lock(&mu_);
      zero_.SignalAll();
    }
  }
  uint64_t value() const { return count_.load(std::memory_order_relaxed); }

  // Until no job is in flight or `deadline` passed; returns the jobs still in flight.
  uint64_t AwaitZero(std::chrono::steady_clock::time_point deadline) {
    waiters_.fetch_add(1);
    {
      MutexLock lock(&mu_);
      while (count_.load() > 0) {
        if (!zero_.WaitUntil(&mu_, deadline)) break;
      }
    }
    waiters_.fetch_sub(1);
    return count_.load();
  }

 private:
  std::atomic<uint64_t> count_{0};
  std::atomic<uint32_t> waiters_{0};
  Mutex mu_;
  CondVar zero_;  // with mu_: count_ reached zero
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_JOBS_JOB_GAUGE_H_
