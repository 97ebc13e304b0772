// The placement policy alone: next-use order of victims and prefetches, and the watermarks.
#include "daemon/tiers/spill_policy.h"

#include <vector>

#include "gtest/gtest.h"

namespace tier::daemon {
namespace {

storage::PoolUsage Used(uint64_t used, uint64_t capacity = 1000) {
  storage::PoolUsage usage;
  usage.capacity_bytes = capacity;
  usage.used_bytes = used;
  usage.free_bytes = capacity - used;
  return usage;
}

std::vector<int> DrainUsedLast(NextUseQueue<int>& queue) {
  std::vector<int> order;
  while (auto item = queue.TakeUsedLast()) order.push_back(*item);
  return order;
}

std::vector<int> DrainUsedSoonest(NextUseQueue<int>& queue) {
  std::vector<int> order;
  while (auto item = queue.TakeUsedSoonest()) order.push_back(*item);
  return order;
}

TEST(SpillPolicyTest, WithoutHintsTheOldestIsSpilledFirst) {
  // Activation offload: offloaded 1, 2, 3, 4, reloaded 4, 3, 2, 1. Object 1 is needed last.
  NextUseQueue<int> queue;
  for (int seq : {3, 1, 4, 2}) queue.Add(NextUse{0, static_cast<uint64_t>(seq)}, seq);
  EXPECT_EQ(DrainUsedLast(queue), (std::vector<int>{1, 2, 3, 4}));
}

TEST(SpillPolicyTest, HintsOrderVictimsByNextUseFurthestFirst) {
  NextUseQueue<int> queue;
  // hint = expected reload order (smaller = sooner); seq deliberately disagrees.
  queue.Add(NextUse{5, 1}, 5);
  queue.Add(NextUse{50, 2}, 50);
  queue.Add(NextUse{1, 3}, 1);
  queue.Add(NextUse{20, 4}, 20);
  EXPECT_EQ(DrainUsedLast(queue), (std::vector<int>{50, 20, 5, 1}));
}

TEST(SpillPolicyTest, HintedObjectsGoBeforeUnhintedOnes) {
  NextUseQueue<int> queue;
  queue.Add(NextUse{0, 1}, -1);  // unhinted, oldest of all
  queue.Add(NextUse{1, 9}, 1);   // hinted, soonest hint
  queue.Add(NextUse{0, 2}, -2);
  EXPECT_EQ(DrainUsedLast(queue), (std::vector<int>{1, -1, -2}));
}

TEST(SpillPolicyTest, PrefetchTakesTheOtherEndOfTheSameOrder) {
  NextUseQueue<int> victims, prefetches;
  std::vector<NextUse> uses = {{0, 7}, {3, 2}, {0, 1}, {9, 4}, {0, 12}, {1, 5}};
  for (size_t i = 0; i < uses.size(); ++i) {
    victims.Add(uses[i], static_cast<int>(i));
    prefetches.Add(uses[i], static_cast<int>(i));
  }
  std::vector<int> spill_order = DrainUsedLast(victims);
  std::vector<int> fetch_order = DrainUsedSoonest(prefetches);
  EXPECT_EQ(fetch_order, std::vector<int>(spill_order.rbegin(), spill_order.rend()));
  // Soonest: the newest unhinted object (seq 12), then 7, 1, then hints 1, 3, 9.
  EXPECT_EQ(fetch_order, (std::vector<int>{4, 0, 2, 5, 1, 3}));
}

TEST(SpillPolicyTest, EqualRanksKeepEveryItem) {
  NextUseQueue<int> queue;
  queue.Add(NextUse{4, 1}, 1);
  queue.Add(NextUse{4, 2}, 2);
  EXPECT_EQ(queue.size(), 2u);
  std::vector<int> order = DrainUsedLast(queue);
  ASSERT_EQ(order.size(), 2u);
  EXPECT_NE(order[0], order[1]);
  EXPECT_TRUE(queue.empty());
  EXPECT_FALSE(queue.TakeUsedSoonest().has_value());
}

TEST(SpillPolicyTest, SpillingStartsAboveHighAndGoesOnDownToLow) {
  SpillPolicy policy(Watermarks{90, 75});
  EXPECT_FALSE(policy.MustSpill(Used(900)));  // at the mark: not above it
  EXPECT_TRUE(policy.MustSpill(Used(901)));
  EXPECT_TRUE(policy.KeepSpilling(Used(800)));
  EXPECT_TRUE(policy.KeepSpilling(Used(751)));
  EXPECT_FALSE(policy.KeepSpilling(Used(750)));
  // Between the marks a new spill does not start.
  EXPECT_FALSE(policy.MustSpill(Used(800)));
}

TEST(SpillPolicyTest, PrefetchOnlyWhileThePoolStaysAtOrBelowLow) {
  SpillPolicy policy(Watermarks{90, 75});
  EXPECT_TRUE(policy.MayPrefetch(Used(0), 750));
  EXPECT_FALSE(policy.MayPrefetch(Used(0), 751));
  EXPECT_TRUE(policy.MayPrefetch(Used(700), 50));
  EXPECT_FALSE(policy.MayPrefetch(Used(700), 51));
  // What a prefetch brings back never starts a spill again (no ping-pong).
  for (uint64_t used = 0; used <= 750; used += 50) {
    for (uint64_t bytes = 0; used + bytes <= 1000; bytes += 10) {
      if (policy.MayPrefetch(Used(used), bytes)) {
        EXPECT_FALSE(policy.MustSpill(Used(used + bytes))) << used << " + " << bytes;
        EXPECT_FALSE(policy.KeepSpilling(Used(used + bytes))) << used << " + " << bytes;
      }
    }
  }
}

TEST(SpillPolicyTest, LowZeroSpillsEverythingAndNeverPrefetches) {
  SpillPolicy policy(Watermarks{50, 0});
  EXPECT_TRUE(policy.KeepSpilling(Used(1)));
  EXPECT_FALSE(policy.MayPrefetch(Used(0), 1));
}

TEST(SpillPolicyTest, LargePoolsDoNotOverflow) {
  SpillPolicy policy(Watermarks{90, 75});
  const uint64_t capacity = 1ull << 50;  // 1 PiB
  EXPECT_TRUE(policy.MustSpill(Used(capacity / 100 * 91, capacity)));
  EXPECT_FALSE(policy.MustSpill(Used(capacity / 100 * 89, capacity)));
}

}  // namespace
}  // namespace tier::daemon
