// client_gpu.h over CUDA. Every call makes the page's GPU current for its duration and restores
// the application's current device after (DeviceGuard).
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/gpu/client_gpu.h"
#include "gpu/cuda_driver.h"

namespace tier::client::gpu {

namespace cuda = ::tier::gpu::cuda;
namespace {

using cuda::CheckDriver;
using cuda::CheckRuntime;
using cuda::Driver;

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

class CudaTicketPage final : public TicketPageRegistration {
 public:
  explicit CudaTicketPage(ring::TicketPage* page) : page_(page) {}
  ~CudaTicketPage() override { (void)cudaHostUnregister(page_); }

 private:
  ring::TicketPage* page_;
};

class CudaDeviceSync final : public DeviceSync {
 public:
  CudaDeviceSync(const Driver& driver, int device, ring::TicketSlot* slot)
      : driver_(driver), device_(device), slot_(slot) {}

  ~CudaDeviceSync() override {
    cuda::DeviceGuard guard(device_);
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
    if (ticket_ != nullptr) (void)cudaStreamDestroy(ticket_);
    if (read_ != nullptr) (void)cudaStreamDestroy(read_);
    if (page_ != nullptr) (void)cudaFree(page_);
  }

  absl::Status Init() {
    if (absl::Status s = cuda::CheckStreamMemOps(device_); !s.ok()) return s;
    cuda::DeviceGuard guard(device_);
    if (!guard.status().ok()) return guard.status();
    if (absl::Status s = CheckRuntime(cudaMalloc(&page_, kSemaphoreAllocBytes),
                                      "cudaMalloc of the semaphore page");
        !s.ok()) {
      page_ = nullptr;
      return s;
    }
    if (absl::Status s = CheckRuntime(cudaStreamCreateWithFlags(&ticket_, cudaStreamNonBlocking),
                                      "creating the ticket stream");
        !s.ok()) {
      ticket_ = nullptr;
      return s;
    }
    if (absl::Status s = CheckRuntime(cudaStreamCreateWithFlags(&read_, cudaStreamNonBlocking),
                                      "creating the read stream");
        !s.ok()) {
      read_ = nullptr;
      return s;
    }
    if (absl::Status s = CheckRuntime(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming),
                                      "creating the ticket event");
        !s.ok()) {
      event_ = nullptr;
      return s;
    }
    // The ticket words as this GPU's streams address them (the page is registered mapped and
    // portable: see RegisterTicketPage).
    for (auto [word, out] : {std::pair{&slot_->produced.value, &produced_addr_},
                             std::pair{&slot_->reload_ready.value, &reload_ready_addr_}}) {
      void* dev = nullptr;
      if (absl::Status s = CheckRuntime(
              cudaHostGetDevicePointer(&dev, const_cast<uint64_t*>(
                                                 reinterpret_cast<const uint64_t*>(word)), 0),
              "cudaHostGetDevicePointer of the ticket page");
          !s.ok()) {
        return s;
      }
      *out = reinterpret_cast<CUdeviceptr>(dev);
    }
    // Zeroed on the ticket stream itself and waited for: every later write to the page is
    // ordered after it, and the daemon sees it zero when it opens the page.
    if (absl::Status s = CheckRuntime(cudaMemsetAsync(page_, 0, kSemaphorePageBytes, ticket_),
                                      "zeroing the semaphore page");
        !s.ok()) {
      return s;
    }
    return CheckRuntime(cudaStreamSynchronize(ticket_), "zeroing the semaphore page");
  }

  int device() const override { return device_; }

