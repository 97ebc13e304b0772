#include "daemon/sessions/session_message.h"

#include "absl/strings/str_cat.h"

namespace tier::daemon {

absl::StatusOr<wire::MessageHeader> ParseRequestHeader(absl::Span<const char> data) {
  wire::MessageHeader header;
  if (data.size() < sizeof(header)) {
    return absl::InvalidArgumentError(
        absl::StrCat("message of ", data.size(), " bytes, shorter than its header"));
  }
  std::memcpy(&header, data.data(), sizeof(header));
  if (header.version != wire::kProtocolVersion) {
    return absl::InvalidArgumentError(absl::StrCat("speaks session protocol ", header.version,
                                                   ", not ", wire::kProtocolVersion));
  }
  switch (static_cast<wire::MessageType>(header.type)) {
    case wire::MessageType::kAttachRequest:
    case wire::MessageType::kRegisterBuffer:
    case wire::MessageType::kUnregisterBuffer:
    case wire::MessageType::kObjectRequest:
    case wire::MessageType::kExtendBuffer:
      return header;
    default:
      return absl::InvalidArgumentError(absl::StrCat("sent unknown message type ", header.type));
  }
}

}  // namespace tier::daemon
