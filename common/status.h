// One error vocabulary: absl::Status inside, the same canonical numbers on the wire (gRPC), in the
// ring's completion entries and across the C ABI (tier_status).
#ifndef TIER_COMMON_STATUS_H_
#define TIER_COMMON_STATUS_H_

#include <cerrno>


#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tier {

// The canonical code of `status` as the int carried by rings and replies.
inline int StatusCodeToInt(const absl::Status& status) { return static_cast<int>(status.code()); }

// Maps an int received from a peer back to a code; unknown numbers become UNKNOWN.
absl::StatusCode StatusCodeFromInt(int code);

// Name of a canonical code ("NOT_FOUND"); "UNKNOWN" for numbers outside the range.
const char* StatusCodeName(int code);

// absl::Status for a failed system call: `what` plus strerror(errnum), with a code that fits.
absl::Status ErrnoStatus(absl::string_view what, int errnum = errno);

}  // namespace tier

#endif  // TIER_COMMON_STATUS_H_
