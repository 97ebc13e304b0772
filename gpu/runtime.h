// The GPU runtime as the daemon's engine (engine/) and the client's GPU layer (client/gpu/) use
// it, written once for CUDA and HIP over gpu/runtime_names.h and compiled for the runtime this
// build chose (tier_gpu_runtime). runtime.cc holds what reads the same on both; what does not
// is in runtime_cuda.cc (the CUDA driver API, through gpu/cuda_driver.h) and runtime_hip.cc.
#ifndef TIER_GPU_RUNTIME_H_
#define TIER_GPU_RUNTIME_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gpu/runtime_names.h"

namespace tier::gpu {

// ---- runtime.cc ----

// "what: cudaErrorX (description)" with a fitting canonical code; clears nothing.
absl::Status RuntimeError(gpuError_t error, absl::string_view what);
inline absl::Status CheckRuntime(gpuError_t error, absl::string_view what) {
  return error == gpuSuccess ? absl::OkStatus() : RuntimeError(error, what);
}

// The address at which the current GPU's streams reach registered, mapped host memory; `what`
// names the memory in an error.
absl::StatusOr<uint64_t> HostDeviceAddress(void* host, absl::string_view what);

// Number of devices; 0 when there is no device or no driver.
int DeviceCount();

// This process's ordinal of the GPU with `uuid`, or nullopt.
std::optional<int> DeviceForUuid(const std::array<uint8_t, 16>& uuid);

// The device's PCI bus id as the runtime writes it ("0000:3B:00.0").
absl::StatusOr<std::string> PciBusId(int device);

// FAILED_PRECONDITION unless `device` supports 64-bit stream memory operations (wait/write).
absl::Status CheckStreamMemOps(int device);

// Makes `device` current for the scope and restores the caller's device after: library code must
// not change the current device of an application thread.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

// ---- runtime_cuda.cc, runtime_hip.cc ----

// The runtime's functions for the stream memory operations below, for messages.
extern const char kStreamWaitValue64Name[];
extern const char kStreamWriteValue64Name[];

// The device's UUID.
absl::StatusOr<std::array<uint8_t, 16>> DeviceUuid(int device);

// Whether `device` can wait on and write 64-bit words from its streams (an error: cannot tell).
absl::StatusOr<bool> StreamMemOpsSupported(int device);

// Stream memory operations on a 64-bit word at a GPU address (device memory, or registered and
// mapped host memory). The wait passes once the word is >= `value` (the runtime's cyclic
// compare); the write is ordered after everything queued on the stream before it, memory writes
// of copies included. A null stream is the legacy default stream of the current GPU.
absl::Status StreamWaitValue64(gpuStream_t stream, uint64_t address, uint64_t value);
absl::Status StreamWriteValue64(gpuStream_t stream, uint64_t address, uint64_t value);

// What kind of memory a pointer is, and on which GPU. GetPointerInfo (runtime.cc) fails with the
// runtime's error, cleared so that the process's next call does not see it, when the runtime does
// not know the pointer; MemoryKind reads the runtime's attributes (their fields differ).
struct PointerInfo {
  enum class Kind { kDevice, kManaged, kOther };
  Kind kind = Kind::kOther;
  int device = -1;
};
absl::StatusOr<PointerInfo> GetPointerInfo(const void* ptr);
PointerInfo::Kind MemoryKind(const gpuPointerAttributes& attributes);

// The allocation (or the address reservation) the runtime says `ptr` lies in.
struct AddressRange {
  uint64_t base = 0;
  uint64_t bytes = 0;
};
absl::StatusOr<AddressRange> GetAddressRange(const void* ptr);

}  // namespace tier::gpu

#endif  // TIER_GPU_RUNTIME_H_
