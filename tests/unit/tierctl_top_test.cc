// tierctl top: rates and percentiles from two samples of the status API, the text and JSON frames,
// the refresh loop; and the pieces it is made of (histogram quantiles, latency formatting).
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tierctl/commands.h"
#include "tierctl/format.h"
#include "tierctl/latency_quantile.h"
#include "tierctl/top.h"

namespace tier::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr uint64_t kMiB = 1ull << 20;

TEST(HistogramQuantile, InterpolatesInsideTheBucketLikePrometheus) {
  const std::vector<double> bounds = {0.001, 0.002, 0.004};
  // 10 samples in (0, 1ms], 10 in (1ms, 2ms], none above.
  EXPECT_DOUBLE_EQ(*HistogramQuantile(0.5, bounds, {10, 10, 0, 0}), 0.001);
  EXPECT_DOUBLE_EQ(*HistogramQuantile(0.25, bounds, {10, 10, 0, 0}), 0.0005);
  EXPECT_DOUBLE_EQ(*HistogramQuantile(0.75, bounds, {10, 10, 0, 0}), 0.0015);
  EXPECT_DOUBLE_EQ(*HistogramQuantile(1.0, bounds, {10, 10, 0, 0}), 0.002);
  // A rank in the +Inf bucket reads as the last finite bound.
  EXPECT_DOUBLE_EQ(*HistogramQuantile(0.99, bounds, {1, 0, 0, 9}), 0.004);
  EXPECT_FALSE(HistogramQuantile(0.5, bounds, {0, 0, 0, 0}).has_value());
  EXPECT_FALSE(HistogramQuantile(1.5, bounds, {1, 0, 0, 0}).has_value());
}

TEST(FormatSeconds, ThreeSignificantDigitsInTheUnitThatFits) {
  EXPECT_EQ(FormatSeconds(850e-9), "850ns");
  EXPECT_EQ(FormatSeconds(12.34e-6), "12.3us");
  EXPECT_EQ(FormatSeconds(4.567e-3), "4.57ms");
  EXPECT_EQ(FormatSeconds(0.2501), "250ms");
  EXPECT_EQ(FormatSeconds(1.234), "1.23s");
  EXPECT_EQ(FormatSeconds(999.7e-6), "1.00ms");
  EXPECT_EQ(FormatSeconds(-1), "0ns");
}

// A kind with all its jobs in one size class: `fast` completions at <= 1 ms, `slow` at <= 4 ms.
void SetKind(v1::GetStatusResponse& status, const std::string& kind, uint64_t fast, uint64_t slow,
             uint64_t failed) {
  v1::JobKindStatus* k = status.add_job_kinds();
  k->set_kind(kind);
  k->set_started(fast + slow + failed);
  k->set_completed(fast + slow);
  k->set_failed(failed);
  v1::LatencyHistogram* h = k->add_latency();
  h->set_size_class("64KiB-1MiB");
  for (uint64_t n : {fast, uint64_t{0}, slow, uint64_t{0}}) h->add_bucket_counts(n);
  h->set_count(fast + slow);
}

TopSample Sample(double time_s, uint64_t uptime_ms, uint64_t fast, uint64_t slow,
                 uint64_t offloaded, uint64_t session_offloaded) {
  TopSample s;
  s.time_s = time_s;
  v1::GetStatusResponse& st = s.status;
  st.set_version("0.1.0");
  st.set_engine("cuda");
  st.set_state(v1::HealthResponse::SERVING);
  st.set_uptime_ms(uptime_ms);
  st.set_sessions(1);
  st.set_jobs_in_flight(2);
  for (double bound : {0.001, 0.002, 0.004}) st.add_latency_bucket_bounds_seconds(bound);
  v1::TierStatus* host = st.add_tiers();
  host->set_name("host");
  host->set_capacity_bytes(1024 * kMiB);
  host->set_used_bytes(256 * kMiB);
  v1::TierStatus* nvme = st.add_tiers();
  nvme->set_name("nvme");
  nvme->set_capacity_bytes(4096 * kMiB);
  st.set_bytes_offloaded(offloaded);
  st.set_bytes_reloaded(offloaded / 2);
  st.set_bytes_spilled(offloaded / 4);
  st.set_spills(fast / 4);
  SetKind(st, "offload", fast, slow, 1);
  SetKind(st, "free", fast, 0, 0);
  v1::SessionInfo* session = s.sessions.add_sessions();
  session->set_session_id(7);
  session->set_name("trainer");
  session->set_attached(true);
  session->set_pid(4242);
  session->set_uid(1000);
  session->set_used_bytes(64 * kMiB);
  session->set_bytes_offloaded(session_offloaded);
  session->set_jobs_completed(fast);
  session->set_jobs_in_flight(2);
  v1::LaneInfo* lane = session->add_lanes();
  lane->set_gpu(0);
  lane->set_direction("D2H");
  lane->set_waiting_ticket(5);
  lane->set_client_ticket(4);
  lane->set_waiting_ms(12000);
  return s;
}

