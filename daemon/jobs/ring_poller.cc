#include "common/thread_gpu.h"
#include "common/thread_role.h"
#include "daemon/jobs/ring_poller.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "common/log.h"
#include "common/status.h"

namespace tier::daemon {
namespace {

constexpr int kBatch = 64;  // entries per session per pass, so one busy client cannot starve others
// A doorbell that woke the poller this many times in a row without an entry to take is ignored for
// kMuteMs (then watched again; one more idle wake-up mutes it again). A client rings only after
// pushing an entry while the poller sleeps, so a well-behaved one makes at most one such wake-up
// in a row (its entry was taken before the poller saw the ring).
constexpr uint32_t kMaxIdleRings = 32;
constexpr uint64_t kMuteMs = 100;
// A doorbell the epoll set could not take is looked at this often.
constexpr int kUnwatchedPollMs = 5;

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

RingPoller::RingPoller(SessionRegistry& registry, JobExecutor& executor, uint32_t poll_idle_us,
                       PollerPlace place)
    : registry_(registry), executor_(executor), poll_idle_ns_(uint64_t{poll_idle_us} * 1000),
      place_(std::move(place)) {}

RingPoller::~RingPoller() { Stop(); }

absl::Status RingPoller::Start() {
  wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_.valid()) return ErrnoStatus("eventfd");
  // One epoll set for the daemon's life: made here, where a failure stops the start, not later,
  // where descriptors may have run out (a poller that re-created it then and went on with none
  // spun at 100% CPU: epoll_wait on -1 returns at once).
  epoll_fd_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd_.valid()) return ErrnoStatus("epoll_create1 for the ring poller");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;  // the wake-up eventfd; doorbells carry their session's id (>= 1)
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, wake_fd_.get(), &ev) != 0) {
    return ErrnoStatus("epoll_ctl for the ring poller's wake-up");
  }
  heartbeat_ms_.store(MonotonicMs(), std::memory_order_relaxed);
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

int RingPoller::DeviceOf(const Session& session) const {
  const int device = session.home_device();
  return device >= 0 && device < place_.devices ? device : -1;
}

std::vector<std::shared_ptr<Session>> RingPoller::OwnSessions() const {
  std::vector<std::shared_ptr<Session>> own = registry_.ActiveSessions();
  std::erase_if(own, [this](const std::shared_ptr<Session>& session) {
    return DeviceOf(*session) != place_.device;
  });
  return own;
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

void RingPoller::Watch(Doorbell& bell, uint32_t events, int op) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = bell.session->id();
  if (::epoll_ctl(epoll_fd_.get(), op, bell.session->sq_doorbell_fd(), &ev) == 0) {
    bell.watched = true;
    return;
  }
  const int error = errno;
  if (op == EPOLL_CTL_ADD) bell.watched = false;
  LogWarningLimited(mute_log_, "session ", bell.session->id(), ": ",
                    ErrnoStatus("epoll_ctl on its doorbell", error).message(),
                    ": its ring is polled every ", kUnwatchedPollMs, " ms instead");
}

void RingPoller::UpdateDoorbells(const std::vector<std::shared_ptr<Session>>& sessions) {
  std::map<Session*, Doorbell> next;
  for (const std::shared_ptr<Session>& session : sessions) {
    auto old = doorbells_.find(session.get());
    if (old != doorbells_.end()) {
      next.emplace(session.get(), std::move(old->second));
      doorbells_.erase(old);
      continue;
    }
    Doorbell bell;
    bell.session = session;
    Watch(bell, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_ADD);
    next.emplace(session.get(), std::move(bell));
  }
  // Sessions that left the active set: out of the epoll set while their doorbells are still open
  // (the entries here hold them).
  std::vector<int> moved_to;
  for (auto& [ptr, bell] : doorbells_) {
    if (bell.watched) {
      ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, bell.session->sq_doorbell_fd(), nullptr);
    }
    // One that moved to its GPU's poller: let go of its queue (this thread is between passes, so
    // it touches the queue no more), counted first so that no wait for an idle pass of every
    // poller can miss it in transit. (Only if this poller took it: one that moved before its
    // first pass here is taken fresh by its new poller. Nobody else lets go of it for us.)
    const int home = DeviceOf(*bell.session);
    if (home != place_.device && !bell.session->closing() && Holds(*bell.session)) {
      moves_out_.fetch_add(1, std::memory_order_acq_rel);
      bell.session->ReleaseSubmissions(holder_id());
      moved_to.push_back(home);
    }
  }
  doorbells_ = std::move(next);
  sessions_ = sessions;
  session_count_.store(static_cast<uint32_t>(sessions_.size()), std::memory_order_relaxed);
  if (place_.let_go) {
    for (int device : moved_to) place_.let_go(device);
  }
}

