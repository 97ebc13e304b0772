#include "engine/link_meter.h"

#include <algorithm>
#include <cstddef>
#include <vector>

namespace tier::engine {

void LinkMeter::Issued(uint64_t now_ns, uint64_t bytes) {
  if (bytes == 0) return;
  MutexLock lock(&mu_);
  if (in_flight_ == 0) {
    since_ns_ = now_ns;
    period_bytes_ = 0;
    period_copies_ = 0;
  }
  in_flight_ += bytes;
}

void LinkMeter::Completed(uint64_t now_ns, uint64_t bytes) {
  if (bytes == 0) return;
  MutexLock lock(&mu_);
  in_flight_ -= std::min(bytes, in_flight_);
  period_bytes_ += bytes;
  ++period_copies_;
  total_ += bytes;
  if (in_flight_ == 0) {
    CloseLocked(now_ns);
  } else if (now_ns - since_ns_ >= kMaxPeriodNs) {
    CloseLocked(now_ns);
    since_ns_ = now_ns;  // still busy: the next period starts here
  }
}

void LinkMeter::CloseLocked(uint64_t now_ns) {
  const uint64_t ns = now_ns > since_ns_ ? now_ns - since_ns_ : 0;
  if (period_bytes_ >= kMinSampleBytes && ns > 0 &&
      period_bytes_ >= kMinMeanCopyBytes * period_copies_) {
    samples_.push_back(Sample{period_bytes_, ns, now_ns});
    if (samples_.size() > kMaxSamples) samples_.pop_front();
  }
  period_bytes_ = 0;
  period_copies_ = 0;
}

LinkMeter::Rate LinkMeter::Current(uint64_t now_ns) const {
  MutexLock lock(&mu_);
  Rate rate;
  std::vector<double> rates;
  for (auto it = samples_.rbegin(); it != samples_.rend(); ++it) {
    if (now_ns > it->end_ns && now_ns - it->end_ns > kWindowNs) break;
    rate.bytes += it->bytes;
    rate.busy_ns += it->ns;
    rates.push_back(static_cast<double>(it->bytes) * 1e9 / static_cast<double>(it->ns));
  }
  if (!rates.empty()) {
    auto middle = rates.begin() + static_cast<std::ptrdiff_t>(rates.size() / 2);
    std::nth_element(rates.begin(), middle, rates.end());
    rate.bytes_per_s = *middle;
  }
  return rate;
}

uint64_t LinkMeter::total_bytes() const {
  MutexLock lock(&mu_);
  return total_;
}

}  // namespace tier::engine
