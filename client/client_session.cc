#include "client/client_session.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include <cstdlib>

#include "absl/container/inlined_vector.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/gpu/client_gpu.h"
#include "common/log.h"
#include "common/process_state.h"
#include "common/populate.h"
#include "common/status.h"
#include "common/unix_socket.h"
#include "common/version.h"

namespace tier::client {
namespace {

uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClientSession>> ClientSession::Open(const SessionOptions& in) {
  SessionOptions options = in;
  if (options.socket_path.empty()) options.socket_path = DefaultSocketPath();
  if (options.connect_timeout_ms <= 0) options.connect_timeout_ms = 5000;
  if (const char* warn = std::getenv("TIER_WAIT_WARN_MS"); warn != nullptr && *warn != '\0') {
    options.wait_warn_ms = std::strtoll(warn, nullptr, 10);
  }
  auto control = std::make_unique<ControlClient>(options.socket_path, options.connect_timeout_ms);
  v1::OpenSessionRequest request;
  request.set_name(options.name);
  request.set_quota_bytes(options.quota_bytes);
  request.set_ring_entries(options.ring_entries);
  request.set_client_api_version(kApiVersion);
  request.set_client_version(absl::StrCat("libtierclient ", kTierVersion));
  absl::StatusOr<v1::OpenSessionResponse> opened = control->OpenSession(request, options.daemon_wait_ms);
  if (!opened.ok()) return opened.status();
  // A daemon of another protocol would misread what follows: give up, naming both sides (the
  // pending session it opened expires on its own).
  if (opened->api_version() != 0 && opened->api_version() != kApiVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "protocol mismatch: tierd ", opened->daemon_version(), " at ", options.socket_path,
        " speaks protocol ", opened->api_version(), ", this client (libtierclient ",
        kTierVersion, ") speaks protocol ", kApiVersion,
        ": use a client and a daemon of the same protocol version"));
  }

  absl::StatusOr<SessionChannel> channel = SessionChannel::Connect(opened->session_socket());
  if (!channel.ok()) return channel.status();
  absl::StatusOr<AttachResult> attached =
      channel->Attach(opened->session_id(), opened->attach_token());
  if (!attached.ok()) return attached.status();
  absl::StatusOr<JobRing> ring =
      JobRing::Map(std::move(attached->ring_fd), attached->ring_bytes,
                   std::move(attached->sq_doorbell), std::move(attached->cq_doorbell));
  if (!ring.ok()) return ring.status();
  std::unique_ptr<ClientSession> session(
      new ClientSession(options, std::move(control), *std::move(channel), *std::move(ring)));
  session->session_id_ = opened->session_id();
  session->token_ = opened->attach_token();
  session->quota_bytes_ = attached->quota_bytes;
  session->engine_ = attached->engine;
  // Who serves this session, for a long wait's warning (0: not visible from here).
  if (absl::StatusOr<PeerCredentials> peer = GetPeerCredentials(session->channel_.fd()); peer.ok()) {
    session->daemon_pid_ = peer->pid;
  }
  // From the start, for every session: the death is known at once (tier_session_flags), also
  // for a client that waits for nothing, so it can open a session with the next tierd.
  session->StartDeathWatch();
  return session;
}

ClientSession::ClientSession(const SessionOptions& options, std::unique_ptr<ControlClient> control,
                             SessionChannel channel, JobRing ring)
    : options_(options), control_(std::move(control)), channel_(std::move(channel)),
      ring_(std::move(ring)),
      devices_(std::make_unique<DeviceRegistry>(
          [this](const wire::RegisterBuffer& request, absl::Span<const int> fds) {
            return RegisterRaw(request, fds);
          },
          [this](uint64_t buffer_id) { return UnregisterRaw(buffer_id); },
          [this](const wire::ExtendBuffer& request, absl::Span<const int> fds) {
            return ExtendRaw(request, fds);
          },
          ring_.tickets(),
          DeviceRegistry::JobMarks{[this] { return LastJobPushed(); },
                                   [this] { return OldestPendingJob(); }})) {}

uint64_t ClientSession::LastJobPushed() const {
  std::lock_guard lock(mu_);
  return next_job_ - 1;
}

uint64_t ClientSession::OldestPendingJob() const {
  std::lock_guard lock(mu_);
  uint64_t oldest = next_job_;
  for (uint64_t job : pending_) oldest = std::min(oldest, job);
  return oldest;
}

