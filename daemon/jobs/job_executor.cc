#include "daemon/jobs/job_executor.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "daemon/jobs/entry_validator.h"

namespace tier::daemon {
namespace {

using ring::Opcode;

}  // namespace

void JobExecutor::Start(const std::shared_ptr<Session>& session,
                        const ring::SubmissionEntry& entry) {
  if (!session->BeginJob()) return;  // closing: the client is gone or going
  CountStart(session->id(), entry);
  metrics_.jobs.Started(session->id(), entry);
  absl::Status status = ValidateEntry(entry);
  if (!status.ok()) {
    Fail(session, entry, std::move(status));
    return;
  }
  switch (static_cast<Opcode>(entry.opcode)) {
    case Opcode::kOffload:
      status = Offload(session, entry);
      break;
    case Opcode::kReload:
      status = Reload(session, entry);
      break;
    case Opcode::kFree:
      status = Free(session, entry);  // (completes itself when it succeeds)
      break;
    case Opcode::kNop:
      Complete(*session, entry, absl::OkStatus());
      break;
  }
  // Offload and reload complete from the copy's callback when they start; a failure to start
  // completes here.
  if (!status.ok()) Fail(session, entry, std::move(status));
}

void JobExecutor::Reject(const std::shared_ptr<Session>& session,
                         const ring::SubmissionEntry& entry, absl::Status status) {
  if (!session->BeginJob()) return;
  CountStart(session->id(), entry);
  Fail(session, entry, std::move(status));
}

void JobExecutor::CountStart(uint64_t session_id, const ring::SubmissionEntry& entry) {
  if (metrics_.jobs_in_flight.Add(session_id)) {
    // The stall clock of health starts no earlier than the work: an idle daemon has not stalled.
    metrics_.last_progress_ms.Store(session_id, MonotonicMs());
  }
  if (entry.sync == 0) metrics_.unticketed_in_flight.Add(session_id);
}

void JobExecutor::Fail(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& entry,
                       absl::Status status) {
  std::shared_ptr<engine::ImportedBuffer> buffer = session->FindBuffer(entry.buffer_id);
  FailOnDevice(session, entry, std::move(status), buffer != nullptr ? buffer->device() : -1);
}

void JobExecutor::FailOnDevice(const std::shared_ptr<Session>& session,
                               const ring::SubmissionEntry& entry, absl::Status status,
                               int device) {
  auto opcode = static_cast<Opcode>(entry.opcode);
  if (entry.sync == 0 || (opcode != Opcode::kOffload && opcode != Opcode::kReload)) {
    Complete(*session, entry, status);
    return;
  }
  // The client took this ticket and its streams wait for it; the engine issues a lane's tickets
  // in order, so a ticket that never reached it would stall every later job of the lane. It
  // goes in as a ticket-only job (no copy) and the entry then fails with the original error.
  engine::CopyJob job;
  job.direction =
      opcode == Opcode::kOffload ? engine::Direction::kToPool : engine::Direction::kFromPool;
  job.len = 0;
  job.session = session->engine_session();
  job.sync = entry.sync;
  job.batch_size = ring::BatchSizeOf(entry.flags);
  job.device = device;
  job.done = [this, session, entry, status = std::move(status)](absl::Status) {
    Complete(*session, entry, status);
  };
  engine_.Submit(std::move(job));
}

absl::StatusOr<JobExecutor::Range> JobExecutor::CheckRange(Session& session,
                                                           const ring::SubmissionEntry& e) {
  std::shared_ptr<engine::ImportedBuffer> buffer = session.FindBuffer(e.buffer_id);
  if (buffer == nullptr) {
    return absl::NotFoundError(absl::StrCat("no buffer ", e.buffer_id, " in this session"));
  }
  if (absl::Status in_range = CheckBufferRange(e.offset, e.len, buffer->bytes(), e.buffer_id);
      !in_range.ok()) {
    return in_range;
  }
  char* data = buffer->base() + e.offset;
  return Range{std::move(buffer), data};
}

absl::Status JobExecutor::Offload(const std::shared_ptr<Session>& session,
                                  const ring::SubmissionEntry& e) {
  absl::StatusOr<Range> range = CheckRange(*session, e);
  if (!range.ok()) return range.status();
  // Every offload is copied into host memory first (the NVMe tier only takes what was there), so
  // one larger than the whole pool can never run. Refused at once: parked, it waited for room
  // that could not come while every later offload of every session queued behind it, and the
  // spiller pushed other sessions' objects to NVMe trying to make that room.
  if (!tiers_.CanEverHold(e.len)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("an offload of ", e.len, " bytes can never fit: the host pool holds ",
                     tiers_.pool().largest_part_bytes(), " bytes in one part"));
  }
  ObjectSlot slot = session->Resolve(e.object_id);
  absl::StatusOr<std::shared_ptr<Object>> object =
      slot.table->Create(slot.id, e.len, e.hint,
                         offload_order_.Next(session->id()), tiers_.Charge(e.len));
  if (!object.ok()) return object.status();
  // The object exists from here on (jobs naming it queue behind its fill); the copy starts once
  // it has host memory: now, or once the spiller made room, or never (no room can come).
  const int device = range->buffer->device();  // its GPU's pool part first
  tiers_.Admit(slot.table, session->id(), *object, device,
               [this, session, e, table = slot.table, object = *object,
                range = *std::move(range)](absl::Status admitted) mutable {
                 if (admitted.ok()) {
                   CopyIn(session, e, table, object, std::move(range));
                   return;
                 }
                 EndFill(*table, *object, admitted);
                 FailOnDevice(session, e, std::move(admitted), range.buffer->device());
               });
  return absl::OkStatus();
}

