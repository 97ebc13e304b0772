#include "daemon/sessions/session.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "common/status.h"

namespace tier::daemon {

Session::Session(uint64_t id, std::string name, const AttachToken& token, uint64_t quota_bytes,
                 uint32_t ring_entries)
    : id_(id), name_(std::move(name)), token_(token), quota_bytes_(quota_bytes),
      ring_entries_(ring_entries), created_ms_(MonotonicMs()),
      objects_(std::make_shared<ObjectTable>(quota_bytes)) {}

Session::~Session() {
  // The engine session reads the ring's ticket page: it goes first. A GPU engine may keep the
  // page registered a little longer (its release thread): it holds the mapping until then.
  engine_session_.reset();
  ring_mapping_.reset();
}

bool Session::TokenMatches(const AttachToken& token) const {
  // Constant time: the token is the only proof that the attaching process opened the session.
  uint8_t diff = 0;
  for (size_t i = 0; i < token.size(); ++i) diff |= token[i] ^ token_[i];
  return diff == 0;
}

absl::Status Session::Attach(const PeerCredentials& peer, EngineOpener open_engine) {
  {
    MutexLock lock(&mu_);
    if (attached_) return absl::AlreadyExistsError("session is already attached");
    if (closing_) return absl::FailedPreconditionError("session is closing");
  }
  ring_bytes_ = ring::SegmentBytes(ring_entries_);
  ring_fd_.reset(::memfd_create(absl::StrCat("tierd-ring-", id_).c_str(),
                                MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!ring_fd_.valid()) return ErrnoStatus("memfd_create for the job ring");
  if (::ftruncate(ring_fd_.get(), static_cast<off_t>(ring_bytes_)) != 0) {
    return ErrnoStatus("ftruncate of the job ring");
  }
  // The client must not be able to shrink the ring under the daemon's mapping (SIGBUS).
  if (::fcntl(ring_fd_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return ErrnoStatus("sealing the job ring");
  }
  ring_base_ = ::mmap(nullptr, ring_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, ring_fd_.get(), 0);
  if (ring_base_ == MAP_FAILED) {
    ring_base_ = nullptr;
    return ErrnoStatus("mmap of the job ring");
  }
  ring_mapping_ = std::shared_ptr<void>(ring_base_, [bytes = ring_bytes_](void* base) {
    ::munmap(base, bytes);
  });
  ring::RingHeader* header = ring::InitSegment(ring_base_, ring_entries_, id_);
  auto* bytes = static_cast<char*>(ring_base_);
  // Offsets and sizes are the daemon's own copies: the client can scribble on the header.
  sq_ = ring::Consumer<ring::SubmissionEntry>(
      &header->sq, reinterpret_cast<ring::SubmissionEntry*>(bytes + ring::kQueuesOffset),
      ring_entries_);
  {
    MutexLock lock(&cq_mu_);  // (no other thread sees the session yet; the analysis cannot know)
    cq_ = ring::Producer<ring::CompletionEntry>(
        &header->cq,
        reinterpret_cast<ring::CompletionEntry*>(
            bytes + ring::kQueuesOffset + size_t{ring_entries_} * sizeof(ring::SubmissionEntry)),
        ring_entries_);
  }
  tickets_ = reinterpret_cast<const ring::TicketPage*>(bytes + ring::kTicketPageOffset);
  int sq[2], cq[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sq) != 0) {
    return ErrnoStatus("socketpair for the submission doorbell");
  }
  sq_doorbell_.reset(sq[0]);
  client_sq_doorbell_.reset(sq[1]);
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, cq) != 0) {
    return ErrnoStatus("socketpair for the completion doorbell");
  }
  cq_doorbell_.reset(cq[0]);
  client_cq_doorbell_.reset(cq[1]);
  engine::EngineSessionInfo info;
  info.id = id_;
  info.label = absl::StrCat("session ", id_, " '", name_, "' (pid ", peer.pid, ")");
  info.uid = peer.uid;
  info.tickets = reinterpret_cast<ring::TicketPage*>(bytes + ring::kTicketPageOffset);
  info.tickets_owner = ring_mapping_;
  absl::StatusOr<std::unique_ptr<engine::EngineSession>> engine = open_engine(info);
  if (!engine.ok()) return engine.status();
  engine_session_ = *std::move(engine);
  MutexLock lock(&mu_);
  peer_ = peer;
  attached_ = true;
  return absl::OkStatus();
}

engine::EngineSession* Session::engine_session_if_attached() const {
  MutexLock lock(&mu_);
  return attached_ ? engine_session_.get() : nullptr;
}

