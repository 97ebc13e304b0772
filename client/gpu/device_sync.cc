#include "client/gpu/device_sync.h"

#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/gpu/client_gpu.h"
#include "gpu/ticket_protocol.h"

namespace tier::client::gpu {

using ::tier::gpu::kMaxTicket;
using ::tier::gpu::kOffloadDoneOffset;
using ::tier::gpu::kReleasedTicket;
using ::tier::gpu::kReloadDoneOffset;
using ::tier::gpu::kSemaphoreAllocBytes;
using ::tier::gpu::kSemaphorePageBytes;

namespace {
// ReleaseWaiters: fresh streams tried, and how long each may stay blocked.
constexpr int kReleaseAttempts = 8;
constexpr auto kReleaseAttemptTime = std::chrono::milliseconds(250);
}  // namespace

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
  if (read_ != nullptr) runtime_->DestroyStream(read_);
  if (page_ != nullptr) runtime_->Free(page_);
}

absl::Status DeviceSync::Init() {
  if (absl::Status s = runtime_->CheckStreamMemOps(device_); !s.ok()) return s;
  DeviceScope scope(*runtime_, device_);
  if (!scope.status().ok()) return scope.status();
  absl::StatusOr<void*> page = runtime_->Malloc(kSemaphoreAllocBytes);
  if (!page.ok()) return page.status();
  page_ = *page;
  absl::StatusOr<SyncRuntime::Stream> ticket = runtime_->CreateStream(false);
  if (!ticket.ok()) return ticket.status();
  ticket_ = *ticket;
  absl::StatusOr<SyncRuntime::Stream> read = runtime_->CreateStream(false);
  if (!read.ok()) return read.status();
  read_ = *read;
  absl::StatusOr<SyncRuntime::Event> event = runtime_->CreateEvent();
  if (!event.ok()) return event.status();
  event_ = *event;
  // The ticket words as this GPU's streams address them (the page is registered mapped and
  // portable: see RegisterTicketPage).
  for (auto [word, out] : {std::pair{&slot_->produced.value, &produced_addr_},
                           std::pair{&slot_->reload_ready.value, &reload_ready_addr_}}) {
    absl::StatusOr<uint64_t> address =
        runtime_->HostDevicePointer(const_cast<std::atomic<uint64_t>*>(word));
    if (!address.ok()) return address.status();
    *out = *address;
  }
  // Zeroed on the ticket stream itself and waited for: every later write to the page is ordered
  // after it, and the daemon sees it zero when it opens the page.
  if (absl::Status s = runtime_->MemsetAsync(page_, kSemaphorePageBytes, ticket_); !s.ok()) {
    return s;
  }
  return runtime_->StreamSynchronize(ticket_);
}

absl::StatusOr<DeviceAllocation> DeviceSync::Export() {
  DeviceScope scope(*runtime_, device_);
  if (!scope.status().ok()) return scope.status();
  DeviceAllocation out;
  out.kind = wire::BufferKind::kCudaSemaphores;
  out.device = device_;
  absl::StatusOr<std::array<uint8_t, 16>> uuid = runtime_->DeviceUuid(device_);
  if (!uuid.ok()) return uuid.status();
  out.device_uuid = *uuid;
  out.base = reinterpret_cast<uint64_t>(page_);
  out.bytes = kSemaphoreAllocBytes;
  absl::StatusOr<std::array<uint8_t, 64>> handle = runtime_->IpcHandle(page_);
  if (!handle.ok()) return handle.status();
  out.ipc_handle = *handle;
  return out;
}

absl::StatusOr<uint64_t> DeviceSync::TicketOffload(absl::Span<void* const> producer_streams) {
  MutexLock lock(&mu_);
  if (released_) return absl::UnavailableError("the daemon is gone; no more tickets");
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
  if (released_) return absl::UnavailableError("the daemon is gone; no more tickets");
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
  return WaitOn(stream, kReloadDoneOffset, ticket);
}

absl::Status DeviceSync::WaitOffloadDone(void* stream, uint64_t ticket) {
  return WaitOn(stream, kOffloadDoneOffset, ticket);
}

absl::Status DeviceSync::ReleaseWaiters() {
  MutexLock lock(&mu_);
  released_ = true;
  DeviceScope scope(*runtime_, device_);
  if (!scope.status().ok()) return scope.status();
  // A fresh stream may share a hardware queue with a stream blocked on a wait the dead daemon
  // will never satisfy; then the write waits behind it. Try again from other fresh streams.
  for (int attempt = 0; attempt < kReleaseAttempts; ++attempt) {
    absl::StatusOr<SyncRuntime::Stream> stream = runtime_->CreateStream(true);
    if (!stream.ok()) return stream.status();
    absl::StatusOr<bool> landed = ReleaseFrom(*stream);
    runtime_->DestroyStream(*stream);  // returns at once; a stuck one is freed once it ran
    if (!landed.ok()) return landed.status();
    if (*landed) return absl::OkStatus();
  }
  return absl::DeadlineExceededError(
      "could not release the streams waiting on the daemon: every release stream stayed "
      "blocked");
}

absl::StatusOr<bool> DeviceSync::ReleaseFrom(SyncRuntime::Stream stream) {
  for (uint64_t offset : {kOffloadDoneOffset, kReloadDoneOffset}) {
    if (absl::Status s = runtime_->WriteValue64(stream, Addr(offset), kReleasedTicket); !s.ok()) {
      return s;
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + kReleaseAttemptTime;
  while (true) {
    absl::StatusOr<bool> done = runtime_->StreamDone(stream);
    if (!done.ok() || *done) return done;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

absl::StatusOr<std::array<uint64_t, 4>> DeviceSync::ReadCounters() {
  DeviceScope scope(*runtime_, device_);
  if (!scope.status().ok()) return scope.status();
  uint64_t words[kReloadDoneOffset / 8 + 1] = {};
  if (absl::Status s = runtime_->CopyToHostAsync(words, page_, sizeof(words), read_); !s.ok()) {
    return s;
  }
  if (absl::Status s = runtime_->StreamSynchronize(read_); !s.ok()) return s;
  return std::array<uint64_t, 4>{slot_->produced.value.load(), words[kOffloadDoneOffset / 8],
                                 slot_->reload_ready.value.load(), words[kReloadDoneOffset / 8]};
}

uint64_t DeviceSync::Addr(uint64_t offset) const {
  return reinterpret_cast<uint64_t>(page_) + offset;
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

absl::Status DeviceSync::WaitOn(void* stream, uint64_t offset, uint64_t ticket) {
  if (ticket == 0 || ticket >= kMaxTicket) {
    return absl::InvalidArgumentError(absl::StrCat("ticket ", ticket, " is out of range"));
  }
  DeviceScope scope(*runtime_, device_);
  if (!scope.status().ok()) return scope.status();
  return runtime_->WaitValue64(stream, Addr(offset), ticket);
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
