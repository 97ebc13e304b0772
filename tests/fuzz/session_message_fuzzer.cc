// libFuzzer target: the session socket's request parser (daemon/session_message.h) on arbitrary
// bytes, as a hostile client could send them. A request that parses must be exactly what its
// bytes say; nothing may read past the message.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "daemon/session_message.h"

namespace {

using tier::daemon::ParseMessage;
using tier::daemon::ParseRequestHeader;

template <typename Message>
void CheckBody(absl::Span<const char> data) {
  Message message;
  if (!ParseMessage(data, &message)) {
    if (data.size() == sizeof(Message)) std::abort();  // refused a well-sized body
    return;
  }
  if (data.size() != sizeof(Message) || std::memcmp(&message, data.data(), sizeof(Message)) != 0) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  absl::Span<const char> data(reinterpret_cast<const char*>(bytes), size);
  absl::StatusOr<tier::wire::MessageHeader> header = ParseRequestHeader(data);
  if (!header.ok()) return 0;
  if (size < sizeof(tier::wire::MessageHeader) ||
      header->version != tier::wire::kProtocolVersion) {
    std::abort();  // accepted what it must refuse
  }
  switch (static_cast<tier::wire::MessageType>(header->type)) {
    case tier::wire::MessageType::kAttachRequest:
      CheckBody<tier::wire::AttachRequest>(data);
      break;
    case tier::wire::MessageType::kRegisterBuffer:
      CheckBody<tier::wire::RegisterBuffer>(data);
      break;
    case tier::wire::MessageType::kUnregisterBuffer:
      CheckBody<tier::wire::UnregisterBuffer>(data);
      break;
    case tier::wire::MessageType::kObjectRequest:
      CheckBody<tier::wire::ObjectRequest>(data);
      break;
    default:
      std::abort();  // a type the daemon does not receive got through
  }
  return 0;
}
