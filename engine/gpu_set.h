// The GPUs the engine has met: per GPU its worker (engine/device_worker.h) and its link's meters,
// made when a session first registers memory there and kept as long as the engine.
#ifndef TIER_ENGINE_GPU_SET_H_
#define TIER_ENGINE_GPU_SET_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "engine/copy_engine.h"
#include "engine/device_worker.h"
#include "engine/lane.h"

namespace tier::engine {

class GpuSet {
 public:
  using MakeWorker = std::function<std::unique_ptr<DeviceWorker>(int device)>;

  explicit GpuSet(MakeWorker make_worker) : make_worker_(std::move(make_worker)) {}
  ~GpuSet() { Stop(); }
  GpuSet(const GpuSet&) = delete;
  GpuSet& operator=(const GpuSet&) = delete;

  // Made on first use; they live until Stop (the worker) or the GpuSet (the meters).
  DeviceWorker& Worker(int device) ABSL_LOCKS_EXCLUDED(mu_);
  LinkMeters& Meters(int device) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<DeviceWorker*> Workers() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits up to `timeout` in all for every worker's lanes to be idle; false if one still has work.
  bool WaitIdle(std::chrono::milliseconds timeout) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<LinkRate> Rates(uint64_t now) const ABSL_LOCKS_EXCLUDED(mu_);
  // Joins the workers (with no lock held: a worker may be asking the engine for stranded lanes).
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const MakeWorker make_worker_;
  // Held alone: a worker is made (its thread started) under it, never joined.
  mutable Mutex mu_ ABSL_ACQUIRED_BEFORE(DeviceWorker::mu_);
  std::map<int, std::unique_ptr<DeviceWorker>> workers_ ABSL_GUARDED_BY(mu_);
  // Each GPU's link, both directions, fed by its worker (lane_runner); made with the lanes.
  std::map<int, std::unique_ptr<LinkMeters>> meters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tier::engine

#endif  // TIER_ENGINE_GPU_SET_H_
