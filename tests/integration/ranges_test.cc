// tier_offload_ranges and tier_reload_ranges against a real tierd (host engine): raw pointers into
// the session's host buffers are found, offloaded as one batch and reloaded intact; an offload
// range that cannot go says why in its own status while the others go; a reload call with a
// destination that cannot be named pushes nothing; a call that cannot go at all pushes nothing.
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tier/client.hpp"
#include "tierd_process.h"

namespace tier {
namespace {

using testing::TierdProcess;

void Fill(char* data, uint64_t len, uint32_t seed) {
  std::mt19937 rng(seed);
  for (uint64_t i = 0; i < len; ++i) data[i] = static_cast<char>(rng());
}

bool Matches(const char* data, uint64_t len, uint32_t seed) {
  std::vector<char> want(len);
  Fill(want.data(), len, seed);
  return std::memcmp(data, want.data(), len) == 0;
}

TEST(OffloadRanges, RawPointersIntoHostBuffersRoundTripAsOneBatch) {
  TierdProcess tierd;
  Session session(tierd.SessionOptions("ranges"));
  constexpr uint64_t kPiece = 12 << 10;
  HostBuffer a = session.AllocHost(4 * kPiece);
  HostBuffer b = session.AllocHost(2 * kPiece);
  char* pa = static_cast<char*>(a.data);
  char* pb = static_cast<char*>(b.data);
  // Two buffers, ranges at odd offsets inside them, in no particular order.
  struct Piece {
    char* ptr;
    uint64_t len;
    const HostBuffer* in;
    char* base;
  };
  std::vector<Piece> pieces = {{pa + 3 * kPiece, kPiece, &a, pa},
                               {pb + 100, kPiece, &b, pb},
                               {pa, kPiece - 7, &a, pa},
                               {pa + kPiece, 2 * kPiece, &a, pa}};
  std::vector<tier_offload_range> ranges;
  for (size_t i = 0; i < pieces.size(); ++i) {
    Fill(pieces[i].ptr, pieces[i].len, 40 + i);
    ranges.push_back(Session::Range(pieces[i].ptr, pieces[i].len, i + 1));
  }
  session.OffloadRanges(ranges);
  for (size_t i = 0; i < ranges.size(); ++i) {
    ASSERT_EQ(ranges[i].status, TIER_OK) << i;
    EXPECT_NE(ranges[i].object, 0u);
    EXPECT_EQ(session.TryWait(ranges[i].job), TIER_OK) << i;
  }
  std::memset(pa, 0, a.bytes);
  std::memset(pb, 0, b.bytes);
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Piece& piece = pieces[i];
    session.Wait(
        session.Reload(ranges[i].object, piece.in->id, piece.ptr - piece.base, piece.len));
    EXPECT_TRUE(Matches(piece.ptr, piece.len, 40 + i)) << i;
  }
}

TEST(OffloadRanges, ARangeThatCannotGoSaysWhyAndTheOthersGo) {
  TierdProcess tierd;
  Session session(tierd.SessionOptions("ranges"));
  constexpr uint64_t kBytes = 64 << 10;
  HostBuffer buffer = session.AllocHost(kBytes);
  char* p = static_cast<char*>(buffer.data);
  Fill(p, kBytes, 7);
  std::vector<char> outside(4096);
  std::vector<tier_offload_range> ranges = {
      Session::Range(p, 4096),
      Session::Range(nullptr, 4096),               // NULL
      Session::Range(p + 4096, 0),                 // empty
      Session::Range(p + kBytes - 100, 4096),      // runs past the buffer's end
      Session::Range(outside.data(), 4096),        // not tier memory (a host-engine tierd)
      Session::Range(p + 8192, 8192),
  };
  session.OffloadRanges(ranges);
  const tier_status want[] = {TIER_OK, TIER_INVALID_ARGUMENT, TIER_INVALID_ARGUMENT,
                              TIER_OUT_OF_RANGE, TIER_FAILED_PRECONDITION, TIER_OK};
  for (size_t i = 0; i < ranges.size(); ++i) {
    EXPECT_EQ(ranges[i].status, want[i]) << i;
    if (want[i] == TIER_OK) {
      EXPECT_EQ(session.TryWait(ranges[i].job), TIER_OK) << i;
    } else {
      EXPECT_EQ(ranges[i].job, 0u) << i;
      EXPECT_EQ(ranges[i].object, 0u) << i;
    }
  }
  // Only the two good ranges' bytes sit in tierd.
  EXPECT_TRUE(tierd.WaitForStatus([](const v1::GetStatusResponse& s) {
    return TierdProcess::HostTier(s).used_bytes() >= 4096 + 8192 && s.jobs_in_flight() == 0;
  }));
  std::memset(p, 0, kBytes);
  session.Wait(session.Reload(ranges[5].object, buffer.id, 8192, 8192));
  std::vector<char> want_bytes(kBytes);
  Fill(want_bytes.data(), kBytes, 7);
  EXPECT_EQ(std::memcmp(p + 8192, want_bytes.data() + 8192, 8192), 0);
}

TEST(OffloadRanges, ACallThatCannotGoPushesNothing) {
  TierdProcess tierd({"--ring_entries=64"});
  Session session(tierd.SessionOptions("ranges"));
  HostBuffer buffer = session.AllocHost(1 << 20);
  char* p = static_cast<char*>(buffer.data);
  std::vector<tier_offload_range> big(65, Session::Range(p, 4096));
  // More ranges than the ring holds, or than the limit.
  EXPECT_EQ(tier_offload_ranges(session.get(), big.data(), big.size(), nullptr),
            TIER_INVALID_ARGUMENT);
  EXPECT_EQ(tier_offload_ranges(session.get(), big.data(), TIER_MAX_BATCH_JOBS + 1, nullptr),
            TIER_INVALID_ARGUMENT);
  EXPECT_EQ(tier_offload_ranges(session.get(), nullptr, 0, nullptr), TIER_OK);
  EXPECT_EQ(tier_offload_ranges(nullptr, big.data(), 1, nullptr), TIER_INVALID_ARGUMENT);
  big[2].struct_size = 8;  // one element of another stride
  EXPECT_EQ(tier_offload_ranges(session.get(), big.data(), 4, nullptr), TIER_INVALID_ARGUMENT);
  big[0].struct_size = 8;  // too small for the struct
  EXPECT_EQ(tier_offload_ranges(session.get(), big.data(), 1, nullptr), TIER_INVALID_ARGUMENT);
  tier_offload_options options;
  tier_offload_options_init(&options);
  options.num_producer_streams = 1;  // and no array
  std::vector<tier_offload_range> one = {Session::Range(p, 4096)};
  EXPECT_EQ(tier_offload_ranges(session.get(), one.data(), 1, &options), TIER_INVALID_ARGUMENT);
  EXPECT_EQ(tierd.Status().jobs_in_flight(), 0u);
  EXPECT_EQ(TierdProcess::HostTier(tierd.Status()).used_bytes(), 0u);
}

TEST(OffloadRanges, ACallToADeadTierdFailsAndEveryRangeItFoundSaysSo) {
  TierdProcess tierd({"--copy_delay_us=500000"});
  Session session(tierd.SessionOptions("ranges"));
  HostBuffer buffer = session.AllocHost(1 << 20);
  char* p = static_cast<char*>(buffer.data);
  // A job still in flight when tierd dies: waiting for it is how this session learns of the
  // death (a host session has no death watch; until then a push to the ring still succeeds).
  std::vector<tier_offload_range> slow = {Session::Range(p, 4096)};
  session.OffloadRanges(slow);
  ASSERT_TRUE(tierd.WaitForStatus(
      [](const v1::GetStatusResponse& s) { return s.jobs_in_flight() > 0; }));
  tierd.Kill();
  EXPECT_EQ(session.TryWait(slow[0].job, 20000), TIER_UNAVAILABLE);
  std::vector<tier_offload_range> late = {Session::Range(p, 4096), Session::Range(nullptr, 1)};
  EXPECT_EQ(tier_offload_ranges(session.get(), late.data(), late.size(), nullptr),
            TIER_UNAVAILABLE);
  EXPECT_EQ(late[0].status, TIER_UNAVAILABLE);
  EXPECT_EQ(late[0].job, 0u);
  EXPECT_EQ(late[1].status, TIER_INVALID_ARGUMENT);
}

TEST(ReloadRanges, ReloadIntoRawPointersAndFreeAfterPerRange) {
  TierdProcess tierd;
  Session session(tierd.SessionOptions("ranges"));
  constexpr uint64_t kPiece = 16 << 10;
  HostBuffer buffer = session.AllocHost(8 * kPiece);
  char* p = static_cast<char*>(buffer.data);
  std::vector<tier_offload_range> out;
  for (int i = 0; i < 4; ++i) {
    Fill(p + i * kPiece, kPiece, 60 + i);
    out.push_back(Session::Range(p + i * kPiece, kPiece));
  }
  session.OffloadRanges(out);
  for (const auto& r : out) session.Wait(r.job);
  std::memset(p, 0, buffer.bytes);
  // Back into the upper half, in reverse order; two of them freed once copied.
  std::vector<tier_reload_range> back;
  for (int i = 0; i < 4; ++i) {
    back.push_back(Session::ReloadRange(out[i].object, p + (7 - i) * kPiece, kPiece,
                                        i % 2 ? TIER_RELOAD_FREE_AFTER : 0));
  }
  session.ReloadRanges(back);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(back[i].status, TIER_OK);
    session.Wait(back[i].job);
    EXPECT_TRUE(Matches(p + (7 - i) * kPiece, kPiece, 60 + i)) << i;
  }
  EXPECT_TRUE(tierd.WaitForStatus([&](const v1::GetStatusResponse& s) {
    return TierdProcess::HostTier(s).used_bytes() == 2 * kPiece;
  })) << "the two reloads with TIER_RELOAD_FREE_AFTER did not free their objects";
}

