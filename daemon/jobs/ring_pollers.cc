#include "daemon/jobs/ring_pollers.h"

#include <algorithm>

#include "common/log.h"
#include "daemon/metrics/metrics.h"

namespace tier::daemon {

RingPollers::RingPollers(SessionRegistry& registry, JobExecutor& executor, uint32_t poll_idle_us,
                         int devices)
    : registry_(registry) {
  devices = std::max(devices, 0);
  for (int device = -1; device < devices; ++device) {
    PollerPlace place;
    place.device = device;
    place.devices = devices;
    // (The pollers live as long as this object; one only calls this from its own thread, which
    // Stop() joins before any of them goes.)
    place.let_go = [this](int to) { ForDevice(to).Wake(); };
    pollers_.push_back(
        std::make_unique<RingPoller>(registry, executor, poll_idle_us, std::move(place)));
  }
}

RingPollers::~RingPollers() { Stop(); }

absl::Status RingPollers::Start() {
  for (auto& poller : pollers_) {
    if (absl::Status started = poller->Start(); !started.ok()) {
      Stop();
      return started;
    }
  }
  LogInfo("ring pollers: ", pollers_.size() - 1, " for the GPUs and the default one");
  return absl::OkStatus();
}

void RingPollers::Stop() {
  for (auto& poller : pollers_) poller->Stop();
}

void RingPollers::WakeAll() {
  for (auto& poller : pollers_) poller->Wake();
}

RingPoller& RingPollers::ForDevice(int device) {
  const size_t index = device >= 0 && static_cast<size_t>(device) + 1 < pollers_.size()
                           ? static_cast<size_t>(device) + 1
                           : 0;
  return *pollers_[index];
}

bool RingPollers::AwaitIdlePass(std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    // A session let go by one poller and not yet taken by the next is in nobody's pass: idle
    // passes of every poller prove nothing about it. They count when no session was in transit
    // at their start and none was let go while they ran (then each session stayed with one
    // poller throughout, and that poller's idle passes covered it). A session moves once, at its
    // first GPU registration, and is taken within a pass of its new poller: this ends.
    const uint64_t moves = MovesOut();
    const bool moving = AnyMoving();
    for (auto& poller : pollers_) {
      if (!poller->AwaitIdlePass(deadline)) return false;
    }
    if (!moving && MovesOut() == moves) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
  }
}

bool RingPollers::AnyMoving() const {
  for (const std::shared_ptr<Session>& session : registry_.ActiveSessions()) {
    if (session->moving()) return true;
  }
  return false;
}

uint64_t RingPollers::MovesOut() const {
  uint64_t moves = 0;
  for (const auto& poller : pollers_) moves += poller->moves_out();
  return moves;
}

uint64_t RingPollers::last_heartbeat_ms() const {
  uint64_t oldest = ~uint64_t{0};
  for (const auto& poller : pollers_) oldest = std::min(oldest, poller->last_heartbeat_ms());
  return oldest;
}

std::vector<PollerStatus> RingPollers::Status() const {
  const uint64_t now = MonotonicMs();
  std::vector<PollerStatus> out;
  for (const auto& poller : pollers_) {
    const uint64_t heartbeat = poller->last_heartbeat_ms();
    out.push_back(PollerStatus{poller->device(), poller->sessions(),
                               now > heartbeat ? now - heartbeat : 0});
  }
  return out;
}

}  // namespace tier::daemon
