// Caps how often one kind of warning reaches the log. Anything a client can trigger at will (a bad
// handshake, a refused connection, accept failing for lack of descriptors) goes through one of
// these: at most `burst` lines per interval, and the first line after a quiet spell says how many
// were dropped. Without it a hostile client could fill the disk with the daemon's journal (about
// 40,000 lines per 90 s of bad handshakes were measured) and cost it the CPU time of writing them.
#ifndef TIER_COMMON_LOG_RATE_LIMITER_H_
#define TIER_COMMON_LOG_RATE_LIMITER_H_

#include <cstdint>

#include "common/log.h"
#include "common/mutex.h"

namespace tier {

class LogRateLimiter {
 public:
  LogRateLimiter(uint32_t burst, uint64_t interval_ms) : burst_(burst), interval_ms_(interval_ms) {}

  // True when a line may be written at `now_ms`; then *suppressed is the number of lines dropped
  // since the last one written. Thread-safe.
  bool Allow(uint64_t now_ms, uint64_t* suppressed);

 private:
  const uint32_t burst_;
  const uint64_t interval_ms_;
  Mutex mu_;
  uint64_t window_start_ms_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t written_ ABSL_GUARDED_BY(mu_) = 0;     // lines written in the current window
  uint64_t suppressed_ ABSL_GUARDED_BY(mu_) = 0;  // lines dropped since the last one written
  bool started_ ABSL_GUARDED_BY(mu_) = false;
};

uint64_t LogClockMs();  // CLOCK_MONOTONIC in milliseconds

// LogWarning through `limiter`.
template <typename... Args>
void LogWarningLimited(LogRateLimiter& limiter, const Args&... args) {
  uint64_t suppressed = 0;
  if (!limiter.Allow(LogClockMs(), &suppressed)) return;
  if (suppressed == 0) {
    LogWarning(args...);
  } else {
    LogWarning(args..., " (", suppressed, " more like it suppressed)");
  }
}

// LogInfo through `limiter`: per-session lines (a session attached, ended), which a client that
// opens sessions in a loop would otherwise multiply (88k lines in 90 s were measured).
template <typename... Args>
void LogInfoLimited(LogRateLimiter& limiter, const Args&... args) {
  uint64_t suppressed = 0;
  if (!limiter.Allow(LogClockMs(), &suppressed)) return;
  if (suppressed == 0) {
    LogInfo(args...);
  } else {
    LogInfo(args..., " (", suppressed, " more like it suppressed)");
  }
}

}  // namespace tier

#endif  // TIER_COMMON_LOG_RATE_LIMITER_H_
