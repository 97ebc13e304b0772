#include "engine/cuda_engine.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "gpu/cuda_driver.h"
#include "engine/stream_engine.h"

namespace tier::engine {

namespace cuda = ::tier::gpu::cuda;
namespace {

using cuda::CheckDriver;
using cuda::CheckRuntime;
using cuda::Driver;

std::string UuidText(const std::array<uint8_t, 16>& u) {
  return absl::StrFormat("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                         u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
                         u[12], u[13], u[14], u[15]);
}

// Legacy IPC mapping (cudaMalloc memory of another process).
class IpcMapping final : public DeviceMapping {
 public:
  IpcMapping(char* base, uint64_t bytes, int device) : base_(base), bytes_(bytes), device_(device) {}
  ~IpcMapping() override {
    cuda::DeviceGuard guard(device_);
    if (cudaError_t e = cudaIpcCloseMemHandle(base_); e != cudaSuccess) {
      LogWarning(cuda::RuntimeError(e, "cudaIpcCloseMemHandle").message());
    }
  }
  char* base() const override { return base_; }
  uint64_t bytes() const override { return bytes_; }
  int device() const override { return device_; }

 private:
  char* base_;
  uint64_t bytes_;
  int device_;
};

// VMM allocations imported from POSIX-fd shareable handles (ImportPages): each holds a reference
// on its allocation until mapped, then the mapping keeps the allocation alive.
struct ImportedPages {
  struct Page {
    CUmemGenericAllocationHandle handle = 0;
    uint64_t bytes = 0;
  };
  explicit ImportedPages(const Driver& driver) : driver(driver) {}
  ImportedPages(ImportedPages&& other) noexcept
      : driver(other.driver), pages(std::move(other.pages)), granularity(other.granularity) {
    other.pages.clear();
  }
  ~ImportedPages() {
    for (Page& page : pages) (void)driver.MemRelease(page.handle);
  }
  uint64_t bytes() const {
    uint64_t total = 0;
    for (const Page& page : pages) total += page.bytes;
    return total;
  }
  const Driver& driver;
  std::vector<Page> pages;
  size_t granularity = 0;
};

// Imports one page per fd, of the size given for it, checking that each lives on `device` (the
// GPU the client named, `gpu` in messages) and is a whole number of allocation granules.
absl::StatusOr<ImportedPages> ImportPages(const Driver& driver, std::vector<UniqueFd>& fds,
                                          const std::vector<uint64_t>& sizes, int device,
                                          const std::string& gpu) {
  if (fds.empty() || fds.size() != sizes.size()) {
    return absl::InvalidArgumentError("VMM buffer registered without its file descriptors");
  }
  ImportedPages out(driver);
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!fds[i].valid()) return absl::InvalidArgumentError("VMM page without a valid descriptor");
    CUmemGenericAllocationHandle handle = 0;
    CUresult r = driver.MemImportFromShareableHandle(
        &handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fds[i].get())),
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) {
      return absl::InvalidArgumentError(absl::StrCat(
          cuda::DriverError(r, "cannot import the VMM allocation fd").message(),
          "; the fd is not a CUDA shareable handle of a device allocation"));
    }
    out.pages.push_back({handle, sizes[i]});
    CUmemAllocationProp prop{};
    if (absl::Status s = CheckDriver(driver.MemGetAllocationPropertiesFromHandle(&prop, handle),
                                     "cuMemGetAllocationPropertiesFromHandle");
        !s.ok()) {
      return s;
    }
    if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the VMM allocation lives on ",
          prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE
              ? absl::StrCat("GPU ", prop.location.id, " of tierd")
              : std::string("a non-device location"),
          ", but the client registered it for GPU ", device, " (", gpu, ")"));
    }
    if (out.granularity == 0) {
      if (absl::Status s = CheckDriver(driver.MemGetAllocationGranularity(
                                           &out.granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                                       "cuMemGetAllocationGranularity");
          !s.ok()) {
        return s;
      }
    }
    if (out.granularity == 0 || sizes[i] == 0 || sizes[i] % out.granularity != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "VMM page of ", sizes[i], " bytes is not a positive multiple of the ", out.granularity,
          "-byte allocation granularity"));
    }
  }
  return out;
}

