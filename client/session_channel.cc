#include "client/session_channel.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/unix_socket.h"

namespace tier::client {
namespace {

wire::MessageHeader Header(wire::MessageType type, uint64_t request_id) {
  return wire::MessageHeader{static_cast<uint32_t>(type), wire::kProtocolVersion, request_id};
}

// Receives a reply of type Reply, checking its type and the request it answers.
// timeout_ms < 0: waits as long as it takes.
template <typename Reply>
absl::StatusOr<Reply> ReceiveReply(int fd, wire::MessageType type, uint64_t request_id,
                                   std::vector<UniqueFd>* fds, int timeout_ms = -1) {
  if (timeout_ms >= 0) {
    if (absl::Status ready = WaitReadable(fd, timeout_ms, "tierd's reply on the session socket");
        !ready.ok()) {
      return ready;
    }
  }
  absl::StatusOr<ReceivedMessage> message =
      ReceiveMessage(fd, wire::kMaxMessageBytes, wire::kMaxFds);
  if (!message.ok()) return message.status();
  if (message->data.empty()) return absl::UnavailableError("tierd closed the session socket");
  if (message->data.size() != sizeof(Reply)) {
    return absl::InternalError("malformed reply on the session socket");
  }
  Reply reply;
  std::memcpy(&reply, message->data.data(), sizeof(reply));
  const wire::Reply& base = reinterpret_cast<const wire::Reply&>(reply);
  if (base.header.type != static_cast<uint32_t>(type) || base.header.request_id != request_id) {
    return absl::InternalError("reply does not answer the request sent");
  }
  if (base.status != 0) {
    std::string text(base.message, strnlen(base.message, sizeof(base.message)));
    return absl::Status(StatusCodeFromInt(base.status), text);
  }
  if (fds != nullptr) *fds = std::move(message->fds);
  return reply;
}

}  // namespace

absl::StatusOr<SessionChannel> SessionChannel::Connect(const std::string& path,
                                                       int timeout_ms) {
  absl::StatusOr<UniqueFd> fd = ConnectSeqpacket(path, timeout_ms);
  if (!fd.ok()) {
    return absl::Status(absl::IsDeadlineExceeded(fd.status())
                            ? absl::StatusCode::kDeadlineExceeded
                            : absl::StatusCode::kUnavailable,
                        absl::StrCat("cannot reach tierd's session socket: ",
                                     fd.status().message()));
  }
  return SessionChannel(*std::move(fd));
}

absl::StatusOr<AttachResult> SessionChannel::Attach(uint64_t session_id, const std::string& token,
                                                    int timeout_ms) {
  wire::AttachRequest request{};
  uint64_t id = next_request_++;
  request.header = Header(wire::MessageType::kAttachRequest, id);
  request.session_id = session_id;
  if (token.size() != sizeof(request.token)) return absl::InternalError("bad attach token size");
  std::memcpy(request.token, token.data(), sizeof(request.token));
  if (absl::Status s = SendMessage(fd_.get(), &request, sizeof(request)); !s.ok()) return s;
  std::vector<UniqueFd> fds;
  absl::StatusOr<wire::AttachReply> reply =
      ReceiveReply<wire::AttachReply>(fd_.get(), wire::MessageType::kAttachReply, id, &fds,
                                      timeout_ms);
  if (!reply.ok()) return reply.status();
  if (fds.size() != 3) return absl::InternalError("attach reply without the ring descriptors");
  AttachResult result;
  result.ring_fd = std::move(fds[0]);
  result.sq_doorbell = std::move(fds[1]);
  result.cq_doorbell = std::move(fds[2]);
  result.ring_bytes = reply->ring_bytes;
  result.quota_bytes = reply->quota_bytes;
  result.ring_entries = reply->ring_entries;
  result.engine.assign(reply->engine, strnlen(reply->engine, sizeof(reply->engine)));
  return result;
}

absl::StatusOr<uint64_t> SessionChannel::Register(const wire::RegisterBuffer& request,
                                                  absl::Span<const int> fds) {
  wire::RegisterBuffer message = request;
  uint64_t id = next_request_++;
  message.header = Header(wire::MessageType::kRegisterBuffer, id);
  absl::Status sent = SendMessage(fd_.get(), &message, sizeof(message), fds);
  if (!sent.ok()) return sent;
  absl::StatusOr<wire::RegisterBufferReply> reply = ReceiveReply<wire::RegisterBufferReply>(
      fd_.get(), wire::MessageType::kRegisterBufferReply, id, nullptr);
  if (!reply.ok()) return reply.status();
  return reply->buffer_id;
}

absl::StatusOr<uint64_t> SessionChannel::Extend(const wire::ExtendBuffer& request,
                                                absl::Span<const int> fds) {
  wire::ExtendBuffer message = request;
  uint64_t id = next_request_++;
  message.header = Header(wire::MessageType::kExtendBuffer, id);
  if (absl::Status s = SendMessage(fd_.get(), &message, sizeof(message), fds); !s.ok()) return s;
  absl::StatusOr<wire::ExtendBufferReply> reply = ReceiveReply<wire::ExtendBufferReply>(
      fd_.get(), wire::MessageType::kExtendBufferReply, id, nullptr);
  if (!reply.ok()) return reply.status();
  return reply->bytes;
}

absl::Status SessionChannel::Unregister(uint64_t buffer_id) {
  wire::UnregisterBuffer message{};
  uint64_t id = next_request_++;
  message.header = Header(wire::MessageType::kUnregisterBuffer, id);
  message.buffer_id = buffer_id;
  if (absl::Status s = SendMessage(fd_.get(), &message, sizeof(message)); !s.ok()) return s;
  return ReceiveReply<wire::UnregisterBufferReply>(
             fd_.get(), wire::MessageType::kUnregisterBufferReply, id, nullptr)
      .status();
}

absl::StatusOr<wire::ObjectReply> SessionChannel::ObjectRequest(wire::ObjectOp op, absl::string_view name,
                                                       uint64_t object_id, uint32_t uid,
                                                       uint64_t len) {
  wire::ObjectRequest message{};
  if (name.size() >= sizeof(message.name)) {
    return absl::InvalidArgumentError(absl::StrCat("object name of ", name.size(),
                                                   " bytes; at most ", sizeof(message.name) - 1));
  }
  uint64_t id = next_request_++;
  message.header = Header(wire::MessageType::kObjectRequest, id);
  message.op = static_cast<uint32_t>(op);
  message.uid = uid;
  message.object_id = object_id;
  message.len = len;
  std::memcpy(message.name, name.data(), name.size());
  if (absl::Status s = SendMessage(fd_.get(), &message, sizeof(message)); !s.ok()) return s;
  absl::StatusOr<wire::ObjectReply> reply = ReceiveReply<wire::ObjectReply>(
      fd_.get(), wire::MessageType::kObjectReply, id, nullptr);
  return reply;
}

}  // namespace tier::client
