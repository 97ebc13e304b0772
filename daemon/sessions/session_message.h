// Parsing what arrives on the session socket, as pure functions of the bytes (the fuzz target
// tests/fuzz/session_message_fuzzer.cc calls them directly). Messages are fixed-size structs
// (tier/session_wire.h); anything else is refused, never guessed at.
#ifndef TIER_DAEMON_SESSIONS_SESSION_MESSAGE_H_
#define TIER_DAEMON_SESSIONS_SESSION_MESSAGE_H_

#include <cstring>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "tier/session_wire.h"

namespace tier::daemon {

// The header of a request: at least a header's bytes, this protocol version, and a type the
// daemon receives (attach, register, extend, unregister,
// object). INVALID_ARGUMENT otherwise, saying why; the
// connection is then dropped.
absl::StatusOr<wire::MessageHeader> ParseRequestHeader(absl::Span<const char> data);

// The body of a request whose header parsed: exactly sizeof(Message) bytes. False otherwise (the
// request is answered INVALID_ARGUMENT).
template <typename Message>
bool ParseMessage(absl::Span<const char> data, Message* out) {
  if (data.size() != sizeof(Message)) return false;
  std::memcpy(out, data.data(), sizeof(Message));
  return true;
}

}  // namespace tier::daemon

#endif  // TIER_DAEMON_SESSIONS_SESSION_MESSAGE_H_
