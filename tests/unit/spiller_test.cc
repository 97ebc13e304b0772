// The spiller over a real host pool and a real spill store (files in a temporary directory):
// watermarks, victim order, prefetch order and stop point, data intact both ways, and
// backpressure that cannot hang. Objects are made here the way the job executor makes them.
#include "daemon/spiller.h"

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/object_memory.h"
#include "gtest/gtest.h"
#include "spill_test_util.h"

namespace tier::daemon {
namespace {

using storage::testing::FillPattern;
using storage::testing::MatchesPattern;
using storage::testing::TempDir;

constexpr uint64_t kObject = 64 * 1024;
constexpr uint64_t kSlots = 64;  // pool of 4 MiB

class SpillerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    storage::HostPoolOptions pool_options;
    pool_options.bytes = kObject * kSlots;
    pool_options.lock = storage::LockMode::kOff;
    auto pool = storage::HostPool::Create(pool_options);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    storage::SpillStoreOptions store_options;
    store_options.directories = {dir_.path()};
    store_options.file_bytes = 64 << 20;
    store_options.io_bytes = 16 * 1024;  // several I/Os per object
    store_options.queue_depth = 8;
    store_options.registered_buffers = {storage::IoBuffer{pool_->base(), pool_->bytes()}};
    auto store = storage::SpillStore::Create(std::move(store_options));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    AttachToken token{};
    session_ = std::make_shared<Session>(1, "test", token, ~uint64_t{0}, 64);
  }

  // Every object made so far becomes a spill candidate before the spiller's thread starts, as if
  // their fills had all just completed; then the thread starts.
  void StartSpiller(Watermarks marks, uint32_t prefetches, bool track = true,
                    uint32_t stall_ms = 5000) {
    spiller_ = std::make_unique<Spiller>(*pool_, *store_,
                                         SpillerOptions{marks, prefetches, stall_ms});
    if (track) {
      for (auto& object : objects_) spiller_->Track(session_, object);
    }
    spiller_->Start();
  }

