// LinkShare: the lane window's policy (engine/link_share.h), from what the worker saw alone.
#include "engine/link_share.h"

#include <gtest/gtest.h>

namespace tier::engine {
namespace {

constexpr uint64_t kWindow = 4 << 20;
constexpr uint64_t kMs = 1'000'000;
int a, b, c, d;  // lane identities

TEST(LinkShare, ALaneAloneHasNoWindow) {
  LinkShare share;
  share.Saw(&a, 1000, 0, 0);
  EXPECT_EQ(share.Window(&a, 1000, 0, 0, kWindow), 0u);
}

TEST(LinkShare, TwoUsersOnOneDirectionEachGetTheWindow) {
  LinkShare share;
  share.Saw(&a, 1000, 0, 0);
  share.Saw(&b, 2000, 0, 0);
  EXPECT_EQ(share.Window(&a, 1000, 0, 0, kWindow), kWindow);
  EXPECT_EQ(share.Window(&b, 2000, 0, 0, kWindow), kWindow);
  // The other direction is another link.
  EXPECT_EQ(share.Window(&c, 1000, 1, 0, kWindow), 0u);
}

// Finding 17 (issue 30): a uid's sessions together get one share of the link while another uid
// shares it, not one share each.
TEST(LinkShare, AUidsLanesShareOneWindowAgainstAnotherUid) {
  LinkShare share;
  share.Saw(&a, 1000, 0, 0);
  share.Saw(&b, 1000, 0, 0);
  share.Saw(&c, 1000, 0, 0);
  share.Saw(&d, 2000, 0, 0);
  EXPECT_EQ(share.Window(&a, 1000, 0, 0, kWindow), kWindow / 3);
  EXPECT_EQ(share.Window(&d, 2000, 0, 0, kWindow), kWindow);
}

TEST(LinkShare, OneUidsLanesAloneKeepThePlainWindow) {
  LinkShare share;
  share.Saw(&a, 1000, 0, 0);
  share.Saw(&b, 1000, 0, 0);
  EXPECT_EQ(share.Window(&a, 1000, 0, 0, kWindow), kWindow);
}

// Finding 17 (issue 30): only lanes with copies on the link are seen (the worker's rule); and a
// lane not seen for kMemoryNs no longer counts, so a lane stuck on a client's ticket stops
// forcing the window on the others.
TEST(LinkShare, ALaneGoneQuietStopsCounting) {
  LinkShare share;
  share.Saw(&a, 1000, 0, 0);
  share.Saw(&b, 2000, 0, 0);
  EXPECT_EQ(share.Window(&a, 1000, 0, 1 * kMs, kWindow), kWindow);
  share.Saw(&a, 1000, 0, 3 * kMs);  // b has had nothing on the link since 0
  EXPECT_EQ(share.Window(&a, 1000, 0, 3 * kMs, kWindow), 0u);
}

}  // namespace
}  // namespace tier::engine
