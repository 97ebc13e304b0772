// Hostile and broken clients against a real tierd: they talk the session protocol and write the
// shared ring by hand. Each must get a clear error or lose only its own session; a well-behaved
// session beside it keeps working with its data intact.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "client/control_client.h"
#include "common/admin_token.h"
#include "client/session_channel.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tier/client.hpp"
#include "tier/ring.h"
#include "raw_session.h"
#include "tierd_process.h"

namespace tier {
namespace {

using testing::OpenRaw;
using testing::RawSession;
using testing::TierdProcess;

TEST(Protocol, WrongTokenIsRefusedAndTheSessionStaysPending) {
  TierdProcess tierd;
  v1::OpenSessionResponse opened = OpenRaw(tierd);
  auto channel = client::SessionChannel::Connect(opened.session_socket());
  ASSERT_TRUE(channel.ok());
  std::string forged(16, 'x');
  absl::StatusOr<client::AttachResult> attached = channel->Attach(opened.session_id(), forged);
  EXPECT_EQ(attached.status().code(), absl::StatusCode::kPermissionDenied);
  // The real owner can still attach.
  auto owner = client::SessionChannel::Connect(opened.session_socket());
  ASSERT_TRUE(owner.ok());
  EXPECT_TRUE(owner->Attach(opened.session_id(), opened.attach_token()).ok());
}

TEST(Protocol, SessionsNotAttachedInTimeAreDiscarded) {
  // Long enough that the first status call surely comes first, also under the sanitizers.
  TierdProcess tierd({"--attach_timeout_ms=2000"});
  OpenRaw(tierd);
  EXPECT_EQ(tierd.Status().sessions(), 1u);
  EXPECT_TRUE(tierd.WaitForStatus([](const v1::GetStatusResponse& s) { return s.sessions() == 0; }));
}

TEST(Protocol, AttachReportsThePeerCredentialsTheKernelGave) {
  TierdProcess tierd;
  Session session(tierd.SessionOptions("good"));
  v1::ListSessionsResponse sessions = tierd.Sessions();
  ASSERT_EQ(sessions.sessions_size(), 1);
  EXPECT_EQ(sessions.sessions(0).pid(), ::getpid());
  EXPECT_EQ(sessions.sessions(0).uid(), ::getuid());
  EXPECT_EQ(sessions.sessions(0).name(), "good");
  EXPECT_TRUE(sessions.sessions(0).attached());
}

TEST(Protocol, UnsealedOrShortMemfdsAreRefused) {
  TierdProcess tierd;
  Session session(tierd.SessionOptions("good"));
  int fd = ::memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(::ftruncate(fd, 1 << 20), 0);
  testing::PopulateMemfd(fd, 1 << 20);  // (tierd refuses sparse memfds: hostile_client_test)
  tier_buffer_id id;
  EXPECT_EQ(tier_buffer_register_fd(session.get(), fd, 1 << 20, &id), TIER_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tier_last_error()).find("F_SEAL_SHRINK"), std::string::npos);
  ASSERT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  EXPECT_EQ(tier_buffer_register_fd(session.get(), fd, 2 << 20, &id), TIER_INVALID_ARGUMENT);
  EXPECT_EQ(tier_buffer_register_fd(session.get(), fd, 1 << 20, &id), TIER_OK);
  EXPECT_EQ(tier_buffer_unregister(session.get(), id), TIER_OK);
  EXPECT_EQ(tier_buffer_unregister(session.get(), id), TIER_NOT_FOUND);
  ::close(fd);
}

TEST(Protocol, MalformedRingEntriesGetClearCodes) {
  TierdProcess tierd;
  RawSession raw(tierd);
  int fd = ::memfd_create("buf", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(::ftruncate(fd, 1 << 20), 0);
  testing::PopulateMemfd(fd, 1 << 20);
  ASSERT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  wire::RegisterBuffer reg{};
  reg.kind = static_cast<uint32_t>(wire::BufferKind::kHostMemfd);
  reg.bytes = 1 << 20;
  absl::StatusOr<uint64_t> buffer = raw.channel->Register(reg, {&fd, 1});
  ASSERT_TRUE(buffer.ok());
  auto offload = [&](uint64_t job, uint64_t object, uint64_t offset, uint64_t len) {
    return ring::SubmissionEntry{.job_id = job, .opcode = 1, .object_id = object,
                                 .buffer_id = *buffer, .offset = offset, .len = len};
  };
  raw.Push(offload(1, 5, 0, 4096));
  EXPECT_EQ(raw.Next().status, 0);
  raw.Push(offload(2, 5, 0, 4096));  // the same object id again
  ring::CompletionEntry dup = raw.Next();
  EXPECT_EQ(dup.job_id, 2u);
  EXPECT_EQ(dup.status, static_cast<int>(absl::StatusCode::kAlreadyExists));
  raw.Push(offload(3, 0, 0, 4096));  // object id 0
  EXPECT_EQ(raw.Next().status, static_cast<int>(absl::StatusCode::kInvalidArgument));
  raw.Push(ring::SubmissionEntry{.job_id = 4, .opcode = 77});
  EXPECT_EQ(raw.Next().status, static_cast<int>(absl::StatusCode::kInvalidArgument));
  raw.Push(offload(5, 6, 1 << 20, 1));  // one byte past the end
  EXPECT_EQ(raw.Next().status, static_cast<int>(absl::StatusCode::kOutOfRange));
  ring::SubmissionEntry reload{.job_id = 6, .opcode = 2, .object_id = 5, .buffer_id = *buffer,
                               .offset = 0, .len = 4096};
  raw.Push(reload);
  EXPECT_EQ(raw.Next().status, 0);
  ::close(fd);
}

TEST(Protocol, CorruptRingEndsOnlyThatSession) {
  TierdProcess tierd;
  Session good(tierd.SessionOptions("good"));
  HostBuffer buffer = good.AllocHost(64 << 10);
  std::memset(buffer.data, 0x3c, buffer.bytes);
  auto [object, job] = good.Offload(buffer.id, 0, buffer.bytes);
  good.Wait(job);

  RawSession raw(tierd);
  // Publish a tail far past anything the queue can hold.
  raw.view.header->sq.tail.value.store(raw.view.header->sq.head.value.load() + 100000);
  uint64_t one = 1;
  (void)!::send(raw.attached.sq_doorbell.get(), &one, sizeof(one), MSG_NOSIGNAL);
  EXPECT_TRUE(tierd.WaitForStatus([](const v1::GetStatusResponse& s) { return s.sessions() == 1; }));
  // The daemon hangs up on the broken session.
  char byte;
  EXPECT_EQ(::recv(raw.channel->fd(), &byte, 1, 0), 0);

  std::memset(buffer.data, 0, buffer.bytes);
  good.Wait(good.Reload(object, buffer.id, 0, buffer.bytes));
  EXPECT_EQ(static_cast<unsigned char*>(buffer.data)[12345], 0x3c);
}

TEST(Protocol, DrainRefusesNewWorkAndReportsIdle) {
  TierdProcess tierd;
  Session session(tierd.SessionOptions("good"));
  HostBuffer buffer = session.AllocHost(4096);
  session.Wait(session.Offload(buffer.id, 0, 4096).second);
  grpc::ClientContext context;
  v1::DrainRequest request;
  request.set_timeout_ms(5000);
  absl::StatusOr<std::string> token = ReadAdminToken(AdminTokenPath(tierd.socket()));
  ASSERT_TRUE(token.ok()) << token.status();
  request.set_admin_token(*token);
  v1::DrainResponse response;
  ASSERT_TRUE(tierd.stub().Drain(&context, request, &response).ok());
  EXPECT_EQ(response.jobs_in_flight(), 0u);
  EXPECT_EQ(tierd.Status().state(), v1::HealthResponse::DRAINING);
  // The client refuses offloads itself (the ring says tierd drains): nothing is pushed.
  EXPECT_EQ(tier_session_flags(session.get()), TIER_SESSION_DAEMON_DRAINING);
  EXPECT_THROW(session.Offload(buffer.id, 0, 4096), Error);
  Session::Options options = tierd.SessionOptions("good");
  EXPECT_THROW(Session{options}, Error);
}

// Issue 30, item 2: a drain first lets every session take back what it offloaded (reloads and
// frees go on; offloads are refused at the client, which keeps its data), so a restart costs a
// trainer no step; it moves on as soon as nothing is held any more.
TEST(Protocol, DrainLetsSessionsTakeBackWhatTheyOffloaded) {
  TierdProcess tierd({"--drain_handback_idle_ms=20000"});
  Session session(tierd.SessionOptions("good"));
  HostBuffer buffer = session.AllocHost(8192);
  std::memset(buffer.data, 0x5C, 4096);
  auto [object, offload] = session.Offload(buffer.id, 0, 4096);
  session.Wait(offload);
  absl::StatusOr<std::string> token = ReadAdminToken(AdminTokenPath(tierd.socket()));
  ASSERT_TRUE(token.ok()) << token.status();
  const auto started = std::chrono::steady_clock::now();
  std::thread drain([&] {
    grpc::ClientContext context;
    v1::DrainRequest request;
    request.set_timeout_ms(30000);
    request.set_admin_token(*token);
    v1::DrainResponse response;
    EXPECT_TRUE(tierd.stub().Drain(&context, request, &response).ok());
  });
  while (!(tier_session_flags(session.get()) & TIER_SESSION_DAEMON_DRAINING)) {
    ASSERT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_THROW(session.Offload(buffer.id, 0, 4096), Error);  // new data stays with the client
  // What it offloaded comes back, and the drain moves on once it is given back (freed).
  EXPECT_EQ(session.TryWait(session.Reload(object, buffer.id, 4096, 4096, /*free_after=*/true)),
            TIER_OK);
  EXPECT_EQ(std::memcmp(static_cast<char*>(buffer.data) + 4096, buffer.data, 4096), 0);
  drain.join();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(15))
      << "the drain waited for the hand-back's idle limit, not for the object to come back";
}

TEST(Protocol, NoDaemonIsAClearUnavailable) {
  tier_session_options options;
  tier_session_options_init(&options);
  options.socket_path = "/nonexistent/tierd.sock";
  options.connect_timeout_ms = 500;
  options.daemon_wait_ms = 1000;  // (the default waits a minute for a tierd that is starting)
  tier_session* session = nullptr;
  EXPECT_EQ(tier_session_open(&options, &session), TIER_UNAVAILABLE);
  EXPECT_EQ(session, nullptr);
  EXPECT_NE(std::string(tier_last_error()).find("/nonexistent/tierd.sock"), std::string::npos);
}

TEST(Tierctl, StatusAndClientsShowTheDaemon) {
  TierdProcess tierd;
  Session session(tierd.SessionOptions("good"));
  HostBuffer buffer = session.AllocHost(1 << 20);
  session.Wait(session.Offload(buffer.id, 0, 1 << 20).second);
  auto [code, out] = testing::RunCommand(std::string(TIERCTL_BIN) + " --socket " + tierd.socket() + " status");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("host"), std::string::npos) << out;
  std::tie(code, out) = testing::RunCommand(std::string(TIERCTL_BIN) + " --socket " + tierd.socket() + " --json status");
  EXPECT_EQ(code, 0);
  EXPECT_NE(out.find("\"used_bytes\":1048576"), std::string::npos) << out;
  std::tie(code, out) = testing::RunCommand(std::string(TIERCTL_BIN) + " --socket " + tierd.socket() + " clients");
  EXPECT_EQ(code, 0);
  EXPECT_NE(out.find("good"), std::string::npos) << out;
  EXPECT_NE(out.find(std::to_string(::getpid())), std::string::npos) << out;
}

TEST(Daemon, ConfigFileAndBadConfig) {
  char dir[] = "/tmp/tierd-conf-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  std::string conf = std::string(dir) + "/tierd.conf";
  FILE* f = std::fopen(conf.c_str(), "w");
  std::fprintf(f, "# test\nring_entries = 32\ndefault_quota_bytes = 16M\n");
  std::fclose(f);
  {
    TierdProcess tierd({"--config=" + conf});
    Session session(tierd.SessionOptions("good"));
    tier_session_info info{};
    info.struct_size = sizeof(info);
    ASSERT_EQ(tier_session_get_info(session.get(), &info), TIER_OK);
    EXPECT_EQ(info.ring_entries, 32u);
    EXPECT_EQ(info.quota_bytes, 16u << 20);
  }
  f = std::fopen(conf.c_str(), "w");
  std::fprintf(f, "ring_entries = 33\n");
  std::fclose(f);
  auto [code, out] = testing::RunCommand(std::string(TIERD_BIN) + " --config=" + conf + " 2>&1");
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("ring_entries"), std::string::npos) << out;
  std::tie(code, out) = testing::RunCommand(std::string(TIERD_BIN) + " --no_such_key=1 2>&1");
  EXPECT_EQ(code, 2);
  std::remove(conf.c_str());
  ::rmdir(dir);
}

}  // namespace
}  // namespace tier
