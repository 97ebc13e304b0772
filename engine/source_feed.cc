#include "engine/source_feed.h"

#include <algorithm>
#include <utility>

namespace tier::engine {

SourceFeed::SourceFeed(uint64_t len, uint64_t chunk_bytes)
    : len_(len), chunk_bytes_(chunk_bytes == 0 ? (len == 0 ? 1 : len) : chunk_bytes) {}

void SourceFeed::Advance(uint64_t bytes) {
  MutexLock lock(&mu_);
  bytes = std::min(bytes, len_);
  if (ended_ || bytes <= ready_) return;
  ready_ = bytes;
  if (progress_) progress_(ready_, false, status_);
}

void SourceFeed::End(absl::Status status) {
  MutexLock lock(&mu_);
  if (ended_) return;
  ended_ = true;
  if (status.ok()) {
    ready_ = len_;
  } else {
    status_ = std::move(status);
  }
  if (progress_) progress_(ready_, true, status_);
}

void SourceFeed::Subscribe(Progress progress) {
  MutexLock lock(&mu_);
  progress_ = std::move(progress);
  progress_(ready_, ended_, status_);
}

void SourceFeed::Unsubscribe() {
  MutexLock lock(&mu_);
  progress_ = nullptr;
}

uint64_t SourceFeed::ready() const {
  MutexLock lock(&mu_);
  return ready_;
}

absl::Status SourceFeed::status() const {
  MutexLock lock(&mu_);
  return status_;
}

}  // namespace tier::engine
