// The GPU engine's clock: nanoseconds of the steady clock, for lane timings, the watchdog, the
// link meters and the link share.
#ifndef TIER_ENGINE_ENGINE_CLOCK_H_
#define TIER_ENGINE_ENGINE_CLOCK_H_

#include <chrono>
#include <cstdint>

namespace tier::engine {

inline uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace tier::engine

#endif  // TIER_ENGINE_ENGINE_CLOCK_H_
