#include "daemon/sessions/session_listener.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "daemon/metrics/metrics.h"
#include "daemon/sessions/segment_request.h"
#include "daemon/sessions/session_message.h"
#include "tier/session_wire.h"

namespace tier::daemon {
namespace {

constexpr int kTickMs = 200;  // how often pending sessions are checked for the attach timeout

void FillReply(wire::Reply* reply, wire::MessageType type, uint64_t request_id,
               const absl::Status& status) {
  reply->header.type = static_cast<uint32_t>(type);
  reply->header.version = wire::kProtocolVersion;
  reply->header.request_id = request_id;
  reply->status = StatusCodeToInt(status);
  absl::string_view message = status.message();
  size_t n = std::min(message.size(), sizeof(reply->message) - 1);
  if (n > 0) std::memcpy(reply->message, message.data(), n);  // data() may be null when empty
  reply->message[n] = '\0';
}

}  // namespace

SessionListener::SessionListener(SessionRegistry& registry, engine::CopyEngine& engine,
                                 ListenerLimits limits, PersistentStore* persistent)
    : registry_(registry), engine_(engine), limits_(limits), persistent_(persistent) {}

SessionListener::~SessionListener() { Stop(); }

absl::Status SessionListener::Start(const std::string& path, mode_t mode, gid_t gid) {
  absl::StatusOr<UniqueFd> listen_fd = ListenSeqpacket(path, mode);
  if (!listen_fd.ok()) return listen_fd.status();
  if (gid != static_cast<gid_t>(-1) && ::chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    return ErrnoStatus(absl::StrCat("chown of ", path));
  }
  path_ = path;
  listen_fd_ = *std::move(listen_fd);
  epoll_fd_.reset(::epoll_create1(EPOLL_CLOEXEC));
  wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!epoll_fd_.valid() || !wake_fd_.valid()) return ErrnoStatus("epoll/eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_.get();
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, listen_fd_.get(), &ev);
  ev.data.fd = wake_fd_.get();
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, wake_fd_.get(), &ev);
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void SessionListener::Stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
  thread_.join();
  for (auto& [fd, connection] : connections_) {
    if (connection.session) registry_.End(connection.session, "daemon stopping");
  }
  connections_.clear();
  ::unlink(path_.c_str());
}

void SessionListener::Run() {
  epoll_event events[32];
  while (!stop_) {
    int timeout_ms = kTickMs;
    if (!accepting_) {
      uint64_t now = MonotonicMs();
      timeout_ms = resume_accept_ms_ <= now
                       ? 0
                       : static_cast<int>(std::min<uint64_t>(kTickMs, resume_accept_ms_ - now));
    }
    int n = ::epoll_wait(epoll_fd_.get(), events, 32, timeout_ms);
    const uint64_t now = MonotonicMs();
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == wake_fd_.get()) {
        uint64_t count;
        [[maybe_unused]] ssize_t got = ::read(wake_fd_.get(), &count, sizeof(count));
        SendDeferredReplies();
        continue;
      }
      if (fd == listen_fd_.get()) {
        Accept(now);
        continue;
      }
      auto it = connections_.find(fd);
      if (it == connections_.end()) continue;
      if (it->second.awaiting_reply) {  // (not reading: only a hang-up wakes it)
        if (events[i].events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)) Drop(fd, "client disconnected");
        continue;
      }
      if (!Serve(it->second)) Drop(fd, "client disconnected");
    }
    ResumeAcceptingIfDue(now);
    DropIdle(now);
    registry_.ExpirePending();
    // A session the daemon ended (corrupt ring, CloseSession, shutdown) loses its connection too,
    // so its client sees the hang-up and fails its pending jobs instead of waiting for ever.
    std::vector<int> ended;
    for (auto& [fd, connection] : connections_) {
      if (connection.session && connection.session->closing()) ended.push_back(fd);
    }
    for (int fd : ended) Drop(fd, "session ended");
  }
}

