// gpu/runtime.h, the part that reads the same on CUDA and HIP (compiled for either).
#include "gpu/runtime.h"

#include "absl/strings/str_cat.h"

namespace tier::gpu {
namespace {

absl::StatusCode RuntimeCode(gpuError_t error) {
  switch (error) {
    case gpuErrorInvalidValue:
    case gpuErrorInvalidDevicePointer:
    case gpuErrorInvalidResourceHandle:
    case gpuErrorMapBufferObjectFailed:
      return absl::StatusCode::kInvalidArgument;
    case gpuErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case gpuErrorNoDevice:
    case gpuErrorInsufficientDriver:
#if defined(TIER_HAVE_CUDA)
    case cudaErrorDevicesUnavailable:  // HIP has no such error
#endif
      return absl::StatusCode::kUnavailable;
    case gpuErrorNotSupported:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::Status RuntimeError(gpuError_t error, absl::string_view what) {
  return absl::Status(RuntimeCode(error), absl::StrCat(what, ": ", gpuGetErrorName(error), " (",
                                                       gpuGetErrorString(error), ")"));
}

int DeviceCount() {
  int count = 0;
  if (gpuGetDeviceCount(&count) != gpuSuccess) {
    (void)gpuGetLastError();  // not sticky; clear it for the caller
    return 0;
  }
  return count;
}

std::optional<int> DeviceForUuid(const std::array<uint8_t, 16>& uuid) {
  int count = DeviceCount();
  for (int device = 0; device < count; ++device) {
    absl::StatusOr<std::array<uint8_t, 16>> candidate = DeviceUuid(device);
    if (candidate.ok() && *candidate == uuid) return device;
  }
  return std::nullopt;
}

absl::StatusOr<std::string> PciBusId(int device) {
  char id[32] = {};  // "DDDDDDDD:BB:DD.F" and a NUL at most
  if (absl::Status s = CheckRuntime(gpuDeviceGetPCIBusId(id, sizeof(id), device),
                                    absl::StrCat("PCI bus id of GPU ", device));
      !s.ok()) {
    return s;
  }
  return std::string(id);
}

absl::StatusOr<PointerInfo> GetPointerInfo(const void* ptr) {
  gpuPointerAttributes attributes{};
  gpuError_t e = gpuPointerGetAttributes(&attributes, ptr);
  if (e != gpuSuccess) {
    (void)gpuGetLastError();  // not sticky: the process's next call must not see it
    return RuntimeError(e, TIER_GPU_FN(PointerGetAttributes));
  }
  return PointerInfo{MemoryKind(attributes), attributes.device};
}

absl::StatusOr<uint64_t> HostDeviceAddress(void* host, absl::string_view what) {
  void* address = nullptr;
  if (absl::Status s = CheckRuntime(gpuHostGetDevicePointer(&address, host, 0),
                                    absl::StrCat(TIER_GPU_FN(HostGetDevicePointer), " of ", what));
      !s.ok()) {
    return s;
  }
  return reinterpret_cast<uint64_t>(address);
}

absl::Status CheckStreamMemOps(int device) {
  absl::StatusOr<bool> supported = StreamMemOpsSupported(device);
  if (!supported.ok()) return supported.status();
  if (!*supported) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GPU ", device, " does not support 64-bit stream memory operations (",
        kStreamWaitValue64Name, "/", kStreamWriteValue64Name,
        "), which Tierd's GPU-side ordering needs"));
  }
  return absl::OkStatus();
}

DeviceGuard::DeviceGuard(int device) {
  status_ = CheckRuntime(gpuGetDevice(&previous_), TIER_GPU_FN(GetDevice));
  if (!status_.ok()) return;
  if (previous_ == device) {
    previous_ = -1;  // nothing to restore
    return;
  }
  status_ =
      CheckRuntime(gpuSetDevice(device), absl::StrCat(TIER_GPU_FN(SetDevice), "(", device, ")"));
  if (!status_.ok()) previous_ = -1;
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)gpuSetDevice(previous_);
}

}  // namespace tier::gpu
