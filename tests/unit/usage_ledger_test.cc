// What clients hold in tierd, against the per-session, per-uid and node-wide limits: host memory
// mapped, and GPU address space reserved for VMM buffers (expandable segments), which one trainer
// with many streams could otherwise take from every other (each segment reserves 1.125 times its
// GPU's memory; the engine's bound for all of them is 32 TiB).
#include "daemon/sessions/usage_ledger.h"

#include <memory>
#include <string>

#include "daemon/sessions/session.h"
#include "fake_buffer.h"
#include "gtest/gtest.h"

namespace tier::daemon {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kSegment = 158 * kGiB;  // what PyTorch reserves per segment on an H200

ClientLimits Limits() {
  ClientLimits limits;
  limits.max_reserved_bytes_per_session = 4 * kSegment;
  limits.max_reserved_bytes_per_uid = 6 * kSegment;
  limits.max_mapped_bytes_per_uid = 8 * kGiB;
  limits.max_mapped_bytes = 12 * kGiB;
  return limits;
}

TEST(UsageLedger, ReservedAddressSpaceIsBoundedPerUidAndCountedApartFromHostMemory) {
  UsageLedger ledger(Limits());
  const BufferCharge segment{0, kSegment};
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(ledger.CheckBuffer(1000, segment).ok()) << i;
    ledger.AddBuffer(1000, segment);
  }
  absl::Status full = ledger.CheckBuffer(1000, segment);
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_NE(full.message().find("max_reserved_bytes_per_uid"), std::string::npos) << full;
  // Host memory is another budget: the uid can still register a memfd.
  EXPECT_TRUE(ledger.CheckBuffer(1000, BufferCharge{kGiB, 0}).ok());
  // Another user is not starved by the first.
  EXPECT_TRUE(ledger.CheckBuffer(2000, segment).ok());
  EXPECT_EQ(ledger.UsageOf(1000).reserved_bytes, 6 * kSegment);
  EXPECT_EQ(ledger.UsageOf(1000).mapped_bytes, 0u);
  EXPECT_EQ(ledger.Totals().reserved_bytes, 6 * kSegment);
  // Unregistering gives the room back.
  ledger.RemoveBuffer(1000, segment);
  EXPECT_TRUE(ledger.CheckBuffer(1000, segment).ok());
  EXPECT_EQ(ledger.Totals().reserved_bytes, 5 * kSegment);
  for (int i = 0; i < 5; ++i) ledger.RemoveBuffer(1000, segment);
  EXPECT_EQ(ledger.Totals().reserved_bytes, 0u);
  EXPECT_EQ(ledger.Totals().buffers, 0u);
}

TEST(UsageLedger, HostMemoryLimitsStillHold) {
  UsageLedger ledger(Limits());
  ledger.AddBuffer(1000, BufferCharge{8 * kGiB, 0});
  absl::Status uid = ledger.CheckBuffer(1000, BufferCharge{1, 0});
  EXPECT_NE(uid.message().find("max_mapped_bytes_per_uid"), std::string::npos) << uid;
  ledger.AddBuffer(2000, BufferCharge{4 * kGiB, 0});
  absl::Status node = ledger.CheckBuffer(3000, BufferCharge{1, 0});
  EXPECT_NE(node.message().find("(max_mapped_bytes)"), std::string::npos) << node;
  EXPECT_EQ(ledger.Totals().mapped_bytes, 12 * kGiB);
}

// One session's segments stop at max_reserved_bytes_per_session, before its user's bound: the
// user's other trainers keep room. Each buffer gives back what it was charged when removed.
TEST(UsageLedger, ASessionIsBoundedBeforeItsUserAndRemovalGivesItsChargeBack) {
  UsageLedger ledger(Limits());
  AttachToken token{};
  Session first(1, "first", token, ~uint64_t{0}, 64);
  Session second(2, "second", token, ~uint64_t{0}, 64);
  first.set_ledger(&ledger);
  second.set_ledger(&ledger);
  const BufferCharge segment{0, kSegment};
  std::vector<uint64_t> ids;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(first.CheckBufferLimits(segment).ok()) << i;
    ids.push_back(first.AddBuffer(std::make_shared<FakeBuffer>(4096, /*device=*/0), segment));
  }
  absl::Status full = first.CheckBufferLimits(segment);
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_NE(full.message().find("max_reserved_bytes_per_session"), std::string::npos) << full;
  // The same user's second session has the rest of the user's share: two segments.
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(second.CheckBufferLimits(segment).ok()) << i;
    second.AddBuffer(std::make_shared<FakeBuffer>(4096, 0), segment);
  }
  absl::Status user = second.CheckBufferLimits(segment);
  EXPECT_NE(user.message().find("max_reserved_bytes_per_uid"), std::string::npos) << user;
  // A host buffer charges its bytes of host memory and no address space. (What the listener
  // passes, from the request: a GPU engine's host buffer says device 0, as here.)
  const uint64_t host =
      first.AddBuffer(std::make_shared<FakeBuffer>(1 << 20, 0), BufferCharge{1 << 20, 0});
  EXPECT_EQ(ledger.Totals().mapped_bytes, uint64_t{1} << 20);
  EXPECT_EQ(ledger.Totals().reserved_bytes, 6 * kSegment);
  ASSERT_TRUE(first.RemoveBuffer(ids[0]));
  ASSERT_TRUE(first.RemoveBuffer(host));
  EXPECT_EQ(ledger.Totals().reserved_bytes, 5 * kSegment);
  EXPECT_EQ(ledger.Totals().mapped_bytes, 0u);
  EXPECT_TRUE(first.CheckBufferLimits(segment).ok());
  // A session's end gives back all it held.
  first.TakeAllBuffers();
  second.TakeAllBuffers();
  EXPECT_EQ(ledger.Totals().reserved_bytes, 0u);
  EXPECT_EQ(ledger.Totals().buffers, 0u);
}

}  // namespace
}  // namespace tier::daemon
