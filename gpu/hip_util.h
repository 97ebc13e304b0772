// HIP helpers shared by the HIP engine and the HIP client layer (header only).
#ifndef TIER_GPU_HIP_UTIL_H_
#define TIER_GPU_HIP_UTIL_H_

#include <hip/hip_runtime_api.h>

#include <array>
#include <cstring>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tier::gpu::hip {

inline absl::Status HipError(hipError_t error, absl::string_view what) {
  absl::StatusCode code = absl::StatusCode::kInternal;
  switch (error) {
    case hipErrorInvalidValue:
    case hipErrorInvalidDevicePointer:
    case hipErrorInvalidResourceHandle:
    case hipErrorMapFailed:
      code = absl::StatusCode::kInvalidArgument;
      break;
    case hipErrorOutOfMemory:
      code = absl::StatusCode::kResourceExhausted;
      break;
    case hipErrorNoDevice:
    case hipErrorInsufficientDriver:
      code = absl::StatusCode::kUnavailable;
      break;
    case hipErrorNotSupported:
      code = absl::StatusCode::kFailedPrecondition;
      break;
    default:
      break;
  }
  return absl::Status(code, absl::StrCat(what, ": ", hipGetErrorName(error), " (",
                                         hipGetErrorString(error), ")"));
}

inline absl::Status CheckHip(hipError_t error, absl::string_view what) {
  return error == hipSuccess ? absl::OkStatus() : HipError(error, what);
}

inline int DeviceCount() {
  int count = 0;
  if (hipGetDeviceCount(&count) != hipSuccess) {
    (void)hipGetLastError();
    return 0;
  }
  return count;
}

inline absl::StatusOr<std::array<uint8_t, 16>> DeviceUuid(int ordinal) {
  hipDevice_t device = 0;
  if (absl::Status s = CheckHip(hipDeviceGet(&device, ordinal), "hipDeviceGet"); !s.ok()) return s;
  hipUUID uuid{};
  if (absl::Status s = CheckHip(hipDeviceGetUuid(&uuid, device), "hipDeviceGetUuid"); !s.ok()) {
    return s;
  }
  std::array<uint8_t, 16> out{};
  static_assert(sizeof(uuid.bytes) == 16);
  std::memcpy(out.data(), uuid.bytes, out.size());
  return out;
}

// The device's PCI bus id as the runtime writes it ("0000:3b:00.0").
inline absl::StatusOr<std::string> PciBusId(int ordinal) {
  char id[32] = {};
  if (absl::Status s = CheckHip(hipDeviceGetPCIBusId(id, sizeof(id), ordinal),
                                absl::StrCat("PCI bus id of GPU ", ordinal));
      !s.ok()) {
    return s;
  }
  return std::string(id);
}

inline std::optional<int> DeviceForUuid(const std::array<uint8_t, 16>& uuid) {
  int count = DeviceCount();
  for (int device = 0; device < count; ++device) {
    absl::StatusOr<std::array<uint8_t, 16>> candidate = DeviceUuid(device);
    if (candidate.ok() && *candidate == uuid) return device;
  }
  return std::nullopt;
}

inline absl::Status CheckStreamMemOps(int device) {
  int supported = 0;
  if (absl::Status s = CheckHip(
          hipDeviceGetAttribute(&supported, hipDeviceAttributeCanUseStreamWaitValue, device),
          "hipDeviceGetAttribute(CanUseStreamWaitValue)");
      !s.ok()) {
    return s;
  }
  if (supported == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GPU ", device, " does not support hipStreamWaitValue64/hipStreamWriteValue64, which "
        "Tierd's GPU-side ordering needs"));
  }
  return absl::OkStatus();
}

// Makes `device` current for the scope; restores the caller's device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    status_ = CheckHip(hipGetDevice(&previous_), "hipGetDevice");
    if (!status_.ok()) return;
    if (previous_ == device) {
      previous_ = -1;
      return;
    }
    status_ = CheckHip(hipSetDevice(device), "hipSetDevice");
    if (!status_.ok()) previous_ = -1;
  }
  ~DeviceGuard() {
    if (previous_ >= 0) (void)hipSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

}  // namespace tier::gpu::hip

#endif  // TIER_GPU_HIP_UTIL_H_
