// The records of a lane's jobs (engine/lane.h keeps them), from acceptance to completion:
//   HeldTicket   accepted, waiting for a smaller ticket or for the rest of its batch
//   QueuedJob    in ticket order, not yet (fully) issued
//   PendingJob   issued on the lane's stream, waiting for the lane's completion word
// and FailedJob: a callback to run with its error once no lock is held (RunFailed).
#ifndef TIER_ENGINE_LANE_JOBS_H_
#define TIER_ENGINE_LANE_JOBS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "engine/copy_engine.h"
#include "engine/pool_writes.h"
#include "engine/source_feed.h"

namespace tier::engine {

// A fed reload's progress: chunks in place in the pool, raised by the feed's callback (on the
// spill I/O path) and read by the worker.
struct FeedProgress {
  std::atomic<uint64_t> ready_chunks{0};
};

// A GPU-side wait a job was issued behind: the writer lane's completion word reaching `seq`.
struct GpuWait {
  const uint64_t* word = nullptr;  // host view of the word
  uint64_t seq = 0;
};

// A job accepted on its lane, in ticket order, not yet (fully) issued.
struct QueuedJob {
  CopyJob job;
  bool host = false;             // host-to-host: copied by the runtime's host-function thread
  uint64_t pool_write = 0;       // kToPool: id of its entry in the engine's pool writes
  PoolWrites::Before writes_before;  // kFromPool: the pool writes registered before it
  std::vector<GpuWait> gpu_waits;  // kFromPool: the pool writes it was ordered after
  uint64_t eligible_ns = 0;      // delay injection: when its ticket was first seen
  bool started = false;          // fed: its first chunk (and the pool waits) are issued
  uint64_t chunks_issued = 0;    // fed
  std::shared_ptr<FeedProgress> progress;  // fed
  uint64_t issued_bytes = 0;     // a plain copy issued in chunks (the lane's window): so far
  absl::Status status;           // a failure while issuing, reported at completion
  bool signal = true;            // writes done = sync after its copy (the last job of its ticket)
};

// The jobs of one ticket on a lane, until all of them arrived and every smaller ticket is queued.
struct HeldTicket {
  uint32_t expected = 1;  // the batch's size, as its first job said
  std::vector<QueuedJob> jobs;
};

// A job issued on the stream, waiting for its `completed` write; or a chunk of a job still being
// issued (no `done`: the job completes with its last chunk).
struct PendingJob {
  uint64_t seq = 0;
  absl::AnyInvocable<void(absl::Status) &&> done;
  absl::Status status;
  uint64_t pool_write = 0;  // kToPool: its entry in the engine's pool writes (0: none)
  char* pool = nullptr;
  std::shared_ptr<SourceFeed> feed;
  std::vector<GpuWait> gpu_waits;  // for diagnostics
  uint64_t issued_ns = 0;
  uint64_t window_bytes = 0;  // of the lane's window it holds until completed
};

// The GPU-side waits of a job not yet done, as "pool write seq S (word at V)"; "" for none.
std::string DescribeGpuWaits(const PendingJob& p);

struct FailedJob {
  absl::AnyInvocable<void(absl::Status) &&> done;
  absl::Status status;
};

// Runs the callbacks and empties `failed`. Call it with no lock held.
void RunFailed(std::vector<FailedJob>& failed);

}  // namespace tier::engine

#endif  // TIER_ENGINE_LANE_JOBS_H_
