// SyncRuntime over the runtime this build chose: written once over gpu/runtime_names.h and
// compiled for CUDA or for HIP (the stream memory operations are gpu/runtime.h's).
#include <memory>

#include "absl/strings/str_cat.h"
#include "client/gpu/sync_runtime.h"
#include "gpu/runtime.h"

namespace tier::client::gpu {
namespace {

namespace rt = ::tier::gpu;
using rt::CheckRuntime;

gpuStream_t AsStream(SyncRuntime::Stream stream) { return static_cast<gpuStream_t>(stream); }
gpuEvent_t AsEvent(SyncRuntime::Event event) { return static_cast<gpuEvent_t>(event); }

class GpuSyncRuntime final : public SyncRuntime {
 public:
  absl::StatusOr<int> SwapDevice(int device) const override {
    int previous = -1;
    if (absl::Status s = CheckRuntime(gpuGetDevice(&previous), TIER_GPU_FN(GetDevice)); !s.ok()) {
      return s;
    }
    if (previous == device) return -1;
    if (absl::Status s = CheckRuntime(gpuSetDevice(device),
                                      absl::StrCat(TIER_GPU_FN(SetDevice), "(", device, ")"));
        !s.ok()) {
      return s;
    }
    return previous;
  }
  void RestoreDevice(int previous) const override { (void)gpuSetDevice(previous); }

  absl::Status CheckStreamMemOps(int device) const override {
    return rt::CheckStreamMemOps(device);
  }
  absl::StatusOr<std::array<uint8_t, 16>> DeviceUuid(int device) const override {
    return rt::DeviceUuid(device);
  }

  absl::StatusOr<uint64_t> HostDevicePointer(void* host) const override {
    return rt::HostDeviceAddress(host, "the ticket page");
  }

  absl::StatusOr<Stream> CreateStream() const override {
    gpuStream_t stream = nullptr;
    if (absl::Status s = CheckRuntime(gpuStreamCreateWithFlags(&stream, gpuStreamNonBlocking),
                                      "creating a stream");
        !s.ok()) {
      return s;
    }
    return stream;
  }
  void DestroyStream(Stream stream) const override { (void)gpuStreamDestroy(AsStream(stream)); }

  absl::StatusOr<Event> CreateEvent() const override {
    gpuEvent_t event = nullptr;
    if (absl::Status s = CheckRuntime(gpuEventCreateWithFlags(&event, gpuEventDisableTiming),
                                      "creating the ticket event");
        !s.ok()) {
      return s;
    }
    return event;
  }
  void DestroyEvent(Event event) const override { (void)gpuEventDestroy(AsEvent(event)); }

  absl::Status RecordEvent(Event event, Stream stream) const override {
    gpuError_t e = gpuEventRecord(AsEvent(event), AsStream(stream));
    if (e == gpuSuccess) return absl::OkStatus();
    (void)gpuGetLastError();  // not sticky: the process's next runtime call must not see it
    return absl::InvalidArgumentError(gpuGetErrorName(e));
  }
  absl::Status StreamWaitEvent(Stream stream, Event event) const override {
    return CheckRuntime(gpuStreamWaitEvent(AsStream(stream), AsEvent(event), 0),
                        TIER_GPU_FN(StreamWaitEvent));
  }
  absl::Status WriteValue64(Stream stream, uint64_t address, uint64_t value) const override {
    return rt::StreamWriteValue64(AsStream(stream), address, value);
  }
  absl::Status WaitValue64(Stream stream, uint64_t address, uint64_t value) const override {
    return rt::StreamWaitValue64(AsStream(stream), address, value);
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<SyncRuntime>> NewSyncRuntime() {
  return std::make_unique<GpuSyncRuntime>();
}

}  // namespace tier::client::gpu
