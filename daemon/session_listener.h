// Serves the session socket: accepts connections, takes each peer's kernel credentials, attaches
// sessions (handing out the ring memfd and doorbells with SCM_RIGHTS), registers and unregisters
// buffers, and ends a session when its connection closes (client exit or death).
#ifndef TIER_DAEMON_SESSION_LISTENER_H_
#define TIER_DAEMON_SESSION_LISTENER_H_

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "common/unique_fd.h"
#include "common/unix_socket.h"
#include "daemon/session_registry.h"
#include "gpu/copy_engine.h"

namespace tier::daemon {

class SessionListener {
 public:
  SessionListener(SessionRegistry& registry, gpu::CopyEngine& engine);
  ~SessionListener();
  // Listens on `path` (mode, and group when gid >= 0) and starts the thread.
  absl::Status Start(const std::string& path, mode_t mode, gid_t gid);
  void Stop();

 private:
  struct Connection {
    UniqueFd fd;
    PeerCredentials peer;
    std::shared_ptr<Session> session;  // set by a successful attach
  };

  void Run();
  void Accept();
  // Handles one message; false when the connection must be dropped.
  bool Serve(Connection& connection);
  void Drop(int fd, absl::string_view reason);
  void HandleAttach(Connection& c, const std::vector<char>& data);
  void HandleRegister(Connection& c, const std::vector<char>& data, std::vector<UniqueFd> fds);
  void HandleUnregister(Connection& c, const std::vector<char>& data);

  SessionRegistry& registry_;
  gpu::CopyEngine& engine_;
  std::string path_;
  UniqueFd listen_fd_;
  UniqueFd epoll_fd_;
  UniqueFd wake_fd_;
  std::atomic<bool> stop_{false};
  std::map<int, Connection> connections_;  // listener thread only
  std::thread thread_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_SESSION_LISTENER_H_
