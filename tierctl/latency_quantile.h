// Quantiles of a latency histogram (fixed buckets, counts per bucket), estimated the way
// Prometheus' histogram_quantile() does: find the bucket holding the rank, interpolate linearly
// inside it (from 0 for the first bucket). A rank in the +Inf bucket reads as the last finite
// bound.
#ifndef TIER_TIERCTL_LATENCY_QUANTILE_H_
#define TIER_TIERCTL_LATENCY_QUANTILE_H_

#include <cstdint>
#include <optional>
#include <vector>

namespace tier::ctl {

// `bounds`: ascending upper bounds (seconds); `counts`: one per bound plus one for +Inf (fewer
// are read as zeros). nullopt when the histogram is empty or q is outside [0, 1].
std::optional<double> HistogramQuantile(double q, const std::vector<double>& bounds,
                                        const std::vector<uint64_t>& counts);

}  // namespace tier::ctl

#endif  // TIER_TIERCTL_LATENCY_QUANTILE_H_
