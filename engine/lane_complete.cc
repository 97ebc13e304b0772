// LaneRunner, completing: from a lane's completion word to the jobs' callbacks
// (engine/lane_runner.h).
#include <string>
#include <utility>

#include "common/log.h"
#include "engine/lane_runner.h"
#include "engine/lane_words.h"

namespace tier::engine {
namespace {

// Moves the pending jobs up to seq `upto` to *out; they give back their share of the window.
void TakePending(Lane& lane, uint64_t upto, uint64_t now, std::vector<PendingJob>* out)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu) {
  while (!lane.pending.empty() && lane.pending.front().seq <= upto) {
    lane.window_bytes -= lane.pending.front().window_bytes;
    lane.meter.Completed(now, lane.pending.front().window_bytes);
    out->push_back(std::move(lane.pending.front()));
    lane.pending.pop_front();
  }
}

}  // namespace

// Completes the lane's finished jobs; true if any.
bool LaneRunner::Complete(Lane& lane, uint64_t now) {
  const uint64_t completed = LoadWord(lane.word.host->completed);
  std::vector<PendingJob> finished;
  std::vector<PendingJob> broken;
  absl::Status broken_status;
  bool check_stream = false;
  uint64_t issued = 0;
  {
    MutexLock lock(&lane.mu);
    TakePending(lane, completed, now, &finished);
    if (!finished.empty() || lane.pending.empty()) {
      lane.progress_ns = now;
    } else if (now - lane.progress_ns > uint64_t{options_.watchdog_ms} * 1000000) {
      check_stream = true;
      issued = lane.next_seq - 1;
      lane.progress_ns = now;
    }
  }
  // Issued copies made no progress for a while: usually a long copy (nothing wrong), but a
  // failed stream never writes `completed`, so ask the runtime.
  if (check_stream) broken_status = QueryStream(lane, now, issued, &finished, &broken);
  Settle(finished, broken, broken_status);
  return !finished.empty() || !broken.empty();
}

absl::Status LaneRunner::QueryStream(Lane& lane, uint64_t now, uint64_t issued,
                                     std::vector<PendingJob>* finished,
                                     std::vector<PendingJob>* broken) {
  absl::StatusOr<bool> done = runtime_.StreamDone(lane.device, lane.stream);
  MutexLock lock(&lane.mu);
  if (done.ok() && !*done) {
    WarnStuck(lane, now);
    return absl::OkStatus();
  }
  if (done.ok() && LoadWord(lane.word.host->completed) < issued && !lane.warned_idle) {
    lane.warned_idle = true;
    LogError(runtime_.name(), " engine: GPU ", lane.device,
             " stream idle but its completion word did not move; completing by stream query "
             "(slow path)");
  }
  TakePending(lane, issued, now, done.ok() ? finished : broken);
  if (done.ok()) return absl::OkStatus();
  if (!lane.queue.empty() && lane.queue.front().issued_bytes > 0 &&
      lane.queue.front().status.ok()) {
    lane.queue.front().status = done.status();  // its chunks ran on the failed stream
  }
  return done.status();
}

// The stream is still running the lane's oldest job: log once if that is taking too long.
void LaneRunner::WarnStuck(Lane& lane, uint64_t now) {
  if (lane.pending.empty() || lane.warned_stuck ||
      now - lane.pending.front().issued_ns <= uint64_t{options_.lane_wait_warn_ms} * 1000000) {
    return;
  }
  lane.warned_stuck = true;
  const PendingJob& oldest = lane.pending.front();
  std::string waits = DescribeGpuWaits(oldest);
  LogError(lane.label, ": GPU ", lane.device, " ", lane.name(), " lane: job seq ", oldest.seq,
           " issued ", (now - oldest.issued_ns) / 1000000,
           " ms ago has not completed (completion word at ", LoadWord(lane.word.host->completed),
           ", ", lane.pending.size(), " in flight); GPU waits not met: ",
           waits.empty() ? "none" : waits);
}

// Runs the callbacks of the jobs taken off the lane (no lock held): a fed job fails with its
// feed's error, a job of a failed stream with the stream's.
void LaneRunner::Settle(std::vector<PendingJob>& finished, std::vector<PendingJob>& broken,
                        const absl::Status& broken_status) {
  for (PendingJob& p : finished) {
    if (p.feed != nullptr) {
      p.feed->Unsubscribe();
      if (absl::Status fed = p.feed->status(); !fed.ok() && p.status.ok()) p.status = fed;
    }
    pool_writes_.End(p.pool_write, p.pool);
    if (p.done) std::move(p.done)(std::move(p.status));
  }
  for (PendingJob& p : broken) {
    if (p.feed != nullptr) p.feed->Unsubscribe();
    pool_writes_.End(p.pool_write, p.pool);
    if (p.done) std::move(p.done)(broken_status);
  }
}

}  // namespace tier::engine