  void TearDown() override {
    if (spiller_) spiller_->Stop();
    // Let writes and reads in flight land before the objects' memory goes.
    for (int i = 0; i < 2000 && !Settled(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  // A filled object of kObject bytes with pattern `seq`, as an offload leaves it (not tracked).
  std::shared_ptr<Object> Offload(uint64_t seq, uint64_t hint = 0) {
    auto object = std::make_shared<Object>();
    std::optional<storage::Extent> extent = pool_->Allocate(kObject);
    if (!extent) {
      ADD_FAILURE() << "pool full at seq " << seq;
      return object;
    }
    object->extent = *extent;
    object->len = kObject;
    object->charged = extent->bytes;
    object->state = Object::State::kReady;
    object->seq = seq;
    object->hint = hint;
    FillPattern(pool_->At(*extent), kObject, seq);
    {
      std::lock_guard lock(session_->mu());
      session_->used_bytes() += object->charged;
    }
    objects_.push_back(object);
    return object;
  }

  // What a free does: the client drops it; memory returns at the last unpin.
  void Free(const std::shared_ptr<Object>& object) {
    Released released;
    {
      std::lock_guard lock(session_->mu());
      object->dropped = true;
      ++object->pins;
      released = UnpinObjectLocked(*session_, *object, *pool_, store_.get());
    }
    if (released == Released::kHost) spiller_->NotifyFreed();
  }

  Object::Where WhereIs(const Object& object) {
    std::lock_guard lock(session_->mu());
    return object.where;
  }

  // No I/O in flight: every live object is on one tier, not between.
  bool Settled() {
    std::lock_guard lock(session_->mu());
    for (auto& object : objects_) {
      if (object->dropped) continue;
      if (object->where == Object::Where::kSpilling || object->where == Object::Where::kFetching) {
        return false;
      }
    }
    return true;
  }

  // Waits until `done` holds and the tiers are settled (at most 10 s).
  template <typename Pred>
  bool WaitFor(Pred done) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (done() && Settled()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }

  uint64_t UsedPct() {
    storage::PoolUsage usage = pool_->Usage();
    return usage.used_bytes * 100 / usage.capacity_bytes;
  }

  TempDir dir_;
  std::unique_ptr<storage::HostPool> pool_;
  std::unique_ptr<storage::SpillStore> store_;
  std::shared_ptr<Session> session_;
  std::unique_ptr<Spiller> spiller_;
  std::vector<std::shared_ptr<Object>> objects_;
};

TEST_F(SpillerTest, SpillsTheOldestDownToTheLowWatermark) {
  for (uint64_t seq = 1; seq <= 40; ++seq) Offload(seq);  // 62% of the pool
  StartSpiller(Watermarks{50, 25}, /*prefetches=*/0);
  ASSERT_TRUE(WaitFor([&] { return UsedPct() <= 25; })) << "pool at " << UsedPct() << "%";
  // Exactly the oldest went to NVMe: every spilled seq is below every seq still in memory.
  uint64_t newest_spilled = 0, oldest_in_memory = ~uint64_t{0};
  for (auto& object : objects_) {
    if (WhereIs(*object) == Object::Where::kNvme) {
      newest_spilled = std::max(newest_spilled, object->seq);
    } else {
      oldest_in_memory = std::min(oldest_in_memory, object->seq);
    }
  }
  EXPECT_LT(newest_spilled, oldest_in_memory);
  EXPECT_EQ(newest_spilled, 24u);  // 40 objects, 16 stay (25% of 64 slots): no overshoot
  EXPECT_EQ(spiller_->counters().spills.load(), newest_spilled);
  EXPECT_EQ(spiller_->counters().bytes_spilled.load(), newest_spilled * kObject);
}

TEST_F(SpillerTest, NothingSpillsBetweenTheWatermarks) {
  for (uint64_t seq = 1; seq <= 30; ++seq) Offload(seq);  // 47%: under the high mark
  StartSpiller(Watermarks{50, 25}, /*prefetches=*/0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(spiller_->counters().spills.load(), 0u);
  for (auto& object : objects_) EXPECT_EQ(WhereIs(*object), Object::Where::kHost);
}

TEST_F(SpillerTest, HintsPickTheObjectsUsedLast) {
  // Hint = reload order: seq k is reloaded k-th, so the largest hints go first, although they
  // were offloaded last.
  for (uint64_t seq = 1; seq <= 40; ++seq) Offload(seq, /*hint=*/seq);
  StartSpiller(Watermarks{50, 25}, /*prefetches=*/0);
  ASSERT_TRUE(WaitFor([&] { return UsedPct() <= 25; }));
  uint64_t smallest_spilled = ~uint64_t{0}, largest_in_memory = 0;
  for (auto& object : objects_) {
    if (WhereIs(*object) == Object::Where::kNvme) {
      smallest_spilled = std::min(smallest_spilled, object->hint);
    } else {
      largest_in_memory = std::max(largest_in_memory, object->hint);
    }
  }
  EXPECT_GT(smallest_spilled, largest_in_memory);
}

TEST_F(SpillerTest, PrefetchBringsBackTheNextReloadsUpToTheLowWatermark) {
  for (uint64_t seq = 1; seq <= 40; ++seq) Offload(seq);
  StartSpiller(Watermarks{50, 25}, /*prefetches=*/2);
  ASSERT_TRUE(WaitFor([&] { return UsedPct() <= 25; }));
  std::vector<std::shared_ptr<Object>> spilled;
  for (auto& object : objects_) {
    if (WhereIs(*object) == Object::Where::kNvme) spilled.push_back(object);
  }
  ASSERT_GE(spilled.size(), 20u);
  // The training step reloads in reverse: the newest objects are reloaded and freed, which
  // empties the pool; prefetch then brings back the spilled objects reloaded next.
  std::vector<std::shared_ptr<Object>> in_memory;
  for (auto& object : objects_) {
    if (WhereIs(*object) == Object::Where::kHost) in_memory.push_back(object);
  }
  for (auto& object : in_memory) Free(object);
  ASSERT_TRUE(WaitFor([&] { return spiller_->counters().prefetches.load() >= 16; }))
      << spiller_->counters().prefetches.load() << " prefetches";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(WaitFor([] { return true; }));
  EXPECT_LE(UsedPct(), 25u);  // prefetching stops at the low watermark
  // The ones back are exactly the newest of the spilled (reloaded soonest), bytes intact.
  uint64_t oldest_back = ~uint64_t{0}, newest_still_out = 0;
  for (auto& object : spilled) {
    if (WhereIs(*object) == Object::Where::kHost) {
      oldest_back = std::min(oldest_back, object->seq);
      EXPECT_TRUE(MatchesPattern(pool_->At(object->extent), kObject, object->seq)) << object->seq;
      EXPECT_TRUE(object->prefetched);
    } else {
      newest_still_out = std::max(newest_still_out, object->seq);
    }
  }
  EXPECT_GT(oldest_back, newest_still_out);
  EXPECT_EQ(spiller_->counters().bytes_prefetched.load(),
            spiller_->counters().prefetches.load() * kObject);
  // Reloading a prefetched object counts a hit; a spilled one a miss.
  {
    std::lock_guard lock(session_->mu());
    for (auto& object : spilled) spiller_->NoteReloadLocked(*object);
  }
  EXPECT_EQ(spiller_->counters().prefetch_hits.load(), spiller_->counters().prefetches.load());
  EXPECT_EQ(spiller_->counters().prefetch_hits.load() + spiller_->counters().prefetch_misses.load(),
            spilled.size());
}

TEST_F(SpillerTest, FetchReturnsTheSpilledBytes) {
  for (uint64_t seq = 1; seq <= 40; ++seq) Offload(seq);
  StartSpiller(Watermarks{50, 25}, /*prefetches=*/0);
  ASSERT_TRUE(WaitFor([&] { return UsedPct() <= 25; }));
  std::shared_ptr<Object> first = objects_[0];
  ASSERT_EQ(WhereIs(*first), Object::Where::kNvme);
  {
    std::lock_guard lock(session_->mu());
    ++first->pins;  // the reload's pin
  }
  std::promise<absl::Status> fetched;
  spiller_->Fetch(session_, first, [&](absl::Status s) { fetched.set_value(s); });
  ASSERT_TRUE(fetched.get_future().get().ok());
  EXPECT_EQ(WhereIs(*first), Object::Where::kHost);
  EXPECT_TRUE(MatchesPattern(pool_->At(first->extent), kObject, 1));
  std::lock_guard lock(session_->mu());
  --first->pins;
}

TEST_F(SpillerTest, AWaiterFailsWhenNothingCanBeSpilled) {
  // A full pool of objects that are no candidates (never tracked: in use or not filled).
  for (uint64_t seq = 1; seq <= kSlots; ++seq) Offload(seq);
  StartSpiller(Watermarks{50, 25}, /*prefetches=*/0, /*track=*/false);
  std::promise<bool> answer;
  spiller_->WaitForRoom(1, [&] { return false; }, [&] { answer.set_value(false); });
  auto future = answer.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_FALSE(future.get());
  EXPECT_EQ(spiller_->counters().spills.load(), 0u);
}

// A copy in flight keeps waiters waiting (its end may bring room), but not forever: when nothing
// changes for stall_ms they give up, since that copy may itself wait for a waiter (a GPU lane
// holds a later ticket until the earlier one arrives). The stall counts from the wait, not from
// the last change before it: a spiller idle for longer than stall_ms must not fail the first job
// that finds the pool full (it did, in the spill benchmark, whose client takes seconds to start).
TEST_F(SpillerTest, WaitersGiveUpWhenCopiesInFlightMakeNoProgress) {
  for (uint64_t seq = 1; seq <= kSlots; ++seq) Offload(seq);  // full, nothing spillable
  StartSpiller(Watermarks{50, 25}, /*prefetches=*/0, /*track=*/false, /*stall_ms=*/300);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // idle past stall_ms
  spiller_->CopyStarted();
  std::promise<std::chrono::steady_clock::time_point> gave_up;
  auto start = std::chrono::steady_clock::now();
  spiller_->WaitForRoom(1, [] { return false; },
                        [&] { gave_up.set_value(std::chrono::steady_clock::now()); });
  auto future = gave_up.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  // Not before the stall time although nothing could be spilled: the copy in flight kept it.
  // (Whole milliseconds on the spiller's clock: allow for the truncation. Timed where it gave
  // up, so a slow test thread cannot fail it.)
  EXPECT_GE(future.get() - start, std::chrono::milliseconds(295))
      << "gave up although a copy was in flight";
  spiller_->CopyEnded();
}

// Waiting jobs of one session get room strictly in arrival order: the second is not even tried
// while the first still finds none (on a GPU lane a later ticket could not run before an earlier
// one anyway).
TEST_F(SpillerTest, WaitersAreServedInArrivalOrder) {
  StartSpiller(Watermarks{50, 25}, /*prefetches=*/0);
  spiller_->CopyStarted();  // a copy in flight: room may still come, nobody gives up
  std::mutex mu;
  std::vector<std::string> log;
  std::atomic<int> first_tries{0};
  std::promise<void> both;
  spiller_->WaitForRoom(
      1,
      [&] {
        std::lock_guard lock(mu);
        log.push_back("first");
        return ++first_tries >= 5;  // room on the fifth look
      },
      [&] { ADD_FAILURE() << "first gave up"; });
  spiller_->WaitForRoom(
      1,
      [&] {
        std::lock_guard lock(mu);
        log.push_back("second");
        both.set_value();
        return true;
      },
      [&] { ADD_FAILURE() << "second gave up"; });
  EXPECT_TRUE(spiller_->HasWaiters());
  for (int i = 0; i < 10; ++i) spiller_->NotifyFreed();
  ASSERT_EQ(both.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  spiller_->CopyEnded();
  std::lock_guard lock(mu);
  ASSERT_EQ(log.size(), 6u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(log[i], "first");
  EXPECT_EQ(log[5], "second");
  // The flag drops once the spiller is back from the second's try (it stays up while a waiter
  // is tried, so that no new job overtakes it): poll for it rather than race the spiller thread.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (spiller_->HasWaiters() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_FALSE(spiller_->HasWaiters());
}

// Sessions wait for room side by side: a session whose first waiter finds none (a large
// offload) does not hold up another session's waiter that fits (issue 16: one session's
// parked offload held every later offload of every session).
TEST_F(SpillerTest, OneSessionsWaiterDoesNotHoldUpAnothers) {
  StartSpiller(Watermarks{50, 25}, /*prefetches=*/0);
  spiller_->CopyStarted();  // a copy in flight: room may still come, nobody gives up
  std::atomic<int> big_tries{0};
  std::atomic<bool> stopping{false};
  std::promise<void> small_served;
  spiller_->WaitForRoom(
      7, [&] { return ++big_tries, false; },
      [&] { EXPECT_TRUE(stopping.load()) << "the big one gave up while room could still come"; });
  spiller_->WaitForRoom(
      8,
      [&] {
        small_served.set_value();
        return true;
      },
      [&] { ADD_FAILURE() << "the small one gave up"; });
  ASSERT_EQ(small_served.get_future().wait_for(std::chrono::seconds(10)),
            std::future_status::ready);
  EXPECT_GE(big_tries.load(), 1);
  EXPECT_TRUE(spiller_->HasWaiters());  // the big one still waits
  stopping = true;
  spiller_->Stop();  // it gives up now: the spiller stops
  spiller_->CopyEnded();
}

// When no room can come, only the waiter that waited longest gives up; the one behind it (same
// session) fits once it is gone and is served, not failed with it (issue 16: the spiller failed
// every waiter, so one impossible offload cost every session its jobs).
TEST_F(SpillerTest, WhenStuckOnlyTheOldestWaiterGivesUp) {
  for (uint64_t seq = 1; seq <= kSlots; ++seq) Offload(seq);  // full, nothing spillable
  StartSpiller(Watermarks{50, 25}, /*prefetches=*/0, /*track=*/false);
  std::atomic<bool> first_gone{false};
  std::promise<std::string> first, second;
  spiller_->WaitForRoom(
      1, [] { return false; },
      [&] {
        first_gone = true;
        first.set_value("gave up");
      });
  spiller_->WaitForRoom(
      1,
      [&] {
        // Fits once the first is gone (as if the first's end released what it needs).
        if (!first_gone) return false;
        second.set_value("served");
        return true;
      },
      [&] { second.set_value("gave up"); });
  auto first_result = first.get_future();
  auto second_result = second.get_future();
  ASSERT_EQ(first_result.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  ASSERT_EQ(second_result.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(first_result.get(), "gave up");
  EXPECT_EQ(second_result.get(), "served");
}

// Stuck waiters of several sessions all give up in the end, oldest first, one per round.
TEST_F(SpillerTest, StuckWaitersGiveUpOneAtATimeOldestFirst) {
  for (uint64_t seq = 1; seq <= kSlots; ++seq) Offload(seq);  // full, nothing spillable
  StartSpiller(Watermarks{50, 25}, /*prefetches=*/0, /*track=*/false);
  std::mutex mu;
  std::vector<int> order;
  std::promise<void> all;
  for (int i = 0; i < 4; ++i) {
    spiller_->WaitForRoom(
        static_cast<uint64_t>(10 - i), [] { return false; },
        [&, i] {
          std::lock_guard lock(mu);
          order.push_back(i);
          if (order.size() == 4) all.set_value();
        });
  }
  ASSERT_EQ(all.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  std::lock_guard lock(mu);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace tier::daemon