void SessionListener::Accept(uint64_t now_ms) {
  int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) {
    int error = errno;
    if (error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM) {
      PauseAccepting(now_ms, error);
    } else if (error != EAGAIN && error != EINTR && error != ECONNABORTED) {
      LogWarningLimited(accept_log_, ErrnoStatus("accept on the session socket", error).message());
    }
    return;
  }
  accept_backoff_ms_ = 0;
  UniqueFd conn(fd);
  absl::StatusOr<PeerCredentials> peer = GetPeerCredentials(fd);
  if (!peer.ok()) {
    LogWarningLimited(client_log_, "session socket: ", peer.status().message());
    return;
  }
  // Over a limit: closed at once (the client's attach sees the hang-up), so idle connections
  // cannot use up the daemon's descriptors and keep everyone else out.
  if (connections_.size() >= limits_.max_connections) {
    LogWarningLimited(client_log_, "session socket: refused a connection of pid ", peer->pid,
                      " uid ", peer->uid, ": ", limits_.max_connections,
                      " connections open (max_connections)");
    return;
  }
  uint32_t& of_uid = connections_per_uid_[peer->uid];
  if (of_uid >= limits_.max_connections_per_uid) {
    LogWarningLimited(client_log_, "session socket: refused a connection of pid ", peer->pid,
                      ": uid ", peer->uid, " has ", limits_.max_connections_per_uid,
                      " connections open (max_connections_per_uid)");
    return;
  }
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.fd = fd;
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
    if (of_uid == 0) connections_per_uid_.erase(peer->uid);
    return;
  }
  ++of_uid;
  connections_.emplace(fd, Connection{std::move(conn), *peer, nullptr, now_ms, next_serial_++});
}

void SessionListener::PauseAccepting(uint64_t now_ms, int error) {
  accept_backoff_ms_ =
      accept_backoff_ms_ == 0 ? 10 : std::min<uint64_t>(accept_backoff_ms_ * 2, 1000);
  if (accepting_) {
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, listen_fd_.get(), nullptr);
    accepting_ = false;
  }
  resume_accept_ms_ = now_ms + accept_backoff_ms_;
  LogWarningLimited(accept_log_, ErrnoStatus("accept on the session socket", error).message(),
                    " with ", connections_.size(), " connections open: not accepting for ",
                    accept_backoff_ms_, " ms");
}

void SessionListener::ResumeAcceptingIfDue(uint64_t now_ms) {
  if (accepting_ || now_ms < resume_accept_ms_) return;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_.get();
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, listen_fd_.get(), &ev) == 0) {
    accepting_ = true;
  } else {
    PauseAccepting(now_ms, errno);  // (ENOMEM: try again later)
  }
}

void SessionListener::DropIdle(uint64_t now_ms) {
  std::vector<int> idle;
  for (const auto& [fd, connection] : connections_) {
    if (connection.session == nullptr &&
        now_ms - connection.accepted_ms > limits_.attach_timeout_ms) {
      idle.push_back(fd);
    }
  }
  for (int fd : idle) Drop(fd, "did not attach in time");
}

void SessionListener::Drop(int fd, absl::string_view reason) {
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, fd, nullptr);
  if (it->second.session) registry_.End(it->second.session, reason);
  if (auto of_uid = connections_per_uid_.find(it->second.peer.uid);
      of_uid != connections_per_uid_.end() && --of_uid->second == 0) {
    connections_per_uid_.erase(of_uid);
  }
  connections_.erase(it);
}

