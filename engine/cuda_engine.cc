// The CUDA engine: PortableRuntime (engine/portable_runtime.h) and what CUDA does differently:
// the copies of a burst in one cudaMemcpyBatchAsync, host copies by cudaLaunchHostFunc, VMM
// imports (engine/cuda_vmm.h), each GPU's context made at start, more hardware queues.
#include <cstdlib>
#include <memory>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "common/log.h"
#include "engine/cuda_vmm.h"
#include "engine/gpu_engine.h"
#include "engine/portable_runtime.h"
#include "gpu/runtime.h"

namespace tier::engine {
namespace {

using gpu::CheckRuntime;

class CudaRuntime final : public PortableRuntime {
 public:
  // One cudaMemcpyBatchAsync for the copies of a burst (CUDA 12.8 and newer): one driver call
  // and one submission for many small copies. Falls back to a cudaMemcpyAsync each, for good,
  // if the driver refuses it.
  absl::Status CopyBatchAsync(GpuStream stream, Direction direction,
                              absl::Span<const CopyOp> ops) override {
#if CUDART_VERSION >= 12080
    if (ops.size() > 1 && batch_copies_.load(std::memory_order_relaxed)) {
      absl::InlinedVector<void*, 32> dsts;
      absl::InlinedVector<const void*, 32> srcs;
      absl::InlinedVector<size_t, 32> sizes;
      for (const CopyOp& op : ops) {
        bool d2h = direction == Direction::kToPool;
        dsts.push_back(d2h ? op.pool : op.client);
        srcs.push_back(d2h ? op.client : op.pool);
        sizes.push_back(op.len);
      }
      cudaMemcpyAttributes attrs{};
      attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t first = 0;
      cudaError_t e = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), ops.size(),
                                           &attrs, &first, 1, static_cast<cudaStream_t>(stream));
      if (e == cudaSuccess) return absl::OkStatus();
      (void)cudaGetLastError();
      batch_copies_.store(false, std::memory_order_relaxed);
      LogWarning(CheckRuntime(e, "cudaMemcpyBatchAsync").message(),
                 "; copies of a batch go one cudaMemcpyAsync each from now on");
    }
#endif
    return GpuRuntime::CopyBatchAsync(stream, direction, ops);
  }

  absl::Status InitDevice(int) override {
    return CheckRuntime(cudaFree(nullptr), "creating the CUDA context");
  }

 protected:
  absl::Status EnqueueHostCopy(GpuStream stream, HostCopyTask* task) override {
    return CheckRuntime(
        cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), &HostCopyTask::Run, task),
        "cudaLaunchHostFunc");
  }
  absl::StatusOr<std::unique_ptr<DeviceMapping>> OpenVmm(BufferImport& import,
                                                         int device) override {
    return vmm_.Open(import, device);
  }

 private:
  VmmImporter vmm_;
  std::atomic<bool> batch_copies_{true};  // cudaMemcpyBatchAsync works here
};

}  // namespace

absl::StatusOr<std::unique_ptr<CopyEngine>> StartGpuEngine(const GpuEngineOptions& options) {
  // Before the first CUDA call: more hardware queues, so that a session stream blocked on its
  // client's ticket shares a queue with fewer other streams (streams beyond the queue count
  // share one, and a queue blocked by a wait delays everything behind it). Honours a value set
  // by the operator.
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
  return StartEngine(std::make_unique<CudaRuntime>(), options);
}

}  // namespace tier::engine
