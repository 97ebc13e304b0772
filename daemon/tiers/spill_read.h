// One read of a spilled object back into host memory, from start to end. Whoever needs a
// spilled object's bytes (a reload: TierManager::MakeReadable; a prefetch: the Spiller) asks the
// object's table first (ObjectTable::BeginFetch: in host memory already, a read to join, no room,
// or a new extent to read into); when a read must start, it hands it here once. The read reads
// the record into the new extent, feeds the reload that started it chunk by chunk as the store
// verifies them, ends the object's fetch (ObjectTable::EndFetch) and starts the reloads that
// joined it meanwhile (the table held them). It owns, until it ended: the host extent it reads
// into (and, if the read fails, keeps it for the reload's copy until that copy is done) and the
// progress feed. No lock of its own: what others see of it is the table's.
#ifndef TIER_DAEMON_TIERS_SPILL_READ_H_
#define TIER_DAEMON_TIERS_SPILL_READ_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

  // Reads the record of `object` (pinned by the caller) into the extent that `begun` gave it
  // (ObjectTable::BeginFetch for `reader`, Fetch::kStarted), then calls `then` once: for a reload,
  // at once, with a Readable whose feed fills as the read goes; for a prefetch, once its read
  // ended (its pin goes with it). On the caller's thread or the store's I/O thread.
  static void Start(NvmeTransfers& io, std::shared_ptr<ObjectTable> table,
                    std::shared_ptr<Object> object, ObjectTable::Reader reader,
                    const ObjectTable::FetchBegun& begun, Then then);

 private:
  SpillRead(NvmeTransfers& io, std::shared_ptr<ObjectTable> table, std::shared_ptr<Object> object,
            bool prefetch, Then then);
  // Reads `record` into `extent` (the object's new extent).
  void Issue(storage::Extent extent, const storage::SpillRecord& record);
  void Finish(const absl::Status& read);
  // Ends the object's fetch; whether it may be spilled again, and the reloads that joined the
  // read go to *joined. The memory it releases goes back before this returns, except a failed
  // reload's extent, which `keep_` holds for its copy.
  bool EndFetch(const absl::Status& read, std::vector<ObjectWaiter>* joined);

  NvmeTransfers& io_;
  const std::shared_ptr<ObjectTable> table_;
  const std::shared_ptr<Object> object_;
  const bool prefetch_;
  const Then then_;
  storage::Extent extent_;
  uint64_t len_ = 0;
  std::shared_ptr<engine::SourceFeed> feed_;  // reloads only
  std::shared_ptr<Release> keep_;             // reloads only: shared with the copy
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_TIERS_SPILL_READ_H_
