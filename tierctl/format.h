// Human units for tierctl's tables: sizes in binary units, durations as 1h02m03s, bandwidth in
// decimal GB/s or MB/s (the units PCIe and disk figures are quoted in).
#ifndef TIER_TIERCTL_FORMAT_H_
#define TIER_TIERCTL_FORMAT_H_

#include <cstdint>
#include <string>

namespace tier::ctl {

// "0 B", "512 B", "1.5 KiB", "12.0 GiB" (one decimal from KiB up, to PiB).
std::string FormatBytes(uint64_t bytes);

// "850ms" below a second, else "42s", "5m07s", "1h02m03s", "3d04h05m06s".
std::string FormatDuration(uint64_t ms);

// "23.4 GB/s" from 1 GB/s up, else "512.0 MB/s"; negative or NaN reads as 0.
std::string FormatBandwidth(double bytes_per_s);

// A latency: "850ns", "12.3us", "4.56ms", "1.23s" (three significant digits); negative or NaN
// reads as 0.
std::string FormatSeconds(double seconds);

// "19.5%" of `part` in `whole`; "-" when `whole` is 0.
std::string FormatPercent(uint64_t part, uint64_t whole);

}  // namespace tier::ctl

#endif  // TIER_TIERCTL_FORMAT_H_