bool SessionListener::Serve(Connection& c) {
  absl::StatusOr<ReceivedMessage> message =
      ReceiveMessage(c.fd.get(), wire::kMaxMessageBytes, wire::kMaxFds);
  if (!message.ok()) {
    if (absl::IsUnavailable(message.status())) return true;  // EAGAIN: spurious wake-up
    LogWarningLimited(client_log_, "session socket of pid ", c.peer.pid, ": ",
                      message.status().message());
    return false;
  }
  if (message->data.empty()) return false;  // orderly close, or the process died
  absl::StatusOr<wire::MessageHeader> header = ParseRequestHeader(message->data);
  if (!header.ok()) {
    LogWarningLimited(client_log_, "pid ", c.peer.pid, " ", header.status().message());
    return false;
  }
  switch (static_cast<wire::MessageType>(header->type)) {
    case wire::MessageType::kAttachRequest:
      HandleAttach(c, message->data);
      return c.session != nullptr;  // a failed attach ends the connection
    case wire::MessageType::kRegisterBuffer:
      HandleRegister(c, message->data, std::move(message->fds));
      return true;
    case wire::MessageType::kUnregisterBuffer:
      HandleUnregister(c, message->data);
      return true;
    case wire::MessageType::kExtendBuffer:
      HandleExtend(c, message->data, std::move(message->fds));
      return true;
    case wire::MessageType::kObjectRequest:
      HandleObject(c, message->data);
      return true;
    default:  // (ParseRequestHeader let no other type through)
      return false;
  }
}

void SessionListener::HandleAttach(Connection& c, const std::vector<char>& data) {
  wire::AttachRequest request{};
  wire::AttachReply reply{};
  absl::Status status;
  std::shared_ptr<Session> session;
  if (c.session != nullptr) {
    status = absl::FailedPreconditionError("connection already attached");
  } else if (!ParseMessage(data, &request)) {
    status = absl::InvalidArgumentError("malformed attach request");
  } else {
    AttachToken token;
    std::memcpy(token.data(), request.token, token.size());
    absl::StatusOr<std::shared_ptr<Session>> attached =
        registry_.Attach(request.session_id, token, c.peer);
    if (attached.ok()) {
      session = *attached;
    } else {
      status = attached.status();
    }
  }
  FillReply(&reply.reply, wire::MessageType::kAttachReply, request.header.request_id, status);
  if (!session) {
    (void)SendMessage(c.fd.get(), &reply, sizeof(reply));
    return;
  }
  reply.ring_bytes = session->ring_bytes();
  reply.quota_bytes = session->quota_bytes();
  reply.ring_entries = session->ring_entries();
  absl::string_view engine = engine_.name();
  std::memcpy(reply.engine, engine.data(), std::min(engine.size(), sizeof(reply.engine) - 1));
  int fds[] = {session->ring_fd(), session->client_sq_doorbell_fd(),
               session->client_cq_doorbell_fd()};
  absl::Status sent = SendMessage(c.fd.get(), &reply, sizeof(reply), fds);
  // The client's doorbell ends are the client's alone from now on (a client that dies closes
  // them, and the daemon's ends then see the hang-up).
  session->ReleaseClientDoorbells();
  if (!sent.ok()) {
    registry_.End(session, "attach reply could not be sent");
    return;
  }
  c.session = std::move(session);
}

namespace {

// The page sizes of a kCudaVmmPages registration, from its handle bytes: exactly one descriptor
// per non-zero size, the sizes summing to `bytes` (checked without overflow).
absl::Status VmmPageSizes(const wire::RegisterBuffer& request, size_t descriptors,
                          std::vector<uint64_t>* pages) {
  uint64_t sum = 0;
  for (size_t i = 0; i < wire::kMaxVmmPages; ++i) {
    uint64_t page;
    std::memcpy(&page, request.handle + 8 * i, sizeof(page));
    if (page == 0) break;
    if (page > request.bytes - sum) {
      return absl::InvalidArgumentError("VMM page sizes exceed the registered size");
    }
    sum += page;
    pages->push_back(page);
  }
  if (sum != request.bytes || pages->size() != descriptors || descriptors == 0) {
    return absl::InvalidArgumentError(absl::StrCat("VMM pages: ", pages->size(),
                                                   " sizes summing to ", sum, " for ",
                                                   descriptors, " descriptors and ",
                                                   request.bytes, " bytes"));
  }
  return absl::OkStatus();
}

// What a registration will cost tierd, from the checked request: the host memory it maps, or
// the GPU address space the engine reserves for it (a segment's whole reservation, as
// VmmImporter reserves it). From the request, not from the buffer the engine makes: a GPU
// engine's host buffer names the GPU whose lanes copy it (device() 0), like GPU memory.
BufferCharge ChargeOf(const engine::BufferImport& import) {
  switch (import.kind) {
    case wire::BufferKind::kHostMemfd:
      return {import.bytes, 0};
    case wire::BufferKind::kCudaVmmFd:
    case wire::BufferKind::kCudaVmmPages:
      return {0, import.bytes};
    case wire::BufferKind::kCudaVmmSegment:
      return {0, std::max(import.reserve_bytes, import.bytes)};
    default:
      return {};
  }
}

}  // namespace

