#include "storage/extent_cache.h"

#include <utility>

namespace tier::storage {

void ExtentCache::Publish() {
  bytes_.store(kept_bytes_, std::memory_order_relaxed);
  count_.store(extents_.size(), std::memory_order_relaxed);
}

std::optional<Extent> ExtentCache::Take(uint64_t bytes) {
  MutexLock lock(&mu_);
  for (auto it = extents_.rbegin(); it != extents_.rend(); ++it) {
    if (it->bytes != bytes) continue;
    Extent extent = *it;
    extents_.erase(std::next(it).base());
    kept_bytes_ -= extent.bytes;
    Publish();
    return extent;
  }
  return std::nullopt;
}

std::vector<Extent> ExtentCache::Put(Extent extent) {
  std::vector<Extent> back;
  if (extent.bytes > kMaxExtentBytes || extent.bytes > cap_bytes_) {
    back.push_back(extent);
    return back;
  }
  MutexLock lock(&mu_);
  while (!extents_.empty() &&
         (extents_.size() >= kMaxExtents || kept_bytes_ + extent.bytes > cap_bytes_)) {
    back.push_back(extents_.front());
    kept_bytes_ -= extents_.front().bytes;
    extents_.pop_front();
  }
  extents_.push_back(extent);
  kept_bytes_ += extent.bytes;
  Publish();
  return back;
}

std::vector<Extent> ExtentCache::TakeAll() {
  MutexLock lock(&mu_);
  std::vector<Extent> all(extents_.begin(), extents_.end());
  extents_.clear();
  kept_bytes_ = 0;
  Publish();
  return all;
}

}  // namespace tier::storage
