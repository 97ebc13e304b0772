#include "common/unix_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "tier/session_wire.h"

namespace tier {
namespace {

absl::StatusOr<sockaddr_un> MakeAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("bad socket path '", path, "'"));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

}  // namespace

namespace {

absl::StatusOr<UniqueFd> Listen(const std::string& path, mode_t mode, int type, int backlog) {
  absl::StatusOr<sockaddr_un> addr = MakeAddress(path);
  if (!addr.ok()) return addr.status();
  UniqueFd fd(::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus("socket");
  ::unlink(path.c_str());
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    return ErrnoStatus(absl::StrCat("bind ", path));
  }
  if (::chmod(path.c_str(), mode) != 0) return ErrnoStatus(absl::StrCat("chmod ", path));
  if (::listen(fd.get(), backlog) != 0) return ErrnoStatus("listen");
  return fd;
}

}  // namespace

absl::StatusOr<UniqueFd> ListenSeqpacket(const std::string& path, mode_t mode, int backlog) {
  return Listen(path, mode, SOCK_SEQPACKET, backlog);
}

absl::StatusOr<UniqueFd> ListenStream(const std::string& path, mode_t mode, int backlog) {
  return Listen(path, mode, SOCK_STREAM, backlog);
}

absl::StatusOr<UniqueFd> ConnectSeqpacket(const std::string& path, int timeout_ms) {
  absl::StatusOr<sockaddr_un> addr = MakeAddress(path);
  if (!addr.ok()) return addr.status();
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return ErrnoStatus("socket");
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  // A Unix socket connects at once or fails with EAGAIN while the listener's backlog is full
  // (there is no EINPROGRESS to wait on): try again every few milliseconds until the deadline.
  for (;;) {
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) == 0) break;
    if (errno != EAGAIN && errno != EINTR) return ErrnoStatus(absl::StrCat("connect ", path));
    if (timeout_ms >= 0 && std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "connect ", path, ": not accepted within ", timeout_ms, " ms (backlog full)"));
    }
    ::poll(nullptr, 0, 5);
  }
  int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return ErrnoStatus("fcntl on the session socket");
  }
  return fd;
}

absl::Status WaitReadable(int fd, int timeout_ms, absl::string_view what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int left = -1;
    if (timeout_ms >= 0) {
      left = static_cast<int>(std::max<int64_t>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(
                 deadline - std::chrono::steady_clock::now())
                 .count()));
    }
    pollfd pfd{fd, POLLIN, 0};
    int n = ::poll(&pfd, 1, left);
    if (n > 0) return absl::OkStatus();  // readable, or hung up / in error: the read says which
    if (n < 0 && errno != EINTR) return ErrnoStatus("poll");
    if (n == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": no answer within ", timeout_ms, " ms"));
    }
  }
}

absl::StatusOr<PeerCredentials> GetPeerCredentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoStatus("getsockopt(SO_PEERCRED)");
  }
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

absl::Status SendMessage(int fd, const void* data, size_t len, absl::Span<const int> fds) {
  if (fds.size() > wire::kMaxFds) return absl::InvalidArgumentError("too many fds");
  iovec iov{const_cast<void*>(data), len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * wire::kMaxFds)] = {};
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n >= 0) {
      if (static_cast<size_t>(n) != len) return absl::InternalError("short sendmsg");
      return absl::OkStatus();
    }
    if (errno != EINTR) return ErrnoStatus("sendmsg");
  }
}

absl::StatusOr<ReceivedMessage> ReceiveMessage(int fd, size_t max_len, size_t max_fds) {
  ReceivedMessage out;
  out.data.resize(max_len);
  iovec iov{out.data.data(), max_len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * (wire::kMaxFds + 4))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoStatus("recvmsg");
  // Take ownership of every descriptor first so none leaks on the error paths below.
  for (cmsghdr* cmsg = CMSG_FIRSTHDR(&msg); cmsg != nullptr; cmsg = CMSG_NXTHDR(&msg, cmsg)) {
    if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received;
      std::memcpy(&received, CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
      out.fds.emplace_back(received);
    }
  }
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
    return absl::InvalidArgumentError("message or its descriptors truncated");
  }
  if (out.fds.size() > max_fds) return absl::InvalidArgumentError("too many descriptors");
  out.data.resize(static_cast<size_t>(n));
  return out;
}

}  // namespace tier
