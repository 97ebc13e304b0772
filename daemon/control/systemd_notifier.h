// tierd's side of the systemd service protocol (sd_notify): READY/STATUS/STOPPING and the
// watchdog keep-alive. One instance, owned by the daemon's composition root (no globals).
//
// Without systemd (NOTIFY_SOCKET unset when the notifier is constructed) every method is a cheap
// no-op: no syscalls, no thread.
#ifndef TIER_DAEMON_CONTROL_SYSTEMD_NOTIFIER_H_
#define TIER_DAEMON_CONTROL_SYSTEMD_NOTIFIER_H_

#include <chrono>
#include <functional>
#include <string_view>
#include <thread>

#include "common/mutex.h"

namespace tier::daemon {

class SystemdNotifier {
 public:
  // Reads NOTIFY_SOCKET (and the watchdog settings) once, now; the environment is left as is.
  SystemdNotifier();
  ~SystemdNotifier();  // Stop()
  SystemdNotifier(const SystemdNotifier&) = delete;
  SystemdNotifier& operator=(const SystemdNotifier&) = delete;

  // True when systemd (or anything else) listens on NOTIFY_SOCKET.
  bool enabled() const { return enabled_; }

  // READY=1 plus STATUS=<status>: tells a Type=notify unit that start-up has finished.
  void Ready(std::string_view status);
  // STATUS=<status>: the free-form line `systemctl status` shows.
  void Status(std::string_view status);
  // STOPPING=1: shutdown has begun (draining).
  void Stopping();

  // The watchdog timeout systemd expects pings within (WatchdogSec=, via WATCHDOG_USEC for this
  // pid); zero when the watchdog is off or there is no systemd.
  std::chrono::microseconds WatchdogInterval() const { return watchdog_interval_; }

  // Starts a thread that sends WATCHDOG=1 every WatchdogInterval()/2 (the first at once) for as
  // long as `healthy` returns true. While it returns false no ping goes out, so systemd restarts
  // the daemon once the interval passes; pings resume if it turns true again first. `healthy` runs
  // on that thread and must not block. Returns false (and does nothing) when the watchdog is off
  // or already started.
  bool StartWatchdog(std::function<bool()> healthy);

  // Stops and joins the watchdog thread, if any. Idempotent.
  void Stop();

 private:
  void Send(std::string_view message);
  void WatchdogLoop();
  // Until Stop() or `deadline`; whether Stop() was called.
  bool AwaitStop(std::chrono::steady_clock::time_point deadline);

  const bool enabled_;
  const std::chrono::microseconds watchdog_interval_;

  std::function<bool()> healthy_;
  Mutex mutex_;
  CondVar stop_cv_;
  bool stop_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_CONTROL_SYSTEMD_NOTIFIER_H_