ClientSession::~ClientSession() {
  // Let the daemon finish what it is doing with our memory before we unmap it, then close: the
  // daemon frees everything the session held.
  (void)WaitAll(-1);
  if (!daemon_gone()) (void)control_->CloseSession(session_id_, token_);
  if (death_watch_.joinable()) {
    uint64_t one = 1;
    (void)!::write(death_watch_stop_.get(), &one, sizeof(one));
    death_watch_.join();
  }
  // The ticket page's registration goes only now: the daemon has closed the session (or is gone,
  // and ReleaseWaiters ran), so no stream of either side still waits on its words.
  devices_.reset();
  std::lock_guard lock(host_mu_);
  for (auto& [id, buffer] : host_buffers_) ::munmap(buffer.ptr, buffer.bytes);
}

absl::StatusOr<uint64_t> ClientSession::RegisterRaw(const wire::RegisterBuffer& request,
                                                    absl::Span<const int> fds) {
  std::lock_guard lock(channel_mu_);
  absl::StatusOr<uint64_t> id = channel_.Register(request, fds);
  if (!id.ok() && absl::IsUnavailable(id.status())) {
    std::lock_guard state(mu_);
    MarkDaemonGoneLocked();
  }
  return id;
}

absl::StatusOr<uint64_t> ClientSession::ExtendRaw(const wire::ExtendBuffer& request,
                                                  absl::Span<const int> fds) {
  std::lock_guard lock(channel_mu_);
  absl::StatusOr<uint64_t> bytes = channel_.Extend(request, fds);
  if (!bytes.ok() && absl::IsUnavailable(bytes.status())) {
    std::lock_guard state(mu_);
    MarkDaemonGoneLocked();
  }
  return bytes;
}

absl::StatusOr<uint64_t> ClientSession::RegisterFd(int fd, uint64_t bytes) {
  wire::RegisterBuffer request{};
  request.kind = static_cast<uint32_t>(wire::BufferKind::kHostMemfd);
  request.device = -1;
  request.bytes = bytes;
  return RegisterRaw(request, {&fd, 1});
}

absl::StatusOr<uint64_t> ClientSession::AllocHostBuffer(uint64_t bytes, void** ptr) {
  if (bytes == 0) return absl::InvalidArgumentError("buffer of 0 bytes");
  UniqueFd fd(::memfd_create("tier-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return ErrnoStatus("memfd_create");
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) return ErrnoStatus("ftruncate");
  // Sealed so neither side can shrink it under the other's mapping.
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    return ErrnoStatus("sealing the buffer");
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) return ErrnoStatus("mmap of the buffer");
  // Populated here, for writing, so the memory is charged to this process and stays: tierd
  // refuses sparse memfds (common/populate.h says why MAP_POPULATE is not enough).
  if (absl::Status populated = PopulateForWrite(base, bytes); !populated.ok()) {
    ::munmap(base, bytes);
    return populated;
  }
  absl::StatusOr<uint64_t> id = RegisterFd(fd.get(), bytes);
  if (!id.ok()) {
    ::munmap(base, bytes);
    return id.status();
  }
  std::lock_guard lock(host_mu_);
  host_buffers_[*id] = HostBuffer{base, bytes};
  host_by_address_[reinterpret_cast<uintptr_t>(base)] = *id;
  *ptr = base;
  return id;
}

absl::StatusOr<ClientSession::HostRange> ClientSession::FindHostRange(const void* ptr,
                                                                      uint64_t len) {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard lock(host_mu_);
  auto it = host_by_address_.upper_bound(address);
  if (it == host_by_address_.begin()) return absl::NotFoundError("not in a host buffer");
  --it;
  const HostBuffer& buffer = host_buffers_.at(it->second);
  const uint64_t offset = address - it->first;
  if (offset >= buffer.bytes) return absl::NotFoundError("not in a host buffer");
  if (len > buffer.bytes - offset) {
    return absl::OutOfRangeError(absl::StrCat("the range of ", len, " bytes at offset ", offset,
                                              " runs past the end of host buffer ", it->second,
                                              " (", buffer.bytes, " bytes)"));
  }
  return HostRange{it->second, offset};
}

