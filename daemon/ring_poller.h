// The thread that drains every session's submission queue. While jobs keep coming it polls
// (no system call per job); after poll_idle_us without work it sets each ring's need_wakeup flag
// and sleeps on the sessions' doorbells (see the wake-up protocol in tier/ring.h).
//
// It never blocks on anything a client holds: the doorbells it reads are the daemon's own ends of
// pipes (daemon/session.h), so a client cannot stop every session's jobs by making a read block,
// and SIGTERM's Stop() always finds the thread going round.
#ifndef TIER_DAEMON_RING_POLLER_H_
#define TIER_DAEMON_RING_POLLER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/mutex.h"
#include "common/unique_fd.h"
#include "daemon/job_executor.h"
#include "daemon/session_registry.h"

namespace tier::daemon {

class RingPoller {
 public:
  RingPoller(SessionRegistry& registry, JobExecutor& executor, uint32_t poll_idle_us);
  ~RingPoller();
  absl::Status Start();
  void Stop();
  // Wakes the thread if it sleeps (any thread may call it).
  void Wake();
  // When the loop last went round (it does at least every 500 ms, idle or not): the watchdog's
  // evidence that jobs are being served.
  uint64_t last_heartbeat_ms() const { return heartbeat_ms_.load(std::memory_order_relaxed); }
  // Until the thread has gone once round every ring, starting after this call, and found nothing
  // to take and no session blocked with entries left: what clients pushed before the call has
  // been taken. False when `deadline` passed first (a client keeps pushing, or a session stays
  // blocked on its full completion queue). While someone waits here the thread does not sleep.
  bool AwaitIdlePass(std::chrono::steady_clock::time_point deadline);

 private:
  void Run();
  // A pass found nothing to take (called only while someone waits for one).
  void NoteIdlePass();
  // Takes up to a batch of entries from one session. Returns true if it took any.
  bool Drain(const std::shared_ptr<Session>& session, bool* blocked);
  void Sleep(const std::vector<std::shared_ptr<Session>>& sessions, bool any_blocked);
  void RebuildEpoll(const std::vector<std::shared_ptr<Session>>& sessions);
  // epoll_wait on the doorbells; ends the sessions whose client closed its doorbell.
  void WaitForDoorbells(const std::vector<std::shared_ptr<Session>>& sessions, int timeout_ms);

  SessionRegistry& registry_;
  JobExecutor& executor_;
  const uint64_t poll_idle_ns_;
  UniqueFd wake_fd_;
  UniqueFd epoll_fd_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> heartbeat_ms_{0};
  std::atomic<uint32_t> idle_waiters_{0};
  Mutex idle_mu_;
  CondVar idle_cv_;  // with idle_mu_: idle_passes_ went up
  uint64_t idle_passes_ ABSL_GUARDED_BY(idle_mu_) = 0;
  std::thread thread_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_RING_POLLER_H_
