#include "daemon/tiers/spiller.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/mutex.h"

namespace tier::daemon {

Spiller::Spiller(storage::HostPool& pool, storage::SpillStore& store, AdmissionQueue& admission,
                 SpillerOptions options)
    : pool_(pool), store_(store), admission_(admission), policy_(options.watermarks),
      max_prefetches_(options.max_prefetches), stall_ms_(options.stall_ms),
      last_change_ms_(MonotonicMs()) {}

Spiller::~Spiller() { Stop(); }

void Spiller::Start() { thread_ = std::thread([this] { Run(); }); }

void Spiller::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  io_done_cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
  // Writes and reads call back into the spiller when they land: wait for them while the store
  // still runs (it goes after the spiller). Bounded: a device that never answers is logged.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  MutexLock lock(&mu_);
  while (writes_in_flight_.load() + reads_in_flight_.load() != 0) {
    if (!io_done_cv_.WaitUntil(&mu_, deadline)) {
      LogError("spiller stopping with NVMe I/O still in flight after 30 s");
      return;
    }
  }
}

void Spiller::Track(const std::shared_ptr<ObjectTable>& table,
                    const std::shared_ptr<Object>& object) {
  last_change_ms_.store(MonotonicMs());
  {
    MutexLock lock(&mu_);
    candidates_.Add(NextUseOf(*object), Candidate{table, object});
  }
  Kick();
}

void Spiller::Kick() {
  // Only above the high watermark, or while an episode waits for candidates: between the marks
  // every completed offload calls this, and the thread has nothing to do for it.
  if (!draining_.load(std::memory_order_relaxed) && !policy_.MustSpill(pool_.Usage())) return;
  {
    MutexLock lock(&mu_);
    kicked_ = true;
  }
  cv_.Signal();
}

void Spiller::WaitBegan(bool first) {
  // The stall clock starts no earlier than the wait: an idle daemon has not "stalled" (it used to
  // fail the first job to find the pool full after 5 s without traffic).
  if (first) last_change_ms_.store(MonotonicMs());
  {
    MutexLock lock(&mu_);
    kicked_ = true;
  }
  cv_.Signal();
}

storage::PoolUsage Spiller::Projected() const {
  storage::PoolUsage usage = pool_.Usage();
  uint64_t writing = std::min(writing_bytes_.load(), usage.used_bytes);
  usage.used_bytes -= writing;
  usage.free_bytes += writing;
  return usage;
}

bool Spiller::AwaitKick() {
  // With jobs waiting for room, look again every few ms even without a kick.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(admission_.HasWaiters() ? 5 : 1000);
  MutexLock lock(&mu_);
  while (!stopping_ && !kicked_) {
    if (!cv_.WaitUntil(&mu_, deadline)) break;
  }
  kicked_ = false;
  return !stopping_;
}

void Spiller::AwaitWriteSlot() {
  MutexLock lock(&mu_);
  while (!stopping_ && writes_in_flight_.load() >= kMaxWritesInFlight) io_done_cv_.Wait(&mu_);
}

void Spiller::Run() {
  while (AwaitKick()) {
    bool parked = admission_.HasWaiters();
    // Above the high watermark: down to the low one, counting writes in flight as done (their
    // extents go soon). A waiting job needs at least one spill whatever the watermarks say.
    // An episode that ran out of candidates goes on when new ones arrive.
    if (policy_.MustSpill(Projected())) draining_.store(true);
    bool spilled_any = false, exhausted = false;
    while ((draining_.load() && policy_.KeepSpilling(Projected())) || (parked && !spilled_any)) {
      if (writes_in_flight_.load() >= kMaxWritesInFlight) {
        AwaitWriteSlot();  // enough queued; the store works through them
        continue;
      }
      if (!SpillOne()) {
        exhausted = true;
        break;
      }
      spilled_any = true;
    }
    if (!policy_.KeepSpilling(Projected())) draining_.store(false);
    if (parked) {
      // Stuck: nothing could be spilled, and nothing in flight (a write, a read, a copy on pool
      // memory) will free memory or make an object spillable; or copies are in flight but
      // nothing changed for stall_ms (they may be waiting on the waiters themselves).
      bool idle = copies_in_flight_.load() == 0 ||
                  MonotonicMs() - last_change_ms_.load() > stall_ms_;
      bool stuck = exhausted && !spilled_any && writes_in_flight_.load() == 0 &&
                   reads_in_flight_.load() == 0 && idle;
      admission_.Serve(stuck ? AdmissionQueue::Mode::kStuck : AdmissionQueue::Mode::kTry);
    } else if (!draining_.load()) {
      Prefetch();
    }
  }
}

