#include "gpu/cuda_driver.h"

#include "absl/strings/str_cat.h"
#include "gpu/runtime.h"

namespace tier::gpu::cuda {
namespace {

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

absl::Status DriverError(CUresult result, absl::string_view what) {
  const char* name = "CUDA_ERROR_UNKNOWN";
  const char* text = "unknown error";
  if (absl::StatusOr<const Driver*> d = GetDriver(); d.ok()) {
    (*d)->GetErrorName(result, &name);
    (*d)->GetErrorString(result, &text);
  }
  return absl::Status(DriverCode(result), absl::StrCat(what, ": ", name, " (", text, ")"));
}

}  // namespace tier::gpu::cuda
