#include "daemon/jobs/entry_validator.h"

#include "absl/strings/str_cat.h"

namespace tier::daemon {

absl::Status ValidateEntry(const ring::SubmissionEntry& entry) {
  switch (static_cast<ring::Opcode>(entry.opcode)) {
    case ring::Opcode::kOffload:
      if (entry.object_id == 0) return absl::InvalidArgumentError("object id 0 is reserved");
      [[fallthrough]];
    case ring::Opcode::kReload:
      if (entry.len == 0) return absl::InvalidArgumentError("job length is 0");
      return absl::OkStatus();
    case ring::Opcode::kFree:
    case ring::Opcode::kNop:
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown opcode ", entry.opcode));
}

absl::Status CheckBufferRange(uint64_t offset, uint64_t len, uint64_t buffer_bytes,
                              uint64_t buffer_id) {
  // Written so that no sum can overflow: offset <= bytes, then len <= bytes - offset.
  if (offset > buffer_bytes || len > buffer_bytes - offset) {
    return absl::OutOfRangeError(absl::StrCat("bytes [", offset, ", +", len,
                                              ") lie outside buffer ", buffer_id, " (",
                                              buffer_bytes, " bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace tier::daemon
