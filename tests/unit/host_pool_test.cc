#include "storage/host_pool.h"

#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tier::storage {
namespace {

TEST(HostPool, CreatesUsableMemoryAndHandsOutExtents) {
  auto pool = HostPool::Create({.bytes = 8 << 20, .alignment = 4096, .numa_node = -1,
                                .lock = LockMode::kOff});
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::optional<Extent> e = (*pool)->Allocate(1 << 20);
  ASSERT_TRUE(e);
  std::memset((*pool)->At(*e), 0xab, 1 << 20);
  EXPECT_EQ(static_cast<unsigned char>((*pool)->At(*e)[12345]), 0xab);
  EXPECT_EQ((*pool)->Usage().used_bytes, 1u << 20);
  (*pool)->Free(*e);
  EXPECT_EQ((*pool)->Usage().used_bytes, 0u);
  EXPECT_FALSE((*pool)->locked());
}

TEST(HostPool, RejectsBadOptions) {
  EXPECT_FALSE(HostPool::Create({.bytes = 0}).ok());
  EXPECT_FALSE(HostPool::Create({.bytes = 1 << 20, .alignment = 3000}).ok());
}

TEST(HostPool, BestEffortLockRunsEvenWhenMlockIsRefused) {
  auto pool = HostPool::Create({.bytes = 4 << 20, .lock = LockMode::kBestEffort});
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->bytes(), 4u << 20);
}

TEST(HostPool, ConcurrentAllocateAndFreeKeepAccountsExact) {
  auto pool = HostPool::Create({.bytes = 64 << 20, .lock = LockMode::kOff});
  ASSERT_TRUE(pool.ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        if (auto e = (*pool)->Allocate(4096 * (1 + i % 7))) (*pool)->Free(*e);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ((*pool)->Usage().used_bytes, 0u);
  EXPECT_EQ((*pool)->Usage().allocations, 0u);
}

}  // namespace
}  // namespace tier::storage
