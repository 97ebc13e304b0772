// SystemdNotifier against a real NOTIFY_SOCKET: a datagram Unix socket the test binds, standing
// in for systemd. Every wait is a poll() on that socket or a condition variable, with a deadline.
#include "daemon/control/systemd_notifier.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>

#include "common/unique_fd.h"
#include "gtest/gtest.h"
#include "scoped_env.h"

namespace tier::daemon {
namespace {

using ::tier::testing::ScopedEnv;

class SystemdNotifierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "tierd-notify-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    std::string path = dir_ + "/notify";
    socket_.reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    ASSERT_TRUE(socket_.valid());
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    ASSERT_LT(path.size(), sizeof(addr.sun_path));
    path.copy(addr.sun_path, path.size());
    ASSERT_EQ(::bind(socket_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    notify_socket_.emplace("NOTIFY_SOCKET", path);
  }
  void TearDown() override {
    socket_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // How long a datagram that must come may take: generous, since a loaded machine (a suite run
  // beside busy loops) kept the watchdog thread from running for over a second once.
  static constexpr int kWaitMs = 10000;

  // The next datagram, or nullopt when none arrives within timeout_ms.
  std::optional<std::string> Receive(int timeout_ms) {
    pollfd pfd{socket_.get(), POLLIN, 0};
    if (::poll(&pfd, 1, timeout_ms) != 1) return std::nullopt;
    char buffer[4096];
    ssize_t n = ::recv(socket_.get(), buffer, sizeof(buffer), 0);
    if (n < 0) return std::nullopt;
    return std::string(buffer, static_cast<size_t>(n));
  }

  std::string dir_;
  UniqueFd socket_;
  std::optional<ScopedEnv> notify_socket_;
  ScopedEnv no_watchdog_usec_{"WATCHDOG_USEC", std::nullopt};
  ScopedEnv no_watchdog_pid_{"WATCHDOG_PID", std::nullopt};
};

TEST_F(SystemdNotifierTest, ReadySendsReadyAndStatus) {
  SystemdNotifier notifier;
  EXPECT_TRUE(notifier.enabled());
  notifier.Ready("x");
  std::optional<std::string> message = Receive(kWaitMs);
  ASSERT_TRUE(message);
  EXPECT_EQ(*message, "READY=1\nSTATUS=x");
}

TEST_F(SystemdNotifierTest, StatusAndStopping) {
  SystemdNotifier notifier;
  notifier.Status("draining\n3 jobs");  // a newline must not start a new assignment
  std::optional<std::string> message = Receive(kWaitMs);
  ASSERT_TRUE(message);
  EXPECT_EQ(*message, "STATUS=draining 3 jobs");
  notifier.Stopping();
  message = Receive(kWaitMs);
  ASSERT_TRUE(message);
  EXPECT_EQ(*message, "STOPPING=1");
}

TEST_F(SystemdNotifierTest, WithoutNotifySocketEverythingIsANoop) {
  notify_socket_.reset();
  ScopedEnv unset("NOTIFY_SOCKET", std::nullopt);
  ScopedEnv usec("WATCHDOG_USEC", "200000");
  ScopedEnv pid("WATCHDOG_PID", std::to_string(::getpid()));
  SystemdNotifier notifier;
  EXPECT_FALSE(notifier.enabled());
  EXPECT_EQ(notifier.WatchdogInterval().count(), 0);
  EXPECT_FALSE(notifier.StartWatchdog([] { return true; }));
  notifier.Ready("x");
  notifier.Status("y");
  notifier.Stopping();
  // Nothing reached the socket (it still exists; only the variable is gone).
  EXPECT_FALSE(Receive(0));
}

TEST_F(SystemdNotifierTest, WatchdogOffWithoutWatchdogUsec) {
  SystemdNotifier notifier;
  EXPECT_EQ(notifier.WatchdogInterval().count(), 0);
  EXPECT_FALSE(notifier.StartWatchdog([] { return true; }));
}

TEST_F(SystemdNotifierTest, WatchdogForAnotherPidIsOff) {
  ScopedEnv usec("WATCHDOG_USEC", "200000");
  ScopedEnv pid("WATCHDOG_PID", std::to_string(::getpid() + 1));
  SystemdNotifier notifier;
  EXPECT_EQ(notifier.WatchdogInterval().count(), 0);
}

TEST_F(SystemdNotifierTest, WatchdogPingsWhileHealthy) {
  ScopedEnv usec("WATCHDOG_USEC", "200000");
  ScopedEnv pid("WATCHDOG_PID", std::to_string(::getpid()));
  SystemdNotifier notifier;
  EXPECT_EQ(notifier.WatchdogInterval(), std::chrono::microseconds(200000));
  ASSERT_TRUE(notifier.StartWatchdog([] { return true; }));
  EXPECT_FALSE(notifier.StartWatchdog([] { return true; }));  // one thread only
  // The first ping at once, the next ~100 ms later: a second one shows it repeats.
  for (int i = 0; i < 2; ++i) {
    std::optional<std::string> message = Receive(kWaitMs);
    ASSERT_TRUE(message) << "ping " << i;
    EXPECT_EQ(*message, "WATCHDOG=1");
  }
  notifier.Stop();
  notifier.Stop();      // idempotent
  while (Receive(0)) {  // pings sent before Stop()
  }
  notifier.Status("after");  // the notifier still works without the thread
  std::optional<std::string> message = Receive(kWaitMs);
  ASSERT_TRUE(message);
  EXPECT_EQ(*message, "STATUS=after");
}

TEST_F(SystemdNotifierTest, WatchdogWithholdsPingsWhileUnhealthy) {
  ScopedEnv usec("WATCHDOG_USEC", "200000");
  ScopedEnv pid("WATCHDOG_PID", std::to_string(::getpid()));
  std::mutex mutex;
  std::condition_variable checked;
  int checks = 0;
  bool healthy = false;
  {
    SystemdNotifier notifier;
    ASSERT_TRUE(notifier.StartWatchdog([&] {
      std::lock_guard<std::mutex> lock(mutex);
      ++checks;
      checked.notify_all();
      return healthy;
    }));
    {
      // By the start of the third check, the first two (both unhealthy) have been acted on.
      std::unique_lock<std::mutex> lock(mutex);
      ASSERT_TRUE(checked.wait_for(lock, std::chrono::seconds(5), [&] { return checks >= 3; }));
    }
    EXPECT_FALSE(Receive(0)) << "a ping went out while the predicate said unhealthy";

    {
      std::lock_guard<std::mutex> lock(mutex);
      healthy = true;
    }
    std::optional<std::string> message = Receive(kWaitMs);
    ASSERT_TRUE(message) << "pings did not resume once healthy";
    EXPECT_EQ(*message, "WATCHDOG=1");
  }  // the destructor stops and joins the thread (std::thread would abort if it did not)
}

}  // namespace
}  // namespace tier::daemon
