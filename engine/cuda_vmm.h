// Client VMM memory in the CUDA engine (the driver API, through gpu/cuda_driver.h): one page
// (kCudaVmmFd), several mapped side by side (kCudaVmmPages, PyTorch's expandable segments), or a
// segment that grows (kCudaVmmSegment, ImportedBuffer::Extend). One address reservation of
// tierd's for them all, each page imported from its fd and mapped at its offset, so that a job
// may cross page boundaries as it does in the client. HIP has no such import (hip_engine.cc).
#ifndef TIER_ENGINE_CUDA_VMM_H_
#define TIER_ENGINE_CUDA_VMM_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/copy_engine.h"
#include "engine/gpu_runtime.h"

namespace tier::engine {

class VmmImporter {
 public:
  // The mapping of `import`'s pages on `device` (current); `import`'s descriptors are consumed.
  absl::StatusOr<std::unique_ptr<DeviceMapping>> Open(BufferImport& import, int device);

 private:
  absl::Status Reserve(uint64_t reserved, uint64_t granularity, int device);

  // Address space reserved for client memory (VMM imports) at most: a quarter of x86-64's 128 TiB
  // of user space, so clients cannot starve tierd of it. A session's and a user's share of it are
  // bounded before the import (max_reserved_bytes_per_session, _per_uid: UsageLedger).
  static constexpr uint64_t kMaxReservedBytes = uint64_t{32} << 40;

  std::atomic<uint64_t> reserved_bytes_{0};
};

}  // namespace tier::engine

#endif  // TIER_ENGINE_CUDA_VMM_H_
