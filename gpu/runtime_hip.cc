// gpu/runtime.h over HIP, the part that is not a renaming: the device UUID, and the stream memory
// operations and address ranges, which HIP has in its runtime API.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "gpu/runtime.h"

namespace tier::gpu {

const char kStreamWaitValue64Name[] = "hipStreamWaitValue64";
const char kStreamWriteValue64Name[] = "hipStreamWriteValue64";

absl::StatusOr<std::array<uint8_t, 16>> DeviceUuid(int ordinal) {
  hipDevice_t device = 0;
  if (absl::Status s = CheckRuntime(hipDeviceGet(&device, ordinal), "hipDeviceGet"); !s.ok()) {
    return s;
  }
  hipUUID uuid{};
  if (absl::Status s = CheckRuntime(hipDeviceGetUuid(&uuid, device), "hipDeviceGetUuid");
      !s.ok()) {
    return s;
  }
  std::array<uint8_t, 16> out{};
  static_assert(sizeof(uuid.bytes) == 16);
  std::memcpy(out.data(), uuid.bytes, out.size());
  return out;
}

absl::StatusOr<bool> StreamMemOpsSupported(int device) {
  int supported = 0;
  absl::Status s = CheckRuntime(
      hipDeviceGetAttribute(&supported, hipDeviceAttributeCanUseStreamWaitValue, device),
      "hipDeviceGetAttribute(CanUseStreamWaitValue)");
  if (!s.ok()) return s;
  return supported != 0;
}

absl::Status StreamWaitValue64(gpuStream_t stream, uint64_t address, uint64_t value) {
  return CheckRuntime(hipStreamWaitValue64(stream, reinterpret_cast<void*>(address), value,
                                           hipStreamWaitValueGte),
                      kStreamWaitValue64Name);
}

absl::Status StreamWriteValue64(gpuStream_t stream, uint64_t address, uint64_t value) {
  return CheckRuntime(
      hipStreamWriteValue64(stream, reinterpret_cast<void*>(address), value, /*flags=*/0),
      kStreamWriteValue64Name);
}

PointerInfo::Kind MemoryKind(const gpuPointerAttributes& attributes) {
  if (attributes.isManaged) return PointerInfo::Kind::kManaged;
  return attributes.memoryType == hipMemoryTypeDevice ? PointerInfo::Kind::kDevice
                                                      : PointerInfo::Kind::kOther;
}

absl::StatusOr<AddressRange> GetAddressRange(const void* ptr) {
  hipDeviceptr_t base = nullptr;
  size_t size = 0;
  if (absl::Status s = CheckRuntime(hipMemGetAddressRange(&base, &size, const_cast<void*>(ptr)),
                                    "hipMemGetAddressRange");
      !s.ok()) {
    return s;
  }
  return AddressRange{reinterpret_cast<uint64_t>(base), static_cast<uint64_t>(size)};
}

}  // namespace tier::gpu