absl::StatusOr<DeviceRegistry::Registered> ClientSession::RegisterDevice(const void* device_ptr,
                                                                         uint64_t len) {
  if (daemon_gone()) return absl::UnavailableError("tierd went away");
  if (engine_ == "host") {
    return absl::FailedPreconditionError(
        "tierd runs the host engine (no GPU in the daemon): register host memory instead");
  }
  absl::StatusOr<DeviceRegistry::Registered> registered = devices_->Register(device_ptr, len);
  return registered;
}

void ClientSession::StartDeathWatch() {
  death_watch_stop_ = UniqueFd(::eventfd(0, EFD_CLOEXEC));
  if (!death_watch_stop_.valid()) return;  // waiters still notice the death when they wait
  death_watch_ = std::thread([this] {
    // The session socket hangs up when the daemon dies; nothing is read from it here.
    pollfd fds[2] = {{death_watch_stop_.get(), POLLIN, 0}, {channel_.fd(), POLLRDHUP, 0}};
    for (;;) {
      if (::poll(fds, 2, -1) < 0) continue;
      if (fds[0].revents != 0) return;
      if (fds[1].revents & (POLLRDHUP | POLLHUP | POLLERR)) break;
    }
    // Release the GPU's waits before taking any lock: a thread holding mu_ may be stuck in a
    // runtime call (a launch into a stream queue full behind a wait on the dead daemon), and
    // only the release frees it. The release is plain stores (DeviceRegistry::ReleaseWaiters).
    devices_->ReleaseWaiters();
    {
      std::lock_guard lock(mu_);
      ReapLocked();
      MarkDaemonGoneLocked();
    }
    // A done write the dying daemon had queued on the GPU may land after the stores above and
    // close a gate again: store again, ever less often, until the session ends.
    for (int wait_ms = 1;; wait_ms = std::min(wait_ms * 2, 1000)) {
      pollfd stop = {death_watch_stop_.get(), POLLIN, 0};
      if (::poll(&stop, 1, wait_ms) > 0) return;
      devices_->ReleaseWaiters();
    }
  });
}

absl::Status ClientSession::UnregisterRaw(uint64_t buffer_id) {
  std::lock_guard lock(channel_mu_);
  return channel_.Unregister(buffer_id);
}

bool ClientSession::IsHostBuffer(uint64_t buffer_id) {
  std::lock_guard lock(host_mu_);
  return host_buffers_.contains(buffer_id);
}

absl::Status ClientSession::UnregisterBuffer(uint64_t buffer_id) {
  // Jobs naming the buffer must be done before it goes; waiting for all is simple and safe.
  if (absl::Status s = WaitAll(-1); !s.ok()) return s;
  devices_->Forget(buffer_id);
  std::lock_guard lock(channel_mu_);
  absl::Status status = channel_.Unregister(buffer_id);
  std::lock_guard host_lock(host_mu_);
  if (auto it = host_buffers_.find(buffer_id); it != host_buffers_.end()) {
    if (status.ok() || absl::IsUnavailable(status)) {
      ::munmap(it->second.ptr, it->second.bytes);
      host_by_address_.erase(reinterpret_cast<uintptr_t>(it->second.ptr));
      host_buffers_.erase(it);
    }
  }
  return status;
}

absl::StatusOr<ClientSession::LinkRate> ClientSession::GetLinkRate(int device) {
  if (engine_ == "host") {
    return absl::NotFoundError("tierd runs the host engine: it moves no bytes over a GPU link");
  }
  absl::StatusOr<std::string> bus = gpu::GpuPciBusId(device);
  if (!bus.ok()) return bus.status();
  absl::StatusOr<v1::GetStatusResponse> status = control_->GetStatus();
  if (!status.ok()) return status.status();
  for (const v1::GpuPlacement& gpu : status->gpus()) {
    if (!absl::EqualsIgnoreCase(gpu.pci_bus_id(), *bus)) continue;
    return LinkRate{gpu.d2h_bytes_per_s(), gpu.h2d_bytes_per_s()};
  }
  return absl::NotFoundError(absl::StrCat("tierd does not serve this process's GPU ", device,
                                          " (PCI ", *bus, "); check its CUDA_VISIBLE_DEVICES"));
}

uint64_t ClientSession::NewObjectId() {
  std::lock_guard lock(mu_);
  return next_object_++;
}

absl::Status ClientSession::CreatePersistent(absl::string_view name, uint64_t object_id,
                                             uint64_t len) {
  std::lock_guard lock(channel_mu_);
  return channel_.ObjectRequest(wire::ObjectOp::kCreate, name, object_id, wire::kCallerUid, len)
      .status();
}

