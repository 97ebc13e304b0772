#include "storage/pool_part.h"

#include <algorithm>

#include "common/thread_gpu.h"

namespace tier::storage {

PoolPart::PoolPart(uint64_t offset, uint64_t bytes, uint64_t alignment, int numa_node)
    : offset_(offset), bytes_(bytes), alignment_(alignment), numa_node_(numa_node),
      allocator_(bytes, alignment) {
  // Each cache holds at most a sixteenth of the part (and 64 MiB): what the caches keep is free
  // memory the allocator cannot merge until they are emptied.
  const uint64_t cap = std::min<uint64_t>(uint64_t{64} << 20, bytes / 16);
  for (auto& cache : caches_) cache = std::make_unique<ExtentCache>(cap);
}

ExtentCache* PoolPart::CacheOfThread() const {
  const int gpu = CurrentThreadGpu();
  return gpu >= 0 && gpu < kCachedGpus ? caches_[gpu].get() : nullptr;
}

void PoolPart::CountAllocation(Locality locality) {
  switch (locality) {
    case Locality::kLocal:
      local_.fetch_add(1, std::memory_order_relaxed);
      break;
    case Locality::kRemote:
      remote_.fetch_add(1, std::memory_order_relaxed);
      break;
    case Locality::kAny:
      any_.fetch_add(1, std::memory_order_relaxed);
      break;
  }
}

std::optional<Extent> PoolPart::Allocate(uint64_t bytes, Locality locality) {
  if (bytes == 0) return std::nullopt;
  if (ExtentCache* cache = CacheOfThread()) {
    if (std::optional<Extent> extent = cache->Take((bytes + alignment_ - 1) & ~(alignment_ - 1))) {
      CountAllocation(locality);
      return extent;
    }
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    {
      MutexLock lock(&mu_);
      if (std::optional<Extent> extent = allocator_.Allocate(bytes)) {
        extent->offset += offset_;
        CountAllocation(locality);
        return extent;
      }
    }
    // No free range that large: what the caches keep may make one.
    if (attempt == 0 && !FlushCaches()) break;
  }
  return std::nullopt;
}

bool PoolPart::Free(Extent extent) {
  if (!Contains(extent.offset)) return false;
  if (ExtentCache* cache = CacheOfThread();
      cache != nullptr && extent.bytes > 0 && extent.offset % alignment_ == 0 &&
      extent.bytes % alignment_ == 0 && extent.bytes <= bytes_ - (extent.offset - offset_)) {
    FreeToAllocator(cache->Put(extent));
    return true;
  }
  extent.offset -= offset_;
  MutexLock lock(&mu_);
  return allocator_.Free(extent);
}

void PoolPart::FreeToAllocator(const std::vector<Extent>& extents) {
  if (extents.empty()) return;
  MutexLock lock(&mu_);
  for (Extent extent : extents) {
    extent.offset -= offset_;
    allocator_.Free(extent);
  }
}

bool PoolPart::FlushCaches() {
  bool any = false;
  for (auto& cache : caches_) {
    if (cache->count() == 0) continue;
    std::vector<Extent> kept = cache->TakeAll();
    any |= !kept.empty();
    FreeToAllocator(kept);
  }
  return any;
}

uint64_t PoolPart::cached_bytes() const {
  uint64_t sum = 0;
  for (const auto& cache : caches_) sum += cache->bytes();
  return sum;
}

uint64_t PoolPart::cached_count() const {
  uint64_t sum = 0;
  for (const auto& cache : caches_) sum += cache->count();
  return sum;
}

uint64_t PoolPart::free_bytes() const {
  const uint64_t cached = cached_bytes();
  MutexLock lock(&mu_);
  return allocator_.free_bytes() + cached;
}

PoolPartUsage PoolPart::Usage() const {
  // The caches' extents are free memory (a moment old: a GPU's thread may be taking one).
  const uint64_t cached = cached_bytes();
  const uint64_t cached_extents = cached_count();
  MutexLock lock(&mu_);
  PoolPartUsage usage;
  usage.numa_node = numa_node_;
  usage.offset = offset_;
  usage.capacity_bytes = allocator_.capacity();
  usage.used_bytes = allocator_.used_bytes() - std::min(cached, allocator_.used_bytes());
  usage.free_bytes = allocator_.free_bytes() + std::min(cached, allocator_.used_bytes());
  usage.largest_free = allocator_.largest_free();
  usage.allocations = allocator_.allocations() - std::min(cached_extents, allocator_.allocations());
  usage.local_allocations = local_.load(std::memory_order_relaxed);
  usage.remote_allocations = remote_.load(std::memory_order_relaxed);
  usage.any_allocations = any_.load(std::memory_order_relaxed);
  return usage;
}

}  // namespace tier::storage
