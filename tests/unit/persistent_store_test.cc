// PersistentStore alone (daemon/persistent_store.h): names per uid, reservations, quota, the
// sweep at a session's end. Objects are created and filled through their table's transitions, as
// the job executor would.
#include "daemon/persistent_store.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "storage/host_pool.h"

namespace tier::daemon {
namespace {

constexpr uint64_t kQuota = 64 << 10;

class PersistentStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    storage::HostPoolOptions options;
    options.bytes = 1 << 20;
    options.lock = storage::LockMode::kOff;
    auto pool = storage::HostPool::Create(options);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    tiers_ = std::make_unique<TierManager>(*pool_, nullptr, SpillerOptions{});
    tiers_->Start();
    store_ = std::make_unique<PersistentStore>(*tiers_, kQuota);
  }

  // What an offload into the slot does: create the object, fill it.
  void Fill(const ObjectSlot& slot, uint64_t len) {
    auto object = slot.table->Create(slot.id, len, 0, 1, tiers_->Charge(len));
    ASSERT_TRUE(object.ok()) << object.status();
    std::vector<ObjectWaiter> waiters;
    tiers_->Settle(slot.table->EndFill(**object, absl::OkStatus(), &waiters));
  }

  std::unique_ptr<storage::HostPool> pool_;
  std::unique_ptr<TierManager> tiers_;
  std::unique_ptr<PersistentStore> store_;
};

TEST_F(PersistentStoreTest, CreatedObjectIsFoundByItsOwnerOnly) {
  auto slot = store_->Create(1000, "w0", /*session=*/7, 8192);
  ASSERT_TRUE(slot.ok()) << slot.status();
  uint64_t len = 0;
  // Reserved, not filled yet: not there.
  EXPECT_TRUE(absl::IsNotFound(store_->Open(1000, "w0", &len).status()));
  EXPECT_TRUE(store_->List().empty());
  Fill(*slot, 8192);

  auto opened = store_->Open(1000, "w0", &len);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(len, 8192u);
  EXPECT_EQ(opened->table, slot->table);
  EXPECT_EQ(opened->id, slot->id);
  std::vector<PersistentObjectInfo> list = store_->List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].uid, 1000u);
  EXPECT_EQ(list[0].name, "w0");
  EXPECT_EQ(list[0].bytes, 8192u);
  EXPECT_EQ(list[0].tier, "host");

  // Another uid: not found, in the words a missing name gets.
  absl::Status foreign = store_->Open(1001, "w0", &len).status();
  absl::Status missing = store_->Open(1000, "w1", &len).status();
  EXPECT_TRUE(absl::IsNotFound(foreign)) << foreign;
  EXPECT_EQ(foreign.message(), "no persistent object named \"w0\"");
  EXPECT_EQ(missing.message(), "no persistent object named \"w1\"");
  EXPECT_TRUE(absl::IsNotFound(store_->Delete(1001, "w0")));
  // The other uid's namespace is its own.
  EXPECT_TRUE(store_->Create(1001, "w0", 8, 4096).ok());

  // The session ends; the object stays. Deleting returns its quota.
  store_->SessionEnded(7);
  EXPECT_TRUE(store_->Open(1000, "w0", &len).ok());
  EXPECT_EQ(slot->table->used_bytes(), 8192u);
  EXPECT_TRUE(store_->Delete(1000, "w0").ok());
  EXPECT_EQ(slot->table->used_bytes(), 0u);
  EXPECT_TRUE(absl::IsNotFound(store_->Open(1000, "w0", &len).status()));
  EXPECT_TRUE(absl::IsNotFound(store_->Delete(1000, "w0")));
}

