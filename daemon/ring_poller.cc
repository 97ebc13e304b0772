#include "daemon/ring_poller.h"
#include "common/thread_role.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/status.h"

namespace tier::daemon {
namespace {

constexpr int kBatch = 64;  // entries per session per pass, so one busy client cannot starve others

void DrainEventfd(int fd) {
  uint64_t value;
  [[maybe_unused]] ssize_t n = ::read(fd, &value, sizeof(value));
}

// Empties a session's doorbell (the daemon's end of a socket pair: MSG_DONTWAIT, so this cannot
// block whatever the client does to its own end). Bounded, so a client that keeps ringing costs
// the poller a few reads per pass, not a loop; what is left wakes the next epoll_wait at once.
void DrainDoorbell(int fd) {
  char bytes[4096];
  for (int i = 0; i < 4; ++i) {
    if (::recv(fd, bytes, sizeof(bytes), MSG_DONTWAIT) < static_cast<ssize_t>(sizeof(bytes))) {
      return;
    }
  }
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

RingPoller::RingPoller(SessionRegistry& registry, JobExecutor& executor, uint32_t poll_idle_us)
    : registry_(registry), executor_(executor), poll_idle_ns_(uint64_t{poll_idle_us} * 1000) {}

RingPoller::~RingPoller() { Stop(); }

absl::Status RingPoller::Start() {
  wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_.valid()) return ErrnoStatus("eventfd");
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void RingPoller::Wake() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
}

void RingPoller::Stop() {
  if (!thread_.joinable()) return;
  stop_.store(true, std::memory_order_release);
  Wake();
  thread_.join();
}

bool RingPoller::AwaitIdlePass(std::chrono::steady_clock::time_point deadline) {
  idle_waiters_.fetch_add(1);
  Wake();  // out of its sleep, to go round (it does not sleep again while we wait)
  bool idle = true;
  {
    MutexLock lock(&idle_mu_);
    // The first pass to end after this point may have looked at some rings before the call; the
    // second began after the first ended.
    const uint64_t target = idle_passes_ + 2;
    while (idle_passes_ < target) {
      if (!idle_cv_.WaitUntil(&idle_mu_, deadline)) {
        idle = false;
        break;
      }
    }
  }
  idle_waiters_.fetch_sub(1);
  return idle;
}

void RingPoller::NoteIdlePass() {
  MutexLock lock(&idle_mu_);
  ++idle_passes_;
  idle_cv_.SignalAll();
}

bool RingPoller::Drain(const std::shared_ptr<Session>& session, bool* blocked) {
  bool took = false;
  ring::SubmissionEntry entry;
  for (int i = 0; i < kBatch; ++i) {
    if (!session->CanAdmit()) {
      *blocked = true;
      break;
    }
    auto result = session->submissions().TryPop(&entry);
    if (result == ring::Consumer<ring::SubmissionEntry>::Result::kEmpty) break;
    if (result == ring::Consumer<ring::SubmissionEntry>::Result::kCorrupt) {
      registry_.End(session, "client corrupted its submission queue");
      break;
    }
    took = true;
    if (registry_.refusing()) {
      executor_.Reject(session, entry, absl::UnavailableError("tierd is draining"));
    } else {
      executor_.Start(session, entry);
    }
  }
  if (session->broken()) registry_.End(session, "client corrupted its completion queue");
  return took;
}

void RingPoller::RebuildEpoll(const std::vector<std::shared_ptr<Session>>& sessions) {
  epoll_fd_.reset(::epoll_create1(EPOLL_CLOEXEC));
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.u64 = 0;  // the wake-up eventfd; sessions are 1 + their index in `sessions`
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, wake_fd_.get(), &ev);
  for (size_t i = 0; i < sessions.size(); ++i) {
    ev.data.u64 = i + 1;
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, sessions[i]->sq_doorbell_fd(), &ev);
  }
}

void RingPoller::WaitForDoorbells(const std::vector<std::shared_ptr<Session>>& sessions,
                                  int timeout_ms) {
  epoll_event events[16];
  int n = ::epoll_wait(epoll_fd_.get(), events, 16, timeout_ms);
  for (int i = 0; i < n; ++i) {
    uint64_t index = events[i].data.u64;
    if (index == 0 || index > sessions.size()) continue;
    // The client closed or shut down its end of the doorbell (it exits, or it is hostile): the
    // daemon's end now reports it for ever, which would keep every epoll_wait from sleeping. A
    // client without its doorbell cannot go on; end the session (the listener then drops its
    // socket).
    if ((events[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) {
      registry_.End(sessions[index - 1], "client closed its submission doorbell");
    }
  }
}

void RingPoller::Sleep(const std::vector<std::shared_ptr<Session>>& sessions, bool any_blocked) {
  // Announce the sleep on every ring, then look once more: a client that published an entry
  // before seeing the flag is caught here; one that publishes after will ring the doorbell.
  bool pending = false;
  for (const auto& session : sessions) pending |= session->submissions().PrepareSleep();
  if (!pending) {
    // A session that is blocked on a full completion queue does not ring; look again soon.
    WaitForDoorbells(sessions, any_blocked ? 1 : 500);
    DrainEventfd(wake_fd_.get());
    for (const auto& session : sessions) DrainDoorbell(session->sq_doorbell_fd());
  }
  for (const auto& session : sessions) session->submissions().CancelSleep();
}

void RingPoller::Run() {
  SetThreadRole(ThreadRole::kRingPoller);
  std::vector<std::shared_ptr<Session>> sessions;
  uint64_t generation = ~uint64_t{0};
  uint64_t last_work_ns = MonotonicNs();
  while (!stop_.load(std::memory_order_acquire)) {
    if (uint64_t now_generation = registry_.generation(); now_generation != generation) {
      generation = now_generation;
      sessions = registry_.ActiveSessions();
      RebuildEpoll(sessions);
    }
    bool work = false;
    bool any_blocked = false;
    for (const auto& session : sessions) {
      if (session->closing()) continue;
      work |= Drain(session, &any_blocked);
    }
    uint64_t now = MonotonicNs();
    heartbeat_ms_.store(now / 1000000, std::memory_order_relaxed);
    if (work) {
      last_work_ns = now;
      continue;
    }
    if (idle_waiters_.load() > 0) {  // someone waits for an idle pass: report it, stay awake
      if (!any_blocked) NoteIdlePass();
      CpuRelax();
      continue;
    }
    if (now - last_work_ns < poll_idle_ns_) {
      CpuRelax();
      continue;
    }
    if (any_blocked) {
      // Blocked sessions keep entries in their queue; sleeping on them would spin. Nap briefly.
      WaitForDoorbells(sessions, 1);
      continue;
    }
    Sleep(sessions, any_blocked);
    last_work_ns = MonotonicNs();
  }
}

}  // namespace tier::daemon
