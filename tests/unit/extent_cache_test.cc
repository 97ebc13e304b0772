// A pool part's per-GPU extent caches (storage/extent_cache.h): a GPU's thread takes back what it
// freed without the part's lock (so another GPU's jobs holding that lock cannot hold it, issue
// 26), cached extents count as free, every cache is emptied before an allocation fails, a cache
// stays within its bounds, and concurrent GPUs keep the accounts exact.
#include "storage/extent_cache.h"

#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "common/thread_gpu.h"
#include "gtest/gtest.h"
#include "storage/pool_part.h"

namespace tier::storage {

struct PoolPartPeer {
  static Mutex& Lock(PoolPart& part) { return part.mu_; }
};

namespace {

constexpr uint64_t kKiB = 1024, kMiB = 1024 * kKiB;

// Runs `f` on a thread of GPU `gpu` (as its ring poller or worker would).
template <typename F>
auto OnGpu(int gpu, F f) {
  return std::async(std::launch::async, [gpu, f] {
    SetThreadGpu(gpu);
    return f();
  });
}

TEST(ExtentCache, AGpuTakesBackWhatItFreedWhileAnotherHoldsThePart) {
  PoolPart part(0, 64 * kMiB, 4096, -1);
  const Extent first = OnGpu(1, [&] {
    std::optional<Extent> e = part.Allocate(4 * kKiB, Locality::kAny);
    EXPECT_TRUE(e.has_value());
    part.Free(*e);  // into GPU 1's cache
    return *e;
  }).get();
  std::future<std::optional<Extent>> again;
  {
    MutexLock busy(&PoolPartPeer::Lock(part));  // GPU 0's flood, in the allocator
    again = OnGpu(1, [&] {
      std::optional<Extent> e = part.Allocate(4 * kKiB, Locality::kAny);
      if (e) part.Free(*e);
      return e;
    });
    ASSERT_EQ(again.wait_for(std::chrono::seconds(10)), std::future_status::ready)
        << "GPU 1's job waited for the part's lock";
  }
  std::optional<Extent> e = again.get();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(*e, first);
}

TEST(ExtentCache, CachedExtentsCountAsFree) {
  PoolPart part(0, 64 * kMiB, 4096, -1);
  OnGpu(0, [&] {
    std::optional<Extent> e = part.Allocate(100 * kKiB, Locality::kLocal);
    EXPECT_TRUE(e.has_value());
    EXPECT_EQ(part.Usage().used_bytes, 100 * kKiB);
    part.Free(*e);
    return 0;
  }).get();
  PoolPartUsage usage = part.Usage();
  EXPECT_EQ(usage.used_bytes, 0u);
  EXPECT_EQ(usage.free_bytes, 64 * kMiB);
  EXPECT_EQ(usage.allocations, 0u);
  EXPECT_EQ(usage.local_allocations, 1u);
  EXPECT_EQ(part.free_bytes(), 64 * kMiB);
}

// Small extents kept by two GPUs split the part; an allocation of the whole part (from a thread
// of no GPU, or of a GPU) empties the caches first and succeeds.
TEST(ExtentCache, EveryCacheIsEmptiedBeforeAnAllocationFails) {
  PoolPart part(0, 1 * kMiB, 4096, -1);  // caches of 64 KiB each
  for (int gpu : {0, 1}) {
    OnGpu(gpu, [&] {
      std::vector<Extent> extents;
      for (int i = 0; i < 8; ++i) extents.push_back(*part.Allocate(4 * kKiB, Locality::kAny));
      for (const Extent& e : extents) part.Free(e);
      return 0;
    }).get();
  }
  std::optional<Extent> whole = part.Allocate(1 * kMiB, Locality::kAny);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->offset, 0u);
  EXPECT_FALSE(part.Allocate(4 * kKiB, Locality::kAny).has_value());
  EXPECT_TRUE(part.Free(*whole));
  EXPECT_EQ(part.Usage().used_bytes, 0u);
}

TEST(ExtentCache, ACacheKeepsWithinItsBoundsAndPushesOutTheOldest) {
  ExtentCache cache(64 * kKiB);
  EXPECT_EQ(cache.Put(Extent{0, 128 * kKiB}).size(), 1u) << "larger than the cap: not kept";
  EXPECT_EQ(cache.Put(Extent{0, ExtentCache::kMaxExtentBytes + 4096}).size(), 1u);
  for (uint64_t i = 0; i < 16; ++i) EXPECT_TRUE(cache.Put(Extent{i * 4096, 4096}).empty());
  EXPECT_EQ(cache.bytes(), 64 * kKiB);
  std::vector<Extent> out = cache.Put(Extent{16 * 4096, 4096});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0], (Extent{0, 4096})) << "the oldest goes";
  EXPECT_EQ(cache.bytes(), 64 * kKiB);
  ASSERT_TRUE(cache.Take(4096).has_value());
  EXPECT_FALSE(cache.Take(8192).has_value()) << "only the exact size";
  EXPECT_EQ(cache.TakeAll().size(), 15u);
  EXPECT_EQ(cache.bytes(), 0u);
  EXPECT_EQ(cache.count(), 0u);
}

TEST(ExtentCache, AGpuDoesNotTakeAnotherGpusExtents) {
  PoolPart part(0, 64 * kMiB, 4096, -1);
  const Extent kept = OnGpu(1, [&] {
    Extent e = *part.Allocate(8 * kKiB, Locality::kAny);
    part.Free(e);
    return e;
  }).get();
  const Extent other = OnGpu(2, [&] { return *part.Allocate(8 * kKiB, Locality::kAny); }).get();
  EXPECT_NE(other.offset, kept.offset);
  EXPECT_EQ(part.Usage().used_bytes, 8 * kKiB);
}

// Several GPUs' threads allocate and free at once (mixed sizes, some frees from a thread of no
// GPU): no extent handed out twice, and once all are back, the whole part is one free range.
TEST(ExtentCache, ConcurrentGpusKeepTheAccountsExact) {
  PoolPart part(0, 64 * kMiB, 4096, -1);
  std::vector<std::future<int>> gpus;
  for (int gpu = 0; gpu < 4; ++gpu) {
    gpus.push_back(OnGpu(gpu, [&part, gpu] {
      int errors = 0;
      std::vector<Extent> held;
      for (int i = 0; i < 2000; ++i) {
        const uint64_t bytes = ((i + gpu) % 3 + 1) * 16 * kKiB;
        if (std::optional<Extent> e = part.Allocate(bytes, Locality::kLocal)) {
          held.push_back(*e);
        } else {
          ++errors;
        }
        if (held.size() > 8) {
          part.Free(held.front());
          held.erase(held.begin());
        }
      }
      for (const Extent& e : held) part.Free(e);
      return errors;
    }));
  }
  for (auto& g : gpus) EXPECT_EQ(g.get(), 0);
  EXPECT_EQ(part.Usage().used_bytes, 0u);
  EXPECT_EQ(part.Usage().allocations, 0u);
  std::optional<Extent> whole = part.Allocate(64 * kMiB, Locality::kAny);
  ASSERT_TRUE(whole.has_value()) << "an extent was lost or handed out twice";
}

}  // namespace
}  // namespace tier::storage