TEST(ReloadRanges, ADestinationThatCannotBeNamedHoldsTheWholeCallBack) {
  TierdProcess tierd;
  Session session(tierd.SessionOptions("ranges"));
  constexpr uint64_t kPiece = 16 << 10;
  HostBuffer buffer = session.AllocHost(4 * kPiece);
  char* p = static_cast<char*>(buffer.data);
  Fill(p, 2 * kPiece, 3);
  std::vector<tier_offload_range> out = {Session::Range(p, kPiece),
                                         Session::Range(p + kPiece, kPiece)};
  session.OffloadRanges(out);
  for (const auto& r : out) session.Wait(r.job);
  std::vector<tier_reload_range> back = {
      Session::ReloadRange(out[0].object, p + 2 * kPiece, kPiece),
      Session::ReloadRange(out[1].object, p + 4 * kPiece - 100, kPiece)};  // past the end
  EXPECT_EQ(tier_reload_ranges(session.get(), back.data(), back.size(), nullptr),
            TIER_OUT_OF_RANGE);
  EXPECT_EQ(back[0].status, TIER_ABORTED);
  EXPECT_EQ(back[1].status, TIER_OUT_OF_RANGE);
  EXPECT_EQ(back[0].job, 0u);
  EXPECT_EQ(back[1].job, 0u);
  // (Waited for: the offloads' completions reach the client a moment before tierd's own count
  // of jobs in flight drops; read at once, TSan's CI run once saw 1.)
  EXPECT_TRUE(tierd.WaitForStatus(
      [](const v1::GetStatusResponse& s) { return s.jobs_in_flight() == 0; }));
  // Nothing went: both objects are still whole, and a good call reloads them.
  std::memset(p + 2 * kPiece, 0, 2 * kPiece);
  back[1].ptr = p + 3 * kPiece;
  session.ReloadRanges(back);
  for (const auto& r : back) session.Wait(r.job);
  std::vector<char> want(2 * kPiece);
  Fill(want.data(), want.size(), 3);
  EXPECT_EQ(std::memcmp(p + 2 * kPiece, want.data(), want.size()), 0);
  // A wrong length fails that job alone, in tierd, like a tier_reload of the wrong length.
  std::vector<tier_reload_range> wrong = {Session::ReloadRange(out[0].object, p, kPiece / 2)};
  session.ReloadRanges(wrong);
  EXPECT_NE(session.TryWait(wrong[0].job), TIER_OK);
}

}  // namespace
}  // namespace tier
