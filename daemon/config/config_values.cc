#include "daemon/config/config_values.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace tier::daemon::config {

absl::Status BadValue(absl::string_view value, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid value '", value, "': expected ", expected));
}

bool AllDigits(absl::string_view text, bool octal) {
  if (text.empty()) return false;
  for (char c : text) {
    if (c < '0' || c > (octal ? '7' : '9')) return false;
  }
  return true;
}

// Decimal digits only: no sign, no blanks, no hex (a typo should not turn into a number).
absl::StatusOr<uint64_t> ParseUnsigned(absl::string_view text) {
  uint64_t value = 0;
  if (!AllDigits(text) || !absl::SimpleAtoi(text, &value)) {
    return BadValue(text, "an unsigned decimal integer");
  }
  return value;
}

absl::StatusOr<int64_t> ParseSigned(absl::string_view text) {
  absl::string_view digits = absl::StartsWith(text, "-") ? text.substr(1) : text;
  int64_t value = 0;
  if (!AllDigits(digits) || !absl::SimpleAtoi(text, &value)) return BadValue(text, "an integer");
  return value;
}

namespace {

struct SizeSuffix {
  absl::string_view short_name;  // K
  absl::string_view long_name;   // KiB (what DescribeConfig prints)
  int shift;
};
constexpr SizeSuffix kSizeSuffixes[] = {
    {"T", "TiB", 40}, {"G", "GiB", 30}, {"M", "MiB", 20}, {"K", "KiB", 10}};

}  // namespace

// Plain bytes, or a number with K/M/G/T or KiB/MiB/GiB/TiB (case-insensitive, blanks allowed
// between): all powers of 1024, since every size here is a memory size.
absl::StatusOr<uint64_t> ParseSize(absl::string_view text) {
  constexpr absl::string_view kExpected = "bytes, or a number with K/M/G/T or KiB/MiB/GiB/TiB";
  size_t digits = 0;
  while (digits < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[digits]))) {
    ++digits;
  }
  uint64_t number = 0;
  if (digits == 0 || !absl::SimpleAtoi(text.substr(0, digits), &number)) {
    return BadValue(text, kExpected);
  }
  absl::string_view suffix = absl::StripLeadingAsciiWhitespace(text.substr(digits));
  if (suffix.empty()) return number;
  for (const SizeSuffix& s : kSizeSuffixes) {
    if (absl::EqualsIgnoreCase(suffix, s.short_name) ||
        absl::EqualsIgnoreCase(suffix, s.long_name)) {
      if (number > (std::numeric_limits<uint64_t>::max() >> s.shift)) {
        return absl::InvalidArgumentError(absl::StrCat("size '", text, "' overflows 64 bits"));
      }
      return number << s.shift;
    }
  }
  return BadValue(text, kExpected);
}

// The largest unit that divides the size exactly, so the text reads well and parses back exactly.
std::string FormatSize(uint64_t bytes) {
  for (const SizeSuffix& s : kSizeSuffixes) {
    uint64_t unit = uint64_t{1} << s.shift;
    if (bytes != 0 && bytes % unit == 0) return absl::StrCat(bytes / unit, s.long_name);
  }
  return absl::StrCat(bytes);
}

// File modes are octal whether or not they start with 0 (as in chmod and systemd's UMask=).
absl::StatusOr<uint32_t> ParseMode(absl::string_view text) {
  if (!AllDigits(text, /*octal=*/true) || text.size() > 5)
    return BadValue(text, "an octal mode like 0660");
  uint32_t mode = 0;
  for (char c : text) mode = mode * 8 + static_cast<uint32_t>(c - '0');
  if (mode > 0777) {
    return absl::InvalidArgumentError(absl::StrCat("mode ", text, " has bits beyond 0777"));
  }
  return mode;
}

std::string FormatMode(uint32_t mode) {
  char text[16];
  std::snprintf(text, sizeof(text), "%04o", mode);
  return text;
}

absl::StatusOr<double> ParseDouble(absl::string_view text) {
  double value = 0;
  // SimpleAtod also takes "nan", "inf" and hex floats; none is a sensible setting.
  if (text.empty() || text.find_first_of("nNxX") != absl::string_view::npos ||
      !absl::SimpleAtod(text, &value)) {
    return BadValue(text, "a decimal number");
  }
  return value;
}

// The shortest of %.15g/%.17g that parses back to the same double.
std::string FormatDouble(double value) {
  char text[40];
  std::snprintf(text, sizeof(text), "%.15g", value);
  double back = 0;
  if (absl::SimpleAtod(text, &back) && back == value) return text;
  std::snprintf(text, sizeof(text), "%.17g", value);
  return text;
}

// A path must survive as a C string and as a config line: no NUL or other control characters
// (the system calls would see a shorter path than the one printed), no blank at either end (a
// config line loses it; found by tests/fuzz/config_fuzzer.cc).
absl::Status CheckPathText(absl::string_view path) {
  for (char c : path) {
    if (absl::ascii_iscntrl(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError("a path must not hold control characters");
    }
  }
  if (!path.empty() && (absl::ascii_isspace(static_cast<unsigned char>(path.front())) ||
                        absl::ascii_isspace(static_cast<unsigned char>(path.back())))) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "': a path must not begin or end with a blank"));
  }
  return absl::OkStatus();
}

// "a,b,c": absolute paths, none empty, none twice (after dropping a trailing '/'); "" is none.
absl::StatusOr<std::vector<std::string>> ParsePathList(absl::string_view value) {
  std::vector<std::string> paths;
  if (value.empty()) return paths;
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    part = absl::StripAsciiWhitespace(part);
    if (!absl::StartsWith(part, "/")) {
      return absl::InvalidArgumentError(
          absl::StrCat("must be absolute paths, comma-separated, got '", part, "'"));
    }
    while (part.size() > 1 && absl::EndsWith(part, "/")) part.remove_suffix(1);
    if (absl::Status text = CheckPathText(part); !text.ok()) return text;
    std::string path(part);
    if (std::find(paths.begin(), paths.end(), path) != paths.end()) {
      return absl::InvalidArgumentError(absl::StrCat("'", path, "' is named twice"));
    }
    paths.push_back(std::move(path));
  }
  return paths;
}

absl::StatusOr<std::vector<int>> ParseNodeNumbers(absl::string_view text) {
  std::vector<int> nodes;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    item = absl::StripAsciiWhitespace(item);
    absl::StatusOr<uint64_t> node = ParseUnsigned(item);
    if (!node.ok() || *node > 1023) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected NUMA nodes 0..1023, comma-separated, got '", item, "'"));
    }
    if (nodes.size() == kMaxNodeListEntries) {
      return absl::InvalidArgumentError(
          absl::StrCat("at most ", kMaxNodeListEntries, " parts"));
    }
    nodes.push_back(static_cast<int>(*node));
  }
  return nodes;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(absl::StrCat("cannot open ", path));
  std::string text;
  char buffer[8192];
  // /proc files report size 0, so read to EOF rather than trusting fstat.
  while (true) {
    ssize_t n = ::read(fd.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(absl::StrCat("cannot read ", path));
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  return text;
}

}  // namespace tier::daemon::config
