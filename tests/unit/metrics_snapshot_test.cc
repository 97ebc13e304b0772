// The Prometheus form of a hand-made MetricsSnapshot, through prometheus-cpp's text serializer:
// names, labels, units and histogram buckets as a scrape sees them; and UserTotals, which keeps
// per-user counters monotonic while sessions come and go.
#include "daemon/metrics/metrics_snapshot.h"

#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics_sample.h"
#include "prometheus/text_serializer.h"

namespace tier::daemon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Exposition(const MetricsSnapshot& snapshot) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, ToMetricFamilies(snapshot));
  return out.str();
}

TEST(MetricsSnapshot, BuildInfoHealthAndPool) {
  std::string text = Exposition(SampleSnapshot());
  EXPECT_THAT(text, HasSubstr("# TYPE tierd_build_info gauge\n"
                              "tierd_build_info{version=\"0.1.0\",engine=\"cuda\",api_version=\"1\","
                              "ring_version=\"2\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("tierd_health_state{state=\"serving\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("tierd_health_state{state=\"not_serving\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("tierd_pool_pinned 1\n"));
  EXPECT_THAT(text, HasSubstr("tierd_pool_pin_seconds 0.038\n"));
  EXPECT_THAT(text, HasSubstr("tierd_start_time_seconds 1700000000\n"));
}

TEST(MetricsSnapshot, TiersAndSpillFiles) {
  std::string text = Exposition(SampleSnapshot());
  EXPECT_THAT(text, HasSubstr("tierd_tier_capacity_bytes{tier=\"host\"} 1073741824\n"));
  EXPECT_THAT(text, HasSubstr("tierd_tier_used_bytes{tier=\"host\"} 268435456\n"));
  EXPECT_THAT(text, HasSubstr("tierd_tier_free_bytes{tier=\"host\"} 805306368\n"));
  EXPECT_THAT(text, HasSubstr("tierd_tier_objects{tier=\"host\"} 12\n"));
  // The NVMe tier is the sum of its files.
  EXPECT_THAT(text, HasSubstr("tierd_tier_capacity_bytes{tier=\"nvme\"} 8589934592\n"));
  EXPECT_THAT(text, HasSubstr("tierd_tier_objects{tier=\"nvme\"} 6\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE tierd_spill_file_written_bytes_total counter\n"
                              "tierd_spill_file_written_bytes_total{directory=\"/nvme0/tierd\"} "
                              "5242880\n"));
  EXPECT_THAT(text, HasSubstr("tierd_spill_file_direct_io{directory=\"/nvme1/tierd\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("tierd_spill_io_errors_total{op=\"read\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("tierd_spill_checksum_failures_total 2\n"));
  EXPECT_THAT(text, HasSubstr("tierd_spilled_bytes_total 10485760\n"));
  EXPECT_THAT(text, HasSubstr("tierd_prefetch_hits_total 4\n"));
}

TEST(MetricsSnapshot, HostPoolPartsPerNumaNode) {
  std::string text = Exposition(SampleSnapshot());
  EXPECT_THAT(text, HasSubstr("tierd_pool_part_capacity_bytes{part=\"1\",numa_node=\"1\"} "
                              "536870912\n"));
  EXPECT_THAT(text, HasSubstr("tierd_pool_part_used_bytes{part=\"0\",numa_node=\"0\"} "
                              "201326592\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE tierd_pool_part_allocations_total counter\n"));
  EXPECT_THAT(text, HasSubstr("tierd_pool_part_allocations_total{part=\"0\",numa_node=\"0\","
                              "locality=\"remote\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("tierd_pool_part_allocations_total{part=\"1\",numa_node=\"1\","
                              "locality=\"local\"} 30\n"));
  // An unbound part says so.
  MetricsSnapshot s = SampleSnapshot();
  s.pool_parts.resize(1);
  s.pool_parts[0].numa_node = -1;
  EXPECT_THAT(Exposition(s),
              HasSubstr("tierd_pool_part_used_bytes{part=\"0\",numa_node=\"none\"} "));
}

TEST(MetricsSnapshot, WithoutNvmeTheTrafficCountersStillReadZero) {
  MetricsSnapshot s = SampleSnapshot();
  s.has_nvme = false;
  s.spill_files.clear();
  s.spill = {};
  std::string text = Exposition(s);
  EXPECT_THAT(text, Not(HasSubstr("tier=\"nvme\"")));
  EXPECT_THAT(text, Not(HasSubstr("tierd_spill_file_")));
  EXPECT_THAT(text, HasSubstr("tierd_spilled_bytes_total 0\n"));
  EXPECT_THAT(text, HasSubstr("tierd_spill_io_errors_total{op=\"write\"} 0\n"));
}

TEST(MetricsSnapshot, JobsByKindAndCodeAndTheLatencyHistogram) {
  std::string text = Exposition(SampleSnapshot());
  EXPECT_THAT(text, HasSubstr("tierd_jobs_submitted_total{kind=\"offload\"} 10\n"));
  EXPECT_THAT(text, HasSubstr("tierd_jobs_submitted_total{kind=\"free\"} 0\n"));
  EXPECT_THAT(text, Not(HasSubstr("tierd_jobs_submitted_total{kind=\"invalid\"}")));
  EXPECT_THAT(text, HasSubstr("tierd_jobs_completed_total{kind=\"offload\",code=\"OK\"} 9\n"));
  EXPECT_THAT(text, HasSubstr(
      "tierd_jobs_completed_total{kind=\"offload\",code=\"RESOURCE_EXHAUSTED\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("tierd_jobs_completed_total{kind=\"reload\",code=\"OK\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE tierd_job_latency_seconds histogram\n"));
  const std::string labels = "kind=\"offload\",size_class=\"64KiB-1MiB\"";
  EXPECT_THAT(text, HasSubstr("tierd_job_latency_seconds_count{" + labels + "} 4\n"));
  EXPECT_THAT(text, HasSubstr("tierd_job_latency_seconds_sum{" + labels + "} 31.00007\n"));
  // Cumulative, in seconds.
  EXPECT_THAT(text, HasSubstr("tierd_job_latency_seconds_bucket{" + labels + ",le=\"5e-06\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("tierd_job_latency_seconds_bucket{" + labels + ",le=\"1e-05\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("tierd_job_latency_seconds_bucket{" + labels + ",le=\"5e-05\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("tierd_job_latency_seconds_bucket{" + labels + ",le=\"30\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("tierd_job_latency_seconds_bucket{" + labels + ",le=\"+Inf\"} 4\n"));
  // Empty histograms are left out.
  EXPECT_THAT(text, Not(HasSubstr("size_class=\"0-64KiB\"")));
  EXPECT_THAT(text, HasSubstr("tierd_jobs_in_flight 3\n"));
  EXPECT_THAT(text, HasSubstr("tierd_offloaded_bytes_total 123456\n"));
}

TEST(MetricsSnapshot, UsersByUidAndLanesNeverByPid) {
  std::string text = Exposition(SampleSnapshot());
  EXPECT_THAT(text, HasSubstr("tierd_sessions{uid=\"1000\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("tierd_sessions_pending 1\n"));
  EXPECT_THAT(text, HasSubstr("tierd_user_used_bytes{uid=\"1000\"} 67108864\n"));
  EXPECT_THAT(text, HasSubstr("tierd_user_jobs_completed_total{uid=\"1000\"} 20\n"));
  EXPECT_THAT(text, HasSubstr("tierd_user_reloaded_bytes_total{uid=\"1000\"} 2097152\n"));
  EXPECT_THAT(text, HasSubstr(
      "tierd_lane_wait_seconds{uid=\"1000\",gpu=\"0\",direction=\"D2H\"} 12.5\n"));
  EXPECT_THAT(text, HasSubstr(
      "tierd_lane_queued_jobs{uid=\"1000\",gpu=\"0\",direction=\"D2H\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("tierd_client_buffers 5\n"));
  EXPECT_THAT(text, HasSubstr("tierd_gpu_lanes 2\n"));
  EXPECT_THAT(text, HasSubstr("tierd_client_reserved_bytes 339302416384\n"));
  EXPECT_THAT(text, Not(HasSubstr("pid")));
}

TEST(MetricsSnapshot, NoUsersNoLanesNoEmptyFamilies) {
  MetricsSnapshot s = SampleSnapshot();
  s.users.clear();
  s.user_totals.clear();
  s.lanes.clear();
  std::string text = Exposition(s);
  EXPECT_THAT(text, Not(HasSubstr("tierd_lane_wait_seconds")));
  EXPECT_THAT(text, Not(HasSubstr("# TYPE tierd_sessions gauge")));
}

TEST(MetricsSnapshot, PersistentObjectsAndTheirJournal) {
  MetricsSnapshot s = SampleSnapshot();
  s.persistent.objects = 1;
  s.persistent.bytes = 2;
  s.persistent.limits.max_bytes = 3;
  s.persistent.journal.file_bytes = 4;
  s.persistent.journal.live_bytes = 5;
  s.persistent.journal.max_bytes = 6;
  s.persistent.writes_queued = 7;
  s.persistent.journal.compactions = 8;
  s.persistent.journal.errors = 9;
  std::string text = Exposition(s);
  EXPECT_THAT(text, HasSubstr("tierd_persistent_objects 1\n"));
  EXPECT_THAT(text, HasSubstr("tierd_persistent_bytes 2\n"));
  EXPECT_THAT(text, HasSubstr("tierd_persistent_max_bytes 3\n"));
  EXPECT_THAT(text, HasSubstr("tierd_persistent_journal_bytes 4\n"));
  EXPECT_THAT(text, HasSubstr("tierd_persistent_journal_live_bytes 5\n"));
  EXPECT_THAT(text, HasSubstr("tierd_persistent_journal_max_bytes 6\n"));
  EXPECT_THAT(text, HasSubstr("tierd_persistent_journal_queued 7\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE tierd_persistent_journal_compactions_total counter\n"
                              "tierd_persistent_journal_compactions_total 8\n"));
  EXPECT_THAT(text, HasSubstr("tierd_persistent_journal_errors_total 9\n"));
}

TEST(UserTotals, CountersOfEndedSessionsStayWithTheirUser) {
  UserTotals totals;
  auto counts = [](uint64_t session, uint32_t uid, uint64_t jobs) {
    return SessionCounts{session, uid, UserCounters{jobs, 0, jobs * 10, 0}};
  };
  auto t = totals.Update({counts(1, 1000, 5), counts(2, 1000, 3), counts(3, 2000, 1)});
  EXPECT_EQ(t[1000].jobs_completed, 8u);
  EXPECT_EQ(t[2000].jobs_completed, 1u);
  // Session 1 ended: the 5 jobs it was last seen with stay with uid 1000; session 2 goes on.
  t = totals.Update({counts(2, 1000, 4), counts(3, 2000, 1)});
  EXPECT_EQ(t[1000].jobs_completed, 9u);
  EXPECT_EQ(t[1000].bytes_offloaded, 90u);
  t = totals.Update({});
  EXPECT_EQ(t[1000].jobs_completed, 9u);
  EXPECT_EQ(t[2000].jobs_completed, 1u);
  t = totals.Update({counts(4, 1000, 1)});
  EXPECT_EQ(t[1000].jobs_completed, 10u);
}

}  // namespace
}  // namespace tier::daemon
