// The daemon's ring pollers: one per GPU and a default one, each its own thread, epoll set and
// doorbells (daemon/jobs/ring_poller.h), so that a session flooding one GPU with jobs, or a poller
// slowed by one GPU's engine, never delays the jobs of another GPU's sessions.
//
// A session is served by the poller of its home device (Session::home_device(): the GPU of the
// first GPU buffer it registered); before that, and for ever for a session of host memory only
// (the host engine, CPU clients), by the default poller. It moves once, at that first
// registration: the registry's generation changes, every poller looks again, the old one lets go
// of the session's queue between two passes and the new one takes it (see ring_poller.h).
//
// What the daemon asks of "the poller" it asks of all of them: Wake wakes every one;
// AwaitIdlePass (drain, SIGTERM) waits for an idle pass of every one with no session moving in
// between; the heartbeat (watchdog, health) is the oldest one's, so one wedged poller stops the
// systemd pings as the single poller did.
#ifndef TIER_DAEMON_JOBS_RING_POLLERS_H_
#define TIER_DAEMON_JOBS_RING_POLLERS_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "daemon/jobs/job_executor.h"
#include "daemon/jobs/ring_poller.h"
#include "daemon/sessions/session_registry.h"

namespace tier::daemon {

// One poller as `tierctl status` shows it.
struct PollerStatus {
  int device = -1;  // -1: the default poller (sessions with no GPU buffer yet, host memory)
  uint32_t sessions = 0;
  uint64_t heartbeat_age_ms = 0;  // since the poller last went round
};

class RingPollers {
 public:
  // `devices`: the GPUs the engine serves (0 with the host engine: the default poller only).
  RingPollers(SessionRegistry& registry, JobExecutor& executor, uint32_t poll_idle_us,
              int devices);
  ~RingPollers();
  RingPollers(const RingPollers&) = delete;
  RingPollers& operator=(const RingPollers&) = delete;

  // Starts every poller's thread; on an error none runs.
  absl::Status Start();
  void Stop();
  // Wakes every poller (the registry's active set or a session's home changed).
  void WakeAll();
  // Until every poller went once round each of its rings, after this call, and found nothing to
  // take, with no session moving between pollers meanwhile: what clients pushed before the call
  // has been taken. False when `deadline` passed first.
  bool AwaitIdlePass(std::chrono::steady_clock::time_point deadline);
  // The oldest heartbeat of all (MonotonicMs): a stuck poller makes the daemon look stuck.
  uint64_t last_heartbeat_ms() const;
  std::vector<PollerStatus> Status() const;

  size_t size() const { return pollers_.size(); }
  // The poller that serves `device` (-1, or a GPU without one: the default poller).
  RingPoller& ForDevice(int device);

 private:
  // Whether an active session is between pollers (let go by one, not taken by the next).
  bool AnyMoving() const;
  uint64_t MovesOut() const;

  SessionRegistry& registry_;
  // pollers_[0] is the default poller; pollers_[d + 1] GPU d's.
  std::vector<std::unique_ptr<RingPoller>> pollers_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_JOBS_RING_POLLERS_H_
