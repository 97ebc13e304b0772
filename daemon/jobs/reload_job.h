// One reload (an object's bytes -> the client's buffer range) from start to end, read top-down:
//
//   Start      the range checked, the object resolved and pinned; a reload of an object still
//              filling waits for the fill's end (below);
//   Fetch      its bytes made readable by the tiers: in host memory, or coming back from NVMe
//              (a feed the copy follows chunk by chunk as the store verifies them);
//   CopyOut    the engine's copy into the client's range;
//   Finish     the copy ended: its result stands once the fill it may have run beside succeeded;
//              a free-after-reload drops the object (and a persistent object's name); the pin
//              goes, the job completes;
//   Abandon    a reload that ends before its copy was submitted: the pin goes, and the job fails
//              with its ticket passed to the engine (the client's streams wait for it).
//
// Ordering against the object's fill: a reload of an object still filling is started by the
// fill's end, in the order the reloads arrived; except on GPU engines, which order the copies on
// the GPU (CopyEngine::orders_pool_reads): there it is submitted at once, so that a ticketed job is
// never held on the host behind another job's completion (client/gpu/client_gpu.h). An offload
// still waiting for host room has nothing to order the copy after yet, so its reloads wait on the
// host on every engine.
//
// It owns itself while it runs (each step's callback holds it); nobody else holds it.
#ifndef TIER_DAEMON_JOBS_RELOAD_JOB_H_
#define TIER_DAEMON_JOBS_RELOAD_JOB_H_

#include <memory>

#include "absl/status/status.h"
#include "daemon/jobs/client_range.h"
#include "daemon/jobs/job_parts.h"
#include "daemon/sessions/session.h"
#include "daemon/tiers/object_table.h"
#include "daemon/tiers/spill_read.h"
#include "tier/ring.h"

namespace tier::daemon {

class ReloadJob : public std::enable_shared_from_this<ReloadJob> {
 public:
  // An error only when the reload did not start (the caller fails it); one that started
  // completes from a callback.
  static absl::Status Start(const JobParts& parts, const std::shared_ptr<Session>& session,
                            const ring::SubmissionEntry& e);

  ReloadJob(const JobParts& parts, std::shared_ptr<Session> session, const ring::SubmissionEntry& e,
            ClientRange range, ObjectSlot slot, ObjectTable::Pinned pinned)
      : parts_(parts), session_(std::move(session)), e_(e), range_(std::move(range)),
        table_(std::move(slot.table)), pinned_(std::move(pinned)) {}

 private:
  // Once the fill it must follow (if any) is known to have succeeded.
  void Fetch();
  void CopyOut(Readable from);
  void Finish(absl::Status copy);
  // Finish, once the fill's end is known (`fill`).
  void End(absl::Status result, const absl::Status& fill);
  void Abandon(absl::Status status);

  Object& object() { return *pinned_.object; }

  const JobParts parts_;
  const std::shared_ptr<Session> session_;
  const ring::SubmissionEntry e_;
  ClientRange range_;  // (its buffer is let go once the copy ended)
  const std::shared_ptr<ObjectTable> table_;  // where the object lives
  const ObjectTable::Pinned pinned_;
  std::shared_ptr<Release> keep_;  // a pipelined read's extent, until the copy ended
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_JOBS_RELOAD_JOB_H_
