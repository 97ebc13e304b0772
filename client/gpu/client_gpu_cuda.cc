// client_gpu.h over CUDA: exporting allocations and registering the ticket page. Every call
// makes the pointer's GPU current for its duration and restores the caller's after (DeviceGuard).
// The tickets themselves are device_sync.cc over sync_runtime_cuda.cc.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/gpu/client_gpu.h"
#include "gpu/cuda_driver.h"

namespace tier::client::gpu {

namespace cuda = ::tier::gpu::cuda;
namespace {

using cuda::CheckDriver;
using cuda::CheckRuntime;
using cuda::Driver;

class CudaTicketPage final : public TicketPageRegistration {
 public:
  explicit CudaTicketPage(ring::TicketPage* page) : page_(page) {}
  ~CudaTicketPage() override { (void)cudaHostUnregister(page_); }

 private:
  ring::TicketPage* page_;
};

}  // namespace

int GpuDeviceCount() { return cuda::DeviceCount(); }

absl::StatusOr<std::string> GpuPciBusId(int device) { return cuda::PciBusId(device); }

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
  out.reservation_base = base;
  out.reservation_bytes = size;

  // VMM memory (cuMemCreate + cuMemMap). cuMemGetAddressRange gave the VA range around it (the
  // whole reservation, or on some drivers only this mapping),
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
      size_t free_bytes = 0, total_bytes = 0;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
        out.device_memory_bytes = total_bytes;
      } else {
        (void)cudaGetLastError();
      }
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

}  // namespace tier::client::gpu