void JobExecutor::CopyIn(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& e,
                         const std::shared_ptr<ObjectTable>& table,
                         const std::shared_ptr<Object>& object, Range range) {
  engine::CopyJob job =
      MakeCopyJob(engine::Direction::kToPool, *session, e, table->extent(*object), range);
  job.done = [this, session, e, table, object,
              buffer = std::move(range.buffer)](absl::Status status) {
    std::vector<ObjectWaiter> waiters;
    tiers_.FillEnded(table, object, status, &waiters);
    for (ObjectWaiter& start : waiters) start(status);
    // A persistent object is queued for the journal (when there is one), not pinned: the
    // journal's writer reads it back from NVMe if the spiller took it first.
    if (status.ok() && persistent_ != nullptr && table != session->objects()) {
      persistent_->Filled(table, object);
    }
    Complete(*session, e, status);
  };
  engine_.Submit(std::move(job));
}

void JobExecutor::EndFill(ObjectTable& table, Object& object, const absl::Status& status) {
  std::vector<ObjectWaiter> waiters;
  table.EndFill(object, status, &waiters);  // (memory it releases goes back at once)
  for (ObjectWaiter& start : waiters) start(status);
}

namespace {

// What a reload of an object whose fill failed reports.
absl::Status FillFailedError(uint64_t object_id, const absl::Status& fill) {
  return absl::AbortedError(
      absl::StrCat("offload of object ", object_id, " failed: ", fill.message()));
}

}  // namespace

