#include "engine/release_thread.h"

#include <utility>

#include "common/thread_role.h"

namespace tier::engine {

ReleaseThread::ReleaseThread() : thread_([this] { Run(); }) {}

ReleaseThread::~ReleaseThread() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

void ReleaseThread::Post(absl::AnyInvocable<void() &&> work) {
  {
    MutexLock lock(&mu_);
    if (!stop_) {
      queue_.push_back(std::move(work));
      ++posted_;
      cv_.SignalAll();
      return;
    }
  }
  std::move(work)();
}

void ReleaseThread::Drain() {
  MutexLock lock(&mu_);
  const uint64_t target = posted_;
  while (done_ < target) drained_cv_.Wait(&mu_);
}

size_t ReleaseThread::pending() const {
  MutexLock lock(&mu_);
  return static_cast<size_t>(posted_ - done_);
}

void ReleaseThread::Run() {
  SetThreadRole(ThreadRole::kReleaser);
  MutexLock lock(&mu_);
  for (;;) {
    while (!stop_ && queue_.empty()) cv_.Wait(&mu_);
    if (queue_.empty()) return;  // stopping, and nothing left
    absl::AnyInvocable<void() &&> work = std::move(queue_.front());
    queue_.pop_front();
    mu_.Unlock();
    std::move(work)();
    mu_.Lock();
    ++done_;
    drained_cv_.SignalAll();
  }
}

}  // namespace tier::engine
