// The NVMe tier's mover behind the TierManager, over a real host pool and a real spill store (files
// in a temporary directory) and a real ObjectTable: watermarks, victim order, prefetch order and
// stop point, data intact both ways, and waits for room that end (served or given up) instead of
// hanging. Objects are made here the way the job executor makes them. (The admission queue's
// order and fairness are tested alone: admission_queue_test.cc.)
#include "daemon/tiers/spiller.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/tiers/nvme_transfers.h"
#include "daemon/tiers/object_table.h"
#include "daemon/tiers/tier_manager.h"
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
  }

  // Every object made so far becomes a spill candidate before the spiller's thread starts, as if
  // their fills had all just completed; then the thread starts.
  void StartSpiller(Watermarks marks, uint32_t prefetches, bool track = true,
                    uint32_t stall_ms = 5000) {
    tiers_ = std::make_unique<TierManager>(*pool_, store_.get(),
                                           SpillerOptions{marks, prefetches, stall_ms});
    if (track) {
      for (auto& object : objects_) tiers_->spiller()->Track(table_, object);
    }
    tiers_->Start();
  }
  NvmeTransfers& nvme() { return *tiers_->nvme(); }

  void TearDown() override {
    if (tiers_) tiers_->Stop();
    // Writes and reads in flight landed (Stop waits for them): every live object is on one tier.
    EXPECT_TRUE(Settled());
  }

  // A filled object of kObject bytes with pattern `seq`, as an offload leaves it (not tracked).
  std::shared_ptr<Object> Offload(uint64_t seq, uint64_t hint = 0) {
    absl::StatusOr<std::shared_ptr<Object>> object =
        table_->Create(seq, kObject, hint, seq, kObject);
    EXPECT_TRUE(object.ok()) << object.status();
    std::optional<storage::Extent> extent = pool_->Allocate(kObject);
    if (!extent) {
      ADD_FAILURE() << "pool full at seq " << seq;
      return *object;
    }
    EXPECT_TRUE(table_->Admit(**object, *extent, home_).ok());
    FillPattern(pool_->At(*extent), kObject, seq);
    std::vector<ObjectWaiter> waiters;
    EXPECT_TRUE(table_->EndFill(**object, absl::OkStatus(), &waiters).empty());
    objects_.push_back(*object);
    return *object;
  }

  // What a free does: the client drops it; memory returns at the last unpin.
  void Free(const std::shared_ptr<Object>& object) {
    absl::StatusOr<Release> released = table_->Free(object->id());
    ASSERT_TRUE(released.ok()) << released.status();  // (its memory goes back here)
  }

  Object::Where WhereIs(const Object& object) { return table_->Look(object).where; }

  // No I/O in flight: every live object is on one tier, not between, and the spiller has counted
  // what it moved (its I/O ends after the object's state changed: a test that saw the state and
  // read a counter at once raced with it under load).
  bool Settled() {
    if (tiers_ != nullptr && nvme().in_flight() != 0) return false;
    for (auto& object : objects_) {
      ObjectTable::View view = table_->Look(*object);
      if (view.dropped) continue;
      if (view.where == Object::Where::kSpilling || view.where == Object::Where::kFetching) {
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

  // Objects are admitted before the tiers exist (StartSpiller): their memory goes back to the
  // tiers once there are any, else straight to the pool.
  class LateHome : public MemoryHome {
   public:
    explicit LateHome(SpillerTest& test) : test_(test) {}
    void Return(std::optional<storage::Extent> extent,
                std::optional<storage::SpillRecord> record) override {
      if (test_.tiers_ != nullptr) {
        test_.tiers_->home().Return(extent, record);
      } else if (extent) {
        test_.pool_->Free(*extent);
      }
    }

   private:
    SpillerTest& test_;
  };

  TempDir dir_;
  std::unique_ptr<storage::HostPool> pool_;
  std::unique_ptr<storage::SpillStore> store_;
  std::shared_ptr<ObjectTable> table_ = std::make_shared<ObjectTable>(~uint64_t{0});
  std::unique_ptr<TierManager> tiers_;
  std::vector<std::shared_ptr<Object>> objects_;
  LateHome home_{*this};
};

TEST_F(SpillerTest, SpillsTheOldestDownToTheLowWatermark) {
  for (uint64_t seq = 1; seq <= 40; ++seq) Offload(seq);  // 62% of the pool
  StartSpiller(Watermarks{50, 25}, /*prefetches=*/0);
  ASSERT_TRUE(WaitFor([&] { return UsedPct() <= 25; })) << "pool at " << UsedPct() << "%";
  // Exactly the oldest went to NVMe: every spilled seq is below every seq still in memory.
  uint64_t newest_spilled = 0, oldest_in_memory = ~uint64_t{0};
  for (auto& object : objects_) {
    if (WhereIs(*object) == Object::Where::kNvme) {
      newest_spilled = std::max(newest_spilled, object->seq());
    } else {
      oldest_in_memory = std::min(oldest_in_memory, object->seq());
    }
  }
  EXPECT_LT(newest_spilled, oldest_in_memory);
  EXPECT_EQ(newest_spilled, 24u);  // 40 objects, 16 stay (25% of 64 slots): no overshoot
  EXPECT_EQ(nvme().counters().spills.load(), newest_spilled);
  EXPECT_EQ(nvme().counters().bytes_spilled.load(), newest_spilled * kObject);
}

// The policy's projection (used minus writing) never reads a write half settled: its extent
// gone back while its bytes still count as being written (here: 0 used, where 1 object is), or
// the reverse (1 object too many: the overshoot the test above caught under TSan).
TEST_F(SpillerTest, TheProjectionReadsNoWriteHalfSettled) {
  NvmeTransfers io(*pool_, *store_);
  std::optional<storage::Extent> written = pool_->Allocate(kObject);
  std::optional<storage::Extent> kept = pool_->Allocate(kObject);
  ASSERT_TRUE(written && kept);
  io.Began(NvmeTransfers::Kind::kWrite, kObject);
  EXPECT_EQ(io.ProjectedUsage().used_bytes, kObject);  // the written one counts as gone

  std::atomic<bool> freed{false}, settled{false};
  std::thread writer([&] {
    NvmeTransfers::WriteSettle settle(io, kObject);
    pool_->Free(*written);
    freed.store(true);
    // (Well inside kMaxSettleWait, for a loaded machine: the reader gives up after 100 ms.)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    settled.store(true);  // (just before the settle ends)
  });
  while (!freed.load()) std::this_thread::yield();
  storage::PoolUsage usage = io.ProjectedUsage();  // waits for the settle's end
  EXPECT_TRUE(settled.load());
  EXPECT_EQ(usage.used_bytes, kObject);
  writer.join();
  io.Ended(NvmeTransfers::Kind::kWrite);

  // A settle that never ends costs the reader kMaxSettleWait, not a stall.
  io.Began(NvmeTransfers::Kind::kWrite, 0);
  std::atomic<bool> release{false};
  std::thread stuck([&] {
    NvmeTransfers::WriteSettle settle(io, 0);
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(5) &&
         io.ProjectedUsage().used_bytes != kObject) {
  }
  EXPECT_EQ(io.ProjectedUsage().used_bytes, kObject);  // returned, with the settle still held
  release.store(true);
  stuck.join();
  io.Ended(NvmeTransfers::Kind::kWrite);
  pool_->Free(*kept);
}

TEST_F(SpillerTest, NothingSpillsBetweenTheWatermarks) {
  for (uint64_t seq = 1; seq <= 30; ++seq) Offload(seq);  // 47%: under the high mark
  StartSpiller(Watermarks{50, 25}, /*prefetches=*/0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(nvme().counters().spills.load(), 0u);
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
      smallest_spilled = std::min(smallest_spilled, object->hint());
    } else {
      largest_in_memory = std::max(largest_in_memory, object->hint());
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
  ASSERT_TRUE(WaitFor([&] { return nvme().counters().prefetches.load() >= 16; }))
      << nvme().counters().prefetches.load() << " prefetches";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(WaitFor([] { return true; }));
  EXPECT_LE(UsedPct(), 25u);  // prefetching stops at the low watermark
  // The ones back are exactly the newest of the spilled (reloaded soonest), bytes intact.
  uint64_t oldest_back = ~uint64_t{0}, newest_still_out = 0;
  for (auto& object : spilled) {
    if (WhereIs(*object) == Object::Where::kHost) {
      oldest_back = std::min(oldest_back, object->seq());
      ObjectTable::View view = table_->Look(*object);
      EXPECT_TRUE(MatchesPattern(pool_->At(view.extent), kObject, object->seq())) << object->seq();
      EXPECT_TRUE(view.prefetched);
    } else {
      newest_still_out = std::max(newest_still_out, object->seq());
    }
  }
  EXPECT_GT(oldest_back, newest_still_out);
  EXPECT_EQ(nvme().counters().bytes_prefetched.load(),
            nvme().counters().prefetches.load() * kObject);
  // Reloading a prefetched object counts a hit; a spilled one a miss.
  for (auto& object : spilled) {
    absl::StatusOr<ObjectTable::Pinned> pinned = table_->PinForReload(object->id(), kObject);
    ASSERT_TRUE(pinned.ok()) << pinned.status();
    std::promise<absl::StatusOr<Readable>> readable;
    tiers_->MakeReadable(table_, 1, *pinned,
                         [&](absl::StatusOr<Readable> r) { readable.set_value(std::move(r)); });
    absl::StatusOr<Readable> from = readable.get_future().get();
    ASSERT_TRUE(from.ok()) << from.status();
    if (from->feed != nullptr) {  // a miss: the copy would wait for the read to end
      std::promise<void> ended;
      bool once = false;
      from->feed->Subscribe([&](uint64_t, bool end, const absl::Status&) {
        if (end && !once) {
          once = true;
          ended.set_value();
        }
      });
      ended.get_future().get();
      from->feed->Unsubscribe();
    }
    from = absl::UnknownError("copied");
    tiers_->ReloadEnded(*table_, *object);
  }
  EXPECT_EQ(nvme().counters().prefetch_hits.load(), nvme().counters().prefetches.load());
  EXPECT_EQ(nvme().counters().prefetch_hits.load() + nvme().counters().prefetch_misses.load(),
            spilled.size());
}

// A reload of a spilled object: the read is pipelined (a feed that fills as chunks are verified),
// and the bytes are the ones written.
TEST_F(SpillerTest, FetchReturnsTheSpilledBytes) {
  for (uint64_t seq = 1; seq <= 40; ++seq) Offload(seq);
  StartSpiller(Watermarks{50, 25}, /*prefetches=*/0);
  ASSERT_TRUE(WaitFor([&] { return UsedPct() <= 25; }));
  std::shared_ptr<Object> first = objects_[0];
  ASSERT_EQ(WhereIs(*first), Object::Where::kNvme);
  absl::StatusOr<ObjectTable::Pinned> pinned = table_->PinForReload(first->id(), kObject);
  ASSERT_TRUE(pinned.ok());
  ASSERT_TRUE(pinned->on_nvme);
  std::promise<absl::StatusOr<Readable>> readable;
  tiers_->MakeReadable(table_, 1, *pinned,
                       [&](absl::StatusOr<Readable> r) { readable.set_value(std::move(r)); });
  absl::StatusOr<Readable> from = readable.get_future().get();
  ASSERT_TRUE(from.ok()) << from.status();
  ASSERT_NE(from->feed, nullptr) << "the reload that starts the read is fed as it goes";
  std::promise<absl::Status> ended;
  from->feed->Subscribe([&](uint64_t, bool end, const absl::Status& status) {
    if (end) ended.set_value(status);
  });
  ASSERT_TRUE(ended.get_future().get().ok());
  EXPECT_TRUE(MatchesPattern(pool_->At(from->extent), kObject, 1));
  ASSERT_TRUE(WaitFor([&] { return WhereIs(*first) == Object::Where::kHost; }));
  EXPECT_EQ(table_->extent(*first), from->extent);
  from->feed->Unsubscribe();
  from = absl::UnknownError("dropped");  // the copy is done: what it kept goes
  tiers_->ReloadEnded(*table_, *first);
  EXPECT_EQ(nvme().counters().fetches.load(), 1u);
}

// A job that finds the pool full waits in the admission queue and gets its room once the spiller
// wrote something out (whatever the watermarks say).
TEST_F(SpillerTest, AnAdmissionWaitsForASpillThenGetsItsRoom) {
  for (uint64_t seq = 1; seq <= kSlots; ++seq) Offload(seq);  // full
  StartSpiller(Watermarks{100, 100}, /*prefetches=*/0);      // the watermarks never spill
  std::shared_ptr<Object> late = *table_->Create(1000, kObject, 0, 1000, kObject);
  std::promise<absl::Status> admitted;
  tiers_->Admit(table_, 1, late, /*device=*/-1, [&](absl::Status s) { admitted.set_value(s); });
  auto future = admitted.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  ASSERT_TRUE(future.get().ok());
  EXPECT_NE(table_->Look(*late).extent.bytes, 0u);
  // The oldest went first; several writes may be in flight and land in any order, so the room
  // may have come from another one's (under load it did): once they all landed, it is on NVMe.
  EXPECT_TRUE(WaitFor([&] { return WhereIs(*objects_[0]) == Object::Where::kNvme; }))
      << "the oldest was not spilled";
  std::vector<ObjectWaiter> waiters;
  tiers_->FillEnded(table_, late, absl::OkStatus(), &waiters);
}

// A reload of a spilled object with the pool full waits for room like an offload, then reads.
TEST_F(SpillerTest, AFetchIntoAFullPoolWaitsForRoom) {
  for (uint64_t seq = 1; seq <= kSlots; ++seq) Offload(seq);
  StartSpiller(Watermarks{100, 100}, /*prefetches=*/0);
  std::shared_ptr<Object> late = *table_->Create(1000, kObject, 0, 1000, kObject);
  std::promise<absl::Status> admitted;
  tiers_->Admit(table_, 1, late, /*device=*/-1, [&](absl::Status s) { admitted.set_value(s); });
  ASSERT_TRUE(admitted.get_future().get().ok());  // one object went to NVMe for it
  std::vector<ObjectWaiter> waiters;
  tiers_->FillEnded(table_, late, absl::OkStatus(), &waiters);
  objects_.push_back(late);
  ASSERT_TRUE(WaitFor([&] { return WhereIs(*objects_[0]) == Object::Where::kNvme; }));
  absl::StatusOr<ObjectTable::Pinned> pinned = table_->PinForReload(objects_[0]->id(), kObject);
  ASSERT_TRUE(pinned.ok());
  std::promise<absl::StatusOr<Readable>> readable;
  tiers_->MakeReadable(table_, 1, *pinned,
                       [&](absl::StatusOr<Readable> r) { readable.set_value(std::move(r)); });
  auto future = readable.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  absl::StatusOr<Readable> from = future.get();
  ASSERT_TRUE(from.ok()) << from.status();
  ASSERT_NE(from->feed, nullptr);
  std::promise<absl::Status> ended;
  from->feed->Subscribe([&](uint64_t, bool end, const absl::Status& status) {
    if (end) ended.set_value(status);
  });
  ASSERT_TRUE(ended.get_future().get().ok());
  EXPECT_TRUE(MatchesPattern(pool_->At(from->extent), kObject, 1));
  EXPECT_GE(nvme().counters().spills.load(), 2u) << "a second spill made room for the read";
  from->feed->Unsubscribe();
  from = absl::UnknownError("dropped");
  tiers_->ReloadEnded(*table_, *objects_[0]);
}

TEST_F(SpillerTest, AWaiterFailsWhenNothingCanBeSpilled) {
  // A full pool of objects that are no candidates (never tracked: in use or not filled).
  for (uint64_t seq = 1; seq <= kSlots; ++seq) Offload(seq);
  StartSpiller(Watermarks{50, 25}, /*prefetches=*/0, /*track=*/false);
  std::shared_ptr<Object> late = *table_->Create(1000, kObject, 0, 1000, kObject);
  std::promise<absl::Status> answer;
  tiers_->Admit(table_, 1, late, /*device=*/-1, [&](absl::Status s) { answer.set_value(s); });
  auto future = answer.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(future.get().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(nvme().counters().spills.load(), 0u);
  std::vector<ObjectWaiter> waiters;
  table_->EndFill(*late, absl::ResourceExhaustedError("no room"), &waiters);
  EXPECT_EQ(table_->size(), kSlots);
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
  tiers_->spiller()->CopyStarted();
  std::shared_ptr<Object> late = *table_->Create(1000, kObject, 0, 1000, kObject);
  std::promise<std::chrono::steady_clock::time_point> gave_up;
  auto start = std::chrono::steady_clock::now();
  tiers_->Admit(table_, 1, late, /*device=*/-1, [&](absl::Status s) {
    EXPECT_FALSE(s.ok());
    gave_up.set_value(std::chrono::steady_clock::now());
  });
  auto future = gave_up.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  // Not before the stall time although nothing could be spilled: the copy in flight kept it.
  // (Whole milliseconds on the spiller's clock: allow for the truncation. Timed where it gave
  // up, so a slow test thread cannot fail it.)
  EXPECT_GE(future.get() - start, std::chrono::milliseconds(295))
      << "gave up although a copy was in flight";
  tiers_->spiller()->CopyEnded();
  std::vector<ObjectWaiter> waiters;
  table_->EndFill(*late, absl::ResourceExhaustedError("no room"), &waiters);
}

// Stopping ends every wait (a job waiting for room fails instead of holding its session open).
TEST_F(SpillerTest, StopEndsEveryWait) {
  for (uint64_t seq = 1; seq <= kSlots; ++seq) Offload(seq);
  StartSpiller(Watermarks{50, 25}, /*prefetches=*/0, /*track=*/false, /*stall_ms=*/60000);
  tiers_->spiller()->CopyStarted();  // room may still come: nobody gives up by itself
  std::vector<std::shared_ptr<Object>> late;
  std::atomic<int> ended{0};
  for (uint64_t i = 0; i < 3; ++i) {
    late.push_back(*table_->Create(1000 + i, kObject, 0, 1000 + i, kObject));
    tiers_->Admit(table_, 1 + i, late.back(), /*device=*/-1, [&](absl::Status s) {
      EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
      ++ended;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(ended.load(), 0);
  tiers_->Stop();
  EXPECT_EQ(ended.load(), 3);
  tiers_->spiller()->CopyEnded();
  std::vector<ObjectWaiter> waiters;
  for (auto& object : late) {
    table_->EndFill(*object, absl::ResourceExhaustedError("stopped"), &waiters);
  }
}

}  // namespace
}  // namespace tier::daemon
