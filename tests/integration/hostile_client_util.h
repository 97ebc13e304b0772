// What the hostile-client tests share (hostile_client_session_test.cc,
// hostile_client_memory_test.cc; one executable, hostile_client_test): issue 16, one hostile or
// careless client must not stop the node. One scenario per finding of the hostile-client
// campaign, each against a real tierd, each with a well-behaved session (or the daemon's own
// health) as the witness that the node still serves.
#ifndef TIER_TESTS_INTEGRATION_HOSTILE_CLIENT_UTIL_H_
#define TIER_TESTS_INTEGRATION_HOSTILE_CLIENT_UTIL_H_

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/admin_token.h"
#include "common/unix_socket.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "raw_session.h"
#include "tier/client.hpp"
#include "tier/ring.h"
#include "tier/session_wire.h"
#include "tierd_process.h"

namespace tier::hostile_client_testing {

using testing::RawSession;
using testing::TierdOptions;
using testing::TierdProcess;

// How many descriptors process `pid` has open (entries of /proc/<pid>/fd).
inline int OpenFds(pid_t pid) {
  int count = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
    ++count;
  }
  return count;
}

inline std::string SessionSocket(const TierdProcess& tierd) {
  return tierd.dir() + "/tierd.session.sock";
}

inline v1::HealthResponse Health(TierdProcess& tierd) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::HealthResponse response;
  EXPECT_TRUE(tierd.stub().Health(&context, v1::HealthRequest(), &response).ok());
  return response;
}

// Offloads and reloads `bytes` through `session` and checks the bytes came back.
inline void RoundTrip(Session& session, uint64_t bytes, int64_t timeout_ms, TierdProcess& tierd) {
  HostBuffer buffer = session.AllocHost(bytes);
  std::memset(buffer.data, 0x5a, bytes);
  auto [object, offload] = session.Offload(buffer.id, 0, bytes);
  tier_status status = session.TryWait(offload, timeout_ms);
  // A daemon that stopped serving would keep the session's destructor waiting for ever: kill it,
  // so the test fails instead of hanging.
  if (status != TIER_OK) tierd.Kill();
  ASSERT_EQ(status, TIER_OK) << "offload did not complete: " << tier_last_error();
  std::memset(buffer.data, 0, bytes);
  status = session.TryWait(session.Reload(object, buffer.id, 0, bytes), timeout_ms);
  if (status != TIER_OK) tierd.Kill();
  ASSERT_EQ(status, TIER_OK) << "reload did not complete: " << tier_last_error();
  EXPECT_EQ(static_cast<unsigned char*>(buffer.data)[bytes - 1], 0x5a);
}

// A sealed, populated memfd of `bytes`.
inline int PopulatedMemfd(uint64_t bytes) {
  int fd = ::memfd_create("test-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
  testing::PopulateMemfd(fd, bytes);
  EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  return fd;
}

inline uint64_t MeminfoValue(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) == 0) return std::stoull(line.substr(key.size() + 1));
  }
  return 0;
}

// Whether the peer closed `fd` within timeout_ms (EOF readable).
inline bool ClosedByPeer(int fd, int timeout_ms) {
  pollfd pfd{fd, POLLIN, 0};
  if (::poll(&pfd, 1, timeout_ms) <= 0) return false;
  char byte;
  return ::recv(fd, &byte, 1, MSG_DONTWAIT) == 0;
}

}  // namespace tier::hostile_client_testing

#endif  // TIER_TESTS_INTEGRATION_HOSTILE_CLIENT_UTIL_H_
