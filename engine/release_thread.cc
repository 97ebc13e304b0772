#include "engine/release_thread.h"

#include <utility>

#include "common/thread_role.h"

namespace tier::engine {

ReleaseThread::ReleaseThread() : thread_([this] { Run(); }) {}

ReleaseThread::~ReleaseThread() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ReleaseThread::Post(absl::AnyInvocable<void() &&> work) {
  {
    std::lock_guard lock(mu_);
    if (!stop_) {
      queue_.push_back(std::move(work));
      ++posted_;
      cv_.notify_all();
      return;
    }
  }
  std::move(work)();
}

void ReleaseThread::Drain() {
  std::unique_lock lock(mu_);
  uint64_t target = posted_;
  drained_cv_.wait(lock, [&] { return done_ >= target; });
}

size_t ReleaseThread::pending() const {
  std::lock_guard lock(mu_);
  return static_cast<size_t>(posted_ - done_);
}

void ReleaseThread::Run() {
  SetThreadRole(ThreadRole::kReleaser);
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and nothing left
    absl::AnyInvocable<void() &&> work = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    std::move(work)();
    lock.lock();
    ++done_;
    drained_cv_.notify_all();
  }
}

}  // namespace tier::engine