// VMM pages mapped side by side in one reservation of tierd's address space: one page
// (kCudaVmmFd), several (kCudaVmmPages), or an expandable segment (kCudaVmmSegment), whose
// reservation is larger than what is mapped so that Extend maps more pages after the last.
class VmmMapping final : public DeviceMapping {
 public:
  // `segment_page_bytes`: a segment's page size (0: not a segment, it cannot grow).
  // `reserved_total`: the engine's count of address space reserved for client memory, which this
  // reservation is part of until it is freed.
  VmmMapping(const Driver& driver, CUdeviceptr base, uint64_t reserved, int device,
             uint64_t segment_page_bytes, std::string gpu,
             std::atomic<uint64_t>& reserved_total)
      : driver_(driver), base_(base), reserved_(reserved), device_(device),
        segment_page_bytes_(segment_page_bytes), gpu_(std::move(gpu)),
        reserved_total_(reserved_total) {}
  ~VmmMapping() override {
    reserved_total_.fetch_sub(reserved_);
    cuda::DeviceGuard guard(device_);
    uint64_t unmapped = 0;
    for (uint64_t page : mapped_pages_) {  // each cuMemMap is unmapped whole
      if (CUresult r = driver_.MemUnmap(base_ + unmapped, page); r != CUDA_SUCCESS) {
        LogWarning(cuda::DriverError(r, "cuMemUnmap").message());
      }
      unmapped += page;
    }
    (void)driver_.MemAddressFree(base_, reserved_);
  }

  // Maps `pages` from bytes() on and makes them accessible; bytes() grows by theirs. On an error
  // nothing stays mapped of them.
  absl::Status Map(const ImportedPages& pages) {
    const uint64_t at = bytes_.load(std::memory_order_relaxed);
    const uint64_t add = pages.bytes();
    if (add > reserved_ - at) {
      return absl::OutOfRangeError(absl::StrCat(
          add, " more bytes of pages do not fit the ", reserved_, "-byte reservation, ", at,
          " of which hold pages"));
    }
    const size_t before = mapped_pages_.size();
    auto undo = [&] {
      uint64_t offset = at;
      for (size_t i = before; i < mapped_pages_.size(); ++i) {
        (void)driver_.MemUnmap(base_ + offset, mapped_pages_[i]);
        offset += mapped_pages_[i];
      }
      mapped_pages_.resize(before);
    };
    uint64_t offset = at;
    for (size_t i = 0; i < pages.pages.size(); ++i) {
      CUresult r = driver_.MemMap(base_ + offset, pages.pages[i].bytes, 0, pages.pages[i].handle, 0);
      if (r != CUDA_SUCCESS) {
        undo();
        return absl::InvalidArgumentError(absl::StrCat(
            cuda::DriverError(r, "cuMemMap of the imported VMM allocation").message(),
            "; the registered size of page ", i, " (", pages.pages[i].bytes,
            " bytes) probably exceeds the allocation"));
      }
      mapped_pages_.push_back(pages.pages[i].bytes);
      offset += pages.pages[i].bytes;
    }
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (absl::Status s = CheckDriver(driver_.MemSetAccess(base_ + at, add, &access, 1),
                                     "cuMemSetAccess of the imported VMM allocation");
        !s.ok()) {
      undo();
      return s;
    }
    // Jobs read bytes() (JobExecutor's range check) on other threads: they see the pages mapped.
    bytes_.store(at + add, std::memory_order_release);
    return absl::OkStatus();
  }

  absl::Status Extend(BufferExtension& extension) override {
    if (segment_page_bytes_ == 0) {
      return absl::FailedPreconditionError(
          "only an expandable-segment registration (kCudaVmmSegment) can be extended");
    }
    const uint64_t now = bytes();
    if (extension.offset != now) {
      return absl::FailedPreconditionError(absl::StrCat(
          "extension at offset ", extension.offset, " of a segment registration of ", now,
          " bytes: pages are added at its end"));
    }
    if (extension.page_bytes != segment_page_bytes_) {
      return absl::InvalidArgumentError(absl::StrCat("extension with pages of ",
                                                     extension.page_bytes, " bytes; the segment's are ",
                                                     segment_page_bytes_));
    }
    cuda::DeviceGuard guard(device_);
    if (!guard.status().ok()) return guard.status();
    std::vector<uint64_t> sizes(extension.page_fds.size(), extension.page_bytes);
    absl::StatusOr<ImportedPages> pages =
        ImportPages(driver_, extension.page_fds, sizes, device_, gpu_);
    if (!pages.ok()) return pages.status();
    return Map(*pages);
  }

