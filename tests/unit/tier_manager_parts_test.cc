// Admission into a host pool split by NUMA node: an offload from GPU d takes its extent from GPU
// d's part, from another part (counted as remote) when that one is full, and gives it back to the
// part it came from when the object goes. No NVMe tier: a pool with no room left refuses.
#include <memory>
#include <optional>
#include <vector>

#include "daemon/tiers/object_table.h"
#include "daemon/tiers/tier_manager.h"
#include "gtest/gtest.h"

namespace tier::daemon {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

class TierManagerPartsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    storage::HostPoolOptions options{.bytes = 8 * kMiB, .lock = storage::LockMode::kOff};
    options.huge_pages = false;
    options.parts = {{-1, 1}, {-1, 1}};  // 4 MiB each
    absl::StatusOr<std::unique_ptr<storage::HostPool>> pool = storage::HostPool::Create(options);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    // GPU 0 is local to part 1, GPU 1 to part 0, GPU 2 to none.
    tiers_ = std::make_unique<TierManager>(*pool_, nullptr, SpillerOptions{},
                                           std::vector<int>{1, 0, -1});
  }

  // Offloads `len` bytes from `device` as the job executor does; the admission's answer.
  absl::Status Offload(uint64_t id, uint64_t len, int device) {
    absl::StatusOr<std::shared_ptr<Object>> object =
        table_->Create(id, len, 0, id, tiers_->Charge(len));
    if (!object.ok()) return object.status();
    std::optional<absl::Status> answer;
    tiers_->Admit(table_, 1, *object, device, [&](absl::Status s) { answer = s; });
    EXPECT_TRUE(answer.has_value());  // no NVMe tier: answered at once
    objects_.push_back(*object);
    return answer.value_or(absl::InternalError("no answer"));
  }
  int PartOf(uint64_t id) {
    for (const auto& object : objects_) {
      if (object->id() == id) return pool_->PartOf(table_->extent(*object).offset);
    }
    return -2;
  }
  void Drop(uint64_t id) {
    for (const auto& object : objects_) {
      if (object->id() != id) continue;
      std::vector<ObjectWaiter> waiters;
      table_->EndFill(*object, absl::OkStatus(), &waiters);
    }
    absl::StatusOr<Release> freed = table_->Free(id);
    ASSERT_TRUE(freed.ok()) << freed.status();  // (its extent goes back here)
  }

  std::unique_ptr<storage::HostPool> pool_;
  std::unique_ptr<TierManager> tiers_;
  std::shared_ptr<ObjectTable> table_ = std::make_shared<ObjectTable>(64 * kMiB);
  std::vector<std::shared_ptr<Object>> objects_;
};

TEST_F(TierManagerPartsTest, EachGpuTakesItsOwnPartFirst) {
  ASSERT_TRUE(Offload(1, kMiB, 0).ok());
  ASSERT_TRUE(Offload(2, kMiB, 1).ok());
  EXPECT_EQ(PartOf(1), 1);
  EXPECT_EQ(PartOf(2), 0);
  EXPECT_EQ(objects_[0]->home_part(), 1);
  EXPECT_EQ(objects_[1]->home_part(), 0);
  std::vector<storage::PoolPartUsage> parts = pool_->PartUsage();
  EXPECT_EQ(parts[0].local_allocations, 1u);
  EXPECT_EQ(parts[1].local_allocations, 1u);
  EXPECT_EQ(parts[0].remote_allocations + parts[1].remote_allocations, 0u);
  // Host memory (device -1) and a GPU without a part take the emptiest part.
  ASSERT_TRUE(Offload(3, 2 * kMiB, -1).ok());
  ASSERT_TRUE(Offload(4, kMiB, 2).ok());
  parts = pool_->PartUsage();
  EXPECT_EQ(parts[0].any_allocations + parts[1].any_allocations, 2u);
  EXPECT_EQ(objects_[2]->home_part(), storage::HostPool::kAnyPart);
}

TEST_F(TierManagerPartsTest, AFullLocalPartSpillsToARemoteOneCountedThenRefuses) {
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(Offload(id, kMiB, 0).ok());  // part 1 full
  ASSERT_TRUE(Offload(5, kMiB, 0).ok());
  EXPECT_EQ(PartOf(5), 0);
  EXPECT_EQ(pool_->PartUsage()[0].remote_allocations, 1u);
  for (uint64_t id = 6; id <= 8; ++id) ASSERT_TRUE(Offload(id, kMiB, 1).ok());  // part 0 full
  absl::Status refused = Offload(9, kMiB, 0);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;

  // The remote extent goes back to part 0, a local one to part 1; the next offload of GPU 0
  // lands at home again.
  Drop(5);
  Drop(2);
  std::vector<storage::PoolPartUsage> parts = pool_->PartUsage();
  EXPECT_EQ(parts[0].used_bytes, 3 * kMiB);
  EXPECT_EQ(parts[1].used_bytes, 3 * kMiB);
  ASSERT_TRUE(Offload(10, kMiB, 0).ok());
  EXPECT_EQ(PartOf(10), 1);
}

TEST_F(TierManagerPartsTest, AnObjectLargerThanAnyPartCanNeverBeHeld) {
  EXPECT_TRUE(tiers_->CanEverHold(4 * kMiB));
  EXPECT_FALSE(tiers_->CanEverHold(4 * kMiB + 1));  // though the pool holds 8 MiB
}

}  // namespace
}  // namespace tier::daemon
