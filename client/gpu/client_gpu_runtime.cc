// client_gpu.h over the runtime this build chose: written once over gpu/runtime_names.h and
// compiled for CUDA or for HIP; what only one of them has is in client_gpu_cuda.cc or
// client_gpu_hip.cc (vmm_export.h, AllocationId). Every call makes the pointer's GPU current for
// its duration and restores the caller's after (DeviceGuard). The tickets themselves are
// device_sync.cc over sync_runtime_gpu.cc.
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "client/gpu/client_gpu.h"
#include "client/gpu/vmm_export.h"
#include "gpu/runtime.h"

namespace tier::client::gpu {
namespace {

namespace rt = ::tier::gpu;

class GpuTicketPage final : public TicketPageRegistration {
 public:
  explicit GpuTicketPage(ring::TicketPage* page) : page_(page) {}
  ~GpuTicketPage() override { (void)gpuHostUnregister(page_); }

 private:
  ring::TicketPage* page_;
};

// The device memory at `device_ptr`: its GPU, or why it cannot be registered.
absl::StatusOr<int> DeviceOf(const void* device_ptr) {
  absl::StatusOr<rt::PointerInfo> info = rt::GetPointerInfo(device_ptr);
  if (!info.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a " TIER_GPU_TITLE " pointer: ", info.status().message()));
  }
  if (info->kind != rt::PointerInfo::Kind::kDevice) {
    return absl::InvalidArgumentError(
        info->kind == rt::PointerInfo::Kind::kManaged
            ? "managed memory cannot be registered; use device memory"
            : "the pointer is not device memory (host or unregistered memory)");
  }
  return info->device;
}

// A legacy IPC handle of the allocation at out.base.
absl::Status ExportIpc(DeviceAllocation& out) {
  gpuIpcMemHandle_t ipc;
  gpuError_t e = gpuIpcGetMemHandle(&ipc, reinterpret_cast<void*>(out.base));
  if (e != gpuSuccess) {
    (void)gpuGetLastError();
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot export the allocation with " TIER_GPU_FN(IpcGetMemHandle) ": ",
        gpuGetErrorName(e),
        " (memory from stream-ordered pools, " TIER_GPU_FN(MallocAsync) ", cannot be shared "
        "this way)"));
  }
  out.kind = wire::BufferKind::kCudaIpc;
  static_assert(sizeof(ipc) == sizeof(out.ipc_handle));
  std::memcpy(out.ipc_handle.data(), &ipc, sizeof(ipc));
  return absl::OkStatus();
}

}  // namespace

int GpuDeviceCount() { return rt::DeviceCount(); }

absl::StatusOr<std::string> GpuPciBusId(int device) { return rt::PciBusId(device); }

absl::StatusOr<DeviceAllocation> ExportDeviceAllocation(const void* device_ptr) {
  if (device_ptr == nullptr) return absl::InvalidArgumentError("null device pointer");
  absl::StatusOr<int> device = DeviceOf(device_ptr);
  if (!device.ok()) return device.status();
  rt::DeviceGuard guard(*device);
  if (!guard.status().ok()) return guard.status();

  DeviceAllocation out;
  out.device = *device;
  absl::StatusOr<std::array<uint8_t, 16>> uuid = rt::DeviceUuid(*device);
  if (!uuid.ok()) return uuid.status();
  out.device_uuid = *uuid;
  absl::StatusOr<rt::AddressRange> range = rt::GetAddressRange(device_ptr);
  if (!range.ok()) return range.status();
  out.base = range->base;
  out.bytes = range->bytes;
  out.offset = reinterpret_cast<uint64_t>(device_ptr) - range->base;
  out.reservation_base = range->base;
  out.reservation_bytes = range->bytes;

  absl::StatusOr<bool> vmm = ExportVmmAllocation(device_ptr, &out);
  if (!vmm.ok()) return vmm.status();
  if (*vmm) return out;
  if (absl::Status s = ExportIpc(out); !s.ok()) return s;
  return out;
}

absl::StatusOr<std::unique_ptr<TicketPageRegistration>> RegisterTicketPage(ring::TicketPage* page) {
  if (rt::DeviceCount() == 0) {
    return absl::UnavailableError("no " TIER_GPU_TITLE " device (or no " TIER_GPU_DRIVER ") found");
  }
  // Mapped: streams write it (stream memory operations); portable: for every GPU's context.
  if (absl::Status s = rt::CheckRuntime(
          gpuHostRegister(page, sizeof(*page), gpuHostRegisterPortable | gpuHostRegisterMapped),
          TIER_GPU_FN(HostRegister) " of the session's ticket page");
      !s.ok()) {
    return s;
  }
  return std::make_unique<GpuTicketPage>(page);
}

}  // namespace tier::client::gpu
