// One write of an object's host bytes to the spill store, from start to end: it pins the object
// (ObjectTable::BeginSpill), owns that until the store's write landed, then ends the spill
// (ObjectTable::EndSpill: on NVMe, its extent back to the pool; or still in host memory), counts
// it and tells the policy. It owns itself while in flight; nobody holds it.
#ifndef TIER_DAEMON_TIERS_SPILL_WRITE_H_
#define TIER_DAEMON_TIERS_SPILL_WRITE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "daemon/tiers/nvme_transfers.h"
#include "daemon/tiers/object_table.h"

namespace tier::daemon {

class SpillWrite {
 public:
  enum class Start {
    kStarted,  // the write runs (it ends on the store's I/O thread)
    kBusy,     // a job uses the object now: try again later
    kNot,      // not a spill candidate any more
    kRefused,  // the store took no write (NVMe full, or closing): the object stays as it was
  };
  static Start Begin(NvmeTransfers& io, const std::shared_ptr<ObjectTable>& table,
                     const std::shared_ptr<Object>& object);

 private:
  SpillWrite(NvmeTransfers& io, std::shared_ptr<ObjectTable> table, std::shared_ptr<Object> object,
             storage::Extent extent)
      : io_(io), table_(std::move(table)), object_(std::move(object)), extent_(extent) {}
  void Landed(const absl::StatusOr<storage::SpillRecord>& record);

  NvmeTransfers& io_;
  const std::shared_ptr<ObjectTable> table_;
  const std::shared_ptr<Object> object_;
  const storage::Extent extent_;  // the host bytes it writes (pinned until it landed)
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_TIERS_SPILL_WRITE_H_
