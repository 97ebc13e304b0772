// client_gpu.h over HIP. Same design as client_gpu_cuda.cc; HIP has no VMM export here, so only
// hipMalloc memory (legacy IPC handles) can be registered.
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/gpu/client_gpu.h"
#include "gpu/hip_util.h"

namespace tier::client::gpu {

namespace hip = ::tier::gpu::hip;
namespace {

using hip::CheckHip;

hipStream_t AsStream(void* stream) { return static_cast<hipStream_t>(stream); }

class HipTicketPage final : public TicketPageRegistration {
 public:
  explicit HipTicketPage(ring::TicketPage* page) : page_(page) {}
  ~HipTicketPage() override { (void)hipHostUnregister(page_); }

 private:
  ring::TicketPage* page_;
};

class HipDeviceSync final : public DeviceSync {
 public:
  HipDeviceSync(int device, ring::TicketSlot* slot) : device_(device), slot_(slot) {}

  ~HipDeviceSync() override {
    hip::DeviceGuard guard(device_);
    if (event_ != nullptr) (void)hipEventDestroy(event_);
    if (ticket_ != nullptr) (void)hipStreamDestroy(ticket_);
    if (read_ != nullptr) (void)hipStreamDestroy(read_);
    if (page_ != nullptr) (void)hipFree(page_);
  }

