#include "daemon/job_executor.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "daemon/entry_validator.h"
#include "daemon/object_memory.h"

namespace tier::daemon {
namespace {

using ring::Opcode;

}  // namespace

void JobExecutor::Start(const std::shared_ptr<Session>& session,
                        const ring::SubmissionEntry& entry) {
  if (!session->BeginJob()) return;  // closing: the client is gone or going
  CountStart(entry);
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
      status = Free(*session, entry);
      if (status.ok()) Complete(*session, entry, status);
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
  CountStart(entry);
  Fail(session, entry, std::move(status));
}

void JobExecutor::CountStart(const ring::SubmissionEntry& entry) {
  if (metrics_.jobs_in_flight.fetch_add(1, std::memory_order_relaxed) == 0) {
    // The stall clock of health starts no earlier than the work: an idle daemon has not stalled.
    metrics_.last_progress_ms.store(MonotonicMs(), std::memory_order_relaxed);
  }
  if (entry.sync == 0) metrics_.unticketed_in_flight.fetch_add(1, std::memory_order_relaxed);
}

void JobExecutor::Fail(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& entry,
                       absl::Status status) {
  auto opcode = static_cast<Opcode>(entry.opcode);
  if (entry.sync == 0 || (opcode != Opcode::kOffload && opcode != Opcode::kReload)) {
    Complete(*session, entry, status);
    return;
  }
  // The client took this ticket and its streams wait for it; the engine issues a lane's tickets
  // in order, so a ticket that never reached it would stall every later job of the lane. It
  // goes in as a ticket-only job (no copy) and the entry then fails with the original error.
  gpu::CopyJob job;
  job.direction = opcode == Opcode::kOffload ? gpu::Direction::kToPool : gpu::Direction::kFromPool;
  job.len = 0;
  job.session = session->engine_session();
  job.sync = entry.sync;
  if (std::shared_ptr<gpu::ImportedBuffer> buffer = session->FindBuffer(entry.buffer_id)) {
    job.device = buffer->device();
  }
  job.done = [this, session, entry, status = std::move(status)](absl::Status) {
    Complete(*session, entry, status);
  };
  engine_.Submit(std::move(job));
}

absl::StatusOr<JobExecutor::Range> JobExecutor::CheckRange(Session& session,
                                                           const ring::SubmissionEntry& e) {
  std::shared_ptr<gpu::ImportedBuffer> buffer = session.FindBuffer(e.buffer_id);
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
  if (e.len > pool_.bytes()) {
    return absl::ResourceExhaustedError(absl::StrCat("an offload of ", e.len,
                                                     " bytes can never fit: the host pool holds ",
                                                     pool_.bytes(), " bytes"));
  }

  auto object = std::make_shared<Object>();
  {
    std::lock_guard lock(session->mu());
    if (session->objects().contains(e.object_id)) {
      return absl::AlreadyExistsError(absl::StrCat("object ", e.object_id, " already exists"));
    }
    // Charged as the extent the pool will hand out (rounded up to its alignment).
    uint64_t charge = (e.len + pool_.alignment() - 1) & ~(pool_.alignment() - 1);
    if (session->used_bytes() + charge > session->quota_bytes()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("session quota exceeded: ", session->used_bytes(), " + ", charge,
                       " bytes > quota of ", session->quota_bytes()));
    }
    // With jobs already waiting for room, this one waits behind them (in order).
    std::optional<storage::Extent> extent;
    if (spiller_ == nullptr || !spiller_->HasWaiters()) extent = pool_.Allocate(e.len);
    if (!extent && spiller_ == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host pool full: no free extent of ", e.len, " bytes"));
    }
    object->len = e.len;
    object->hint = e.hint;
    object->seq = next_seq_.fetch_add(1, std::memory_order_relaxed);
    object->pins = 1;  // the fill
    object->charged = extent ? extent->bytes : charge;
    if (extent) object->extent = *extent;
    session->objects().emplace(e.object_id, object);
    session->used_bytes() += object->charged;
  }
  if (object->extent.bytes == 0) {
    // Host pool full: the object exists at once (jobs naming it queue behind its fill), and the
    // copy starts once the spiller has made room, or fails if none can come.
    ParkOffload(session, e, object, *std::move(range));
    return absl::OkStatus();
  }
  StartOffloadCopy(session, e, std::move(object), *std::move(range));
  return absl::OkStatus();
}

