// Memory an ObjectTable transition gave back (a host extent, a spill record), as a value that
// returns itself to where it came from when it goes out of scope: no caller hands it back by hand.
//
// Where memory goes back is its MemoryHome, which an object learns when it is admitted
// (ObjectTable::Admit): the tiers that handed out its extent (TierManager), or a test's fake.
// A Release is made under its table's lock but never given back there: it is returned by value
// and goes back in the caller's scope, after the lock is dropped. A caller that must order the
// return before something else (the spiller counts a write's extent until it is back) ends the
// scope there, or calls GiveBack().
#ifndef TIER_DAEMON_TIERS_RELEASE_H_
#define TIER_DAEMON_TIERS_RELEASE_H_

#include <optional>

#include "storage/extent_allocator.h"
#include "storage/spill_store.h"

namespace tier::daemon {

class MemoryHome {
 public:
  virtual ~MemoryHome() = default;
  // Takes back an extent (to the host pool) and/or a record (to the spill store). Called with no
  // table's lock held.
  virtual void Return(std::optional<storage::Extent> extent,
                      std::optional<storage::SpillRecord> record) = 0;
};

class Release {
 public:
  Release() = default;
  explicit Release(MemoryHome* home) : home_(home) {}
  Release(MemoryHome* home, storage::Extent extent) : home_(home), extent_(extent) {}
  Release(Release&& other) noexcept { *this = std::move(other); }
  Release& operator=(Release&& other) noexcept;
  Release(const Release&) = delete;
  Release& operator=(const Release&) = delete;
  ~Release() { GiveBack(); }

  const std::optional<storage::Extent>& extent() const { return extent_; }
  const std::optional<storage::SpillRecord>& record() const { return record_; }
  bool empty() const { return !extent_ && !record_; }

  void set_extent(storage::Extent extent) { extent_ = extent; }
  void set_record(storage::SpillRecord record) { record_ = record; }
  // Takes what `other` holds (both come from one object: one home), leaving it empty.
  void Absorb(Release&& other);
  // Gives it back now; empty afterwards.
  void GiveBack();

 private:
  MemoryHome* home_ = nullptr;
  std::optional<storage::Extent> extent_;
  std::optional<storage::SpillRecord> record_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_TIERS_RELEASE_H_
