#include "daemon/jobs/admission_queue.h"

#include <utility>

namespace tier::daemon {

void AdmissionQueue::Wait(uint64_t queue, std::function<bool()> try_now,
                          std::function<void()> give_up) {
  bool queued = false, first = false;
  {
    MutexLock lock(&mu_);
    if (!closed_) {
      first = waiters_ == 0;
      waiting_[queue].push_back(Waiter{next_seq_++, std::move(try_now), std::move(give_up)});
      ++waiters_;
      has_waiters_.store(true, std::memory_order_release);
      queued = true;
    }
  }
  if (!queued) {
    give_up();
    return;
  }
  if (on_wait_) on_wait_(first);
}

size_t AdmissionQueue::size() const {
  MutexLock lock(&mu_);
  return waiters_;
}

std::vector<uint64_t> AdmissionQueue::QueueOrderLocked() const {
  std::vector<uint64_t> order;
  auto start = waiting_.lower_bound(next_queue_);
  for (auto it = start; it != waiting_.end(); ++it) order.push_back(it->first);
  for (auto it = waiting_.begin(); it != start; ++it) order.push_back(it->first);
  return order;
}

void AdmissionQueue::Done() {
  --waiters_;
  if (waiters_ == 0) has_waiters_.store(false, std::memory_order_release);
}

void AdmissionQueue::Serve(Mode mode) {
  bool served_any = false;
  uint64_t oldest_queue = 0, oldest_seq = ~uint64_t{0};  // of the last round's waiters
  for (;;) {
    // One round: the first waiter of each queue, the queues in turn from the one after the first
    // of the last round. Rounds go on while someone gets room.
    std::vector<uint64_t> order;
    {
      MutexLock lock(&mu_);
      order = QueueOrderLocked();
      if (!order.empty()) next_queue_ = order.front() + 1;
    }
    bool served = false;
    oldest_seq = ~uint64_t{0};
    for (uint64_t queue : order) {
      Waiter waiter;
      {
        MutexLock lock(&mu_);
        auto it = waiting_.find(queue);
        if (it == waiting_.end() || it->second.empty()) continue;
        // Out of its queue while tried, but still counted: a new job must not overtake it.
        waiter = std::move(it->second.front());
        it->second.pop_front();
      }
      const bool got_room = waiter.try_now();
      bool closed = false;
      {
        MutexLock lock(&mu_);
        // (New waiters may have joined this queue meanwhile.)
        std::deque<Waiter>& waiters = waiting_[queue];
        if (got_room) {
          served = true;
          Done();
        } else if (closed_) {
          closed = true;  // closed while it was tried: Close did not see it
        } else {
          if (waiter.seq < oldest_seq) {
            oldest_seq = waiter.seq;
            oldest_queue = queue;
          }
          waiters.push_front(std::move(waiter));  // still first
        }
        if (waiters.empty()) waiting_.erase(queue);
      }
      if (closed) {
        waiter.give_up();
        MutexLock lock(&mu_);
        Done();
      }
    }
    served_any |= served;
    if (!served) break;
  }
  // Stuck, and nobody found room (someone who did would have started a copy, which may free
  // memory): only the oldest gives up. Its end may be what the others wait for (a GPU lane
  // released by its ticket); if not, the next round finds them stuck again.
  if (mode != Mode::kStuck || served_any || oldest_seq == ~uint64_t{0}) return;
  Waiter doomed;
  {
    MutexLock lock(&mu_);
    auto it = waiting_.find(oldest_queue);
    if (it != waiting_.end() && !it->second.empty() && it->second.front().seq == oldest_seq) {
      doomed = std::move(it->second.front());
      it->second.pop_front();
    }
  }
  if (!doomed.give_up) return;
  doomed.give_up();
  MutexLock lock(&mu_);
  Done();
  auto it = waiting_.find(oldest_queue);
  if (it != waiting_.end() && it->second.empty()) waiting_.erase(it);
}

void AdmissionQueue::Close() {
  std::vector<Waiter> all;
  {
    MutexLock lock(&mu_);
    closed_ = true;
    for (auto& [queue, waiters] : waiting_) {
      for (Waiter& waiter : waiters) all.push_back(std::move(waiter));
    }
    waiting_.clear();
  }
  for (Waiter& waiter : all) waiter.give_up();
  MutexLock lock(&mu_);
  for (size_t i = 0; i < all.size(); ++i) Done();
}

}  // namespace tier::daemon
