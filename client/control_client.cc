#include "client/control_client.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace tier::client {
namespace {

absl::Status FromGrpc(const grpc::Status& status, const std::string& socket_path) {
  if (status.ok()) return absl::OkStatus();
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::UnavailableError(absl::StrCat("tierd is not reachable at ", socket_path, " (",
                                               status.error_message(), ")"));
  }
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// A stub on a channel of its own to tierd's control socket.
std::unique_ptr<v1::Control::Stub> NewStub(const std::string& socket_path) {
  return v1::Control::NewStub(
      grpc::CreateChannel("unix:" + socket_path, grpc::InsecureChannelCredentials()));
}

}  // namespace

std::string DefaultSocketPath() {
  if (const char* env = std::getenv("TIER_SOCKET"); env != nullptr && *env != '\0') return env;
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && *xdg != '\0') {
    std::string path = absl::StrCat(xdg, "/tierd/tierd.sock");
    if (::access(path.c_str(), F_OK) == 0) return path;
  }
  return "/run/tierd/tierd.sock";
}

ControlClient::ControlClient(const std::string& socket_path, int timeout_ms)
    : socket_path_(socket_path), timeout_ms_(timeout_ms), stub_(NewStub(socket_path)) {}

absl::StatusOr<v1::OpenSessionResponse> ControlClient::OpenSession(
    const v1::OpenSessionRequest& request, int daemon_wait_ms) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::milliseconds(std::max(daemon_wait_ms, 0));
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<v1::OpenSessionResponse> opened = OpenSessionOnce(request);
    if (opened.ok() || !absl::IsUnavailable(opened.status())) return opened;
    if (std::chrono::steady_clock::now() >= deadline) {
      if (attempt == 0) return opened;
      return absl::UnavailableError(absl::StrCat(
          opened.status().message(), "; tried ", attempt + 1, " times in ",
          std::chrono::duration_cast<std::chrono::milliseconds>(
              std::chrono::steady_clock::now() - start).count(),
          " ms"));
    }
    // Not listening yet, or turning sessions away (starting, draining): ask again on a new
    // channel (a channel whose connect failed waits out a back-off of a second or more).
    if (attempt == 0) {
      LogWarning("libtierclient: tierd at ", socket_path_, " does not serve yet (",
                 opened.status().message(), "): waiting up to ", daemon_wait_ms,
                 " ms for it to start");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    stub_ = NewStub(socket_path_);
  }
}

absl::StatusOr<v1::OpenSessionResponse> ControlClient::OpenSessionOnce(
    const v1::OpenSessionRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms_));
  context.set_wait_for_ready(false);
  v1::OpenSessionResponse response;
  absl::Status status = FromGrpc(stub_->OpenSession(&context, request, &response), socket_path_);
  if (!status.ok()) return status;
  return response;
}

absl::Status ControlClient::CloseSession(uint64_t session_id, const std::string& token) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms_));
  v1::CloseSessionRequest request;
  request.set_session_id(session_id);
  request.set_attach_token(token);
  v1::CloseSessionResponse response;
  return FromGrpc(stub_->CloseSession(&context, request, &response), socket_path_);
}

absl::StatusOr<v1::GetStatusResponse> ControlClient::GetStatus() {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms_));
  v1::GetStatusRequest request;
  v1::GetStatusResponse response;
  if (absl::Status s = FromGrpc(stub_->GetStatus(&context, request, &response), socket_path_);
      !s.ok()) {
    return s;
  }
  return response;
}

}  // namespace tier::client
