// Moves objects between the host tier and the NVMe tier by the placement policy
// (daemon/spill_policy.h): keeps the host pool under its high watermark by writing the objects
// used last to the spill store, brings spilled objects back when a job needs them, and prefetches
// the ones used soonest while the pool has room below its low watermark.
//
// Victims: objects whose bytes are only in host memory, completely filled and not in use by any
// job. Spilling and prefetching are decided on the spiller's thread; the I/O runs on the store's.
//
// An object is pinned (Object::pins) while a write or prefetch read runs, so neither a free nor a
// session's end releases its memory under the I/O; when the write lands, the host extent is
// released only if nothing else pinned the object meanwhile (a reload that arrived during the
// write keeps the host copy, and the record is dropped).
//
// Locks: the spiller's own mutex guards its queues only; it never holds it while taking a
// session's mutex, and it never calls into the store while holding a session's mutex, except
// SpillStore::Free (which takes only the store's own lock).
#ifndef TIER_DAEMON_SPILLER_H_
#define TIER_DAEMON_SPILLER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "daemon/metrics.h"
#include "daemon/session.h"
#include "daemon/spill_policy.h"
#include "gpu/source_feed.h"
#include "storage/host_pool.h"
#include "storage/spill_store.h"

namespace tier::daemon {

struct SpillerOptions {
  Watermarks watermarks;
  // Prefetch reads in flight at most (0: no prefetching).
  uint32_t max_prefetches = 2;
  // Waiting jobs give up when nothing can be spilled and, although copies are in flight, nothing
  // changed for this long since the first of them began to wait: those copies may themselves
  // wait on the waiters (a GPU lane holds a later ticket until the earlier one, which may be a
  // waiting reload, arrives).
  uint32_t stall_ms = 5000;
};

struct SpillCounters {
  std::atomic<uint64_t> bytes_spilled{0};
  std::atomic<uint64_t> bytes_fetched{0};  // NVMe -> host, prefetches included
  std::atomic<uint64_t> spills{0};
  std::atomic<uint64_t> fetches{0};
  std::atomic<uint64_t> prefetches{0};        // fetches started by the policy, not by a reload
  std::atomic<uint64_t> bytes_prefetched{0};
  std::atomic<uint64_t> prefetch_hits{0};     // reloads that found a prefetched object in memory
  std::atomic<uint64_t> prefetch_misses{0};   // reloads that had to wait for NVMe
  // I/O errors and checksum failures are counted by the store (SpillFileUsage), which tells them
  // apart (both reach the client as DATA_LOSS).
  BandwidthMeter spill_bandwidth;
  BandwidthMeter fetch_bandwidth;
};

class Spiller {
 public:
  Spiller(storage::HostPool& pool, storage::SpillStore& store, SpillerOptions options);
  ~Spiller();
  Spiller(const Spiller&) = delete;
  Spiller& operator=(const Spiller&) = delete;

  void Start();
  // Stops the thread, then waits for the NVMe I/O it started (the store must still run).
  void Stop();

  // A filled object (Where kHost) becomes a spill candidate.
  void Track(const std::shared_ptr<Session>& session, const std::shared_ptr<Object>& object);
  // The host pool got fuller (or an allocation failed): look at the watermark again.
  void Kick();

  // Brings a spilled object's bytes back into host memory and then runs `then` (on the store's
  // I/O thread, or at once on error). The caller has pinned the object and holds no lock.
  // Concurrent calls for one object share one read. When the host pool has no room, waits like
  // an offload (WaitForRoom) and fails RESOURCE_EXHAUSTED only when no room can come.
  //
  // Pipelined (a reload): when this call starts a new read, it does not call `then`; it calls
  // `pipelined(feed, lease)` at once instead, and the caller submits its copy with that feed
  // (CopyJob::feed), which then carries the read's result, and keeps `lease` until that copy is
  // done (the extent the read fills must outlive both). When the object is already in host
  // memory or being read, `then` runs as above.
  using Pipelined =
      std::function<void(std::shared_ptr<gpu::SourceFeed> feed, std::shared_ptr<void> lease)>;
  void Fetch(const std::shared_ptr<Session>& session, const std::shared_ptr<Object>& object,
             std::function<void(absl::Status)> then, Pipelined pipelined = nullptr);

  // A reload accepted for `object`: counts a prefetch hit or miss. Caller holds session.mu().
  void NoteReloadLocked(Object& object);

