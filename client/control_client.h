// The client's gRPC calls: open and close a session. Nothing on the job path uses it.
#ifndef TIER_CLIENT_CONTROL_CLIENT_H_
#define TIER_CLIENT_CONTROL_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tier.grpc.pb.h"

namespace tier::client {

// $TIER_SOCKET, else $XDG_RUNTIME_DIR/tierd/tierd.sock if it exists, else /run/tierd/tierd.sock.
std::string DefaultSocketPath();

class ControlClient {
 public:
  ControlClient(const std::string& socket_path, int timeout_ms);
  // Opens a session. A tierd that is not listening yet (no socket, or refused) or answers
  // UNAVAILABLE (starting, draining) is asked again every few milliseconds for up to
  // daemon_wait_ms, each time on a new channel (a gRPC channel backs off after a failed connect).
  absl::StatusOr<v1::OpenSessionResponse> OpenSession(const v1::OpenSessionRequest& request,
                                                      int daemon_wait_ms);
  absl::Status CloseSession(uint64_t session_id, const std::string& token);
  absl::StatusOr<v1::GetStatusResponse> GetStatus();

 private:
  std::string socket_path_;
  int timeout_ms_;
  absl::StatusOr<v1::OpenSessionResponse> OpenSessionOnce(const v1::OpenSessionRequest& request);

  std::unique_ptr<v1::Control::Stub> stub_;
};

}  // namespace tier::client

#endif  // TIER_CLIENT_CONTROL_CLIENT_H_
