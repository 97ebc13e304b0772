// The GPU engine's facade (engine/stream_engine.h): the CopyEngine calls, each handed to the part
// that owns it; the sessions, for shutdown and diagnostics.
#include "engine/stream_engine.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "common/log.h"
#include "common/mutex.h"
#include "engine/device_worker.h"
#include "engine/engine_clock.h"
#include "engine/gpu_imports.h"
#include "engine/gpu_session.h"
#include "engine/gpu_set.h"
#include "engine/job_intake.h"
#include "engine/lane.h"
#include "engine/lane_runner.h"
#include "engine/lane_words.h"
#include "engine/pool_writes.h"
#include "engine/release_thread.h"

namespace tier::engine {
namespace {

class StreamEngine final : public CopyEngine {
 public:
  StreamEngine(std::unique_ptr<GpuRuntime> runtime, const GpuEngineOptions& options)
      : runtime_(std::move(runtime)), options_(options),
        releaser_(std::make_shared<ReleaseThread>()), words_(*runtime_),
        runner_(*runtime_, options_, pool_writes_), intake_(pool_writes_),
        gpus_([this](int device) {
          return std::make_unique<DeviceWorker>(
              *runtime_, runner_, [this](int d) { return StrandedLanes(d); }, device, options_);
        }),
        importer_(*runtime_, releaser_, words_, gpus_) {}

  ~StreamEngine() override {
    Shutdown();
    gpus_.Stop();  // joins the workers
    if (pool_base_ != nullptr) {
      releaser_->Post([this] { runtime_->UnregisterHost(pool_base_); });
    }
    releaser_->Drain();
  }

  absl::string_view name() const override { return runtime_->name(); }
  bool orders_pool_reads() const override { return true; }

