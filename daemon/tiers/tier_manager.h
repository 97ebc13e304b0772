// The memory tiers behind the job executor: the host pool and, when configured, the NVMe tier (the
// spill store and the spiller that moves objects between the two). The executor sees two calls per
// job: admission of a new object into host memory (now, or in order once room comes) and making
// an object readable (its extent as it is, or a feed still filling from NVMe); everything about
// spilling stays behind this class. With no NVMe tier, admission fails at once when the pool is
// full and every object is readable as it is.
#ifndef TIER_DAEMON_TIERS_TIER_MANAGER_H_
#define TIER_DAEMON_TIERS_TIER_MANAGER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/jobs/admission_queue.h"
#include "daemon/tiers/object_table.h"
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
  // Jobs still waiting for room give up; the spiller stops after its I/O landed.
  void Stop();

  storage::HostPool& pool() { return pool_; }
  // The NVMe tier's mover (status and counters), or null.
  Spiller* spiller() { return spiller_.get(); }

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
  void Admit(const std::shared_ptr<ObjectTable>& table, uint64_t queue,
             const std::shared_ptr<Object>& object, int device,
             std::function<void(absl::Status)> then);
  // A reload found its object so (a prefetch hit or miss: counters).
  void NoteReload(ObjectTable::Prefetch prefetch);
  // A reload pinned `pinned`: `then` gets what to copy from (see Readable and Spiller::Fetch);
  // at once when the object's bytes are in host memory.
  void MakeReadable(const std::shared_ptr<ObjectTable>& table, uint64_t queue,
                    const ObjectTable::Pinned& pinned,
                    std::function<void(absl::StatusOr<Readable>)> then);
  // A fill completed: the object may be spilled from now on.
  void Filled(const std::shared_ptr<ObjectTable>& table, const std::shared_ptr<Object>& object);
  // Copies on pool memory (fills, reloads) started and ended: see Spiller::CopyStarted.
  void CopyStarted();
  void CopyEnded();
  // Gives back what an ObjectTable transition released.
  void Settle(const Release& release);

 private:
  // Gives `object` the new `extent`; an extent the table refuses goes back to the pool.
  absl::Status AdmitWith(ObjectTable& table, Object& object, storage::Extent extent);

  storage::HostPool& pool_;
  const std::vector<int> part_of_device_;
  AdmissionQueue admission_;
  std::unique_ptr<Spiller> spiller_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_TIERS_TIER_MANAGER_H_
