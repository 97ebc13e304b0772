#include "engine/gpu_session.h"

#include "engine/job_intake.h"

namespace tier::engine {

int SessionState::FindDevice(const char* addr, uint64_t len, bool* host) {
  MutexLock lock(&mu);
  auto p = reinterpret_cast<uintptr_t>(addr);
  auto it = ranges.upper_bound(p);
  if (it == ranges.begin()) return -1;
  --it;
  if (p < it->first || p >= it->second.end || len > it->second.end - p) return -1;
  *host = it->second.host;
  return it->second.device;
}

int SessionState::OnlySemaphoreDevice() {
  MutexLock lock(&mu);
  int found = -1;
  for (auto& [device, lanes] : devices) {
    if (!lanes.slot_bound) continue;
    if (found >= 0) return -1;
    found = device;
  }
  return found;
}

std::shared_ptr<Lane> SessionState::FindLane(int device, Direction direction) {
  MutexLock lock(&mu);
  auto it = devices.find(device);
  return it == devices.end() ? nullptr : it->second.lanes[LaneIndex(direction)];
}

std::vector<std::shared_ptr<Lane>> SessionState::AllLanes() {
  std::vector<std::shared_ptr<Lane>> all;
  MutexLock lock(&mu);
  for (auto& [device, d] : devices) {
    for (auto& lane : d.lanes) {
      if (lane != nullptr) all.push_back(lane);
    }
  }
  return all;
}

GpuSession::~GpuSession() { intake_.Abandon(*state_); }

}  // namespace tier::engine