void SessionListener::HandleRegister(Connection& c, const std::vector<char>& data,
                                     std::vector<UniqueFd> fds) {
  wire::RegisterBuffer request{};
  wire::RegisterBufferReply reply{};
  absl::Status status;
  bool parsed = ParseMessage(data, &request);
  if (c.session == nullptr) {
    status = absl::FailedPreconditionError("register before attach");
  } else if (c.session->closing()) {
    status = absl::FailedPreconditionError("session is ending");
  } else if (!parsed) {
    status = absl::InvalidArgumentError("malformed register request");
  } else if (request.kind != static_cast<uint32_t>(wire::BufferKind::kCudaVmmPages) &&
             request.kind != static_cast<uint32_t>(wire::BufferKind::kCudaVmmSegment) &&
             fds.size() > 1) {
    status = absl::InvalidArgumentError("register carries more than one descriptor");
  } else if (request.kind == static_cast<uint32_t>(wire::BufferKind::kCudaVmmPages) &&
             fds.size() > wire::kMaxVmmPages) {
    status = absl::InvalidArgumentError(absl::StrCat("VMM pages: ", fds.size(),
                                                     " descriptors; at most ", wire::kMaxVmmPages));
  }
  engine::BufferImport import;
  if (status.ok()) {
    import.kind = static_cast<wire::BufferKind>(request.kind);
    import.device = request.device;
    import.bytes = request.bytes;
    std::memcpy(import.ipc_handle.data(), request.handle, import.ipc_handle.size());
    std::memcpy(import.device_uuid.data(), request.device_uuid, import.device_uuid.size());
    if (import.kind == wire::BufferKind::kCudaVmmPages) {
      status = VmmPageSizes(request, fds.size(), &import.page_bytes);
      import.page_fds = std::move(fds);
    } else if (import.kind == wire::BufferKind::kCudaVmmSegment) {
      absl::StatusOr<SegmentPages> pages = CheckSegmentRegister(request, fds.size());
      if (pages.ok()) {
        import.page_bytes.assign(pages->page_count, pages->page_bytes);
        import.reserve_bytes = pages->reserve_bytes;
        import.page_fds = std::move(fds);
      } else {
        status = pages.status();
      }
    } else if (!fds.empty()) {
      import.fd = std::move(fds[0]);
    }
  }
  const BufferCharge charge = ChargeOf(import);
  if (status.ok()) status = c.session->CheckBufferLimits(charge);
  if (status.ok()) {
    absl::StatusOr<std::unique_ptr<engine::ImportedBuffer>> buffer =
        engine_.Import(c.session->engine_session(), std::move(import));
    if (buffer.ok()) {
      const int home = c.session->home_device();
      reply.buffer_id =
          c.session->AddBuffer(std::shared_ptr<engine::ImportedBuffer>(*std::move(buffer)), charge);
      // Its first GPU buffer: the session moves to that GPU's ring poller (handed over between
      // two passes; its jobs are served all along).
      if (c.session->home_device() != home) registry_.HomeChanged();
    } else {
      status = buffer.status();
    }
  }
  FillReply(&reply.reply, wire::MessageType::kRegisterBufferReply,
            parsed ? request.header.request_id : 0, status);
  (void)SendMessage(c.fd.get(), &reply, sizeof(reply));
}