  // Backpressure: a job found the host pool full. Waiting jobs queue per `queue` (the session):
  // within a queue strictly in arrival order, each time host memory may have been freed
  // `try_now` runs (no locks held) for its first waiter; true: it got its room and is done;
  // false: it stays first and those behind it keep waiting. (A later job of a session taking the
  // room first could hold memory an earlier one needs; on a GPU lane, which is per session, a
  // later ticket cannot even run before an earlier one, so that would be a deadlock.) Queues are
  // served in turn, one waiter each per round, so one session's waiters (say, large offloads
  // that wait long) cannot starve another's.
  // `give_up` runs instead when no room can come: nothing left to spill (everything is pinned or
  // the NVMe tier is full) and nothing in flight that could free memory (or nothing changed for
  // stall_ms). Then only one waiter gives up, the one waiting longest of those that found no
  // room, and the others are looked at again; their turn to give up comes one round later if
  // still nothing changes. One of the two ends the wait, exactly once.
  void WaitForRoom(uint64_t queue, std::function<bool()> try_now, std::function<void()> give_up);
  // Jobs are waiting for room: a new job needing room queues behind them.
  bool HasWaiters();
  // The executor's copies on pool memory (offload fills, reloads): while any runs, a parked
  // offload is not failed as stuck, since its end frees memory or makes an object spillable.
  void CopyStarted() { copies_in_flight_.fetch_add(1); }
  void CopyEnded();

  // Host memory was freed: parked offloads try again, and prefetching may go on.
  void NotifyFreed();

  const SpillCounters& counters() const { return counters_; }
  storage::SpillStore& store() { return store_; }

 private:
  struct Candidate {
    std::weak_ptr<Session> session;
    std::weak_ptr<Object> object;
  };

  void Run();
  // The pool as it will be once the writes in flight landed and released their extents.
  storage::PoolUsage Projected() const;
  // Takes the next candidate that may be spilled now and starts its write; false if none.
  bool SpillOne();
  // Starts prefetch reads of the spilled objects used soonest while the pool has room.
  void Prefetch();
  enum class FetchKind { kReload, kPipelined, kPrefetch };
  struct FetchLease;
  // Starts reading `object` (Where kNvme, pinned by the caller) into a new host extent, unless a
  // read already runs (then `then` joins it). false: no host room (nothing was started and
  // `then` was not called). Caller holds no lock.
  // may_allocate false: a read that would need a new extent is not started (false returned).
  bool StartFetch(const std::shared_ptr<Session>& session, const std::shared_ptr<Object>& object,
                  FetchKind kind, std::function<void(absl::Status)>& then,
                  const Pipelined& pipelined, bool may_allocate = true);
  void EndFetch(const std::shared_ptr<Session>& session, const std::shared_ptr<Object>& object,
                const storage::SpillRecord& record, bool prefetch,
                const std::shared_ptr<gpu::SourceFeed>& feed, absl::Status read);
  // kTry: serves the queues' first waiters in turn while they find room. kStuck: the same, and
  // if none found room, the oldest of them gives up. kStop: all give up.
  enum class Serve { kTry, kStuck, kStop };
  void ServeWaiters(Serve mode);
  // The queues in serving order: from the first at or after next_queue_, wrapping around.
  std::vector<uint64_t> QueueOrderLocked() const;
  static NextUse NextUseOf(const Object& object) { return {object.hint, object.seq}; }

  storage::HostPool& pool_;
  storage::SpillStore& store_;
  const SpillPolicy policy_;
  const uint32_t max_prefetches_;
  SpillCounters counters_;

  std::mutex mu_;
  std::condition_variable cv_;
  NextUseQueue<Candidate> candidates_;  // in host memory: spill candidates
  NextUseQueue<Candidate> spilled_;     // on NVMe: prefetch candidates
  bool kicked_ = false;
  struct Waiter {
    uint64_t seq = 0;  // arrival order over all queues
    std::function<bool()> try_now;
    std::function<void()> give_up;
  };
  // Jobs waiting for room: per queue (session), in arrival order. A waiter being tried is out of
  // its queue but still counted in waiters_.
  std::map<uint64_t, std::deque<Waiter>> waiting_;
  size_t waiters_ = 0;
  uint64_t next_waiter_seq_ = 0;
  uint64_t next_queue_ = 0;  // the queue served first in the next round
  // Set with the first waiter, cleared once the last got room or gave up (not while one is being
  // tried): HasWaiters on the offload path without the lock.
  std::atomic<bool> has_waiters_{false};
  // In a spill episode: from above the high watermark down to the low one (the thread's; read by
  // Kick).
  std::atomic<bool> draining_{false};
  bool stopping_ = false;
  std::atomic<uint64_t> writes_in_flight_{0};
  std::atomic<uint64_t> writing_bytes_{0};  // host extents of the writes in flight
  std::atomic<uint32_t> prefetches_in_flight_{0};
  std::atomic<uint64_t> reads_in_flight_{0};   // fetches and prefetches
  std::atomic<uint64_t> copies_in_flight_{0};  // see CopyStarted
  const uint32_t stall_ms_;
  // Memory freed, a copy ended, a candidate came, or a first waiter arrived.
  std::atomic<uint64_t> last_change_ms_{0};
  std::thread thread_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_SPILLER_H_
