// How every job ends: counted in when it is accepted, and out, with exactly one completion on its
// session's ring carrying a canonical status code. A ticketed offload or reload that fails before
// its copy reached the engine still passes its ticket to the engine first, as a ticket-only job:
// the client's streams wait for that ticket, and the engine issues a lane's tickets in order, so
// one that never arrived would stall every later job of the lane (and the trainer) for good.
#ifndef TIER_DAEMON_JOBS_JOB_ENDS_H_
#define TIER_DAEMON_JOBS_JOB_ENDS_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "daemon/metrics/metrics.h"
#include "daemon/sessions/session.h"
#include "engine/copy_engine.h"
#include "tier/ring.h"

namespace tier::daemon {

class JobEnds {
 public:
  JobEnds(engine::CopyEngine& engine, DaemonMetrics& metrics)
      : engine_(engine), metrics_(metrics) {}

  // A job of session `session_id` was accepted: the daemon-wide counts (Complete undoes them).
  void Accepted(uint64_t session_id, const ring::SubmissionEntry& entry);
  // The job ends with `status`: its counts, then its completion.
  void Complete(Session& session, const ring::SubmissionEntry& entry, const absl::Status& status);
  // A job that will not run ends with `status`; a ticketed one passes its ticket first: on the
  // GPU of the buffer the entry names (Fail), or on `device` (FailOnDevice: a job that holds its
  // checked buffer, which the client may have unregistered since).
  void Fail(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& entry,
            absl::Status status);
  void FailOnDevice(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& entry,
                    absl::Status status, int device);

 private:
  engine::CopyEngine& engine_;
  DaemonMetrics& metrics_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_JOBS_JOB_ENDS_H_
