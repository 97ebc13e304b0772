// Validates ring entries and runs them: offload (client buffer -> new pool extent), reload (object
// -> client buffer), free. Every entry ends in exactly one completion on the session's ring, with
// a canonical status code; a bad entry fails alone and touches nothing else.
//
// Ordering between jobs on the same object: a reload of an object whose offload is still copying
// is started from the offload's completion on the host engine, and submitted at once on GPU
// engines, which order it after the fill on the GPU (CopyEngine::orders_pool_reads); either way
// its completion reports the fill's failure. And an object's extent returns to the pool only once it has been freed and no
// accepted job still uses it.
#ifndef TIER_DAEMON_JOB_EXECUTOR_H_
#define TIER_DAEMON_JOB_EXECUTOR_H_

#include <atomic>
#include <memory>

#include "absl/status/status.h"
#include "daemon/metrics.h"
#include "daemon/session.h"
#include "daemon/spiller.h"
#include "gpu/copy_engine.h"
#include "storage/host_pool.h"
#include "tier/ring.h"

namespace tier::daemon {

class JobExecutor {
 public:
  JobExecutor(storage::HostPool& pool, gpu::CopyEngine& engine, DaemonMetrics& metrics)
      : pool_(pool), engine_(engine), metrics_(metrics) {}
  // The NVMe tier, when there is one (set before any job runs).
  void set_spiller(Spiller* spiller) { spiller_ = spiller; }

  // Starts one entry taken from the session's submission queue. Never waits for a copy.
  void Start(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& entry);
  // Completes an entry with `status` without running it (daemon draining).
  void Reject(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& entry,
              absl::Status status);
  // After the session is idle and closing: returns all its objects' memory to the pool.
  void ReleaseAll(Session& session);

 private:
  // The checked view of a buffer range named by an entry.
  struct Range {
    std::shared_ptr<gpu::ImportedBuffer> buffer;
    char* data = nullptr;
  };
  absl::StatusOr<Range> CheckRange(Session& session, const ring::SubmissionEntry& entry);

  absl::Status Offload(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& e);
  absl::Status Reload(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& e);
  absl::Status Free(Session& session, const ring::SubmissionEntry& e);
  // Host pool full with an NVMe tier: waits (off the poller) for the spiller to make room.
  void ParkOffload(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& e,
                   std::shared_ptr<Object> object, Range range);
  void StartOffloadCopy(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& e,
                        std::shared_ptr<Object> object, Range range);
  // feed, lease: a reload pipelined behind the NVMe read that brings the object back (see
  // Spiller::Fetch); null otherwise.
  void StartReloadCopy(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& e,
                       std::shared_ptr<Object> object, Range range,
                       std::shared_ptr<gpu::SourceFeed> feed = nullptr,
                       std::shared_ptr<void> lease = nullptr);

  // Drops one pin; returns the extent to the pool when the object is freed and unpinned.
  // Caller holds session.mu().
  void UnpinLocked(Session& session, Object& object);
  gpu::CopyJob MakeCopyJob(gpu::Direction direction, Session& session,
                           const ring::SubmissionEntry& e, const Object& object, const Range& range);
  // An offload's fill ended (copied, or failed before or during the copy): sets the object's
  // state (a failed fill leaves no object behind), drops the fill's pin, then starts the jobs
  // that waited for the fill.
  void EndFill(Session& session, const ring::SubmissionEntry& e, Object& object,
               const absl::Status& status);
  // A successful reload with TIER_RELOAD_FREE_AFTER drops its object. Caller holds session.mu().
  void DropAfterReloadLocked(Session& session, const ring::SubmissionEntry& e, Object& object);
  // Completes a job that will not run with `status`; a ticketed one first passes its ticket to the
  // engine as a ticket-only job, so the client's streams waiting on it are released.
  void Fail(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& entry,
            absl::Status status);
  void Complete(Session& session, const ring::SubmissionEntry& entry, const absl::Status& status);
  // The daemon-wide counts of a job accepted (Complete undoes them).
  void CountStart(const ring::SubmissionEntry& entry);

  storage::HostPool& pool_;
  gpu::CopyEngine& engine_;
  DaemonMetrics& metrics_;
  Spiller* spiller_ = nullptr;
  std::atomic<uint64_t> next_seq_{1};
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_JOB_EXECUTOR_H_
