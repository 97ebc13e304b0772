#include "engine/hip_engine.h"

#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "gpu/hip_util.h"
#include "engine/stream_engine.h"

namespace tier::engine {

namespace hip = ::tier::gpu::hip;
namespace {

using hip::CheckHip;

class HipIpcMapping final : public DeviceMapping {
 public:
  HipIpcMapping(char* base, uint64_t bytes, int device) : base_(base), bytes_(bytes), device_(device) {}
  ~HipIpcMapping() override {
    hip::DeviceGuard guard(device_);
    if (hipError_t e = hipIpcCloseMemHandle(base_); e != hipSuccess) {
      LogWarning(hip::HipError(e, "hipIpcCloseMemHandle").message());
    }
  }
  char* base() const override { return base_; }
  uint64_t bytes() const override { return bytes_; }
  int device() const override { return device_; }

 private:
  char* base_;
  uint64_t bytes_;
  int device_;
};

class HipRuntime final : public GpuRuntime {
 public:
  absl::string_view name() const override { return "hip"; }

  absl::Status SetDevice(int device) override {
    return CheckHip(hipSetDevice(device), absl::StrCat("hipSetDevice(", device, ")"));
  }

  absl::StatusOr<GpuStream> CreateStream(int device, bool high_priority) override {
    if (absl::Status s = SetDevice(device); !s.ok()) return s;
    hipStream_t stream = nullptr;
    if (high_priority) {
      int least = 0;
      int greatest = 0;
      (void)hipDeviceGetStreamPriorityRange(&least, &greatest);
      if (absl::Status s = CheckHip(
              hipStreamCreateWithPriority(&stream, hipStreamNonBlocking, greatest),
              "hipStreamCreateWithPriority");
          !s.ok()) {
        return s;
      }
    } else if (absl::Status s = CheckHip(hipStreamCreateWithFlags(&stream, hipStreamNonBlocking),
                                         "hipStreamCreateWithFlags");
               !s.ok()) {
      return s;
    }
    return static_cast<GpuStream>(stream);
  }

  void DestroyStream(int device, GpuStream stream) override {
    hip::DeviceGuard guard(device);
    (void)hipStreamDestroy(static_cast<hipStream_t>(stream));
  }

  absl::StatusOr<bool> StreamDone(int, GpuStream stream) override {
    hipError_t e = hipStreamQuery(static_cast<hipStream_t>(stream));
    if (e == hipSuccess) return true;
    if (e == hipErrorNotReady) return false;
    return hip::HipError(e, "copy stream failed");
  }

  absl::Status WaitValue64(GpuStream stream, uint64_t addr, uint64_t value) override {
    return CheckHip(hipStreamWaitValue64(static_cast<hipStream_t>(stream),
                                         reinterpret_cast<void*>(addr), value,
                                         hipStreamWaitValueGte),
                    "hipStreamWaitValue64");
  }

  absl::Status WriteValue64(GpuStream stream, uint64_t addr, uint64_t value) override {
    return CheckHip(hipStreamWriteValue64(static_cast<hipStream_t>(stream),
                                          reinterpret_cast<void*>(addr), value, 0),
                    "hipStreamWriteValue64");
  }

  absl::Status CopyAsync(GpuStream stream, Direction direction, char* client, char* pool,
                         uint64_t len) override {
    hipError_t e = direction == Direction::kToPool
                       ? hipMemcpyAsync(pool, client, len, hipMemcpyDefault,
                                        static_cast<hipStream_t>(stream))
                       : hipMemcpyAsync(client, pool, len, hipMemcpyDefault,
                                        static_cast<hipStream_t>(stream));
    return CheckHip(e, "hipMemcpyAsync");
  }

  absl::Status HostCopyAsync(GpuStream stream, char* dst, const char* src,
                             uint64_t len) override {
    auto* task = new HostCopyTask{dst, src, len};
    // hipStreamAddCallback, not hipLaunchHostFunc: the HIP runtime Debian ships (5.2) declares
    // the latter but does not export it. The callback runs in stream order either way.
    auto run = [](hipStream_t, hipError_t, void* arg) { HostCopyTask::Run(arg); };
    absl::Status s = CheckHip(
        hipStreamAddCallback(static_cast<hipStream_t>(stream), run, task, 0), "hipStreamAddCallback");
    if (!s.ok()) delete task;
    return s;
  }

  absl::StatusOr<MappedHost> AllocMappedHost(uint64_t bytes) override {
    void* host = nullptr;
    if (absl::Status s = CheckHip(
            hipHostMalloc(&host, bytes, hipHostMallocPortable | hipHostMallocMapped),
            "hipHostMalloc of engine words");
        !s.ok()) {
      return s;
    }
    std::memset(host, 0, bytes);
    void* device = nullptr;
    if (absl::Status s = CheckHip(hipHostGetDevicePointer(&device, host, 0),
                                  "hipHostGetDevicePointer");
        !s.ok()) {
      (void)hipHostFree(host);
      return s;
    }
    return MappedHost{host, reinterpret_cast<uint64_t>(device)};
  }

  void FreeMappedHost(void* host) override { (void)hipHostFree(host); }

  absl::Status RegisterHost(char* base, uint64_t bytes) override {
    return CheckHip(hipHostRegister(base, bytes, hipHostRegisterPortable),
                    absl::StrCat("hipHostRegister of the ", bytes >> 20, " MiB host pool"));
  }

  absl::Status RegisterMappedHost(char* base, uint64_t bytes) override {
    return CheckHip(
        hipHostRegister(base, bytes, hipHostRegisterPortable | hipHostRegisterMapped),
        "hipHostRegister of a session's ticket page");
  }

