// One direction of one session on one GPU: its own stream, its completion word, its jobs in ticket
// order (engine/lane_jobs.h). Made when the session first registers memory on the GPU
// (engine/gpu_imports.cc), fed by Submit (engine/job_intake.cc), served by the GPU's worker
// (engine/device_worker.cc through engine/lane_runner.h). It goes, idle, when its session and its
// worker have dropped it; its stream is destroyed on the release thread.
#ifndef TIER_ENGINE_LANE_H_
#define TIER_ENGINE_LANE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "engine/copy_engine.h"
#include "engine/gpu_runtime.h"
#include "engine/lane_jobs.h"
#include "engine/lane_words.h"
#include "engine/link_meter.h"
#include "engine/pool_writes.h"
#include "engine/release_thread.h"
#include "engine/source_feed.h"

namespace tier::engine {

class DeviceWorker;

// One GPU's link, both directions.
struct LinkMeters {
  LinkMeter d2h;
  LinkMeter h2d;
  LinkMeter& of(Direction d) { return d == Direction::kToPool ? d2h : h2d; }
};

// A session's ticket page registered with the runtime (mapped, for every GPU), so that the
// lanes' streams write its done counters. Held by the session's lanes; the last one to go
// unregisters it on the release thread (cudaHostUnregister waits for the device, so the done
// writes already queued land first) and only then lets the page be unmapped (`owner`).
struct TicketPagePin {
  char* base = nullptr;
  std::shared_ptr<const void> owner;
};

inline int LaneIndex(Direction direction) { return direction == Direction::kToPool ? 0 : 1; }

struct Lane {
  Lane(GpuRuntime& runtime, HostWordPool& pool, std::shared_ptr<ReleaseThread> releaser,
       std::atomic<uint64_t>& live, DeviceWorker& worker, LinkMeter& meter, std::string label,
       uint32_t uid, int device, Direction direction, GpuStream stream, HostWordPool::Slot word);
  ~Lane();
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  uint64_t completed_addr() const { return word.device_addr + offsetof(LaneWord, completed); }
  const char* name() const { return direction == Direction::kToPool ? "D2H" : "H2D"; }
  bool busy() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !queue.empty() || !pending.empty(); }
  // For tierctl clients (CopyEngine::Lanes).
  LaneStatus Status(uint64_t now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  GpuRuntime& runtime;
  HostWordPool& pool;
  const std::shared_ptr<ReleaseThread> releaser;
  std::atomic<uint64_t>& live;
  DeviceWorker& worker;     // the GPU's worker (lives as long as the engine)
  LinkMeter& meter;         // the GPU's link in this direction (lives as long as the engine)
  const std::string label;  // the session, for logs
  const uint32_t uid;       // the session's user: a uid's lanes share one window (LinkShare)
  const int device;
  const Direction direction;
  const GpuStream stream;
  const HostWordPool::Slot word;
  std::atomic<bool> in_worker{false};  // in its worker's active list

  // Taken by Submit (the ring poller), the worker, Abandon and diagnostics. Under it: the pool
  // writes, the GPU's link meter and a job's feed (leaves). Never held while a job's callback runs.
  mutable Mutex mu ABSL_ACQUIRED_BEFORE(PoolWrites::Shard::mu, LinkMeter::mu_, SourceFeed::mu_);
  // The client's ticket counter of this lane in the session's ticket page (host memory, written
  // by the client's GPU stream, untrusted) and the done counter beside it (written by this
  // lane's stream, at done_addr as the GPU addresses it). Unset until the session bound its
  // ticket slot for this GPU (BufferKind kCudaSemaphores).
  const std::atomic<uint64_t>* ready ABSL_GUARDED_BY(mu) = nullptr;
  uint64_t done_addr ABSL_GUARDED_BY(mu) = 0;
  std::shared_ptr<TicketPagePin> ticket_pin ABSL_GUARDED_BY(mu);  // keeps done_addr registered
  uint64_t next_seq ABSL_GUARDED_BY(mu) = 1;
  uint64_t next_ticket ABSL_GUARDED_BY(mu) = 1;
  // Tickets not yet queued: a smaller ticket has not arrived, or not all jobs of the batch.
  std::map<uint64_t, HeldTicket> held ABSL_GUARDED_BY(mu);
  uint64_t held_jobs ABSL_GUARDED_BY(mu) = 0;
  std::deque<QueuedJob> queue ABSL_GUARDED_BY(mu);  // accepted in ticket order, not yet issued
  // Copies issued by this pass of the worker and not yet given to the runtime (one
  // CopyBatchAsync per run of plain copies), and the seq of the first job among them.
  std::vector<GpuRuntime::CopyOp> staged ABSL_GUARDED_BY(mu);
  uint64_t staged_from_seq ABSL_GUARDED_BY(mu) = 0;
  std::deque<PendingJob> pending ABSL_GUARDED_BY(mu);  // issued on the stream, in seq order
  // Plain copies issued and not completed (lane_window_bytes).
  uint64_t window_bytes ABSL_GUARDED_BY(mu) = 0;
  // The window this pass: lane_window_bytes while another lane of the GPU and direction had
  // work in the last kShareMemoryNs (set by the worker), else 0 (no limit).
  uint64_t window_limit ABSL_GUARDED_BY(mu) = 0;
  bool abandoned ABSL_GUARDED_BY(mu) = false;
  // Last completion, or when the first pending job was issued.
  uint64_t progress_ns ABSL_GUARDED_BY(mu) = 0;
  // When the head job began to wait for its ticket (0: not).
  uint64_t wait_since_ns ABSL_GUARDED_BY(mu) = 0;
  uint64_t client_ticket ABSL_GUARDED_BY(mu) = 0;  // the ticket counter as last read
  // What the head job waits for on the host (diagnostics).
  const char* blocked ABSL_GUARDED_BY(mu) = "";
  bool warned_wait ABSL_GUARDED_BY(mu) = false;
  bool warned_stuck ABSL_GUARDED_BY(mu) = false;
  bool warned_idle ABSL_GUARDED_BY(mu) = false;
};

// A session's two lanes on one GPU.
struct DeviceLanes {
  std::shared_ptr<Lane> lanes[2];  // [0] kToPool, [1] kFromPool
  bool slot_bound = false;         // the client bound its ticket slot for this GPU
};

}  // namespace tier::engine

#endif  // TIER_ENGINE_LANE_H_
