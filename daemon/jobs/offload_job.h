// One offload (the client's buffer range -> a new object's host bytes) from start to end, read
// top-down:
//
//   Start    the range checked (and the length against the pool: one larger than its largest
//            part can never run), the object created in its table (quota charged, the offload
//            numbered), then admitted by the tiers: it gets its host extent now, or once the
//            spiller made room, or never;
//   CopyIn   the engine's copy into the extent; its end ends the object's fill (the reloads that
//            waited for it start) and completes the job, and a persistent object goes to the
//            journal;
//   Refused  no host room can come: the fill ends failed and the job fails, its ticket passed
//            to the engine.
//
// The object exists from Start on: jobs naming it queue behind its fill. It owns itself while
// it runs (each step's callback holds it); nobody else holds it.
#ifndef TIER_DAEMON_JOBS_OFFLOAD_JOB_H_
#define TIER_DAEMON_JOBS_OFFLOAD_JOB_H_

#include <memory>

#include "absl/status/status.h"
#include "daemon/jobs/client_range.h"
#include "daemon/jobs/job_parts.h"
#include "daemon/sessions/session.h"
#include "daemon/tiers/object_table.h"
#include "tier/ring.h"

namespace tier::daemon {

class OffloadJob : public std::enable_shared_from_this<OffloadJob> {
 public:
  // An error only when the offload did not start (the caller fails it); one that started
  // completes from a callback.
  static absl::Status Start(const JobParts& parts, const std::shared_ptr<Session>& session,
                            const ring::SubmissionEntry& e);

  OffloadJob(const JobParts& parts, std::shared_ptr<Session> session,
             const ring::SubmissionEntry& e, ClientRange range, std::shared_ptr<ObjectTable> table,
             std::shared_ptr<Object> object)
      : parts_(parts), session_(std::move(session)), e_(e), range_(std::move(range)),
        table_(std::move(table)), object_(std::move(object)) {}

 private:
  void CopyIn();
  void Copied(const absl::Status& status);
  void Refused(absl::Status status);

  const JobParts parts_;
  const std::shared_ptr<Session> session_;
  const ring::SubmissionEntry e_;
  const ClientRange range_;
  const std::shared_ptr<ObjectTable> table_;  // where the object lives
  const std::shared_ptr<Object> object_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_JOBS_OFFLOAD_JOB_H_
