// The one thread of a GPU engine that makes the runtime calls that release things: closing a
// client's IPC mapping, unmapping VMM memory, unregistering host memory, destroying streams. These
// calls may wait for the GPU (implicit synchronization) while holding a driver lock every other
// runtime call of the process needs, so they run here, never on a device worker (which issues and
// completes jobs) or on a thread that holds a lock someone else needs (see engine/stream_engine.h).
#ifndef TIER_ENGINE_RELEASE_THREAD_H_
#define TIER_ENGINE_RELEASE_THREAD_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <thread>

#include "absl/functional/any_invocable.h"
#include "common/mutex.h"

namespace tier::engine {

class ReleaseThread {
 public:
  ReleaseThread();
  // Runs whatever is still queued, then joins.
  ~ReleaseThread();
  ReleaseThread(const ReleaseThread&) = delete;
  ReleaseThread& operator=(const ReleaseThread&) = delete;

  // Queues `work` (run in order, once). After the destructor began, runs it on the caller.
  void Post(absl::AnyInvocable<void() &&> work) ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until everything posted before the call has run.
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);
  size_t pending() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  // A leaf: the work runs with it released.
  mutable Mutex mu_;
  CondVar cv_;          // work posted, or stop
  CondVar drained_cv_;  // a piece of work ran
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t posted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace tier::engine

#endif  // TIER_ENGINE_RELEASE_THREAD_H_