  absl::Status Init() {
    if (absl::Status s = hip::CheckStreamMemOps(device_); !s.ok()) return s;
    hip::DeviceGuard guard(device_);
    if (!guard.status().ok()) return guard.status();
    if (absl::Status s = CheckHip(hipMalloc(&page_, kSemaphoreAllocBytes), "hipMalloc of the page");
        !s.ok()) {
      page_ = nullptr;
      return s;
    }
    if (absl::Status s = CheckHip(hipStreamCreateWithFlags(&ticket_, hipStreamNonBlocking),
                                  "creating the ticket stream");
        !s.ok()) {
      ticket_ = nullptr;
      return s;
    }
    if (absl::Status s = CheckHip(hipStreamCreateWithFlags(&read_, hipStreamNonBlocking),
                                  "creating the read stream");
        !s.ok()) {
      read_ = nullptr;
      return s;
    }
    if (absl::Status s = CheckHip(hipEventCreateWithFlags(&event_, hipEventDisableTiming),
                                  "creating the ticket event");
        !s.ok()) {
      event_ = nullptr;
      return s;
    }
    // The ticket words as this GPU's streams address them (registered mapped and portable).
    for (auto [word, out] : {std::pair{&slot_->produced.value, &produced_addr_},
                             std::pair{&slot_->reload_ready.value, &reload_ready_addr_}}) {
      if (absl::Status s = CheckHip(
              hipHostGetDevicePointer(out, const_cast<std::atomic<uint64_t>*>(word), 0),
              "hipHostGetDevicePointer of the ticket page");
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = CheckHip(hipMemsetAsync(page_, 0, kSemaphorePageBytes, ticket_),
                                  "zeroing the semaphore page");
        !s.ok()) {
      return s;
    }
    return CheckHip(hipStreamSynchronize(ticket_), "zeroing the semaphore page");
  }

  int device() const override { return device_; }

  absl::StatusOr<DeviceAllocation> Export() override {
    hip::DeviceGuard guard(device_);
    if (!guard.status().ok()) return guard.status();
    DeviceAllocation out;
    out.kind = wire::BufferKind::kCudaSemaphores;
    out.device = device_;
    absl::StatusOr<std::array<uint8_t, 16>> uuid = hip::DeviceUuid(device_);
    if (!uuid.ok()) return uuid.status();
    out.device_uuid = *uuid;
    out.base = reinterpret_cast<uint64_t>(page_);
    out.bytes = kSemaphoreAllocBytes;
    hipIpcMemHandle_t handle;
    if (absl::Status s = CheckHip(hipIpcGetMemHandle(&handle, page_), "hipIpcGetMemHandle");
        !s.ok()) {
      return s;
    }
    static_assert(sizeof(handle) == sizeof(out.ipc_handle));
    std::memcpy(out.ipc_handle.data(), &handle, sizeof(handle));
    return out;
  }

  absl::StatusOr<uint64_t> TicketOffload(absl::Span<void* const> producer_streams) override {
    std::lock_guard lock(mu_);
    if (released_) return absl::UnavailableError("the daemon is gone; no more tickets");
    hip::DeviceGuard guard(device_);
    if (!guard.status().ok()) return guard.status();
    uint64_t ticket = next_offload_;
    if (producer_streams.empty()) {
      if (absl::Status s = FollowStream(nullptr); !s.ok()) return s;
    }
    for (void* producer : producer_streams) {
      if (absl::Status s = FollowStream(producer); !s.ok()) return s;
    }
    if (absl::Status s = WriteAt(ticket_, produced_addr_, ticket); !s.ok()) return s;
    ++next_offload_;
    return ticket;
  }

  absl::StatusOr<uint64_t> TicketReload(void* consumer_stream) override {
    std::lock_guard lock(mu_);
    if (released_) return absl::UnavailableError("the daemon is gone; no more tickets");
    hip::DeviceGuard guard(device_);
    if (!guard.status().ok()) return guard.status();
    uint64_t ticket = next_reload_;
    if (absl::Status s = FollowStream(consumer_stream); !s.ok()) return s;
    if (absl::Status s = WriteAt(ticket_, reload_ready_addr_, ticket); !s.ok()) return s;
    ++next_reload_;
    return ticket;
  }

  absl::Status WaitReloadDone(void* stream, uint64_t ticket) override {
    return WaitOn(stream, kReloadDoneOffset, ticket);
  }

  absl::Status WaitOffloadDone(void* stream, uint64_t ticket) override {
    return WaitOn(stream, kOffloadDoneOffset, ticket);
  }

  absl::Status ReleaseWaiters() override {
    std::lock_guard lock(mu_);
    released_ = true;
    hip::DeviceGuard guard(device_);
    if (!guard.status().ok()) return guard.status();
    int least = 0;
    int greatest = 0;
    (void)hipDeviceGetStreamPriorityRange(&least, &greatest);
    for (int attempt = 0; attempt < 8; ++attempt) {
      hipStream_t stream = nullptr;
      if (absl::Status s = CheckHip(
              hipStreamCreateWithPriority(&stream, hipStreamNonBlocking, greatest),
              "creating a release stream");
          !s.ok()) {
        return s;
      }
      absl::Status s = Write(stream, kOffloadDoneOffset, kReleasedTicket);
      if (s.ok()) s = Write(stream, kReloadDoneOffset, kReleasedTicket);
      if (!s.ok()) {
        (void)hipStreamDestroy(stream);
        return s;
      }
      auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(250);
      hipError_t e = hipErrorNotReady;
      while ((e = hipStreamQuery(stream)) == hipErrorNotReady &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      (void)hipStreamDestroy(stream);
      if (e == hipSuccess) return absl::OkStatus();
      if (e != hipErrorNotReady) return hip::HipError(e, "release stream");
    }
    return absl::DeadlineExceededError(
        "could not release the streams waiting on the daemon: every release stream stayed "
        "blocked");
  }

  absl::StatusOr<std::array<uint64_t, 4>> ReadCounters() override {
    hip::DeviceGuard guard(device_);
    if (!guard.status().ok()) return guard.status();
    uint64_t words[kReloadDoneOffset / 8 + 1] = {};
    if (absl::Status s = CheckHip(hipMemcpyAsync(words, page_, sizeof(words),
                                                 hipMemcpyDeviceToHost, read_),
                                  "reading the semaphore page");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckHip(hipStreamSynchronize(read_), "reading the semaphore page");
        !s.ok()) {
      return s;
    }
    return std::array<uint64_t, 4>{slot_->produced.value.load(), words[kOffloadDoneOffset / 8],
                                   slot_->reload_ready.value.load(), words[kReloadDoneOffset / 8]};
  }

 private:
  void* Addr(uint64_t offset) const { return static_cast<char*>(page_) + offset; }

  absl::Status FollowStream(void* stream) {
    hipError_t e = hipEventRecord(event_, AsStream(stream));
    if (e != hipSuccess) {
      (void)hipGetLastError();
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot record an event on the given stream (", hipGetErrorName(e),
          "); is it a live stream of GPU ", device_, "?"));
    }
    return CheckHip(hipStreamWaitEvent(ticket_, event_, 0), "hipStreamWaitEvent");
  }

  absl::Status Write(hipStream_t stream, uint64_t offset, uint64_t value) {
    return WriteAt(stream, Addr(offset), value);
  }
  absl::Status WriteAt(hipStream_t stream, void* addr, uint64_t value) {
    return CheckHip(hipStreamWriteValue64(stream, addr, value, 0), "hipStreamWriteValue64");
  }

  absl::Status WaitOn(void* stream, uint64_t offset, uint64_t ticket) {
    if (ticket == 0 || ticket >= kMaxTicket) {
      return absl::InvalidArgumentError(absl::StrCat("ticket ", ticket, " is out of range"));
    }
    hip::DeviceGuard guard(device_);
    if (!guard.status().ok()) return guard.status();
    return CheckHip(hipStreamWaitValue64(AsStream(stream), Addr(offset), ticket,
                                         hipStreamWaitValueGte),
                    "hipStreamWaitValue64");
  }

  const int device_;
  ring::TicketSlot* const slot_;
  void* produced_addr_ = nullptr;
  void* reload_ready_addr_ = nullptr;
  void* page_ = nullptr;
  hipStream_t ticket_ = nullptr;
  hipStream_t read_ = nullptr;
  hipEvent_t event_ = nullptr;

  std::mutex mu_;
  uint64_t next_offload_ = 1;
  uint64_t next_reload_ = 1;
  bool released_ = false;
};

}  // namespace

int GpuDeviceCount() { return hip::DeviceCount(); }

uint64_t AllocationId(const void*) { return 0; }  // no cheap identity: always export

absl::StatusOr<DeviceAllocation> ExportDeviceAllocation(const void* device_ptr) {
  if (device_ptr == nullptr) return absl::InvalidArgumentError("null device pointer");
  hipPointerAttribute_t attributes{};
  hipError_t e = hipPointerGetAttributes(&attributes, device_ptr);
  if (e != hipSuccess) {
    (void)hipGetLastError();
    return absl::InvalidArgumentError(absl::StrCat("not a HIP pointer: ", hipGetErrorName(e)));
  }
  if (attributes.memoryType != hipMemoryTypeDevice || attributes.isManaged) {
    return absl::InvalidArgumentError("the pointer is not (unmanaged) device memory");
  }
  int device = attributes.device;
  hip::DeviceGuard guard(device);
  if (!guard.status().ok()) return guard.status();
  DeviceAllocation out;
  out.device = device;
  absl::StatusOr<std::array<uint8_t, 16>> uuid = hip::DeviceUuid(device);
  if (!uuid.ok()) return uuid.status();
  out.device_uuid = *uuid;
  hipDeviceptr_t base = nullptr;
  size_t size = 0;
  if (absl::Status s = CheckHip(hipMemGetAddressRange(&base, &size, const_cast<void*>(device_ptr)),
                                "hipMemGetAddressRange");
      !s.ok()) {
    return s;
  }
  out.base = reinterpret_cast<uint64_t>(base);
  out.bytes = size;
  out.offset = reinterpret_cast<uint64_t>(device_ptr) - out.base;
  hipIpcMemHandle_t ipc;
  if (absl::Status s = CheckHip(hipIpcGetMemHandle(&ipc, base), "hipIpcGetMemHandle"); !s.ok()) {
    return s;
  }
  out.kind = wire::BufferKind::kCudaIpc;
  static_assert(sizeof(ipc) == sizeof(out.ipc_handle));
  std::memcpy(out.ipc_handle.data(), &ipc, sizeof(ipc));
  return out;
}

absl::StatusOr<std::unique_ptr<TicketPageRegistration>> RegisterTicketPage(ring::TicketPage* page) {
  if (hip::DeviceCount() == 0) return absl::UnavailableError("no HIP device (or no ROCm driver) found");
  if (absl::Status s = CheckHip(
          hipHostRegister(page, sizeof(*page), hipHostRegisterPortable | hipHostRegisterMapped),
          "hipHostRegister of the session's ticket page");
      !s.ok()) {
    return s;
  }
  return std::make_unique<HipTicketPage>(page);
}

absl::StatusOr<std::unique_ptr<DeviceSync>> CreateDeviceSync(int device, ring::TicketSlot* slot) {
  int count = hip::DeviceCount();
  if (count == 0) return absl::UnavailableError("no HIP device (or no ROCm driver) found");
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("no GPU ", device, " (", count, " visible)"));
  }
  auto sync = std::make_unique<HipDeviceSync>(device, slot);
  if (absl::Status s = sync->Init(); !s.ok()) return s;
  return sync;
}

}  // namespace tier::client::gpu
