#include "tierctl/format.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tier::ctl {

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes) / 1024.0;
  size_t unit = 0;
  // Move up a unit where one decimal would round to 1024.0 of this one.
  while (value >= 1023.95 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string FormatDuration(uint64_t ms) {
  if (ms < 1000) return absl::StrCat(ms, "ms");
  const uint64_t total_s = ms / 1000;
  const uint64_t days = total_s / 86400;
  const uint64_t hours = total_s / 3600 % 24;
  const uint64_t minutes = total_s / 60 % 60;
  const uint64_t seconds = total_s % 60;
  if (days > 0) return absl::StrFormat("%dd%02dh%02dm%02ds", days, hours, minutes, seconds);
  if (hours > 0) return absl::StrFormat("%dh%02dm%02ds", hours, minutes, seconds);
  if (minutes > 0) return absl::StrFormat("%dm%02ds", minutes, seconds);
  return absl::StrCat(seconds, "s");
}

std::string FormatBandwidth(double bytes_per_s) {
  if (!(bytes_per_s > 0)) bytes_per_s = 0;  // also catches NaN
  // 999.95 MB/s would print as "1000.0 MB/s"; show it as GB/s instead.
  if (bytes_per_s >= 999.95e6) return absl::StrFormat("%.1f GB/s", bytes_per_s / 1e9);
  return absl::StrFormat("%.1f MB/s", bytes_per_s / 1e6);
}

std::string FormatSeconds(double seconds) {
  if (!(seconds > 0)) seconds = 0;
  struct Unit {
    double scale;
    const char* name;
  };
  static constexpr Unit kUnits[] = {{1e-9, "ns"}, {1e-6, "us"}, {1e-3, "ms"}, {1, "s"}};
  size_t unit = 0;
  // The largest unit in which the value is at least 1 (rounded as printed).
  while (unit + 1 < std::size(kUnits) && seconds >= kUnits[unit + 1].scale * 0.9995) ++unit;
  const double value = seconds / kUnits[unit].scale;
  if (unit == 0) return absl::StrFormat("%.0f%s", value, kUnits[unit].name);
  const int decimals = value >= 99.95 ? 0 : value >= 9.995 ? 1 : 2;
  return absl::StrFormat("%.*f%s", decimals, value, kUnits[unit].name);
}

std::string FormatPercent(uint64_t part, uint64_t whole) {
  if (whole == 0) return "-";
  return absl::StrFormat("%.1f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

}  // namespace tier::ctl