void JobExecutor::ParkOffload(const std::shared_ptr<Session>& session,
                              const ring::SubmissionEntry& e, std::shared_ptr<Object> object,
                              Range range) {
  spiller_->WaitForRoom(
      session->id(),
      [this, session, e, object, range]() {
        {
          std::lock_guard lock(session->mu());
          std::optional<storage::Extent> extent = pool_.Allocate(e.len);
          if (!extent) return false;
          object->extent = *extent;
          session->used_bytes() += extent->bytes - object->charged;
          object->charged = extent->bytes;
        }
        StartOffloadCopy(session, e, object, range);
        return true;
      },
      [this, session, e, object]() {
        absl::Status full = absl::ResourceExhaustedError(absl::StrCat(
            "host pool and NVMe tier full: no room for ", e.len, " bytes (nothing more to spill)"));
        EndFill(*session, e, *object, full);
        Fail(session, e, full);
      });
}

void JobExecutor::StartOffloadCopy(const std::shared_ptr<Session>& session,
                                   const ring::SubmissionEntry& e, std::shared_ptr<Object> object,
                                   Range range) {
  gpu::CopyJob job = MakeCopyJob(gpu::Direction::kToPool, *session, e, *object, range);
  // The callback holds the buffer (so an unregister cannot unmap it mid-copy) and the session.
  job.done = [this, session, e, object, buffer = std::move(range.buffer)](absl::Status status) {
    EndFill(*session, e, *object, status);
    if (spiller_ != nullptr) {
      if (status.ok()) spiller_->Track(session, object);
      spiller_->CopyEnded();
    }
    Complete(*session, e, status);
  };
  if (spiller_ != nullptr) spiller_->CopyStarted();
  engine_.Submit(std::move(job));
}

absl::Status JobExecutor::Reload(const std::shared_ptr<Session>& session,
                                 const ring::SubmissionEntry& e) {
  absl::StatusOr<Range> range = CheckRange(*session, e);
  if (!range.ok()) return range.status();
  std::shared_ptr<Object> object;
  bool spilled = false;
  {
    std::lock_guard lock(session->mu());
    auto it = session->objects().find(e.object_id);
    if (it == session->objects().end()) {
      return absl::NotFoundError(absl::StrCat("no object ", e.object_id, " in this session"));
    }
    object = it->second;
    if (e.len != object->len) {
      return absl::InvalidArgumentError(absl::StrCat("reload of ", e.len, " bytes from object ",
                                                     e.object_id, " of ", object->len, " bytes"));
    }
    ++object->pins;
    if (spiller_ != nullptr) spiller_->NoteReloadLocked(*object);
    // TIER_RELOAD_FREE_AFTER drops the object when the copy succeeded (DropAfterReloadLocked), so
    // a reload that fails (a spilled object with no host room yet, say) loses nothing.
    // (An offload waiting for room has no extent yet: nothing to order on the GPU either.)
    if (object->state == Object::State::kFilling &&
        (!engine_.orders_pool_reads() || object->extent.bytes == 0)) {
      // Started by the offload's completion, in the order the reloads arrived. (GPU engines
      // order the copies on the GPU instead: the reload is submitted at once, so a ticketed job
      // is never held on the host behind another job's completion; see gpu/client_gpu.h.)
      object->on_filled.push_back(
          [this, session, e, object, range = *range](absl::Status fill) mutable {
            if (fill.ok()) {
              StartReloadCopy(session, e, std::move(object), std::move(range));
              return;
            }
            {
              std::lock_guard lock(session->mu());
              UnpinLocked(*session, *object);
            }
            Complete(*session, e,
                     absl::AbortedError(absl::StrCat("offload of object ", e.object_id,
                                                     " failed: ", fill.message())));
          });
      return absl::OkStatus();
    }
    spilled = object->where == Object::Where::kNvme || object->where == Object::Where::kFetching;
  }
  if (spilled) {
    // NVMe -> host -> destination. The reload that starts the read copies each chunk onward as
    // the read verifies it (pipelined: the feed also carries the read's result); a reload that
    // finds a read already running waits for it, then copies.
    auto copy_when_fetched = [this, session, e, object,
                              range = *range](absl::Status fetched) mutable {
      if (fetched.ok()) {
        StartReloadCopy(session, e, std::move(object), std::move(range));
        return;
      }
      {
        std::lock_guard lock(session->mu());
        UnpinLocked(*session, *object);
      }
      Complete(*session, e, fetched);
    };
    Spiller::Pipelined copy_as_fetched = [this, session, e, object, range = *range](
                                             std::shared_ptr<gpu::SourceFeed> feed,
                                             std::shared_ptr<void> lease) {
      StartReloadCopy(session, e, object, range, std::move(feed), std::move(lease));
    };
    spiller_->Fetch(session, object, std::move(copy_when_fetched), std::move(copy_as_fetched));
    return absl::OkStatus();
  }
  StartReloadCopy(session, e, std::move(object), std::move(*range));
  return absl::OkStatus();
}

