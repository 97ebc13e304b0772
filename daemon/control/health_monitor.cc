#include "daemon/control/health_monitor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tier::daemon {

absl::Status HealthMonitor::Check(uint64_t now_ms) const {
  // Either clock may have been read a moment after now_ms: a value from the future is fresh.
  const uint64_t heartbeat = poller_heartbeat_ms_();
  if (now_ms > heartbeat && now_ms - heartbeat > kPollerStallMs) {
    return absl::UnavailableError(
        absl::StrCat("a ring poller has not gone round for ", now_ms - heartbeat, " ms"));
  }
  if (stall_ms_ == 0) return absl::OkStatus();
  const uint64_t in_flight = metrics_.unticketed_in_flight.Sum();
  const uint64_t progress = metrics_.last_progress_ms.Latest();
  if (in_flight == 0 || now_ms <= progress || now_ms - progress <= stall_ms_) {
    return absl::OkStatus();
  }
  // Stalled so far: unless the clients hold every one of them (asked only now: it walks lanes).
  const uint64_t held = held_by_clients_();
  const uint64_t waiting = in_flight - std::min(in_flight, held);
  if (waiting > 0) {
    return absl::UnavailableError(absl::StrCat("no job has completed for ", now_ms - progress,
                                               " ms with ", waiting, " in flight"));
  }
  return absl::OkStatus();
}

}  // namespace tier::daemon