TEST(TopRender, RatesAndPercentilesComeFromTheDifferenceOfTwoSamples) {
  // Over 2 s: 2 GB offloaded (1 GB/s), 200 fast and 200 slow offloads (200 jobs/s), 2 failures.
  TopSample before = Sample(100.0, 60000, 100, 0, 1'000'000'000, 0);
  TopSample after = Sample(102.0, 62000, 300, 200, 3'000'000'000, 400'000'000);
  after.status.mutable_job_kinds(0)->set_failed(3);
  std::ostringstream out;
  RenderTop(&before, after, /*json=*/false, out);
  const std::string text = out.str();
  EXPECT_THAT(text, StartsWith("tierd 0.1.0 (engine cuda)  serving  up 1m02s  1 session  2 jobs "
                               "in flight  over 2.0s\n"));
  // host: in = offloads 1.0 GB/s, out = reloads 0.5 GB/s, ops = offload + reload jobs/s
  // ((500 + 3) - (100 + 1)) / 2 = 201; nvme: in = spills 250 MB/s, ops = spills/s 25.
  EXPECT_THAT(text, HasSubstr("host   1.0 GiB  256.0 MiB  25.0%    1.0 GB/s  500.0 MB/s    201\n"));
  EXPECT_THAT(text, HasSubstr("nvme   4.0 GiB        0 B   0.0%  250.0 MB/s    0.0 MB/s   25.0\n"));
  // Percentiles of the interval only: 200 fast (<= 1 ms) then 200 slow (2-4 ms): p50 at 1 ms,
  // p90 at 2 + 2 * 0.8 = 3.6 ms; the 100 fast ones of the first sample do not count.
  EXPECT_THAT(text, HasSubstr("offload     201       1.0  1.00ms  3.60ms  3.96ms\n"));
  EXPECT_THAT(text, HasSubstr("free        100         0"));
  // The session: 200 MB/s offloaded, 100 jobs/s, and what its lane waits for.
  EXPECT_THAT(text, HasSubstr(" 7  trainer  4242  1000  64.0 MiB  200.0 MB/s  0.0 MB/s     100"));
  EXPECT_THAT(text, HasSubstr("client: gpu0 D2H ticket 5 (at 4) 12s"));
}

TEST(TopRender, WithoutAPreviousSampleRatesAreDashes) {
  std::ostringstream out;
  RenderTop(nullptr, Sample(1.0, 1000, 10, 0, 0, 0), false, out);
  EXPECT_THAT(out.str(), HasSubstr("(rates from the next refresh)"));
  EXPECT_THAT(out.str(), HasSubstr("offload       -         -    -    -    -\n"));
}

TEST(TopRender, ARestartedDaemonIsNotComparedWithItsPredecessor) {
  TopSample before = Sample(1.0, 90000, 500, 0, 5'000'000'000, 0);
  TopSample after = Sample(2.0, 500, 10, 0, 0, 0);  // uptime went back: a new tierd
  std::ostringstream out;
  RenderTop(&before, after, false, out);
  EXPECT_THAT(out.str(), HasSubstr("(rates from the next refresh)"));
}

TEST(TopRender, JsonCarriesTheSameNumbers) {
  TopSample before = Sample(100.0, 60000, 100, 0, 1'000'000'000, 0);
  TopSample after = Sample(102.0, 62000, 300, 200, 3'000'000'000, 400'000'000);
  std::ostringstream out;
  RenderTop(&before, after, /*json=*/true, out);
  const std::string json = out.str();
  EXPECT_THAT(json, StartsWith("{\"interval_s\":2,\"version\":\"0.1.0\",\"engine\":\"cuda\","
                               "\"state\":\"serving\""));
  EXPECT_THAT(json, HasSubstr("{\"name\":\"host\",\"capacity_bytes\":1073741824,\"used_bytes\":"
                              "268435456,\"in_bytes_per_s\":1e+09,\"out_bytes_per_s\":5e+08,"
                              "\"ops_per_s\":200}"));
  EXPECT_THAT(json, HasSubstr("{\"kind\":\"offload\",\"jobs_per_s\":200,\"failed_per_s\":0,"
                              "\"p50_seconds\":0.001,\"p90_seconds\":0.0036"));
  EXPECT_THAT(json, HasSubstr("\"session_id\":7,\"name\":\"trainer\",\"pid\":4242,\"uid\":1000"));
  EXPECT_THAT(json, HasSubstr("\"offload_bytes_per_s\":2e+08,\"reload_bytes_per_s\":0,"
                              "\"jobs_per_s\":100,\"jobs_in_flight\":2,\"waiting_on\":"
                              "\"client: gpu0 D2H ticket 5 (at 4) 12s\"}"));
  EXPECT_EQ(json.back(), '\n');
  EXPECT_EQ(std::count(json.begin(), json.end(), '\n'), 1);
}

TEST(TopRender, JsonRatesAreNullWithoutAPreviousSample) {
  std::ostringstream out;
  RenderTop(nullptr, Sample(1.0, 1000, 10, 0, 0, 0), true, out);
  EXPECT_THAT(out.str(), StartsWith("{\"interval_s\":null,"));
  EXPECT_THAT(out.str(), HasSubstr("\"p50_seconds\":null"));
}

// A sampler that returns prepared samples, then fails like an unreachable daemon.
TopSampler Script(std::vector<TopSample> samples, int* calls) {
  return [samples, calls](TopSample& sample, int& exit_code) {
    if (*calls >= static_cast<int>(samples.size())) {
      exit_code = kExitNotRunning;
      return false;
    }
    sample = samples[(*calls)++];
    return true;
  };
}

TEST(TopLoop, OnceTakesTwoSamplesAndPrintsOneFrame) {
  int calls = 0;
  std::ostringstream out;
  TopOptions options;
  options.once = true;
  options.interval = std::chrono::milliseconds(1);
  auto sampler = Script({Sample(1.0, 1000, 0, 0, 0, 0), Sample(2.0, 2000, 10, 0, 0, 0)}, &calls);
  EXPECT_EQ(RunTop(sampler, options, out), kExitOk);
  EXPECT_EQ(calls, 2);
  EXPECT_THAT(out.str(), HasSubstr("over 1.0s"));
  EXPECT_THAT(out.str(), Not(HasSubstr("\x1b[")));
}

TEST(TopLoop, FramesFollowAsPlainTextOffATerminalAndReplaceEachOtherOnOne) {
  for (bool terminal : {false, true}) {
    int calls = 0;
    std::ostringstream out;
    TopOptions options;
    options.terminal = terminal;
    options.interval = std::chrono::milliseconds(1);
    options.max_frames = 2;
    std::vector<TopSample> samples = {Sample(1.0, 1000, 0, 0, 0, 0),
                                      Sample(2.0, 2000, 10, 0, 0, 0)};
    EXPECT_EQ(RunTop(Script(samples, &calls), options, out), kExitOk);
    const std::string text = out.str();
    EXPECT_THAT(text, HasSubstr("(rates from the next refresh)"));
    EXPECT_THAT(text, HasSubstr("over 1.0s"));
    const size_t clears = std::count(text.begin(), text.end(), '\x1b');
    EXPECT_EQ(clears, terminal ? 4u : 0u) << terminal;  // two escapes per frame
  }
}

TEST(TopLoop, AFailedSampleEndsItWithTheSamplersStatus) {
  int calls = 0;
  std::ostringstream out;
  TopOptions options;
  options.interval = std::chrono::milliseconds(1);
  EXPECT_EQ(RunTop(Script({Sample(1.0, 1000, 0, 0, 0, 0)}, &calls), options, out),
            kExitNotRunning);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace tier::ctl
