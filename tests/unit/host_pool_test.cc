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

// Huge pages and parallel faulting change how the pool is made, not what it is: every byte is
// there and writable, the huge-page pool starts on a 2 MiB boundary (so the kernel can back it
// with huge pages), and the threads asked for are used (one per 64 MiB at most).
TEST(HostPool, HugePagesAndParallelPopulateGiveTheSamePool) {
  for (bool huge : {false, true}) {
    for (uint32_t threads : {1u, 3u}) {
      HostPoolOptions options{.bytes = 256ull << 20, .lock = LockMode::kBestEffort};
      options.huge_pages = huge;
      options.populate_threads = threads;
      auto pool = HostPool::Create(options);
      ASSERT_TRUE(pool.ok()) << pool.status();
      const PoolSetup& setup = (*pool)->setup();
      EXPECT_EQ(setup.threads, threads) << "huge " << huge;
      EXPECT_EQ((*pool)->bytes(), 256ull << 20);
      if (huge) {
        EXPECT_EQ(reinterpret_cast<uintptr_t>((*pool)->base()) % (2 << 20), 0u);
      } else {
        EXPECT_FALSE(setup.huge_pages);
        EXPECT_EQ(setup.huge_bytes, 0u);
      }
      EXPECT_LE(setup.huge_bytes, (*pool)->bytes());
      // Every page, first and last byte of every thread's range included.
      char* base = (*pool)->base();
      for (uint64_t off = 0; off < (*pool)->bytes(); off += 4096) base[off] = char(off >> 12);
      base[(*pool)->bytes() - 1] = 7;
      for (uint64_t off = 0; off < (*pool)->bytes(); off += 4096) {
        ASSERT_EQ(base[off], char(off >> 12)) << off;
      }
      EXPECT_EQ(base[(*pool)->bytes() - 1], 7);
    }
  }
}

// A pool smaller than a huge page is made of small pages (nothing to align).
TEST(HostPool, SmallPoolNeedsNoHugePage) {
  HostPoolOptions options{.bytes = 1 << 20, .lock = LockMode::kOff};
  options.huge_pages = true;
  auto pool = HostPool::Create(options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_FALSE((*pool)->setup().huge_pages);
  EXPECT_EQ((*pool)->setup().threads, 1u);
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
