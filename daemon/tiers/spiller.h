// The NVMe tier's policy and its thread: keeps the host pool under its high watermark by choosing
// the objects used last to be written to the spill store (daemon/tiers/spill_policy.h), and
// prefetches the ones used soonest while the pool has room below its low watermark. It moves no
// bytes itself: each write and read is a SpillWrite or SpillRead (daemon/tiers/nvme_transfers.h),
// which tell it when they ended (NvmeEvents). Its thread also serves the admission queue (jobs
// waiting for host room): it knows when memory may have come free and when none can come.
//
// Victims: objects whose bytes are only in host memory, completely filled and not in use by any
// job. Every change of an object's state is a transition of its ObjectTable; the spiller holds
// objects only weakly (a freed object simply drops out of its lists).
//
// Locks: the spiller's own mutex guards its lists only; it never holds it while calling into an
// ObjectTable or a transfer.
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
#include "daemon/tiers/nvme_transfers.h"
#include "daemon/tiers/object_table.h"
#include "daemon/tiers/spill_policy.h"
#include "storage/host_pool.h"

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

class Spiller : public NvmeEvents {
 public:
  // Listens to `transfers` (its ended writes and reads).
  Spiller(NvmeTransfers& transfers, AdmissionQueue& admission, SpillerOptions options);
  ~Spiller() override;
  Spiller(const Spiller&) = delete;
  Spiller& operator=(const Spiller&) = delete;

  void Start();
  // Stops the thread (the admission queue must be closed first). Transfers in flight go on: the
  // tiers wait for them (NvmeTransfers::AwaitIdle) while the spiller still hears of them.
  void Stop();

  // A filled object (in host memory) becomes a spill candidate.
  void Track(const std::shared_ptr<ObjectTable>& table, const std::shared_ptr<Object>& object);
  // The host pool got fuller (or an allocation failed): look at the watermark again.
  void Kick();
  // A wait for room began (AdmissionQueue's callback).
  void WaitBegan(bool first);

  // The executor's copies on pool memory (offload fills, reloads): while any runs, waiters are
  // not failed as stuck, since its end frees memory or makes an object spillable.
  void CopyStarted() { copies_in_flight_.fetch_add(1); }
  void CopyEnded();
  // Host memory was freed: waiters try again, and prefetching may go on.
  void NotifyFreed();

  // NvmeEvents: a write landed on NVMe (a prefetch candidate now), a read brought an object back
  // (a spill candidate again).
  void Spilled(const std::shared_ptr<ObjectTable>& table,
               const std::shared_ptr<Object>& object) override;
  void Fetched(const std::shared_ptr<ObjectTable>& table,
               const std::shared_ptr<Object>& object) override {
    Track(table, object);
  }

 private:
  struct Candidate {
    std::weak_ptr<ObjectTable> table;
    std::weak_ptr<Object> object;
  };
  static constexpr uint64_t kMaxWritesInFlight = 64;

  void Run();
  // Until kicked, or a few ms when jobs wait for room; false once stopping.
  bool AwaitKick();
  // The pool as it will be once the writes in flight landed and released their extents.
  storage::PoolUsage Projected() const;
  // Takes the next candidate that may be spilled now and starts its write; false if none.
  bool SpillOne();
  // Starts prefetch reads of the spilled objects used soonest while the pool has room.
  void Prefetch();
  static NextUse NextUseOf(const Object& object) { return {object.hint(), object.seq()}; }
  // After spilled_ changed: whether memory coming free may start a prefetch.
  void NoteSpilled() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    prefetchable_.store(!spilled_.empty() && max_prefetches_ > 0, std::memory_order_release);
  }

  NvmeTransfers& transfers_;
  storage::HostPool& pool_;
  AdmissionQueue& admission_;
  const SpillPolicy policy_;
  const uint32_t max_prefetches_;

  Mutex mu_;
  CondVar cv_;  // with mu_: kicked_ or stopping_ set
  NextUseQueue<Candidate> candidates_ ABSL_GUARDED_BY(mu_);  // in host memory: spill candidates
  NextUseQueue<Candidate> spilled_ ABSL_GUARDED_BY(mu_);     // on NVMe: prefetch candidates
  bool kicked_ ABSL_GUARDED_BY(mu_) = false;
  // In a spill episode: from above the high watermark down to the low one (the thread's; read by
  // Kick).
  std::atomic<bool> draining_{false};
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // !spilled_.empty() && max_prefetches_ > 0, for NotifyFreed without mu_: every job's end and
  // every free call it, from every GPU's threads (issue 26).
  std::atomic<bool> prefetchable_{false};
  std::atomic<uint32_t> prefetches_in_flight_{0};
  std::atomic<uint64_t> copies_in_flight_{0};  // see CopyStarted
  const uint32_t stall_ms_;
  // Memory freed, a copy ended, a candidate came, or a first waiter arrived.
  std::atomic<uint64_t> last_change_ms_{0};
  std::thread thread_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_TIERS_SPILLER_H_
