// SyncRuntime over CUDA: the runtime API, and the driver API for the stream memory operations.
#include "absl/strings/str_cat.h"
#include "client/gpu/sync_runtime.h"
#include "gpu/cuda_driver.h"

namespace tier::client::gpu {

namespace cuda = ::tier::gpu::cuda;
namespace {

using cuda::CheckDriver;
using cuda::CheckRuntime;

cudaStream_t AsStream(SyncRuntime::Stream stream) { return static_cast<cudaStream_t>(stream); }
cudaEvent_t AsEvent(SyncRuntime::Event event) { return static_cast<cudaEvent_t>(event); }

class CudaSyncRuntime final : public SyncRuntime {
 public:
  explicit CudaSyncRuntime(const cuda::Driver& driver) : driver_(driver) {}

  absl::StatusOr<int> SwapDevice(int device) const override {
    int previous = -1;
    if (absl::Status s = CheckRuntime(cudaGetDevice(&previous), "cudaGetDevice"); !s.ok()) {
      return s;
    }
    if (previous == device) return -1;
    if (absl::Status s =
            CheckRuntime(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")"));
        !s.ok()) {
      return s;
    }
    return previous;
  }
  void RestoreDevice(int previous) const override { (void)cudaSetDevice(previous); }

  absl::Status CheckStreamMemOps(int device) const override {
    return cuda::CheckStreamMemOps(device);
  }
  absl::StatusOr<std::array<uint8_t, 16>> DeviceUuid(int device) const override {
    return cuda::DeviceUuid(device);
  }

  absl::StatusOr<uint64_t> HostDevicePointer(void* host) const override {
    void* dev = nullptr;
    if (absl::Status s = CheckRuntime(cudaHostGetDevicePointer(&dev, host, 0),
                                      "cudaHostGetDevicePointer of the ticket page");
        !s.ok()) {
      return s;
    }
    return reinterpret_cast<uint64_t>(dev);
  }

  absl::StatusOr<Stream> CreateStream() const override {
    cudaStream_t stream = nullptr;
    if (absl::Status s = CheckRuntime(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                      "creating a stream");
        !s.ok()) {
      return s;
    }
    return stream;
  }
  void DestroyStream(Stream stream) const override { (void)cudaStreamDestroy(AsStream(stream)); }

  absl::StatusOr<Event> CreateEvent() const override {
    cudaEvent_t event = nullptr;
    if (absl::Status s = CheckRuntime(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                                      "creating the ticket event");
        !s.ok()) {
      return s;
    }
    return event;
  }
  void DestroyEvent(Event event) const override { (void)cudaEventDestroy(AsEvent(event)); }

  absl::Status RecordEvent(Event event, Stream stream) const override {
    cudaError_t e = cudaEventRecord(AsEvent(event), AsStream(stream));
    if (e == cudaSuccess) return absl::OkStatus();
    (void)cudaGetLastError();  // not sticky: the process's next CUDA call must not see it
    return absl::InvalidArgumentError(cudaGetErrorName(e));
  }
  absl::Status StreamWaitEvent(Stream stream, Event event) const override {
    return CheckRuntime(cudaStreamWaitEvent(AsStream(stream), AsEvent(event), 0),
                        "cudaStreamWaitEvent");
  }
  absl::Status WriteValue64(Stream stream, uint64_t address, uint64_t value) const override {
    return CheckDriver(driver_.StreamWriteValue64(static_cast<CUstream>(stream),
                                                  static_cast<CUdeviceptr>(address), value,
                                                  CU_STREAM_WRITE_VALUE_DEFAULT),
                       "cuStreamWriteValue64");
  }
  absl::Status WaitValue64(Stream stream, uint64_t address, uint64_t value) const override {
    // A null stream is the driver's legacy NULL stream of the current context.
    return CheckDriver(driver_.StreamWaitValue64(static_cast<CUstream>(stream),
                                                 static_cast<CUdeviceptr>(address), value,
                                                 CU_STREAM_WAIT_VALUE_GEQ),
                       "cuStreamWaitValue64");
  }

 private:
  const cuda::Driver& driver_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SyncRuntime>> NewSyncRuntime() {
  absl::StatusOr<const cuda::Driver*> driver = cuda::GetDriver();
  if (!driver.ok()) return driver.status();
  return std::make_unique<CudaSyncRuntime>(**driver);
}

}  // namespace tier::client::gpu
