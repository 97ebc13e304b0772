// The NVMe transfers alone (SpillWrite, SpillRead over NvmeTransfers), with a real host pool, a
// real spill store (files in a temporary directory, faults injected where a test says) and a real
// ObjectTable, but no spiller: who owns what from a transfer's start to its end. The tests begin
// each fetch at the table, as TierManager and the Spiller do, and hand a read that must start to
// SpillRead. A read feeds the reload that started it, wakes every reload that joined it (the
// table held them) exactly once, and gives its host extent back exactly once: to the object when
// it succeeds, to the pool after the reload's copy when it fails.
#include "daemon/tiers/spill_read.h"

#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <vector>

#include "daemon/tiers/nvme_transfers.h"
#include "daemon/tiers/object_table.h"
#include "daemon/tiers/spill_write.h"
#include "gtest/gtest.h"
#include "spill_test_util.h"
#include "storage/faulty_io_queue.h"

namespace tier::daemon {
namespace {

using storage::testing::FillPattern;
using storage::testing::MatchesPattern;
using storage::testing::TempDir;

constexpr uint64_t kObject = 64 * 1024;
constexpr auto kDeadline = std::chrono::seconds(10);

// Gives memory back to the pool and the store, and counts every extent and record it got, so that
// one given back twice (or never) shows.
class CountingHome : public MemoryHome {
 public:
  CountingHome(storage::HostPool& pool, storage::SpillStore& store) : pool_(pool), store_(store) {}
  void Return(std::optional<storage::Extent> extent,
              std::optional<storage::SpillRecord> record) override {
    if (extent) {
      ++extents[extent->offset];
      pool_.Free(*extent);
    }
    if (record) {
      ++records[record->id];
      EXPECT_TRUE(store_.Free(*record).ok());
    }
  }
  std::map<uint64_t, int> extents;  // by offset: times given back
  std::map<uint64_t, int> records;  // by id

 private:
  storage::HostPool& pool_;
  storage::SpillStore& store_;
};

class SpillReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    storage::HostPoolOptions pool_options;
    pool_options.bytes = 16 * kObject;
    pool_options.lock = storage::LockMode::kOff;
    auto pool = storage::HostPool::Create(pool_options);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    storage::SpillStoreOptions options;
    options.directories = {dir_.path()};
    options.file_bytes = 16 << 20;
    options.io_bytes = 16 * 1024;  // several chunks per object
    options.registered_buffers = {storage::IoBuffer{pool_->base(), pool_->bytes()}};
    options.wrap_io_queue = [this](std::unique_ptr<storage::IoQueue> inner) {
      auto faulty = std::make_unique<storage::FaultyIoQueue>(std::move(inner));
      faulty_ = faulty.get();
      return std::unique_ptr<storage::IoQueue>(std::move(faulty));
    };
    auto store = storage::SpillStore::Create(std::move(options));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    home_ = std::make_unique<CountingHome>(*pool_, *store_);
    transfers_ = std::make_unique<NvmeTransfers>(*pool_, *store_);
  }

  void TearDown() override {
    if (transfers_ != nullptr) {
      EXPECT_TRUE(transfers_->AwaitIdle(std::chrono::steady_clock::now() + kDeadline));
    }
  }

  // A filled object with pattern `seq`, written to NVMe (its host extent back in the pool).
  std::shared_ptr<Object> Spilled(uint64_t seq) {
    std::shared_ptr<Object> object = *table_->Create(seq, kObject, 0, seq, kObject);
    std::optional<storage::Extent> extent = pool_->Allocate(kObject);
    EXPECT_TRUE(extent.has_value());
    EXPECT_TRUE(table_->Admit(*object, *extent, *home_).ok());
    FillPattern(pool_->At(*extent), kObject, seq);
    std::vector<ObjectWaiter> waiters;
    EXPECT_TRUE(table_->EndFill(*object, absl::OkStatus(), &waiters).empty());
    EXPECT_EQ(SpillWrite::Begin(*transfers_, table_, object), SpillWrite::Start::kStarted);
    EXPECT_TRUE(transfers_->AwaitIdle(std::chrono::steady_clock::now() + kDeadline));
    EXPECT_EQ(table_->Look(*object).where, Object::Where::kNvme);
    EXPECT_EQ(home_->extents[extent->offset], 1) << "the written extent went back once";
    return object;
  }

  // The fetch of `object` for `reader`, begun at its table with room from the pool; a reload that
  // finds the read running joins it with `joiner`.
  ObjectTable::FetchBegun BeginFetch(const std::shared_ptr<Object>& object,
                                     ObjectTable::Reader reader, ObjectWaiter joiner = nullptr) {
    return table_->BeginFetch(
        *object, reader, [&] { return transfers_->AllocateFetch(*object); }, std::move(joiner));
  }

