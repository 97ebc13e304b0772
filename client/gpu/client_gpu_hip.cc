// client_gpu.h over HIP. Same design as client_gpu_cuda.cc; HIP has no VMM export here, so only
// hipMalloc memory (legacy IPC handles) can be registered.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/gpu/client_gpu.h"
#include "gpu/hip_util.h"

namespace tier::client::gpu {

namespace hip = ::tier::gpu::hip;
namespace {

using hip::CheckHip;

class HipTicketPage final : public TicketPageRegistration {
 public:
  explicit HipTicketPage(ring::TicketPage* page) : page_(page) {}
  ~HipTicketPage() override { (void)hipHostUnregister(page_); }

 private:
  ring::TicketPage* page_;
};

}  // namespace

int GpuDeviceCount() { return hip::DeviceCount(); }

absl::StatusOr<std::string> GpuPciBusId(int device) { return hip::PciBusId(device); }

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
  out.reservation_base = out.base;
  out.reservation_bytes = size;
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

}  // namespace tier::client::gpu
