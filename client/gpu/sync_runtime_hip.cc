// SyncRuntime over HIP.
#include "absl/strings/str_cat.h"
#include "client/gpu/sync_runtime.h"
#include "gpu/hip_util.h"

namespace tier::client::gpu {

namespace hip = ::tier::gpu::hip;
namespace {

using hip::CheckHip;

hipStream_t AsStream(SyncRuntime::Stream stream) { return static_cast<hipStream_t>(stream); }
hipEvent_t AsEvent(SyncRuntime::Event event) { return static_cast<hipEvent_t>(event); }

class HipSyncRuntime final : public SyncRuntime {
 public:
  absl::StatusOr<int> SwapDevice(int device) const override {
    int previous = -1;
    if (absl::Status s = CheckHip(hipGetDevice(&previous), "hipGetDevice"); !s.ok()) {
      return s;
    }
    if (previous == device) return -1;
    if (absl::Status s =
            CheckHip(hipSetDevice(device), absl::StrCat("hipSetDevice(", device, ")"));
        !s.ok()) {
      return s;
    }
    return previous;
  }
  void RestoreDevice(int previous) const override { (void)hipSetDevice(previous); }

  absl::Status CheckStreamMemOps(int device) const override {
    return hip::CheckStreamMemOps(device);
  }
  absl::StatusOr<std::array<uint8_t, 16>> DeviceUuid(int device) const override {
    return hip::DeviceUuid(device);
  }

  absl::StatusOr<uint64_t> HostDevicePointer(void* host) const override {
    void* dev = nullptr;
    if (absl::Status s = CheckHip(hipHostGetDevicePointer(&dev, host, 0),
                                      "hipHostGetDevicePointer of the ticket page");
        !s.ok()) {
      return s;
    }
    return reinterpret_cast<uint64_t>(dev);
  }

  absl::StatusOr<Stream> CreateStream() const override {
    hipStream_t stream = nullptr;
    if (absl::Status s =
            CheckHip(hipStreamCreateWithFlags(&stream, hipStreamNonBlocking), "creating a stream");
        !s.ok()) {
      return s;
    }
    return stream;
  }
  void DestroyStream(Stream stream) const override { (void)hipStreamDestroy(AsStream(stream)); }

  absl::StatusOr<Event> CreateEvent() const override {
    hipEvent_t event = nullptr;
    if (absl::Status s = CheckHip(hipEventCreateWithFlags(&event, hipEventDisableTiming),
                                      "creating the ticket event");
        !s.ok()) {
      return s;
    }
    return event;
  }
  void DestroyEvent(Event event) const override { (void)hipEventDestroy(AsEvent(event)); }

  absl::Status RecordEvent(Event event, Stream stream) const override {
    hipError_t e = hipEventRecord(AsEvent(event), AsStream(stream));
    if (e == hipSuccess) return absl::OkStatus();
    (void)hipGetLastError();  // not sticky: the process's next CUDA call must not see it
    return absl::InvalidArgumentError(hipGetErrorName(e));
  }
  absl::Status StreamWaitEvent(Stream stream, Event event) const override {
    return CheckHip(hipStreamWaitEvent(AsStream(stream), AsEvent(event), 0),
                        "hipStreamWaitEvent");
  }
  absl::Status WriteValue64(Stream stream, uint64_t address, uint64_t value) const override {
    return CheckHip(hipStreamWriteValue64(AsStream(stream), reinterpret_cast<void*>(address), value,
                                          0),
                    "hipStreamWriteValue64");
  }
  absl::Status WaitValue64(Stream stream, uint64_t address, uint64_t value) const override {
    return CheckHip(hipStreamWaitValue64(AsStream(stream), reinterpret_cast<void*>(address), value,
                                         hipStreamWaitValueGte),
                    "hipStreamWaitValue64");
  }

};

}  // namespace

absl::StatusOr<std::unique_ptr<SyncRuntime>> NewSyncRuntime() {
  return std::make_unique<HipSyncRuntime>();
}

}  // namespace tier::client::gpu
