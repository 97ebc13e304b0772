#include "daemon/tiers/spill_read.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace tier::daemon {

bool SpillRead::Start(NvmeTransfers& io, const std::shared_ptr<ObjectTable>& table,
                      const std::shared_ptr<Object>& object, ObjectTable::Reader reader,
                      bool may_allocate, const Then& then) {
  const bool prefetch = reader == ObjectTable::Reader::kPrefetch;
  std::function<std::optional<storage::Extent>()> allocate;
  // Back into the part its GPU copies from (TierManager::Admit), when that one has room.
  if (may_allocate) {
    allocate = [&io, len = object->len(), part = object->home_part()] {
      return io.pool().Allocate(len, part);
    };
  }
  std::shared_ptr<SpillRead> read(new SpillRead(io, table, object, prefetch));
  ObjectTable::FetchBegun begun = table->BeginFetch(*object, reader, allocate, read);
  switch (begun.fetch) {
    case ObjectTable::Fetch::kNoRoom:
      return false;
    case ObjectTable::Fetch::kJoined:
      if (!prefetch) {  // copies once the running read ended
        begun.running->Join([then](absl::Status ended) {
          if (ended.ok()) {
            then(Readable{});
          } else {
            then(std::move(ended));
          }
        });
        return true;
      }
      [[fallthrough]];  // someone else's read brings it back: nothing to do
    case ObjectTable::Fetch::kInHost:
    case ObjectTable::Fetch::kGone:
      begun.released.GiveBack();  // (a prefetch's pin: before it is reported done)
      then(Readable{});
      return true;
    case ObjectTable::Fetch::kStarted:
      break;
  }
  read->then_ = then;
  read->Issue(begun.extent, begun.record);
  return true;
}

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

bool SpillRead::EndFetch(const absl::Status& read) {
  bool spillable = false;
  Release release = table_->EndFetch(*object_, read, prefetch_, &spillable);
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
  const bool spillable = EndFetch(read);
  if (spillable && io_.events() != nullptr) io_.events()->Fetched(table_, object_);
  // (A failed read was logged and counted by the store. A failed prefetch is not retried: a
  // reload reads again and reports its own result.)
  std::vector<ObjectWaiter> joined;
  {
    MutexLock lock(&mu_);
    ended_ = true;
    result_ = read;
    joined.swap(joined_);
  }
  for (ObjectWaiter& waiter : joined) waiter(read);
  if (prefetch_) then_(Readable{});
  // What it shares with the copy is the copy's from now on: a failed read's extent goes back when
  // the copy lets go, never with this read after the tiers may be gone.
  keep_.reset();
  feed_.reset();
  io_.Ended(NvmeTransfers::Kind::kRead);  // the last thing: see NvmeTransfers::Ended
}

void SpillRead::Join(ObjectWaiter waiter) {
  absl::Status result;
  {
    MutexLock lock(&mu_);
    if (!ended_) {
      joined_.push_back(std::move(waiter));
      return;
    }
    result = result_;
  }
  waiter(result);
}

}  // namespace tier::daemon
