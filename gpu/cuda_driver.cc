#include "gpu/cuda_driver.h"

#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tier::gpu::cuda {
namespace {

absl::StatusCode RuntimeCode(cudaError_t error) {
  switch (error) {
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorMapBufferObjectFailed:
      return absl::StatusCode::kInvalidArgument;
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
      return absl::StatusCode::kUnavailable;
    case cudaErrorNotSupported:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::StatusCode DriverCode(CUresult result) {
  switch (result) {
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_INVALID_DEVICE:
      return absl::StatusCode::kInvalidArgument;
    case CUDA_ERROR_OUT_OF_MEMORY:
      return absl::StatusCode::kResourceExhausted;
    case CUDA_ERROR_NOT_PERMITTED:
      return absl::StatusCode::kPermissionDenied;
    case CUDA_ERROR_NOT_SUPPORTED:
      return absl::StatusCode::kFailedPrecondition;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

// The ABI version the typedefs in Driver correspond to.
constexpr unsigned int kDriverAbi = 12000;

template <typename Fn>
absl::Status Resolve(const char* symbol, Fn* fn) {
  void* pointer = nullptr;
  cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
  cudaError_t error =
      cudaGetDriverEntryPointByVersion(symbol, &pointer, kDriverAbi, cudaEnableDefault, &query);
  if (error != cudaSuccess) return RuntimeError(error, absl::StrCat("looking up ", symbol));
  if (pointer == nullptr || query != cudaDriverEntryPointSuccess) {
    return absl::UnavailableError(absl::StrCat("the CUDA driver has no ", symbol,
                                               " (driver older than CUDA 12.0?)"));
  }
  *fn = reinterpret_cast<Fn>(pointer);
  return absl::OkStatus();
}

absl::StatusOr<Driver> Load() {
  Driver d;
  absl::Status s;
  auto get = [&s](const char* symbol, auto* fn) {
    if (s.ok()) s = Resolve(symbol, fn);
  };
  get("cuGetErrorName", &d.GetErrorName);
  get("cuGetErrorString", &d.GetErrorString);
  get("cuDeviceGet", &d.DeviceGet);
  get("cuDeviceGetAttribute", &d.DeviceGetAttribute);
  get("cuStreamWaitValue64", &d.StreamWaitValue64);
  get("cuStreamWriteValue64", &d.StreamWriteValue64);
  get("cuMemGetAddressRange", &d.MemGetAddressRange);
  get("cuMemRetainAllocationHandle", &d.MemRetainAllocationHandle);
  get("cuMemGetAllocationPropertiesFromHandle", &d.MemGetAllocationPropertiesFromHandle);
  get("cuMemGetAllocationGranularity", &d.MemGetAllocationGranularity);
  get("cuMemExportToShareableHandle", &d.MemExportToShareableHandle);
  get("cuMemImportFromShareableHandle", &d.MemImportFromShareableHandle);
  get("cuMemAddressReserve", &d.MemAddressReserve);
  get("cuMemAddressFree", &d.MemAddressFree);
  get("cuMemMap", &d.MemMap);
  get("cuMemUnmap", &d.MemUnmap);
  get("cuMemSetAccess", &d.MemSetAccess);
  get("cuMemRelease", &d.MemRelease);
  get("cuMemCreate", &d.MemCreate);
  get("cuPointerGetAttribute", &d.PointerGetAttribute);
  if (!s.ok()) return s;
  return d;
}

}  // namespace

absl::StatusOr<const Driver*> GetDriver() {
  static const absl::StatusOr<Driver>* const driver = new absl::StatusOr<Driver>(Load());
  if (!driver->ok()) return driver->status();
  return &**driver;
}

absl::Status RuntimeError(cudaError_t error, absl::string_view what) {
  return absl::Status(RuntimeCode(error), absl::StrCat(what, ": ", cudaGetErrorName(error), " (",
                                                       cudaGetErrorString(error), ")"));
}

absl::Status DriverError(CUresult result, absl::string_view what) {
  const char* name = "CUDA_ERROR_UNKNOWN";
  const char* text = "unknown error";
  if (absl::StatusOr<const Driver*> d = GetDriver(); d.ok()) {
    (*d)->GetErrorName(result, &name);
    (*d)->GetErrorString(result, &text);
  }
  return absl::Status(DriverCode(result), absl::StrCat(what, ": ", name, " (", text, ")"));
}

int DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky; clear it for the caller
    return 0;
  }
  return count;
}

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

absl::StatusOr<std::string> PciBusId(int device) {
  char id[32] = {};  // "DDDDDDDD:BB:DD.F" and a NUL at most
  if (absl::Status s = CheckRuntime(cudaDeviceGetPCIBusId(id, sizeof(id), device),
                                    absl::StrCat("PCI bus id of GPU ", device));
      !s.ok()) {
    return s;
  }
  return std::string(id);
}

std::optional<int> DeviceForUuid(const std::array<uint8_t, 16>& uuid) {
  int count = DeviceCount();
  for (int device = 0; device < count; ++device) {
    absl::StatusOr<std::array<uint8_t, 16>> candidate = DeviceUuid(device);
    if (candidate.ok() && *candidate == uuid) return device;
  }
  return std::nullopt;
}

absl::Status CheckStreamMemOps(int device) {
  absl::StatusOr<const Driver*> d = GetDriver();
  if (!d.ok()) return d.status();
  CUdevice cu_device = 0;
  if (absl::Status s = CheckDriver((*d)->DeviceGet(&cu_device, device), "cuDeviceGet"); !s.ok()) {
    return s;
  }
  int supported = 0;
  if (absl::Status s = CheckDriver((*d)->DeviceGetAttribute(
                                       &supported, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
                                       cu_device),
                                   "cuDeviceGetAttribute(CAN_USE_64_BIT_STREAM_MEM_OPS)");
      !s.ok()) {
    return s;
  }
  if (supported == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GPU ", device, " does not support 64-bit stream memory operations "
        "(cuStreamWaitValue64/cuStreamWriteValue64), which Tierd's GPU-side ordering needs"));
  }
  return absl::OkStatus();
}

DeviceGuard::DeviceGuard(int device) {
  status_ = CheckRuntime(cudaGetDevice(&previous_), "cudaGetDevice");
  if (!status_.ok()) return;
  if (previous_ == device) {
    previous_ = -1;  // nothing to restore
    return;
  }
  status_ = CheckRuntime(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")"));
  if (!status_.ok()) previous_ = -1;
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

}  // namespace tier::gpu::cuda