  absl::StatusOr<uint64_t> HostDeviceAddress(int device, char* host) override {
    hip::DeviceGuard guard(device);
    if (!guard.status().ok()) return guard.status();
    void* address = nullptr;
    if (absl::Status s = CheckHip(hipHostGetDevicePointer(&address, host, 0),
                                  "hipHostGetDevicePointer of a session's ticket page");
        !s.ok()) {
      return s;
    }
    return reinterpret_cast<uint64_t>(address);
  }

  void UnregisterHost(char* base) override { (void)hipHostUnregister(base); }

  absl::StatusOr<int> FindDevice(const BufferImport& import) override {
    std::optional<int> device = hip::DeviceForUuid(import.device_uuid);
    if (!device) {
      return absl::FailedPreconditionError(absl::StrCat(
          "no GPU with the client's UUID (its GPU ", import.device,
          ") is visible to tierd; check the daemon's HIP_VISIBLE_DEVICES"));
    }
    return *device;
  }

  absl::StatusOr<std::unique_ptr<DeviceMapping>> Open(BufferImport& import) override {
    if (import.kind == wire::BufferKind::kCudaVmmFd ||
        import.kind == wire::BufferKind::kCudaVmmPages ||
        import.kind == wire::BufferKind::kCudaVmmSegment) {
      return absl::UnimplementedError(
          "the HIP engine cannot import VMM (fd) allocations: this HIP has no "
          "hipMemImportFromShareableHandle; register hipMalloc memory");
    }
    absl::StatusOr<int> device = FindDevice(import);
    if (!device.ok()) return device.status();
    if (import.bytes == 0) return absl::InvalidArgumentError("GPU buffer of 0 bytes");
    hip::DeviceGuard guard(*device);
    if (!guard.status().ok()) return guard.status();
    hipIpcMemHandle_t handle;
    static_assert(sizeof(handle) == sizeof(import.ipc_handle));
    std::memcpy(&handle, import.ipc_handle.data(), sizeof(handle));
    void* ptr = nullptr;
    hipError_t e = hipIpcOpenMemHandle(&ptr, handle, hipIpcMemLazyEnablePeerAccess);
    if (e != hipSuccess) {
      (void)hipGetLastError();
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot open the HIP IPC handle on GPU ", *device, ": ", hipGetErrorName(e),
          "; the handle is malformed, or the process that exported it has exited or freed the "
          "memory"));
    }
    auto mapping = std::make_unique<HipIpcMapping>(static_cast<char*>(ptr), import.bytes, *device);
    hipPointerAttribute_t attributes{};
    if (absl::Status s = CheckHip(hipPointerGetAttributes(&attributes, ptr),
                                  "hipPointerGetAttributes of the opened IPC memory");
        !s.ok()) {
      return s;
    }
    if (attributes.device != *device) {
      return absl::InvalidArgumentError(absl::StrCat("the HIP IPC handle is for GPU ",
                                                     attributes.device, " of tierd, not GPU ",
                                                     *device, " the client named"));
    }
    hipDeviceptr_t base = nullptr;
    size_t size = 0;
    if (absl::Status s = CheckHip(hipMemGetAddressRange(&base, &size, ptr), "hipMemGetAddressRange");
        !s.ok()) {
      return s;
    }
    uint64_t end = reinterpret_cast<uint64_t>(base) + size;
    if (reinterpret_cast<uint64_t>(ptr) + import.bytes > end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the HIP IPC allocation holds ", end - reinterpret_cast<uint64_t>(ptr),
          " bytes, fewer than the ", import.bytes, " registered"));
    }
    return mapping;
  }
};

// As the CUDA engine's: stream memory operations on mapped host words must work.
absl::Status SelfTest(GpuRuntime& runtime, int device) {
  absl::StatusOr<MappedHost> words = runtime.AllocMappedHost(4096);
  if (!words.ok()) return words.status();
  auto* host = static_cast<uint64_t*>(words->host);
  host[8] = 7;
  absl::StatusOr<GpuStream> stream = runtime.CreateStream(device, false);
  if (!stream.ok()) {
    runtime.FreeMappedHost(words->host);
    return stream.status();
  }
  absl::Status s = runtime.WaitValue64(*stream, words->device_addr + 64, 7);
  if (s.ok()) s = runtime.WriteValue64(*stream, words->device_addr, 42);
  if (s.ok()) {
    s = CheckHip(hipStreamSynchronize(static_cast<hipStream_t>(*stream)), "hipStreamSynchronize");
  }
  if (s.ok() && std::atomic_ref<uint64_t>(host[0]).load() != 42) {
    s = absl::FailedPreconditionError(absl::StrCat(
        "GPU ", device, ": hipStreamWriteValue64 to mapped host memory did not land"));
  }
  runtime.DestroyStream(device, *stream);
  runtime.FreeMappedHost(words->host);
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CopyEngine>> MakeHipEngine(const GpuEngineOptions& options) {
  int count = hip::DeviceCount();
  if (count == 0) return absl::UnavailableError("no HIP device (or no ROCm driver) found");
  auto runtime = std::make_unique<HipRuntime>();
  for (int device = 0; device < count; ++device) {
    if (absl::Status s = hip::CheckStreamMemOps(device); !s.ok()) return s;
    if (absl::Status s = runtime->SetDevice(device); !s.ok()) return s;
    if (absl::Status s = SelfTest(*runtime, device); !s.ok()) return s;
  }
  LogInfo("hip engine: ", count, " GPU(s), stream memory operations verified");
  return MakeStreamEngine(std::move(runtime), options);
}

}  // namespace tier::engine
