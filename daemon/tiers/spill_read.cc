#include "daemon/tiers/spill_read.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace tier::daemon {

void SpillRead::Start(NvmeTransfers& io, std::shared_ptr<ObjectTable> table,
                      std::shared_ptr<Object> object, ObjectTable::Reader reader,
                      const ObjectTable::FetchBegun& begun, Then then) {
  std::shared_ptr<SpillRead> read(new SpillRead(io, std::move(table), std::move(object),
                                                reader == ObjectTable::Reader::kPrefetch,
                                                std::move(then)));
  read->Issue(begun.extent, begun.record);
}

SpillRead::SpillRead(NvmeTransfers& io, std::shared_ptr<ObjectTable> table,
                     std::shared_ptr<Object> object, bool prefetch, Then then)
    : io_(io), table_(std::move(table)), object_(std::move(object)), prefetch_(prefetch),
      then_(std::move(then)) {}

void SpillRead::Issue(storage::Extent extent, const storage::SpillRecord& record) {
  extent_ = extent;
  len_ = record.len;
  if (prefetch_) io_.counters().prefetches.fetch_add(1, std::memory_order_relaxed);
  io_.Began(NvmeTransfers::Kind::kRead);
  storage::SpillStore::ReadProgress progress = nullptr;
  if (!prefetch_) {
    // The copy onward starts now and takes each chunk as the read verifies it; the last chunk
    // only with the feed's end, after the object's fetch ended. Chunks of whole I/Os, at most 64
    // per object (each is a copy issued on a GPU).
    const uint64_t io = io_.store().io_bytes();
    const uint64_t ios = (object_->len() + io - 1) / io;
    feed_ = std::make_shared<engine::SourceFeed>(object_->len(), io * ((ios + 63) / 64));
    keep_ = std::make_shared<Release>();
    then_(Readable{feed_, keep_, extent});
    progress = [feed = feed_](uint64_t verified) {
      feed->Advance(std::min(verified, feed->len() - 1));
    };
  }
  std::shared_ptr<SpillRead> self = shared_from_this();
  absl::Status started = io_.store().Read(
      record, io_.pool().At(extent), [self](absl::Status read) { self->Finish(read); },
      std::move(progress));
  if (!started.ok()) Finish(started);
}

bool SpillRead::EndFetch(const absl::Status& read, std::vector<ObjectWaiter>* joined) {
  bool spillable = false;
  Release release = table_->EndFetch(*object_, read, prefetch_, &spillable, joined);
  if (feed_ != nullptr) {
    if (!read.ok()) {
      // What the copy onward must still deliver is zeros, never unverified bytes; the extent
      // stays with the copy until it is done.
      const uint64_t ready = feed_->ready();
      std::memset(io_.pool().At(extent_) + ready, 0, extent_.bytes - ready);
      *keep_ = std::move(release);
    }
    feed_->End(read);
  }
  return spillable;
}

void SpillRead::Finish(const absl::Status& read) {
  // Counted before anyone can see the object back in host memory or the reload complete.
  if (read.ok()) {
    SpillCounters& counters = io_.counters();
    counters.fetches.fetch_add(1);
    counters.bytes_fetched.fetch_add(len_);
    counters.fetch_bandwidth.Add(len_, MonotonicMs());
    if (prefetch_) counters.bytes_prefetched.fetch_add(len_);
  }
  std::vector<ObjectWaiter> joined;
  const bool spillable = EndFetch(read, &joined);
  if (spillable && io_.events() != nullptr) io_.events()->Fetched(table_, object_);
  // (A failed read was logged and counted by the store. A failed prefetch is not retried: a
  // reload reads again and reports its own result.)
  for (ObjectWaiter& waiter : joined) waiter(read);
  if (prefetch_) then_(Readable{});
  // What it shares with the copy is the copy's from now on: a failed read's extent goes back when
  // the copy lets go, never with this read after the tiers may be gone.
  keep_.reset();
  feed_.reset();
  io_.Ended(NvmeTransfers::Kind::kRead);  // the last thing: see NvmeTransfers::Ended
}

}  // namespace tier::daemon