absl::StatusOr<uint64_t> ClientSession::OpenPersistent(absl::string_view name,
                                                       uint64_t object_id) {
  std::lock_guard lock(channel_mu_);
  absl::StatusOr<wire::ObjectReply> reply =
      channel_.ObjectRequest(wire::ObjectOp::kOpen, name, object_id, wire::kCallerUid);
  if (!reply.ok()) return reply.status();
  return reply->len;
}

absl::StatusOr<PersistentState> ClientSession::StatPersistent(absl::string_view name) {
  std::lock_guard lock(channel_mu_);
  absl::StatusOr<wire::ObjectReply> reply =
      channel_.ObjectRequest(wire::ObjectOp::kStat, name, 0, wire::kCallerUid);
  if (!reply.ok()) return reply.status();
  return PersistentState{reply->len, reply->flags};
}

absl::Status ClientSession::ReleasePersistent(uint64_t object_id) {
  std::lock_guard lock(channel_mu_);
  return channel_.ObjectRequest(wire::ObjectOp::kRelease, "", object_id, wire::kCallerUid)
      .status();
}

absl::Status ClientSession::DeletePersistent(absl::string_view name, uint32_t uid) {
  std::lock_guard lock(channel_mu_);
  return channel_.ObjectRequest(wire::ObjectOp::kDelete, name, 0, uid).status();
}

size_t ClientSession::ReapLocked() {
  // While a reaper watches the ring outside the lock it owns the completion queue's head; the
  // others leave the queue alone and are woken when it is done.
  if (reaper_active_) return 0;
  size_t reaped = 0;
  ring::CompletionEntry entry;
  while (ring_.Pop(&entry)) {
    if (pending_.erase(entry.job_id) == 0) continue;  // not ours: ignore rather than trust
    gpu_tickets_.erase(entry.job_id);
    Completion c{entry.job_id, entry.object_id, entry.len, absl::OkStatus()};
    if (entry.status != 0) {
      c.status = absl::Status(StatusCodeFromInt(entry.status),
                              absl::StrCat(StatusCodeName(entry.status), " from tierd for job ",
                                           entry.job_id));
    }
    done_.emplace(entry.job_id, std::move(c));
    ++reaped;
  }
  if (reaped > 0) cv_.notify_all();
  return reaped;
}

void ClientSession::MarkDaemonGoneLocked() {
  if (daemon_gone_) return;
  daemon_gone_ = true;
  // No daemon will write the done counters any more: release every stream waiting on them.
  if (devices_) devices_->ReleaseWaiters();
  for (uint64_t job : pending_) {
    done_.emplace(job, Completion{job, 0, 0, absl::UnavailableError("tierd went away")});
  }
  pending_.clear();
  gpu_tickets_.clear();
  cv_.notify_all();
}

