#include "engine/gpu_imports.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/memfd_mapping.h"
#include "engine/runtime_call_rule.h"
#include "tier/ring.h"

namespace tier::engine {
namespace {

// A client buffer: its mapping and its entry in the session's range map. Its mapping is closed on
// the release thread.
class GpuBuffer final : public ImportedBuffer {
 public:
  GpuBuffer(std::unique_ptr<DeviceMapping> mapping, std::shared_ptr<SessionState> session,
            std::shared_ptr<ReleaseThread> releaser, std::atomic<uint64_t>& live)
      : mapping_(std::move(mapping)), session_(std::move(session)),
        releaser_(std::move(releaser)), live_(live) {
    live_.fetch_add(1);
  }
  ~GpuBuffer() override {
    {
      MutexLock lock(&session_->mu);
      auto it = session_->ranges.find(reinterpret_cast<uintptr_t>(mapping_->base()));
      if (it != session_->ranges.end() && --it->second.refs == 0) session_->ranges.erase(it);
    }
    releaser_->Post([mapping = std::move(mapping_), &live = live_]() mutable {
      mapping.reset();  // closes the IPC handle / unmaps / unpins
      live.fetch_sub(1);
    });
  }
  char* base() const override { return mapping_->base(); }
  uint64_t bytes() const override { return mapping_->bytes(); }
  int device() const override { return mapping_->device(); }
  absl::Status Extend(BufferExtension& extension) override {
    if (absl::Status s = mapping_->Extend(extension); !s.ok()) return s;
    // The session's range map finds the GPU of a job's addresses: it covers the new pages before
    // the client learns of them (jobs on them come after the reply).
    MutexLock lock(&session_->mu);
    auto it = session_->ranges.find(reinterpret_cast<uintptr_t>(mapping_->base()));
    if (it != session_->ranges.end()) {
      it->second.end = reinterpret_cast<uintptr_t>(mapping_->base()) + mapping_->bytes();
    }
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<DeviceMapping> mapping_;
  std::shared_ptr<SessionState> session_;
  std::shared_ptr<ReleaseThread> releaser_;
  std::atomic<uint64_t>& live_;
};

// A bound ticket slot as the daemon's session sees it: zero bytes, so no job can name it. The
// ticket page stays registered (held by the session's lanes) until the session is gone.
class SemaphoreBuffer final : public ImportedBuffer {
 public:
  SemaphoreBuffer(char* base, int device) : base_(base), device_(device) {}
  char* base() const override { return base_; }
  uint64_t bytes() const override { return 0; }
  int device() const override { return device_; }

 private:
  char* base_;
  int device_;
};

// A registered (pinned) client memfd, unpinned and unmapped on destruction.
class HostMapping final : public DeviceMapping {
 public:
  HostMapping(GpuRuntime& runtime, std::unique_ptr<MemfdMapping> mapping, int device)
      : runtime_(runtime), mapping_(std::move(mapping)), device_(device) {}
  ~HostMapping() override { runtime_.UnregisterHost(mapping_->base()); }
  char* base() const override { return mapping_->base(); }
  uint64_t bytes() const override { return mapping_->bytes(); }
  int device() const override { return device_; }

