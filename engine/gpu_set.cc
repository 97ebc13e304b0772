#include "engine/gpu_set.h"

#include <algorithm>
#include <utility>

namespace tier::engine {

DeviceWorker& GpuSet::Worker(int device) {
  MutexLock lock(&mu_);
  std::unique_ptr<DeviceWorker>& w = workers_[device];
  if (w == nullptr) w = make_worker_(device);
  return *w;
}

LinkMeters& GpuSet::Meters(int device) {
  MutexLock lock(&mu_);
  std::unique_ptr<LinkMeters>& m = meters_[device];
  if (m == nullptr) m = std::make_unique<LinkMeters>();
  return *m;
}

std::vector<DeviceWorker*> GpuSet::Workers() {
  std::vector<DeviceWorker*> out;
  MutexLock lock(&mu_);
  for (auto& [device, w] : workers_) out.push_back(w.get());
  return out;
}

bool GpuSet::WaitIdle(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (DeviceWorker* w : Workers()) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (!w->Idle(std::max(left, std::chrono::milliseconds(0)))) return false;
  }
  return true;
}

std::vector<LinkRate> GpuSet::Rates(uint64_t now) const {
  std::vector<std::pair<int, const LinkMeters*>> meters;
  {
    MutexLock lock(&mu_);
    for (const auto& [device, m] : meters_) meters.emplace_back(device, m.get());
  }
  std::vector<LinkRate> out;
  for (const auto& [device, m] : meters) {
    LinkRate rate;
    rate.device = device;
    rate.d2h_bytes_per_s = m->d2h.Current(now).bytes_per_s;
    rate.h2d_bytes_per_s = m->h2d.Current(now).bytes_per_s;
    rate.d2h_bytes = m->d2h.total_bytes();
    rate.h2d_bytes = m->h2d.total_bytes();
    out.push_back(rate);
  }
  return out;
}

void GpuSet::Stop() {
  std::map<int, std::unique_ptr<DeviceWorker>> workers;
  {
    MutexLock lock(&mu_);
    workers.swap(workers_);
  }
  workers.clear();  // joins them
}

}  // namespace tier::engine
