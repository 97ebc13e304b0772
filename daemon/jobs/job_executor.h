// Validates ring entries and runs them: offload (client buffer -> new object: OffloadJob), reload
// (object -> client buffer: ReloadJob), free. Every entry ends in exactly one completion on the
// session's ring, with a canonical status code (JobEnds); a bad entry fails alone and touches
// nothing else.
//
// Each job reads top-down through three layers, and only calls down:
//   the session's ObjectTable  - the object's state: create, pin, fill ended, free (and quota);
//   the TierManager            - where its bytes live: room in the host pool for a new object,
//                                an object brought back from NVMe for a reload;
//   the CopyEngine             - the copy itself, completed by callback.
//
// An object's memory returns to its tier only once it has been freed and no accepted job still
// uses it (the table's pins). How a reload is ordered after its object's fill:
// daemon/jobs/reload_job.h.
#ifndef TIER_DAEMON_JOBS_JOB_EXECUTOR_H_
#define TIER_DAEMON_JOBS_JOB_EXECUTOR_H_

#include <memory>

#include "absl/status/status.h"
#include "daemon/jobs/job_ends.h"
#include "daemon/jobs/job_parts.h"
#include "daemon/jobs/offload_order.h"
#include "daemon/metrics/metrics.h"
#include "daemon/persistent/persistent_store.h"
#include "daemon/sessions/session.h"
#include "daemon/tiers/tier_manager.h"
#include "engine/copy_engine.h"
#include "tier/ring.h"

namespace tier::daemon {

class JobExecutor {
 public:
  // `persistent`: the named objects that outlive sessions (null: none, as in unit tests).
  JobExecutor(TierManager& tiers, engine::CopyEngine& engine, DaemonMetrics& metrics,
              PersistentStore* persistent = nullptr)
      : metrics_(metrics), ends_(engine, metrics),
        parts_{tiers, engine, ends_, persistent, offload_order_} {}

  // Starts one entry taken from the session's submission queue. Never waits for a copy.
  void Start(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& entry);
  // Completes an entry with `status` without running it (daemon draining).
  void Reject(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& entry,
              absl::Status status);
  // After the session is idle and closing: returns all its objects' memory to the tiers.
  void ReleaseAll(Session& session);

 private:
  // Returns an error only when the free did not happen (the caller fails it).
  absl::Status Free(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& e);

  DaemonMetrics& metrics_;
  JobEnds ends_;
  OffloadOrder offload_order_;  // each object's seq
  const JobParts parts_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_JOBS_JOB_EXECUTOR_H_
