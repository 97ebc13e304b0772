// The host pool split into parts (one per NUMA node): each part's share and place in the one
// mapping, allocation from the preferred part first and from another only when it is full
// (counted as remote), extents going back to the part they came from, and the NUMA policy really
// set on each part's range (read back from the kernel with get_mempolicy).
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "storage/host_pool.h"

namespace tier::storage {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

std::unique_ptr<HostPool> MakePool(uint64_t bytes, std::vector<PoolPartOptions> parts,
                                   bool huge_pages = true) {
  HostPoolOptions options{.bytes = bytes, .lock = LockMode::kOff};
  options.huge_pages = huge_pages;
  options.parts = std::move(parts);
  absl::StatusOr<std::unique_ptr<HostPool>> pool = HostPool::Create(options);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? *std::move(pool) : nullptr;
}

TEST(HostPoolParts, SharesFollowTheWeightsOnHugePageBoundaries) {
  std::unique_ptr<HostPool> pool = MakePool(64 * kMiB, {{-1, 1}, {-1, 3}});
  ASSERT_NE(pool, nullptr);
  ASSERT_EQ(pool->part_count(), 2u);
  std::vector<PoolPartUsage> parts = pool->PartUsage();
  EXPECT_EQ(parts[0].offset, 0u);
  EXPECT_EQ(parts[0].capacity_bytes, 16 * kMiB);
  EXPECT_EQ(parts[1].offset, 16 * kMiB);
  EXPECT_EQ(parts[1].capacity_bytes, 48 * kMiB);
  EXPECT_EQ(pool->largest_part_bytes(), 48 * kMiB);
  EXPECT_EQ(pool->Usage().capacity_bytes, 64 * kMiB);

  // Thirds of 64 MiB: 2 MiB granules, the last part takes the rest.
  pool = MakePool(64 * kMiB, {{-1, 1}, {-1, 1}, {-1, 1}});
  ASSERT_NE(pool, nullptr);
  parts = pool->PartUsage();
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].capacity_bytes, 20 * kMiB);
  EXPECT_EQ(parts[1].capacity_bytes, 20 * kMiB);
  EXPECT_EQ(parts[2].capacity_bytes, 24 * kMiB);
  EXPECT_EQ(parts[2].offset, 40 * kMiB);
}

TEST(HostPoolParts, APoolTooSmallForItsPartsIsRefused) {
  HostPoolOptions options{.bytes = 3 * kMiB, .lock = LockMode::kOff};
  options.parts = {{-1, 1}, {-1, 1}};  // 2 MiB granules: 2 + 1
  absl::StatusOr<std::unique_ptr<HostPool>> pool = HostPool::Create(options);
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
  options.parts = {{-1, 0}};
  EXPECT_FALSE(HostPool::Create(options).ok());
  options.huge_pages = false;  // small-page granules fit
  options.parts = {{-1, 1}, {-1, 1}};
  EXPECT_TRUE(HostPool::Create(options).ok());
}

TEST(HostPoolParts, LocalFirstThenRemoteCountedThenNothing) {
  std::unique_ptr<HostPool> pool = MakePool(8 * kMiB, {{-1, 1}, {-1, 1}}, false);
  ASSERT_NE(pool, nullptr);
  // Part 1 (4 MiB) serves its own GPU's four 1 MiB extents.
  std::vector<Extent> local;
  for (int i = 0; i < 4; ++i) {
    std::optional<Extent> e = pool->Allocate(kMiB, 1);
    ASSERT_TRUE(e);
    EXPECT_EQ(pool->PartOf(e->offset), 1);
    EXPECT_GE(e->offset, 4 * kMiB);
    local.push_back(*e);
  }
  // Full: the next ones go to part 0, counted there as remote.
  std::optional<Extent> remote = pool->Allocate(kMiB, 1);
  ASSERT_TRUE(remote);
  EXPECT_EQ(pool->PartOf(remote->offset), 0);
  std::vector<PoolPartUsage> parts = pool->PartUsage();
  EXPECT_EQ(parts[1].local_allocations, 4u);
  EXPECT_EQ(parts[1].remote_allocations, 0u);
  EXPECT_EQ(parts[0].remote_allocations, 1u);
  EXPECT_EQ(parts[0].local_allocations, 0u);
  EXPECT_EQ(parts[1].used_bytes, 4 * kMiB);
  EXPECT_EQ(parts[0].used_bytes, kMiB);
  // An extent larger than any part never fits, though the pool has that much free in total.
  EXPECT_FALSE(pool->Allocate(5 * kMiB, 0));
  // Part 0's own GPU still gets its part's room.
  std::optional<Extent> zero = pool->Allocate(3 * kMiB, 0);
  ASSERT_TRUE(zero);
  EXPECT_EQ(pool->PartOf(zero->offset), 0);
  EXPECT_FALSE(pool->Allocate(4096, 0));  // everything is taken
  EXPECT_FALSE(pool->Allocate(4096, 1));
  EXPECT_FALSE(pool->Allocate(4096));

  // Each extent goes back to its own part.
  pool->Free(*remote);
  parts = pool->PartUsage();
  EXPECT_EQ(parts[0].used_bytes, 3 * kMiB);
  EXPECT_EQ(parts[1].used_bytes, 4 * kMiB);
  pool->Free(local[2]);
  parts = pool->PartUsage();
  EXPECT_EQ(parts[1].used_bytes, 3 * kMiB);
  EXPECT_EQ(parts[1].allocations, 3u);
  std::optional<Extent> again = pool->Allocate(kMiB, 1);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, local[2]);  // the freed range, in its own part
  EXPECT_EQ(pool->Usage().used_bytes, 7 * kMiB);
}

