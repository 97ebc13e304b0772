#include "tierctl/latency_quantile.h"

namespace tier::ctl {

std::optional<double> HistogramQuantile(double q, const std::vector<double>& bounds,
                                        const std::vector<uint64_t>& counts) {
  if (!(q >= 0 && q <= 1) || bounds.empty()) return std::nullopt;
  uint64_t total = 0;
  for (uint64_t n : counts) total += n;
  if (total == 0) return std::nullopt;
  const double rank = q * static_cast<double>(total);
  uint64_t below = 0;  // samples in the buckets before this one
  for (size_t i = 0; i < counts.size(); ++i) {
    const uint64_t in_bucket = counts[i];
    if (in_bucket > 0 && static_cast<double>(below + in_bucket) >= rank) {
      if (i >= bounds.size()) return bounds.back();  // +Inf
      const double lower = i == 0 ? 0.0 : bounds[i - 1];
      const double fraction = (rank - static_cast<double>(below)) / static_cast<double>(in_bucket);
      return lower + (bounds[i] - lower) * fraction;
    }
    below += in_bucket;
  }
  return bounds.back();
}

}  // namespace tier::ctl