absl::Status JobExecutor::Reload(const std::shared_ptr<Session>& session,
                                 const ring::SubmissionEntry& e) {
  absl::StatusOr<Range> range = CheckRange(*session, e);
  if (!range.ok()) return range.status();
  ObjectSlot slot = session->Resolve(e.object_id);
  ObjectTable& table = *slot.table;
  absl::StatusOr<ObjectTable::Pinned> pinned = table.PinForReload(slot.id, e.len);
  if (!pinned.ok()) return pinned.status();
  // A reload of an object still filling is started by the fill's end, in the order the reloads
  // arrived; except on GPU engines, which order the copies on the GPU: there the reload is
  // submitted at once, so that a ticketed job is never held on the host behind another job's
  // completion (client/gpu/client_gpu.h). An offload still waiting for host room has nothing to order
  // the copy after yet, so its reloads wait on the host on every engine.
  if (pinned->filling && (!engine_.orders_pool_reads() || !pinned->admitted)) {
    ObjectTable::Fill fill = table.AwaitFill(
        *pinned->object, [this, session, e, table = slot.table, pinned = *pinned,
                          range = *range](absl::Status fill) {
          if (fill.ok()) {
            FetchThenCopyOut(session, e, table, pinned, range);
          } else {
            AbandonReload(session, e, range, *table, *pinned.object,
                          FillFailedError(e.object_id, fill));
          }
        });
    if (fill == ObjectTable::Fill::kRunning) return absl::OkStatus();
    if (fill == ObjectTable::Fill::kFailed) {  // the fill ended meanwhile, and failed
      AbandonReload(session, e, *range, table, *pinned->object,
                    FillFailedError(e.object_id, absl::InternalError("the fill failed")));
      return absl::OkStatus();
    }
  }
  FetchThenCopyOut(session, e, slot.table, *pinned, *std::move(range));
  return absl::OkStatus();
}

void JobExecutor::FetchThenCopyOut(const std::shared_ptr<Session>& session,
                                   const ring::SubmissionEntry& e,
                                   const std::shared_ptr<ObjectTable>& table,
                                   const ObjectTable::Pinned& pinned, Range range) {
  tiers_.MakeReadable(table, session->id(), pinned,
                      [this, session, e, table, object = pinned.object,
                       range = std::move(range)](absl::StatusOr<Readable> readable) {
                        if (!readable.ok()) {
                          AbandonReload(session, e, range, *table, *object,
                                        readable.status());
                          return;
                        }
                        CopyOut(session, e, table, object, range, *std::move(readable));
                      });
}

void JobExecutor::CopyOut(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& e,
                          const std::shared_ptr<ObjectTable>& table,
                          const std::shared_ptr<Object>& object, Range range, Readable from) {
  // A feed fills its own extent from NVMe; otherwise the object's bytes are in host memory.
  storage::Extent extent = from.feed != nullptr ? from.extent : table->extent(*object);
  engine::CopyJob job = MakeCopyJob(engine::Direction::kFromPool, *session, e, extent, range);
  job.feed = std::move(from.feed);
  // (`keep` holds a pipelined read's extent until this copy is done, whatever the read's end.)
  job.done = [this, session, e, table, object, buffer = std::move(range.buffer),
              keep = std::move(from.keep)](absl::Status status) {
    FinishReload(session, e, table, object, std::move(status));
  };
  engine_.Submit(std::move(job));
}

void JobExecutor::FinishReload(const std::shared_ptr<Session>& session,
                               const ring::SubmissionEntry& e,
                               const std::shared_ptr<ObjectTable>& table,
                               const std::shared_ptr<Object>& object, absl::Status copy) {
  // The copy may have been submitted while the object was still filling (GPU engines): its
  // result stands only once the fill is known to have succeeded.
  auto finish = [this, session, e, table, object](absl::Status result, const absl::Status& fill) {
    if (!fill.ok()) result = FillFailedError(e.object_id, fill);
    bool later = false;
    if (result.ok() && (e.flags & ring::kFlagFreeAfterReload)) {
      table->DropAfterReload(*object);
      // A persistent object's name goes too; the job completes once that is durable.
      if (table != session->objects()) session->Unbind(e.object_id).IgnoreError();
      later = persistent_ != nullptr && table != session->objects() &&
              persistent_->Forget(table, object->id(),
                                  [this, session, e] { Complete(*session, e, absl::OkStatus()); });
    }
    tiers_.ReloadEnded(*table, *object);
    if (!later) Complete(*session, e, result);
  };
  ObjectTable::Fill fill =
      table->AwaitFill(*object, [finish, copy](absl::Status fill) { finish(copy, fill); });
  if (fill == ObjectTable::Fill::kRunning) return;
  finish(std::move(copy), fill == ObjectTable::Fill::kFailed
                              ? absl::InternalError("the fill failed")
                              : absl::OkStatus());
}

