// The control socket's listener. tierd accepts the gRPC connections itself and hands each to the
// gRPC server (grpc::AddInsecureChannelFromFd), so that it knows who is at the other end
// (SO_PEERCRED) and bounds them; gRPC listening on its own took every connection, and 1,100 silent
// ones of one user used up the descriptors (RLIMIT_NOFILE 1024): health probes hung (a liveness
// probe would have restarted tierd), attaches failed, and the ring poller lost its epoll set.
//  - Per uid: at most max_connections_per_uid at once; one more is closed at once.
//  - In all: no connection is kept once the descriptor it got is within a reserve of RLIMIT_NOFILE
//    (an eighth of it, at least 64), except those of root and of tierd's own user (tierctl health,
//    the liveness probe), which may go on until 32 are left.
//  - Who calls: PeerOf(ServerContext::peer()) gives a call's credentials (gRPC names a connection
//    handed to it "fd:N"), so that OpenSession can count pending sessions per uid.
// gRPC closes a connection's descriptor when the connection ends and tells nobody: a sweep notices
// (the descriptor closed, or now another file) every second and whenever a limit is reached.
//
// Thread-safe; one thread of its own accepts.
#ifndef TIER_DAEMON_CONTROL_CONTROL_ACCEPTOR_H_
#define TIER_DAEMON_CONTROL_CONTROL_ACCEPTOR_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/log_rate_limiter.h"
#include "common/mutex.h"
#include "common/unique_fd.h"
#include "common/unix_socket.h"

namespace grpc {
class Server;
}

namespace tier::daemon {

class ControlAcceptor {
 public:
  explicit ControlAcceptor(uint32_t max_connections_per_uid);
  ~ControlAcceptor();
  ControlAcceptor(const ControlAcceptor&) = delete;
  ControlAcceptor& operator=(const ControlAcceptor&) = delete;

  // Listens on `path` (mode, and group when gid != -1) and hands what it accepts to `server`
  // (built and started, with no listening port of its own; it must outlive Stop()).
  absl::Status Start(const std::string& path, mode_t mode, gid_t gid, grpc::Server* server);
  // Stops accepting (connections handed over stay gRPC's) and removes the socket file.
  void Stop();

  // The credentials of the process at the other end of a call's connection, from
  // ServerContext::peer(); nullopt for a peer it did not hand over (or one that went meanwhile).
  std::optional<PeerCredentials> PeerOf(absl::string_view peer) const;
  // Connections handed to gRPC and not yet seen closed.
  size_t connections() const;

 private:
  struct Connection {
    dev_t dev = 0;
    ino_t ino = 0;
    PeerCredentials peer;
  };

  void Run();
  // Takes one connection; false when none is waiting or descriptors ran out (then backs off).
  bool Accept();
  // Forgets connections gRPC closed. Unless `force`, at most once per 10 ms.
  void Sweep(bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetLocked(int fd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint32_t max_connections_per_uid_;
  const uid_t own_uid_;
  grpc::Server* server_ = nullptr;
  std::string path_;
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;
  std::atomic<bool> stop_{false};
  uint64_t open_files_limit_ = 0;  // RLIMIT_NOFILE at start
  uint64_t backoff_ms_ = 0;        // accept failing for lack of descriptors: wait this long

  mutable Mutex mu_;
  std::unordered_map<int, Connection> connections_ ABSL_GUARDED_BY(mu_);  // by descriptor
  std::unordered_map<uid_t, uint32_t> per_uid_ ABSL_GUARDED_BY(mu_);
  uint64_t last_sweep_ms_ ABSL_GUARDED_BY(mu_) = 0;

  LogRateLimiter log_{20, 10000};
  std::thread thread_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_CONTROL_CONTROL_ACCEPTOR_H_
