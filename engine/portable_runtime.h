// GpuRuntime (engine/gpu_runtime.h) written once for CUDA and HIP over gpu/runtime_names.h, and
// compiled for the runtime this build chose: streams, copies, stream memory operations, pinned
// and mapped host memory, finding a client's GPU, opening its IPC memory, and the engine's start
// (each GPU checked, then the stream engine over the runtime). What differs in more than a name
// is in the runtime's own small file, through the virtual calls below: cuda_engine.cc (batched
// copies, host functions, VMM imports: cuda_vmm.h, the context) and hip_engine.cc (host
// callbacks; no VMM imports).
#ifndef TIER_ENGINE_PORTABLE_RUNTIME_H_
#define TIER_ENGINE_PORTABLE_RUNTIME_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/copy_engine.h"
#include "engine/gpu_runtime.h"
#include "tier/session_wire.h"

namespace tier::engine {

class PortableRuntime : public GpuRuntime {
 public:
  absl::string_view name() const override;
  absl::Status SetDevice(int device) override;
  absl::StatusOr<GpuStream> CreateStream(int device, bool high_priority) override;
  void DestroyStream(int device, GpuStream stream) override;
  absl::StatusOr<bool> StreamDone(int device, GpuStream stream) override;
  absl::Status WaitValue64(GpuStream stream, uint64_t addr, uint64_t value) override;
  absl::Status WriteValue64(GpuStream stream, uint64_t addr, uint64_t value) override;
  absl::Status CopyAsync(GpuStream stream, Direction direction, char* client, char* pool,
                         uint64_t len) override;
  absl::Status HostCopyAsync(GpuStream stream, char* dst, const char* src, uint64_t len) final;
  absl::StatusOr<MappedHost> AllocMappedHost(uint64_t bytes) override;
  void FreeMappedHost(void* host) override;
  absl::Status RegisterHost(char* base, uint64_t bytes) override;
  absl::Status RegisterMappedHost(char* base, uint64_t bytes) override;
  absl::StatusOr<uint64_t> HostDeviceAddress(int device, char* host) override;
  void UnregisterHost(char* base) override;
  absl::StatusOr<int> FindDevice(const BufferImport& import) override;
  // IPC memory here; VMM memory through OpenVmm, with `import`'s GPU current.
  absl::StatusOr<std::unique_ptr<DeviceMapping>> Open(BufferImport& import) final;

  // Start-up work on each GPU before the engine's self-test (CUDA: create the context).
  virtual absl::Status InitDevice(int device);

 protected:
  // Queues `task` on the stream for the runtime's host-function thread (HostCopyTask::Run).
  virtual absl::Status EnqueueHostCopy(GpuStream stream, HostCopyTask* task) = 0;
  // OK where this runtime can import memory of `kind`; checked first.
  virtual absl::Status CanImport(wire::BufferKind kind) const;
  // kCudaVmmFd, kCudaVmmPages, kCudaVmmSegment on `device` (current).
  virtual absl::StatusOr<std::unique_ptr<DeviceMapping>> OpenVmm(BufferImport& import,
                                                                 int device);

 private:
  absl::StatusOr<std::unique_ptr<DeviceMapping>> OpenIpc(BufferImport& import, int device);
};

// The client's GPU as tierd names it in messages ("GPU-xxxxxxxx-xxxx-...").
std::string UuidText(const std::array<uint8_t, 16>& uuid);

// Checks every GPU (stream memory operations, InitDevice, a self-test of them on mapped host
// memory), then starts the stream engine (engine/stream_engine.h) over `runtime`.
absl::StatusOr<std::unique_ptr<CopyEngine>> StartEngine(std::unique_ptr<PortableRuntime> runtime,
                                                        const GpuEngineOptions& options);

}  // namespace tier::engine

#endif  // TIER_ENGINE_PORTABLE_RUNTIME_H_
