// client_gpu.h, what only CUDA has (the rest is client_gpu_runtime.cc): the allocation id, and
// exporting VMM memory (cuMemCreate, e.g. PyTorch's expandable segments) as a POSIX fd, through
// the driver API (gpu/cuda_driver.h).
#include "absl/strings/str_cat.h"
#include "client/gpu/client_gpu.h"
#include "client/gpu/vmm_export.h"
#include "gpu/cuda_driver.h"
#include "gpu/runtime.h"

namespace tier::client::gpu {
namespace {

namespace cuda = ::tier::gpu::cuda;
using cuda::CheckDriver;
using cuda::Driver;

// The extent of the allocation `handle` around `ptr` within the address range out holds (the
// whole reservation, or on some drivers only this mapping), which may hold many physical
// allocations side by side (PyTorch's expandable segments map one per segment page): found by
// walking it in steps of the mapping granularity while the same allocation is mapped
// (cuMemRetainAllocationHandle returns the allocation's own handle, with a reference that
// cuMemRelease drops). The daemon maps exactly that allocation, at offset 0.
void FindAllocation(const Driver& d, CUmemGenericAllocationHandle handle, CUdeviceptr ptr,
                    size_t granularity, DeviceAllocation& out) {
  auto same = [&](CUdeviceptr at) {
    CUmemGenericAllocationHandle other = 0;
    if (d.MemRetainAllocationHandle(&other, reinterpret_cast<void*>(at)) != CUDA_SUCCESS) {
      return false;
    }
    (void)d.MemRelease(other);
    return other == handle;
  };
  const CUdeviceptr base = out.reservation_base;
  const CUdeviceptr range_end = base + out.reservation_bytes;
  CUdeviceptr lo = ptr - (ptr - base) % granularity;
  while (lo >= base + granularity && same(lo - granularity)) lo -= granularity;
  CUdeviceptr hi = lo + granularity;
  while (hi < range_end && same(hi)) hi += granularity;
  out.base = lo;
  out.bytes = hi - lo;
  out.offset = ptr - lo;
}

// The retained VMM allocation `handle` at `ptr` into `out`, as a POSIX fd.
absl::Status ExportRetained(const Driver& d, CUmemGenericAllocationHandle handle, CUdeviceptr ptr,
                            DeviceAllocation& out) {
  CUmemAllocationProp prop{};
  if (absl::Status s = CheckDriver(d.MemGetAllocationPropertiesFromHandle(&prop, handle),
                                   "cuMemGetAllocationPropertiesFromHandle");
      !s.ok()) {
    return s;
  }
  if ((prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
    return absl::InvalidArgumentError(
        "the VMM allocation was created without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in its "
        "requested handle types, so it cannot be shared with tierd");
  }
  size_t granularity = 0;
  if (absl::Status s = CheckDriver(
          d.MemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity");
      !s.ok()) {
    return s;
  }
  FindAllocation(d, handle, ptr, granularity, out);
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    out.device_memory_bytes = total_bytes;
  } else {
    (void)cudaGetLastError();
  }
  int fd = -1;
  if (absl::Status s = CheckDriver(
          d.MemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          "cuMemExportToShareableHandle");
      !s.ok()) {
    return s;
  }
  out.kind = wire::BufferKind::kCudaVmmFd;
  out.fd.reset(fd);
  return absl::OkStatus();
}

}  // namespace

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

absl::StatusOr<bool> ExportVmmAllocation(const void* device_ptr, DeviceAllocation* out) {
  absl::StatusOr<const Driver*> driver = cuda::GetDriver();
  if (!driver.ok()) return driver.status();
  const Driver& d = **driver;
  auto ptr = reinterpret_cast<CUdeviceptr>(device_ptr);
  CUmemGenericAllocationHandle handle = 0;
  if (d.MemRetainAllocationHandle(&handle, reinterpret_cast<void*>(ptr)) != CUDA_SUCCESS) {
    return false;  // not VMM memory (cuMemCreate + cuMemMap)
  }
  absl::Status s = ExportRetained(d, handle, ptr, *out);
  (void)d.MemRelease(handle);  // balances the retain
  if (!s.ok()) return s;
  return true;
}

}  // namespace tier::client::gpu
