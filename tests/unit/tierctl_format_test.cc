#include "tierctl/format.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace tier::ctl {
namespace {

TEST(FormatBytesTest, BinaryUnitsWithOneDecimal) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.0 KiB");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(768ull << 20), "768.0 MiB");
  EXPECT_EQ(FormatBytes(64ull << 30), "64.0 GiB");
  EXPECT_EQ(FormatBytes(3ull << 39), "1.5 TiB");
  EXPECT_EQ(FormatBytes(std::numeric_limits<uint64_t>::max()), "16384.0 PiB");
}

TEST(FormatBytesTest, MovesUpAUnitInsteadOfPrinting1024) {
  EXPECT_EQ(FormatBytes((1ull << 20) - 1), "1.0 MiB");
  EXPECT_EQ(FormatBytes((1ull << 20) - 60), "1023.9 KiB");
}

TEST(FormatDurationTest, HumanDurations) {
  EXPECT_EQ(FormatDuration(0), "0ms");
  EXPECT_EQ(FormatDuration(999), "999ms");
  EXPECT_EQ(FormatDuration(1000), "1s");
  EXPECT_EQ(FormatDuration(59'999), "59s");
  EXPECT_EQ(FormatDuration(60'000), "1m00s");
  EXPECT_EQ(FormatDuration(307'000), "5m07s");
  EXPECT_EQ(FormatDuration(3'723'000), "1h02m03s");
  EXPECT_EQ(FormatDuration(90'061'000), "1d01h01m01s");
}

TEST(FormatBandwidthTest, GigabytesOrMegabytesPerSecond) {
  EXPECT_EQ(FormatBandwidth(23.4e9), "23.4 GB/s");
  EXPECT_EQ(FormatBandwidth(1e9), "1.0 GB/s");
  EXPECT_EQ(FormatBandwidth(999.96e6), "1.0 GB/s");
  EXPECT_EQ(FormatBandwidth(512e6), "512.0 MB/s");
  EXPECT_EQ(FormatBandwidth(0), "0.0 MB/s");
  EXPECT_EQ(FormatBandwidth(-5), "0.0 MB/s");
  EXPECT_EQ(FormatBandwidth(std::nan("")), "0.0 MB/s");
}

TEST(FormatPercentTest, OfWholeOrDash) {
  EXPECT_EQ(FormatPercent(1, 4), "25.0%");
  EXPECT_EQ(FormatPercent(0, 4), "0.0%");
  EXPECT_EQ(FormatPercent(0, 0), "-");
}

}  // namespace
}  // namespace tier::ctl