void Spiller::Settle(const Release& release) {
  if (release.record) (void)store_.Free(*release.record);
  if (release.extent) {
    pool_.Free(*release.extent);
    NotifyFreed();  // waiters may fit now, or a prefetch
  }
}

bool Spiller::SpillOne() {
  std::vector<Candidate> busy;  // in use right now: back in the list after this call
  auto requeue = [&] {
    MutexLock lock(&mu_);
    for (Candidate& c : busy) {
      if (auto object = c.object.lock()) candidates_.Add(NextUseOf(*object), std::move(c));
    }
  };
  for (;;) {
    std::optional<Candidate> candidate;
    {
      MutexLock lock(&mu_);
      if (!stopping_) candidate = candidates_.TakeUsedLast();
    }
    if (!candidate) {
      requeue();
      return false;
    }
    std::shared_ptr<ObjectTable> table = candidate->table.lock();
    std::shared_ptr<Object> object = candidate->object.lock();
    if (table == nullptr || object == nullptr) continue;  // gone meanwhile
    storage::Extent extent;
    switch (table->BeginSpill(*object, &extent)) {
      case ObjectTable::SpillStart::kNot:
        continue;
      case ObjectTable::SpillStart::kBusy:  // a reload uses it: try it again later
        busy.push_back(std::move(*candidate));
        continue;
      case ObjectTable::SpillStart::kBegan:
        break;
    }
    writes_in_flight_.fetch_add(1);
    writing_bytes_.fetch_add(extent.bytes);
    auto landed = [this, table, object, extent](absl::StatusOr<storage::SpillRecord> record) {
      bool spilled = false;
      Release release = table->EndSpill(*object, record, &spilled);
      Settle(release);
      writing_bytes_.fetch_sub(extent.bytes);  // after the extent went back (or stays)
      if (spilled) {
        counters_.spills.fetch_add(1);
        counters_.bytes_spilled.fetch_add(object->len());
        counters_.spill_bandwidth.Add(object->len(), MonotonicMs());
        MutexLock lock(&mu_);
        spilled_.Add(NextUseOf(*object), Candidate{table, object});
      }
      // A failed write was logged by the store; the object stays in host memory and is no
      // candidate any more, so a failing device is not hammered (it becomes one again once
      // filled anew).
      {
        // Signalled under the lock: Stop() may return (and the spiller go) as soon as the count
        // it waits for reaches zero, so nothing of ours may be touched after the unlock.
        MutexLock lock(&mu_);
        writes_in_flight_.fetch_sub(1);
        io_done_cv_.SignalAll();
      }
    };
    absl::Status started = store_.Write(pool_.At(extent), object->len(), landed);
    if (!started.ok()) {
      bool spilled = false;
      Settle(table->EndSpill(*object, started, &spilled));  // back in host memory, unpinned
      writing_bytes_.fetch_sub(extent.bytes);
      writes_in_flight_.fetch_sub(1);
      busy.push_back(std::move(*candidate));  // still a candidate once NVMe has room
      requeue();
      if (!absl::IsResourceExhausted(started)) {
        LogWarning("spill write not started: ", started.ToString());
      }
      return false;  // NVMe full or closing: nothing more to do now
    }
    requeue();
    return true;
  }
}