void JobExecutor::StartReloadCopy(const std::shared_ptr<Session>& session,
                                  const ring::SubmissionEntry& e, std::shared_ptr<Object> object,
                                  Range range, std::shared_ptr<gpu::SourceFeed> feed,
                                  std::shared_ptr<void> lease) {
  gpu::CopyJob job = MakeCopyJob(gpu::Direction::kFromPool, *session, e, *object, range);
  job.feed = std::move(feed);
  // (`lease` keeps a pipelined read's extent until this copy is done, whatever the read's end.)
  job.done = [this, session, e, object, buffer = std::move(range.buffer),
              lease = std::move(lease)](absl::Status status) {
    // The copy may have been submitted while the object was still filling (GPU engines): its
    // result stands only once the fill is known to have succeeded.
    auto finish = [this, session, e, object](absl::Status copy, const absl::Status& fill) {
      if (!fill.ok()) {
        copy = absl::AbortedError(
            absl::StrCat("offload of object ", e.object_id, " failed: ", fill.message()));
      }
      {
        std::lock_guard lock(session->mu());
        if (copy.ok()) DropAfterReloadLocked(*session, e, *object);
        UnpinLocked(*session, *object);
      }
      if (spiller_ != nullptr) spiller_->CopyEnded();
      Complete(*session, e, copy);
    };
    bool fill_failed;
    {
      std::lock_guard lock(session->mu());
      if (object->state == Object::State::kFilling) {
        object->on_filled.push_back(
            [finish, status](absl::Status fill) mutable { finish(std::move(status), fill); });
        return;
      }
      fill_failed = object->state == Object::State::kFailed;
    }
    finish(std::move(status),
           fill_failed ? absl::InternalError("the fill failed") : absl::OkStatus());
  };
  if (spiller_ != nullptr) spiller_->CopyStarted();
  engine_.Submit(std::move(job));
}

absl::Status JobExecutor::Free(Session& session, const ring::SubmissionEntry& e) {
  std::lock_guard lock(session.mu());
  auto it = session.objects().find(e.object_id);
  if (it == session.objects().end()) {
    return absl::NotFoundError(absl::StrCat("no object ", e.object_id, " in this session"));
  }
  std::shared_ptr<Object> object = std::move(it->second);
  session.objects().erase(it);
  object->dropped = true;
  // Jobs already accepted keep their pins; the memory returns when the last one ends.
  ++object->pins;
  UnpinLocked(session, *object);
  return absl::OkStatus();
}

