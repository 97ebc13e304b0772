// HealthMonitor: when tierd says NOT_SERVING (a liveness probe then restarts it under every
// session), and when it must not.
#include "daemon/control/health_monitor.h"

#include <gtest/gtest.h>

namespace tier::daemon {
namespace {

TEST(HealthMonitor, ServingWhileJobsMove) {
  DaemonMetrics metrics;
  HealthMonitor health(metrics, [] { return uint64_t{100000}; }, 1000);
  metrics.unticketed_in_flight.Add(/*session_id=*/1, 3);
  metrics.last_progress_ms.Store(/*session_id=*/1, 99500);
  EXPECT_TRUE(health.Check(100000).ok());
}

TEST(HealthMonitor, NotServingWhenJobsWithoutATicketStall) {
  DaemonMetrics metrics;
  HealthMonitor health(metrics, [] { return uint64_t{100000}; }, 1000);
  metrics.unticketed_in_flight.Add(/*session_id=*/1, 3);
  metrics.last_progress_ms.Store(/*session_id=*/1, 90000);
  EXPECT_EQ(health.Check(100000).code(), absl::StatusCode::kUnavailable);
}

TEST(HealthMonitor, NotServingWhenThePollerStopped) {
  DaemonMetrics metrics;
  HealthMonitor health(metrics, [] { return uint64_t{1000}; }, 1000);
  EXPECT_EQ(health.Check(1000 + HealthMonitor::kPollerStallMs + 1).code(),
            absl::StatusCode::kUnavailable);
}

// Finding 11 (issue 30): a client queues a job without a ticket behind one whose ticket it never
// raises. Those jobs are the client's to hold, and must not make tierd NOT_SERVING.
TEST(HealthMonitor, JobsAClientHoldsBehindItsTicketDoNotCount) {
  DaemonMetrics metrics;
  uint64_t held = 2;
  HealthMonitor health(metrics, [] { return uint64_t{100000}; }, 1000, [&] { return held; });
  metrics.unticketed_in_flight.Add(/*session_id=*/1, 2);
  metrics.last_progress_ms.Store(/*session_id=*/1, 90000);
  EXPECT_TRUE(health.Check(100000).ok());
  held = 1;  // one of them is stuck in tierd itself
  EXPECT_EQ(health.Check(100000).code(), absl::StatusCode::kUnavailable);
}

// The counts are kept per session shard: a job of one session completing is progress for all.
TEST(HealthMonitor, ProgressOfAnySessionCounts) {
  DaemonMetrics metrics;
  HealthMonitor health(metrics, [] { return uint64_t{100000}; }, 1000);
  metrics.unticketed_in_flight.Add(/*session_id=*/1, 2);
  metrics.unticketed_in_flight.Add(/*session_id=*/2, 1);
  metrics.last_progress_ms.Store(/*session_id=*/1, 90000);
  metrics.last_progress_ms.Store(/*session_id=*/2, 99500);
  EXPECT_TRUE(health.Check(100000).ok());
  metrics.last_progress_ms.Store(/*session_id=*/2, 90000);
  EXPECT_EQ(health.Check(100000).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tier::daemon
