#include "client/gpu/device_sync.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "client/gpu/client_gpu.h"
#include "gpu/ticket_protocol.h"

namespace tier::client::gpu {

using ::tier::gpu::kMaxTicket;
using ::tier::gpu::kReleasedTicket;

absl::StatusOr<std::unique_ptr<DeviceSync>> DeviceSync::Create(
    std::unique_ptr<SyncRuntime> runtime, int device, ring::TicketSlot* slot) {
  std::unique_ptr<DeviceSync> sync(new DeviceSync(std::move(runtime), device, slot));
  if (absl::Status s = sync->Init(); !s.ok()) return s;
  return sync;
}

DeviceSync::DeviceSync(std::unique_ptr<SyncRuntime> runtime, int device, ring::TicketSlot* slot)
    : runtime_(std::move(runtime)), device_(device), slot_(slot) {}

DeviceSync::~DeviceSync() {
  DeviceScope scope(*runtime_, device_);
  if (event_ != nullptr) runtime_->DestroyEvent(event_);
  if (ticket_ != nullptr) runtime_->DestroyStream(ticket_);
}

absl::Status DeviceSync::Init() {
  if (absl::Status s = runtime_->CheckStreamMemOps(device_); !s.ok()) return s;
  DeviceScope scope(*runtime_, device_);
  if (!scope.status().ok()) return scope.status();
  absl::StatusOr<SyncRuntime::Stream> ticket = runtime_->CreateStream();
  if (!ticket.ok()) return ticket.status();
  ticket_ = *ticket;
  absl::StatusOr<SyncRuntime::Event> event = runtime_->CreateEvent();
  if (!event.ok()) return event.status();
  event_ = *event;
  // The slot's words as this GPU's streams address them (the page is registered mapped and
  // portable: see RegisterTicketPage). The daemon's done words start at 0 (a fresh ring).
  for (auto [word, out] : {std::pair{&slot_->produced.value, &produced_addr_},
                           std::pair{&slot_->reload_ready.value, &reload_ready_addr_},
                           std::pair{&slot_->offload_done.value, &offload_done_addr_},
                           std::pair{&slot_->reload_done.value, &reload_done_addr_}}) {
    absl::StatusOr<uint64_t> address = runtime_->HostDevicePointer(word);
    if (!address.ok()) return address.status();
    *out = *address;
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceAllocation> DeviceSync::Export() {
  DeviceAllocation out;
  out.kind = wire::BufferKind::kCudaSemaphores;
  out.device = device_;
  absl::StatusOr<std::array<uint8_t, 16>> uuid = runtime_->DeviceUuid(device_);
  if (!uuid.ok()) return uuid.status();
  out.device_uuid = *uuid;
  out.base = 0;
  out.bytes = 0;
  return out;
}

absl::StatusOr<uint64_t> DeviceSync::TicketOffload(absl::Span<void* const> producer_streams) {
  MutexLock lock(&mu_);
  if (released_.load()) return absl::UnavailableError("the daemon is gone; no more tickets");
  DeviceScope scope(*runtime_, device_);
  if (!scope.status().ok()) return scope.status();
  const uint64_t ticket = next_offload_;
  if (producer_streams.empty()) {
    if (absl::Status s = FollowStream(nullptr); !s.ok()) return s;
  }
  for (void* producer : producer_streams) {
    if (absl::Status s = FollowStream(producer); !s.ok()) return s;
  }
  if (absl::Status s = runtime_->WriteValue64(ticket_, produced_addr_, ticket); !s.ok()) return s;
  ++next_offload_;  // taken only once its write is queued: a failure leaves no gap
  return ticket;
}

absl::StatusOr<uint64_t> DeviceSync::TicketReload(void* consumer_stream) {
  MutexLock lock(&mu_);
  if (released_.load()) return absl::UnavailableError("the daemon is gone; no more tickets");
  DeviceScope scope(*runtime_, device_);
  if (!scope.status().ok()) return scope.status();
  const uint64_t ticket = next_reload_;
  if (absl::Status s = FollowStream(consumer_stream); !s.ok()) return s;
  if (absl::Status s = runtime_->WriteValue64(ticket_, reload_ready_addr_, ticket); !s.ok()) {
    return s;
  }
  ++next_reload_;
  return ticket;
}

absl::Status DeviceSync::WaitReloadDone(void* stream, uint64_t ticket) {
  return WaitOn(stream, reload_done_addr_, ticket);
}

absl::Status DeviceSync::WaitOffloadDone(void* stream, uint64_t ticket) {
  return WaitOn(stream, offload_done_addr_, ticket);
}

void DeviceSync::ReleaseWaiters() {
  released_.store(true);
  // Host memory the GPU's waits read: the store is all it takes (no runtime call; see the
  // header and gpu/ticket_protocol.h, DEAD PEER).
  slot_->offload_done.value.store(kReleasedTicket);
  slot_->reload_done.value.store(kReleasedTicket);
}

std::array<uint64_t, 4> DeviceSync::ReadCounters() const {
  return {slot_->produced.value.load(), slot_->offload_done.value.load(),
          slot_->reload_ready.value.load(), slot_->reload_done.value.load()};
}

// Makes the ticket stream wait for the work queued so far on `stream` (nullptr: the legacy
// default stream of this GPU). One event serves every call: a stream's wait captures the event's
// latest record, and a later record does not affect waits already queued.
absl::Status DeviceSync::FollowStream(void* stream) {
  if (absl::Status s = runtime_->RecordEvent(event_, stream); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot record an event on the given stream (", s.message(), "); is it a live stream of GPU ",
        device_, "?"));
  }
  return runtime_->StreamWaitEvent(ticket_, event_);
}

absl::Status DeviceSync::WaitOn(void* stream, uint64_t address, uint64_t ticket) {
  if (ticket == 0 || ticket >= kMaxTicket) {
    return absl::InvalidArgumentError(absl::StrCat("ticket ", ticket, " is out of range"));
  }
  DeviceScope scope(*runtime_, device_);
  if (!scope.status().ok()) return scope.status();
  return runtime_->WaitValue64(stream, address, ticket);
}

absl::StatusOr<std::unique_ptr<DeviceSync>> CreateDeviceSync(int device, ring::TicketSlot* slot) {
  absl::StatusOr<std::unique_ptr<SyncRuntime>> runtime = NewSyncRuntime();
  if (!runtime.ok()) return runtime.status();
  const int count = GpuDeviceCount();
  if (count == 0) return absl::UnavailableError("no GPU (or no GPU driver) found");
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("no GPU ", device, " (", count, " visible)"));
  }
  return DeviceSync::Create(*std::move(runtime), device, slot);
}

}  // namespace tier::client::gpu