void JobExecutor::AbandonReload(const std::shared_ptr<Session>& session,
                                const ring::SubmissionEntry& e, const Range& range,
                                ObjectTable& table, Object& object, absl::Status status) {
  table.Unpin(object);
  // Fail, not Complete: the reload's ticket never reached the engine, and the client's streams
  // (and every later job of its lane) wait for it.
  FailOnDevice(session, e, std::move(status), range.buffer->device());
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
      persistent_ != nullptr && slot.table != session->objects() &&
      persistent_->Forget(slot.table, slot.id,
                          [this, session, e] { Complete(*session, e, absl::OkStatus()); });
  if (!later) Complete(*session, e, absl::OkStatus());
  return absl::OkStatus();
}

engine::CopyJob JobExecutor::MakeCopyJob(engine::Direction direction, Session& session,
                                      const ring::SubmissionEntry& e, storage::Extent extent,
                                      const Range& range) {
  engine::CopyJob job;
  job.direction = direction;
  job.client = range.data;
  job.pool = tiers_.pool().At(extent);
  job.len = e.len;
  job.session = session.engine_session();
  job.sync = e.sync;
  job.batch_size = ring::BatchSizeOf(e.flags);
  return job;
}

void JobExecutor::ReleaseAll(Session& session) {
  session.objects()->DropAll();  // what no job uses goes back now
  // Persistent objects stay; names the session reserved and never filled go.
  if (persistent_ != nullptr) persistent_->SessionEnded(session.id());
  // Dropped outside any lock: closing client memory is the engine's slow path.
  session.TakeAllBuffers().clear();
}

void JobExecutor::Complete(Session& session, const ring::SubmissionEntry& entry,
                           const absl::Status& status) {
  ring::CompletionEntry c{};
  c.job_id = entry.job_id;
  c.status = StatusCodeToInt(status);
  c.object_id = entry.object_id;
  c.len = entry.len;
  const uint64_t id = session.id();  // the shard of every daemon-wide count (metric_shards.h)
  metrics_.jobs.Completed(id, entry, c.status);
  JobCounters& counters = session.counters();
  const uint64_t now_ms = MonotonicMs();
  if (status.ok()) {
    counters.jobs_completed.fetch_add(1, std::memory_order_relaxed);
    metrics_.totals.jobs_completed.Add(id);
    auto opcode = static_cast<Opcode>(entry.opcode);
    if (opcode == Opcode::kOffload || opcode == Opcode::kReload) {
      auto& session_bytes =
          opcode == Opcode::kOffload ? counters.bytes_offloaded : counters.bytes_reloaded;
      auto& total_bytes = opcode == Opcode::kOffload ? metrics_.totals.bytes_offloaded
                                                     : metrics_.totals.bytes_reloaded;
      session_bytes.fetch_add(entry.len, std::memory_order_relaxed);
      total_bytes.Add(id, entry.len);
      metrics_.bandwidth.Add(entry.len, now_ms, id);
    }
  } else {
    counters.jobs_failed.fetch_add(1, std::memory_order_relaxed);
    metrics_.totals.jobs_failed.Add(id);
  }
  // Progress is noted before the client can see the completion, so that a client that asks for
  // health right after its job completed never finds that job still counted as stuck.
  metrics_.last_progress_ms.Store(id, now_ms);
  if (entry.sync == 0) metrics_.unticketed_in_flight.Sub(id);
  session.PostCompletion(c);
  metrics_.jobs_in_flight.Sub(id);
  session.EndJob();
}

}  // namespace tier::daemon