  // What a reload gets, once: from the read it started (Then), or from the read it joined.
  struct Answer {
    std::promise<absl::StatusOr<Readable>> promise;
    std::future<absl::StatusOr<Readable>> future = promise.get_future();
    int calls = 0;
    SpillRead::Then Then() {
      return [this](absl::StatusOr<Readable> readable) {
        if (++calls == 1) promise.set_value(std::move(readable));
      };
    }
    ObjectWaiter Joiner() {
      return [this](const absl::Status& ended) {
        if (++calls > 1) return;
        if (ended.ok()) {
          promise.set_value(Readable{});
        } else {
          promise.set_value(ended);
        }
      };
    }
    absl::StatusOr<Readable> Get() {
      if (future.wait_for(kDeadline) != std::future_status::ready) {
        return absl::DeadlineExceededError("never answered");
      }
      return future.get();
    }
  };

  // Until `feed` ended (it ends after the object's fetch ended).
  static absl::Status AwaitEnd(engine::SourceFeed& feed) {
    std::promise<absl::Status> ended;
    bool once = false;
    feed.Subscribe([&](uint64_t, bool end, const absl::Status& status) {
      if (end && !once) {
        once = true;
        ended.set_value(status);
      }
    });
    std::future<absl::Status> f = ended.get_future();
    absl::Status result = f.wait_for(kDeadline) == std::future_status::ready
                              ? f.get()
                              : absl::DeadlineExceededError("feed never ended");
    feed.Unsubscribe();
    return result;
  }

  TempDir dir_;
  std::unique_ptr<storage::HostPool> pool_;
  std::unique_ptr<storage::SpillStore> store_;
  storage::FaultyIoQueue* faulty_ = nullptr;
  std::unique_ptr<CountingHome> home_;
  std::unique_ptr<NvmeTransfers> transfers_;
  std::shared_ptr<ObjectTable> table_ = std::make_shared<ObjectTable>(~uint64_t{0});
};

TEST_F(SpillReadTest, AReloadThatFindsTheReadRunningJoinsItAndIsWokenOnce) {
  std::shared_ptr<Object> object = Spilled(1);
  ASSERT_TRUE(table_->PinForReload(1, kObject).ok());
  ASSERT_TRUE(table_->PinForReload(1, kObject).ok());
  const std::map<uint64_t, int> given_back = home_->extents;
  Answer first, second;
  SpillRead::Then first_then = first.Then();
  // The second reload arrives while the first one's read runs (its feed has just been handed
  // over, before the store took the read): it must join that read, not start another.
  ObjectTable::Fetch second_fetch = ObjectTable::Fetch::kNoRoom;
  SpillRead::Then on_feed = [&](absl::StatusOr<Readable> readable) {
    second_fetch = BeginFetch(object, ObjectTable::Reader::kPipelined, second.Joiner()).fetch;
    first_then(std::move(readable));
  };
  ObjectTable::FetchBegun begun = BeginFetch(object, ObjectTable::Reader::kPipelined);
  ASSERT_EQ(begun.fetch, ObjectTable::Fetch::kStarted);
  SpillRead::Start(*transfers_, table_, object, ObjectTable::Reader::kPipelined, begun, on_feed);
  ASSERT_EQ(second_fetch, ObjectTable::Fetch::kJoined);
  absl::StatusOr<Readable> fed = first.Get();
  ASSERT_TRUE(fed.ok()) << fed.status();
  ASSERT_NE(fed->feed, nullptr) << "the reload that started the read copies from its feed";
  EXPECT_TRUE(AwaitEnd(*fed->feed).ok());
  absl::StatusOr<Readable> woken = second.Get();
  ASSERT_TRUE(woken.ok()) << woken.status();
  EXPECT_EQ(woken->feed, nullptr) << "a joined reload copies from the object's extent";
  EXPECT_TRUE(transfers_->AwaitIdle(std::chrono::steady_clock::now() + kDeadline));
  EXPECT_EQ(first.calls, 1);
  EXPECT_EQ(second.calls, 1);
  EXPECT_EQ(transfers_->counters().fetches.load(), 1u) << "one read for both reloads";
  EXPECT_EQ(table_->Look(*object).where, Object::Where::kHost);
  const storage::Extent extent = table_->extent(*object);
  EXPECT_EQ(extent, fed->extent);
  EXPECT_TRUE(MatchesPattern(pool_->At(extent), kObject, 1));
  EXPECT_EQ(home_->records.size(), 1u) << "the record went back once the bytes were home";
  fed->keep.reset();  // the first copy is done: the extent stays the object's
  EXPECT_EQ(home_->extents, given_back) << "no extent went back: the read's is the object's";
  table_->Unpin(*object);
  table_->Unpin(*object);
  EXPECT_EQ(table_->Look(*object).pins, 0u);
}

