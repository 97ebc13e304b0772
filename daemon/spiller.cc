#include "daemon/spiller.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "daemon/object_memory.h"

namespace tier::daemon {

Spiller::Spiller(storage::HostPool& pool, storage::SpillStore& store, SpillerOptions options)
    : pool_(pool), store_(store), policy_(options.watermarks),
      max_prefetches_(options.max_prefetches), stall_ms_(options.stall_ms),
      last_change_ms_(MonotonicMs()) {}

Spiller::~Spiller() { Stop(); }

void Spiller::Start() { thread_ = std::thread([this] { Run(); }); }

void Spiller::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Writes and prefetch reads call back into the spiller when they land: wait for them while the
  // store still runs (it goes after the spiller). Bounded: a device that never answers is logged.
  for (int i = 0; writes_in_flight_.load() + reads_in_flight_.load() > 0; ++i) {
    if (i == 30000) {
      LogError("spiller stopping with NVMe I/O still in flight after 30 s");
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void Spiller::Track(const std::shared_ptr<Session>& session,
                    const std::shared_ptr<Object>& object) {
  last_change_ms_.store(MonotonicMs());
  {
    std::lock_guard lock(mu_);
    candidates_.Add(NextUseOf(*object), Candidate{session, object});
  }
  Kick();
}

void Spiller::Kick() {
  // Only above the high watermark, or while an episode waits for candidates: between the marks
  // every completed offload calls this, and the thread has nothing to do for it.
  if (!draining_.load(std::memory_order_relaxed) && !policy_.MustSpill(pool_.Usage())) return;
  {
    std::lock_guard lock(mu_);
    kicked_ = true;
  }
  cv_.notify_one();
}

storage::PoolUsage Spiller::Projected() const {
  storage::PoolUsage usage = pool_.Usage();
  uint64_t writing = std::min(writing_bytes_.load(), usage.used_bytes);
  usage.used_bytes -= writing;
  usage.free_bytes += writing;
  return usage;
}

void Spiller::Run() {
  std::unique_lock lock(mu_);
  for (;;) {
    // With offloads parked, look again every few ms even without a kick.
    cv_.wait_for(lock, std::chrono::milliseconds(waiters_ == 0 ? 1000 : 5),
                 [&] { return stopping_ || kicked_; });
    if (stopping_) {
      lock.unlock();
      ServeWaiters(Serve::kStop);
      return;
    }
    kicked_ = false;
    bool parked = waiters_ > 0;
    lock.unlock();
    // Above the high watermark: down to the low one, counting writes in flight as done (their
    // extents go soon). A parked offload needs at least one spill whatever the watermarks say.
    // An episode that ran out of candidates goes on when new ones arrive.
    if (policy_.MustSpill(Projected())) draining_.store(true);
    bool spilled_any = false, exhausted = false;
    while ((draining_.load() && policy_.KeepSpilling(Projected())) || (parked && !spilled_any)) {
      if (writes_in_flight_.load() >= 64) {  // enough queued; the store works through them
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
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
      ServeWaiters(stuck ? Serve::kStuck : Serve::kTry);
    } else if (!draining_.load()) {
      Prefetch();
    }
    lock.lock();
  }
}

bool Spiller::SpillOne() {
  std::vector<Candidate> busy;  // in use right now: back in the queue after this call
  auto requeue = [&] {
    std::lock_guard lock(mu_);
    for (Candidate& c : busy) {
      if (auto object = c.object.lock()) candidates_.Add(NextUseOf(*object), std::move(c));
    }
  };
  for (;;) {
    std::optional<Candidate> candidate;
    {
      std::lock_guard lock(mu_);
      if (!stopping_) candidate = candidates_.TakeUsedLast();
    }
    if (!candidate) {
      requeue();
      return false;
    }
    std::shared_ptr<Session> session = candidate->session.lock();
    std::shared_ptr<Object> object = candidate->object.lock();
    if (session == nullptr || object == nullptr) continue;  // gone meanwhile
    const char* src = nullptr;
    uint64_t extent_bytes = 0;
    {
      std::lock_guard lock(session->mu());
      if (object->dropped || object->state != Object::State::kReady ||
          object->where != Object::Where::kHost) {
        continue;
      }
      if (object->pins > 0) {  // a reload uses it: try it again later, after the others
        busy.push_back(std::move(*candidate));
        continue;
      }
      object->where = Object::Where::kSpilling;
      object->prefetched = false;
      ++object->pins;  // the write reads the extent
      src = pool_.At(object->extent);
      extent_bytes = object->extent.bytes;
    }
    writes_in_flight_.fetch_add(1);
    writing_bytes_.fetch_add(extent_bytes);
    absl::Status started = store_.Write(
        src, object->len,
        [this, session, object, extent_bytes](absl::StatusOr<storage::SpillRecord> record) {
          writes_in_flight_.fetch_sub(1);
          bool keep_record = false;
          Released released;
          {
            std::lock_guard lock(session->mu());
            if (record.ok() && object->pins == 1 && !object->dropped) {
              pool_.Free(object->extent);
              object->extent = {};
              object->spill = *record;
              object->where = Object::Where::kNvme;
              keep_record = true;
            } else {
              // Failed, or used or freed during the write: the host copy stays (or goes with the
              // last unpin); the record is not needed.
              object->where = Object::Where::kHost;
            }
            released = UnpinObjectLocked(*session, *object, pool_, &store_);
          }
          writing_bytes_.fetch_sub(extent_bytes);  // after the extent went back (or stays)
          if (!record.ok()) {
            // (The store logged it.) The object stays in host memory and is no candidate any
            // more, so a failing device is not hammered; it becomes one again once filled anew.
            if (released == Released::kHost) NotifyFreed();
            return;
          }
          if (!keep_record) {
            (void)store_.Free(*record);
            if (released == Released::kHost) NotifyFreed();
            return;
          }
          counters_.spills.fetch_add(1);
          counters_.bytes_spilled.fetch_add(object->len);
          counters_.spill_bandwidth.Add(object->len, MonotonicMs());
          {
            std::lock_guard lock(mu_);
            spilled_.Add(NextUseOf(*object), Candidate{session, object});
          }
          NotifyFreed();
        });
    if (!started.ok()) {
      writes_in_flight_.fetch_sub(1);
      writing_bytes_.fetch_sub(extent_bytes);
      {
        std::lock_guard lock(session->mu());
        object->where = Object::Where::kHost;
        (void)UnpinObjectLocked(*session, *object, pool_, &store_);
      }
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
      std::lock_guard lock(mu_);
      if (stopping_ || waiters_ > 0) return;  // parked offloads need the room more
      candidate = spilled_.TakeUsedSoonest();
    }
    if (!candidate) return;
    std::shared_ptr<Session> session = candidate->session.lock();
    std::shared_ptr<Object> object = candidate->object.lock();
    if (session == nullptr || object == nullptr) continue;
    {
      std::lock_guard lock(session->mu());
      // Fetched by a reload meanwhile (or freed): nothing to prefetch.
      if (object->dropped || object->where != Object::Where::kNvme) continue;
      if (!policy_.MayPrefetch(pool_.Usage(), object->len)) {
        std::lock_guard own(mu_);
        spilled_.Add(NextUseOf(*object), std::move(*candidate));
        return;
      }
      ++object->pins;  // the read writes into its new extent
    }
    prefetches_in_flight_.fetch_add(1);
    std::function<void(absl::Status)> done = [this](absl::Status) {
      prefetches_in_flight_.fetch_sub(1);
      {
        std::lock_guard lock(mu_);
        kicked_ = true;  // the next one
      }
      cv_.notify_one();
    };
    if (!StartFetch(session, object, FetchKind::kPrefetch, done, nullptr)) {
      prefetches_in_flight_.fetch_sub(1);
      {
        std::lock_guard lock(session->mu());
        (void)UnpinObjectLocked(*session, *object, pool_, &store_);
      }
      std::lock_guard own(mu_);
      spilled_.Add(NextUseOf(*object), std::move(*candidate));
      return;
    }
  }
}

void Spiller::NoteReloadLocked(Object& object) {
  if (object.where == Object::Where::kNvme || object.where == Object::Where::kFetching) {
    counters_.prefetch_misses.fetch_add(1, std::memory_order_relaxed);
  } else if (object.prefetched) {
    counters_.prefetch_hits.fetch_add(1, std::memory_order_relaxed);
  }
  object.prefetched = false;
}

void Spiller::Fetch(const std::shared_ptr<Session>& session, const std::shared_ptr<Object>& object,
                    std::function<void(absl::Status)> then, Pipelined pipelined) {
  const FetchKind kind = pipelined ? FetchKind::kPipelined : FetchKind::kReload;
  // Behind jobs already waiting for room, unless no room is needed (a read already runs).
  if (StartFetch(session, object, kind, then, pipelined, /*may_allocate=*/!HasWaiters())) return;
  // Like an offload: wait for the spiller to make room, fail only when none can come.
  auto shared_then = std::make_shared<std::function<void(absl::Status)>>(std::move(then));
  const uint64_t len = object->len;
  WaitForRoom(
      session->id(),
      [this, session, object, kind, shared_then, pipelined = std::move(pipelined)]() {
        return StartFetch(session, object, kind, *shared_then, pipelined);
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
    if (!owned_by_object.load()) {
      spiller.pool_.Free(extent);
      spiller.NotifyFreed();
    }
  }
  Spiller& spiller;
  const storage::Extent extent;
  std::atomic<bool> owned_by_object{false};
};

bool Spiller::StartFetch(const std::shared_ptr<Session>& session,
                         const std::shared_ptr<Object>& object, FetchKind kind,
                         std::function<void(absl::Status)>& then, const Pipelined& pipelined,
                         bool may_allocate) {
  const bool prefetch = kind == FetchKind::kPrefetch;
  storage::SpillRecord record;
  char* dst = nullptr;
  std::shared_ptr<gpu::SourceFeed> feed;
  std::shared_ptr<FetchLease> lease;
  {
    std::lock_guard lock(session->mu());
    switch (object->where) {
      case Object::Where::kHost:
      case Object::Where::kSpilling:  // the host copy is intact until the write lands
        break;
      case Object::Where::kFetching:
        if (prefetch) break;  // someone else's read brings it back: nothing to do
        object->on_host.push_back(std::move(then));  // shares the read, copies after it
        return true;
      case Object::Where::kNvme: {
        if (!may_allocate) return false;
        std::optional<storage::Extent> extent = pool_.Allocate(object->len);
        if (!extent) return false;
        object->extent = *extent;
        object->where = Object::Where::kFetching;
        record = object->spill;
        dst = pool_.At(*extent);
        if (kind == FetchKind::kPipelined) {
          // Chunks of whole I/Os, at most 64 per object (each is a wait and a copy on a GPU).
          const uint64_t io = store_.io_bytes();
          const uint64_t ios = (object->len + io - 1) / io;
          feed = std::make_shared<gpu::SourceFeed>(object->len, io * ((ios + 63) / 64));
          lease = std::make_shared<FetchLease>(*this, *extent);
        } else {
          object->on_host.push_back(std::move(then));
        }
        break;
      }
    }
  }
  if (dst == nullptr) {  // in host memory, or a read already runs (prefetch)
    if (prefetch) {
      std::lock_guard lock(session->mu());
      (void)UnpinObjectLocked(*session, *object, pool_, &store_);
    }
    then(absl::OkStatus());
    return true;
  }
  if (prefetch) counters_.prefetches.fetch_add(1, std::memory_order_relaxed);
  reads_in_flight_.fetch_add(1);
  // The copy onward starts now and takes each chunk as the read verifies it; the last chunk
  // only with the feed's end, after EndFetch settled the object.
  if (feed != nullptr) pipelined(feed, lease);
  auto finish = [this, session, object, record, prefetch, feed, lease](absl::Status read) {
    if (lease != nullptr && read.ok()) lease->owned_by_object.store(true);
    EndFetch(session, object, record, prefetch, feed, std::move(read));
    reads_in_flight_.fetch_sub(1);
  };
  storage::SpillStore::ReadProgress progress = nullptr;
  if (feed != nullptr) {
    progress = [feed](uint64_t verified) { feed->Advance(std::min(verified, feed->len() - 1)); };
  }
  if (absl::Status started = store_.Read(record, dst, finish, std::move(progress));
      !started.ok()) {
    finish(started);
  }
  return true;
}

void Spiller::EndFetch(const std::shared_ptr<Session>& session,
                       const std::shared_ptr<Object>& object, const storage::SpillRecord& record,
                       bool prefetch, const std::shared_ptr<gpu::SourceFeed>& feed,
                       absl::Status read) {
  std::vector<std::function<void(absl::Status)>> waiters;
  Released released = Released::kNothing;
  bool track = false;
  storage::Extent detached;  // a failed pipelined read's extent: the copy may still read it
  {
    std::lock_guard lock(session->mu());
    waiters.swap(object->on_host);
    if (read.ok()) {
      object->where = Object::Where::kHost;
      object->spill = {};
      object->prefetched = prefetch;
      (void)store_.Free(record);
    } else {  // the bytes stay on NVMe; the host extent goes back
      if (feed != nullptr) {
        detached = object->extent;  // returned by the lease once the copy is done too
      } else {
        pool_.Free(object->extent);
      }
      object->extent = {};
      object->where = Object::Where::kNvme;
    }
    if (prefetch) released = UnpinObjectLocked(*session, *object, pool_, &store_);
    track = read.ok() && !object->dropped;
  }
  if (feed != nullptr) {
    if (!read.ok()) {
      // What the copy onward must still deliver is zeros, never unverified bytes.
      uint64_t ready = feed->ready();
      std::memset(pool_.At(detached) + ready, 0, detached.bytes - ready);
    }
    feed->End(read);
  }
  if (read.ok()) {
    counters_.fetches.fetch_add(1);
    counters_.bytes_fetched.fetch_add(record.len);
    counters_.fetch_bandwidth.Add(record.len, MonotonicMs());
    if (prefetch) counters_.bytes_prefetched.fetch_add(record.len);
    if (track) Track(session, object);
  }
  // (A failed read was logged and counted by the store. A failed prefetch is not retried: a
  // reload reads again and reports its own result.)
  if (released == Released::kHost || (!read.ok() && feed == nullptr)) NotifyFreed();
  for (auto& waiter : waiters) waiter(read);
}

void Spiller::CopyEnded() {
  copies_in_flight_.fetch_sub(1);
  NotifyFreed();  // its memory may be spillable or free now
}

void Spiller::WaitForRoom(uint64_t queue, std::function<bool()> try_now,
                          std::function<void()> give_up) {
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      // The stall clock starts no earlier than the wait: an idle daemon has not "stalled" (it
      // used to fail the first job to find the pool full after 5 s without traffic).
      if (waiters_ == 0) last_change_ms_.store(MonotonicMs());
      waiting_[queue].push_back(
          Waiter{next_waiter_seq_++, std::move(try_now), std::move(give_up)});
      ++waiters_;
      has_waiters_.store(true);
      kicked_ = true;
      cv_.notify_one();
      return;
    }
  }
  give_up();
}

bool Spiller::HasWaiters() { return has_waiters_.load(); }

void Spiller::NotifyFreed() {
  last_change_ms_.store(MonotonicMs());
  {
    std::lock_guard lock(mu_);
    if (waiters_ == 0 && (spilled_.empty() || max_prefetches_ == 0)) return;
    kicked_ = true;
  }
  cv_.notify_one();
}

std::vector<uint64_t> Spiller::QueueOrderLocked() const {
  std::vector<uint64_t> order;
  auto start = waiting_.lower_bound(next_queue_);
  for (auto it = start; it != waiting_.end(); ++it) order.push_back(it->first);
  for (auto it = waiting_.begin(); it != start; ++it) order.push_back(it->first);
  return order;
}

void Spiller::ServeWaiters(Serve mode) {
  if (mode == Serve::kStop) {
    std::vector<Waiter> all;
    {
      std::lock_guard lock(mu_);
      for (auto& [queue, waiters] : waiting_) {
        for (Waiter& waiter : waiters) all.push_back(std::move(waiter));
      }
      waiting_.clear();
    }
    for (Waiter& waiter : all) waiter.give_up();
    std::lock_guard lock(mu_);
    waiters_ -= all.size();
    if (waiters_ == 0) has_waiters_.store(false);
    return;
  }
  bool served_any = false;
  uint64_t oldest_queue = 0, oldest_seq = ~uint64_t{0};  // of the last round's waiters
  for (;;) {
    // One round: the first waiter of each queue, the queues in turn from the one after the first
    // of the last round. Rounds go on while someone gets room.
    std::vector<uint64_t> order;
    {
      std::lock_guard lock(mu_);
      order = QueueOrderLocked();
      if (!order.empty()) next_queue_ = order.front() + 1;
    }
    bool served = false;
    oldest_seq = ~uint64_t{0};
    for (uint64_t queue : order) {
      Waiter waiter;
      {
        std::lock_guard lock(mu_);
        auto it = waiting_.find(queue);
        if (it == waiting_.end() || it->second.empty()) continue;
        // Out of its queue while tried, but still counted: a new job must not overtake it.
        waiter = std::move(it->second.front());
        it->second.pop_front();
      }
      const bool got_room = waiter.try_now();
      std::lock_guard lock(mu_);
      // (Only this thread removes queues; new waiters may have joined this one meanwhile.)
      std::deque<Waiter>& waiters = waiting_[queue];
      if (got_room) {
        served = true;
        --waiters_;
        if (waiters.empty()) waiting_.erase(queue);
        continue;
      }
      if (waiter.seq < oldest_seq) {
        oldest_seq = waiter.seq;
        oldest_queue = queue;
      }
      waiters.push_front(std::move(waiter));  // still first
    }
    served_any |= served;
    if (!served) break;
  }
  // Stuck, and nobody found room (someone who did would have started a copy, which may free
  // memory): only the oldest gives up. Its end may be what the others wait for (a GPU lane
  // released by its ticket); if not, the next round finds them stuck again.
  if (mode == Serve::kStuck && !served_any && oldest_seq != ~uint64_t{0}) {
    Waiter doomed;
    {
      std::lock_guard lock(mu_);
      auto it = waiting_.find(oldest_queue);
      if (it != waiting_.end() && !it->second.empty() && it->second.front().seq == oldest_seq) {
        doomed = std::move(it->second.front());
        it->second.pop_front();
      }
    }
    if (doomed.give_up) {
      doomed.give_up();
      std::lock_guard lock(mu_);
      --waiters_;
      auto it = waiting_.find(oldest_queue);
      if (it != waiting_.end() && it->second.empty()) waiting_.erase(it);
    }
  }
  std::lock_guard lock(mu_);
  if (waiters_ == 0) has_waiters_.store(false);
}

}  // namespace tier::daemon
