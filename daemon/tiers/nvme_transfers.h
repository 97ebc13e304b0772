// The NVMe tier's mechanism: every transfer between the host pool and the spill store is one
// object that owns it from start to end (daemon/tiers/spill_write.h, daemon/tiers/spill_read.h);
// this class is what they share: the pool, the store, the counters, and the count of transfers in
// flight, so that the policy (daemon/tiers/spiller.h) can see what is under way and Stop can wait
// until every transfer has ended. It decides nothing.
//
// Locks: mu_ guards nothing but the in-flight counts' changes and their condition variable; it is
// a leaf (no other lock is taken under it).
#ifndef TIER_DAEMON_TIERS_NVME_TRANSFERS_H_
#define TIER_DAEMON_TIERS_NVME_TRANSFERS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>

#include "common/mutex.h"
#include "daemon/metrics/metrics.h"
#include "daemon/tiers/object_table.h"
#include "storage/host_pool.h"
#include "storage/spill_store.h"

namespace tier::daemon {

// The NVMe tier's traffic, one list of counts for both forms: counted as it happens
// (SpillCounters) and as one read of them sees it (SpillTraffic: the metrics, tierctl status).
template <typename Count>
struct SpillCounts {
  Count bytes_spilled{};
  Count bytes_fetched{};  // NVMe -> host, prefetches included
  Count spills{};
  Count fetches{};
  Count prefetches{};        // fetches started by the policy, not by a reload
  Count bytes_prefetched{};
  Count prefetch_hits{};     // reloads that found a prefetched object in memory
  Count prefetch_misses{};   // reloads that had to wait for NVMe
};
using SpillTraffic = SpillCounts<uint64_t>;

struct SpillCounters : SpillCounts<std::atomic<uint64_t>> {
  // Every count, each read on its own (relaxed): a scrape's view.
  SpillTraffic Read() const;

  // I/O errors and checksum failures are counted by the store (SpillFileUsage), which tells them
  // apart (both reach the client as DATA_LOSS).
  BandwidthMeter spill_bandwidth;
  BandwidthMeter fetch_bandwidth;
};

// What the policy hears of transfers that ended (called on the store's I/O thread, or on the
// caller's when a transfer could not start; no lock of the tiers held).
class NvmeEvents {
 public:
  virtual ~NvmeEvents() = default;
  // The object's bytes are on NVMe now (its host extent went back): a prefetch candidate.
  virtual void Spilled(const std::shared_ptr<ObjectTable>& table,
                       const std::shared_ptr<Object>& object) = 0;
  // The object's bytes are in host memory again and it may be spilled.
  virtual void Fetched(const std::shared_ptr<ObjectTable>& table,
                       const std::shared_ptr<Object>& object) = 0;
};

class NvmeTransfers {
 public:
  enum class Kind { kWrite, kRead };

  NvmeTransfers(storage::HostPool& pool, storage::SpillStore& store)
      : pool_(pool), store_(store) {}
  NvmeTransfers(const NvmeTransfers&) = delete;
  NvmeTransfers& operator=(const NvmeTransfers&) = delete;

  // Who hears of ended transfers (set once, before the first).
  void Listen(NvmeEvents* events) { events_ = events; }
  NvmeEvents* events() const { return events_; }

  storage::HostPool& pool() { return pool_; }
  storage::SpillStore& store() { return store_; }
  SpillCounters& counters() { return counters_; }
  const SpillCounters& counters() const { return counters_; }

  // The host extent a read brings `object` back into: from the pool part its GPU copies from
  // (TierManager::Admit), else another, or none when the pool is full. Called under the
  // object's table lock (ObjectTable::BeginFetch's `allocate`).
  std::optional<storage::Extent> AllocateFetch(const Object& object) {
    return pool_.Allocate(object.len(), object.home_part());
  }

  // A transfer began (`bytes`: a write's host extent, counted as leaving host memory until the
  // write settles).
  void Began(Kind kind, uint64_t bytes = 0);

  // A write settles: its extent goes back to the pool (or stays: the write failed) and stops
  // counting as leaving host memory. Both change while one of these lives (declared before the
  // object that frees the extent, so that it ends last), and ProjectedUsage never reads them
  // half-changed. Read in between, the projection counted the extent twice, either way: once
  // gone from the pool and once still being written (the spiller stopped above its low
  // watermark), or still in the pool and no longer being written (it spilled one object more
  // than the watermark asked: tiers_test's SpillsTheOldestDownToTheLowWatermark under TSan).
  class WriteSettle {
   public:
    WriteSettle(NvmeTransfers& io, uint64_t bytes);
    ~WriteSettle();
    WriteSettle(const WriteSettle&) = delete;
    WriteSettle& operator=(const WriteSettle&) = delete;

   private:
    NvmeTransfers& io_;
    uint64_t bytes_;
  };

  // The pool's usage with the extents of writes in flight counted as free (their bytes leave
  // soon), read when no write is settling: a seqlock over the settles, whose readers yield (a
  // settle is a few pool calls). After kMaxSettleWait it takes the view as it is: a slow settle
  // costs the policy one object's precision, never a stall.
  storage::PoolUsage ProjectedUsage() const;
  static constexpr std::chrono::milliseconds kMaxSettleWait{100};
  // A transfer ended: the last thing it does (once the count it is in reaches zero, Stop may
  // return and the tiers go).
  void Ended(Kind kind);

  uint64_t writes_in_flight() const { return writes_.load(); }
  uint64_t reads_in_flight() const { return reads_.load(); }
  uint64_t in_flight() const { return writes_.load() + reads_.load(); }

  // Until fewer than `max` writes are in flight; false once Close() was called.
  bool AwaitWriteSlot(uint64_t max);
  // Wakes and ends every AwaitWriteSlot (shutdown).
  void Close();
  // Until no transfer is in flight; false at `deadline`.
  bool AwaitIdle(std::chrono::steady_clock::time_point deadline);

 private:
  storage::HostPool& pool_;
  storage::SpillStore& store_;
  NvmeEvents* events_ = nullptr;
  SpillCounters counters_;
  Mutex mu_;
  CondVar cv_;  // with mu_: a transfer ended, or Close
  // Atomics (read without the lock by the policy), changed under mu_ so a waiter misses nothing.
  std::atomic<uint64_t> writes_{0};
  std::atomic<uint64_t> reads_{0};
  std::atomic<uint64_t> writing_bytes_{0};
  // Settles under way, and a count that moves at each one's start and end (ProjectedUsage).
  std::atomic<uint64_t> settling_{0};
  std::atomic<uint64_t> settle_generation_{0};
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_TIERS_NVME_TRANSFERS_H_