void Spiller::Prefetch() {
  while (prefetches_in_flight_.load() < max_prefetches_) {
    std::optional<Candidate> candidate;
    {
      MutexLock lock(&mu_);
      if (stopping_ || admission_.HasWaiters()) return;  // waiting jobs need the room more
      candidate = spilled_.TakeUsedSoonest();
    }
    if (!candidate) return;
    std::shared_ptr<ObjectTable> table = candidate->table.lock();
    std::shared_ptr<Object> object = candidate->object.lock();
    if (table == nullptr || object == nullptr) continue;
    if (!policy_.MayPrefetch(pool_.Usage(), object->len())) {
      MutexLock own(&mu_);
      spilled_.Add(NextUseOf(*object), std::move(*candidate));
      return;
    }
    // Fetched by a reload meanwhile (or freed): nothing to prefetch.
    if (!table->PinIfOnNvme(*object)) continue;  // the read writes into its new extent
    prefetches_in_flight_.fetch_add(1);
    auto done = std::make_shared<std::function<void(absl::StatusOr<Readable>)>>(
        [this](absl::StatusOr<Readable>) {
          prefetches_in_flight_.fetch_sub(1);
          {
            MutexLock lock(&mu_);
            kicked_ = true;  // the next one
          }
          cv_.Signal();
        });
    if (!StartFetch(table, object, ObjectTable::Reader::kPrefetch, done, /*may_allocate=*/true)) {
      prefetches_in_flight_.fetch_sub(1);
      Settle(table->Unpin(*object));
      MutexLock own(&mu_);
      spilled_.Add(NextUseOf(*object), std::move(*candidate));
      return;
    }
  }
}

void Spiller::Fetch(const std::shared_ptr<ObjectTable>& table, uint64_t queue,
                    const std::shared_ptr<Object>& object,
                    std::function<void(absl::StatusOr<Readable>)> then) {
  auto shared_then =
      std::make_shared<std::function<void(absl::StatusOr<Readable>)>>(std::move(then));
  constexpr ObjectTable::Reader kReader = ObjectTable::Reader::kPipelined;
  // Behind jobs already waiting for room, unless no room is needed (a read already runs).
  if (StartFetch(table, object, kReader, shared_then, !admission_.HasWaiters())) return;
  // Like an offload: wait for room, fail only when none can come.
  const uint64_t len = object->len();
  admission_.Wait(
      queue,
      [this, table, object, shared_then]() {
        return StartFetch(table, object, kReader, shared_then, /*may_allocate=*/true);
      },
      [shared_then, len]() {
        (*shared_then)(absl::ResourceExhaustedError(absl::StrCat(
            "host pool full and nothing can be spilled: no room to bring back ", len,
            " spilled bytes")));
      });
}

// The host extent a pipelined fetch reads into, held by the read and by the copy that reads it
// onward. When both are done it goes back to the pool, unless the read succeeded (then it is the
// object's extent).
struct Spiller::FetchLease {
  FetchLease(Spiller& spiller, storage::Extent extent) : spiller(spiller), extent(extent) {}
  ~FetchLease() {
    if (!owned_by_object.load()) spiller.Settle(Release{extent, std::nullopt});
  }
  Spiller& spiller;
  const storage::Extent extent;
  std::atomic<bool> owned_by_object{false};
};