  char* base() const override { return reinterpret_cast<char*>(base_); }
  uint64_t bytes() const override { return bytes_.load(std::memory_order_acquire); }
  int device() const override { return device_; }

 private:
  const Driver& driver_;
  const CUdeviceptr base_;
  const uint64_t reserved_;
  const int device_;
  const uint64_t segment_page_bytes_;
  const std::string gpu_;
  std::atomic<uint64_t>& reserved_total_;
  std::atomic<uint64_t> bytes_{0};
  std::vector<uint64_t> mapped_pages_;  // the mapper's (one caller at a time), then the destructor
};

class CudaRuntime final : public GpuRuntime {
 public:
  explicit CudaRuntime(const Driver& driver) : driver_(driver) {}

  absl::string_view name() const override { return "cuda"; }

  absl::Status SetDevice(int device) override {
    return CheckRuntime(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")"));
  }

  absl::StatusOr<GpuStream> CreateStream(int device, bool high_priority) override {
    if (absl::Status s = SetDevice(device); !s.ok()) return s;
    cudaStream_t stream = nullptr;
    if (high_priority) {
      int least = 0;
      int greatest = 0;
      if (absl::Status s = CheckRuntime(cudaDeviceGetStreamPriorityRange(&least, &greatest),
                                        "cudaDeviceGetStreamPriorityRange");
          !s.ok()) {
        return s;
      }
      if (absl::Status s = CheckRuntime(
              cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest),
              "cudaStreamCreateWithPriority");
          !s.ok()) {
        return s;
      }
    } else if (absl::Status s = CheckRuntime(
                   cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags");
               !s.ok()) {
      return s;
    }
    return static_cast<GpuStream>(stream);
  }

  void DestroyStream(int device, GpuStream stream) override {
    // Returns at once; the driver frees the stream once its queued work is done.
    cuda::DeviceGuard guard(device);
    (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  }

  absl::StatusOr<bool> StreamDone(int, GpuStream stream) override {
    cudaError_t e = cudaStreamQuery(static_cast<cudaStream_t>(stream));
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) return false;
    return cuda::RuntimeError(e, "copy stream failed");
  }

  absl::Status WaitValue64(GpuStream stream, uint64_t addr, uint64_t value) override {
    return CheckDriver(driver_.StreamWaitValue64(static_cast<CUstream>(stream), addr, value,
                                                 CU_STREAM_WAIT_VALUE_GEQ),
                       "cuStreamWaitValue64");
  }

  absl::Status WriteValue64(GpuStream stream, uint64_t addr, uint64_t value) override {
    // The default flags order the write after every earlier operation of the stream, memory
    // writes of copies included (a fence): whoever sees the value sees the data.
    return CheckDriver(driver_.StreamWriteValue64(static_cast<CUstream>(stream), addr, value,
                                                  CU_STREAM_WRITE_VALUE_DEFAULT),
                       "cuStreamWriteValue64");
  }

  absl::Status CopyAsync(GpuStream stream, Direction direction, char* client, char* pool,
                         uint64_t len) override {
    cudaError_t e = direction == Direction::kToPool
                        ? cudaMemcpyAsync(pool, client, len, cudaMemcpyDefault,
                                          static_cast<cudaStream_t>(stream))
                        : cudaMemcpyAsync(client, pool, len, cudaMemcpyDefault,
                                          static_cast<cudaStream_t>(stream));
    return CheckRuntime(e, direction == Direction::kToPool ? "cudaMemcpyAsync D2H"
                                                           : "cudaMemcpyAsync H2D");
  }

  // One cudaMemcpyBatchAsync for the copies of a burst (CUDA 12.8 and newer): one driver call
  // and one submission for many small copies. Falls back to a cudaMemcpyAsync each, for good,
  // if the driver refuses it.
  absl::Status CopyBatchAsync(GpuStream stream, Direction direction,
                              absl::Span<const CopyOp> ops) override {
#if CUDART_VERSION >= 12080
    if (ops.size() > 1 && batch_copies_.load(std::memory_order_relaxed)) {
      absl::InlinedVector<void*, 32> dsts;
      absl::InlinedVector<const void*, 32> srcs;
      absl::InlinedVector<size_t, 32> sizes;
      for (const CopyOp& op : ops) {
        bool d2h = direction == Direction::kToPool;
        dsts.push_back(d2h ? op.pool : op.client);
        srcs.push_back(d2h ? op.client : op.pool);
        sizes.push_back(op.len);
      }
      cudaMemcpyAttributes attrs{};
      attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t first = 0;
      cudaError_t e = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), ops.size(),
                                           &attrs, &first, 1, static_cast<cudaStream_t>(stream));
      if (e == cudaSuccess) return absl::OkStatus();
      (void)cudaGetLastError();
      batch_copies_.store(false, std::memory_order_relaxed);
      LogWarning(CheckRuntime(e, "cudaMemcpyBatchAsync").message(),
                 "; copies of a batch go one cudaMemcpyAsync each from now on");
    }
