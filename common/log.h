// Minimal leveled logging to stderr. Under systemd (JOURNAL_STREAM set) lines carry the <N>
// priority prefix journald understands; elsewhere a timestamp and level.
#ifndef TIER_COMMON_LOG_H_
#define TIER_COMMON_LOG_H_



#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tier {

enum class Severity { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetMinLogSeverity(Severity severity);
// Parses "debug", "info", "warning", "error".
bool ParseSeverity(absl::string_view text, Severity* out);
void Log(Severity severity, absl::string_view message);

template <typename... Args>
void LogInfo(const Args&... args) { Log(Severity::kInfo, absl::StrCat(args...)); }
template <typename... Args>
void LogWarning(const Args&... args) { Log(Severity::kWarning, absl::StrCat(args...)); }
template <typename... Args>
void LogError(const Args&... args) { Log(Severity::kError, absl::StrCat(args...)); }
template <typename... Args>
void LogDebug(const Args&... args) { Log(Severity::kDebug, absl::StrCat(args...)); }

}  // namespace tier

#endif  // TIER_COMMON_LOG_H_