template <typename Pred, typename What>
bool ClientSession::WaitLocked(std::unique_lock<std::mutex>& lock, int64_t timeout_ms, Pred ready,
                               What what) {
  const uint64_t start = NowNs();
  const uint64_t deadline =
      timeout_ms < 0 ? ~uint64_t{0} : start + static_cast<uint64_t>(timeout_ms) * 1000000;
  const uint64_t warn_at = options_.wait_warn_ms > 0
                               ? start + static_cast<uint64_t>(options_.wait_warn_ms) * 1000000
                               : ~uint64_t{0};
  bool warned = false;
  for (;;) {
    ReapLocked();
    if (ready() || daemon_gone_) {
      if (warned) {
        LogWarning("libtierclient: session ", session_id_, ": the wait for ", what(),
                   " ended after ", (NowNs() - start) / 1000000, " ms");
      }
      return true;
    }
    uint64_t now = NowNs();
    if (now >= deadline) return false;
    if (!warned && now >= warn_at) {
      warned = true;
      // tierd's state tells the causes apart: stopped (SIGSTOP, a debugger) or stuck in a disk
      // or driver call, it will not answer by itself; running, it waits for something.
      LogWarning("libtierclient: session ", session_id_, " (pid ", ::getpid(), ") has waited ",
                 (now - start) / 1000000, " ms for ", what(), " (", pending_.size(),
                 " jobs in flight); tierd (pid ", daemon_pid_, ") is ",
                 DescribeProcessState(daemon_pid_),
                 ". `tierctl clients` shows what tierd waits for: a lane waiting "
                 "for this process's ticket means a stream of this process has not reached the "
                 "job's point; lanes with nothing to wait for mean tierd or the GPU is slow");
    }
    if (reaper_active_) {
      // Another thread watches the ring; it wakes us when it reaps.
      uint64_t until = std::min(deadline, warned ? deadline : warn_at);
      if (until == ~uint64_t{0}) {
        cv_.wait(lock);
      } else {
        cv_.wait_for(lock, std::chrono::nanoseconds(until - std::min(until, now)));
      }
      continue;
    }
    reaper_active_ = true;
    lock.unlock();
    // Poll first: a completion usually comes within microseconds, and sleeping costs more.
    bool seen = false;
    const uint64_t wake_by = std::min(deadline, warned ? deadline : warn_at);
    while (NowNs() - now < options_.spin_ns && NowNs() < wake_by) {
      if (!ring_.CompletionsEmpty()) {
        seen = true;
        break;
      }
      CpuRelax();
    }
    JobRing::WaitResult result = JobRing::WaitResult::kReady;
    if (!seen) {
      uint64_t left_ns = wake_by == ~uint64_t{0} ? 0 : wake_by - std::min(wake_by, NowNs());
      int64_t sleep_ms =
          wake_by == ~uint64_t{0} ? -1 : static_cast<int64_t>((left_ns + 999999) / 1000000);
      result = ring_.SleepForCompletion(sleep_ms, channel_.fd());
    }
    lock.lock();
    reaper_active_ = false;
    cv_.notify_all();
    if (result == JobRing::WaitResult::kPeerGone) {
      ReapLocked();
      MarkDaemonGoneLocked();
    }
  }
}

absl::StatusOr<uint64_t> ClientSession::Submit(const JobRequest& request) {
  JobRequest copy = request;
  return SubmitTicketed(copy, [&]() -> absl::StatusOr<uint64_t> { return request.sync; });
}

absl::StatusOr<uint64_t> ClientSession::SubmitTicketed(
    JobRequest& request, absl::FunctionRef<absl::StatusOr<uint64_t>()> take_ticket) {
  uint64_t job = 0;
  if (absl::Status s = PushBatch(absl::MakeSpan(&request, 1), take_ticket, absl::MakeSpan(&job, 1));
      !s.ok()) {
    return s;
  }
  return job;
}

absl::StatusOr<std::vector<uint64_t>> ClientSession::SubmitBatch(
    absl::Span<JobRequest> requests, absl::FunctionRef<absl::StatusOr<uint64_t>()> take_ticket) {
  std::vector<uint64_t> jobs(requests.size());
  if (absl::Status s = PushBatch(requests, take_ticket, absl::MakeSpan(jobs)); !s.ok()) return s;
  return jobs;
}

