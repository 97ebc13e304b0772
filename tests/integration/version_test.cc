// A client and a daemon of different protocol versions: each side refuses the other at
// OpenSession with FAILED_PRECONDITION naming both versions, rather than misreading what follows.
// The daemon side against a real tierd; the client side against a fake daemon that speaks another
// protocol (an in-process gRPC server on a Unix socket).
#include <grpcpp/grpcpp.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/version.h"
#include "gtest/gtest.h"
#include "tier.grpc.pb.h"
#include "tier/tier.h"
#include "tierd_process.h"

namespace tier {
namespace {

using testing::TierdProcess;

TEST(ProtocolVersion, TheDaemonTellsItsVersionsAtOpen) {
  TierdProcess tierd;
  grpc::ClientContext context;
  v1::OpenSessionRequest request;
  request.set_client_api_version(kApiVersion);
  request.set_client_version("test");
  v1::OpenSessionResponse response;
  ASSERT_TRUE(tierd.stub().OpenSession(&context, request, &response).ok());
  EXPECT_EQ(response.api_version(), kApiVersion);
  EXPECT_EQ(response.daemon_version(), kTierVersion);
  EXPECT_EQ(tierd.Stop(), 0);
}

TEST(ProtocolVersion, TheDaemonRefusesAClientOfAnotherProtocolNamingBoth) {
  TierdProcess tierd;
  grpc::ClientContext context;
  v1::OpenSessionRequest request;
  request.set_client_api_version(kApiVersion + 1);
  request.set_client_version("libtierclient 9.9.9");
  v1::OpenSessionResponse response;
  grpc::Status status = tierd.stub().OpenSession(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message(),
            absl::StrCat("protocol mismatch: this client (libtierclient 9.9.9) speaks protocol ",
                         kApiVersion + 1, ", tierd ", kTierVersion, " speaks protocol ",
                         kApiVersion, ": use a client and a daemon of the same protocol version"));
  EXPECT_EQ(tierd.Status().sessions(), 0u);  // nothing was opened
  EXPECT_EQ(tierd.Stop(), 0);
}

// A tierd of the next protocol: answers OpenSession (it does not check the client) with its own.
class FutureDaemon final : public v1::Control::Service {
 public:
  grpc::Status OpenSession(grpc::ServerContext*, const v1::OpenSessionRequest* request,
                           v1::OpenSessionResponse* response) override {
    client_api_version = request->client_api_version();
    response->set_session_id(1);
    response->set_attach_token(std::string(16, 'x'));
    response->set_session_socket("/nonexistent/session.sock");
    response->set_api_version(kApiVersion + 1);
    response->set_daemon_version("9.9.9");
    return grpc::Status::OK;
  }
  uint32_t client_api_version = 0;
};

TEST(ProtocolVersion, TheClientRefusesADaemonOfAnotherProtocolNamingBoth) {
  char pattern[] = "/tmp/tierd-version-XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  const std::string socket = dir + "/tierd.sock";
  FutureDaemon daemon;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
  builder.RegisterService(&daemon);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);

  tier_session_options options;
  tier_session_options_init(&options);
  options.socket_path = socket.c_str();
  tier_session* session = nullptr;
  EXPECT_EQ(tier_session_open(&options, &session), TIER_FAILED_PRECONDITION);
  EXPECT_EQ(session, nullptr);
  EXPECT_EQ(std::string(tier_last_error()),
            absl::StrCat("protocol mismatch: tierd 9.9.9 at ", socket, " speaks protocol ",
                         kApiVersion + 1, ", this client (libtierclient ", kTierVersion,
                         ") speaks protocol ", kApiVersion,
                         ": use a client and a daemon of the same protocol version"));
  EXPECT_EQ(daemon.client_api_version, kApiVersion);  // the client told its own
  server->Shutdown();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tier