void SessionListener::HandleExtend(Connection& c, const std::vector<char>& data,
                                   std::vector<UniqueFd> fds) {
  wire::ExtendBuffer request{};
  wire::ExtendBufferReply reply{};
  absl::Status status;
  bool parsed = ParseMessage(data, &request);
  std::shared_ptr<engine::ImportedBuffer> buffer;
  absl::StatusOr<SegmentPages> pages;
  if (c.session == nullptr) {
    status = absl::FailedPreconditionError("extend before attach");
  } else if (c.session->closing()) {
    status = absl::FailedPreconditionError("session is ending");
  } else if (!parsed) {
    status = absl::InvalidArgumentError("malformed extend request");
  } else if (pages = CheckSegmentExtend(request, fds.size()); !pages.ok()) {
    status = pages.status();
  } else if ((buffer = c.session->FindBuffer(request.buffer_id)) == nullptr) {
    status = absl::NotFoundError(absl::StrCat("no buffer ", request.buffer_id, " in this session"));
  } else {
    // (GPU pages map no host memory: nothing to charge against max_mapped_bytes_per_session; the
    // segment's reservation, checked at registration, bounds what it can grow to.)
    engine::BufferExtension extension{request.offset, request.page_bytes, std::move(fds)};
    status = buffer->Extend(extension);
  }
  if (buffer != nullptr) reply.bytes = buffer->bytes();
  FillReply(&reply.reply, wire::MessageType::kExtendBufferReply,
            parsed ? request.header.request_id : 0, status);
  (void)SendMessage(c.fd.get(), &reply, sizeof(reply));
}

void SessionListener::HandleUnregister(Connection& c, const std::vector<char>& data) {
  wire::UnregisterBuffer request{};
  wire::UnregisterBufferReply reply{};
  absl::Status status;
  bool parsed = ParseMessage(data, &request);
  if (c.session == nullptr) {
    status = absl::FailedPreconditionError("unregister before attach");
  } else if (!parsed) {
    status = absl::InvalidArgumentError("malformed unregister request");
  } else if (!c.session->RemoveBuffer(request.buffer_id)) {
    status = absl::NotFoundError(absl::StrCat("no buffer ", request.buffer_id, " in this session"));
  }
  FillReply(&reply.reply, wire::MessageType::kUnregisterBufferReply,
            parsed ? request.header.request_id : 0, status);
  (void)SendMessage(c.fd.get(), &reply, sizeof(reply));
}

