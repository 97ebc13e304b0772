// The client's session socket against a listener that never answers: connect and the attach
// reply give up after their timeouts instead of blocking tier_session_open for ever (issue 16).
#include "client/session_channel.h"

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <string>

#include "common/unix_socket.h"
#include "gtest/gtest.h"

namespace tier::client {
namespace {

class SessionChannelTimeoutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/tier-channel-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    path_ = dir_ + "/session.sock";
    // A backlog of 0 holds one connection nobody accepts; the next cannot connect at all.
    absl::StatusOr<UniqueFd> listener = ListenSeqpacket(path_, 0600, /*backlog=*/0);
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = *std::move(listener);
  }
  void TearDown() override {
    // Closing the listener also releases a call that did block (without the fix), so a failing
    // test ends instead of hanging.
    listener_.reset();
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }

  // Runs `call` and returns its status, or DEADLINE_EXCEEDED("blocked") after 20 s.
  template <typename Call>
  absl::Status Within20s(Call call) {
    auto future = std::async(std::launch::async, call);
    if (future.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      listener_.reset();  // unblocks it
      future.wait();
      return absl::DeadlineExceededError("blocked");
    }
    return future.get();
  }

  std::string dir_;
  std::string path_;
  UniqueFd listener_;
};

TEST_F(SessionChannelTimeoutTest, AttachReplyTimesOut) {
  absl::StatusOr<SessionChannel> channel = SessionChannel::Connect(path_, 2000);
  ASSERT_TRUE(channel.ok()) << channel.status();
  auto start = std::chrono::steady_clock::now();
  absl::Status status = Within20s([&] {
    return channel->Attach(1, std::string(16, 't'), /*timeout_ms=*/300).status();
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(status.message(), "blocked") << "the attach reply has no timeout";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST_F(SessionChannelTimeoutTest, ConnectTimesOutWhenNothingIsAccepted) {
  absl::StatusOr<SessionChannel> first = SessionChannel::Connect(path_, 2000);
  ASSERT_TRUE(first.ok()) << first.status();  // waits in the backlog
  absl::Status status =
      Within20s([&] { return SessionChannel::Connect(path_, /*timeout_ms=*/300).status(); });
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(status.message(), "blocked") << "connect has no timeout";
}

}  // namespace
}  // namespace tier::client
