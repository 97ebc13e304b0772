#include "storage/extent_allocator.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tier::storage {
namespace {

TEST(ExtentAllocator, RoundsUpAndTracksUsage) {
  ExtentAllocator a(1 << 20, 4096);
  std::optional<Extent> e = a.Allocate(1);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->bytes, 4096u);
  EXPECT_EQ(a.used_bytes(), 4096u);
  EXPECT_EQ(a.free_bytes(), (1u << 20) - 4096);
  EXPECT_TRUE(a.Free(*e));
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.free_ranges(), 1u);
}

TEST(ExtentAllocator, RefusesZeroAndTooLarge) {
  ExtentAllocator a(64 << 10, 4096);
  EXPECT_FALSE(a.Allocate(0));
  EXPECT_FALSE(a.Allocate((64 << 10) + 1));
  EXPECT_TRUE(a.Allocate(64 << 10));
  EXPECT_FALSE(a.Allocate(1));
}

TEST(ExtentAllocator, BestFitPicksTheSmallestHole) {
  ExtentAllocator a(40 << 12, 4096);
  std::vector<Extent> e;
  for (int i = 0; i < 10; ++i) e.push_back(*a.Allocate(4 << 12));
  ASSERT_TRUE(a.Free(e[1]));  // a 4-page hole
  Extent two_a = *a.Allocate(2 << 12);
  ASSERT_TRUE(a.Free(e[5]));  // another 4-page hole
  ASSERT_TRUE(a.Free(two_a));  // back to a 4-page hole at e[1]
  ASSERT_TRUE(a.Free(e[7]));
  ASSERT_TRUE(a.Free(e[8]));  // an 8-page hole
  Extent four = *a.Allocate(4 << 12);
  EXPECT_EQ(four.offset, e[1].offset);  // smallest fitting, lowest offset
  Extent eight = *a.Allocate(8 << 12);
  EXPECT_EQ(eight.offset, e[7].offset);
}

TEST(ExtentAllocator, CoalescesNeighboursOnFree) {
  ExtentAllocator a(3 << 12, 4096);
  Extent x = *a.Allocate(4096), y = *a.Allocate(4096), z = *a.Allocate(4096);
  EXPECT_TRUE(a.Free(x));
  EXPECT_TRUE(a.Free(z));
  EXPECT_EQ(a.free_ranges(), 2u);
  EXPECT_TRUE(a.Free(y));
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_EQ(a.largest_free(), 3u << 12);
}

TEST(ExtentAllocator, RejectsDoubleAndForeignFrees) {
  ExtentAllocator a(8 << 12, 4096);
  Extent x = *a.Allocate(4096);
  EXPECT_TRUE(a.Free(x));
  EXPECT_FALSE(a.Free(x));
  EXPECT_FALSE(a.Free(Extent{100, 4096}));
  EXPECT_FALSE(a.Free(Extent{0, 1 << 20}));
  EXPECT_EQ(a.free_bytes(), 8u << 12);
}

TEST(ExtentAllocator, RandomWorkloadNeverOverlapsAndReturnsEverything) {
  ExtentAllocator a(16 << 20, 4096);
  std::mt19937 rng(42);
  std::vector<Extent> live;
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      if (auto e = a.Allocate(1 + rng() % (256 << 10))) live.push_back(*e);
    } else {
      size_t i = rng() % live.size();
      ASSERT_TRUE(a.Free(live[i]));
      live[i] = live.back();
      live.pop_back();
    }
  }
  std::sort(live.begin(), live.end(), [](auto& l, auto& r) { return l.offset < r.offset; });
  uint64_t used = 0;
  for (size_t i = 0; i < live.size(); ++i) {
    used += live[i].bytes;
    if (i > 0) {
      ASSERT_LE(live[i - 1].offset + live[i - 1].bytes, live[i].offset);
    }
  }
  EXPECT_EQ(a.used_bytes(), used);
  for (const Extent& e : live) ASSERT_TRUE(a.Free(e));
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_EQ(a.free_bytes(), 16u << 20);
}

}  // namespace
}  // namespace tier::storage
