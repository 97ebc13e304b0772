// Jobs waiting for host memory: an offload that found the pool full, a reload of a spilled object
// with no room to bring it back. They wait per queue (a session), within a queue strictly in
// arrival order: each time memory may have come free, the first waiter of each queue is tried in
// turn (`try_now`, no locks held): true, it got its room and is done; false, it stays first and
// those behind it keep waiting. (A later job of a session taking the room first could hold
// memory an earlier one needs; on a GPU lane, which is per session, a later ticket cannot even
// run before an earlier one, so that would be a deadlock.) Queues are served in turn, one waiter
// each per round, so one session's waiters (say, large offloads that wait long) cannot starve
// another's. A waiter gives up (`give_up`) only when the owner says no room can come: then only
// the one waiting longest gives up per round, and the others are looked at again. One of the two
// ends each wait, exactly once.
//
// Served by the NVMe tier's policy thread (daemon/tiers/spiller.h), which knows when memory may have
// come free and when nothing more can.
#ifndef TIER_DAEMON_JOBS_ADMISSION_QUEUE_H_
#define TIER_DAEMON_JOBS_ADMISSION_QUEUE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"

namespace tier::daemon {

class AdmissionQueue {
 public:
  // `on_wait(first)`: a wait began (first: with no other waiting; the owner's stall clock starts
  // then); the owner's thread should serve soon. Called without the queue's lock.
  explicit AdmissionQueue(std::function<void(bool first)> on_wait) : on_wait_(std::move(on_wait)) {}
  AdmissionQueue(const AdmissionQueue&) = delete;
  AdmissionQueue& operator=(const AdmissionQueue&) = delete;

  // Queues a waiter. After Close(), `give_up` runs at once instead.
  void Wait(uint64_t queue, std::function<bool()> try_now, std::function<void()> give_up);
  // Jobs are waiting (a new job needing room queues behind them). Lock-free: the offload path
  // asks it for every job. Stays true while a waiter is being tried.
  bool HasWaiters() const { return has_waiters_.load(std::memory_order_acquire); }
  size_t size() const;

  // kTry: serve the queues' first waiters in turn while they find room. kStuck: the same, and if
  // none found room, the oldest of them gives up.
  enum class Mode { kTry, kStuck };
  void Serve(Mode mode);
  // No more waits: every waiter gives up, and later ones give up at once.
  void Close();

 private:
  struct Waiter {
    uint64_t seq = 0;  // arrival order over all queues
    std::function<bool()> try_now;
    std::function<void()> give_up;
  };
  // The queues in serving order: from the first at or after next_queue_, wrapping around.
  std::vector<uint64_t> QueueOrderLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Done() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // a waiter ended

  const std::function<void(bool first)> on_wait_;
  mutable Mutex mu_;
  // A waiter being tried is out of its queue but still counted in waiters_. Only the serving
  // thread takes waiters out and erases queues.
  std::map<uint64_t, std::deque<Waiter>> waiting_ ABSL_GUARDED_BY(mu_);
  size_t waiters_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_queue_ ABSL_GUARDED_BY(mu_) = 0;  // the queue served first in the next round
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> has_waiters_{false};
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_JOBS_ADMISSION_QUEUE_H_
