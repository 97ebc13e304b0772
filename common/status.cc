#include "common/status.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace tier {

absl::StatusCode StatusCodeFromInt(int code) {
  if (code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::StatusCode::kUnknown;
  }
  return static_cast<absl::StatusCode>(code);
}

const char* StatusCodeName(int code) {
  static constexpr const char* kNames[] = {
      "OK",        "CANCELLED",          "UNKNOWN",           "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED", "NOT_FOUND",   "ALREADY_EXISTS",    "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",  "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",        "UNAVAILABLE",       "DATA_LOSS",
      "UNAUTHENTICATED"};
  if (code < 0 || code >= static_cast<int>(std::size(kNames))) return "UNKNOWN";
  return kNames[code];
}

absl::Status ErrnoStatus(absl::string_view what, int errnum) {
  std::string message = absl::StrCat(what, ": ", std::strerror(errnum));
  switch (errnum) {
    case ENOENT:
    case ENXIO:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOMEM:
    case ENOSPC:
    case EMFILE:
    case ENFILE:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    case EINVAL:
    case EBADF:
      return absl::InvalidArgumentError(message);
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case EAGAIN:
      return absl::UnavailableError(message);
    case ETIMEDOUT:
      return absl::DeadlineExceededError(message);
    case EIO:
      return absl::DataLossError(message);
    case EEXIST:
      return absl::AlreadyExistsError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace tier