  absl::StatusOr<DeviceAllocation> Export() override {
    cuda::DeviceGuard guard(device_);
    if (!guard.status().ok()) return guard.status();
    DeviceAllocation out;
    out.kind = wire::BufferKind::kCudaSemaphores;
    out.device = device_;
    absl::StatusOr<std::array<uint8_t, 16>> uuid = cuda::DeviceUuid(device_);
    if (!uuid.ok()) return uuid.status();
    out.device_uuid = *uuid;
    out.base = reinterpret_cast<uint64_t>(page_);
    out.bytes = kSemaphoreAllocBytes;
    cudaIpcMemHandle_t handle;
    if (absl::Status s = CheckRuntime(cudaIpcGetMemHandle(&handle, page_),
                                      "cudaIpcGetMemHandle of the semaphore page");
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
    cuda::DeviceGuard guard(device_);
    if (!guard.status().ok()) return guard.status();
    uint64_t ticket = next_offload_;
    if (producer_streams.empty()) {
      if (absl::Status s = FollowStream(nullptr); !s.ok()) return s;
    }
    for (void* producer : producer_streams) {
      if (absl::Status s = FollowStream(producer); !s.ok()) return s;
    }
    if (absl::Status s = Write(produced_addr_, ticket); !s.ok()) return s;
    ++next_offload_;  // taken only once its write is queued: a failure leaves no gap
    return ticket;
  }

  absl::StatusOr<uint64_t> TicketReload(void* consumer_stream) override {
    std::lock_guard lock(mu_);
    if (released_) return absl::UnavailableError("the daemon is gone; no more tickets");
    cuda::DeviceGuard guard(device_);
    if (!guard.status().ok()) return guard.status();
    uint64_t ticket = next_reload_;
    if (absl::Status s = FollowStream(consumer_stream); !s.ok()) return s;
    if (absl::Status s = Write(reload_ready_addr_, ticket); !s.ok()) return s;
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
    cuda::DeviceGuard guard(device_);
    if (!guard.status().ok()) return guard.status();
    int least = 0;
    int greatest = 0;
    (void)cudaDeviceGetStreamPriorityRange(&least, &greatest);
    // A fresh stream may share a hardware queue with a stream blocked on a wait the dead daemon
    // will never satisfy; then the write waits behind it. Try again from other fresh streams.
    for (int attempt = 0; attempt < 8; ++attempt) {
      cudaStream_t stream = nullptr;
      if (absl::Status s = CheckRuntime(
              cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest),
              "creating a release stream");
          !s.ok()) {
        return s;
      }
      absl::Status s = CheckDriver(
          driver_.StreamWriteValue64(stream, Addr(kOffloadDoneOffset), kReleasedTicket,
                                     CU_STREAM_WRITE_VALUE_DEFAULT),
          "cuStreamWriteValue64(offload_done)");
      if (s.ok()) {
        s = CheckDriver(driver_.StreamWriteValue64(stream, Addr(kReloadDoneOffset),
                                                   kReleasedTicket, CU_STREAM_WRITE_VALUE_DEFAULT),
                        "cuStreamWriteValue64(reload_done)");
      }
      if (!s.ok()) {
        (void)cudaStreamDestroy(stream);
        return s;
      }
      auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(250);
      cudaError_t e = cudaErrorNotReady;
      while ((e = cudaStreamQuery(stream)) == cudaErrorNotReady &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      (void)cudaStreamDestroy(stream);  // returns at once; a stuck one is freed once it ran
      if (e == cudaSuccess) return absl::OkStatus();
      if (e != cudaErrorNotReady) return cuda::RuntimeError(e, "release stream");
    }
    return absl::DeadlineExceededError(
        "could not release the streams waiting on the daemon: every release stream stayed "
        "blocked");
  }

  absl::StatusOr<std::array<uint64_t, 4>> ReadCounters() override {
    cuda::DeviceGuard guard(device_);
    if (!guard.status().ok()) return guard.status();
    uint64_t words[kReloadDoneOffset / 8 + 1] = {};
    if (absl::Status s = CheckRuntime(cudaMemcpyAsync(words, page_, sizeof(words),
                                                      cudaMemcpyDeviceToHost, read_),
                                      "reading the semaphore page");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckRuntime(cudaStreamSynchronize(read_), "reading the semaphore page");
        !s.ok()) {
      return s;
    }
    return std::array<uint64_t, 4>{slot_->produced.value.load(), words[kOffloadDoneOffset / 8],
                                   slot_->reload_ready.value.load(), words[kReloadDoneOffset / 8]};
  }

 private:
  CUdeviceptr Addr(uint64_t offset) const {
    return reinterpret_cast<CUdeviceptr>(static_cast<char*>(page_) + offset);
  }

  // Makes the ticket stream wait for the work queued so far on `stream` (nullptr: the legacy
  // default stream of this GPU). One event serves every call: cudaStreamWaitEvent captures the
  // event's latest record, and a later record does not affect waits already queued.
  absl::Status FollowStream(void* stream) {
    cudaError_t e = cudaEventRecord(event_, AsStream(stream));
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot record an event on the given stream (", cudaGetErrorName(e),
          "); is it a live stream of GPU ", device_, "?"));
    }
    return CheckRuntime(cudaStreamWaitEvent(ticket_, event_, 0), "cudaStreamWaitEvent");
  }