void Session::TellDraining() {
  if (ring_base_ == nullptr) return;
  static_cast<ring::RingHeader*>(ring_base_)->daemon_state.fetch_or(ring::kDaemonDraining,
                                                                      std::memory_order_release);
}

void Session::ReleaseClientDoorbells() {
  client_sq_doorbell_.reset();
  client_cq_doorbell_.reset();
}

bool Session::attached() const {
  MutexLock lock(&mu_);
  return attached_;
}

PeerCredentials Session::peer() const {
  MutexLock lock(&mu_);
  return peer_;
}

bool Session::CanAdmit() {
  const uint64_t in_flight = in_flight_seen_.load(std::memory_order_acquire);
  MutexLock lock(&cq_mu_);
  std::optional<uint32_t> pending = cq_.Pending();
  if (!pending) {
    broken_ = true;
    return false;
  }
  return in_flight + *pending < ring_entries_;
}

bool Session::PostCompletion(const ring::CompletionEntry& entry) {
  bool wake;
  {
    MutexLock lock(&cq_mu_);
    if (!cq_.TryPush(entry)) {
      // Admission control keeps room for every accepted job, so a full queue means the client
      // moved its head backwards: the ring is corrupt and the session cannot go on.
      broken_ = true;
      return false;
    }
    wake = cq_.TakeWakeupRequest();
  }
  if (wake) {
    uint64_t one = 1;
    // Never blocks: MSG_DONTWAIT holds for this call whatever the descriptor's flags. EAGAIN: the
    // client has not read the wake-ups already sent, which already means "wake up". EPIPE: the
    // client shut its end; it cannot sleep on it then.
    [[maybe_unused]] ssize_t n =
        ::send(cq_doorbell_.get(), &one, sizeof(one), MSG_DONTWAIT | MSG_NOSIGNAL);
  }
  return true;
}

absl::Status Session::CheckBufferLimits(const BufferCharge& charge) const {
  MutexLock lock(&mu_);
  if (ledger_ == nullptr) return absl::OkStatus();
  const ClientLimits& limits = ledger_->limits();
  if (buffers_.size() >= limits.max_buffers_per_session) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session ", id_, " already has ", limits.max_buffers_per_session,
                     " buffers registered (max_buffers_per_session)"));
  }
  if (charge.mapped_bytes > limits.max_mapped_bytes_per_session - charged_.mapped_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session ", id_, " has ", charged_.mapped_bytes, " bytes of host memory registered; ",
        charge.mapped_bytes, " more would pass ", limits.max_mapped_bytes_per_session,
        " (max_mapped_bytes_per_session)"));
  }
  if (charge.reserved_bytes > limits.max_reserved_bytes_per_session - charged_.reserved_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session ", id_, " has ", charged_.reserved_bytes >> 30,
        " GiB of GPU address space reserved; ", charge.reserved_bytes >> 30,
        " GiB more would pass ", limits.max_reserved_bytes_per_session >> 30,
        " GiB (max_reserved_bytes_per_session): unregister buffers, or use fewer streams"));
  }
  return ledger_->CheckBuffer(peer_.uid, charge);
}

bool Session::TakeSubmissions(int poller) {
  int holder = sq_holder_.load(std::memory_order_acquire);
  if (holder == poller) return true;
  if (holder != kNoHolder && holder != kMoving) return false;
  return sq_holder_.compare_exchange_strong(holder, poller, std::memory_order_acquire);
}

void Session::ReleaseSubmissions(int poller) {
  int holder = poller;
  sq_holder_.compare_exchange_strong(holder, kMoving, std::memory_order_release);
}

uint64_t Session::AddBuffer(std::shared_ptr<engine::ImportedBuffer> buffer, BufferCharge charge) {
  if (const int device = buffer->device(); device >= 0) {
    int none = -1;  // (only the first GPU buffer sets it: a session moves at most once)
    home_device_.compare_exchange_strong(none, device, std::memory_order_acq_rel);
  }
  MutexLock lock(&mu_);
  uint64_t id = next_buffer_id_++;
  charged_.Add(charge);
  if (ledger_ != nullptr) ledger_->AddBuffer(peer_.uid, charge);
  buffers_.emplace(id, Registered{std::move(buffer), charge});
  return id;
}

bool Session::RemoveBuffer(uint64_t buffer_id) {
  std::shared_ptr<engine::ImportedBuffer> doomed;  // unmapped outside the lock
  MutexLock lock(&mu_);
  auto it = buffers_.find(buffer_id);
  if (it == buffers_.end()) return false;
  doomed = std::move(it->second.buffer);
  const BufferCharge charge = it->second.charge;
  buffers_.erase(it);
  charged_.Remove(charge);
  // Counted free at once, though a job that still copies keeps the mapping a moment longer.
  if (ledger_ != nullptr) ledger_->RemoveBuffer(peer_.uid, charge);
  return true;
}

