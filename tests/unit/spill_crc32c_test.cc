#include "storage/crc32c.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tier::storage {
namespace {

using CrcFn = std::function<uint32_t(uint32_t, const void*, size_t)>;

// Bit at a time, straight from the definition: the oracle the fast paths are checked against.
uint32_t Reference(const void* data, size_t len) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xFFFFFFFF;
  for (size_t i = 0; i < len; ++i) {
    crc ^= p[i];
    for (int b = 0; b < 8; ++b) crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78 : 0);
  }
  return ~crc;
}

struct Path {
  const char* name;
  CrcFn fn;
  bool available;
};

class Crc32cPathTest : public ::testing::TestWithParam<int> {
 protected:
  Path path() const {
    if (GetParam() == 0) return {"table", Crc32cExtendPortable, true};
    return {"sse4.2", Crc32cExtendSse42, Crc32cHasSse42()};
  }
  void SetUp() override {
    if (!path().available) GTEST_SKIP() << "this CPU has no SSE4.2: hardware path not testable";
  }
  uint32_t Crc(const void* data, size_t len) const { return path().fn(0, data, len); }
};

TEST_P(Crc32cPathTest, KnownAnswers) {
  // The check value of the CRC-32C catalogue entry and the iSCSI vectors of RFC 3720, B.4.
  EXPECT_EQ(Crc("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc("", 0), 0u);
  unsigned char buf[32];
  std::memset(buf, 0, sizeof(buf));
  EXPECT_EQ(Crc(buf, 32), 0x8A9136AAu);
  std::memset(buf, 0xFF, sizeof(buf));
  EXPECT_EQ(Crc(buf, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(Crc(buf, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(31 - i);
  EXPECT_EQ(Crc(buf, 32), 0x113FDB5Cu);
}

TEST_P(Crc32cPathTest, MatchesReferenceAtEveryLengthAndAlignment) {
  std::mt19937 rng(42);
  std::vector<unsigned char> data(3 * 8192 * 2 + 4096);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  // Short lengths at every start offset mod 8, then lengths around the interleaving block sizes.
  for (size_t start = 0; start < 8; ++start) {
    for (size_t len = 0; len < 800; ++len) {
      ASSERT_EQ(Crc(data.data() + start, len), Reference(data.data() + start, len))
          << "start " << start << " len " << len;
    }
  }
  for (size_t len : {767u, 768u, 769u, 24575u, 24576u, 24577u, 24576u + 768u, 49152u, 50000u}) {
    for (size_t start : {0u, 1u, 5u}) {
      ASSERT_EQ(Crc(data.data() + start, len), Reference(data.data() + start, len))
          << "start " << start << " len " << len;
    }
  }
}

TEST_P(Crc32cPathTest, ExtendComposes) {
  std::mt19937 rng(7);
  std::vector<unsigned char> data(200000);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  uint32_t whole = Crc(data.data(), data.size());
  for (size_t split : {0ul, 1ul, 4095ul, 4096ul, 65536ul, 123457ul, 200000ul}) {
    uint32_t head = path().fn(0, data.data(), split);
    EXPECT_EQ(path().fn(head, data.data() + split, data.size() - split), whole) << split;
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, Crc32cPathTest, ::testing::Values(0, 1),
                         [](const auto& info) { return info.param == 0 ? "Table" : "Sse42"; });

TEST(Crc32c, DispatchAgreesWithBothPaths) {
  std::vector<char> data(100000, 'x');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31);
  uint32_t expected = Crc32cExtendPortable(0, data.data(), data.size());
  EXPECT_EQ(Crc32c(data.data(), data.size()), expected);
  if (Crc32cHasSse42()) {
    EXPECT_EQ(Crc32cExtendSse42(0, data.data(), data.size()), expected);
    EXPECT_STREQ(Crc32cImplementation(), "sse4.2");
  } else {
    EXPECT_STREQ(Crc32cImplementation(), "table");
  }
}

}  // namespace
}  // namespace tier::storage
