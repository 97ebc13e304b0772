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
  EXPECT_TRUE(gauge.Add());
  EXPECT_FALSE(gauge.Add());
  EXPECT_EQ(gauge.value(), 2u);
  gauge.Sub();
  gauge.Sub();
  EXPECT_EQ(gauge.value(), 0u);
  EXPECT_TRUE(gauge.Add());
}

TEST(JobGauge, AwaitZeroReturnsAtOnceWhenIdle) {
  JobGauge gauge;
  const auto start = Clock::now();
  EXPECT_EQ(gauge.AwaitZero(start + seconds(30)), 0u);
  EXPECT_LT(Clock::now() - start, seconds(5));
}

TEST(JobGauge, AwaitZeroWakesWhenTheLastJobEnds) {
  JobGauge gauge;
  for (int i = 0; i < 3; ++i) gauge.Add();
  std::thread jobs([&] {
    for (int i = 0; i < 3; ++i) {
      std::this_thread::sleep_for(milliseconds(50));
      gauge.Sub();
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
  gauge.Add();
  gauge.Add();
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
    gauge.Add();
    std::thread job([&] { gauge.Sub(); });
    ASSERT_EQ(gauge.AwaitZero(Clock::now() + seconds(20)), 0u) << "round " << round;
    job.join();
  }
  EXPECT_LT(Clock::now() - start, seconds(20));
}

}  // namespace
}  // namespace tier::daemon
