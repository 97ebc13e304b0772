#include "engine/device_worker.h"

#include <sys/prctl.h>

#include <algorithm>
#include <utility>

#include "common/log.h"
#include "common/thread_gpu.h"
#include "common/thread_role.h"
#include "engine/engine_clock.h"

namespace tier::engine {

DeviceWorker::DeviceWorker(GpuRuntime& runtime, LaneRunner& runner, FindStranded find_stranded,
                           int device, const GpuEngineOptions& options)
    : runtime_(runtime), runner_(runner), find_stranded_(std::move(find_stranded)),
      device_(device), spin_us_(options.poll_spin_us),
      max_sleep_us_(std::max<uint32_t>(options.poll_max_sleep_us, 1)),
      lane_window_bytes_(options.lane_window_bytes) {
  thread_ = std::thread([this] { Run(); });
}

DeviceWorker::~DeviceWorker() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

void DeviceWorker::Wake(const std::shared_ptr<Lane>& lane) {
  {
    MutexLock lock(&mu_);
    if (std::find(active_.begin(), active_.end(), lane) == active_.end()) {
      active_.push_back(lane);
      lane->in_worker.store(true);
    }
    woken_.store(true);
  }
  cv_.SignalAll();
}

void DeviceWorker::Poke() {
  woken_.store(true);
  cv_.SignalAll();
}

bool DeviceWorker::Idle(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&mu_);
  while (!active_.empty()) {
    if (!idle_cv_.WaitUntil(&mu_, deadline)) return active_.empty();
  }
  return true;
}

std::vector<std::shared_ptr<Lane>> DeviceWorker::Active() {
  MutexLock lock(&mu_);
  return active_;
}

void DeviceWorker::Run() {
  SetThreadRole(ThreadRole::kDeviceWorker);
  SetThreadGpu(device_);  // what its jobs' completions free goes to its GPU's extent caches
  // Sleeps of a few microseconds must be that short: the default timer slack is 50 us.
  (void)::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  if (absl::Status s = runtime_.SetDevice(device_); !s.ok()) {
    LogError(runtime_.name(), " engine: GPU ", device_, " worker: ", s.message());
  }
  uint64_t last_progress_ns = NowNs();
  uint64_t sleep_us = 1;
  std::vector<std::shared_ptr<Lane>> lanes;
  while (AwaitWork(&lanes)) {
    const uint64_t now = NowNs();
    std::vector<const Lane*> idle;
    const bool progress = StepAll(lanes, now, &idle);
    const bool any_active = RetireIdle(idle);
    lanes.clear();  // may destroy lanes of ended sessions (their streams go on the release thread)
    if (progress) {
      last_progress_ns = now;
      sleep_us = 1;
      continue;
    }
    if (!any_active) continue;  // AwaitWork blocks
    // Lanes wait for tickets or copies: spin right after progress, then back off.
    if (now - last_progress_ns < uint64_t{spin_us_} * 1000) {
      std::this_thread::yield();
      continue;
    }
    Backoff(sleep_us);
    sleep_us = std::min<uint64_t>(sleep_us * 2, max_sleep_us_);
  }
}

bool DeviceWorker::AwaitWork(std::vector<std::shared_ptr<Lane>>* lanes) {
  MutexLock lock(&mu_);
  // Idle: sleep until a Submit wakes us, looking every second for a lane with work that no one
  // woke us for (a safety net: it logs, and the lane is served).
  while (!stop_ && active_.empty()) {
    if (!cv_.WaitUntil(&mu_, std::chrono::steady_clock::now() + std::chrono::seconds(1))) {
      mu_.Unlock();
      ServeStranded();
      mu_.Lock();
    }
  }
  if (stop_) return false;
  *lanes = active_;
  woken_.store(false);
  return true;
}

void DeviceWorker::ServeStranded() {
  for (auto& lane : find_stranded_(device_)) {
    LogError(lane->label, ": GPU ", device_, " ", lane->name(),
             " lane had jobs its worker was not told of (a lost wake-up); serving it");
    Wake(lane);
  }
}

bool DeviceWorker::StepAll(std::vector<std::shared_ptr<Lane>>& lanes, uint64_t now,
                           std::vector<const Lane*>* idle) {
  // D2H lanes first: a reload issued in this pass may wait for an offload issued in it.
  std::stable_sort(lanes.begin(), lanes.end(), [](const auto& a, const auto& b) {
    return LaneIndex(a->direction) < LaneIndex(b->direction);
  });
  // Only lanes with copies on the link count as sharing it (engine/link_share.h).
  for (auto& lane : lanes) {
    bool copying;
    {
      MutexLock lane_lock(&lane->mu);
      copying = !lane->pending.empty();
    }
    if (copying) share_.Saw(lane.get(), lane->uid, LaneIndex(lane->direction), now);
  }
  bool progress = false;
  for (auto& lane : lanes) {
    bool busy = false;
    const uint64_t window = share_.Window(lane.get(), lane->uid, LaneIndex(lane->direction), now,
                                          lane_window_bytes_);
    progress |= runner_.Step(*lane, now, window, &busy);
    if (!busy) idle->push_back(lane.get());
  }
  return progress;
}

bool DeviceWorker::RetireIdle(const std::vector<const Lane*>& idle) {
  MutexLock lock(&mu_);
  std::erase_if(active_, [&](const std::shared_ptr<Lane>& lane) {
    if (std::find(idle.begin(), idle.end(), lane.get()) == idle.end()) return false;
    MutexLock lane_lock(&lane->mu);
    if (lane->busy()) return false;  // a Submit queued meanwhile
    lane->in_worker.store(false);
    return true;
  });
  const bool any_active = !active_.empty();
  if (!any_active) idle_cv_.SignalAll();
  return any_active;
}

void DeviceWorker::Backoff(uint64_t sleep_us) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(sleep_us);
  MutexLock lock(&mu_);
  while (!stop_ && !woken_.load()) {
    if (!cv_.WaitUntil(&mu_, deadline)) return;
  }
}

}  // namespace tier::engine