TEST_F(PersistentStoreTest, NamesAreUniqueWhileTakenOrReserved) {
  auto slot = store_->Create(5, "n", 1, 4096);
  ASSERT_TRUE(slot.ok());
  // Another session may not take a name a live session is filling.
  EXPECT_TRUE(absl::IsAlreadyExists(store_->Create(5, "n", 2, 4096).status()));
  Fill(*slot, 4096);
  EXPECT_TRUE(absl::IsAlreadyExists(store_->Create(5, "n", 1, 4096).status()));
  EXPECT_TRUE(absl::IsAlreadyExists(store_->Create(5, "n", 2, 4096).status()));

  // A reservation never filled goes with its session.
  ASSERT_TRUE(store_->Create(5, "unfilled", 3, 4096).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(store_->Create(5, "unfilled", 4, 4096).status()));
  store_->SessionEnded(3);
  EXPECT_TRUE(store_->Create(5, "unfilled", 4, 4096).ok());
}

TEST_F(PersistentStoreTest, QuotaIsCheckedAtCreateAndByTheTable) {
  auto first = store_->Create(9, "a", 1, 48 << 10);
  ASSERT_TRUE(first.ok());
  Fill(*first, 48 << 10);
  absl::Status over = store_->Create(9, "b", 1, 32 << 10).status();
  EXPECT_TRUE(absl::IsResourceExhausted(over)) << over;
  EXPECT_NE(over.message().find("persistent_quota_bytes_per_uid"), std::string::npos) << over;
  // Too large for the quota even when empty.
  EXPECT_TRUE(absl::IsResourceExhausted(store_->Create(10, "big", 1, kQuota + 1).status()));
  // The table enforces it too (a create raced past the first check).
  auto raced = store_->Create(9, "c", 1, 8 << 10);
  ASSERT_TRUE(raced.ok());
  absl::Status table = raced->table->Create(raced->id, 32 << 10, 0, 1, 32 << 10).status();
  EXPECT_TRUE(absl::IsResourceExhausted(table)) << table;
  EXPECT_NE(table.message().find("persistent_quota_bytes_per_uid"), std::string::npos) << table;
}

TEST_F(PersistentStoreTest, SessionEndFreesObjectsNoNameReaches) {
  // One session reserves a name twice and fills both ids: only the second stays named.
  auto one = store_->Create(3, "twice", 1, 4096);
  ASSERT_TRUE(one.ok());
  auto two = store_->Create(3, "twice", 1, 4096);
  ASSERT_TRUE(two.ok());
  Fill(*one, 4096);
  Fill(*two, 4096);
  EXPECT_EQ(one->table->size(), 2u);
  store_->SessionEnded(1);
  EXPECT_EQ(one->table->size(), 1u);
  uint64_t len = 0;
  auto opened = store_->Open(3, "twice", &len);
  ASSERT_TRUE(opened.ok());
  EXPECT_EQ(opened->id, two->id);
}

TEST_F(PersistentStoreTest, NamesAreChecked) {
  EXPECT_TRUE(PersistentStore::CheckName("ckpt/step-100/layer.0").ok());
  EXPECT_TRUE(absl::IsInvalidArgument(PersistentStore::CheckName("")));
  EXPECT_TRUE(absl::IsInvalidArgument(PersistentStore::CheckName("a b")));
  EXPECT_TRUE(absl::IsInvalidArgument(PersistentStore::CheckName("tab\there")));
  EXPECT_TRUE(absl::IsInvalidArgument(PersistentStore::CheckName("\xc3\xa9")));
  EXPECT_TRUE(absl::IsInvalidArgument(PersistentStore::CheckName(std::string(128, 'x'))));
  EXPECT_TRUE(PersistentStore::CheckName(std::string(127, 'x')).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Create(1, "a b", 1, 4096).status()));
  uint64_t len = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Open(1, "", &len).status()));
}

TEST_F(PersistentStoreTest, DropAllAtShutdownEmptiesEveryNamespace) {
  auto a = store_->Create(1, "a", 1, 4096);
  auto b = store_->Create(2, "b", 2, 4096);
  ASSERT_TRUE(a.ok() && b.ok());
  Fill(*a, 4096);
  Fill(*b, 4096);
  EXPECT_EQ(store_->size(), 2u);
  store_->DropAll();
  EXPECT_EQ(store_->size(), 0u);
  EXPECT_TRUE(store_->List().empty());
}

}  // namespace
}  // namespace tier::daemon
