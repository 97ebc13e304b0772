// LaneRunner, issuing: from a lane's queue onto its stream (engine/lane_runner.h).
#include <algorithm>
#include <atomic>
#include <utility>

#include "common/log.h"
#include "engine/engine_clock.h"
#include "engine/lane_runner.h"

namespace tier::engine {

bool LaneRunner::Step(Lane& lane, uint64_t now, uint64_t window, bool* busy) {
  std::vector<FailedJob> failed;
  bool moved = false;
  {
    MutexLock lock(&lane.mu);
    lane.window_limit = window;
    if (lane.abandoned) {
      moved = !lane.queue.empty();
      CancelQueued(lane, failed);
    }
    const uint64_t first_seq = lane.next_seq;
    while (!lane.queue.empty()) {
      if (!IssueHead(lane, lane.queue.front(), now)) break;
      lane.queue.pop_front();
      moved = true;
    }
    if (lane.next_seq != first_seq) MarkCompleted(lane, first_seq, failed);
  }
  RunFailed(failed);
  moved |= Complete(lane, now);
  MutexLock lock(&lane.mu);
  *busy = lane.busy();
  return moved;
}

// The session is ending: nothing queued may wait for this client any more; what is issued
// finishes on its own.
void LaneRunner::CancelQueued(Lane& lane, std::vector<FailedJob>& failed) {
  for (QueuedJob& q : lane.queue) {
    pool_writes_.End(q.pool_write, q.job.pool);
    if (q.job.feed != nullptr) q.job.feed->Unsubscribe();
    failed.push_back({std::move(q.job.done), absl::CancelledError("session is ending")});
  }
  lane.queue.clear();
  lane.wait_since_ns = 0;
}

// Issues the lane's head job if it is ready, or as much of it as is ready (fed reloads). True if
// the job was fully issued (then the caller pops it; its `completed` write comes at the end of
// the pass, MarkCompleted). A plain copy is staged, to go to the runtime with the copies of the
// jobs after it in one call; any other stream operation, and the ticket's done write, first
// flushes what is staged, so the stream runs them in job order.
bool LaneRunner::IssueHead(Lane& lane, QueuedJob& q, uint64_t now) {
  if (q.job.sync != 0 && !TicketArrived(lane, q.job.sync, now)) return false;
  const bool copy = q.job.len > 0;
  if (copy && !DelayPassed(lane, q, now)) return false;
  if (copy && !q.started) {
    if (!OrderAfterPoolWrites(lane, q)) return false;
    q.started = true;
  }
  Issued issued;
  if (copy && q.status.ok() && !IssueCopy(lane, q, now, &issued)) return false;
  lane.blocked = "";
  SignalAndPend(lane, q, now, issued);
  return true;
}

// The client's ticket: its ticket stream raised it after the job's producers (offload) or its
// consumer's allocation point (reload). Until it is here nothing of the job goes on the GPU.
bool LaneRunner::TicketArrived(Lane& lane, uint64_t ticket, uint64_t now) {
  uint64_t seen = lane.ready->load(std::memory_order_acquire);
  lane.client_ticket = seen;
  if (seen < ticket) {
    lane.blocked = "the client's ticket";
    if (lane.wait_since_ns == 0) lane.wait_since_ns = now;
    if (!lane.warned_wait &&
        now - lane.wait_since_ns > uint64_t{options_.lane_wait_warn_ms} * 1000000) {
      lane.warned_wait = true;
      LogWarning(lane.label, ": GPU ", lane.device, " ", lane.name(), " lane has waited ",
                 (now - lane.wait_since_ns) / 1000000, " ms for the client's ticket ", ticket,
                 " (the client has reported tickets up to ", seen, "; ", lane.queue.size(),
                 " jobs queued behind it): the client's ",
                 lane.direction == Direction::kToPool ? "producer" : "consumer",
                 " stream has not reached the job's point yet, or the client stopped");
    }
    return false;
  }
  if (lane.wait_since_ns != 0 && lane.warned_wait) {
    LogInfo(lane.label, ": GPU ", lane.device, " ", lane.name(), " lane: ticket ", ticket,
            " arrived after ", (now - lane.wait_since_ns) / 1000000, " ms");
  }
  lane.wait_since_ns = 0;
  lane.warned_wait = false;
  return true;
}

// Delay injection: the copy is issued copy_delay_us after its ticket arrived, late relative to
// the client's producer/consumer work, whatever the host did meanwhile.
bool LaneRunner::DelayPassed(Lane& lane, QueuedJob& q, uint64_t now) {
  if (options_.copy_delay_us == 0) return true;
  if (q.eligible_ns == 0) q.eligible_ns = now;
  if (now - q.eligible_ns < options_.copy_delay_us * 1000) {
    lane.blocked = "delay injection";
    return false;
  }
  return true;
}

// A reload may read pool bytes an offload is still writing (the daemon submits the reload of an
// object right after its offload): issue it only after those copies are issued, and order it
// after them on the GPU.
bool LaneRunner::OrderAfterPoolWrites(Lane& lane, QueuedJob& q) {
  if (q.job.direction != Direction::kFromPool) return true;
  std::vector<PoolWrites::Write> writes;
  if (!pool_writes_.Overlapping(q.job.pool, q.job.len, q.writes_before, &writes)) {
    lane.blocked = "an offload into the same pool bytes to be issued";
    return false;
  }
  if (!writes.empty()) (void)FlushStaged(lane);
  for (const PoolWrites::Write& w : writes) {
    if (q.status.ok()) q.status = runtime_.WaitValue64(lane.stream, w.completed_addr, w.seq);
    q.gpu_waits.push_back(GpuWait{w.completed_host, w.seq});
  }
  return true;
}

// The job's copy: a fed reload's chunks as they land, a host-to-host copy, or a plain copy
// (whole, or its chunks as the lane's window lets them go; the last or only piece is staged and
// becomes the job's pending entry). False: not all of it could go yet.
bool LaneRunner::IssueCopy(Lane& lane, QueuedJob& q, uint64_t now, Issued* issued) {
  CopyJob& job = q.job;
  if (q.progress != nullptr) return IssueFedChunks(lane, q);
  if (q.host) {
    (void)FlushStaged(lane);
    q.status = Copy(lane.stream, job.direction, q.host, job.client, job.pool, job.len);
    return true;
  }
  if (!IssueChunks(lane, q, now)) return false;
  const uint64_t rest = job.len - q.issued_bytes;
  if (lane.staged.empty()) lane.staged_from_seq = lane.next_seq;
  lane.staged.push_back(
      GpuRuntime::CopyOp{job.client + q.issued_bytes, job.pool + q.issued_bytes, rest});
  lane.window_bytes += rest;
  issued->window = rest;
  issued->staged = true;
  return true;
}

// Fed: chunk i goes once the feed has it in place (all of them once it ended; the bytes it could
// not deliver are zeroed first). The lane's later jobs wait behind this one.
bool LaneRunner::IssueFedChunks(Lane& lane, QueuedJob& q) {
  CopyJob& job = q.job;
  (void)FlushStaged(lane);
  const uint64_t chunk = job.feed->chunk_bytes();
  const uint64_t chunks = job.feed->chunks();
  uint64_t ready = std::min(q.progress->ready_chunks.load(), chunks);
  while (q.chunks_issued < ready && q.status.ok()) {
    uint64_t off = q.chunks_issued * chunk;
    uint64_t n = std::min(chunk, job.len - off);
    q.status = Copy(lane.stream, job.direction, q.host, job.client + off, job.pool + off, n);
    ++q.chunks_issued;
  }
  if (q.status.ok() && q.chunks_issued < chunks) {
    lane.blocked = "NVMe chunks";
    return false;
  }
  return true;
}

// A plain copy under the lane's window (GpuEngineOptions::lane_window_bytes): stages every chunk
// but the last that fits, each its own pending entry; true once the rest (the last chunk, or the
// whole copy) may be staged too. False: the window is full; the job stays at the head, and the
// lane's completions open the window again.
bool LaneRunner::IssueChunks(Lane& lane, QueuedJob& q, uint64_t now) {
  const uint64_t window = lane.window_limit;
  const CopyJob& job = q.job;
  if (window == 0) return true;
  const uint64_t chunk = std::max<uint64_t>(window / 4, 1);
  // An empty window always takes the next piece, so a lane alone is never held back by it.
  auto fits = [&](uint64_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu) {
    return lane.window_bytes == 0 || lane.window_bytes + n <= window;
  };
  while (job.len - q.issued_bytes > chunk) {
    if (!fits(chunk)) {
      lane.blocked = "its window of the GPU link";
      return false;
    }
    if (lane.staged.empty()) lane.staged_from_seq = lane.next_seq;
    lane.staged.push_back(
        GpuRuntime::CopyOp{job.client + q.issued_bytes, job.pool + q.issued_bytes, chunk});
    lane.pending.push_back(PendingJob{lane.next_seq++, nullptr, absl::OkStatus(), 0, nullptr,
                                      nullptr, {}, now, chunk});
    lane.meter.Issued(now, chunk);
    lane.window_bytes += chunk;
    q.issued_bytes += chunk;
    if (lane.pending.size() == 1) lane.progress_ns = now;
    if (absl::Status s = MarkPiece(lane); !s.ok() && q.status.ok()) q.status = s;
  }
  if (!fits(job.len - q.issued_bytes)) {
    lane.blocked = "its window of the GPU link";
    return false;
  }
  return true;
}

// The job is on the stream: its pool write is issued, its ticket signalled (if it is the last
// job of its ticket), and it waits in `pending` for the lane's completion word. Whatever failed
// before, the ticket is still signalled: the client's streams wait on it and must not hang. The
// failure reaches the client through the job's completion.
void LaneRunner::SignalAndPend(Lane& lane, QueuedJob& q, uint64_t now, const Issued& issued) {
  CopyJob& job = q.job;
  const uint64_t seq = lane.next_seq;  // after any chunks: the seq of the job's last piece
  if (q.pool_write != 0 && q.status.ok()) {
    pool_writes_.Issued(q.pool_write, job.pool, lane.completed_addr(), &lane.word.host->completed,
                        seq);
  }
  absl::Status signal;
  if (job.sync != 0 && q.signal) {  // a batch signals once, after its last job's copy
    FlushFor(lane, q, issued.staged);
    signal = runtime_.WriteValue64(lane.stream, lane.done_addr, job.sync);
  }
  ++lane.next_seq;
  absl::Status status = q.status.ok() ? signal : q.status;
  if (lane.pending.empty()) lane.progress_ns = now;  // the watchdog counts from here
  lane.pending.push_back(PendingJob{seq, std::move(job.done), std::move(status), q.pool_write,
                                    job.pool, std::move(job.feed), std::move(q.gpu_waits), now,
                                    issued.window});
  lane.meter.Issued(now, issued.window);
  if (issued.window != 0 && lane.window_limit != 0) {
    if (absl::Status s = MarkPiece(lane); !s.ok() && lane.pending.back().status.ok()) {
      lane.pending.back().status = s;
    }
  }
}

// Under a window, each piece (chunk or job) completes on its own: its copy goes to the runtime
// and `completed` is written after it, so the window reopens as pieces land instead of once the
// whole pass's copies are done (which would drain the stream before the next piece). A failure
// goes to the job (the caller); the pass's own completion write still completes its pieces.
absl::Status LaneRunner::MarkPiece(Lane& lane) {
  absl::Status s = FlushStaged(lane);
  if (!s.ok()) return s;
  return runtime_.WriteValue64(lane.stream, lane.completed_addr(), lane.next_seq - 1);
}

// Gives the staged copies to the runtime in one call. A failure fails every job among them.
absl::Status LaneRunner::FlushStaged(Lane& lane) {
  if (lane.staged.empty()) return absl::OkStatus();
  absl::Status s = runtime_.CopyBatchAsync(lane.stream, lane.direction, lane.staged);
  lane.staged.clear();
  if (!s.ok()) {
    for (PendingJob& p : lane.pending) {
      if (p.seq >= lane.staged_from_seq && p.status.ok()) p.status = s;
    }
    // Chunks have no completion of their own: their job, still at the head, reports it.
    if (!lane.queue.empty() && lane.queue.front().issued_bytes > 0 &&
        lane.queue.front().status.ok()) {
      lane.queue.front().status = s;
    }
  }
  return s;
}

// FlushStaged for the head job `q`: a failure is its own too when its copy was among the staged.
void LaneRunner::FlushFor(Lane& lane, QueuedJob& q, bool staged) {
  absl::Status flushed = FlushStaged(lane);
  if (!flushed.ok() && staged && q.status.ok()) q.status = flushed;
}

// The end of a pass that issued jobs first_seq and up: flushes staged copies and writes the
// lane's `completed` word once, for the last of them. If that write cannot be queued, the jobs
// of the pass would never complete: they fail now.
void LaneRunner::MarkCompleted(Lane& lane, uint64_t first_seq, std::vector<FailedJob>& failed) {
  (void)FlushStaged(lane);  // a failure is recorded on the jobs it concerns
  absl::Status mark = runtime_.WriteValue64(lane.stream, lane.completed_addr(), lane.next_seq - 1);
  if (mark.ok()) return;
  while (!lane.pending.empty() && lane.pending.back().seq >= first_seq) {
    PendingJob& p = lane.pending.back();
    pool_writes_.End(p.pool_write, p.pool);
    if (p.feed != nullptr) p.feed->Unsubscribe();
    lane.window_bytes -= p.window_bytes;
    lane.meter.Completed(NowNs(), p.window_bytes);  // never ran: keeps the meter's count right
    if (p.done) {
      failed.push_back({std::move(p.done), p.status.ok() ? mark : std::move(p.status)});
    } else if (!lane.queue.empty() && lane.queue.front().status.ok()) {
      lane.queue.front().status = mark;  // a chunk of the head job
    }
    lane.pending.pop_back();
  }
}

absl::Status LaneRunner::Copy(GpuStream stream, Direction direction, bool host, char* client,
                              char* pool, uint64_t len) {
  if (!host) return runtime_.CopyAsync(stream, direction, client, pool, len);
  return direction == Direction::kToPool ? runtime_.HostCopyAsync(stream, pool, client, len)
                                         : runtime_.HostCopyAsync(stream, client, pool, len);
}

}  // namespace tier::engine