  absl::Status Write(CUdeviceptr word, uint64_t ticket) {
    return CheckDriver(driver_.StreamWriteValue64(ticket_, word, ticket,
                                                  CU_STREAM_WRITE_VALUE_DEFAULT),
                       "cuStreamWriteValue64 on the ticket stream");
  }

  absl::Status WaitOn(void* stream, uint64_t offset, uint64_t ticket) {
    if (ticket == 0 || ticket >= kMaxTicket) {
      return absl::InvalidArgumentError(absl::StrCat("ticket ", ticket, " is out of range"));
    }
    cuda::DeviceGuard guard(device_);
    if (!guard.status().ok()) return guard.status();
    // A null stream is the driver's legacy NULL stream of the current (this GPU's) context.
    return CheckDriver(driver_.StreamWaitValue64(static_cast<CUstream>(stream), Addr(offset),
                                                 ticket, CU_STREAM_WAIT_VALUE_GEQ),
                       "cuStreamWaitValue64");
  }

  const Driver& driver_;
  const int device_;
  ring::TicketSlot* const slot_;
  CUdeviceptr produced_addr_ = 0;
  CUdeviceptr reload_ready_addr_ = 0;
  void* page_ = nullptr;
  cudaStream_t ticket_ = nullptr;
  cudaStream_t read_ = nullptr;
  cudaEvent_t event_ = nullptr;

  std::mutex mu_;  // ticket order = order of the writes on the ticket stream
  uint64_t next_offload_ = 1;
  uint64_t next_reload_ = 1;
  bool released_ = false;
};

}  // namespace

int GpuDeviceCount() { return cuda::DeviceCount(); }

uint64_t AllocationId(const void* device_ptr) {
  absl::StatusOr<const Driver*> driver = cuda::GetDriver();
  if (!driver.ok() || (*driver)->PointerGetAttribute == nullptr) return 0;
  auto ptr = reinterpret_cast<CUdeviceptr>(device_ptr);
  // The physical allocation's id: for VMM memory (PyTorch's expandable segments) the buffer id
  // names the address range, which stays the same when the allocator unmaps a page and maps new
  // memory there (empty_cache), so it cannot tell the new page from the old one.
  unsigned long long id = 0;
  if ((*driver)->PointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, ptr) ==
          CUDA_SUCCESS &&
      id != 0) {
    return id;
  }
  if ((*driver)->PointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr) != CUDA_SUCCESS) {
    return 0;
  }
  return id;
}