TEST(HostPoolParts, NoPreferenceTakesTheEmptiestPart) {
  std::unique_ptr<HostPool> pool = MakePool(8 * kMiB, {{-1, 1}, {-1, 1}}, false);
  ASSERT_NE(pool, nullptr);
  ASSERT_TRUE(pool->Allocate(2 * kMiB, 0));
  std::optional<Extent> any = pool->Allocate(kMiB);
  ASSERT_TRUE(any);
  EXPECT_EQ(pool->PartOf(any->offset), 1);
  std::optional<Extent> out_of_range = pool->Allocate(kMiB, 7);  // no such part: any
  ASSERT_TRUE(out_of_range);
  EXPECT_EQ(pool->PartOf(out_of_range->offset), 1);
  std::vector<PoolPartUsage> parts = pool->PartUsage();
  EXPECT_EQ(parts[1].any_allocations, 2u);
  EXPECT_EQ(parts[0].local_allocations, 1u);
}

TEST(HostPoolParts, ConcurrentAllocateAndFreeAcrossPartsKeepAccountsExact) {
  std::unique_ptr<HostPool> pool = MakePool(16 * kMiB, {{-1, 1}, {-1, 1}}, false);
  ASSERT_NE(pool, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, t] {
      std::vector<Extent> held;
      for (int i = 0; i < 2000; ++i) {
        // Large enough that a part fills now and then and remote allocations happen.
        if (auto e = pool->Allocate(256 * 1024 * (1 + i % 5), t % 3 == 2 ? -1 : t % 2)) {
          held.push_back(*e);
        }
        if (held.size() > 4) {
          pool->Free(held.front());
          held.erase(held.begin());
        }
      }
      for (const Extent& e : held) pool->Free(e);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(pool->Usage().used_bytes, 0u);
  EXPECT_EQ(pool->Usage().allocations, 0u);
  uint64_t handed_out = 0;
  for (const PoolPartUsage& part : pool->PartUsage()) {
    EXPECT_EQ(part.free_bytes, 8 * kMiB);
    handed_out += part.local_allocations + part.remote_allocations + part.any_allocations;
  }
  EXPECT_GT(handed_out, 0u);
}

// get_mempolicy(2) without libnuma: the policy of the mapping at `addr` (MPOL_F_ADDR), or the node
// its page is on (MPOL_F_NODE | MPOL_F_ADDR).
constexpr int kMpolDefault = 0;
constexpr int kMpolBind = 2;
constexpr unsigned long kMpolFNode = 1;
constexpr unsigned long kMpolFAddr = 2;

bool NodeZeroExists() { return std::filesystem::exists("/sys/devices/system/node/node0"); }

TEST(HostPoolParts, EachPartsRangeIsBoundToItsNode) {
  if (!NodeZeroExists()) GTEST_SKIP() << "no NUMA node 0 in sysfs";
  // Part 0 bound to node 0, part 1 unbound, part 2 bound to node 0 again.
  std::unique_ptr<HostPool> pool = MakePool(24 * kMiB, {{0, 1}, {-1, 1}, {0, 1}});
  ASSERT_NE(pool, nullptr);
  std::vector<PoolPartUsage> parts = pool->PartUsage();
  ASSERT_EQ(parts.size(), 3u);
  for (size_t i = 0; i < parts.size(); ++i) {
    EXPECT_EQ(parts[i].numa_node, i == 1 ? -1 : 0);
    // First, middle and last page of the part.
    for (uint64_t at : {uint64_t{0}, parts[i].capacity_bytes / 2, parts[i].capacity_bytes - 4096}) {
      char* addr = pool->base() + parts[i].offset + at;
      int mode = -1;
      unsigned long mask[16] = {};
      long rc = syscall(SYS_get_mempolicy, &mode, mask, 16 * 64, addr, kMpolFAddr);
      if (rc != 0 && errno == ENOSYS) GTEST_SKIP() << "kernel without NUMA policies";
      ASSERT_EQ(rc, 0) << "part " << i;
      if (i == 1) {
        EXPECT_EQ(mode, kMpolDefault) << "part " << i << " +" << at;
      } else {
        EXPECT_EQ(mode, kMpolBind) << "part " << i << " +" << at;
        EXPECT_EQ(mask[0], 1ul) << "part " << i << " +" << at;  // node 0 only
      }
      // The page exists (the pool is populated) and is on node 0 (bound, or the only node).
      int node = -1;
      ASSERT_EQ(syscall(SYS_get_mempolicy, &node, nullptr, 0, addr, kMpolFNode | kMpolFAddr), 0);
      if (i != 1) {
        EXPECT_EQ(node, 0) << "part " << i;
      }
    }
  }
  // And the pool works across the boundaries.
  std::optional<Extent> e = pool->Allocate(kMiB, 2);
  ASSERT_TRUE(e);
  EXPECT_EQ(pool->PartOf(e->offset), 2);
  pool->At(*e)[0] = 1;
}

TEST(HostPoolParts, BindingToANodeThatDoesNotExistFailsCleanly) {
  HostPoolOptions options{.bytes = 8 * kMiB, .lock = LockMode::kOff};
  options.parts = {{0, 1}, {1000, 1}};
  absl::StatusOr<std::unique_ptr<HostPool>> pool = HostPool::Create(options);
  ASSERT_FALSE(pool.ok());
  EXPECT_NE(pool.status().message().find("NUMA node 1000"), std::string::npos) << pool.status();
}

}  // namespace
}  // namespace tier::storage
