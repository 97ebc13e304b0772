#include "daemon/tiers/spill_write.h"

#include <utility>

#include "common/log.h"
#include "common/mutex.h"

namespace tier::daemon {

SpillWrite::Start SpillWrite::Begin(NvmeTransfers& io, const std::shared_ptr<ObjectTable>& table,
                                    const std::shared_ptr<Object>& object) {
  storage::Extent extent;
  switch (table->BeginSpill(*object, &extent)) {
    case ObjectTable::SpillStart::kNot:
      return Start::kNot;
    case ObjectTable::SpillStart::kBusy:
      return Start::kBusy;
    case ObjectTable::SpillStart::kBegan:
      break;
  }
  io.Began(NvmeTransfers::Kind::kWrite, extent.bytes);
  std::unique_ptr<SpillWrite> write(new SpillWrite(io, table, object, extent));
  absl::Status started = io.store().Write(
      io.pool().At(extent), object->len(),
      [write = std::move(write)](absl::StatusOr<storage::SpillRecord> record) {
        write->Landed(record);
      });
  if (started.ok()) return Start::kStarted;
  // Nothing started: the store dropped the callback (and the write with it); the object is back
  // in host memory, unpinned.
  {
    NvmeTransfers::WriteSettle settle(io, extent.bytes);  // (ends after the release)
    bool spilled = false;
    Release release = table->EndSpill(*object, started, &spilled);
  }
  io.Ended(NvmeTransfers::Kind::kWrite);
  if (!absl::IsResourceExhausted(started)) {
    LogWarning("spill write not started: ", started.ToString());
  }
  return Start::kRefused;
}

void SpillWrite::Landed(const absl::StatusOr<storage::SpillRecord>& record) {
  {
    NvmeTransfers::WriteSettle settle(io_, extent_.bytes);  // (ends after the release)
    bool spilled = false;
    Release release = table_->EndSpill(*object_, record, &spilled);
    if (spilled) {
      SpillCounters& counters = io_.counters();
      counters.spills.fetch_add(1);
      counters.bytes_spilled.fetch_add(object_->len());
      counters.spill_bandwidth.Add(object_->len(), MonotonicMs());
      if (io_.events() != nullptr) io_.events()->Spilled(table_, object_);
    }
    // A failed write was logged by the store; the object stays in host memory and is no
    // candidate any more, so a failing device is not hammered (it becomes one again once filled
    // anew).
  }  // its extent (or the record not needed) goes back here, then the write has settled
  io_.Ended(NvmeTransfers::Kind::kWrite);
}

}  // namespace tier::daemon