TEST_F(SpillReadTest, AFailedReadKeepsItsExtentForTheCopyThenGivesItBackOnce) {
  std::shared_ptr<Object> object = Spilled(2);
  storage::FaultRule eio;
  eio.op = storage::IoOp::kRead;
  eio.times = -1;
  faulty_->AddRule(eio);
  ASSERT_TRUE(table_->PinForReload(2, kObject).ok());
  ASSERT_TRUE(table_->PinForReload(2, kObject).ok());
  const std::map<uint64_t, int> given_back = home_->extents;
  Answer first, second;
  SpillRead::Then first_then = first.Then();
  SpillRead::Then on_feed = [&](absl::StatusOr<Readable> readable) {
    EXPECT_EQ(BeginFetch(object, ObjectTable::Reader::kPipelined, second.Joiner()).fetch,
              ObjectTable::Fetch::kJoined);
    first_then(std::move(readable));
  };
  ObjectTable::FetchBegun begun = BeginFetch(object, ObjectTable::Reader::kPipelined);
  ASSERT_EQ(begun.fetch, ObjectTable::Fetch::kStarted);
  SpillRead::Start(*transfers_, table_, object, ObjectTable::Reader::kPipelined, begun, on_feed);
  absl::StatusOr<Readable> fed = first.Get();
  ASSERT_TRUE(fed.ok()) << fed.status();
  ASSERT_NE(fed->feed, nullptr);
  EXPECT_FALSE(AwaitEnd(*fed->feed).ok()) << "the copy hears the read failed";
  absl::StatusOr<Readable> woken = second.Get();
  EXPECT_FALSE(woken.ok()) << "the joined reload gets the read's error";
  EXPECT_TRUE(transfers_->AwaitIdle(std::chrono::steady_clock::now() + kDeadline));
  EXPECT_EQ(second.calls, 1);
  EXPECT_EQ(table_->Look(*object).where, Object::Where::kNvme) << "its bytes stay on NVMe";
  const uint64_t offset = fed->extent.offset;
  // The read has ended, but the copy may still read the extent: it is not back yet.
  EXPECT_EQ(home_->extents, given_back) << "given back while the copy may still read it";
  const uint64_t used = pool_->Usage().used_bytes;
  EXPECT_GE(used, kObject) << "the copy's extent is still held";
  fed->keep.reset();
  fed->feed.reset();
  std::map<uint64_t, int> expected = given_back;
  ++expected[offset];
  EXPECT_EQ(home_->extents, expected) << "given back once, when the copy let go";
  EXPECT_EQ(pool_->Usage().used_bytes, used - kObject);
  EXPECT_TRUE(home_->records.empty()) << "the record stays: the object is still on NVMe";
  table_->Unpin(*object);
  table_->Unpin(*object);
}

TEST_F(SpillReadTest, APrefetchDropsItsPinWhetherItReadsOrNot) {
  std::shared_ptr<Object> object = Spilled(3);
  ASSERT_TRUE(table_->PinIfOnNvme(*object));
  Answer done;
  ObjectTable::FetchBegun begun = BeginFetch(object, ObjectTable::Reader::kPrefetch);
  ASSERT_EQ(begun.fetch, ObjectTable::Fetch::kStarted);
  SpillRead::Start(*transfers_, table_, object, ObjectTable::Reader::kPrefetch, begun,
                   done.Then());
  ASSERT_TRUE(done.Get().ok());
  EXPECT_TRUE(transfers_->AwaitIdle(std::chrono::steady_clock::now() + kDeadline));
  EXPECT_EQ(table_->Look(*object).pins, 0u);
  EXPECT_TRUE(table_->Look(*object).prefetched);
  EXPECT_TRUE(MatchesPattern(pool_->At(table_->extent(*object)), kObject, 3));
  // In host memory now: a second prefetch has nothing to read, and drops its pin all the same.
  ASSERT_TRUE(table_->PinForReload(3, kObject).ok());  // (the prefetch's pin, as a reload's)
  EXPECT_EQ(BeginFetch(object, ObjectTable::Reader::kPrefetch).fetch, ObjectTable::Fetch::kInHost);
  EXPECT_EQ(table_->Look(*object).pins, 0u);
  EXPECT_EQ(transfers_->counters().prefetches.load(), 1u);
}

TEST_F(SpillReadTest, NoRoomInThePoolStartsNothing) {
  std::shared_ptr<Object> object = Spilled(4);
  ASSERT_TRUE(table_->PinForReload(4, kObject).ok());
  std::vector<storage::Extent> taken;
  while (std::optional<storage::Extent> extent = pool_->Allocate(kObject)) taken.push_back(*extent);
  EXPECT_EQ(BeginFetch(object, ObjectTable::Reader::kPipelined).fetch,
            ObjectTable::Fetch::kNoRoom);
  EXPECT_EQ(transfers_->in_flight(), 0u);
  EXPECT_EQ(table_->Look(*object).where, Object::Where::kNvme);
  for (const storage::Extent& extent : taken) pool_->Free(extent);
  table_->Unpin(*object);
}

}  // namespace
}  // namespace tier::daemon
