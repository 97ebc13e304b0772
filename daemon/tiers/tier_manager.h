// The memory tiers behind the job executor: the host pool and, when configured, the NVMe tier (its
// transfers, daemon/tiers/nvme_transfers.h, and the spiller's policy). The executor sees two calls
// per job: admission of a new object into host memory (now, or in order once room comes) and
// making an object readable (its extent as it is, or a feed still filling from NVMe); both wait
// in the admission queue for room the spiller makes. Everything about spilling stays behind this
// class. It is also the MemoryHome of every object it admits: memory an ObjectTable transition
// releases comes back here by itself (daemon/tiers/release.h). With no NVMe tier, admission fails
// at once when the pool is full and every object is readable as it is.
#ifndef TIER_DAEMON_TIERS_TIER_MANAGER_H_
#define TIER_DAEMON_TIERS_TIER_MANAGER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/jobs/admission_queue.h"
#include "daemon/tiers/nvme_transfers.h"
#include "daemon/tiers/object_table.h"
#include "daemon/tiers/release.h"
#include "daemon/tiers/spill_read.h"
#include "daemon/tiers/spiller.h"
#include "storage/host_pool.h"
#include "storage/spill_store.h"

namespace tier::daemon {

class TierManager {
 public:
  // `store`: the NVMe tier, or null for none. `part_of_device[d]`: the pool part GPU d's
  // offloads take extents from first (daemon/tiers/pool_layout.h); a GPU beyond it, or -1, has none.
  TierManager(storage::HostPool& pool, storage::SpillStore* store, SpillerOptions options,
              std::vector<int> part_of_device = {});
  ~TierManager();
  TierManager(const TierManager&) = delete;
  TierManager& operator=(const TierManager&) = delete;

  void Start();
  // Jobs still waiting for room give up; the spiller stops, then the NVMe transfers in flight end.
  void Stop();

  storage::HostPool& pool() { return pool_; }
  // The NVMe tier's transfers (the store, counters, what is in flight), or null.
  NvmeTransfers* nvme() { return transfers_.get(); }
  // The NVMe tier's policy, or null (its own tests drive it).
  Spiller* spiller() { return spiller_.get(); }
  // Where admitted objects' memory goes back (tests that admit by hand).
  MemoryHome& home() { return home_; }

  // Whether an object of `len` bytes could ever be in host memory (it must be, to be filled): an
  // extent lies within one part of the pool.
  bool CanEverHold(uint64_t len) const { return len <= pool_.largest_part_bytes(); }
  // The pool part GPU `device` prefers (storage::HostPool::kAnyPart for none, or host memory).
  int PartOf(int device) const;
  // The quota charge of an object of `len` bytes: the extent the pool will hand out for it.
  uint64_t Charge(uint64_t len) const {
    return (len + pool_.alignment() - 1) & ~(pool_.alignment() - 1);
  }

  // A new object in `table` needs its host extent: `then(OK)` once it has it (ObjectTable::Admit
  // done), on this thread when there is room now and nobody waits before it, else later, in the
  // order of `queue` (the session), once the spiller made room; `then(RESOURCE_EXHAUSTED)` when
  // no room can come. `device`: the GPU its bytes come from (-1: host memory); the extent comes
  // from that GPU's pool part when it has room, else from another part (counted as remote)
  // before the object waits for the spiller. A fetch back from NVMe prefers the same part.
  // `then(OK)` lets the fill's copy into the extent start: it counts as a copy on pool memory
  // until FillEnded.
  void Admit(const std::shared_ptr<ObjectTable>& table, uint64_t queue,
             const std::shared_ptr<Object>& object, int device,
             std::function<void(absl::Status)> then);
  // The fill of an admitted object ended (its copy ran, or failed): the table's transition (the
  // jobs that waited for the fill go to *waiters, for the caller to start), and a filled object
  // becomes a spill candidate. Its copy on pool memory is over.
  void FillEnded(const std::shared_ptr<ObjectTable>& table, const std::shared_ptr<Object>& object,
                 const absl::Status& status, std::vector<ObjectWaiter>* waiters);
  // A reload pinned `pinned` (`prefetch`: how it found the object, counted): `then` gets what to
  // copy from (see Readable and SpillRead::Start), at once when the object's bytes are in host
  // memory. When the pool has no room to read a spilled object back into, it waits in the
  // admission queue (`queue`: the session), and fails RESOURCE_EXHAUSTED only when no room can
  // come. An OK answer lets the reload's copy start: a copy on pool memory until ReloadEnded.
  void MakeReadable(const std::shared_ptr<ObjectTable>& table, uint64_t queue,
                    const ObjectTable::Pinned& pinned,
                    std::function<void(absl::StatusOr<Readable>)> then);
  // The copy of a reload that MakeReadable answered OK ended: its pin goes (and the memory of a
  // freed object with it), and its copy on pool memory is over.
  void ReloadEnded(ObjectTable& table, Object& object);

 private:
  // Memory an object of these tiers released: extents to the pool, records to the spill store;
  // the spiller hears that memory came free.
  class Home : public MemoryHome {
   public:
    explicit Home(TierManager& tiers) : tiers_(tiers) {}
    void Return(std::optional<storage::Extent> extent,
                std::optional<storage::SpillRecord> record) override;

   private:
    TierManager& tiers_;
  };

  // MakeReadable of an object on NVMe: its bytes in host memory already, a running read to join,
  // or a read this call starts (with `may_allocate`, and room in the pool). False: no room,
  // nothing started and `then` not called.
  bool Fetch(const std::shared_ptr<ObjectTable>& table, const std::shared_ptr<Object>& object,
             bool may_allocate, const SpillRead::Then& then);
  // Gives `object` the new `extent`; an extent the table refuses goes back to the pool. OK: the
  // fill's copy is counted as started.
  absl::Status AdmitWith(ObjectTable& table, Object& object, storage::Extent extent);
  // A copy on pool memory started or ended: while any runs, jobs waiting for room are not failed
  // as stuck (Spiller::CopyStarted).
  void CopyStarted();
  void CopyEnded();

  storage::HostPool& pool_;
  const std::vector<int> part_of_device_;
  Home home_{*this};
  AdmissionQueue admission_;
  std::unique_ptr<NvmeTransfers> transfers_;  // null: no NVMe tier
  std::unique_ptr<Spiller> spiller_;          // with transfers_
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_TIERS_TIER_MANAGER_H_
