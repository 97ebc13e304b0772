// Serves the session socket: accepts connections, takes each peer's kernel credentials, attaches
// sessions (handing out the ring memfd and doorbells with SCM_RIGHTS), registers and unregisters
// buffers, and ends a session when its connection closes (client exit or death).
#ifndef TIER_DAEMON_SESSIONS_SESSION_LISTENER_H_
#define TIER_DAEMON_SESSIONS_SESSION_LISTENER_H_

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/log_rate_limiter.h"
#include "common/mutex.h"
#include "common/unique_fd.h"
#include "common/unix_socket.h"
#include "daemon/persistent/persistent_store.h"
#include "daemon/sessions/session_registry.h"
#include "engine/copy_engine.h"
#include "tier/session_wire.h"

namespace tier::daemon {

// What the listener admits (the settings of the same names).
struct ListenerLimits {
  uint32_t max_connections = 1024;
  uint32_t max_connections_per_uid = 128;
  // A connection that has not attached a session by then is closed.
  uint32_t attach_timeout_ms = 10000;
};

class SessionListener {
 public:
  // `persistent`: named objects (null: object requests are answered UNIMPLEMENTED).
  SessionListener(SessionRegistry& registry, engine::CopyEngine& engine, ListenerLimits limits = {},
                  PersistentStore* persistent = nullptr);
  ~SessionListener();
  // Listens on `path` (mode, and group when gid >= 0) and starts the thread.
  absl::Status Start(const std::string& path, mode_t mode, gid_t gid);
  void Stop();

 private:
  struct Connection {
    UniqueFd fd;
    PeerCredentials peer;
    std::shared_ptr<Session> session;  // set by a successful attach
    uint64_t accepted_ms = 0;
    uint64_t serial = 0;          // tells a reused descriptor number from this connection
    bool awaiting_reply = false;  // a deferred answer is due: nothing more is read till it is sent
  };
  // An answer decided on another thread (a persistent delete, once durable).
  struct DeferredReply {
    int fd = -1;
    uint64_t serial = 0;
    wire::ObjectReply reply{};
  };

  void Run();
  void Accept(uint64_t now_ms);
  // accept4 failed for lack of descriptors or memory: the listening socket leaves the epoll set
  // for a while (10 ms, doubling up to 1 s while it keeps failing) instead of waking the thread
  // again at once for the same pending connection (it spun at 190% CPU, 11 M log lines).
  void PauseAccepting(uint64_t now_ms, int error);
  void ResumeAcceptingIfDue(uint64_t now_ms);
  // Closes connections that have not attached within attach_timeout_ms.
  void DropIdle(uint64_t now_ms);
  // Handles one message; false when the connection must be dropped.
  bool Serve(Connection& connection);
  void Drop(int fd, absl::string_view reason);
  void HandleAttach(Connection& c, const std::vector<char>& data);
  void HandleRegister(Connection& c, const std::vector<char>& data, std::vector<UniqueFd> fds);
  void HandleExtend(Connection& c, const std::vector<char>& data, std::vector<UniqueFd> fds);
  void HandleUnregister(Connection& c, const std::vector<char>& data);
  void HandleObject(Connection& c, const std::vector<char>& data);
  std::optional<absl::Status> DeleteObject(Connection& c, const wire::ObjectRequest& request,
                                           absl::string_view name, uid_t caller);
  // Deferred answers: queued from any thread (waking this one), sent from this thread.
  void PostReply(DeferredReply reply);
  void SendDeferredReplies();
  void SetReading(const Connection& c, bool reading);

  SessionRegistry& registry_;
  engine::CopyEngine& engine_;
  const ListenerLimits limits_;
  PersistentStore* const persistent_;
  std::string path_;
  UniqueFd listen_fd_;
  UniqueFd epoll_fd_;
  UniqueFd wake_fd_;
  std::atomic<bool> stop_{false};
  std::map<int, Connection> connections_;  // listener thread only
  std::map<uid_t, uint32_t> connections_per_uid_;  // listener thread only
  uint64_t next_serial_ = 1;                        // listener thread only
  Mutex replies_mu_;
  std::vector<DeferredReply> replies_ ABSL_GUARDED_BY(replies_mu_);
  bool accepting_ = true;          // the listening socket is in the epoll set
  uint64_t resume_accept_ms_ = 0;  // when it goes back (accepting_ false)
  uint64_t accept_backoff_ms_ = 0;
  // Everything a client can trigger at will is logged through these (common/log_rate_limiter.h).
  LogRateLimiter client_log_{20, 10000};
  LogRateLimiter accept_log_{1, 10000};
  std::thread thread_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_SESSIONS_SESSION_LISTENER_H_
