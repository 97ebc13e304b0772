// LinkMeter: what a GPU's link achieved for tierd's copies, from issue and completion times
// alone (engine/link_meter.h).
#include "engine/link_meter.h"

#include <gtest/gtest.h>

namespace tier::engine {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kMs = 1'000'000;

TEST(LinkMeter, NoSampleNoRate) {
  LinkMeter meter;
  EXPECT_EQ(meter.Current(0).bytes_per_s, 0);
  meter.Issued(0, kMiB);
  EXPECT_EQ(meter.Current(1 * kMs).bytes_per_s, 0);  // nothing completed yet
}

// Copies back to back: the rate is bytes over the time they were in flight, not over the wall
// clock (idle gaps between bursts do not count).
TEST(LinkMeter, RateIsBytesOverBusyTime) {
  LinkMeter meter;
  // Burst 1: 4 copies of 16 MiB issued at once, done at 1, 2, 3, 4 ms (16 GiB/s).
  for (int i = 0; i < 4; ++i) meter.Issued(0, 16 * kMiB);
  for (int i = 1; i <= 4; ++i) meter.Completed(i * kMs, 16 * kMiB);
  // An idle second, then burst 2: the same at the same speed.
  const uint64_t t = 1000 * kMs;
  for (int i = 0; i < 4; ++i) meter.Issued(t, 16 * kMiB);
  for (int i = 1; i <= 4; ++i) meter.Completed(t + i * kMs, 16 * kMiB);
  LinkMeter::Rate rate = meter.Current(t + 5 * kMs);
  EXPECT_EQ(rate.bytes, 128 * kMiB);
  EXPECT_EQ(rate.busy_ns, 8 * kMs);
  EXPECT_NEAR(rate.bytes_per_s, 16.0 * kMiB / 1e-3, 1);
  EXPECT_EQ(meter.total_bytes(), 128 * kMiB);
}

// A slow first period (memory just registered, the stream starting) does not drag the figure:
// the median of the samples' rates is the link's.
TEST(LinkMeter, OneSlowPeriodDoesNotDragTheFigure) {
  LinkMeter meter;
  uint64_t t = 0;
  meter.Issued(t, 256 * kMiB);
  meter.Completed(t + 25 * kMs, 256 * kMiB);  // ~10 GiB/s: the first round
  for (int round = 1; round <= 3; ++round) {
    t = round * 100 * kMs;
    meter.Issued(t, 256 * kMiB);
    meter.Completed(t + 5 * kMs, 256 * kMiB);  // 50 GiB/s
  }
  EXPECT_NEAR(meter.Current(t + 6 * kMs).bytes_per_s, 256.0 * kMiB / 5e-3, 1);
}

// Periods that moved little are dominated by how late completion is seen: they are left out.
TEST(LinkMeter, SmallPeriodsAreNotSamples) {
  LinkMeter meter;
  meter.Issued(0, kMiB);
  meter.Completed(5 * kMs, kMiB);  // 1 MiB "in" 5 ms: detection delay, not the link
  EXPECT_EQ(meter.Current(6 * kMs).bytes_per_s, 0);
  EXPECT_EQ(meter.total_bytes(), kMiB);
}

// Many small copies measure the cost per copy, not the link: left out.
TEST(LinkMeter, PeriodsOfSmallCopiesAreNotSamples) {
  LinkMeter meter;
  for (int i = 0; i < 256; ++i) meter.Issued(0, 64 << 10);
  for (int i = 1; i <= 256; ++i) meter.Completed(i * 10'000, 64 << 10);  // 16 MiB in 2.56 ms
  EXPECT_EQ(meter.Current(3 * kMs).bytes_per_s, 0);
}

// A stream that never goes idle still gives samples: periods are cut every kMaxPeriodNs.
TEST(LinkMeter, ABusyStreamIsSampledWhileItRuns) {
  LinkMeter meter;
  uint64_t now = 0;
  meter.Issued(now, 32 * kMiB);
  for (int i = 0; i < 300; ++i) {  // one 32 MiB copy completes each ms, the next already queued
    meter.Issued(now, 32 * kMiB);
    now += kMs;
    meter.Completed(now, 32 * kMiB);
  }
  LinkMeter::Rate rate = meter.Current(now);
  EXPECT_GT(rate.busy_ns, 0u);
  EXPECT_NEAR(rate.bytes_per_s / (32.0 * kMiB / 1e-3), 1.0, 0.02);
}

// Only the last kWindowNs count: the link's recent figure, not its history.
TEST(LinkMeter, OldSamplesAgeOut) {
  LinkMeter meter;
  meter.Issued(0, 64 * kMiB);
  meter.Completed(8 * kMs, 64 * kMiB);  // 8 GiB/s
  const uint64_t later = LinkMeter::kWindowNs + 100 * kMs;
  meter.Issued(later, 64 * kMiB);
  meter.Completed(later + 2 * kMs, 64 * kMiB);  // 32 GiB/s
  EXPECT_NEAR(meter.Current(later + 3 * kMs).bytes_per_s, 64.0 * kMiB / 2e-3, 1);
}

}  // namespace
}  // namespace tier::engine
