#include "daemon/jobs/job_ends.h"

#include <utility>

#include "common/status.h"

namespace tier::daemon {

using ring::Opcode;

void JobEnds::Accepted(uint64_t session_id, const ring::SubmissionEntry& entry) {
  if (metrics_.jobs_in_flight.Add(session_id)) {
    // The stall clock of health starts no earlier than the work: an idle daemon has not stalled.
    metrics_.last_progress_ms.Store(session_id, MonotonicMs());
  }
  if (entry.sync == 0) metrics_.unticketed_in_flight.Add(session_id);
}

void JobEnds::Fail(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& entry,
                   absl::Status status) {
  std::shared_ptr<engine::ImportedBuffer> buffer = session->FindBuffer(entry.buffer_id);
  FailOnDevice(session, entry, std::move(status), buffer != nullptr ? buffer->device() : -1);
}

void JobEnds::FailOnDevice(const std::shared_ptr<Session>& session,
                           const ring::SubmissionEntry& entry, absl::Status status, int device) {
  auto opcode = static_cast<Opcode>(entry.opcode);
  if (entry.sync == 0 || (opcode != Opcode::kOffload && opcode != Opcode::kReload)) {
    Complete(*session, entry, status);
    return;
  }
  // The ticket goes in as a ticket-only job (no copy); the entry then fails with the original
  // error.
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

void JobEnds::Complete(Session& session, const ring::SubmissionEntry& entry,
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
