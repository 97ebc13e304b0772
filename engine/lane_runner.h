// A pass of the GPU's worker over one lane (Step): issue what is ready (lane_issue.cc) and
// complete what finished (lane_complete.cc). Issuing a job puts on the lane's stream, with no host
// synchronization between jobs (engine/stream_engine.h):
//   [wait(writer lane completed >= s)]   H2D only: an offload into the same pool bytes, issued
//   copy                                 whole, in chunks (the lane's window), or per feed chunk
//   write(ticket page[done] = k)         the last job of ticket k: releases the client's streams
//   write(completed = seq)               once per pass (and per piece under a window)
// Completing reads the lane's completion word and runs the jobs' callbacks with no lock held; a
// lane without progress for watchdog_ms has its stream queried. No state of its own: the lane
// holds it, under Lane::mu.
#ifndef TIER_ENGINE_LANE_RUNNER_H_
#define TIER_ENGINE_LANE_RUNNER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/copy_engine.h"
#include "engine/gpu_runtime.h"
#include "engine/lane.h"
#include "engine/lane_jobs.h"
#include "engine/pool_writes.h"

namespace tier::engine {

class LaneRunner {
 public:
  LaneRunner(GpuRuntime& runtime, const GpuEngineOptions& options, PoolWrites& pool_writes)
      : runtime_(runtime), options_(options), pool_writes_(pool_writes) {}

  // Issues what is ready on `lane` and completes what finished; true if anything moved. *busy:
  // whether the lane still has work. `window`: the lane's window this pass (0: none; the
  // worker's LinkShare).
  bool Step(Lane& lane, uint64_t now, uint64_t window, bool* busy) ABSL_LOCKS_EXCLUDED(lane.mu);

 private:
  // What issuing the head job put on the stream for it.
  struct Issued {
    bool staged = false;  // its copy waits in lane.staged for the next flush
    uint64_t window = 0;  // of the lane's window its pending entry holds
  };

  // ---- lane_issue.cc ----
  void CancelQueued(Lane& lane, std::vector<FailedJob>& failed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  bool IssueHead(Lane& lane, QueuedJob& q, uint64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  bool TicketArrived(Lane& lane, uint64_t ticket, uint64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  bool DelayPassed(Lane& lane, QueuedJob& q, uint64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  bool OrderAfterPoolWrites(Lane& lane, QueuedJob& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  bool IssueCopy(Lane& lane, QueuedJob& q, uint64_t now, Issued* issued)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  bool IssueFedChunks(Lane& lane, QueuedJob& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  bool IssueChunks(Lane& lane, QueuedJob& q, uint64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  void SignalAndPend(Lane& lane, QueuedJob& q, uint64_t now, const Issued& issued)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  absl::Status MarkPiece(Lane& lane) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  absl::Status FlushStaged(Lane& lane) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  void FlushFor(Lane& lane, QueuedJob& q, bool staged) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  void MarkCompleted(Lane& lane, uint64_t first_seq, std::vector<FailedJob>& failed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  absl::Status Copy(GpuStream stream, Direction direction, bool host, char* client, char* pool,
                    uint64_t len);

  // ---- lane_complete.cc ----
  bool Complete(Lane& lane, uint64_t now) ABSL_LOCKS_EXCLUDED(lane.mu);
  // Asks the runtime about a lane whose issued jobs (up to seq `issued`) made no progress; takes
  // them into *finished (the stream is idle) or *broken (it failed: the returned error).
  absl::Status QueryStream(Lane& lane, uint64_t now, uint64_t issued,
                           std::vector<PendingJob>* finished, std::vector<PendingJob>* broken)
      ABSL_LOCKS_EXCLUDED(lane.mu);
  void WarnStuck(Lane& lane, uint64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  void Settle(std::vector<PendingJob>& finished, std::vector<PendingJob>& broken,
              const absl::Status& broken_status);

  GpuRuntime& runtime_;
  const GpuEngineOptions options_;
  PoolWrites& pool_writes_;
};

}  // namespace tier::engine

#endif  // TIER_ENGINE_LANE_RUNNER_H_
