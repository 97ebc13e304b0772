#include "daemon/control/control_acceptor.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/log.h"
#include "common/status.h"
#include "daemon/metrics/metrics.h"
#include "grpcpp/server.h"
#include "grpcpp/server_posix.h"

namespace tier::daemon {
namespace {

constexpr int kSweepMs = 1000;
constexpr uint64_t kExemptReserve = 32;  // descriptors root's and tierd's own connections leave

// Whether the descriptor `fd` still is the file it was (device and inode).
bool SameFile(int fd, dev_t dev, ino_t ino) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

}  // namespace

ControlAcceptor::ControlAcceptor(uint32_t max_connections_per_uid)
    : max_connections_per_uid_(max_connections_per_uid), own_uid_(::geteuid()) {}

ControlAcceptor::~ControlAcceptor() { Stop(); }

absl::Status ControlAcceptor::Start(const std::string& path, mode_t mode, gid_t gid,
                                    grpc::Server* server) {
  absl::StatusOr<UniqueFd> listen_fd = ListenStream(path, mode);
  if (!listen_fd.ok()) return listen_fd.status();
  if (gid != static_cast<gid_t>(-1) && ::chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    return ErrnoStatus(absl::StrCat("chown ", path));
  }
  if (::fcntl(listen_fd->get(), F_SETFL, O_NONBLOCK) != 0) return ErrnoStatus("fcntl O_NONBLOCK");
  wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_.valid()) return ErrnoStatus("eventfd");
  rlimit limit{};
  open_files_limit_ = ::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                          ? limit.rlim_cur
                          : uint64_t{1} << 20;
  server_ = server;
  path_ = path;
  listen_fd_ = *std::move(listen_fd);
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void ControlAcceptor::Stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
  thread_.join();
  listen_fd_.reset();
  ::unlink(path_.c_str());
}

void ControlAcceptor::Run() {
  while (!stop_) {
    pollfd fds[2] = {{wake_fd_.get(), POLLIN, 0}, {listen_fd_.get(), POLLIN, 0}};
    // While accept fails for lack of descriptors, the listening socket is not watched (it would
    // wake the thread at once for the same pending connection): a pause, doubling up to 1 s.
    const bool paused = backoff_ms_ > 0;
    int ready = ::poll(fds, paused ? 1 : 2, paused ? static_cast<int>(backoff_ms_) : kSweepMs);
    if (stop_) break;
    if (paused || (ready > 0 && (fds[1].revents & POLLIN) != 0)) {
      // A burst at a time, so that one wake-up does not cost a poll per connection.
      for (int i = 0; i < 64 && !stop_ && Accept(); ++i) {
      }
    }
    MutexLock lock(&mu_);
    Sweep(/*force=*/false);
  }
}

bool ControlAcceptor::Accept() {
  int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) {
    const int error = errno;
    if (error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM) {
      backoff_ms_ = backoff_ms_ == 0 ? 10 : std::min<uint64_t>(backoff_ms_ * 2, 1000);
      LogWarningLimited(log_, ErrnoStatus("accept on the control socket", error).message(),
                        ": not accepting for ", backoff_ms_, " ms");
      return false;
    }
    backoff_ms_ = 0;
    return error == EINTR || error == ECONNABORTED;  // EAGAIN: none waiting
  }
  backoff_ms_ = 0;
  UniqueFd conn(fd);
  absl::StatusOr<PeerCredentials> peer = GetPeerCredentials(fd);
  if (!peer.ok()) {
    LogWarningLimited(log_, "control socket: ", peer.status().message());
    return true;
  }
  const bool exempt = peer->uid == 0 || peer->uid == own_uid_;
  // Descriptors are handed out lowest first: one this high means nearly all below it are taken.
  const uint64_t reserve =
      exempt ? kExemptReserve : std::max<uint64_t>(64, open_files_limit_ / 8);
  if (static_cast<uint64_t>(fd) + reserve >= open_files_limit_) {
    LogWarningLimited(log_, "control socket: refused a connection of pid ", peer->pid, " uid ",
                      peer->uid, ": descriptor ", fd, " of ", open_files_limit_,
                      " (RLIMIT_NOFILE), ", reserve, " kept for tierd",
                      exempt ? "" : " and for root's health checks");
    return true;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) return true;
  {
    MutexLock lock(&mu_);
    ForgetLocked(fd);  // a descriptor number gRPC closed and the kernel gave out again
    if (!exempt && per_uid_[peer->uid] >= max_connections_per_uid_) {
      Sweep(/*force=*/true);
      if (per_uid_[peer->uid] >= max_connections_per_uid_) {
        LogWarningLimited(log_, "control socket: refused a connection of pid ", peer->pid,
                          ": uid ", peer->uid, " has ", max_connections_per_uid_,
                          " open (max_connections_per_uid)");
        return true;
      }
    }
    connections_[fd] = Connection{st.st_dev, st.st_ino, *peer};
    ++per_uid_[peer->uid];
  }
  // gRPC owns the descriptor from here, and closes it when the connection ends.
  grpc::AddInsecureChannelFromFd(server_, conn.release());
  return true;
}

void ControlAcceptor::ForgetLocked(int fd) {
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  auto of_uid = per_uid_.find(it->second.peer.uid);
  if (of_uid != per_uid_.end() && --of_uid->second == 0) per_uid_.erase(of_uid);
  connections_.erase(it);
}

void ControlAcceptor::Sweep(bool force) {
  const uint64_t now = MonotonicMs();
  if (!force && now - last_sweep_ms_ < static_cast<uint64_t>(kSweepMs)) return;
  if (force && now - last_sweep_ms_ < 10) return;
  last_sweep_ms_ = now;
  std::vector<int> gone;
  for (const auto& [fd, connection] : connections_) {
    if (!SameFile(fd, connection.dev, connection.ino)) gone.push_back(fd);
  }
  for (int fd : gone) ForgetLocked(fd);
}

std::optional<PeerCredentials> ControlAcceptor::PeerOf(absl::string_view peer) const {
  if (!absl::ConsumePrefix(&peer, "fd:")) return std::nullopt;
  int fd = -1;
  auto [end, error] = std::from_chars(peer.data(), peer.data() + peer.size(), fd);
  if (error != std::errc() || end != peer.data() + peer.size()) return std::nullopt;
  MutexLock lock(&mu_);
  auto it = connections_.find(fd);
  if (it == connections_.end() || !SameFile(fd, it->second.dev, it->second.ino)) {
    return std::nullopt;
  }
  return it->second.peer;
}

size_t ControlAcceptor::connections() const {
  MutexLock lock(&mu_);
  return connections_.size();
}

}  // namespace tier::daemon
