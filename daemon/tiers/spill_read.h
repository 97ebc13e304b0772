// One read of a spilled object back into host memory, from start to end. It is the one way in
// for everyone who needs a spilled object's bytes (a reload, a prefetch): Start gives the object
// a new host extent (ObjectTable::BeginFetch), reads its record into it, feeds the reload that
// started it chunk by chunk as the store verifies them, and ends the object's fetch
// (ObjectTable::EndFetch). It owns, until it ended: the host extent it reads into (and, if the
// read fails, keeps it for the reload's copy until that copy is done), the progress feed, and the
// reloads that found it running (they join it and start when it ends).
//
// Locks: mu_ guards the joined reloads and the end; a leaf, never held while calling out.
#ifndef TIER_DAEMON_TIERS_SPILL_READ_H_
#define TIER_DAEMON_TIERS_SPILL_READ_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "daemon/tiers/nvme_transfers.h"
#include "daemon/tiers/object_table.h"
#include "daemon/tiers/release.h"
#include "engine/source_feed.h"

namespace tier::daemon {

// What a reload reads from: a feed still filling from NVMe (with `keep`, which holds its extent
// until the copy is done whatever the read's end), or, with both null, the object's extent as it
// is.
struct Readable {
  std::shared_ptr<engine::SourceFeed> feed;
  std::shared_ptr<Release> keep;
  storage::Extent extent;  // with a feed: the host bytes it fills
};

class SpillRead : public std::enable_shared_from_this<SpillRead> {
 public:
  using Then = std::function<void(absl::StatusOr<Readable>)>;

  // Makes the bytes of `object` (pinned by the caller) readable for `reader`, then calls `then`
  // once: for a reload, with a Readable whose feed is still filling (a read this call started),
  // or an empty Readable once the bytes are in host memory (already there, or a read that was
  // running ended), or with the read's error; for a prefetch, once its read ended (or at once
  // when there is nothing to read; a prefetch's pin is dropped when it ends). False: no host room
  // (`may_allocate` false, or the pool is full): nothing started and `then` not called. Runs
  // `then` on the caller's thread or the store's I/O thread.
  static bool Start(NvmeTransfers& io, const std::shared_ptr<ObjectTable>& table,
                    const std::shared_ptr<Object>& object, ObjectTable::Reader reader,
                    bool may_allocate, const Then& then);

  // A reload that found this read running: `waiter` runs when it ends, with its result (at once
  // when it has ended).
  void Join(ObjectWaiter waiter);

 private:
  SpillRead(NvmeTransfers& io, std::shared_ptr<ObjectTable> table, std::shared_ptr<Object> object,
            bool prefetch)
      : io_(io), table_(std::move(table)), object_(std::move(object)), prefetch_(prefetch) {}
  // Reads `record` into `extent` (the object's new extent).
  void Issue(storage::Extent extent, const storage::SpillRecord& record);
  void Finish(const absl::Status& read);
  // Ends the object's fetch; whether it may be spilled again. The memory it releases goes back
  // before this returns, except a failed reload's extent, which `keep_` holds for its copy.
  bool EndFetch(const absl::Status& read);

  NvmeTransfers& io_;
  const std::shared_ptr<ObjectTable> table_;
  const std::shared_ptr<Object> object_;
  const bool prefetch_;
  Then then_;                                  // set before the read is issued
  storage::Extent extent_;
  uint64_t len_ = 0;
  std::shared_ptr<engine::SourceFeed> feed_;   // reloads only
  std::shared_ptr<Release> keep_;              // reloads only: shared with the copy
  Mutex mu_;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status result_ ABSL_GUARDED_BY(mu_);
  std::vector<ObjectWaiter> joined_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_TIERS_SPILL_READ_H_
