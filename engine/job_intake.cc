#include "engine/job_intake.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/device_worker.h"
#include "gpu/ticket_protocol.h"

namespace tier::engine {

using gpu::kMaxTicket;

void JobIntake::Submit(SessionState& state, CopyJob job) {
  if (state.abandoned.load()) {
    std::move(job.done)(absl::CancelledError("session is ending"));
    return;
  }
  bool host = false;
  absl::StatusOr<int> device = RouteDevice(state, job, &host);
  if (!device.ok()) {
    std::move(job.done)(device.status());
    return;
  }
  if (job.sync >= kMaxTicket) {
    std::move(job.done)(
        absl::InvalidArgumentError(absl::StrCat("ticket ", job.sync, " is out of range")));
    return;
  }
  std::shared_ptr<Lane> found = state.FindLane(*device, job.direction);
  if (found == nullptr) {
    std::move(job.done)(absl::FailedPreconditionError(
        absl::StrCat("the session registered no memory on GPU ", *device)));
    return;
  }
  Lane& lane = *found;
  std::vector<FailedJob> failed;
  {
    MutexLock lock(&lane.mu);
    Enqueue(lane, std::move(job), host, *device, failed);
  }
  RunFailed(failed);
  lane.worker.Wake(found);
}

absl::StatusOr<int> JobIntake::RouteDevice(SessionState& state, const CopyJob& job, bool* host) {
  int device = job.device;
  if (job.client != nullptr) {
    int found = state.FindDevice(job.client, job.len, host);
    if (device < 0) device = found;
  } else if (device < 0) {
    device = state.OnlySemaphoreDevice();
  }
  if (device >= 0) return device;
  return absl::InvalidArgumentError(
      job.client != nullptr
          ? "job memory lies in no GPU buffer of this session"
          : "ticket-only job names no GPU and the session has not bound exactly one ticket slot");
}

void JobIntake::Enqueue(Lane& lane, CopyJob job, bool host, int device,
                        std::vector<FailedJob>& failed) {
  if (lane.abandoned) {
    failed.push_back({std::move(job.done), absl::CancelledError("session is ending")});
  } else if (job.sync == 0) {
    lane.queue.push_back(Accept(lane, std::move(job), host));
  } else if (lane.ready == nullptr) {
    failed.push_back({std::move(job.done),
                      absl::FailedPreconditionError(absl::StrCat(
                          "job carries ticket ", job.sync, " but the session bound no "
                          "ticket slot for GPU ", device))});
  } else {
    Hold(lane, std::move(job), host, failed);
  }
}

// Held on the host until every smaller ticket and every job of this one arrived (the daemon may
// hold a job back, e.g. a reload of a spilled object): issuing it earlier would signal done = sync
// while another job up to that ticket has not copied.
void JobIntake::Hold(Lane& lane, CopyJob job, bool host, std::vector<FailedJob>& failed) {
  HeldTicket* held = nullptr;
  if (job.sync >= lane.next_ticket) {
    auto [it, fresh] = lane.held.try_emplace(job.sync);
    if (fresh) it->second.expected = std::max<uint32_t>(job.batch_size, 1);
    held = &it->second;
  }
  if (held == nullptr || held->jobs.size() >= held->expected) {
    failed.push_back({std::move(job.done),
                      absl::InvalidArgumentError(absl::StrCat(
                          "ticket ", job.sync, " was already used on this GPU and direction",
                          held == nullptr ? "" : absl::StrCat(" by the ", held->expected,
                                                              " jobs of its batch")))});
    return;
  }
  held->jobs.push_back(Accept(lane, std::move(job), host));
  ++lane.held_jobs;
  QueueArrived(lane);
}

// Moves the tickets that are complete and next in order from `held` to the queue; the last job of
// each ticket signals it.
void JobIntake::QueueArrived(Lane& lane) {
  while (!lane.held.empty()) {
    auto it = lane.held.begin();
    if (it->first != lane.next_ticket || it->second.jobs.size() < it->second.expected) return;
    std::vector<QueuedJob>& jobs = it->second.jobs;
    for (size_t i = 0; i < jobs.size(); ++i) {
      jobs[i].signal = i + 1 == jobs.size();
      lane.queue.push_back(std::move(jobs[i]));
    }
    lane.held_jobs -= jobs.size();
    lane.held.erase(it);
    ++lane.next_ticket;
  }
}

// A job accepted on its lane (queued or held), in the order the daemon submitted it: its place
// among the pool writes is fixed now, so a reload submitted after an offload into the same pool
// bytes is ordered after it even while either waits for a smaller ticket.
QueuedJob JobIntake::Accept(Lane& lane, CopyJob job, bool host) {
  QueuedJob q;
  q.host = host;
  if (job.direction == Direction::kToPool && job.len > 0) {
    q.pool_write = pool_writes_.Add(job.pool, job.len);
  } else if (job.direction == Direction::kFromPool) {
    q.writes_before = pool_writes_.Newest(job.pool, job.len);
  }
  if (job.feed != nullptr && job.direction == Direction::kFromPool && job.len > 0) {
    auto progress = std::make_shared<FeedProgress>();
    const uint64_t chunks = job.feed->chunks();
    SourceFeed* raw = job.feed.get();
    DeviceWorker* worker = &lane.worker;
    // Subscribed now, so that no chunk is missed; the worker issues each chunk as it lands.
    // (Runs on the spill I/O path, under the feed's lock: no lock taken, no runtime call.)
    job.feed->Subscribe([progress, chunks, raw, worker](uint64_t ready, bool ended,
                                                        const absl::Status&) {
      progress->ready_chunks.store(ended ? chunks : raw->ChunksIn(ready));
      worker->Poke();
    });
    q.progress = std::move(progress);
  }
  q.job = std::move(job);
  return q;
}

void JobIntake::Abandon(SessionState& state) {
  if (state.abandoned.exchange(true)) return;
  std::vector<FailedJob> failed;
  std::vector<std::shared_ptr<Lane>> lanes = state.AllLanes();
  for (auto& lane : lanes) {
    MutexLock lock(&lane->mu);
    lane->abandoned = true;  // the worker cancels what is queued; it reads no ticket any more
    for (auto& [ticket, held] : lane->held) {
      for (QueuedJob& q : held.jobs) {
        pool_writes_.End(q.pool_write, q.job.pool);
        if (q.job.feed != nullptr) q.job.feed->Unsubscribe();
        failed.push_back({std::move(q.job.done),
                          absl::CancelledError(absl::StrCat(
                              "session ended while ticket ", ticket, " waited for ticket ",
                              lane->next_ticket, " (", held.jobs.size(), " of its ",
                              held.expected, " jobs arrived)"))});
      }
    }
    lane->held.clear();
    lane->held_jobs = 0;
  }
  RunFailed(failed);
  for (auto& lane : lanes) lane->worker.Wake(lane);
}

}  // namespace tier::engine
