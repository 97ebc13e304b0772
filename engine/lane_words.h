// Lanes' completion words: one per lane, in pinned host memory every GPU can address. The lane's
// stream writes the seq of the jobs it finished (a value write queued after their copies); the
// device worker reads it with a plain load: no runtime call, no driver lock.
#ifndef TIER_ENGINE_LANE_WORDS_H_
#define TIER_ENGINE_LANE_WORDS_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "engine/gpu_runtime.h"

namespace tier::engine {

struct alignas(64) LaneWord {
  uint64_t completed;
  uint64_t pad[7];
};
static_assert(sizeof(LaneWord) == 64);

inline uint64_t LoadWord(const uint64_t& word) {
  return std::atomic_ref<const uint64_t>(word).load(std::memory_order_acquire);
}

// Hands out LaneWord slots from mapped host blocks (a cudaHostAlloc per lane would cost far more
// than the lane). Blocks live as long as the pool (the engine).
class HostWordPool {
 public:
  struct Slot {
    LaneWord* host = nullptr;
    uint64_t device_addr = 0;
  };

  explicit HostWordPool(GpuRuntime& runtime) : runtime_(runtime) {}
  ~HostWordPool();
  HostWordPool(const HostWordPool&) = delete;
  HostWordPool& operator=(const HostWordPool&) = delete;

  // A zeroed word (no job done). A setup call when it needs a new block.
  absl::StatusOr<Slot> Take();
  void Give(Slot slot);

 private:
  static constexpr uint64_t kBlockBytes = 64 * 1024;

  GpuRuntime& runtime_;
  Mutex mu_;  // a leaf: nothing is locked or called back under it
  std::vector<void*> blocks_ ABSL_GUARDED_BY(mu_);
  std::vector<Slot> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tier::engine

#endif  // TIER_ENGINE_LANE_WORDS_H_