 private:
  GpuRuntime& runtime_;
  std::unique_ptr<MemfdMapping> mapping_;
  int device_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ImportedBuffer>> GpuImporter::Import(GpuSession& session,
                                                                    BufferImport import) {
  SessionState& state = session.state();
  if (state.abandoned.load()) return absl::FailedPreconditionError("session is ending");
  switch (import.kind) {
    case wire::BufferKind::kCudaIpc:
    case wire::BufferKind::kCudaVmmFd:
    case wire::BufferKind::kCudaVmmPages:
    case wire::BufferKind::kCudaVmmSegment:
      return ImportDevice(session, import);
    case wire::BufferKind::kCudaSemaphores:
      return BindTicketSlot(state, import);
    case wire::BufferKind::kHostMemfd:
      return ImportHost(session, import);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown buffer kind ", static_cast<uint32_t>(import.kind)));
  }
}

absl::StatusOr<std::unique_ptr<ImportedBuffer>> GpuImporter::ImportDevice(GpuSession& session,
                                                                          BufferImport& import) {
  CheckCall(GpuCallClass::kSetup);
  absl::StatusOr<std::unique_ptr<DeviceMapping>> mapping = runtime_.Open(import);
  if (!mapping.ok()) return mapping.status();
  if (absl::Status s = EnsureLanes(session.state(), (*mapping)->device()); !s.ok()) {
    Release(*std::move(mapping));
    return s;
  }
  return AddBuffer(session, *std::move(mapping), /*host=*/false);
}

// A client's host memory (CPU tensors, the demo): mapped, pinned for the GPUs (portable), and
// copied by GPU 0's lanes like device memory. Jobs on it carry no tickets.
absl::StatusOr<std::unique_ptr<ImportedBuffer>> GpuImporter::ImportHost(GpuSession& session,
                                                                        BufferImport& import) {
  absl::StatusOr<std::unique_ptr<MemfdMapping>> mapped =
      MemfdMapping::Map(import.fd, import.bytes);
  if (!mapped.ok()) return mapped.status();
  CheckCall(GpuCallClass::kSetup);
  if (absl::Status s = runtime_.RegisterHost((*mapped)->base(), (*mapped)->bytes()); !s.ok()) {
    return s;
  }
  constexpr int kDevice = 0;
  auto mapping = std::make_unique<HostMapping>(runtime_, *std::move(mapped), kDevice);
  if (absl::Status s = EnsureLanes(session.state(), kDevice); !s.ok()) {
    Release(std::move(mapping));
    return s;
  }
  return AddBuffer(session, std::move(mapping), /*host=*/true);
}

std::unique_ptr<ImportedBuffer> GpuImporter::AddBuffer(GpuSession& session,
                                                       std::unique_ptr<DeviceMapping> mapping,
                                                       bool host) {
  SessionState& state = session.state();
  const auto base = reinterpret_cast<uintptr_t>(mapping->base());
  {
    MutexLock lock(&state.mu);
    SessionState::Range& range = state.ranges[base];
    range.end = base + mapping->bytes();
    range.device = mapping->device();
    if (host) range.host = true;
    ++range.refs;
  }
  return std::make_unique<GpuBuffer>(std::move(mapping), session.shared(), releaser_,
                                     live_buffers_);
}

// The client binds its ticket slot for one of its GPUs (gpu/ticket_protocol.h): this GPU's lanes
// then read that slot's tickets and write its done counters. The first slot bound registers the
// session's ticket page with the runtime.
absl::StatusOr<std::unique_ptr<ImportedBuffer>> GpuImporter::BindTicketSlot(
    SessionState& state, const BufferImport& import) {
  if (import.bytes != 0 || import.fd.valid()) {
    return absl::InvalidArgumentError(
        "a ticket slot (kCudaSemaphores) carries no memory: bytes must be 0 and no descriptor "
        "sent (a client of protocol 1 sends a semaphore page; use a client of this release)");
  }
  const int client_device = import.device;
  if (client_device < 0 || client_device >= ring::kMaxTicketDevices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ticket slot for GPU ", client_device, ": tickets exist for GPUs 0 to ",
        ring::kMaxTicketDevices - 1, " of the client"));
  }
  if (state.tickets == nullptr) {
    return absl::FailedPreconditionError("the session has no ticket page");
  }
  CheckCall(GpuCallClass::kSetup);
  absl::StatusOr<int> device = runtime_.FindDevice(import);
  if (!device.ok()) return device.status();
  if (absl::Status s = EnsureLanes(state, *device); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<TicketPagePin>> pin = PinTicketPage(state);
  if (!pin.ok()) return pin.status();
  absl::StatusOr<uint64_t> page = runtime_.HostDeviceAddress(*device, (*pin)->base);
  if (!page.ok()) return page.status();
  ring::TicketSlot& slot = state.tickets->slots[client_device];
  const auto offset_of = [&](const ring::TicketWord& word) {
    return static_cast<uint64_t>(reinterpret_cast<const char*>(&word) -
                                 reinterpret_cast<const char*>(state.tickets));
  };
  MutexLock lock(&state.mu);
  DeviceLanes& d = state.devices[*device];
  if (d.slot_bound) {
    return absl::AlreadyExistsError(
        absl::StrCat("the session already bound a ticket slot for GPU ", *device));
  }
  d.slot_bound = true;
  for (auto& lane : d.lanes) {
    MutexLock lane_lock(&lane->mu);
    bool d2h = lane->direction == Direction::kToPool;
    lane->ready = d2h ? &slot.produced.value : &slot.reload_ready.value;
    lane->done_addr = *page + offset_of(d2h ? slot.offload_done : slot.reload_done);
    lane->ticket_pin = *pin;
  }
  return std::make_unique<SemaphoreBuffer>(reinterpret_cast<char*>(&slot), *device);
}

// The session's ticket page registered with the runtime: once, by the first slot bound; kept by
// the lanes that write it.
absl::StatusOr<std::shared_ptr<TicketPagePin>> GpuImporter::PinTicketPage(SessionState& state) {
  MutexLock lock(&state.pin_mu);
  if (std::shared_ptr<TicketPagePin> pin = state.ticket_pin.lock()) return pin;
  char* base = reinterpret_cast<char*>(state.tickets);
  if (absl::Status s = runtime_.RegisterMappedHost(base, sizeof(ring::TicketPage)); !s.ok()) {
    return s;
  }
  std::shared_ptr<TicketPagePin> pin(
      new TicketPagePin{base, state.tickets_owner},
      [r = releaser_, &runtime = runtime_](TicketPagePin* p) {
        r->Post([p, &runtime] {
          runtime.UnregisterHost(p->base);
          delete p;  // then the page may be unmapped
        });
      });
  state.ticket_pin = pin;
  return pin;
}

absl::Status GpuImporter::EnsureLanes(SessionState& state, int device) {
  for (Direction direction : {Direction::kToPool, Direction::kFromPool}) {
    if (absl::Status s = EnsureLane(state, device, direction); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status GpuImporter::EnsureLane(SessionState& state, int device, Direction direction) {
  {
    MutexLock lock(&state.mu);
    if (state.devices[device].lanes[LaneIndex(direction)] != nullptr) return absl::OkStatus();
  }
  // Made outside the session's lock: the job path takes it.
  CheckCall(GpuCallClass::kSetup);
  absl::StatusOr<GpuStream> stream = runtime_.CreateStream(device, /*high_priority=*/false);
  if (!stream.ok()) return stream.status();
  absl::StatusOr<HostWordPool::Slot> word = words_.Take();
  if (!word.ok()) {
    releaser_->Post(
        [&runtime = runtime_, device, s = *stream] { runtime.DestroyStream(device, s); });
    return word.status();
  }
  auto lane = std::make_shared<Lane>(runtime_, words_, releaser_, live_lanes_, gpus_.Worker(device),
                                     gpus_.Meters(device).of(direction), state.label, state.uid,
                                     device, direction, *stream, *word);
  MutexLock lock(&state.mu);
  std::shared_ptr<Lane>& slot = state.devices[device].lanes[LaneIndex(direction)];
  if (slot == nullptr) slot = std::move(lane);  // else a concurrent import made it first
  return absl::OkStatus();
}

void GpuImporter::Release(std::unique_ptr<DeviceMapping> mapping) {
  releaser_->Post([m = std::move(mapping)]() mutable { m.reset(); });
}

}  // namespace tier::engine
