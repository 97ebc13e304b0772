// One GPU's worker thread: issues the jobs of that GPU's lanes as their tickets arrive and
// completes them as their completion words move (each lane's pass: engine/lane_runner.h). Owns no
// lane; holds the busy ones (Wake). Its LinkShare says which lanes shared the GPU's link lately
// (engine/link_share.h); only its thread uses it. Makes enqueue calls only.
//
// Waiting: with no busy lane it blocks on a condition variable (looking every second for a lane
// with work that no one woke it for, which it logs and serves); with busy lanes it spins briefly
// after progress (tickets and completions come microseconds apart), then sleeps in doubling steps
// up to poll_max_sleep_us, waking at once for a Submit or a feed's chunk.
#ifndef TIER_ENGINE_DEVICE_WORKER_H_
#define TIER_ENGINE_DEVICE_WORKER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "engine/copy_engine.h"
#include "engine/gpu_runtime.h"
#include "engine/lane.h"
#include "engine/lane_runner.h"
#include "engine/link_share.h"

namespace tier::engine {

class GpuSet;

class DeviceWorker {
 public:
  // The lanes of `device` with work whose worker is not looking at them (there should be none).
  using FindStranded = std::function<std::vector<std::shared_ptr<Lane>>(int device)>;

  DeviceWorker(GpuRuntime& runtime, LaneRunner& runner, FindStranded find_stranded, int device,
               const GpuEngineOptions& options);
  ~DeviceWorker();  // joins the thread
  DeviceWorker(const DeviceWorker&) = delete;
  DeviceWorker& operator=(const DeviceWorker&) = delete;

  // The lane has work: look at it now.
  void Wake(const std::shared_ptr<Lane>& lane) ABSL_LOCKS_EXCLUDED(mu_);
  // Something moved for a lane already active (a feed): look again soon. Takes no lock, so any
  // thread may call it holding anything; a lost wake-up costs at most one backoff sleep.
  void Poke();
  // Waits up to `timeout` for every lane to be idle; false if one still has work.
  bool Idle(std::chrono::milliseconds timeout) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::shared_ptr<Lane>> Active() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class GpuSet;  // GpuSet::mu_ is taken before mu_ (its lock-order annotation names mu_)

  void Run();
  // Blocks until a lane has work (true, *lanes = the busy ones) or the worker stops (false).
  bool AwaitWork(std::vector<std::shared_ptr<Lane>>* lanes) ABSL_LOCKS_EXCLUDED(mu_);
  void ServeStranded() ABSL_LOCKS_EXCLUDED(mu_);
  // One pass over the busy lanes; true if anything moved. *idle: the lanes left without work.
  bool StepAll(std::vector<std::shared_ptr<Lane>>& lanes, uint64_t now,
               std::vector<const Lane*>* idle);
  // Drops the idle lanes from the active list (unless a Submit queued meanwhile); true if some
  // lane is still active.
  bool RetireIdle(const std::vector<const Lane*>& idle) ABSL_LOCKS_EXCLUDED(mu_);
  void Backoff(uint64_t sleep_us) ABSL_LOCKS_EXCLUDED(mu_);

  GpuRuntime& runtime_;
  LaneRunner& runner_;
  const FindStranded find_stranded_;
  const int device_;
  const uint32_t spin_us_;
  const uint32_t max_sleep_us_;
  const uint64_t lane_window_bytes_;
  LinkShare share_;  // the worker thread's only
  std::atomic<bool> woken_{false};

  // Taken by Submit (Wake), Abandon, diagnostics and the worker. Under it: a lane's lock
  // (retiring an idle lane checks that no Submit queued on it meanwhile).
  Mutex mu_ ABSL_ACQUIRED_BEFORE(Lane::mu);
  CondVar cv_;       // work arrived (Wake, Poke) or stop
  CondVar idle_cv_;  // active_ became empty
  // The lanes with queued or issued jobs.
  std::vector<std::shared_ptr<Lane>> active_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace tier::engine

#endif  // TIER_ENGINE_DEVICE_WORKER_H_
