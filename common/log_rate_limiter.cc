#include "common/log_rate_limiter.h"

#include "common/mutex.h"

#include <ctime>

namespace tier {

bool LogRateLimiter::Allow(uint64_t now_ms, uint64_t* suppressed) {
  MutexLock lock(&mu_);
  if (!started_ || now_ms - window_start_ms_ >= interval_ms_) {
    started_ = true;
    window_start_ms_ = now_ms;
    written_ = 0;
  }
  if (written_ >= burst_) {
    ++suppressed_;
    return false;
  }
  ++written_;
  *suppressed = suppressed_;
  suppressed_ = 0;
  return true;
}

uint64_t LogClockMs() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1000 + static_cast<uint64_t>(now.tv_nsec) / 1000000;
}

}  // namespace tier