absl::Status ClientSession::PushBatch(absl::Span<JobRequest> requests,
                                      absl::FunctionRef<absl::StatusOr<uint64_t>()> take_ticket,
                                      absl::Span<uint64_t> jobs) {
  const size_t n = requests.size();
  if (n == 0) return absl::OkStatus();
  const size_t limit = std::min<size_t>(ring_.capacity(), ring::kMaxBatchJobs);
  if (n > limit) {
    return absl::InvalidArgumentError(absl::StrCat("a batch of ", n, " jobs; at most ", limit,
                                                   " fit this session's ring"));
  }
  std::unique_lock lock(mu_);
  if (daemon_gone_) return absl::UnavailableError("tierd went away");
  if (ring_.daemon_state() & ring::kDaemonDraining) {
    for (const JobRequest& r : requests) {
      if (r.opcode != static_cast<uint32_t>(ring::Opcode::kOffload)) continue;
      // tierd hands back before it exits: what was offloaded comes back (reloads and frees go
      // on); new data stays with the caller. Nothing was pushed.
      return absl::UnavailableError(
          "tierd is draining (stopping or restarting): offload refused, keep the data");
    }
  }
  // At most ring-capacity jobs in flight, so neither queue can overflow; and room for the whole
  // batch before its ticket is taken: the daemon signals the ticket only once every job of it
  // arrived, so a batch stuck half pushed would wait for itself.
  if (pending_.size() + n > ring_.capacity()) {
    WaitLocked(lock, -1, [&] { return pending_.size() + n <= ring_.capacity(); },
               [&] { return absl::StrCat("room in the ring (", ring_.capacity(), " jobs) for ", n,
                                         n == 1 ? " job" : " jobs"); });
    if (daemon_gone_) return absl::UnavailableError("tierd went away");
  }
  absl::StatusOr<uint64_t> ticket = take_ticket();
  if (!ticket.ok()) return ticket.status();
  absl::InlinedVector<ring::SubmissionEntry, 1> entries(n);
  const uint32_t batch_flags = *ticket != 0 && n > 1 ? ring::BatchSizeFlags(n) : 0;
  for (size_t i = 0; i < n; ++i) {
    JobRequest& request = requests[i];
    request.sync = *ticket;
    ring::SubmissionEntry& entry = entries[i];
    entry = static_cast<const ring::SubmissionEntry&>(request);
    entry.job_id = jobs[i] = next_job_ + i;
    entry.flags |= batch_flags;
  }
  if (!ring_.PushAll(entries)) {
    // Cannot happen (admission keeps the queue from overflowing); if it did, a taken ticket
    // would never reach the daemon, so this session's GPU lanes are released for good.
    if (*ticket != 0) MarkDaemonGoneLocked();
    return absl::InternalError("submission queue full despite admission");
  }
  next_job_ += n;
  for (size_t i = 0; i < n; ++i) {
    pending_.insert(jobs[i]);
    if (*ticket != 0) {
      const bool reload = requests[i].opcode == static_cast<uint32_t>(ring::Opcode::kReload);
      gpu_tickets_[jobs[i]] = Ticket{requests[i].device, *ticket, reload};
    }
  }
  return absl::OkStatus();
}

absl::Status ClientSession::StreamWaitJob(uint64_t job, bool reload, void* stream) {
  Ticket ticket;
  {
    std::lock_guard lock(mu_);
    auto it = gpu_tickets_.find(job);
    if (it == gpu_tickets_.end()) {
      if (job == 0 || job >= next_job_) return absl::NotFoundError(absl::StrCat("no job ", job));
      // Reaped: its done value was written before its completion (one stream does both), so
      // nothing is left to wait for; or a job on host memory.
      return absl::OkStatus();
    }
    ticket = it->second;
  }
  if (ticket.reload != reload) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job, " is a GPU ",
                                                   ticket.reload ? "reload" : "offload"));
  }
  gpu::DeviceSync* sync = devices_->Sync(ticket.device);
  if (sync == nullptr) return absl::InternalError("GPU job without a ticket slot");
  return reload ? sync->WaitReloadDone(stream, ticket.ticket)
                : sync->WaitOffloadDone(stream, ticket.ticket);
}

absl::Status ClientSession::Wait(uint64_t job, int64_t timeout_ms) {
  std::unique_lock lock(mu_);
  if (!done_.contains(job) && !pending_.contains(job)) {
    return absl::NotFoundError(absl::StrCat("job ", job, " is unknown or was already waited for"));
  }
  if (!WaitLocked(lock, timeout_ms, [&] { return done_.contains(job); },
                  [&] { return absl::StrCat("job ", job); })) {
    return absl::DeadlineExceededError(absl::StrCat("job ", job, " not done within ", timeout_ms, " ms"));
  }
  auto it = done_.find(job);
  absl::Status status = std::move(it->second.status);
  done_.erase(it);
  return status;
}

std::vector<Completion> ClientSession::Poll(size_t max) {
  std::lock_guard lock(mu_);
  ReapLocked();
  std::vector<Completion> out;
  for (auto it = done_.begin(); it != done_.end() && out.size() < max;) {
    out.push_back(std::move(it->second));
    it = done_.erase(it);
  }
  return out;
}

absl::Status ClientSession::WaitAll(int64_t timeout_ms) {
  std::unique_lock lock(mu_);
  if (!WaitLocked(lock, timeout_ms, [&] { return pending_.empty(); },
                  [&] { return std::string("every job in flight"); })) {
    return absl::DeadlineExceededError("jobs still in flight");
  }
  return daemon_gone_ ? absl::UnavailableError("tierd went away") : absl::OkStatus();
}

size_t ClientSession::in_flight() const {
  std::lock_guard lock(mu_);
  return pending_.size();
}

bool ClientSession::daemon_gone() const {
  std::lock_guard lock(mu_);
  return daemon_gone_;
}

}  // namespace tier::client
