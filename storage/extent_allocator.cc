#include "storage/extent_allocator.h"

#include <cassert>

namespace tier::storage {

ExtentAllocator::ExtentAllocator(uint64_t capacity, uint64_t alignment)
    : capacity_(capacity & ~(alignment - 1)), alignment_(alignment), free_bytes_(0) {
  assert(alignment != 0 && (alignment & (alignment - 1)) == 0);
  if (capacity_ > 0) Insert(0, capacity_);
}

void ExtentAllocator::Insert(uint64_t offset, uint64_t bytes) {
  by_offset_.emplace(offset, bytes);
  by_size_.emplace(bytes, offset);
  free_bytes_ += bytes;
}

void ExtentAllocator::Erase(std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  free_bytes_ -= it->second;
  by_offset_.erase(it);
}

std::optional<Extent> ExtentAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0 || bytes > capacity_) return std::nullopt;
  uint64_t want = (bytes + alignment_ - 1) & ~(alignment_ - 1);
  // Best fit: the smallest free range that holds `want`, lowest offset among equals.
  auto fit = by_size_.lower_bound({want, 0});
  if (fit == by_size_.end()) return std::nullopt;
  uint64_t offset = fit->second;
  uint64_t range = fit->first;
  Erase(by_offset_.find(offset));
  if (range > want) Insert(offset + want, range - want);
  ++allocations_;
  return Extent{offset, want};
}

bool ExtentAllocator::Free(Extent extent) {
  bool valid = extent.bytes > 0 && extent.offset % alignment_ == 0 &&
               extent.bytes % alignment_ == 0 && extent.offset + extent.bytes <= capacity_ &&
               extent.offset + extent.bytes > extent.offset;
  auto next = by_offset_.lower_bound(extent.offset);
  // The extent must not overlap a free range on either side (that would be a double free).
  if (valid && next != by_offset_.end() && next->first < extent.offset + extent.bytes) valid = false;
  auto prev = next == by_offset_.begin() ? by_offset_.end() : std::prev(next);
  if (valid && prev != by_offset_.end() && prev->first + prev->second > extent.offset) valid = false;
  if (!valid) return false;

  uint64_t offset = extent.offset;
  uint64_t bytes = extent.bytes;
  if (next != by_offset_.end() && next->first == offset + bytes) {
    bytes += next->second;
    Erase(next);
  }
  if (prev != by_offset_.end() && prev->first + prev->second == offset) {
    offset = prev->first;
    bytes += prev->second;
    Erase(prev);
  }
  Insert(offset, bytes);
  --allocations_;
  return true;
}

uint64_t ExtentAllocator::largest_free() const {
  return by_size_.empty() ? 0 : by_size_.rbegin()->first;
}

}  // namespace tier::storage
