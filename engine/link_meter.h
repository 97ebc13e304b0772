// What one GPU's link in one direction achieves for tierd's copies: bytes moved over the time
// copies were in flight (busy time), from the GPU's worker (engine/stream_engine.cc), which sees
// every copy it issues and completes. A pure object fed with the worker's clock, so that it is
// unit-tested without a device.
//
// Busy periods: the meter is busy from the first byte issued while idle until nothing is in
// flight again; a period that stays busy is cut every kMaxPeriodNs so a stream that never idles
// still gives samples. A period's bytes over its length is one sample; periods that moved fewer
// than kMinSampleBytes are dropped (their length is dominated by the completion-detection delay
// of the worker's polling), and so are periods whose copies averaged under kMinMeanCopyBytes
// (small copies are bound by the cost of each copy, not by the link; the figure is the link's).
// Current() is the median of the rates of the samples that ended in the last kWindowNs: what the
// link gave tierd lately, shared by every process of the node through tierd's status (clients
// plan with it: python/tier/_offload_budget.py). The median, not total bytes over total time: a
// session's first copies into memory just registered (mappings, the lane's stream starting) ran
// at a fifth of the link, and one such sample halved a window of four.
#ifndef TIER_ENGINE_LINK_METER_H_
#define TIER_ENGINE_LINK_METER_H_

#include <cstdint>
#include <deque>

#include "common/mutex.h"

namespace tier::engine {

class LinkMeter {
 public:
  static constexpr uint64_t kMaxPeriodNs = 100'000'000;    // 100 ms
  static constexpr uint64_t kMinSampleBytes = 8ull << 20;  // 8 MiB
  static constexpr uint64_t kMinMeanCopyBytes = 1ull << 20;  // 1 MiB
  static constexpr uint64_t kWindowNs = 30'000'000'000;    // 30 s
  static constexpr size_t kMaxSamples = 512;

  struct Rate {
    double bytes_per_s = 0;  // the samples' median rate; 0: no sample in the window
    uint64_t bytes = 0;      // of the samples in the window
    uint64_t busy_ns = 0;
  };

  // A copy of `bytes` went to the GPU at `now_ns` (0 bytes: ignored).
  void Issued(uint64_t now_ns, uint64_t bytes);
  // A copy issued earlier was seen complete at `now_ns`.
  void Completed(uint64_t now_ns, uint64_t bytes);
  Rate Current(uint64_t now_ns) const;
  uint64_t total_bytes() const;  // completed since start

 private:
  friend struct Lane;  // Lane::mu is taken before mu_ (its lock-order annotation names mu_)

  struct Sample {
    uint64_t bytes;
    uint64_t ns;
    uint64_t end_ns;
  };
  void CloseLocked(uint64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;
  uint64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t since_ns_ ABSL_GUARDED_BY(mu_) = 0;  // start of the current period
  uint64_t period_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t period_copies_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Sample> samples_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tier::engine

#endif  // TIER_ENGINE_LINK_METER_H_
