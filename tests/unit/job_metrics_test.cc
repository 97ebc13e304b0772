// JobMetrics and SubmitTimes: jobs by kind and status code, latency histograms by kind and size
// class, and the fixed table that carries submit times without a per-job map.
#include "daemon/metrics/job_metrics.h"

#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tier::daemon {
namespace {

ring::SubmissionEntry Entry(ring::Opcode opcode, uint64_t job_id, uint64_t len = 0) {
  ring::SubmissionEntry entry;
  entry.opcode = static_cast<uint32_t>(opcode);
  entry.job_id = job_id;
  entry.len = len;
  return entry;
}

TEST(JobMetrics, SizeClassesAndNames) {
  EXPECT_EQ(SizeClassOf(JobKind::kOffload, 1), 0);
  EXPECT_EQ(SizeClassOf(JobKind::kOffload, 64 << 10), 0);
  EXPECT_EQ(SizeClassOf(JobKind::kReload, (64 << 10) + 1), 1);
  EXPECT_EQ(SizeClassOf(JobKind::kReload, 1 << 20), 1);
  EXPECT_EQ(SizeClassOf(JobKind::kOffload, 16 << 20), 2);
  EXPECT_EQ(SizeClassOf(JobKind::kOffload, 256 << 20), 3);
  EXPECT_EQ(SizeClassOf(JobKind::kOffload, (256ull << 20) + 1), 4);
  EXPECT_EQ(SizeClassOf(JobKind::kFree, 1 << 20), kNoSize);
  EXPECT_EQ(SizeClassName(1), "64KiB-1MiB");
  EXPECT_EQ(SizeClassName(kNoSize), "none");
  EXPECT_EQ(JobKindName(JobKindOf(static_cast<uint32_t>(ring::Opcode::kReload))), "reload");
  EXPECT_EQ(JobKindName(JobKindOf(99)), "invalid");
}

TEST(JobMetrics, LatencyLandsInItsKindSizeAndBucket) {
  JobMetrics metrics;
  ring::SubmissionEntry offload = Entry(ring::Opcode::kOffload, 7, 2 << 20);
  metrics.Started(3, offload);
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  metrics.Completed(3, offload, 0);

  EXPECT_EQ(metrics.started(JobKind::kOffload), 1u);
  EXPECT_EQ(metrics.completed(JobKind::kOffload, 0), 1u);
  EXPECT_EQ(metrics.unmeasured(), 0u);
  LatencySnapshot h = metrics.latency(JobKind::kOffload, 2);  // 1MiB-16MiB
  ASSERT_EQ(h.count, 1u);
  EXPECT_GE(h.sum_ns, 3'000'000u);
  EXPECT_LT(h.sum_ns, 10'000'000'000u);
  int bucket = 0;
  while (h.buckets[bucket] == 0) ++bucket;
  // The bucket's bound is at least the latency, the one below it is not.
  ASSERT_LT(bucket, kLatencyBuckets - 1);
  EXPECT_GE(kLatencyBoundsNs[bucket], h.sum_ns);
  EXPECT_LT(kLatencyBoundsNs[bucket - 1], h.sum_ns);
  EXPECT_EQ(metrics.latency(JobKind::kOffload, 0).count, 0u);
  EXPECT_EQ(metrics.latency(JobKind::kReload, 2).count, 0u);
}

TEST(JobMetrics, StatusCodesCountApartAndUnknownNumbersAsUnknown) {
  JobMetrics metrics;
  for (uint64_t job = 1; job <= 3; ++job) {
    ring::SubmissionEntry reload = Entry(ring::Opcode::kReload, job, 4096);
    metrics.Started(1, reload);
    metrics.Completed(1, reload, job == 1 ? 0 : 8);  // RESOURCE_EXHAUSTED
  }
  ring::SubmissionEntry odd = Entry(ring::Opcode::kFree, 4);
  metrics.Started(1, odd);
  metrics.Completed(1, odd, 1234);
  EXPECT_EQ(metrics.completed(JobKind::kReload, 0), 1u);
  EXPECT_EQ(metrics.completed(JobKind::kReload, 8), 2u);
  EXPECT_EQ(metrics.completed(JobKind::kFree, 2), 1u);
  EXPECT_EQ(metrics.latency(JobKind::kReload, 0).count, 3u);
  EXPECT_EQ(metrics.latency(JobKind::kFree, kNoSize).count, 1u);
}

TEST(JobMetrics, AJobThatNeverStartedIsCountedButNotMeasured) {
  JobMetrics metrics;
  metrics.Completed(5, Entry(ring::Opcode::kOffload, 1, 4096), 14);  // refused while draining
  EXPECT_EQ(metrics.started(JobKind::kOffload), 0u);
  EXPECT_EQ(metrics.completed(JobKind::kOffload, 14), 1u);
  EXPECT_EQ(metrics.unmeasured(), 1u);
  EXPECT_EQ(metrics.latency(JobKind::kOffload, 0).count, 0u);
}

TEST(SubmitTimes, ASessionsConsecutiveJobsNeverCollide) {
  SubmitTimes times;
  for (uint64_t job = 1; job <= SubmitTimes::kSlots; ++job) times.Record(9, job, 1000 + job);
  for (uint64_t job = 1; job <= SubmitTimes::kSlots; ++job) {
    std::optional<uint64_t> elapsed = times.Elapsed(9, job, 1'000'000);
    ASSERT_TRUE(elapsed.has_value()) << job;
    ASSERT_EQ(*elapsed, 1'000'000 - 1000 - job);
  }
  // The job kSlots later takes the first one's slot: the first is no longer measured.
  times.Record(9, SubmitTimes::kSlots + 1, 5);
  EXPECT_FALSE(times.Elapsed(9, 1, 10).has_value());
  EXPECT_EQ(times.Elapsed(9, SubmitTimes::kSlots + 1, 10), 5u);
}

TEST(SubmitTimes, SessionsDoNotReadEachOthersTimes) {
  SubmitTimes times;
  times.Record(1, 1, 100);
  EXPECT_EQ(times.Elapsed(1, 1, 150), 50u);
  // Another session's job 1 was never recorded; sessions 1..1000 all tell theirs apart.
  int matched = 0;
  for (uint64_t session = 2; session <= 1000; ++session) {
    matched += times.Elapsed(session, 1, 150).has_value();
  }
  EXPECT_EQ(matched, 0);
  EXPECT_FALSE(times.Elapsed(1, 2, 150).has_value());
}

TEST(SubmitTimes, TimeWrapsAfter48Bits) {
  SubmitTimes times;
  const uint64_t before_wrap = (uint64_t{1} << 48) - 10;
  times.Record(1, 1, before_wrap);
  EXPECT_EQ(times.Elapsed(1, 1, before_wrap + 25), 25u);
}

// Many threads complete jobs at once (the poller, engine workers): no count is lost. The jobs are
// one session's, each thread's ids apart, so no two share a submit-time slot: with a session per
// thread, sessions 1 and 3 (and 2 and 4) map their first 5000 ids onto overlapping slots, and a
// thread descheduled between Started and Completed under load lost its sample to the other's
// (1 run in 30 beside two busy loops). Across sessions that is by design (submit_times.h).
TEST(JobMetrics, ConcurrentCompletionsAllCount) {
  JobMetrics metrics;
  constexpr int kThreads = 4;
  constexpr uint64_t kJobs = 5000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&metrics, t] {
      for (uint64_t job = 1; job <= kJobs; ++job) {
        ring::SubmissionEntry entry = Entry(ring::Opcode::kOffload, t * kJobs + job, 4096);
        metrics.Started(1, entry);
        metrics.Completed(1, entry, 0);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(metrics.started(JobKind::kOffload), kThreads * kJobs);
  EXPECT_EQ(metrics.completed(JobKind::kOffload, 0), kThreads * kJobs);
  EXPECT_EQ(metrics.latency(JobKind::kOffload, 0).count + metrics.unmeasured(), kThreads * kJobs);
  EXPECT_EQ(metrics.unmeasured(), 0u);
}

// Each session counts into its own shard (the threads of different GPUs write different cache
// lines); every reading is the sum over the shards.
TEST(JobMetrics, SessionsCountInTheirShardsAndReadingsSumThem) {
  JobMetrics metrics;
  for (uint64_t session = 1; session <= 2 * kMetricShards; ++session) {
    ring::SubmissionEntry reload = Entry(ring::Opcode::kReload, session, 4096);
    metrics.Started(session, reload);
    metrics.Completed(session, reload, session % 2 == 0 ? 0 : 5);
  }
  EXPECT_NE(MetricShardOf(1), MetricShardOf(2));
  EXPECT_EQ(metrics.started(JobKind::kReload), 2u * kMetricShards);
  EXPECT_EQ(metrics.completed(JobKind::kReload, 0), 1u * kMetricShards);
  EXPECT_EQ(metrics.completed(JobKind::kReload, 5), 1u * kMetricShards);
  EXPECT_EQ(metrics.latency(JobKind::kReload, 0).count, 2u * kMetricShards);
  EXPECT_EQ(metrics.unmeasured(), 0u);
}

}  // namespace
}  // namespace tier::daemon
