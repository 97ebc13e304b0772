#include "daemon/control/systemd_notifier.h"

#include <systemd/sd-daemon.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/mutex.h"

namespace tier::daemon {
namespace {

bool NotifySocketSet() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  return socket != nullptr && socket[0] != '\0';
}

// sd_watchdog_enabled() also checks WATCHDOG_PID against getpid(), so a child that inherited the
// variables does not ping on its parent's behalf.
std::chrono::microseconds ReadWatchdogInterval(bool enabled) {
  if (!enabled) return std::chrono::microseconds(0);
  uint64_t usec = 0;
  if (sd_watchdog_enabled(/*unset_environment=*/0, &usec) <= 0) return std::chrono::microseconds(0);
  return std::chrono::microseconds(usec);
}

// The protocol is newline-separated KEY=VALUE lines; a newline inside a status would start a
// bogus assignment.
std::string OneLine(std::string_view text) {
  std::string line(text);
  for (char& c : line) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return line;
}

}  // namespace

SystemdNotifier::SystemdNotifier()
    : enabled_(NotifySocketSet()), watchdog_interval_(ReadWatchdogInterval(enabled_)) {}

SystemdNotifier::~SystemdNotifier() { Stop(); }

void SystemdNotifier::Send(std::string_view message) {
  if (!enabled_) return;
  std::string text(message);
  // sd_notify opens a fresh datagram socket per call, so calls from several threads are safe.
  int result = sd_notify(/*unset_environment=*/0, text.c_str());
  if (result < 0) LogWarning("sd_notify(", OneLine(message), ") failed: error ", -result);
}

void SystemdNotifier::Ready(std::string_view status) {
  Send(absl::StrCat("READY=1\nSTATUS=", OneLine(status)));
}

void SystemdNotifier::Status(std::string_view status) {
  Send(absl::StrCat("STATUS=", OneLine(status)));
}

void SystemdNotifier::Stopping() { Send("STOPPING=1"); }

bool SystemdNotifier::StartWatchdog(std::function<bool()> healthy) {
  if (watchdog_interval_.count() == 0 || thread_.joinable()) return false;
  healthy_ = std::move(healthy);
  {
    MutexLock lock(&mutex_);
    stop_ = false;
  }
  thread_ = std::thread([this] { WatchdogLoop(); });
  return true;
}

void SystemdNotifier::Stop() {
  if (!thread_.joinable()) return;
  {
    MutexLock lock(&mutex_);
    stop_ = true;
  }
  stop_cv_.SignalAll();
  thread_.join();
}

void SystemdNotifier::WatchdogLoop() {
  // Half the interval, as sd_watchdog_enabled(3) advises: one late ping still lands in time.
  const std::chrono::microseconds period = watchdog_interval_ / 2;
  bool was_healthy = true;
  // The predicate and the send run without the lock, so Stop() never waits behind them for
  // longer than one check.
  while (!AwaitStop(std::chrono::steady_clock::now())) {
    bool healthy = healthy_();
    if (healthy) {
      Send("WATCHDOG=1");
    } else if (was_healthy) {
      LogError("health check failed: withholding watchdog pings (systemd restarts tierd after ",
               watchdog_interval_.count() / 1000, " ms unless it recovers)");
    }
    if (healthy && !was_healthy) LogInfo("health check passes again: watchdog pings resume");
    was_healthy = healthy;
    if (AwaitStop(std::chrono::steady_clock::now() + period)) return;
  }
}

bool SystemdNotifier::AwaitStop(std::chrono::steady_clock::time_point deadline) {
  MutexLock lock(&mutex_);
  while (!stop_) {
    if (!stop_cv_.WaitUntil(&mutex_, deadline)) break;
  }
  return stop_;
}

}  // namespace tier::daemon