void SessionListener::HandleObject(Connection& c, const std::vector<char>& data) {
  wire::ObjectRequest request{};
  wire::ObjectReply reply{};
  absl::Status status;
  bool parsed = ParseMessage(data, &request);
  const void* nul = parsed ? std::memchr(request.name, '\0', sizeof(request.name)) : nullptr;
  absl::string_view name(request.name, nul == nullptr ? 0
                                                       : static_cast<const char*>(nul) - request.name);
  // Names are the caller's: its uid from SO_PEERCRED of this connection, never its word.
  const uid_t caller = c.peer.uid;
  if (c.session == nullptr) {
    status = absl::FailedPreconditionError("object request before attach");
  } else if (c.session->closing()) {
    status = absl::FailedPreconditionError("session is ending");
  } else if (!parsed) {
    status = absl::InvalidArgumentError("malformed object request");
  } else if (nul == nullptr) {
    status = absl::InvalidArgumentError("object name is not NUL-terminated");
  } else if (persistent_ == nullptr) {
    status = absl::UnimplementedError("this tierd keeps no persistent objects");
  } else if ((request.op == static_cast<uint32_t>(wire::ObjectOp::kCreate) ||
              request.op == static_cast<uint32_t>(wire::ObjectOp::kOpen)) &&
             !(status = c.session->CheckBindable(request.object_id)).ok()) {
    // (Checked before a create reserves its name; Bind checks again.)
  } else {
    switch (static_cast<wire::ObjectOp>(request.op)) {
      case wire::ObjectOp::kCreate: {
        absl::StatusOr<ObjectSlot> slot = persistent_->Create(caller, name, c.session->id(),
                                                                request.len);
        status = slot.ok() ? c.session->Bind(request.object_id, *std::move(slot)) : slot.status();
        break;
      }
      case wire::ObjectOp::kOpen: {
        uint64_t len = 0;
        absl::StatusOr<ObjectSlot> slot = persistent_->Open(caller, name, &len);
        status = slot.ok() ? c.session->Bind(request.object_id, *std::move(slot)) : slot.status();
        if (status.ok()) reply.len = len;
        break;
      }
      case wire::ObjectOp::kStat: {
        absl::StatusOr<PersistentObjectState> state = persistent_->Stat(caller, name);
        status = state.status();
        if (state.ok()) {
          reply.len = state->len;
          reply.flags = (state->ready ? wire::kObjectReady : 0) |
                        (state->durable ? wire::kObjectDurable : 0) |
                        (state->journaled ? wire::kObjectJournaled : 0);
        }
        break;
      }
      case wire::ObjectOp::kRelease: {
        // (A name reserved for the id and never filled goes with it.)
        const ObjectSlot slot = c.session->Resolve(request.object_id);
        status = c.session->Unbind(request.object_id);
        if (status.ok()) persistent_->Released(c.session->id(), slot);
        break;
      }
      case wire::ObjectOp::kDelete: {
        std::optional<absl::Status> now = DeleteObject(c, request, name, caller);
        if (!now.has_value()) return;  // answered once the deletion is durable
        status = *now;
        break;
      }
      default:
        status = absl::InvalidArgumentError(absl::StrCat("unknown object operation ", request.op));
    }
  }
  FillReply(&reply.reply, wire::MessageType::kObjectReply, parsed ? request.header.request_id : 0,
            status);
  (void)SendMessage(c.fd.get(), &reply, sizeof(reply));
}

// A delete by name: answered at once (the status), or, when a record of the object may be in the
// journal, once its deletion is durable (nullopt: the reply is posted then, and `c` is not read
// meanwhile). No journal I/O on this thread, which serves every session.
std::optional<absl::Status> SessionListener::DeleteObject(Connection& c,
                                                          const wire::ObjectRequest& request,
                                                          absl::string_view name, uid_t caller) {
  const uid_t owner = request.uid == wire::kCallerUid ? caller : request.uid;
  if (owner != caller && caller != 0) {
    // Not "permission denied": that would tell another user the name exists.
    absl::Status status = PersistentStore::CheckName(name);
    if (!status.ok()) return status;
    return absl::NotFoundError(absl::StrCat("no persistent object named \"", name, "\""));
  }
  std::optional<absl::Status> now = persistent_->Delete(
      owner, name, [this, fd = c.fd.get(), serial = c.serial,
                    request_id = request.header.request_id](absl::Status done) {
        DeferredReply deferred{fd, serial, {}};
        FillReply(&deferred.reply.reply, wire::MessageType::kObjectReply, request_id, done);
        PostReply(std::move(deferred));
      });
  if (!now.has_value()) {
    c.awaiting_reply = true;
    SetReading(c, false);
  }
  return now;
}

void SessionListener::PostReply(DeferredReply reply) {
  {
    MutexLock lock(&replies_mu_);
    replies_.push_back(std::move(reply));
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
}

void SessionListener::SendDeferredReplies() {
  std::vector<DeferredReply> replies;
  {
    MutexLock lock(&replies_mu_);
    replies.swap(replies_);
  }
  for (const DeferredReply& deferred : replies) {
    auto it = connections_.find(deferred.fd);
    if (it == connections_.end() || it->second.serial != deferred.serial) continue;  // gone
    (void)SendMessage(it->second.fd.get(), &deferred.reply, sizeof(deferred.reply));
    it->second.awaiting_reply = false;
    SetReading(it->second, true);
  }
}

void SessionListener::SetReading(const Connection& c, bool reading) {
  epoll_event ev{};
  ev.events = EPOLLRDHUP;
  if (reading) ev.events |= EPOLLIN;
  ev.data.fd = c.fd.get();
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
}

}  // namespace tier::daemon
