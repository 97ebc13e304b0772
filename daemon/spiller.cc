#include "daemon/spiller.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace tier::daemon {

Spiller::Spiller(storage::HostPool& pool, storage::SpillStore& store, SpillerOptions options)
    : pool_(pool), store_(store), options_(options) {}

Spiller::~Spiller() { Stop(); }

void Spiller::Start() { thread_ = std::thread([this] { Run(); }); }

void Spiller::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Spiller::Track(const std::shared_ptr<Session>& session,
                    const std::shared_ptr<Object>& object) {
  Key key = object->hint != 0 ? Key{0, ~uint64_t{0} - object->hint} : Key{1, object->seq};
  {
    std::lock_guard lock(mu_);
    candidates_.emplace(key, Candidate{session, object});
  }
  Kick();
}

void Spiller::Kick() {
  if (!AboveHigh()) return;
  {
    std::lock_guard lock(mu_);
    kicked_ = true;
  }
  cv_.notify_one();
}

bool Spiller::AboveHigh() const {
  storage::PoolUsage usage = pool_.Usage();
  return usage.used_bytes * 100 > usage.capacity_bytes * options_.high_pct;
}

bool Spiller::AboveLow() const {
  storage::PoolUsage usage = pool_.Usage();
  return usage.used_bytes * 100 > usage.capacity_bytes * options_.low_pct;
}

