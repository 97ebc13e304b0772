// The log rate limiter: a burst per interval, then silence, then one line that counts the silence.
#include "common/log_rate_limiter.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tier {
namespace {

TEST(LogRateLimiter, BurstThenSilenceThenCountOfWhatWasDropped) {
  LogRateLimiter limiter(3, 1000);
  uint64_t suppressed = 99;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(limiter.Allow(5000 + i, &suppressed));
    EXPECT_EQ(suppressed, 0u);
  }
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(limiter.Allow(5100 + i / 10, &suppressed));
  // The next interval: one line reports the 1000 dropped, the next ones report none.
  ASSERT_TRUE(limiter.Allow(6000, &suppressed));
  EXPECT_EQ(suppressed, 1000u);
  ASSERT_TRUE(limiter.Allow(6001, &suppressed));
  EXPECT_EQ(suppressed, 0u);
}

TEST(LogRateLimiter, ManyThreadsWriteAtMostTheBurst) {
  LogRateLimiter limiter(5, 60 * 1000);
  std::atomic<int> allowed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      uint64_t suppressed;
      for (int i = 0; i < 1000; ++i) allowed += limiter.Allow(LogClockMs(), &suppressed);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(allowed.load(), 5);
}

}  // namespace
}  // namespace tier
