// Hands out byte ranges of a fixed-size arena (the pinned host pool, or one spill file) with no
// system calls: best fit over the free ranges, coalescing neighbours on free. Not thread-safe; the
// owner (HostPool, SpillFile) serializes calls.
#ifndef TIER_STORAGE_EXTENT_ALLOCATOR_H_
#define TIER_STORAGE_EXTENT_ALLOCATOR_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace tier::storage {

struct Extent {
  uint64_t offset = 0;  // bytes from the arena start, a multiple of the alignment
  uint64_t bytes = 0;   // a multiple of the alignment, > 0
  friend bool operator==(const Extent&, const Extent&) = default;
};

class ExtentAllocator {
 public:
  // capacity is rounded down to a multiple of alignment; alignment is a power of two.
  ExtentAllocator(uint64_t capacity, uint64_t alignment);

  // Best fit for `bytes` rounded up to the alignment; nullopt when no free range is large enough
  // or bytes is 0.
  std::optional<Extent> Allocate(uint64_t bytes);
  // Returns an extent from Allocate. Anything else (overlap with free space, double free, out of
  // range) is refused: false, and the allocator is unchanged.
  bool Free(Extent extent);

  uint64_t capacity() const { return capacity_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t used_bytes() const { return capacity_ - free_bytes_; }
  uint64_t free_bytes() const { return free_bytes_; }
  uint64_t largest_free() const;
  size_t free_ranges() const { return by_offset_.size(); }
  uint64_t allocations() const { return allocations_; }

 private:
  void Insert(uint64_t offset, uint64_t bytes);
  void Erase(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t capacity_;
  uint64_t alignment_;
  uint64_t free_bytes_;
  uint64_t allocations_ = 0;
  std::map<uint64_t, uint64_t> by_offset_;          // offset -> bytes of each free range
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // (bytes, offset) of each free range
};

}  // namespace tier::storage

#endif  // TIER_STORAGE_EXTENT_ALLOCATOR_H_
