// One part of the host pool: a contiguous sub-range of the pool's one mapping, with its memory on
// one NUMA node (or unbound), its own extent allocator and lock, and counts of who it served.
// HostPool owns the parts and picks one per allocation; extents a part hands out carry offsets
// from the start of the whole pool, so the rest of tierd (At(), the GPU registration, the
// io_uring registered buffer) never knows the pool is split.
#ifndef TIER_STORAGE_POOL_PART_H_
#define TIER_STORAGE_POOL_PART_H_

#include <cstdint>
#include <optional>

#include "common/mutex.h"
#include "storage/extent_allocator.h"

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

  // Thread-safe. The extent's offset is from the start of the pool.
  std::optional<Extent> Allocate(uint64_t bytes, Locality locality);
  // An extent this part handed out (Contains(extent.offset)); false when refused (see
  // ExtentAllocator::Free).
  bool Free(Extent extent);
  uint64_t free_bytes() const;
  PoolPartUsage Usage() const;

 private:
  const uint64_t offset_;
  const uint64_t bytes_;
  const int numa_node_;
  mutable Mutex mu_;
  ExtentAllocator allocator_ ABSL_GUARDED_BY(mu_);  // offsets from offset_
  uint64_t local_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t remote_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t any_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tier::storage

#endif  // TIER_STORAGE_POOL_PART_H_
