#include "storage/pool_part.h"

namespace tier::storage {

PoolPart::PoolPart(uint64_t offset, uint64_t bytes, uint64_t alignment, int numa_node)
    : offset_(offset), bytes_(bytes), numa_node_(numa_node), allocator_(bytes, alignment) {}

std::optional<Extent> PoolPart::Allocate(uint64_t bytes, Locality locality) {
  MutexLock lock(&mu_);
  std::optional<Extent> extent = allocator_.Allocate(bytes);
  if (!extent) return std::nullopt;
  switch (locality) {
    case Locality::kLocal:
      ++local_;
      break;
    case Locality::kRemote:
      ++remote_;
      break;
    case Locality::kAny:
      ++any_;
      break;
  }
  extent->offset += offset_;
  return extent;
}

bool PoolPart::Free(Extent extent) {
  if (!Contains(extent.offset)) return false;
  extent.offset -= offset_;
  MutexLock lock(&mu_);
  return allocator_.Free(extent);
}

uint64_t PoolPart::free_bytes() const {
  MutexLock lock(&mu_);
  return allocator_.free_bytes();
}

PoolPartUsage PoolPart::Usage() const {
  MutexLock lock(&mu_);
  PoolPartUsage usage;
  usage.numa_node = numa_node_;
  usage.offset = offset_;
  usage.capacity_bytes = allocator_.capacity();
  usage.used_bytes = allocator_.used_bytes();
  usage.free_bytes = allocator_.free_bytes();
  usage.largest_free = allocator_.largest_free();
  usage.allocations = allocator_.allocations();
  usage.local_allocations = local_;
  usage.remote_allocations = remote_;
  usage.any_allocations = any_;
  return usage;
}

}  // namespace tier::storage
