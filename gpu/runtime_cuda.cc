// gpu/runtime.h over CUDA, the part that is not a renaming: the device UUID from the device's
// properties, and the stream memory operations and address ranges through the driver API
// (gpu/cuda_driver.h).
#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu/cuda_driver.h"
#include "gpu/runtime.h"

namespace tier::gpu {

const char kStreamWaitValue64Name[] = "cuStreamWaitValue64";
const char kStreamWriteValue64Name[] = "cuStreamWriteValue64";

absl::StatusOr<std::array<uint8_t, 16>> DeviceUuid(int device) {
  static std::mutex mu;
  static std::vector<std::optional<std::array<uint8_t, 16>>> cache;
  std::lock_guard lock(mu);
  if (device >= 0 && static_cast<size_t>(device) < cache.size() && cache[device]) {
    return *cache[device];
  }
  cudaDeviceProp prop{};
  if (absl::Status s = CheckRuntime(cudaGetDeviceProperties(&prop, device),
                                    absl::StrCat("properties of GPU ", device));
      !s.ok()) {
    return s;
  }
  std::array<uint8_t, 16> uuid{};
  static_assert(sizeof(prop.uuid.bytes) == 16);
  std::memcpy(uuid.data(), prop.uuid.bytes, uuid.size());
  if (static_cast<size_t>(device) >= cache.size()) cache.resize(device + 1);
  cache[device] = uuid;
  return uuid;
}

absl::StatusOr<bool> StreamMemOpsSupported(int device) {
  absl::StatusOr<const cuda::Driver*> d = cuda::GetDriver();
  if (!d.ok()) return d.status();
  CUdevice cu_device = 0;
  if (absl::Status s = cuda::CheckDriver((*d)->DeviceGet(&cu_device, device), "cuDeviceGet");
      !s.ok()) {
    return s;
  }
  int supported = 0;
  if (absl::Status s = cuda::CheckDriver(
          (*d)->DeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
                                   cu_device),
          "cuDeviceGetAttribute(CAN_USE_64_BIT_STREAM_MEM_OPS)");
      !s.ok()) {
    return s;
  }
  return supported != 0;
}

absl::Status StreamWaitValue64(gpuStream_t stream, uint64_t address, uint64_t value) {
  absl::StatusOr<const cuda::Driver*> d = cuda::GetDriver();
  if (!d.ok()) return d.status();
  // A null stream is the driver's legacy NULL stream of the current context.
  return cuda::CheckDriver((*d)->StreamWaitValue64(static_cast<CUstream>(stream),
                                                   static_cast<CUdeviceptr>(address), value,
                                                   CU_STREAM_WAIT_VALUE_GEQ),
                           kStreamWaitValue64Name);
}

absl::Status StreamWriteValue64(gpuStream_t stream, uint64_t address, uint64_t value) {
  absl::StatusOr<const cuda::Driver*> d = cuda::GetDriver();
  if (!d.ok()) return d.status();
  // The default flags order the write after every earlier operation of the stream, memory writes
  // of copies included (a fence): whoever sees the value sees the data.
  return cuda::CheckDriver((*d)->StreamWriteValue64(static_cast<CUstream>(stream),
                                                    static_cast<CUdeviceptr>(address), value,
                                                    CU_STREAM_WRITE_VALUE_DEFAULT),
                           kStreamWriteValue64Name);
}

PointerInfo::Kind MemoryKind(const gpuPointerAttributes& attributes) {
  switch (attributes.type) {
    case cudaMemoryTypeDevice:
      return PointerInfo::Kind::kDevice;
    case cudaMemoryTypeManaged:
      return PointerInfo::Kind::kManaged;
    default:
      return PointerInfo::Kind::kOther;
  }
}

absl::StatusOr<AddressRange> GetAddressRange(const void* ptr) {
  absl::StatusOr<const cuda::Driver*> d = cuda::GetDriver();
  if (!d.ok()) return d.status();
  CUdeviceptr base = 0;
  size_t size = 0;
  if (absl::Status s = cuda::CheckDriver(
          (*d)->MemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(ptr)),
          "cuMemGetAddressRange");
      !s.ok()) {
    return s;
  }
  return AddressRange{static_cast<uint64_t>(base), static_cast<uint64_t>(size)};
}

}  // namespace tier::gpu
