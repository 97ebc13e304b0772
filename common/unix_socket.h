// Unix-domain socket plumbing for the session socket: SOCK_SEQPACKET listen/connect, messages with
// file descriptors (SCM_RIGHTS), and the peer's kernel credentials (SO_PEERCRED).
#ifndef TIER_COMMON_UNIX_SOCKET_H_
#define TIER_COMMON_UNIX_SOCKET_H_

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/unique_fd.h"

namespace tier {

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// Binds and listens on `path` (an existing socket file there is replaced), mode `mode`.
absl::StatusOr<UniqueFd> ListenSeqpacket(const std::string& path, mode_t mode, int backlog = 64);
// The same for a stream socket (the control socket's gRPC).
absl::StatusOr<UniqueFd> ListenStream(const std::string& path, mode_t mode, int backlog = 128);
// Connects within timeout_ms (< 0: no limit). A Unix socket whose listener does not accept
// (a hung or overloaded daemon, a full backlog) makes a plain connect() wait for ever: the socket
// connects non-blocking and retries until the deadline instead (DEADLINE_EXCEEDED). The returned
// socket is blocking.
absl::StatusOr<UniqueFd> ConnectSeqpacket(const std::string& path, int timeout_ms = -1);
// Waits until `fd` is readable (or hung up) for at most timeout_ms (< 0: no limit);
// DEADLINE_EXCEEDED naming `what` when the time passes.
absl::Status WaitReadable(int fd, int timeout_ms, absl::string_view what);
absl::StatusOr<PeerCredentials> GetPeerCredentials(int fd);

// Sends one message with up to wire::kMaxFds descriptors attached.
absl::Status SendMessage(int fd, const void* data, size_t len, absl::Span<const int> fds = {});

struct ReceivedMessage {
  std::vector<char> data;      // empty on orderly shutdown by the peer
  std::vector<UniqueFd> fds;   // owned: closed unless taken
};

// Receives one message (blocking unless fd is non-blocking). A truncated message or one carrying
// more descriptors than allowed is an error (the extra descriptors are closed).
absl::StatusOr<ReceivedMessage> ReceiveMessage(int fd, size_t max_len, size_t max_fds);

}  // namespace tier

#endif  // TIER_COMMON_UNIX_SOCKET_H_
