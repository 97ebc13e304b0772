// The node's pinned host pool: one anonymous mapping made once at start (MAP_POPULATE, bound to a
// NUMA node when asked), locked in RAM (mlock, or registered with the GPU runtime by the copy
// engine, which pins it), and carved into extents with no per-job system call.
#ifndef TIER_STORAGE_HOST_POOL_H_
#define TIER_STORAGE_HOST_POOL_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "storage/extent_allocator.h"

namespace tier::storage {

enum class LockMode {
  kOff,       // pageable (tests)
  kBestEffort,  // mlock; on failure (RLIMIT_MEMLOCK) log and run pageable
  kRequired,  // mlock or fail to start
};

struct HostPoolOptions {
  uint64_t bytes = 0;          // rounded down to alignment; > 0
  uint64_t alignment = 4096;   // extent granularity (O_DIRECT needs 4096)
  int numa_node = -1;          // -1: no binding
  LockMode lock = LockMode::kBestEffort;
};

struct PoolUsage {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t largest_free = 0;
  uint64_t allocations = 0;  // extents currently handed out
};

class HostPool {
 public:
  static absl::StatusOr<std::unique_ptr<HostPool>> Create(const HostPoolOptions& options);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // Thread-safe. nullopt when the pool has no free range that large.
  std::optional<Extent> Allocate(uint64_t bytes);
  void Free(Extent extent);

  char* At(const Extent& extent) const { return base_ + extent.offset; }
  char* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t alignment() const { return alignment_; }
  bool locked() const { return locked_; }
  // Set by the copy engine once it pinned the pool (cudaHostRegister).
  void set_registered(bool registered) { registered_ = registered; }
  bool registered() const { return registered_; }
  PoolUsage Usage() const;

 private:
  HostPool(char* base, uint64_t bytes, uint64_t alignment, bool locked);

  char* base_;
  uint64_t bytes_;
  uint64_t alignment_;
  bool locked_;
  bool registered_ = false;
  mutable Mutex mu_;
  ExtentAllocator allocator_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tier::storage

#endif  // TIER_STORAGE_HOST_POOL_H_