gpu::CopyJob JobExecutor::MakeCopyJob(gpu::Direction direction, Session& session,
                                      const ring::SubmissionEntry& e, const Object& object,
                                      const Range& range) {
  gpu::CopyJob job;
  job.direction = direction;
  job.client = range.data;
  job.pool = pool_.At(object.extent);
  job.len = e.len;
  job.session = session.engine_session();
  job.sync = e.sync;
  return job;
}

void JobExecutor::EndFill(Session& session, const ring::SubmissionEntry& e, Object& object,
                          const absl::Status& status) {
  std::vector<std::function<void(absl::Status)>> waiters;
  {
    std::lock_guard lock(session.mu());
    if (status.ok()) {
      object.state = Object::State::kReady;
    } else {
      object.state = Object::State::kFailed;
      if (!object.dropped) {  // a failed offload leaves no object behind
        session.objects().erase(e.object_id);
        object.dropped = true;
      }
    }
    waiters.swap(object.on_filled);
    UnpinLocked(session, object);
  }
  for (auto& start : waiters) start(status);
}

void JobExecutor::DropAfterReloadLocked(Session& session, const ring::SubmissionEntry& e,
                                        Object& object) {
  if (!(e.flags & ring::kFlagFreeAfterReload) || object.dropped) return;
  auto it = session.objects().find(e.object_id);
  if (it != session.objects().end() && it->second.get() == &object) session.objects().erase(it);
  object.dropped = true;
}

void JobExecutor::UnpinLocked(Session& session, Object& object) {
  Released released =
      UnpinObjectLocked(session, object, pool_, spiller_ ? &spiller_->store() : nullptr);
  // Parked offloads may fit now, or a prefetch.
  if (released == Released::kHost && spiller_ != nullptr) spiller_->NotifyFreed();
}

void JobExecutor::ReleaseAll(Session& session) {
  {
    std::lock_guard lock(session.mu());
    for (const std::shared_ptr<Object>& object : session.TakeAllObjects()) {
      object->dropped = true;
      ++object->pins;
      UnpinLocked(session, *object);
    }
  }
  // Dropped outside the session's lock: closing client memory is the engine's slow path.
  session.TakeAllBuffers().clear();
}

void JobExecutor::Complete(Session& session, const ring::SubmissionEntry& entry,
                           const absl::Status& status) {
  ring::CompletionEntry c{};
  c.job_id = entry.job_id;
  c.status = StatusCodeToInt(status);
  c.object_id = entry.object_id;
  c.len = entry.len;
  metrics_.jobs.Completed(session.id(), entry, c.status);
  JobCounters& counters = session.counters();
  if (status.ok()) {
    counters.jobs_completed.fetch_add(1, std::memory_order_relaxed);
    metrics_.totals.jobs_completed.fetch_add(1, std::memory_order_relaxed);
    auto opcode = static_cast<Opcode>(entry.opcode);
    if (opcode == Opcode::kOffload || opcode == Opcode::kReload) {
      auto& session_bytes =
          opcode == Opcode::kOffload ? counters.bytes_offloaded : counters.bytes_reloaded;
      auto& total_bytes = opcode == Opcode::kOffload ? metrics_.totals.bytes_offloaded
                                                     : metrics_.totals.bytes_reloaded;
      session_bytes.fetch_add(entry.len, std::memory_order_relaxed);
      total_bytes.fetch_add(entry.len, std::memory_order_relaxed);
      metrics_.bandwidth.Add(entry.len, MonotonicMs());
    }
  } else {
    counters.jobs_failed.fetch_add(1, std::memory_order_relaxed);
    metrics_.totals.jobs_failed.fetch_add(1, std::memory_order_relaxed);
  }
  // Progress is noted before the client can see the completion, so that a client that asks for
  // health right after its job completed never finds that job still counted as stuck.
  metrics_.last_progress_ms.store(MonotonicMs(), std::memory_order_relaxed);
  if (entry.sync == 0) metrics_.unticketed_in_flight.fetch_sub(1, std::memory_order_relaxed);
  session.PostCompletion(c);
  metrics_.jobs_in_flight.fetch_sub(1, std::memory_order_relaxed);
  session.EndJob();
}

}  // namespace tier::daemon
