#include "common/log.h"

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <atomic>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tier {
namespace {

std::atomic<int> min_severity{static_cast<int>(Severity::kInfo)};

}  // namespace

void SetMinLogSeverity(Severity severity) { min_severity = static_cast<int>(severity); }

bool ParseSeverity(absl::string_view text, Severity* out) {
  if (text == "debug") *out = Severity::kDebug;
  else if (text == "info") *out = Severity::kInfo;
  else if (text == "warning") *out = Severity::kWarning;
  else if (text == "error") *out = Severity::kError;
  else return false;
  return true;
}

void Log(Severity severity, absl::string_view message) {
  if (static_cast<int>(severity) < min_severity.load(std::memory_order_relaxed)) return;
  static constexpr const char* kLevel[] = {"D", "I", "W", "E"};
  static constexpr int kJournalPriority[] = {7, 6, 4, 3};
  int index = static_cast<int>(severity);
  std::string line;
  if (std::getenv("JOURNAL_STREAM") != nullptr) {
    line = absl::StrCat("<", kJournalPriority[index], ">", message, "\n");
  } else {
    timespec now{};
    clock_gettime(CLOCK_REALTIME, &now);
    tm parts{};
    localtime_r(&now.tv_sec, &parts);
    char stamp[32];
    std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &parts);
    line = absl::StrFormat("%s %s.%03d %s\n", kLevel[index], stamp,
                           static_cast<int>(now.tv_nsec / 1000000), message);
  }
  // One write per line so lines from several threads do not interleave.
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace tier
