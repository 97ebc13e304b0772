// engine/portable_runtime.h: compiled for CUDA or for HIP (gpu/runtime_names.h).
#include "engine/portable_runtime.h"

#include <array>
#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "engine/stream_engine.h"
#include "gpu/runtime.h"

namespace tier::engine {

using gpu::CheckRuntime;

namespace {

gpuStream_t AsStream(GpuStream stream) { return static_cast<gpuStream_t>(stream); }

// Legacy IPC memory (cudaMalloc / hipMalloc memory of another process).
class IpcMapping final : public DeviceMapping {
 public:
  IpcMapping(char* base, uint64_t bytes, int device)
      : base_(base), bytes_(bytes), device_(device) {}
  ~IpcMapping() override {
    gpu::DeviceGuard guard(device_);
    if (gpuError_t e = gpuIpcCloseMemHandle(base_); e != gpuSuccess) {
      LogWarning(gpu::RuntimeError(e, TIER_GPU_FN(IpcCloseMemHandle)).message());
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

bool IsVmm(wire::BufferKind kind) {
  return kind == wire::BufferKind::kCudaVmmFd || kind == wire::BufferKind::kCudaVmmPages ||
         kind == wire::BufferKind::kCudaVmmSegment;
}

// Stream memory operations on the engine's mapped host words, once, before any session: a write
// from a stream must land in host memory, and a wait on host memory must pass. Neither step can
// hang: the wait targets a value the host wrote before it was queued.
absl::Status SelfTest(GpuRuntime& runtime, int device) {
  absl::StatusOr<MappedHost> words = runtime.AllocMappedHost(4096);
  if (!words.ok()) return words.status();
  auto* host = static_cast<uint64_t*>(words->host);
  host[8] = 7;  // read by the wait below
  absl::StatusOr<GpuStream> stream = runtime.CreateStream(device, false);
  if (!stream.ok()) {
    runtime.FreeMappedHost(words->host);
    return stream.status();
  }
  absl::Status s = runtime.WaitValue64(*stream, words->device_addr + 64, 7);
  if (s.ok()) s = runtime.WriteValue64(*stream, words->device_addr, 42);
  if (s.ok()) {
    s = CheckRuntime(gpuStreamSynchronize(AsStream(*stream)), TIER_GPU_FN(StreamSynchronize));
  }
  if (s.ok() && std::atomic_ref<uint64_t>(host[0]).load() != 42) {
    s = absl::FailedPreconditionError(absl::StrCat(
        "GPU ", device, ": ", gpu::kStreamWriteValue64Name, " to mapped host memory did not land"));
  }
  runtime.DestroyStream(device, *stream);
  runtime.FreeMappedHost(words->host);
  return s;
}

}  // namespace

std::string UuidText(const std::array<uint8_t, 16>& u) {
  return absl::StrFormat("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                         u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
                         u[12], u[13], u[14], u[15]);
}

absl::string_view PortableRuntime::name() const { return TIER_GPU_NAME; }

absl::Status PortableRuntime::SetDevice(int device) {
  return CheckRuntime(gpuSetDevice(device), absl::StrCat(TIER_GPU_FN(SetDevice), "(", device, ")"));
}

absl::StatusOr<GpuStream> PortableRuntime::CreateStream(int device, bool high_priority) {
  if (absl::Status s = SetDevice(device); !s.ok()) return s;
  gpuStream_t stream = nullptr;
  if (high_priority) {
    int least = 0;
    int greatest = 0;
    if (absl::Status s = CheckRuntime(gpuDeviceGetStreamPriorityRange(&least, &greatest),
                                      TIER_GPU_FN(DeviceGetStreamPriorityRange));
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            CheckRuntime(gpuStreamCreateWithPriority(&stream, gpuStreamNonBlocking, greatest),
                         TIER_GPU_FN(StreamCreateWithPriority));
        !s.ok()) {
      return s;
    }
  } else if (absl::Status s = CheckRuntime(gpuStreamCreateWithFlags(&stream, gpuStreamNonBlocking),
                                           TIER_GPU_FN(StreamCreateWithFlags));
             !s.ok()) {
    return s;
  }
  return static_cast<GpuStream>(stream);
}

void PortableRuntime::DestroyStream(int device, GpuStream stream) {
  // Returns at once; the driver frees the stream once its queued work is done.
  gpu::DeviceGuard guard(device);
  (void)gpuStreamDestroy(AsStream(stream));
}

absl::StatusOr<bool> PortableRuntime::StreamDone(int, GpuStream stream) {
  gpuError_t e = gpuStreamQuery(AsStream(stream));
  if (e == gpuSuccess) return true;
  if (e == gpuErrorNotReady) return false;
  return gpu::RuntimeError(e, "copy stream failed");
}

absl::Status PortableRuntime::WaitValue64(GpuStream stream, uint64_t addr, uint64_t value) {
  return gpu::StreamWaitValue64(AsStream(stream), addr, value);
}

absl::Status PortableRuntime::WriteValue64(GpuStream stream, uint64_t addr, uint64_t value) {
  return gpu::StreamWriteValue64(AsStream(stream), addr, value);
}

absl::Status PortableRuntime::CopyAsync(GpuStream stream, Direction direction, char* client,
                                        char* pool, uint64_t len) {
  const bool d2h = direction == Direction::kToPool;
  gpuError_t e = d2h ? gpuMemcpyAsync(pool, client, len, gpuMemcpyDefault, AsStream(stream))
                     : gpuMemcpyAsync(client, pool, len, gpuMemcpyDefault, AsStream(stream));
  return CheckRuntime(e, d2h ? TIER_GPU_FN(MemcpyAsync) " D2H" : TIER_GPU_FN(MemcpyAsync) " H2D");
}

absl::Status PortableRuntime::HostCopyAsync(GpuStream stream, char* dst, const char* src,
                                            uint64_t len) {
  auto* task = new HostCopyTask{dst, src, len};
  absl::Status s = EnqueueHostCopy(stream, task);
  if (!s.ok()) delete task;  // else HostCopyTask::Run deletes it
  return s;
}

absl::StatusOr<MappedHost> PortableRuntime::AllocMappedHost(uint64_t bytes) {
  void* host = nullptr;
  if (absl::Status s =
          CheckRuntime(gpuHostAlloc(&host, bytes, gpuHostAllocPortable | gpuHostAllocMapped),
                       TIER_GPU_HOST_ALLOC_NAME " of engine words");
      !s.ok()) {
    return s;
  }
  std::memset(host, 0, bytes);
  absl::StatusOr<uint64_t> device = gpu::HostDeviceAddress(host, "engine words");
  if (!device.ok()) {
    (void)gpuFreeHost(host);
    return device.status();
  }
  return MappedHost{host, *device};
}

void PortableRuntime::FreeMappedHost(void* host) { (void)gpuFreeHost(host); }

absl::Status PortableRuntime::RegisterHost(char* base, uint64_t bytes) {
  // Pinning the daemon's mmap'd pool is ~15x faster than cudaHostAlloc of the same size.
  return CheckRuntime(gpuHostRegister(base, bytes, gpuHostRegisterPortable),
                      absl::StrCat(TIER_GPU_FN(HostRegister), " of the ", bytes >> 20,
                                   " MiB host pool"));
}

absl::Status PortableRuntime::RegisterMappedHost(char* base, uint64_t bytes) {
  return CheckRuntime(gpuHostRegister(base, bytes, gpuHostRegisterPortable | gpuHostRegisterMapped),
                      TIER_GPU_FN(HostRegister) " of a session's ticket page");
}

absl::StatusOr<uint64_t> PortableRuntime::HostDeviceAddress(int device, char* host) {
  gpu::DeviceGuard guard(device);
  if (!guard.status().ok()) return guard.status();
  return gpu::HostDeviceAddress(host, "a session's ticket page");
}

void PortableRuntime::UnregisterHost(char* base) { (void)gpuHostUnregister(base); }

absl::StatusOr<int> PortableRuntime::FindDevice(const BufferImport& import) {
  std::optional<int> device = gpu::DeviceForUuid(import.device_uuid);
  if (!device) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no GPU with UUID ", UuidText(import.device_uuid), " (the client's GPU ", import.device,
        ") is visible to tierd; check the daemon's " TIER_GPU_VISIBLE_DEVICES));
  }
  return *device;
}

absl::StatusOr<std::unique_ptr<DeviceMapping>> PortableRuntime::Open(BufferImport& import) {
  if (absl::Status s = CanImport(import.kind); !s.ok()) return s;
  absl::StatusOr<int> device = FindDevice(import);
  if (!device.ok()) return device.status();
  if (import.bytes == 0) return absl::InvalidArgumentError("GPU buffer of 0 bytes");
  gpu::DeviceGuard guard(*device);
  if (!guard.status().ok()) return guard.status();
  return IsVmm(import.kind) ? OpenVmm(import, *device) : OpenIpc(import, *device);
}

absl::Status PortableRuntime::InitDevice(int) { return absl::OkStatus(); }

absl::Status PortableRuntime::CanImport(wire::BufferKind) const { return absl::OkStatus(); }

absl::StatusOr<std::unique_ptr<DeviceMapping>> PortableRuntime::OpenVmm(BufferImport&, int) {
  return absl::UnimplementedError("the " TIER_GPU_NAME " engine cannot import VMM allocations");
}

absl::StatusOr<std::unique_ptr<DeviceMapping>> PortableRuntime::OpenIpc(BufferImport& import,
                                                                        int device) {
  gpuIpcMemHandle_t handle;
  static_assert(sizeof(handle) == sizeof(import.ipc_handle));
  std::memcpy(&handle, import.ipc_handle.data(), sizeof(handle));
  void* ptr = nullptr;
  gpuError_t e = gpuIpcOpenMemHandle(&ptr, handle, gpuIpcMemLazyEnablePeerAccess);
  if (e != gpuSuccess) {
    (void)gpuGetLastError();
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot open the " TIER_GPU_TITLE " IPC handle on GPU ", device, ": ", gpuGetErrorName(e),
        " (", gpuGetErrorString(e), "); the handle is malformed, or the process that exported it "
        "has exited or freed the memory"));
  }
  auto mapping = std::make_unique<IpcMapping>(static_cast<char*>(ptr), import.bytes, device);
  // The handle names its own GPU; make sure it is the one the client said (by UUID).
  absl::StatusOr<gpu::PointerInfo> info = gpu::GetPointerInfo(ptr);
  if (!info.ok()) return info.status();
  if (info->kind != gpu::PointerInfo::Kind::kDevice || info->device != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the " TIER_GPU_TITLE " IPC handle is for GPU ", info->device, " of tierd, but the client "
        "registered it for GPU ", device, " (", UuidText(import.device_uuid), ")"));
  }
  absl::StatusOr<gpu::AddressRange> range = gpu::GetAddressRange(ptr);
  if (!range.ok()) return range.status();
  const uint64_t end = range->base + range->bytes;
  if (reinterpret_cast<uint64_t>(ptr) + import.bytes > end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the " TIER_GPU_TITLE " IPC allocation holds ", end - reinterpret_cast<uint64_t>(ptr),
        " bytes, fewer than the ", import.bytes, " registered"));
  }
  return mapping;
}

absl::StatusOr<std::unique_ptr<CopyEngine>> StartEngine(std::unique_ptr<PortableRuntime> runtime,
                                                        const GpuEngineOptions& options) {
  const int count = gpu::DeviceCount();
  if (count == 0) {
    return absl::UnavailableError("no " TIER_GPU_TITLE " device (or no " TIER_GPU_DRIVER ") found");
  }
  for (int device = 0; device < count; ++device) {
    if (absl::Status s = gpu::CheckStreamMemOps(device); !s.ok()) return s;
    if (absl::Status s = runtime->SetDevice(device); !s.ok()) return s;
    if (absl::Status s = runtime->InitDevice(device); !s.ok()) return s;
    if (absl::Status s = SelfTest(*runtime, device); !s.ok()) return s;
  }
  LogInfo(TIER_GPU_NAME " engine: ", count, " GPU(s), stream memory operations verified");
  return MakeStreamEngine(std::move(runtime), options);
}

}  // namespace tier::engine
