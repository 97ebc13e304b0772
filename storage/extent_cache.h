// Free extents that one GPU's threads gave back to a pool part, kept for that GPU's next
// allocations of the same size. Every offload allocates and frees an extent; through the part's
// lock alone (one part for all GPUs on a machine of one NUMA node), a flood of small jobs on one
// GPU would hold every other GPU's offloads (issue 26). A job's extent comes back to the GPU that
// took it (the free job runs on its session's poller), so a GPU repeating its sizes takes and
// gives extents through its own cache, under its own lock, and reaches the part's allocator only
// on a miss.
//
// Bounded: extents up to kMaxExtentBytes, at most kMaxExtents of them and `cap_bytes` in all; one
// that does not fit pushes the oldest out (back to the allocator). The part counts cached bytes as
// free, and empties every cache into the allocator before it fails an allocation, so a cache never
// costs an offload its room; it may only split a free range for a while.
#ifndef TIER_STORAGE_EXTENT_CACHE_H_
#define TIER_STORAGE_EXTENT_CACHE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "common/mutex.h"
#include "storage/extent_allocator.h"

namespace tier::storage {

class ExtentCache {
 public:
  static constexpr size_t kMaxExtents = 64;
  static constexpr uint64_t kMaxExtentBytes = uint64_t{4} << 20;

  explicit ExtentCache(uint64_t cap_bytes) : cap_bytes_(cap_bytes) {}
  ExtentCache(const ExtentCache&) = delete;
  ExtentCache& operator=(const ExtentCache&) = delete;

  // A kept extent of exactly `bytes` (the newest such), or nothing.
  std::optional<Extent> Take(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Keeps `extent` if it may; what must go back to the allocator instead: the extent itself (too
  // large), or the oldest kept ones it pushed out.
  std::vector<Extent> Put(Extent extent) ABSL_LOCKS_EXCLUDED(mu_);
  // Every kept extent (the cache is empty after).
  std::vector<Extent> TakeAll() ABSL_LOCKS_EXCLUDED(mu_);

  // What it keeps now (read without the lock: a moment old).
  uint64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  void Publish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t cap_bytes_;
  Mutex mu_;  // a leaf: taken alone, never with the part's lock
  std::deque<Extent> extents_ ABSL_GUARDED_BY(mu_);  // oldest first
  uint64_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> bytes_{0};
  std::atomic<uint64_t> count_{0};
};

}  // namespace tier::storage

#endif  // TIER_STORAGE_EXTENT_CACHE_H_
