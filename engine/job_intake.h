// Where a copy job enters the GPU engine (CopyEngine::Submit, on the ring poller): it finds the
// job's GPU and lane, fixes the job's place among the pool writes, and queues it in ticket order,
// holding a ticket back until every smaller one and every job of its batch arrived. Also where a
// session is abandoned: its held jobs fail and its lanes stop reading tickets. Never calls the
// runtime; wakes the GPU's worker, which issues what was queued (engine/lane_runner.h).
#ifndef TIER_ENGINE_JOB_INTAKE_H_
#define TIER_ENGINE_JOB_INTAKE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "engine/copy_engine.h"
#include "engine/gpu_session.h"
#include "engine/lane.h"
#include "engine/lane_jobs.h"
#include "engine/pool_writes.h"

namespace tier::engine {

class JobIntake {
 public:
  explicit JobIntake(PoolWrites& pool_writes) : pool_writes_(pool_writes) {}

  // Queues the job on its lane, or completes it with the reason it cannot run.
  void Submit(SessionState& state, CopyJob job);
  // Fails what waits on the session's client (held tickets; the worker cancels what is queued)
  // and stops its lanes reading tickets. Once; later calls do nothing.
  void Abandon(SessionState& state);

 private:
  // The GPU the job's memory (or, ticket-only, its session's one ticket slot) is on.
  static absl::StatusOr<int> RouteDevice(SessionState& state, const CopyJob& job, bool* host);
  void Enqueue(Lane& lane, CopyJob job, bool host, int device, std::vector<FailedJob>& failed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  void Hold(Lane& lane, CopyJob job, bool host, std::vector<FailedJob>& failed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  QueuedJob Accept(Lane& lane, CopyJob job, bool host) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  static void QueueArrived(Lane& lane) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);

  PoolWrites& pool_writes_;
};

}  // namespace tier::engine

#endif  // TIER_ENGINE_JOB_INTAKE_H_
