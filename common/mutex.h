// The daemon's lock and condition variable: std::mutex and std::condition_variable with clang's
// thread-safety annotations, so "guarded by" and "called with the lock held" are checked by the
// compiler (clang -Wthread-safety, in the TSan build of scripts/test) instead of written as prose.
//
// Why not absl::Mutex: Debian's Abseil is a prebuilt library without TSan instrumentation, so
// TSan cannot see absl::Mutex's acquire and release (they are atomics inside that library) and
// reports every access it guards as a race. std::mutex is pthreads, which TSan intercepts.
#ifndef TIER_COMMON_MUTEX_H_
#define TIER_COMMON_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace tier {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }
  // Tells the analysis the caller holds it (where the code path proves it but the analysis
  // cannot follow, e.g. a callback run under the lock). Checks nothing at run time.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Waits release the Mutex and hold it again when they return. Callers wait in a loop on their
// own condition (wake-ups may be spurious).
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held: the caller's MutexLock releases it
  }
  // False when `deadline` passed (the Mutex is held again either way). time_point::max() waits
  // without a deadline.
  bool WaitUntil(Mutex* mu, std::chrono::steady_clock::time_point deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (deadline == std::chrono::steady_clock::time_point::max()) {
      Wait(mu);
      return true;
    }
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace tier

#endif  // TIER_COMMON_MUTEX_H_