  absl::Status RegisterPool(char* base, uint64_t bytes) override {
    if (pool_base_ != nullptr) return absl::FailedPreconditionError("host pool already registered");
    if (absl::Status s = runtime_->RegisterHost(base, bytes); !s.ok()) return s;
    pool_base_ = base;
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<EngineSession>> OpenSession(
      const EngineSessionInfo& info) override {
    auto state = std::make_shared<SessionState>(info);
    MutexLock lock(&mu_);
    if (Stopping()) return absl::UnavailableError("copy engine is shut down");
    std::erase_if(sessions_, [](const std::weak_ptr<SessionState>& s) { return s.expired(); });
    sessions_.push_back(state);
    return std::make_unique<GpuSession>(intake_, std::move(state));
  }

  absl::StatusOr<std::unique_ptr<ImportedBuffer>> Import(EngineSession* session,
                                                         BufferImport import) override {
    return importer_.Import(*static_cast<GpuSession*>(session), std::move(import));
  }

  // Queues the job on its lane; never calls the runtime (the ring poller calls this).
  void Submit(CopyJob job) override {
    if (Stopping()) {
      std::move(job.done)(absl::UnavailableError("copy engine is shut down"));
      return;
    }
    intake_.Submit(static_cast<GpuSession*>(job.session)->state(), std::move(job));
  }

  void AbandonSession(EngineSession* session) override {
    intake_.Abandon(static_cast<GpuSession*>(session)->state());
  }

  void Shutdown() override;

  std::vector<LaneStatus> Lanes(EngineSession* session) override {
    std::vector<LaneStatus> out;
    const uint64_t now = NowNs();
    for (auto& lane : static_cast<GpuSession*>(session)->state().AllLanes()) {
      MutexLock lock(&lane->mu);
      out.push_back(lane->Status(now));
    }
    return out;
  }

  EngineCounts Counts() const override {
    EngineCounts c;
    c.buffers = importer_.live_buffers();
    c.lanes = importer_.live_lanes();
    c.pending_releases = releaser_->pending();
    return c;
  }

  std::vector<LinkRate> LinkRates() const override { return gpus_.Rates(NowNs()); }

  uint64_t UnticketedBehindClients() const override;

 private:
  // Read on every Submit, by every GPU's ring poller: an atomic, not the engine's lock (issue 26).
  bool Stopping() const { return stopping_.load(std::memory_order_acquire); }
  std::vector<std::shared_ptr<SessionState>> Sessions() const ABSL_LOCKS_EXCLUDED(mu_);
  // Lanes of `device` with work that their worker is not looking at. There should be none (Submit
  // wakes the worker); the worker checks now and then and logs any it finds.
  std::vector<std::shared_ptr<Lane>> StrandedLanes(int device) const;
  // Issued copies that never completed (a broken stream): fails them, so every callback runs.
  void FailInFlight();

  const std::unique_ptr<GpuRuntime> runtime_;
  const GpuEngineOptions options_;
  const std::shared_ptr<ReleaseThread> releaser_;
  HostWordPool words_;
  PoolWrites pool_writes_;
  LaneRunner runner_;
  JobIntake intake_;
  GpuSet gpus_;  // after what its workers use, so they are joined first
  GpuImporter importer_;
  char* pool_base_ = nullptr;

  // Nothing is locked under it; a session's lock would be taken after it, never before.
  mutable Mutex mu_ ABSL_ACQUIRED_BEFORE(SessionState::mu);
  std::vector<std::weak_ptr<SessionState>> sessions_ ABSL_GUARDED_BY(mu_);
  // Set once, under mu_, so that a session opened under mu_ either sees it or is in sessions_
  // when Shutdown looks; read without mu_ by Submit.
  std::atomic<bool> stopping_{false};
};

void StreamEngine::Shutdown() {
  {
    MutexLock lock(&mu_);
    if (stopping_.exchange(true, std::memory_order_acq_rel)) return;
  }
  auto grace = std::chrono::milliseconds(options_.shutdown_grace_ms);
  if (gpus_.WaitIdle(grace)) return;
  LogWarning(runtime_->name(), " engine: jobs still queued after ", options_.shutdown_grace_ms,
             " ms; cancelling what waits for a client");
  for (auto& s : Sessions()) intake_.Abandon(*s);
  if (gpus_.WaitIdle(grace)) return;
  FailInFlight();
}

void StreamEngine::FailInFlight() {
  std::vector<FailedJob> failed;
  for (DeviceWorker* worker : gpus_.Workers()) {
    for (auto& lane : worker->Active()) {
      MutexLock lane_lock(&lane->mu);
      for (PendingJob& p : lane->pending) {
        if (p.feed != nullptr) p.feed->Unsubscribe();
        failed.push_back({std::move(p.done),
                          absl::UnavailableError("copy engine shut down before the copy ended")});
      }
      lane->pending.clear();
    }
  }
  LogError(runtime_->name(), " engine: ", failed.size(), " jobs failed at shutdown");
  RunFailed(failed);
}

std::vector<std::shared_ptr<SessionState>> StreamEngine::Sessions() const {
  std::vector<std::shared_ptr<SessionState>> sessions;
  MutexLock lock(&mu_);
  for (auto& weak : sessions_) {
    if (auto s = weak.lock()) sessions.push_back(std::move(s));
  }
  return sessions;
}

uint64_t StreamEngine::UnticketedBehindClients() const {
  uint64_t held = 0;
  for (auto& session : Sessions()) {
    for (auto& lane : session->AllLanes()) {
      MutexLock lock(&lane->mu);
      if (lane->wait_since_ns == 0) continue;  // its head is not waiting for a client's ticket
      for (const QueuedJob& q : lane->queue) held += q.job.sync == 0 ? 1 : 0;
    }
  }
  return held;
}

std::vector<std::shared_ptr<Lane>> StreamEngine::StrandedLanes(int device) const {
  std::vector<std::shared_ptr<Lane>> stranded;
  for (auto& session : Sessions()) {
    for (auto& lane : session->AllLanes()) {
      if (lane->device != device || lane->in_worker.load()) continue;
      MutexLock lock(&lane->mu);
      if (lane->busy()) stranded.push_back(lane);
    }
  }
  return stranded;
}

}  // namespace

std::unique_ptr<CopyEngine> MakeStreamEngine(std::unique_ptr<GpuRuntime> runtime,
                                             const GpuEngineOptions& options) {
  return std::make_unique<StreamEngine>(std::move(runtime), options);
}

}  // namespace tier::engine