std::shared_ptr<engine::ImportedBuffer> Session::FindBuffer(uint64_t buffer_id) {
  MutexLock lock(&mu_);
  auto it = buffers_.find(buffer_id);
  return it == buffers_.end() ? nullptr : it->second.buffer;
}

bool Session::BeginJob() {
  MutexLock lock(&mu_);
  if (closing_) return false;
  in_flight_seen_.store(++jobs_in_flight_, std::memory_order_release);
  return true;
}

void Session::EndJob() {
  MutexLock lock(&mu_);
  in_flight_seen_.store(--jobs_in_flight_, std::memory_order_release);
  if (jobs_in_flight_ == 0) idle_cv_.SignalAll();
}

void Session::MarkClosing() {
  MutexLock lock(&mu_);
  closing_ = true;
  closing_seen_.store(true, std::memory_order_release);
}

bool Session::closing() const { return closing_seen_.load(std::memory_order_acquire); }

void Session::WaitIdle() {
  MutexLock lock(&mu_);
  while (jobs_in_flight_ != 0) idle_cv_.Wait(&mu_);
}

std::vector<std::shared_ptr<engine::ImportedBuffer>> Session::TakeAllBuffers() {
  std::vector<std::shared_ptr<engine::ImportedBuffer>> all;
  MutexLock lock(&mu_);
  for (auto& [id, registered] : buffers_) {
    if (ledger_ != nullptr) ledger_->RemoveBuffer(peer_.uid, registered.charge);
    all.push_back(std::move(registered.buffer));
  }
  buffers_.clear();
  charged_ = BufferCharge{};
  return all;
}

SessionSnapshot Session::Snapshot() const {
  SessionSnapshot s;
  s.id = id_;
  s.name = name_;
  s.quota_bytes = quota_bytes_;
  s.age_ms = MonotonicMs() - created_ms_;
  {
    MutexLock lock(&mu_);
    s.attached = attached_;
    s.peer = peer_;
    s.used_bytes = objects_->used_bytes();
    s.objects = objects_->size();
    s.buffers = buffers_.size();
    s.charged = charged_;
    s.jobs_in_flight = jobs_in_flight_;
  }
  s.jobs_completed = counters_.jobs_completed.load(std::memory_order_relaxed);
  s.jobs_failed = counters_.jobs_failed.load(std::memory_order_relaxed);
  s.bytes_offloaded = counters_.bytes_offloaded.load(std::memory_order_relaxed);
  s.bytes_reloaded = counters_.bytes_reloaded.load(std::memory_order_relaxed);
  return s;
}

ObjectSlot Session::Resolve(uint64_t id) const {
  if (any_bound_.load(std::memory_order_acquire)) {
    MutexLock lock(&mu_);
    auto it = bound_.find(id);
    if (it != bound_.end()) return it->second;
  }
  return ObjectSlot{objects_, id};
}

absl::Status Session::CheckBindable(uint64_t id) const {
  if (id == 0) return absl::InvalidArgumentError("object id 0 is reserved");
  if (objects_->Find(id) != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat("object ", id, " already exists"));
  }
  MutexLock lock(&mu_);
  if (bound_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("object ", id, " is bound already"));
  }
  if (bound_.size() >= kMaxBound) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this session has bound ", kMaxBound, " ids to persistent objects, the most it may"));
  }
  return absl::OkStatus();
}

absl::Status Session::Bind(uint64_t id, ObjectSlot slot) {
  if (id == 0) return absl::InvalidArgumentError("object id 0 is reserved");
  if (objects_->Find(id) != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat("object ", id, " already exists"));
  }
  MutexLock lock(&mu_);
  if (bound_.size() >= kMaxBound) {
    return absl::ResourceExhaustedError(absl::StrCat("more than ", kMaxBound, " bound ids"));
  }
  if (!bound_.emplace(id, std::move(slot)).second) {
    return absl::AlreadyExistsError(absl::StrCat("object ", id, " is bound already"));
  }
  any_bound_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

absl::Status Session::Unbind(uint64_t id) {
  MutexLock lock(&mu_);
  if (bound_.erase(id) == 0) {
    return absl::NotFoundError(absl::StrCat("object ", id, " is not bound to a persistent object"));
  }
  any_bound_.store(!bound_.empty(), std::memory_order_release);
  return absl::OkStatus();
}

}  // namespace tier::daemon
