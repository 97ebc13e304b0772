#include "daemon/jobs/reload_job.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tier::daemon {
namespace {

// What a reload of an object whose fill failed reports.
absl::Status FillFailedError(uint64_t object_id, const absl::Status& fill) {
  return absl::AbortedError(
      absl::StrCat("offload of object ", object_id, " failed: ", fill.message()));
}

// A fill's end as AwaitFill answered it when it did not wait.
absl::Status FillEnd(ObjectTable::Fill fill) {
  return fill == ObjectTable::Fill::kFailed ? absl::InternalError("the fill failed")
                                            : absl::OkStatus();
}

}  // namespace

absl::Status ReloadJob::Start(const JobParts& parts, const std::shared_ptr<Session>& session,
                              const ring::SubmissionEntry& e) {
  absl::StatusOr<ClientRange> range = ClientRange::Of(*session, e);
  if (!range.ok()) return range.status();
  ObjectSlot slot = session->Resolve(e.object_id);
  absl::StatusOr<ObjectTable::Pinned> pinned = slot.table->PinForReload(slot.id, e.len);
  if (!pinned.ok()) return pinned.status();
  // A GPU engine orders a reload after a fill's copy it already has (engine::PoolWrites); a fill
  // not yet submitted (parked for room, or admitted and on its way to the engine on another
  // thread) is waited for here, as every fill is on the host engine.
  const bool wait_for_fill =
      pinned->filling && (!parts.engine.orders_pool_reads() || !pinned->fill_submitted);
  auto job = std::make_shared<ReloadJob>(parts, session, e, *std::move(range), std::move(slot),
                                         *std::move(pinned));
  if (wait_for_fill) {
    ObjectTable::Fill fill =
        job->table_->AwaitFill(job->object(), [job](absl::Status fill) {
          if (fill.ok()) {
            job->Fetch();
          } else {
            job->Abandon(FillFailedError(job->e_.object_id, fill));
          }
        });
    if (fill == ObjectTable::Fill::kRunning) return absl::OkStatus();
    if (fill == ObjectTable::Fill::kFailed) {  // the fill ended meanwhile, and failed
      job->Abandon(FillFailedError(e.object_id, FillEnd(fill)));
      return absl::OkStatus();
    }
  }
  job->Fetch();
  return absl::OkStatus();
}

void ReloadJob::Fetch() {
  parts_.tiers.MakeReadable(table_, session_->id(), pinned_,
                            [self = shared_from_this()](absl::StatusOr<Readable> readable) {
                              if (!readable.ok()) {
                                self->Abandon(readable.status());
                                return;
                              }
                              self->CopyOut(*std::move(readable));
                            });
}

void ReloadJob::CopyOut(Readable from) {
  // A feed fills its own extent from NVMe; otherwise the object's bytes are in host memory.
  storage::Extent extent = from.feed != nullptr ? from.extent : table_->extent(object());
  engine::CopyJob job = MakeCopyJob(engine::Direction::kFromPool, *session_, e_,
                                    parts_.tiers.pool().At(extent), range_);
  job.feed = std::move(from.feed);
  keep_ = std::move(from.keep);  // (held until the copy is done, whatever the read's end)
  job.done = [self = shared_from_this()](absl::Status status) { self->Finish(std::move(status)); };
  parts_.engine.Submit(std::move(job));
}

void ReloadJob::Finish(absl::Status copy) {
  // The copy may have been submitted while the object was still filling (GPU engines): its
  // result stands only once the fill is known to have succeeded.
  ObjectTable::Fill fill = table_->AwaitFill(
      object(), [self = shared_from_this(), copy](absl::Status fill) { self->End(copy, fill); });
  if (fill == ObjectTable::Fill::kRunning) return;
  End(std::move(copy), FillEnd(fill));
}

void ReloadJob::End(absl::Status result, const absl::Status& fill) {
  if (!fill.ok()) result = FillFailedError(e_.object_id, fill);
  const bool persistent = table_ != session_->objects();
  bool later = false;
  if (result.ok() && (e_.flags & ring::kFlagFreeAfterReload)) {
    table_->DropAfterReload(object());
    // A persistent object's name goes too; the job completes once that is durable.
    if (persistent) session_->Unbind(e_.object_id).IgnoreError();
    later = persistent && parts_.persistent != nullptr &&
            parts_.persistent->Forget(table_, object().id(),
                                      [ends = &parts_.ends, session = session_, e = e_] {
                                        ends->Complete(*session, e, absl::OkStatus());
                                      });
  }
  parts_.tiers.ReloadEnded(*table_, object());
  if (!later) parts_.ends.Complete(*session_, e_, result);
}

void ReloadJob::Abandon(absl::Status status) {
  table_->Unpin(object());
  // Fail, not Complete: the reload's ticket never reached the engine, and the client's streams
  // (and every later job of its lane) wait for it.
  parts_.ends.FailOnDevice(session_, e_, std::move(status), range_.device());
}

}  // namespace tier::daemon