#endif
    return GpuRuntime::CopyBatchAsync(stream, direction, ops);
  }

  absl::Status HostCopyAsync(GpuStream stream, char* dst, const char* src,
                             uint64_t len) override {
    auto* task = new HostCopyTask{dst, src, len};
    absl::Status s = CheckRuntime(
        cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), &HostCopyTask::Run, task),
        "cudaLaunchHostFunc");
    if (!s.ok()) delete task;
    return s;
  }

  absl::StatusOr<MappedHost> AllocMappedHost(uint64_t bytes) override {
    void* host = nullptr;
    if (absl::Status s = CheckRuntime(
            cudaHostAlloc(&host, bytes, cudaHostAllocPortable | cudaHostAllocMapped),
            "cudaHostAlloc of engine words");
        !s.ok()) {
      return s;
    }
    std::memset(host, 0, bytes);
    void* device = nullptr;
    if (absl::Status s = CheckRuntime(cudaHostGetDevicePointer(&device, host, 0),
                                      "cudaHostGetDevicePointer");
        !s.ok()) {
      (void)cudaFreeHost(host);
      return s;
    }
    return MappedHost{host, reinterpret_cast<uint64_t>(device)};
  }

  void FreeMappedHost(void* host) override { (void)cudaFreeHost(host); }

  absl::Status RegisterHost(char* base, uint64_t bytes) override {
    // Pinning the daemon's mmap'd pool is ~15x faster than cudaHostAlloc of the same size.
    return CheckRuntime(cudaHostRegister(base, bytes, cudaHostRegisterPortable),
                        absl::StrCat("cudaHostRegister of the ", bytes >> 20, " MiB host pool"));
  }

  absl::Status RegisterMappedHost(char* base, uint64_t bytes) override {
    return CheckRuntime(
        cudaHostRegister(base, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped),
        "cudaHostRegister of a session's ticket page");
  }

  absl::StatusOr<uint64_t> HostDeviceAddress(int device, char* host) override {
    cuda::DeviceGuard guard(device);
    if (!guard.status().ok()) return guard.status();
    void* address = nullptr;
    if (absl::Status s = CheckRuntime(cudaHostGetDevicePointer(&address, host, 0),
                                      "cudaHostGetDevicePointer of a session's ticket page");
        !s.ok()) {
      return s;
    }
    return reinterpret_cast<uint64_t>(address);
  }

  void UnregisterHost(char* base) override { (void)cudaHostUnregister(base); }

  absl::StatusOr<int> FindDevice(const BufferImport& import) override {
    std::optional<int> device = cuda::DeviceForUuid(import.device_uuid);
    if (!device) {
      return absl::FailedPreconditionError(absl::StrCat(
          "no GPU with UUID ", UuidText(import.device_uuid), " (the client's GPU ", import.device,
          ") is visible to tierd; check the daemon's CUDA_VISIBLE_DEVICES"));
    }
    return *device;
  }

  absl::StatusOr<std::unique_ptr<DeviceMapping>> Open(BufferImport& import) override {
    absl::StatusOr<int> device = FindDevice(import);
    if (!device.ok()) return device.status();
    if (import.bytes == 0) return absl::InvalidArgumentError("GPU buffer of 0 bytes");
    cuda::DeviceGuard guard(*device);
    if (!guard.status().ok()) return guard.status();
    if (import.kind == wire::BufferKind::kCudaVmmFd) {
      import.page_fds.clear();
      import.page_fds.push_back(std::move(import.fd));
      import.page_bytes = {import.bytes};
      return OpenVmm(import, *device);
    }
    if (import.kind == wire::BufferKind::kCudaVmmPages ||
        import.kind == wire::BufferKind::kCudaVmmSegment) {
      return OpenVmm(import, *device);
    }
    return OpenIpc(import, *device);
  }

 private:
  absl::StatusOr<std::unique_ptr<DeviceMapping>> OpenIpc(BufferImport& import, int device) {
    cudaIpcMemHandle_t handle;
    static_assert(sizeof(handle) == sizeof(import.ipc_handle));
    std::memcpy(&handle, import.ipc_handle.data(), sizeof(handle));
    void* ptr = nullptr;
    cudaError_t e = cudaIpcOpenMemHandle(&ptr, handle, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot open the CUDA IPC handle on GPU ", device, ": ", cudaGetErrorName(e), " (",
          cudaGetErrorString(e), "); the handle is malformed, or the process that exported it "
          "has exited or freed the memory"));
    }
    auto mapping = std::make_unique<IpcMapping>(static_cast<char*>(ptr), import.bytes, device);
    // The handle names its own GPU; make sure it is the one the client said (by UUID).
    cudaPointerAttributes attributes{};
    if (absl::Status s = CheckRuntime(cudaPointerGetAttributes(&attributes, ptr),
                                      "cudaPointerGetAttributes of the opened IPC memory");
        !s.ok()) {
      return s;
    }
    if (attributes.type != cudaMemoryTypeDevice || attributes.device != device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the CUDA IPC handle is for GPU ", attributes.device, " of tierd, but the client "
          "registered it for GPU ", device, " (", UuidText(import.device_uuid), ")"));
    }
    CUdeviceptr base = 0;
    size_t size = 0;
    if (absl::Status s = CheckDriver(driver_.MemGetAddressRange(&base, &size,
                                                                reinterpret_cast<CUdeviceptr>(ptr)),
                                     "cuMemGetAddressRange of the opened IPC memory");
        !s.ok()) {
      return s;
    }
    uint64_t end = static_cast<uint64_t>(base) + size;
    if (reinterpret_cast<uint64_t>(ptr) + import.bytes > end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the CUDA IPC allocation holds ", end - reinterpret_cast<uint64_t>(ptr),
          " bytes, fewer than the ", import.bytes, " registered"));
    }
    return mapping;
  }

  // VMM memory: one page (kCudaVmmFd), several mapped side by side (kCudaVmmPages, PyTorch's
  // expandable segments), or a segment that grows (kCudaVmmSegment). One VA reservation for them
  // all, each page imported from its fd and mapped at its offset, so a job may cross page
  // boundaries as it does in the client.
  absl::StatusOr<std::unique_ptr<DeviceMapping>> OpenVmm(BufferImport& import, int device) {
    const std::string gpu = UuidText(import.device_uuid);
    absl::StatusOr<ImportedPages> pages =
        ImportPages(driver_, import.page_fds, import.page_bytes, device, gpu);
    if (!pages.ok()) return pages.status();
    const bool segment = import.kind == wire::BufferKind::kCudaVmmSegment;
    // (The listener checked a segment's reservation: whole pages, at least its bytes.)
    const uint64_t reserved = segment ? std::max(import.reserve_bytes, import.bytes) : import.bytes;
    // Address space is tierd's, not the client's: a reservation may not exceed the GPU's memory
    // (no segment can hold more), and all of them together stay under kMaxReservedBytes (each
    // used to take up to 4 TiB of tierd's 128 TiB, counted nowhere: issue 30, finding 12).
    size_t free_bytes = 0, total_bytes = 0;
    if (absl::Status s = CheckRuntime(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
        !s.ok()) {
      return s;
    }
    const uint64_t bound = total_bytes + pages->granularity;  // the first page may stick out
    if (reserved > bound) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a VMM reservation of ", reserved, " bytes is larger than GPU ", device, "'s memory (",
          total_bytes, " bytes)"));
    }
    if (reserved_bytes_.fetch_add(reserved) + reserved > kMaxReservedBytes) {
      reserved_bytes_.fetch_sub(reserved);
      return absl::ResourceExhaustedError(absl::StrCat(
          "tierd has reserved ", reserved_bytes_.load() >> 30, " GiB of address space for "
          "clients' GPU memory, at most ", kMaxReservedBytes >> 30, " GiB: unregister buffers"));
    }
    if (reserved % pages->granularity != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a VMM reservation of ", reserved, " bytes is not a multiple of the ",
          pages->granularity, "-byte allocation granularity"));
    }
    CUdeviceptr va = 0;
    if (absl::Status s = CheckDriver(driver_.MemAddressReserve(&va, reserved, pages->granularity,
                                                               0, 0),
                                     "cuMemAddressReserve");
        !s.ok()) {
      reserved_bytes_.fetch_sub(reserved);
      return s;
    }
    // From here the mapping frees the reservation (and its count), and unmaps what it mapped.
    auto mapping = std::make_unique<VmmMapping>(driver_, va, reserved, device,
                                                segment ? import.page_bytes[0] : 0, gpu,
                                                reserved_bytes_);
    if (absl::Status s = mapping->Map(*pages); !s.ok()) return s;
    return mapping;
  }

  // Address space reserved for client memory (VMM imports) at most: a quarter of x86-64's 128 TiB
  // of user space, so clients cannot starve tierd of it.
  static constexpr uint64_t kMaxReservedBytes = uint64_t{32} << 40;

  const Driver& driver_;
  std::atomic<bool> batch_copies_{true};  // cudaMemcpyBatchAsync works here
  std::atomic<uint64_t> reserved_bytes_{0};
};