bool Spiller::StartFetch(const std::shared_ptr<ObjectTable>& table,
                         const std::shared_ptr<Object>& object, ObjectTable::Reader reader,
                         std::shared_ptr<std::function<void(absl::StatusOr<Readable>)>> then,
                         bool may_allocate) {
  const bool prefetch = reader == ObjectTable::Reader::kPrefetch;
  std::function<std::optional<storage::Extent>()> allocate;
  // Back into the part its GPU copies from (TierManager::Admit), when that one has room.
  if (may_allocate) {
    allocate = [this, len = object->len(), part = object->home_part()] {
      return pool_.Allocate(len, part);
    };
  }
  // A reload that joins a read already running copies once the read ended.
  ObjectWaiter join = [then](absl::Status read) {
    if (read.ok()) {
      (*then)(Readable{});
    } else {
      (*then)(std::move(read));
    }
  };
  storage::Extent extent;
  storage::SpillRecord record;
  switch (table->BeginFetch(*object, reader, allocate, std::move(join), &extent, &record)) {
    case ObjectTable::Fetch::kNoRoom:
      return false;
    case ObjectTable::Fetch::kJoined:
      if (!prefetch) return true;  // `join` runs when the read ends
      [[fallthrough]];             // someone else's read brings it back: nothing to do
    case ObjectTable::Fetch::kInHost:
    case ObjectTable::Fetch::kGone:
      if (prefetch) Settle(table->Unpin(*object));
      (*then)(Readable{});
      return true;
    case ObjectTable::Fetch::kStarted:
      break;
  }
  if (prefetch) counters_.prefetches.fetch_add(1, std::memory_order_relaxed);
  reads_in_flight_.fetch_add(1);
  std::shared_ptr<engine::SourceFeed> feed;
  std::shared_ptr<FetchLease> lease;
  if (!prefetch) {
    // The copy onward starts now and takes each chunk as the read verifies it; the last chunk
    // only with the feed's end, after EndFetch settled the object. Chunks of whole I/Os, at most
    // 64 per object (each is a copy issued on a GPU).
    const uint64_t io = store_.io_bytes();
    const uint64_t ios = (object->len() + io - 1) / io;
    feed = std::make_shared<engine::SourceFeed>(object->len(), io * ((ios + 63) / 64));
    lease = std::make_shared<FetchLease>(*this, extent);
    (*then)(Readable{feed, lease, extent});
  }
  auto finish = [this, table, object, record, prefetch, feed, lease, extent,
                 then](absl::Status read) {
    if (lease != nullptr && read.ok()) lease->owned_by_object.store(true);
    EndFetch(table, object, record, prefetch, feed, extent, read);
    if (prefetch) (*then)(Readable{});
    {
      MutexLock lock(&mu_);  // signalled under it: see the write's landing above
      reads_in_flight_.fetch_sub(1);
      io_done_cv_.SignalAll();
    }
  };
  storage::SpillStore::ReadProgress progress = nullptr;
  if (feed != nullptr) {
    progress = [feed](uint64_t verified) { feed->Advance(std::min(verified, feed->len() - 1)); };
  }
  if (absl::Status started = store_.Read(record, pool_.At(extent), finish, std::move(progress));
      !started.ok()) {
    finish(started);
  }
  return true;
}

void Spiller::EndFetch(const std::shared_ptr<ObjectTable>& table,
                       const std::shared_ptr<Object>& object, const storage::SpillRecord& record,
                       bool prefetch, const std::shared_ptr<engine::SourceFeed>& feed,
                       storage::Extent extent, absl::Status read) {
  std::vector<ObjectWaiter> waiters;
  bool spillable = false;
  // Counted before anyone can see the object back in host memory or the reload complete.
  if (read.ok()) {
    counters_.fetches.fetch_add(1);
    counters_.bytes_fetched.fetch_add(record.len);
    counters_.fetch_bandwidth.Add(record.len, MonotonicMs());
    if (prefetch) counters_.bytes_prefetched.fetch_add(record.len);
  }
  // A failed pipelined read's extent stays with its lease: the copy may still read it.
  Release release =
      table->EndFetch(*object, read, prefetch, /*detach=*/feed != nullptr, &spillable, &waiters);
  if (feed != nullptr) {
    if (!read.ok()) {
      // What the copy onward must still deliver is zeros, never unverified bytes.
      uint64_t ready = feed->ready();
      std::memset(pool_.At(extent) + ready, 0, extent.bytes - ready);
    }
    feed->End(read);
  }
  Settle(release);
  if (read.ok() && spillable) Track(table, object);
  // (A failed read was logged and counted by the store. A failed prefetch is not retried: a
  // reload reads again and reports its own result.)
  for (auto& waiter : waiters) waiter(read);
}

void Spiller::CopyEnded() {
  copies_in_flight_.fetch_sub(1);
  NotifyFreed();  // its memory may be spillable or free now
}

void Spiller::NotifyFreed() {
  last_change_ms_.store(MonotonicMs());
  {
    MutexLock lock(&mu_);
    if (!admission_.HasWaiters() && (spilled_.empty() || max_prefetches_ == 0)) return;
    kicked_ = true;
  }
  cv_.Signal();
}

}  // namespace tier::daemon