void Spiller::Run() {
  std::unique_lock lock(mu_);
  for (;;) {
    // With offloads parked, look again every few ms even without a kick.
    cv_.wait_for(lock, std::chrono::milliseconds(waiting_.empty() ? 1000 : 5),
                 [&] { return stopping_ || kicked_; });
    if (stopping_) {
      lock.unlock();
      ServeWaiters(/*stuck=*/true);
      return;
    }
    kicked_ = false;
    bool parked = !waiting_.empty();
    lock.unlock();
    // Down to the low watermark, counting writes in flight as done (their extents go soon).
    bool spilled_any = false, exhausted = false;
    while (AboveLow() || (parked && !spilled_any)) {
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
    if (parked) {
      // Stuck: nothing could be spilled and no write will free anything.
      ServeWaiters(/*stuck=*/exhausted && !spilled_any && writes_in_flight_.load() == 0);
    }
    lock.lock();
  }
}

bool Spiller::SpillOne() {
  size_t budget;  // each candidate looked at once per call (pinned ones go back in the set)
  {
    std::lock_guard lock(mu_);
    budget = candidates_.size();
  }
  for (;; --budget) {
    Candidate candidate;
    {
      std::lock_guard lock(mu_);
      if (budget == 0 || candidates_.empty() || stopping_) return false;
      candidate = candidates_.begin()->second;
      candidates_.erase(candidates_.begin());
    }
    std::shared_ptr<Session> session = candidate.session.lock();
    std::shared_ptr<Object> object = candidate.object.lock();
    if (session == nullptr || object == nullptr) continue;  // gone meanwhile
    const char* src = nullptr;
    {
      std::lock_guard lock(session->mu());
      if (object->dropped || object->state != Object::State::kReady ||
          object->where != Object::Where::kHost) {
        continue;
      }
      if (object->pins > 0) {
        // In use right now (a reload): try it again later, after the others.
        std::lock_guard own(mu_);
        candidates_.emplace(Key{2, object->seq}, candidate);
        continue;
      }
      object->where = Object::Where::kSpilling;
      ++object->pins;  // the write reads the extent
      src = pool_.At(object->extent);
    }
    writes_in_flight_.fetch_add(1);
    absl::Status started = store_.Write(
        src, object->len, [this, session, object](absl::StatusOr<storage::SpillRecord> record) {
          writes_in_flight_.fetch_sub(1);
          bool release_record = false;
          {
            std::lock_guard lock(session->mu());
            --object->pins;
            if (!record.ok()) {
              object->where = Object::Where::kHost;
            } else if (object->pins > 0 || object->dropped) {
              // Used or freed during the write: the host copy stays (or goes with its last
              // unpin); the record is not needed.
              object->where = Object::Where::kHost;
              release_record = true;
            } else {
              pool_.Free(object->extent);
              object->extent = {};
              object->spill = *record;
              object->where = Object::Where::kNvme;
            }
            if (object->dropped && object->pins == 0 && object->where == Object::Where::kHost &&
                object->extent.bytes != 0) {
              pool_.Free(object->extent);
              object->extent = {};
              session->used_bytes() -= object->charged;
            }
          }
          if (!record.ok()) {
            counters_.write_errors.fetch_add(1);
            LogWarning("spill write failed: ", record.status().ToString());
            return;
          }
          if (release_record) {
            (void)store_.Free(*record);
            return;
          }
          counters_.spills.fetch_add(1);
          counters_.bytes_spilled.fetch_add(object->len);
          NotifyFreed();
        });
    if (!started.ok()) {
      writes_in_flight_.fetch_sub(1);
      std::lock_guard lock(session->mu());
      --object->pins;
      object->where = Object::Where::kHost;
      if (!absl::IsResourceExhausted(started)) {
        LogWarning("spill write not started: ", started.ToString());
      }
      return false;  // NVMe full or closing: nothing more to do now
    }
    return true;
  }
}

void Spiller::Fetch(const std::shared_ptr<Session>& session, const std::shared_ptr<Object>& object,
                    std::function<void(absl::Status)> then) {
  storage::SpillRecord record;
  char* dst = nullptr;
  bool on_host = false;
  bool no_room = false;
  {
    std::lock_guard lock(session->mu());
    switch (object->where) {
      case Object::Where::kHost:
      case Object::Where::kSpilling:  // the host copy is intact until the write lands
        on_host = true;
        break;
      case Object::Where::kFetching:
        object->on_host.push_back(std::move(then));
        return;
      case Object::Where::kNvme: {
        std::optional<storage::Extent> extent = pool_.Allocate(object->len);
        if (!extent) {
          no_room = true;
          break;
        }
        object->extent = *extent;
        object->where = Object::Where::kFetching;
        object->on_host.push_back(std::move(then));
        record = object->spill;
        dst = pool_.At(*extent);
        break;
      }
    }
  }
  if (on_host) {
    then(absl::OkStatus());
    return;
  }
  if (no_room) {
    // Like an offload: wait for the spiller to make room, fail only when none can come.
    const uint64_t len = object->len;
    WaitForRoom([this, session, object, then = std::move(then), len](bool room) mutable {
      if (room) {
        Fetch(session, object, std::move(then));
      } else {
        then(absl::ResourceExhaustedError(absl::StrCat(
            "host pool full and nothing can be spilled: no room to bring back ", len,
            " spilled bytes")));
      }
    });
    return;
  }
  auto finish = [this, session, object, record](absl::Status read) {
    std::vector<std::function<void(absl::Status)>> waiters;
    {
      std::lock_guard lock(session->mu());
      waiters.swap(object->on_host);
      if (read.ok()) {
        object->where = Object::Where::kHost;
        object->spill = {};
      } else {  // the bytes stay on NVMe; the host extent goes back
        pool_.Free(object->extent);
        object->extent = {};
        object->where = Object::Where::kNvme;
      }
    }
    if (read.ok()) {
      (void)store_.Free(record);
      counters_.fetches.fetch_add(1);
      counters_.bytes_fetched.fetch_add(record.len);
      Track(session, object);
    } else if (absl::IsDataLoss(read)) {
      counters_.checksum_failures.fetch_add(1);
      LogError(read.ToString());
    } else {
      counters_.read_errors.fetch_add(1);
      LogWarning("fetch from NVMe failed: ", read.ToString());
    }
    for (auto& waiter : waiters) waiter(read);
  };
  if (absl::Status started = store_.Read(record, dst, finish); !started.ok()) finish(started);
}

void Spiller::Release(const storage::SpillRecord& record) {
  (void)store_.Free(record);
  {
    std::lock_guard lock(mu_);
    nvme_full_ = false;
  }
}

void Spiller::WaitForRoom(std::function<void(bool room)> retry) {
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      waiting_.push_back(std::move(retry));
      kicked_ = true;
      cv_.notify_one();
      return;
    }
  }
  retry(false);
}

void Spiller::NotifyFreed() {
  std::lock_guard lock(mu_);
  if (waiting_.empty()) return;
  kicked_ = true;
  cv_.notify_one();
}

void Spiller::ServeWaiters(bool stuck) {
  std::vector<std::function<void(bool)>> waiters;
  {
    std::lock_guard lock(mu_);
    waiters.swap(waiting_);
  }
  // Each either succeeds, parks again (a new entry for the next round) or, stuck, fails.
  for (auto& retry : waiters) retry(!stuck);
}

}  // namespace tier::daemon
