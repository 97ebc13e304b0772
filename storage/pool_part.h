// One part of the host pool: a contiguous sub-range of the pool's one mapping, with its memory on
// one NUMA node (or unbound), its own extent allocator and lock, and counts of who it served.
// HostPool owns the parts and picks one per allocation; extents a part hands out carry offsets
// from the start of the whole pool, so the rest of tierd (At(), the GPU registration, the
// io_uring registered buffer) never knows the pool is split.
//
// Each GPU's threads (common/thread_gpu.h) free into and allocate from a cache of their own first
// (storage/extent_cache.h), so that GPUs sharing a part do not share its lock on every job; other
// threads (and every miss) use the allocator under the part's lock.
#ifndef TIER_STORAGE_POOL_PART_H_
#define TIER_STORAGE_POOL_PART_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "common/mutex.h"
#include "storage/extent_allocator.h"
#include "storage/extent_cache.h"

namespace tier::storage {

// Who asked for an extent, relative to the part that gave it.
enum class Locality {
  kLocal,   // the caller preferred this part (its GPU is local to it)
  kRemote,  // the caller preferred another part, which had no room
  kAny,     // the caller had no preference (host memory, a restored object)
};

struct PoolPartUsage {
  int numa_node = -1;  // -1: not bound
  uint64_t offset = 0;  // of the part in the pool
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t largest_free = 0;
  uint64_t allocations = 0;  // extents currently handed out
  // Extents handed out since start, by Locality.
  uint64_t local_allocations = 0;
  uint64_t remote_allocations = 0;
  uint64_t any_allocations = 0;
};

class PoolPart {
 public:
  // [offset, offset + bytes) of the pool; bytes a multiple of alignment.
  PoolPart(uint64_t offset, uint64_t bytes, uint64_t alignment, int numa_node);
  PoolPart(const PoolPart&) = delete;
  PoolPart& operator=(const PoolPart&) = delete;

  uint64_t offset() const { return offset_; }
  uint64_t bytes() const { return bytes_; }
  int numa_node() const { return numa_node_; }
  bool Contains(uint64_t pool_offset) const {
    return pool_offset >= offset_ && pool_offset - offset_ < bytes_;
  }

  // GPUs 0..kCachedGpus-1 have an extent cache in each part; others use the allocator only.
  static constexpr int kCachedGpus = 16;

  // Thread-safe. The extent's offset is from the start of the pool.
  std::optional<Extent> Allocate(uint64_t bytes, Locality locality);
  // An extent this part handed out (Contains(extent.offset)); false when refused (see
  // ExtentAllocator::Free). A GPU's thread's extent goes to its cache, unchecked: a double free
  // is refused only where it reaches the allocator.
  bool Free(Extent extent);
  uint64_t free_bytes() const;
  PoolPartUsage Usage() const;

 private:
  friend struct PoolPartPeer;  // tests: hold the part's lock

  // The calling thread's GPU's cache, or null.
  ExtentCache* CacheOfThread() const;
  // Gives extents (pool offsets) back to the allocator.
  void FreeToAllocator(const std::vector<Extent>& extents) ABSL_LOCKS_EXCLUDED(mu_);
  // Empties every cache into the allocator; true if any held an extent.
  bool FlushCaches() ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t cached_bytes() const;
  uint64_t cached_count() const;
  void CountAllocation(Locality locality);

  const uint64_t offset_;
  const uint64_t bytes_;
  const uint64_t alignment_;
  const int numa_node_;
  mutable Mutex mu_;  // never held with a cache's lock
  ExtentAllocator allocator_ ABSL_GUARDED_BY(mu_);  // offsets from offset_
  std::array<std::unique_ptr<ExtentCache>, kCachedGpus> caches_;
  std::atomic<uint64_t> local_{0};
  std::atomic<uint64_t> remote_{0};
  std::atomic<uint64_t> any_{0};
};

}  // namespace tier::storage

#endif  // TIER_STORAGE_POOL_PART_H_
