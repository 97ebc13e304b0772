#include "daemon/jobs/offload_job.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tier::daemon {

absl::Status OffloadJob::Start(const JobParts& parts, const std::shared_ptr<Session>& session,
                               const ring::SubmissionEntry& e) {
  absl::StatusOr<ClientRange> range = ClientRange::Of(*session, e);
  if (!range.ok()) return range.status();
  // Every offload is copied into host memory first (the NVMe tier only takes what was there), so
  // one larger than the whole pool can never run. Refused at once: parked, it waited for room
  // that could not come while every later offload of every session queued behind it, and the
  // spiller pushed other sessions' objects to NVMe trying to make that room.
  if (!parts.tiers.CanEverHold(e.len)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("an offload of ", e.len, " bytes can never fit: the host pool holds ",
                     parts.tiers.pool().largest_part_bytes(), " bytes in one part"));
  }
  ObjectSlot slot = session->Resolve(e.object_id);
  absl::StatusOr<std::shared_ptr<Object>> object =
      slot.table->Create(slot.id, e.len, e.hint, parts.order.Next(session->id()),
                         parts.tiers.Charge(e.len));
  if (!object.ok()) return object.status();
  auto job = std::make_shared<OffloadJob>(parts, session, e, *std::move(range),
                                          std::move(slot.table), *std::move(object));
  // The copy starts once the object has host memory: its GPU's pool part first.
  parts.tiers.Admit(job->table_, session->id(), job->object_, job->range_.device(),
                    [job](absl::Status admitted) {
                      if (admitted.ok()) {
                        job->CopyIn();
                      } else {
                        job->Refused(std::move(admitted));
                      }
                    });
  return absl::OkStatus();
}

void OffloadJob::CopyIn() {
  engine::CopyJob job = MakeCopyJob(engine::Direction::kToPool, *session_, e_,
                                    parts_.tiers.pool().At(table_->extent(*object_)), range_);
  job.done = [self = shared_from_this()](absl::Status status) { self->Copied(status); };
  parts_.engine.Submit(std::move(job));
  // Only now may a reload rely on the engine's ordering (ReloadJob::Start): admission may run on
  // the spiller's thread while the ring poller starts a reload of this object.
  table_->FillSubmitted(*object_);
}

void OffloadJob::Copied(const absl::Status& status) {
  std::vector<ObjectWaiter> waiters;
  parts_.tiers.FillEnded(table_, object_, status, &waiters);
  for (ObjectWaiter& start : waiters) start(status);
  // A persistent object is queued for the journal (when there is one), not pinned: the
  // journal's writer reads it back from NVMe if the spiller took it first.
  if (status.ok() && parts_.persistent != nullptr && table_ != session_->objects()) {
    parts_.persistent->Filled(table_, object_);
  }
  parts_.ends.Complete(*session_, e_, status);
}

void OffloadJob::Refused(absl::Status status) {
  // The fill ended before any copy: the table's transition (memory it releases goes back at
  // once), then the reloads that waited for it.
  std::vector<ObjectWaiter> waiters;
  table_->EndFill(*object_, status, &waiters);
  for (ObjectWaiter& start : waiters) start(status);
  parts_.ends.FailOnDevice(session_, e_, std::move(status), range_.device());
}

}  // namespace tier::daemon
