// The value syntax of tierd's settings: each kind of value a config line or a flag can hold is
// parsed and formatted here, the formatter the exact inverse of the parser (--print-config's text
// parses back to the same settings). Pure functions; errors say what was expected.
#ifndef TIER_DAEMON_CONFIG_CONFIG_VALUES_H_
#define TIER_DAEMON_CONFIG_CONFIG_VALUES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace tier::daemon::config {

absl::Status BadValue(absl::string_view value, absl::string_view expected);
// Decimal digits only (octal: 0-7), at least one.
bool AllDigits(absl::string_view text, bool octal = false);
// Decimal digits only: no sign, no blanks, no hex (a typo should not turn into a number).
absl::StatusOr<uint64_t> ParseUnsigned(absl::string_view text);
absl::StatusOr<int64_t> ParseSigned(absl::string_view text);
// Plain bytes, or a number with K/M/G/T or KiB/MiB/GiB/TiB (case-insensitive, blanks allowed
// between): all powers of 1024, since every size here is a memory size.
absl::StatusOr<uint64_t> ParseSize(absl::string_view text);
// The largest unit that divides the size exactly, so the text reads well and parses back exactly.
std::string FormatSize(uint64_t bytes);
// File modes are octal whether or not they start with 0 (as in chmod and systemd's UMask=).
absl::StatusOr<uint32_t> ParseMode(absl::string_view text);
std::string FormatMode(uint32_t mode);
absl::StatusOr<double> ParseDouble(absl::string_view text);
// The shortest of %.15g/%.17g that parses back to the same double.
std::string FormatDouble(double value);
// A path must survive as a C string and as a config line: no NUL or other control characters
// (the system calls would see a shorter path than the one printed), no blank at either end (a
// config line loses it; found by tests/fuzz/config_fuzzer.cc).
absl::Status CheckPathText(absl::string_view path);
// "a,b,c": absolute paths, none empty, none twice (after dropping a trailing '/'); "" is none.
absl::StatusOr<std::vector<std::string>> ParsePathList(absl::string_view value);

// NUMA nodes "0,1,1" (pool_numa): each 0..1023, in the given order, repeats allowed, at least
// one and at most kMaxNodeListEntries; blanks around each allowed.
inline constexpr size_t kMaxNodeListEntries = 64;
absl::StatusOr<std::vector<int>> ParseNodeNumbers(absl::string_view text);

// An enum setting: its names, each for one value.
template <typename E>
struct Choice {
  absl::string_view name;
  E value;
};
template <typename E>
absl::StatusOr<E> ParseChoice(absl::string_view text, const std::vector<Choice<E>>& choices) {
  for (const Choice<E>& choice : choices) {
    if (text == choice.name) return choice.value;
  }
  std::vector<absl::string_view> names;
  for (const Choice<E>& choice : choices) names.push_back(choice.name);
  return absl::InvalidArgumentError(
      absl::StrCat("must be one of ", absl::StrJoin(names, ", "), ", got '", text, "'"));
}
template <typename E>
absl::string_view FormatChoice(E value, const std::vector<Choice<E>>& choices) {
  for (const Choice<E>& choice : choices) {
    if (choice.value == value) return choice.name;
  }
  return "?";
}

// The whole file (read to EOF: /proc files report size 0).
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

}  // namespace tier::daemon::config

#endif  // TIER_DAEMON_CONFIG_CONFIG_VALUES_H_