absl::StatusOr<DeviceAllocation> ExportDeviceAllocation(const void* device_ptr) {
  if (device_ptr == nullptr) return absl::InvalidArgumentError("null device pointer");
  absl::StatusOr<const Driver*> driver = cuda::GetDriver();
  if (!driver.ok()) return driver.status();
  const Driver& d = **driver;

  cudaPointerAttributes attributes{};
  cudaError_t e = cudaPointerGetAttributes(&attributes, device_ptr);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::InvalidArgumentError(
        absl::StrCat("not a CUDA pointer: ", cudaGetErrorName(e)));
  }
  if (attributes.type != cudaMemoryTypeDevice) {
    return absl::InvalidArgumentError(
        attributes.type == cudaMemoryTypeManaged
            ? "managed memory cannot be registered; use device memory"
            : "the pointer is not device memory (host or unregistered memory)");
  }
  int device = attributes.device;
  cuda::DeviceGuard guard(device);
  if (!guard.status().ok()) return guard.status();

  DeviceAllocation out;
  out.device = device;
  absl::StatusOr<std::array<uint8_t, 16>> uuid = cuda::DeviceUuid(device);
  if (!uuid.ok()) return uuid.status();
  out.device_uuid = *uuid;
  CUdeviceptr base = 0;
  size_t size = 0;
  auto ptr = reinterpret_cast<CUdeviceptr>(device_ptr);
  if (absl::Status s = CheckDriver(d.MemGetAddressRange(&base, &size, ptr), "cuMemGetAddressRange");
      !s.ok()) {
    return s;
  }
  out.base = base;
  out.bytes = size;
  out.offset = ptr - base;

  // VMM memory (cuMemCreate + cuMemMap). cuMemGetAddressRange gave the whole VA reservation,
  // which may hold many physical allocations side by side (PyTorch's expandable segments map one
  // per segment page), so the buffer is the one physical allocation mapped at the pointer: found
  // by walking the reservation in steps of the mapping granularity while the same allocation is
  // mapped (cuMemRetainAllocationHandle returns the allocation's own handle, with a reference
  // that cuMemRelease drops). The daemon maps exactly that allocation, at offset 0.
  CUmemGenericAllocationHandle handle = 0;
  if (d.MemRetainAllocationHandle(&handle, reinterpret_cast<void*>(ptr)) == CUDA_SUCCESS) {
    CUmemAllocationProp prop{};
    absl::Status s = CheckDriver(d.MemGetAllocationPropertiesFromHandle(&prop, handle),
                                 "cuMemGetAllocationPropertiesFromHandle");
    if (s.ok() && (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
      s = absl::InvalidArgumentError(
          "the VMM allocation was created without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in its "
          "requested handle types, so it cannot be shared with tierd");
    }
    size_t granularity = 0;
    if (s.ok()) {
      s = CheckDriver(d.MemGetAllocationGranularity(&granularity, &prop,
                                                    CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                      "cuMemGetAllocationGranularity");
    }
    if (s.ok()) {
      auto same = [&](CUdeviceptr at) {
        CUmemGenericAllocationHandle other = 0;
        if (d.MemRetainAllocationHandle(&other, reinterpret_cast<void*>(at)) != CUDA_SUCCESS) {
          return false;
        }
        (void)d.MemRelease(other);
        return other == handle;
      };
      const CUdeviceptr range_end = base + size;
      CUdeviceptr lo = ptr - (ptr - base) % granularity;
      while (lo >= base + granularity && same(lo - granularity)) lo -= granularity;
      CUdeviceptr hi = lo + granularity;
      while (hi < range_end && same(hi)) hi += granularity;
      out.base = lo;
      out.bytes = hi - lo;
      out.offset = ptr - lo;
    }
    int fd = -1;
    if (s.ok()) {
      s = CheckDriver(d.MemExportToShareableHandle(&fd, handle,
                                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                      "cuMemExportToShareableHandle");
    }
    (void)d.MemRelease(handle);  // balances the retain
    if (!s.ok()) return s;
    out.kind = wire::BufferKind::kCudaVmmFd;
    out.fd.reset(fd);
    return out;
  }

  cudaIpcMemHandle_t ipc;
  e = cudaIpcGetMemHandle(&ipc, reinterpret_cast<void*>(base));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot export the allocation with cudaIpcGetMemHandle: ", cudaGetErrorName(e),
        " (memory from stream-ordered pools, cudaMallocAsync, cannot be shared this way)"));
  }
  out.kind = wire::BufferKind::kCudaIpc;
  static_assert(sizeof(ipc) == sizeof(out.ipc_handle));
  std::memcpy(out.ipc_handle.data(), &ipc, sizeof(ipc));
  return out;
}

absl::StatusOr<std::unique_ptr<TicketPageRegistration>> RegisterTicketPage(ring::TicketPage* page) {
  if (cuda::DeviceCount() == 0) {
    return absl::UnavailableError("no CUDA device (or no CUDA driver) found");
  }
  // Mapped: streams write it (stream memory operations); portable: for every GPU's context.
  if (absl::Status s = CheckRuntime(
          cudaHostRegister(page, sizeof(*page), cudaHostRegisterPortable | cudaHostRegisterMapped),
          "cudaHostRegister of the session's ticket page");
      !s.ok()) {
    return s;
  }
  return std::make_unique<CudaTicketPage>(page);
}

absl::StatusOr<std::unique_ptr<DeviceSync>> CreateDeviceSync(int device, ring::TicketSlot* slot) {
  int count = cuda::DeviceCount();
  if (count == 0) return absl::UnavailableError("no CUDA device (or no CUDA driver) found");
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("no GPU ", device, " (", count, " visible)"));
  }
  absl::StatusOr<const Driver*> driver = cuda::GetDriver();
  if (!driver.ok()) return driver.status();
  auto sync = std::make_unique<CudaDeviceSync>(**driver, device, slot);
  if (absl::Status s = sync->Init(); !s.ok()) return s;
  return sync;
}

}  // namespace tier::client::gpu
