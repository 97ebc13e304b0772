// The thread that drains every session's submission queue. While jobs keep coming it polls
// (no system call per job); after poll_idle_us without work it sets each ring's need_wakeup flag
// and sleeps on the sessions' doorbells (see the wake-up protocol in tier/ring.h).
//
// It never blocks on anything a client holds: the doorbells it reads are the daemon's own ends of
// pipes (daemon/sessions/session.h), so a client cannot stop every session's jobs by making a read block,
// and SIGTERM's Stop() always finds the thread going round.
//
// What one session can cost it is bounded: kBatch entries per session per pass, and wake-ups. A
// client that keeps ringing its doorbell without submitting (kMaxIdleRings wake-ups in a row that
// brought no entry) has its doorbell ignored for kMuteMs; its ring is still looked at on every
// pass, and the poller then sleeps at most until the mute ends, so its jobs are served, only
// later. Its epoll set is made once, at Start, and kept in step with the sessions (no epoll to
// re-create when descriptors run out); a doorbell it cannot watch (epoll_ctl failing) is polled
// like a muted one.
#ifndef TIER_DAEMON_JOBS_RING_POLLER_H_
#define TIER_DAEMON_JOBS_RING_POLLER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/log_rate_limiter.h"
#include "common/mutex.h"
#include "common/unique_fd.h"
#include "daemon/jobs/job_executor.h"
#include "daemon/sessions/session_registry.h"

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
  // How the poller watches one session's doorbell (poller thread only).
  struct Doorbell {
    std::shared_ptr<Session> session;
    bool watched = false;    // in the epoll set (EPOLLIN, or only hang-ups while muted)
    bool muted = false;
    bool rang = false;       // woke the poller since its ring was last drained
    uint32_t idle_rings = 0;  // wake-ups in a row that brought no entry
    uint64_t unmute_ms = 0;
  };

  // Takes up to a batch of entries from one session. Returns true if it took any.
  bool Drain(const std::shared_ptr<Session>& session, bool* blocked);
  void Sleep(bool any_blocked);
  // Brings the epoll set and doorbells_ in step with `sessions` (the active set).
  void UpdateDoorbells(const std::vector<std::shared_ptr<Session>>& sessions);
  // Counts a wake-up of `bell`'s that brought no entry (or resets the count when it did); mutes
  // and unmutes.
  void NoteDrain(Doorbell& bell, bool took, uint64_t now_ms);
  void Watch(Doorbell& bell, uint32_t events, int op);
  // How long the thread may sleep before a muted or unwatched doorbell must be looked at.
  int SleepBoundMs(int timeout_ms, uint64_t now_ms) const;
  // epoll_wait on the doorbells; ends the sessions whose client closed its doorbell.
  void WaitForDoorbells(int timeout_ms);

  SessionRegistry& registry_;
  JobExecutor& executor_;
  const uint64_t poll_idle_ns_;
  UniqueFd wake_fd_;
  UniqueFd epoll_fd_;
  std::vector<std::shared_ptr<Session>> sessions_;  // the active set; poller thread only
  std::map<Session*, Doorbell> doorbells_;          // one per entry of sessions_; poller thread only
  LogRateLimiter mute_log_{10, 60000};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> heartbeat_ms_{0};
  std::atomic<uint32_t> idle_waiters_{0};
  Mutex idle_mu_;
  CondVar idle_cv_;  // with idle_mu_: idle_passes_ went up
  uint64_t idle_passes_ ABSL_GUARDED_BY(idle_mu_) = 0;
  std::thread thread_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_JOBS_RING_POLLER_H_