// Stream memory operations on the engine's mapped host words, once, before any session: a write
// from a stream must land in host memory, and a wait on host memory must pass. Neither step can
// hang: the wait targets a value the host wrote before it was queued.
absl::Status SelfTest(GpuRuntime& runtime, int device) {
  absl::StatusOr<MappedHost> words = runtime.AllocMappedHost(4096);
  if (!words.ok()) return words.status();
  auto* host = static_cast<uint64_t*>(words->host);
  host[8] = 7;  // read by the wait below
  absl::StatusOr<GpuStream> stream = runtime.CreateStream(device, false);
  if (!stream.ok()) {
    runtime.FreeMappedHost(words->host);
    return stream.status();
  }
  absl::Status s = runtime.WaitValue64(*stream, words->device_addr + 64, 7);
  if (s.ok()) s = runtime.WriteValue64(*stream, words->device_addr, 42);
  if (s.ok()) {
    s = CheckRuntime(cudaStreamSynchronize(static_cast<cudaStream_t>(*stream)),
                     "cudaStreamSynchronize");
  }
  if (s.ok() && std::atomic_ref<uint64_t>(host[0]).load() != 42) {
    s = absl::FailedPreconditionError(absl::StrCat(
        "GPU ", device, ": cuStreamWriteValue64 to mapped host memory did not land"));
  }
  runtime.DestroyStream(device, *stream);
  runtime.FreeMappedHost(words->host);
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CopyEngine>> MakeCudaEngine(const GpuEngineOptions& options) {
  // Before the first CUDA call: more hardware queues, so that a session stream blocked on its
  // client's ticket shares a queue with fewer other streams (streams beyond the queue count
  // share one, and a queue blocked by a wait delays everything behind it). Honours a value set
  // by the operator.
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
  int count = cuda::DeviceCount();
  if (count == 0) return absl::UnavailableError("no CUDA device (or no CUDA driver) found");
  absl::StatusOr<const Driver*> driver = cuda::GetDriver();
  if (!driver.ok()) return driver.status();
  auto runtime = std::make_unique<CudaRuntime>(**driver);
  for (int device = 0; device < count; ++device) {
    if (absl::Status s = cuda::CheckStreamMemOps(device); !s.ok()) return s;
    if (absl::Status s = runtime->SetDevice(device); !s.ok()) return s;
    if (absl::Status s = CheckRuntime(cudaFree(nullptr), "creating the CUDA context"); !s.ok()) {
      return s;
    }
    if (absl::Status s = SelfTest(*runtime, device); !s.ok()) return s;
  }
  LogInfo("cuda engine: ", count, " GPU(s), stream memory operations verified");
  return MakeStreamEngine(std::move(runtime), options);
}

}  // namespace tier::engine