void RingPoller::NoteDrain(Doorbell& bell, bool took, uint64_t now_ms) {
  if (took) {
    bell.idle_rings = 0;
  } else if (bell.rang && ++bell.idle_rings >= kMaxIdleRings && !bell.muted) {
    bell.muted = true;
    bell.unmute_ms = now_ms + kMuteMs;
    if (bell.watched) Watch(bell, EPOLLRDHUP, EPOLL_CTL_MOD);  // hang-ups still end it
    LogWarningLimited(mute_log_, "session ", bell.session->id(), " '", bell.session->name(),
                      "' (pid ", bell.session->peer().pid, " uid ", bell.session->peer().uid,
                      ") rings its doorbell without submitting: ignored for ", kMuteMs,
                      " ms at a time");
  }
  bell.rang = false;
  if (bell.muted && now_ms >= bell.unmute_ms) {
    bell.muted = false;
    if (bell.watched) Watch(bell, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_MOD);
  }
}

int RingPoller::SleepBoundMs(int timeout_ms, uint64_t now_ms) const {
  for (const auto& [ptr, bell] : doorbells_) {
    if (!bell.watched) timeout_ms = std::min(timeout_ms, kUnwatchedPollMs);
    if (bell.muted) {
      timeout_ms = std::min<int>(
          timeout_ms, static_cast<int>(bell.unmute_ms > now_ms ? bell.unmute_ms - now_ms : 0));
    }
  }
  return timeout_ms;
}

void RingPoller::WaitForDoorbells(int timeout_ms) {
  epoll_event events[16];
  int n = ::epoll_wait(epoll_fd_.get(), events, 16, timeout_ms);
  if (n < 0 && errno != EINTR) {
    // (Not expected with a valid set; never spin on it.)
    LogWarningLimited(mute_log_, ErrnoStatus("epoll_wait in the ring poller").message());
    ::poll(nullptr, 0, std::min(timeout_ms, 10));
    return;
  }
  for (int i = 0; i < n; ++i) {
    const uint64_t id = events[i].data.u64;
    if (id == 0) continue;  // the wake-up eventfd
    auto it = std::find_if(sessions_.begin(), sessions_.end(),
                           [id](const std::shared_ptr<Session>& s) { return s->id() == id; });
    if (it == sessions_.end()) continue;
    // The client closed or shut down its end of the doorbell (it exits, or it is hostile): the
    // daemon's end now reports it for ever, which would keep every epoll_wait from sleeping. A
    // client without its doorbell cannot go on; end the session (the listener then drops its
    // socket).
    if ((events[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) {
      registry_.End(*it, "client closed its submission doorbell");
    } else {
      doorbells_[it->get()].rang = true;
    }
  }
}

void RingPoller::Sleep(bool any_blocked) {
  // Announce the sleep on every ring, then look once more: a client that published an entry
  // before seeing the flag is caught here; one that publishes after will ring the doorbell.
  // (Only the queues this poller holds: one it has not taken yet is someone else's.)
  std::vector<Session*> held;
  for (const auto& session : sessions_) {
    if (session->HoldsSubmissions(holder_id())) held.push_back(session.get());
  }
  bool pending = false;
  for (Session* session : held) pending |= session->submissions().PrepareSleep();
  if (!pending) {
    // A session that is blocked on a full completion queue does not ring; look again soon.
    WaitForDoorbells(SleepBoundMs(any_blocked ? 1 : 500, MonotonicMs()));
    DrainEventfd(wake_fd_.get());
    // (A muted doorbell is left full: its client's rings then fail, and cost nobody anything.)
    for (const auto& [ptr, bell] : doorbells_) {
      if (!bell.muted) DrainDoorbell(bell.session->sq_doorbell_fd());
    }
  }
  for (Session* session : held) session->submissions().CancelSleep();
}

void RingPoller::Run() {
  SetThreadRole(ThreadRole::kRingPoller);
  SetThreadGpu(place_.device);  // its GPU's extent caches (storage/extent_cache.h); -1: none
  uint64_t generation = ~uint64_t{0};
  uint64_t last_work_ns = MonotonicNs();
  while (!stop_.load(std::memory_order_acquire)) {
    if (uint64_t now_generation = registry_.generation(); now_generation != generation) {
      generation = now_generation;
      UpdateDoorbells(OwnSessions());
    }
    bool work = false;
    bool any_blocked = false;
    const uint64_t now_ms = MonotonicMs();
    for (const auto& session : sessions_) {
      if (session->closing()) continue;
      if (!session->TakeSubmissions(holder_id())) {
        // Moved here, and the poller it left has not let go yet (it does when it next looks at
        // its sessions, woken by the same change): not idle, and no long sleep.
        any_blocked = true;
        continue;
      }
      bool blocked = false;
      const bool took = Drain(session, &blocked);
      any_blocked |= blocked;
      work |= took;
      // (A blocked session waits for its completion queue, not for entries: not idle.)
      NoteDrain(doorbells_[session.get()], took || blocked, now_ms);
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
      WaitForDoorbells(1);
      continue;
    }
    Sleep(any_blocked);
    last_work_ns = MonotonicNs();
  }
}

}  // namespace tier::daemon
