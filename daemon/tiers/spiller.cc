#include "daemon/tiers/spiller.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "common/log.h"
#include "common/mutex.h"
#include "daemon/tiers/spill_read.h"
#include "daemon/tiers/spill_write.h"

namespace tier::daemon {

Spiller::Spiller(NvmeTransfers& transfers, AdmissionQueue& admission, SpillerOptions options)
    : transfers_(transfers), pool_(transfers.pool()), admission_(admission),
      policy_(options.watermarks), max_prefetches_(options.max_prefetches),
      stall_ms_(options.stall_ms), last_change_ms_(MonotonicMs()) {
  transfers_.Listen(this);
}

Spiller::~Spiller() { Stop(); }

void Spiller::Start() { thread_ = std::thread([this] { Run(); }); }

void Spiller::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  transfers_.Close();  // a thread waiting for a write slot gives up
  if (thread_.joinable()) thread_.join();
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

storage::PoolUsage Spiller::Projected() const { return transfers_.ProjectedUsage(); }

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

void Spiller::Run() {
  while (AwaitKick()) {
    bool parked = admission_.HasWaiters();
    // Above the high watermark: down to the low one, counting writes in flight as done (their
    // extents go soon). A waiting job needs at least one spill whatever the watermarks say.
    // An episode that ran out of candidates goes on when new ones arrive.
    if (policy_.MustSpill(Projected())) draining_.store(true);
    bool spilled_any = false, exhausted = false;
    while ((draining_.load() && policy_.KeepSpilling(Projected())) || (parked && !spilled_any)) {
      if (transfers_.writes_in_flight() >= kMaxWritesInFlight) {
        // Enough queued; the store works through them.
        if (!transfers_.AwaitWriteSlot(kMaxWritesInFlight)) break;  // stopping
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
      bool stuck = exhausted && !spilled_any && transfers_.in_flight() == 0 && idle;
      admission_.Serve(stuck ? AdmissionQueue::Mode::kStuck : AdmissionQueue::Mode::kTry);
    } else if (!draining_.load()) {
      Prefetch();
    }
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
    switch (SpillWrite::Begin(transfers_, table, object)) {
      case SpillWrite::Start::kNot:
        continue;
      case SpillWrite::Start::kBusy:  // a reload uses it: try it again later
        busy.push_back(std::move(*candidate));
        continue;
      case SpillWrite::Start::kRefused:  // NVMe full or closing: nothing more to do now
        busy.push_back(std::move(*candidate));  // still a candidate once NVMe has room
        requeue();
        return false;
      case SpillWrite::Start::kStarted:
        requeue();
        return true;
    }
  }
}

void Spiller::Spilled(const std::shared_ptr<ObjectTable>& table,
                      const std::shared_ptr<Object>& object) {
  MutexLock lock(&mu_);
  spilled_.Add(NextUseOf(*object), Candidate{table, object});
  NoteSpilled();
}

void Spiller::Prefetch() {
  while (prefetches_in_flight_.load() < max_prefetches_) {
    std::optional<Candidate> candidate;
    {
      MutexLock lock(&mu_);
      if (stopping_ || admission_.HasWaiters()) return;  // waiting jobs need the room more
      candidate = spilled_.TakeUsedSoonest();
      NoteSpilled();
    }
    if (!candidate) return;
    std::shared_ptr<ObjectTable> table = candidate->table.lock();
    std::shared_ptr<Object> object = candidate->object.lock();
    if (table == nullptr || object == nullptr) continue;
    if (!policy_.MayPrefetch(pool_.Usage(), object->len())) {
      MutexLock own(&mu_);
      spilled_.Add(NextUseOf(*object), std::move(*candidate));
      NoteSpilled();
      return;
    }
    // Fetched by a reload meanwhile (or freed): nothing to prefetch.
    if (!table->PinIfOnNvme(*object)) continue;  // the read writes into its new extent
    constexpr ObjectTable::Reader kReader = ObjectTable::Reader::kPrefetch;
    ObjectTable::FetchBegun begun = table->BeginFetch(
        *object, kReader, [this, &object] { return transfers_.AllocateFetch(*object); });
    if (begun.fetch == ObjectTable::Fetch::kNoRoom) {
      Release unpinned = table->Unpin(*object);
      MutexLock own(&mu_);
      spilled_.Add(NextUseOf(*object), std::move(*candidate));
      NoteSpilled();
      return;
    }
    // In host memory meanwhile, a reload's read running, or freed: nothing to read (its pin went
    // with `begun.released`).
    if (begun.fetch != ObjectTable::Fetch::kStarted) continue;
    prefetches_in_flight_.fetch_add(1);
    SpillRead::Start(transfers_, table, object, kReader, begun, [this](absl::StatusOr<Readable>) {
      prefetches_in_flight_.fetch_sub(1);
      {
        MutexLock lock(&mu_);
        kicked_ = true;  // the next one
      }
      cv_.Signal();
    });
  }
}

void Spiller::CopyEnded() {
  copies_in_flight_.fetch_sub(1);
  NotifyFreed();  // its memory may be spillable or free now
}

void Spiller::NotifyFreed() {
  // Stored only when the millisecond changed, and the lock taken only when the spiller has
  // something to do with the room: every GPU's threads call this on every job's end (issue 26).
  const uint64_t now = MonotonicMs();
  if (last_change_ms_.load(std::memory_order_relaxed) != now) last_change_ms_.store(now);
  if (!admission_.HasWaiters() && !prefetchable_.load(std::memory_order_acquire)) return;
  {
    MutexLock lock(&mu_);
    kicked_ = true;
  }
  cv_.Signal();
}

}  // namespace tier::daemon
