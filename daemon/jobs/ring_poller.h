// One thread that drains the submission queues of the sessions in its care: those of one GPU
// (home_device(), daemon/sessions/session.h), or, for the default poller, those with no GPU of
// their own yet (daemon/jobs/ring_pollers.h owns one per GPU and the default one). While jobs keep
// coming it polls (no system call per job); after poll_idle_us without work it sets each ring's
// need_wakeup flag and sleeps on the sessions' doorbells (see the wake-up protocol in tier/ring.h).
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
//
// Moving (a session's first GPU buffer makes that GPU its home, and the registry's generation
// changes): the poller that held its queue lets go of it when it next re-reads its sessions,
// between passes, never in the middle of a drain (Session::ReleaseSubmissions), and the new home
// takes it on its next pass (Session::TakeSubmissions); until then it counts as blocked there
// (no idle pass, no long sleep). Entries pushed meanwhile wait in the ring: none is lost, none
// is taken twice.
#ifndef TIER_DAEMON_JOBS_RING_POLLER_H_
#define TIER_DAEMON_JOBS_RING_POLLER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
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

// Which sessions a poller serves.
struct PollerPlace {
  // Sessions whose home_device() is this GPU; -1: the default poller, which serves every session
  // with no home device, or one on a GPU outside 0..devices-1.
  int device = -1;
  int devices = 0;  // GPUs 0..devices-1 have a poller of their own
  // Called on this poller's thread after it let go of a session whose home is now `device`'s
  // poller (so that one takes it without waiting for its next pass). May be empty.
  std::function<void(int device)> let_go;
};

class RingPoller {
 public:
  RingPoller(SessionRegistry& registry, JobExecutor& executor, uint32_t poll_idle_us,
             PollerPlace place = {});
  ~RingPoller();
  absl::Status Start();
  void Stop();
  // Wakes the thread if it sleeps (any thread may call it).
  void Wake();
  int device() const { return place_.device; }
  // The poller `session` belongs to, by its home device (-1: the default one).
  int DeviceOf(const Session& session) const;
  // Whether this poller holds the session's submission queue now (it took it on a pass).
  bool Holds(const Session& session) const { return session.HoldsSubmissions(holder_id()); }
  // When the loop last went round (it does at least every 500 ms, idle or not): the watchdog's
  // evidence that jobs are being served.
  uint64_t last_heartbeat_ms() const { return heartbeat_ms_.load(std::memory_order_relaxed); }
  // Sessions in its care as of its last look (diagnostics).
  uint32_t sessions() const { return session_count_.load(std::memory_order_relaxed); }
  // Sessions it let go to another poller since start, counted before each let go:
  // RingPollers::AwaitIdlePass looks for moves during its wait (a session in transit is in
  // nobody's pass).
  uint64_t moves_out() const { return moves_out_.load(std::memory_order_acquire); }
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
  // The active sessions whose poller is this one.
  std::vector<std::shared_ptr<Session>> OwnSessions() const;
  // Brings the epoll set and doorbells_ in step with `sessions` (the active set of this poller);
  // lets go of sessions that moved to another poller.
  void UpdateDoorbells(const std::vector<std::shared_ptr<Session>>& sessions);
  // Counts a wake-up of `bell`'s that brought no entry (or resets the count when it did); mutes
  // and unmutes.
  void NoteDrain(Doorbell& bell, bool took, uint64_t now_ms);
  void Watch(Doorbell& bell, uint32_t events, int op);
  // How long the thread may sleep before a muted or unwatched doorbell must be looked at.
  int SleepBoundMs(int timeout_ms, uint64_t now_ms) const;
  // epoll_wait on the doorbells; ends the sessions whose client closed its doorbell.
  void WaitForDoorbells(int timeout_ms);

  // Its identity as a holder of sessions' queues (Session::TakeSubmissions): device + 1.
  int holder_id() const { return place_.device + 1; }

  SessionRegistry& registry_;
  JobExecutor& executor_;
  const uint64_t poll_idle_ns_;
  const PollerPlace place_;
  UniqueFd wake_fd_;
  UniqueFd epoll_fd_;
  std::vector<std::shared_ptr<Session>> sessions_;  // its active set; poller thread only
  std::map<Session*, Doorbell> doorbells_;          // one per entry of sessions_; poller thread only
  LogRateLimiter mute_log_{10, 60000};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> heartbeat_ms_{0};
  std::atomic<uint32_t> session_count_{0};
  std::atomic<uint64_t> moves_out_{0};
  std::atomic<uint32_t> idle_waiters_{0};
  Mutex idle_mu_;
  CondVar idle_cv_;  // with idle_mu_: idle_passes_ went up
  uint64_t idle_passes_ ABSL_GUARDED_BY(idle_mu_) = 0;
  std::thread thread_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_JOBS_RING_POLLER_H_
