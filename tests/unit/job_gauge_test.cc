// JobGauge: the daemon's jobs in flight and the drain's wait for none. The wait must wake when
// the last job ends (a lost wake-up would hold a drain for its whole timeout) and give up at its
// deadline.
#include "daemon/jobs/job_gauge.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

namespace tier::daemon {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(JobGauge, CountsAndSaysWhenItRoseFromZero) {
  JobGauge gauge;
  EXPECT_TRUE(gauge.Add(1));
  EXPECT_FALSE(gauge.Add(1));
  EXPECT_EQ(gauge.value(), 2u);
  gauge.Sub(1);
  gauge.Sub(1);
  EXPECT_EQ(gauge.value(), 0u);
  EXPECT_TRUE(gauge.Add(1));
}

TEST(JobGauge, AwaitZeroReturnsAtOnceWhenIdle) {
  JobGauge gauge;
  const auto start = Clock::now();
  EXPECT_EQ(gauge.AwaitZero(start + seconds(30)), 0u);
  EXPECT_LT(Clock::now() - start, seconds(5));
}

TEST(JobGauge, AwaitZeroWakesWhenTheLastJobEnds) {
  JobGauge gauge;
  for (int i = 0; i < 3; ++i) gauge.Add(1);
  std::thread jobs([&] {
    for (int i = 0; i < 3; ++i) {
      std::this_thread::sleep_for(milliseconds(50));
      gauge.Sub(1);
    }
  });
  const auto start = Clock::now();
  EXPECT_EQ(gauge.AwaitZero(start + seconds(30)), 0u);
  const auto waited = Clock::now() - start;
  jobs.join();
  EXPECT_GE(waited, milliseconds(100));  // it did wait for the jobs
  EXPECT_LT(waited, seconds(5));         // and woke when they ended, not at the deadline
}

TEST(JobGauge, AwaitZeroGivesUpAtTheDeadlineWithTheJobsLeft) {
  JobGauge gauge;
  gauge.Add(1);
  gauge.Add(1);
  const auto start = Clock::now();
  EXPECT_EQ(gauge.AwaitZero(start + milliseconds(100)), 2u);
  const auto waited = Clock::now() - start;
  EXPECT_GE(waited, milliseconds(100));
  EXPECT_LT(waited, seconds(5));
}

// The race the sequentially consistent counters close: the last job ends while the waiter is
// between reading the count and sleeping. Each round's wait must end with the job, not at the
// 20 s deadline; 2000 rounds take well under a second when no wake-up is lost.
TEST(JobGauge, NoWakeUpIsLostWhenTheLastJobEndsAsTheWaitBegins) {
  JobGauge gauge;
  const auto start = Clock::now();
  for (int round = 0; round < 2000; ++round) {
    gauge.Add(1);
    std::thread job([&] { gauge.Sub(1); });
    ASSERT_EQ(gauge.AwaitZero(Clock::now() + seconds(20)), 0u) << "round " << round;
    job.join();
  }
  EXPECT_LT(Clock::now() - start, seconds(20));
}

// Sessions of different GPUs count on different shards (no cache line every GPU's threads write):
// each session's shard rises from zero on its own, and the gauge is their sum.
TEST(JobGauge, SessionsCountOnTheirOwnShards) {
  JobGauge gauge;
  EXPECT_TRUE(gauge.Add(1));
  EXPECT_TRUE(gauge.Add(2));  // session 1's job does not make session 2's shard busy
  EXPECT_FALSE(gauge.Add(2));
  EXPECT_EQ(gauge.value(), 3u);
  gauge.Sub(2);
  gauge.Sub(2);
  EXPECT_EQ(gauge.value(), 1u);
  EXPECT_TRUE(gauge.Add(2));
  gauge.Sub(2);
  gauge.Sub(1);
  EXPECT_EQ(gauge.value(), 0u);
}

// The last job of one shard ends while another shard still has one: the wait goes on until both
// ended, and ends with the second.
TEST(JobGauge, AwaitZeroWaitsForEveryShard) {
  JobGauge gauge;
  gauge.Add(1);
  gauge.Add(2);
  std::thread jobs([&] {
    gauge.Sub(1);
    std::this_thread::sleep_for(milliseconds(50));
    gauge.Sub(2);
  });
  const auto start = Clock::now();
  EXPECT_EQ(gauge.AwaitZero(start + seconds(30)), 0u);
  jobs.join();
  EXPECT_LT(Clock::now() - start, seconds(5));
}

}  // namespace
}  // namespace tier::daemon
