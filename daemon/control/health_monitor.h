// Whether jobs still move through tierd: the answer of the Health call (and of `tierctl health`,
// the Kubernetes liveness probe). SERVING used to mean only "not draining", so a daemon whose ring
// poller was stuck for good (issue 16, finding 1) still answered SERVING and was never restarted.
//
// Not serving when either
//  - a ring poller has not gone round for kPollerStallMs (each does at least every 500 ms, idle
//    or not; one per GPU: daemon/jobs/ring_pollers.h), or
//  - jobs that wait for nothing a client holds (no GPU ticket) are in flight and no job has
//    completed for stall_ms. Jobs with a ticket are left out: a client may keep its stream from
//    reaching a ticket for as long as it likes, and that must not get the daemon restarted under
//    every other session (their own GPU lanes have the engine's watchdog). So are jobs without a
//    ticket that a GPU lane holds behind one waiting for its client's ticket (a client could
//    otherwise queue one behind a ticket it never raises and make health say NOT_SERVING).
#ifndef TIER_DAEMON_CONTROL_HEALTH_MONITOR_H_
#define TIER_DAEMON_CONTROL_HEALTH_MONITOR_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "daemon/metrics/metrics.h"

namespace tier::daemon {

class HealthMonitor {
 public:
  static constexpr uint64_t kPollerStallMs = 5000;

  // poller_heartbeat_ms: when the ring pollers last went round, the oldest of them (MonotonicMs).
  // stall_ms 0: only the pollers are checked. held_by_clients: jobs without a ticket queued behind a client's ticket
  // (CopyEngine::UnticketedBehindClients).
  HealthMonitor(const DaemonMetrics& metrics, std::function<uint64_t()> poller_heartbeat_ms,
                uint32_t stall_ms, std::function<uint64_t()> held_by_clients = [] { return 0; })
      : metrics_(metrics), poller_heartbeat_ms_(std::move(poller_heartbeat_ms)),
        stall_ms_(stall_ms), held_by_clients_(std::move(held_by_clients)) {}

  // OK while jobs move; otherwise UNAVAILABLE saying what stopped.
  absl::Status Check(uint64_t now_ms) const;

 private:
  const DaemonMetrics& metrics_;
  const std::function<uint64_t()> poller_heartbeat_ms_;
  const uint32_t stall_ms_;
  const std::function<uint64_t()> held_by_clients_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_CONTROL_HEALTH_MONITOR_H_
