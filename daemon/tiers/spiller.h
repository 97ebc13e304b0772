// The NVMe tier's mover: keeps the host pool under its high watermark by writing the objects used
// last to the spill store (daemon/tiers/spill_policy.h), brings spilled objects back when a job needs
// them (Fetch), and prefetches the ones used soonest while the pool has room below its low
// watermark. Its thread also serves the admission queue (jobs waiting for host room): it knows
// when memory may have come free and when none can come.
//
// Victims: objects whose bytes are only in host memory, completely filled and not in use by any
// job. Every change of an object's state is a transition of its ObjectTable; the spiller holds
// objects only weakly (a freed object simply drops out of its lists).
//
// Locks: the spiller's own mutex guards its lists only; it never holds it while calling into an
// ObjectTable or the store.
#ifndef TIER_DAEMON_TIERS_SPILLER_H_
#define TIER_DAEMON_TIERS_SPILLER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "absl/status/status.h"
#include "common/mutex.h"
#include "daemon/jobs/admission_queue.h"
#include "daemon/metrics/metrics.h"
#include "daemon/tiers/object_table.h"
#include "daemon/tiers/spill_policy.h"
#include "engine/source_feed.h"
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

// What a reload reads from: a feed still filling from NVMe (with the lease that keeps its extent
// until the copy is done), or, with both null, the object's extent as it is.
struct Readable {
  std::shared_ptr<engine::SourceFeed> feed;
  std::shared_ptr<void> lease;
  storage::Extent extent;  // with a feed: the host bytes it fills
};

class Spiller {
 public:
  Spiller(storage::HostPool& pool, storage::SpillStore& store, AdmissionQueue& admission,
          SpillerOptions options);
  ~Spiller();
  Spiller(const Spiller&) = delete;
  Spiller& operator=(const Spiller&) = delete;

  void Start();
  // Stops the thread (the admission queue must be closed first), then waits for the NVMe I/O it
  // started (the store must still run).
  void Stop();

  // A filled object (in host memory) becomes a spill candidate.
  void Track(const std::shared_ptr<ObjectTable>& table, const std::shared_ptr<Object>& object);
  // The host pool got fuller (or an allocation failed): look at the watermark again.
  void Kick();
  // A wait for room began (AdmissionQueue's callback).
  void WaitBegan(bool first);

  // Brings a spilled object's bytes back into host memory for a reload that pinned it, then
  // calls `then` once: with a Readable whose feed is still filling (a read this call started:
  // the copy goes on as chunks land), or with an empty Readable once the bytes are in host memory
  // (already there, or a read that was running ended), or with the read's error. When the pool
  // has no room it waits in the admission queue (`queue`: the session), and fails
  // RESOURCE_EXHAUSTED only when no room can come. Runs `then` on the caller's thread, the
  // store's I/O thread or the spiller's.
  void Fetch(const std::shared_ptr<ObjectTable>& table, uint64_t queue,
             const std::shared_ptr<Object>& object,
             std::function<void(absl::StatusOr<Readable>)> then);

  // The executor's copies on pool memory (offload fills, reloads): while any runs, waiters are
  // not failed as stuck, since its end frees memory or makes an object spillable.
  void CopyStarted() { copies_in_flight_.fetch_add(1); }
  void CopyEnded();
  // Host memory was freed: waiters try again, and prefetching may go on.
  void NotifyFreed();
  // Gives back what a transition released (extent to the pool, record to the store).
  void Settle(const Release& release);

  // NVMe writes and reads started and not yet ended (their counters and state changes all made).
  uint64_t io_in_flight() const { return writes_in_flight_.load() + reads_in_flight_.load(); }

  SpillCounters& counters() { return counters_; }
  const SpillCounters& counters() const { return counters_; }
  storage::SpillStore& store() { return store_; }

 private:
  struct Candidate {
    std::weak_ptr<ObjectTable> table;
    std::weak_ptr<Object> object;
  };
  struct FetchLease;

  static constexpr uint64_t kMaxWritesInFlight = 64;

  void Run();
  // Until kicked, or a few ms when jobs wait for room; false once stopping.
  bool AwaitKick();
  // Until fewer than kMaxWritesInFlight writes are in flight (or stopping).
  void AwaitWriteSlot();
  // The pool as it will be once the writes in flight landed and released their extents.
  storage::PoolUsage Projected() const;
  // Takes the next candidate that may be spilled now and starts its write; false if none.
  bool SpillOne();
  // Starts prefetch reads of the spilled objects used soonest while the pool has room.
  void Prefetch();
  // Begins a read of `object` for `reader`; false: no host room (nothing started, `then` kept).
  // may_allocate false: a read that would need a new extent is not started.
  bool StartFetch(const std::shared_ptr<ObjectTable>& table, const std::shared_ptr<Object>& object,
                  ObjectTable::Reader reader,
                  std::shared_ptr<std::function<void(absl::StatusOr<Readable>)>> then,
                  bool may_allocate);
  void EndFetch(const std::shared_ptr<ObjectTable>& table, const std::shared_ptr<Object>& object,
                const storage::SpillRecord& record, bool prefetch,
                const std::shared_ptr<engine::SourceFeed>& feed, storage::Extent extent,
                absl::Status read);
  static NextUse NextUseOf(const Object& object) { return {object.hint(), object.seq()}; }

  storage::HostPool& pool_;
  storage::SpillStore& store_;
  AdmissionQueue& admission_;
  const SpillPolicy policy_;
  const uint32_t max_prefetches_;
  SpillCounters counters_;

  Mutex mu_;
  CondVar cv_;  // with mu_: kicked_ or stopping_ set
  NextUseQueue<Candidate> candidates_ ABSL_GUARDED_BY(mu_);  // in host memory: spill candidates
  NextUseQueue<Candidate> spilled_ ABSL_GUARDED_BY(mu_);     // on NVMe: prefetch candidates
  bool kicked_ ABSL_GUARDED_BY(mu_) = false;
  // In a spill episode: from above the high watermark down to the low one (the thread's; read by
  // Kick).
  std::atomic<bool> draining_{false};
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> writes_in_flight_{0};
  std::atomic<uint64_t> writing_bytes_{0};  // host extents of the writes in flight
  std::atomic<uint32_t> prefetches_in_flight_{0};
  std::atomic<uint64_t> reads_in_flight_{0};   // fetches and prefetches
  std::atomic<uint64_t> copies_in_flight_{0};  // see CopyStarted
  // With mu_: writes and reads in flight ended. Their counters are atomics (read without the lock
  // by Projected and the stall check) decremented under mu_, so a waiter cannot miss the change.
  CondVar io_done_cv_;
  const uint32_t stall_ms_;
  // Memory freed, a copy ended, a candidate came, or a first waiter arrived.
  std::atomic<uint64_t> last_change_ms_{0};
  std::thread thread_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_TIERS_SPILLER_H_
