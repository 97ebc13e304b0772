// The one thread of a GPU engine that makes the runtime calls that release things: closing a
// client's IPC mapping, unmapping VMM memory, unregistering host memory, destroying streams. These
// calls may wait for the GPU (implicit synchronization) while holding a driver lock every other
// runtime call of the process needs, so they run here, never on a device worker (which issues and
// completes jobs) or on a thread that holds a lock someone else needs (see engine/stream_engine.h).
#ifndef TIER_ENGINE_RELEASE_THREAD_H_
#define TIER_ENGINE_RELEASE_THREAD_H_

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/functional/any_invocable.h"

namespace tier::engine {

class ReleaseThread {
 public:
  ReleaseThread();
  // Runs whatever is still queued, then joins.
  ~ReleaseThread();
  ReleaseThread(const ReleaseThread&) = delete;
  ReleaseThread& operator=(const ReleaseThread&) = delete;

  // Queues `work` (run in order, once). After the destructor began, runs it on the caller.
  void Post(absl::AnyInvocable<void() &&> work);
  // Blocks until everything posted before the call has run.
  void Drain();
  size_t pending() const;

 private:
  void Run();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable drained_cv_;
  std::deque<absl::AnyInvocable<void() &&>> queue_;
  uint64_t posted_ = 0;
  uint64_t done_ = 0;
  bool stop_ = false;
  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace tier::engine

#endif  // TIER_ENGINE_RELEASE_THREAD_H_
