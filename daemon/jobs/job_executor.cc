#include "daemon/jobs/job_executor.h"

#include <utility>

#include "daemon/jobs/entry_validator.h"
#include "daemon/jobs/offload_job.h"
#include "daemon/jobs/reload_job.h"

namespace tier::daemon {

using ring::Opcode;

void JobExecutor::Start(const std::shared_ptr<Session>& session,
                        const ring::SubmissionEntry& entry) {
  if (!session->BeginJob()) return;  // closing: the client is gone or going
  ends_.Accepted(session->id(), entry);
  metrics_.jobs.Started(session->id(), entry);
  absl::Status status = ValidateEntry(entry);
  if (!status.ok()) {
    ends_.Fail(session, entry, std::move(status));
    return;
  }
  switch (static_cast<Opcode>(entry.opcode)) {
    case Opcode::kOffload:
      status = OffloadJob::Start(parts_, session, entry);
      break;
    case Opcode::kReload:
      status = ReloadJob::Start(parts_, session, entry);
      break;
    case Opcode::kFree:
      status = Free(session, entry);  // (completes itself when it succeeds)
      break;
    case Opcode::kNop:
      ends_.Complete(*session, entry, absl::OkStatus());
      break;
  }
  // Offload and reload complete from the copy's callback when they start; a failure to start
  // completes here.
  if (!status.ok()) ends_.Fail(session, entry, std::move(status));
}

void JobExecutor::Reject(const std::shared_ptr<Session>& session,
                         const ring::SubmissionEntry& entry, absl::Status status) {
  if (!session->BeginJob()) return;
  ends_.Accepted(session->id(), entry);
  ends_.Fail(session, entry, std::move(status));
}

absl::Status JobExecutor::Free(const std::shared_ptr<Session>& session,
                               const ring::SubmissionEntry& e) {
  // Jobs already accepted keep their pins; the memory returns when the last one ends.
  ObjectSlot slot = session->Resolve(e.object_id);
  // (What the free releases goes back at once.)
  if (absl::Status freed = slot.table->Free(slot.id).status(); !freed.ok()) return freed;
  // A persistent object bound to the id is deleted: its name goes with it (and the id's binding,
  // which would otherwise count against the session's bound ids until it ended), and the job
  // completes once that is durable (a crash must not bring back an object whose free the client
  // saw).
  if (slot.table != session->objects()) session->Unbind(e.object_id).IgnoreError();
  const bool later =
      parts_.persistent != nullptr && slot.table != session->objects() &&
      parts_.persistent->Forget(slot.table, slot.id, [this, session, e] {
        ends_.Complete(*session, e, absl::OkStatus());
      });
  if (!later) ends_.Complete(*session, e, absl::OkStatus());
  return absl::OkStatus();
}

void JobExecutor::ReleaseAll(Session& session) {
  session.objects()->DropAll();  // what no job uses goes back now
  // Persistent objects stay; names the session reserved and never filled go.
  if (parts_.persistent != nullptr) parts_.persistent->SessionEnded(session.id());
  // Dropped outside any lock: closing client memory is the engine's slow path.
  session.TakeAllBuffers().clear();
}

}  // namespace tier::daemon
