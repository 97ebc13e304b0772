// The client's end of the session socket: attach with the token from OpenSession, then register and
// unregister buffers (descriptors travel with SCM_RIGHTS). One request at a time.
#ifndef TIER_CLIENT_SESSION_CHANNEL_H_
#define TIER_CLIENT_SESSION_CHANNEL_H_

#include <cstdint>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/unique_fd.h"
#include "tier/session_wire.h"

namespace tier::client {

struct AttachResult {
  UniqueFd ring_fd;
  UniqueFd sq_doorbell;
  UniqueFd cq_doorbell;
  uint64_t ring_bytes = 0;
  uint64_t quota_bytes = 0;
  uint32_t ring_entries = 0;
  std::string engine;
};

class SessionChannel {
 public:
  // How long connecting and waiting for the attach reply may take, unless the caller says.
  // Without a limit tier_session_open blocked for ever on a daemon that accepted nothing
  // (backlog full, descriptors exhausted) or never answered.
  static constexpr int kDefaultTimeoutMs = 10000;

  // timeout_ms < 0: no limit. DEADLINE_EXCEEDED when it passes.
  static absl::StatusOr<SessionChannel> Connect(const std::string& path,
                                                int timeout_ms = kDefaultTimeoutMs);
  SessionChannel(SessionChannel&&) = default;

  absl::StatusOr<AttachResult> Attach(uint64_t session_id, const std::string& token,
                                      int timeout_ms = kDefaultTimeoutMs);
  // `fds`: none, one, or one per page (kCudaVmmPages).
  absl::StatusOr<uint64_t> Register(const wire::RegisterBuffer& request, absl::Span<const int> fds);
  absl::Status Unregister(uint64_t buffer_id);
  // Appends pages to a segment registration (wire::ExtendBuffer); returns its size after.
  absl::StatusOr<uint64_t> Extend(const wire::ExtendBuffer& request, absl::Span<const int> fds);
  // A named-object request (tier/session_wire.h ObjectOp); returns the reply (length, flags).
  absl::StatusOr<wire::ObjectReply> ObjectRequest(wire::ObjectOp op, absl::string_view name,
                                                  uint64_t object_id, uint32_t uid,
                                                  uint64_t len = 0);
  int fd() const { return fd_.get(); }

 private:
  explicit SessionChannel(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
  uint64_t next_request_ = 1;
};

}  // namespace tier::client

#endif  // TIER_CLIENT_SESSION_CHANNEL_H_
